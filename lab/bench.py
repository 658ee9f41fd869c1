"""bench: the benchmark and the tuner behind `python minibpd.py --bench` and `--tune`, and the
per-task runs of `--tasks`, as functions of a lab.run.Run (the model's resources, the settings,
the prompts and the decode options, built once by cli.py from the flags; figures.py draws the
report).

Block efficiency (tokens per serial model call) is exact and machine-independent; wall-clock is
measured as ratios inside one run, after a warm-up, as the median of several repetitions, with
their spread reported. At temperature 0 every decoder must equal greedy decoding token for token;
above it, every decoder samples the base model's distribution, so the check becomes a
distribution check and the baseline is sample_decode.
"""
import math
import statistics
import time
from collections import Counter
from dataclasses import dataclass, fields

import torch

from lab import analysis
from lab import stats
import decoders
from lab import tasks
from decoders import Method, baseline_name, split_text
from minibpd import ArgmaxDrafter
from runtime.corpus import decode, encode
from minibpd import window_start
from runtime.loop import lab_decode
from runtime.kvcache import device_of
from runtime.sampling import target_probs


def make_prompts(text, vocab, n, length=64):
    """n prompts of `length` characters, evenly spaced over `text`, each starting at a line."""
    check_prompt_count(text, n, length)
    prompts = []
    for i in range(n):
        pos = (len(text) - 2 * length) * i // max(1, n - 1) if n > 1 else 0
        nl = text.find("\n", pos, pos + length)
        pos = nl + 1 if nl >= 0 else pos
        prompts.append(encode(text[pos:pos + length], vocab))
    return prompts


def check_prompt_count(text, n, length=64):
    """make_prompts' rule, checked alone (before a model is loaded): at most len(text) // length
    prompts, from a text of at least 2 x length characters."""
    if len(text) < 2 * length:
        raise ValueError(f"the prompt text has {len(text)} characters; need at least {2 * length}")
    if n > len(text) // length:
        raise ValueError(f"asked for {n:,} prompts of {length} characters, but the text "
                         f"({len(text):,} characters) holds at most {len(text) // length:,}: lower "
                         "--prompts")


# ----------------------------------------------------------------------------- wall-clock

def seconds(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def timings(run, methods, max_reps=None, warm_up=True):
    """Seconds per repetition of each Method over all of run's prompts (run.n new tokens each, at
    run.temperature from run.generator, verifying as run.verify): one warm-up (unless warm_up is
    False: the demo's methods have just run), then method.reps
    repetitions (fewer for the slow refined decoders, to keep the bench short; at most max_reps),
    the methods interleaved so that machine noise hits them alike."""
    decode = lambda m, p, k: m.decode(run.model, p, k, run.temperature, run.generator, run.verify)
    reps = {m.name: min(m.reps, max_reps or m.reps) for m in methods}
    for m in methods if warm_up else []:
        decode(m, run.prompts[0], min(run.n, 16))
    times = {m.name: [] for m in methods}
    for r in range(max(reps.values())):
        for m in methods:
            if r < reps[m.name]:
                times[m.name].append(seconds(lambda: [decode(m, p, run.n) for p in run.prompts]))
    return times


def tokens_per_s(times, tokens):
    return {name: tokens / statistics.median(t) for name, t in times.items()}


def timing_warnings(times, base):
    """Why the wall-clock ratios of this run may mean little: too short, or too noisy."""
    out = []
    if statistics.median(times[base]) < 1.0:
        out.append(f"{base} ran {statistics.median(times[base]):.2f} s per repetition: too short "
                   "for wall-clock ratios to mean much (the defaults take about 3.5 s)")
    for name, t in times.items():
        spread = (max(t) - min(t)) / statistics.median(t)
        if spread > 0.25:
            out.append(f"{name}'s repetitions varied by {100 * spread:.0f}% of their median: the "
                       "machine is busy; its ratios are noisy")
    return out


class OnModel(Method):
    """A Method that decodes on a model of its own, whatever model it is handed: plain BPD on a
    first_heads(k) view (Stern §7.3's block size k) in an interleaved run of the full model."""

    def __init__(self, name, model, drafter):
        super().__init__(name, drafter)
        self.own = model

    def decode(self, model, prompt, n, *args, **kw):
        return super().decode(self.own, prompt, n, *args, **kw)


def timed_methods(run, methods, max_reps=None):
    """An ablation in one run at temperature 0 (Stern §7.3's k, Kim §7.1's rescorer sizes): each
    Method decodes every prompt once for real (its block efficiency; its output checked against
    greedy's), then all are timed interleaved (timings: a warm-up, then the repetitions; the
    first method is the baseline of the speedups). -> {methods: {name: {block_efficiency,
    identical_to_greedy, tokens_per_s, speedup, timing_spread}}, timing_warnings, threads}"""
    greedy, out = run.continuations(), {}
    for m in methods:
        decoded = [m.decode(run.model, p, k) for p, k in zip(run.prompts, run.lengths)]
        out[m.name] = {"block_efficiency": analysis.block_eff([s for _, s in decoded]),
                       "identical_to_greedy": [t for t, _ in decoded] == greedy}
    times, base = timings(run, methods, max_reps), methods[0].name
    tps = tokens_per_s(times, len(run.prompts) * run.n)
    for name, t in times.items():
        out[name].update(tokens_per_s=tps[name], speedup=tps[name] / tps[base],
                         timing_spread={"min": min(t), "median": statistics.median(t),
                                        "max": max(t)})
    return {"methods": out, "timing_warnings": timing_warnings(times, base),
            "threads": torch.get_num_threads()}


def by_heads(run, max_reps=None):
    """Stern §7.3: wall-clock speedup by block size k (Table 4), each k's block efficiency beside
    it (Fig. 4 plots speedup against that mean accepted block size):
    greedy, then plain BPD on heads 1..k for k = 1..h (the model's first_heads(k), as
    `--heads k`), timed in one interleaved run (timed_methods; methods named "1".."h")."""
    h = run.model.config.n_bpd_heads
    return timed_methods(run, [Method(baseline_name(0))] + [
        OnModel(str(k), run.model.first_heads(k), ArgmaxDrafter()) for k in range(1, h + 1)],
        max_reps)


def clock(run):
    """The baseline and every decoder that does not peek, timed in one run (timings) -> the
    report's tokens_per_s, speedup, timing_spread, timing_warnings, threads and machine."""
    base = baseline_name(run.temperature)
    methods = [Method(base)] + [decoders.method(k, run.res, run.chosen[k]) for k, d in
                                decoders.active().items() if not d.peeks]
    times = timings(run, methods)
    tps = tokens_per_s(times, len(run.prompts) * run.n)
    return {"tokens_per_s": tps, "speedup": {k: v / tps[base] for k, v in tps.items()},
            "timing_spread": {k: {"min": min(t), "median": statistics.median(t), "max": max(t)}
                              for k, t in times.items()},
            "timing_warnings": timing_warnings(times, base), "threads": torch.get_num_threads(),
            "machine": getattr(run.model, "machine", None)}


# ----------------------------------------------------------------------------- decoding for real

def decode_all(run):
    """Decode every prompt of the run with every active decoder (run.lengths new tokens each), a
    fresh drafter per prompt, built with its answer key (run.answer_keys: for the oracle).
    -> ({name: [stats]}, {name: [tokens]}, {name: the drafters' summed work counts})."""
    runs, outs, work = {}, {}, {}
    answers = run.answer_keys()
    for name in decoders.active():
        runs[name], outs[name], work[name] = [], [], {}
        for p, a, k in zip(run.prompts, answers, run.lengths):
            drafter = decoders.make(name, run.res, run.chosen[name], a)
            out, stats = lab_decode(run.model, p, k, drafter, run.temperature, run.generator,
                                    run.verify)
            runs[name].append(stats)
            outs[name].append(out)
            for key, v in getattr(drafter, "counts", {}).items():
                work[name][key] = work[name].get(key, 0) + v
    return runs, outs, work


def ngram_perplexities(run, orders=(1, 2, 3, 4, 5)):
    """Held-out (test split) perplexity of the n-gram LM of each order, fitted on train."""
    test = encode(split_text(run.ck, "test"), run.ck["vocab"])
    return {str(o): run.res.ngram(o).perplexity(test) for o in orders}


def paper_sections(run, be, runs, work, tps):
    """Kim et al. §6-7 at small scale, by offline replay along the run's greedy continuations
    (run.items): repetition, head confidence, oracle headroom, relative gains, win/tie/loss and
    cost (see analysis.py). be, runs, work, tps: the run decoded for real (decode_all, clock)."""
    by_k, chosen = analysis.oracle_by_k(run), run.chosen
    compared = analysis.compared_steps(run, runs[decoders.PLAIN])     # once, for both counts
    oracle_at = {name: by_k.get(str(chosen[name].get("k"))) or analysis.be_of(
        run, "oracle", {"k": chosen[name].get("k", 1)}) for name in decoders.refined()}
    return {"repetition": analysis.repetition_table(
                {k: v for k, v in runs.items() if not decoders.DECODERS[k].peeks}, run.items),
            **analysis.head_confidence(run.items), "oracle_by_k": by_k,
            "relative_gain": analysis.relative_gain(be, oracle_at),
            "win_tie_loss": analysis.win_tie_loss(run, runs[decoders.PLAIN], compared=compared),
            "loss_repeats": analysis.loss_repeats(compared),
            "head_entropy_quantiles": analysis.entropy_quantiles(run.items),
            "cost": analysis.cost(run, runs, work, tps)}


# ----------------------------------------------------------------------------- T > 0: distributions

@torch.no_grad()
def second_token(model, prompt, T):
    """Exact distribution [V] of the 2nd new token: sum_x p(x | prompt) p(y | prompt + x)."""
    V, B, dev = model.config.vocab_size, model.config.block_size, device_of(model)
    t = len(prompt)
    z = model(torch.tensor([prompt[window_start(t, B):t]], device=dev))[0, -1]
    p1 = target_probs(model.lm_head(z).double(), T).cpu()                            # [V]
    rows = torch.tensor([prompt[window_start(t + 1, B):] + [x] for x in range(V)], device=dev)
    return p1 @ target_probs(model.lm_head(model(rows)[:, -1]).double(), T).cpu()   # [V]


def distribution_check(model, make, prompt, T, seed, runs=1000, top=9):
    """The first drafted token (the 2nd new token) against its exact distribution, coarsened to
    its `top` likeliest tokens + 'other' (a coarsening keeps a correct sampler correct). L1
    distance of `runs` draws, and the bound it exceeds with probability < 1e-6 for a correct
    sampler (test_sampling.py explains it)."""
    marginal = second_token(model, prompt, T)
    keep = marginal.argsort(descending=True)[:top].tolist()
    cat = {tok: i for i, tok in enumerate(keep)}
    gen, counts = torch.Generator().manual_seed(seed), Counter()
    for _ in range(runs):
        counts[cat.get(lab_decode(model, prompt, 2, make(), T, gen)[0][1], top)] += 1
    exact = marginal[keep].tolist() + [1 - float(marginal[keep].sum())]
    l1 = sum(abs(counts[i] / runs - p) for i, p in enumerate(exact))
    bound = math.sqrt(2 / runs * math.log((2 ** (top + 1) - 2) / 1e-6))
    return {"l1": l1, "bound": bound, "runs": runs, "ok": l1 < bound}


def accepted_share(steps):
    """Share of the tried draft tokens that were accepted (what temperature takes away)."""
    tries = [ok for s in steps for _, _, _, ok in s["tries"]]
    return sum(tries) / max(1, len(tries))


def sampled_sections(run, runs):
    """At run.temperature T > 0: distribution_check per decoder (seeded by run.seed), on the
    prompt whose 2nd token is least certain (highest exact entropy: where the check is most
    telling), and the share of draft tokens accepted in `runs` (decode_all's)."""
    T, prompts = run.temperature, run.prompts
    entropy = [float(-(m * m.clamp_min(1e-300).log()).sum()) for m in
               (second_token(run.model, p, T) for p in prompts)]
    at = entropy.index(max(entropy))
    answer = run.answer_keys()[at]
    check = {name: distribution_check(run.model, lambda: decoders.make(name, run.res,
                                                                       run.chosen[name], answer),
                                      prompts[at], T, run.seed)
             for name in decoders.active()}
    return {"distribution_check": check, "distribution_check_prompt": at,
            "acceptance": {k: accepted_share([s for r in v for s in r["steps"]])
                           for k, v in runs.items()}}


# ----------------------------------------------------------------------------- the report

@dataclass
class BenchReport:
    """What `--bench` measures: `--json` prints one key per field that is not None (`speedup` as
    speedup_vs_greedy or speedup_vs_sample), figures.print_report draws it."""
    temperature: float = None         # T > 0 only: sampling
    seed: int = None                  # T > 0 only
    block_efficiency: dict = None     # {method: new tokens / serial calls}; the baseline is 1.0
    identical_to_greedy: dict = None  # T = 0: {method: every output equals greedy_decode's}
    distribution_check: dict = None   # T > 0: {decoder: {l1, bound, runs, ok}}
    distribution_check_prompt: int = None
    acceptance: dict = None           # T > 0: {decoder: share of tried draft tokens accepted}
    tokens_per_s: dict = None         # {method: tokens/s}, median of the repetitions
    speedup: dict = None              # {method: tokens/s over the baseline's}
    timing_spread: dict = None        # {method: {min, median, max} seconds per repetition}
    timing_warnings: list = None
    threads: int = None
    machine: str = None               # the dtype and blocks chosen for this CPU (models/machine.py)
    prompts: int = None
    new_tokens: int = None
    checkpoint: str = None
    heads: int = None
    settings: dict = None             # {decoder: its settings}
    verify: str = None                # T = 0 only: --verify
    verify_tokens: dict = None        # {decoder: {batch, tree}: drafted tokens run per call}
    ngram_perplexity: dict = None     # {order: held-out perplexity}
    repetition: dict = None           # Kim §6.1 ... (analysis.py): the paper's sections, T = 0
    head_entropy: list = None
    hmax: int = None
    head_accuracy: list = None
    oracle_by_k: dict = None
    relative_gain: dict = None
    win_tie_loss: dict = None
    cost: dict = None
    sweep: dict = None                # --sweep only
    loss_repeats: dict = None         # Kim Table 5's losses (analysis.loss_repeats), T = 0
    head_entropy_quantiles: dict = None   # Kim Fig. 3a (analysis.entropy_quantiles), T = 0
    speedup_by_heads: dict = None     # --by-heads only: Stern §7.3, Fig. 4, Table 4
    approximate: dict = None          # --approximate only: {rule: ...} (lab/approximate.py), the
                                      # APPROXIMATE rules, NOT greedy's: never identical_to_greedy
    seconds: float = None

    @property
    def baseline(self):
        return baseline_name(self.temperature or 0.0)

    def to_json(self):
        return {f"speedup_vs_{self.baseline}" if f.name == "speedup" else f.name: getattr(self, f.name)
                for f in fields(self) if getattr(self, f.name) is not None}


def run_bench(run, sweep=False, heads=False):
    """Every decoder on every prompt of the run (run.n new tokens each), for real: block
    efficiency, exactness (T = 0: identical to greedy; T > 0: the distribution check),
    wall-clock, and at T = 0 the paper's analyses; with `sweep` (T = 0) the sweep on the tune
    split; with `heads` (T = 0) the speedup by block size (by_heads). -> BenchReport"""
    t0, T, base = time.perf_counter(), run.temperature, baseline_name(run.temperature)
    runs, outs, work = decode_all(run)
    be = {base: 1.0, **{k: analysis.block_eff(v) for k, v in runs.items()}}
    r = BenchReport(temperature=T or None, seed=run.seed if T else None, block_efficiency=be,
                    prompts=len(run.prompts), new_tokens=run.n, heads=run.model.config.n_bpd_heads,
                    settings=run.chosen)
    if T == 0:
        greedy = run.continuations()
        r.identical_to_greedy = {base: True, **{k: v == greedy for k, v in outs.items()}}
    else:
        for key, value in sampled_sections(run, runs).items():
            setattr(r, key, value)
    for key, value in clock(run).items():
        setattr(r, key, value)
    if T == 0:
        r.verify, r.ngram_perplexity = run.verify, ngram_perplexities(run)
        r.verify_tokens = {k: analysis.verify_tokens(v) for k, v in runs.items()}
        for key, value in paper_sections(run, be, runs, work, r.tokens_per_s).items():
            setattr(r, key, value)
    if sweep and T == 0:                # on the tune split, at most 8 prompts x 96 tokens
        tune = make_prompts(split_text(run.ck, "tune"), run.ck["vocab"], min(8, len(run.prompts)))
        r.sweep = analysis.sweep(run.on(tune, min(96, run.n)))
    if heads and T == 0:
        r.speedup_by_heads = by_heads(run)
    r.seconds = time.perf_counter() - t0
    return r


# ----------------------------------------------------------------------------- --tune

def tune_timed(run, objective="block_efficiency", log=print):
    """Choose each decoder's settings from its grid on the run's prompts, of the tune split (never
    the test split; run.n new tokens each). block_efficiency: exact, by offline replay;
    tokens_per_s: one timed decode of the prompts per setting, verifying as run.verify
    (machine-specific). -> (chosen settings, scores)."""
    model, prompts, n = run.model, run.prompts, run.n

    def speed(name, s):
        m = decoders.method(name, run.res, s)
        m.decode(model, prompts[0], min(n, 16), verify=run.verify)             # warm-up
        return len(prompts) * n / seconds(lambda: [m.decode(model, p, n, verify=run.verify)
                                                    for p in prompts])
    return analysis.tune(run, log=log, objective=objective, speed=speed)


# ----------------------------------------------------------------------------- --tasks

SUBWORD_TOKENS = (8, 32)      # ours: a subword model decodes its target's length within these
DEGENERATE_ROUGE = 0.1        # ours: a task whose greedy ROUGE-L is below this is degenerate


@dataclass
class TaskResult:
    """One task of `--tasks` (Kim's per-task findings, §6-7): what `--tasks --json` prints under
    tasks.NAME."""
    examples: int                   # test examples decoded
    block_efficiency: dict          # {method: new tokens / calls}, each example for its target's length
    identical_to_greedy: dict       # {method: every output equals greedy's}
    relative_gain: dict             # {refined decoder: percent over BPD}
    best_refined: str               # the refined decoder with the highest block efficiency
    oracle_by_k: dict               # Kim §6.3
    head_entropy: list              # Kim §6.2, nats per head
    hmax: int
    head_accuracy: list             # ours: top-1 agreement with greedy
    repetition: dict                # Kim Table 3: BPD's drafts: adjacent_repeat, longest_run
    repetition_2gram: dict          # ... after 2-gram rescoring (the ngram decoder at order 2)
    quality: dict                   # greedy output against the reference (the task's metric
                                    # first), and its phrase_repeat (a loop guard)
    in_domain: dict                 # {rescoring decoder: block efficiency with in-domain rescorers}
    block_efficiency_interval: dict = None  # {decoder: [lo, hi]}: 95% bootstrap over examples
    degenerate: bool = False        # greedy's ROUGE-L < DEGENERATE_ROUGE: left out of correlation
    lengths: list = None            # [fewest, most] new tokens decoded per example
    win_tie_loss: dict = None       # Kim §7.3: {refined decoder: {win, tie, loss, ...}}
    block_efficiency_by_heads: dict = None  # Kim Table 1: {heads: plain BPD's}, by replay


@dataclass
class TasksReport:
    tasks: dict                     # {task: TaskResult}
    correlation: dict               # across tasks (see correlations)
    checkpoint: str = None
    settings: dict = None
    python: str = None              # the Python whose stdlib built the examples
    excluded: list = None           # degenerate tasks, left out of the correlations
    degenerate_below: float = DEGENERATE_ROUGE
    seconds: float = None

    def to_json(self):
        return {**{f.name: getattr(self, f.name) for f in fields(self)},
                "tasks": {t: vars(r) for t, r in self.tasks.items()}}


def task_examples(ck, n=None):
    """{task: [(prompt ids, target ids)]}: the first n test examples of each task stored in the
    checkpoint (ck["tasks"], the ones it was tuned and evaluated on, whatever Python runs)."""
    stored = stored_tasks(ck, n)
    out = {}
    for name, splits in stored["tasks"].items():
        pairs = splits["test"][:n] if n else splits["test"]
        out[name] = [(encode(p, ck["vocab"]), encode(t, ck["vocab"])) for p, t in pairs]
    return out


def stored_tasks(ck, n=None):
    """ck["tasks"], checked to hold n test examples of every task (before a model is loaded)."""
    stored = ck.get("tasks")
    if not stored:
        raise ValueError("this checkpoint holds no tasks (ck['tasks']): use "
                         "checkpoints/minibpd-tasks.pt or fine-tune one with `python train_heads.py --tasks`")
    most = min(len(s["test"]) for s in stored["tasks"].values())
    if n is not None and n > most:
        raise ValueError(f"asked for {n:,} examples per task, but the smallest task holds {most} "
                         "test examples: lower --prompts")
    return stored


def check_built_counts(n, names=None, split="test"):
    """A ValueError if a task (of tasks.TASKS, or `names`) has fewer than n `split` examples."""
    for name in names or tasks.TASKS:
        count = len(tasks.build(name, split))
        if count < n:
            raise ValueError(f"task {name} has {count} {split} examples, fewer than --prompts "
                             f"{n}: lower --prompts")


def built_tasks(vocab, n, names=None, split="test"):
    """{task: [(prompt ids, target ids)]} for a model whose vocab encodes any text (SmolLM2's
    subword Vocab): every task of tasks.TASKS (or `names`) built by the running Python, n
    examples spread evenly over the split, an instruction task's prompt in the model's chat
    template (vocab.chat), a continuation's raw (tasks.instruction says which)."""
    check_built_counts(n, names, split)
    out = {}
    for name in names or tasks.TASKS:
        pairs = tasks.build(name, split)
        chosen_ = [pairs[i * len(pairs) // n] for i in range(n)]
        out[name] = [(vocab.encode(as_prompt(name, p, vocab)), vocab.encode(t)) for p, t in chosen_]
    return out


def as_prompt(name, prompt, vocab):
    """The text the model reads: the chat template around an instruction task's user message."""
    return prompt if tasks.INSTRUCTION[name] is None else vocab.chat(tasks.instruction(name, prompt))


def up_to_stop(tokens, vocab):
    """The tokens before the first end token (SmolLM2's <|im_end|>, <|endoftext|>), if any."""
    stops = getattr(vocab, "stop_tokens", ())
    return next((tokens[:i] for i, t in enumerate(tokens) if t in stops), tokens)


def quality_of(greedy, examples, metric, vocab):
    """{metric: mean over examples, ...} of greedy's text (up to an end token) against the
    target, the task's own metric first; plus phrase_repeat, the loop guard."""
    texts = [(decode(up_to_stop(g, vocab), vocab), decode(t, vocab))
             for g, (_, t) in zip(greedy, examples)]
    return {name: sum(fn(g, t) for g, t in texts) / len(texts)
            for name, fn in sorted(analysis.QUALITY.items(), key=lambda kv: kv[0] != metric)} | {
        "phrase_repeat": analysis.phrase_repetition_all(greedy)}


def run_task(run, examples, metric, res_in, tokens=None, same_in_domain=()):
    """Every decoder on one task's examples (run's resources, settings and verify on their
    prompts), for real (each for its target's length, within `tokens` = (fewest, most) if
    given), and the paper's per-task analyses by offline replay; in_domain replays the rescoring
    decoders with res_in, but not those in `same_in_domain` (whose rescorer res_in does not
    change). -> TaskResult"""
    lo, hi = tokens or (1, None)
    lengths = [max(lo, min(len(t), hi or len(t))) for _, t in examples]
    task, chosen = run.on([p for p, _ in examples], lengths), run.chosen
    greedy, (runs, outs, _) = task.continuations(), decode_all(task)
    be = {baseline_name(0): 1.0, **{k: analysis.block_eff(v) for k, v in runs.items()}}
    two = {**chosen["ngram"], "order": 2}
    refined = {k: v for k, v in be.items() if k in decoders.refined()}
    gains = {k: 100 * (v / be[decoders.PLAIN] - 1) for k, v in refined.items()}
    return TaskResult(
        examples=len(examples), block_efficiency=be, block_efficiency_interval=intervals(runs),
        identical_to_greedy={k: v == greedy for k, v in outs.items()}, relative_gain=gains,
        best_refined=max(refined, key=refined.get), oracle_by_k=analysis.oracle_by_k(task),
        **analysis.head_confidence(task.items),
        repetition=analysis.repetition([s["drafts"][0] for r in runs[decoders.PLAIN] for s in r["steps"]]),
        repetition_2gram=analysis.repetition([s["drafts"][0] for r in analysis.replay_all(
            task, lambda a: decoders.make("ngram", run.res, two, a)) for s in r["steps"]]),
        quality=(q := quality_of(greedy, examples, metric, run.ck["vocab"])),
        degenerate=q["rouge_l"] < DEGENERATE_ROUGE, lengths=[min(lengths), max(lengths)],
        win_tie_loss=analysis.win_tie_loss(task, runs[decoders.PLAIN]),
        block_efficiency_by_heads=analysis.be_by_heads(task),
        in_domain={k: analysis.be_of(task, k, chosen[k], res_in) for k in refined
                   if chosen[k].get("alpha", 0) > 0 and k not in same_in_domain})


def pearson(xs, ys):
    if len(xs) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sx = math.sqrt(sum((x - mx) ** 2 for x in xs))
    sy = math.sqrt(sum((y - my) ** 2 for y in ys))
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / (sx * sy) if sx and sy else None


def ranks(xs):
    """Ranks from 0, tied values given their mean rank (Spearman's rho is Pearson's r on them)."""
    order = sorted(xs)
    return [sum(i for i, v in enumerate(order) if v == x) / order.count(x) for x in xs]


def spearman(xs, ys):
    """Spearman's rho: Pearson's r on the ranks."""
    return pearson(ranks(xs), ranks(ys))


def correlations(results):
    """Kim's cross-task claims, measured: Pearson r of h_max and of mean head entropy with BPD's
    block efficiency (Fig. 3b), Spearman's rho of each refined decoder's gain with it (Table 4:
    gains shrink as it grows) and of the oracle's headroom (Figs. 5-6). Each entry: n (the
    tasks), the coefficient (r or rho), p (exact permutation, two-sided) and loo ([min, max] of
    the coefficient with one task dropped; stats.py)."""
    tasks_ = list(results.values())
    bpd = [r.block_efficiency[decoders.PLAIN] for r in tasks_]
    refined = tasks_[0].relative_gain if tasks_ else {}
    headroom = [r.oracle_by_k["8"] / r.block_efficiency[decoders.PLAIN] - 1 for r in tasks_]
    return {"hmax_vs_bpd_be": stats.summary(bpd, [float(r.hmax) for r in tasks_], pearson, "r"),
            "entropy_vs_bpd_be": stats.summary(bpd, [sum(r.head_entropy) / len(r.head_entropy)
                                                     for r in tasks_], pearson, "r"),
            "gain_vs_bpd_be": {k: stats.summary(bpd, [r.relative_gain[k] for r in tasks_],
                                                spearman, "rho") for k in refined},
            "headroom_vs_bpd_be": stats.summary(bpd, headroom, spearman, "rho")}


def intervals(runs, reps=1000, seed=0):
    """{decoder: [lo, hi]}: the 95% bootstrap interval of its block efficiency over the task's
    examples (resampled; block efficiency = their tokens / their calls)."""
    return {k: list(stats.bootstrap_interval([(s["new_tokens"], s["calls"]) for s in v],
                                             stats.block_efficiency, reps, seed))
            for k, v in runs.items()}


def run_tasks(run, examples, res_in, log=print, tokens=None, python=None, same_in_domain=()):
    """`--tasks`: run_task with the run's resources, settings and verify on every task's examples
    ({task: [(prompt ids, target ids)]}: the checkpoint's stored ones, task_examples, or built
    here, built_tasks), then correlations over the tasks that are not degenerate (the others are
    named in `excluded`)."""
    t0, results = time.perf_counter(), {}
    for name, ex in examples.items():
        log(f"  {name}: {len(ex)} examples ...")
        results[name] = run_task(run, ex, tasks.QUALITY[name], res_in, tokens, same_in_domain)
    kept = {k: r for k, r in results.items() if not r.degenerate}
    return TasksReport(results, correlations(kept), settings=run.chosen, python=python,
                       excluded=sorted(set(results) - set(kept)), seconds=time.perf_counter() - t0)
