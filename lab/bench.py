"""bench: the benchmark and the tuner behind `python minibpd.py --bench` and `--tune`, as
functions of a lab.run.Run (the model's resources, the settings, the prompts and the decode
options, built once by modes.py from the flags; figures.py draws the report; task_runs.py runs
`--tasks` on the same pieces). Block efficiency (tokens per serial model call) is exact and
machine-independent; wall-clock is timing.py's. At temperature 0 every decoder must equal greedy
decoding token for token; above it the check is distribution.py's and the baseline sample_decode.
"""
import time
from dataclasses import dataclass, fields, replace

from lab import analysis
from lab.distribution import sampled_sections
from lab.timing import by_heads, speed_report, timings, tokens_per_s
import decoders
from runtime.corpus import encode
from runtime.loop import lab_decode


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
    test = encode(decoders.split_text(run.ck, "test"), run.ck["vocab"])
    return {str(o): run.res.ngram(o).perplexity(test) for o in orders}


def paper_sections(run, be, runs, work, tps):
    """Kim et al. §6-7 at small scale, by offline replay along the run's greedy continuations
    (run.items): repetition, head confidence, oracle headroom, relative gains, win/tie/loss and
    cost (see analysis.py). be, runs, work, tps: the run decoded for real (decode_all,
    speed_report)."""
    by_k, chosen = analysis.oracle_by_k(run), run.chosen
    compared = analysis.compared_steps(run, runs[decoders.PLAIN])     # once, for both counts
    oracle_at = {name: by_k.get(str(chosen[name].get("k", 1))) or analysis.be_of(
        run, "oracle", {"k": chosen[name].get("k", 1)}) for name in decoders.refined()}
    return {"repetition": analysis.repetition_table(
                {k: v for k, v in runs.items() if not decoders.DECODERS[k].peeks}, run.items),
            **analysis.head_confidence(run.items), "oracle_by_k": by_k,
            "relative_gain": analysis.relative_gain(be, oracle_at),
            "win_tie_loss": analysis.win_tie_loss(compared),
            "loss_repeats": analysis.loss_repeats(compared),
            "head_entropy_quantiles": analysis.entropy_quantiles(run.items),
            "cost": analysis.cost(run, runs, work, tps)}


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
        return decoders.baseline_name(self.temperature or 0.0)

    def to_json(self):
        return {f"speedup_vs_{self.baseline}" if f.name == "speedup" else f.name: getattr(self, f.name)
                for f in fields(self) if getattr(self, f.name) is not None}


def run_bench(run, sweep=False, heads=False):
    """Every decoder on every prompt of the run (run.n new tokens each), for real: block
    efficiency, exactness (T = 0: identical to greedy; T > 0: the distribution check),
    wall-clock, and at T = 0 the paper's analyses; with `sweep` (T = 0) the sweep on the tune
    split; with `heads` (T = 0) the speedup by block size (by_heads). -> BenchReport"""
    t0, T, base = time.perf_counter(), run.temperature, decoders.baseline_name(run.temperature)
    runs, outs, work = decode_all(run)
    be = {base: 1.0, **{k: analysis.block_eff(v) for k, v in runs.items()}}
    r = BenchReport(temperature=T or None, seed=run.seed if T else None, block_efficiency=be,
                    prompts=len(run.prompts), new_tokens=run.n, heads=run.model.config.n_bpd_heads,
                    settings=run.chosen)
    if T:
        r = replace(r, **sampled_sections(run, runs))
    r = replace(r, **speed_report(run))
    if T == 0:
        greedy = run.continuations()
        r.identical_to_greedy = {base: True, **{k: v == greedy for k, v in outs.items()}}
        r.verify, r.ngram_perplexity = run.verify, ngram_perplexities(run)
        r.verify_tokens = {k: analysis.verify_tokens(v) for k, v in runs.items()}
        r = replace(r, **paper_sections(run, be, runs, work, r.tokens_per_s))
    if sweep and T == 0:                # on the tune split, at most 8 prompts x 96 tokens
        text = decoders.split_text(run.ck, "tune")
        tune = make_prompts(text, run.ck["vocab"], min(8, len(run.prompts)))
        r.sweep = analysis.sweep(run.on(tune, min(96, run.n)))
    if heads and T == 0:
        r.speedup_by_heads = by_heads(run)
    r.seconds = time.perf_counter() - t0
    return r


# ----------------------------------------------------------------------------- --tune

def tune_timed(run, objective="block_efficiency"):
    """Choose each decoder's settings from its grid on the run's prompts, of the tune split (never
    the test split; run.n new tokens each). block_efficiency: exact, by offline replay;
    tokens_per_s: one timed decode of the prompts per setting, verifying as run.verify
    (machine-specific; timing.timings, after a warm-up). -> (chosen settings, scores)."""
    def speed(name, s):
        times = timings(run, [decoders.method(name, run.res, s)], max_reps=1)
        return tokens_per_s(times, len(run.prompts) * run.n)[name]
    return analysis.tune(run, objective=objective, speed=speed)
