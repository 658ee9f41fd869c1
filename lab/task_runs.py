"""task_runs: `--tasks`, Kim's per-task findings (§6-7) measured: every decoder on each task's
examples (the checkpoint's stored ones, or built here for a subword model), for real and by
offline replay, then the cross-task correlations with how much five tasks can hold (stats.py).
"""
import time
from dataclasses import asdict, dataclass

from lab import analysis
from lab import stats
from lab import tasks
from lab.bench import decode_all
import decoders
from runtime.corpus import decode, encode


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
        return asdict(self)                                 # the TaskResults as dicts too


def task_examples(ck, n=None):
    """{task: [(prompt ids, target ids)]}: the first n test examples of each task stored in the
    checkpoint (ck["tasks"], the ones it was tuned and evaluated on, whatever Python runs)."""
    stored, vocab, out = stored_tasks(ck, n), ck["vocab"], {}
    for name, splits in stored["tasks"].items():        # [:None]: all of them
        out[name] = [(encode(p, vocab), encode(t, vocab)) for p, t in splits["test"][:n]]
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
            for name, fn in sorted(analysis.METRICS.items(), key=lambda kv: kv[0] != metric)} | {
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
    be = {decoders.baseline_name(0): 1.0, **{k: analysis.block_eff(v) for k, v in runs.items()}}
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
        win_tie_loss=analysis.win_tie_loss(analysis.compared_steps(task, runs[decoders.PLAIN])),
        block_efficiency_by_heads=analysis.be_by_heads(task),
        in_domain={k: analysis.be_of(task, k, chosen[k], res_in) for k in refined
                   if chosen[k].get("alpha", 0) > 0 and k not in same_in_domain})


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
    hmax = [float(r.hmax) for r in tasks_]
    return {"hmax_vs_bpd_be": stats.summary(bpd, hmax, stats.pearson, "r"),
            "entropy_vs_bpd_be": stats.summary(bpd, [sum(r.head_entropy) / len(r.head_entropy)
                                                     for r in tasks_], stats.pearson, "r"),
            "gain_vs_bpd_be": {k: stats.summary(bpd, [r.relative_gain[k] for r in tasks_],
                                                stats.spearman, "rho") for k in refined},
            "headroom_vs_bpd_be": stats.summary(bpd, headroom, stats.spearman, "rho")}


def intervals(runs):
    """{decoder: [lo, hi]}: the 95% bootstrap interval of its block efficiency over the task's
    examples (resampled; block efficiency = their tokens / their calls)."""
    return {k: list(stats.bootstrap_interval(v, analysis.block_eff)) for k, v in runs.items()}


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
