"""timing: wall-clock, measured as ratios inside one run, after a warm-up, as the median of
several repetitions, the methods interleaved so that machine noise hits them alike, with their
spread and a warning where the ratios may mean little. `--bench`'s tokens per second and speedups,
and Stern §7.3's ablation of the block size k, timed in one run (by_heads).
"""
import statistics
import time

import torch

from lab import analysis
import decoders
from minibpd import ArgmaxDrafter


def seconds(fn):
    """Wall-clock seconds of one call of fn (also the measuring scripts' clock: tools/)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def timings(run, methods, max_reps=None, warm_up=True):
    """Seconds per repetition of each Method over all of run's prompts (run.n new tokens each, at
    run.temperature from run.generator, verifying as run.verify): one warm-up (unless warm_up is
    False: the demo's methods have just run), then method.reps repetitions (fewer for the slow
    refined decoders, to keep the bench short; at most max_reps), the methods interleaved."""
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


class OnModel(decoders.Method):
    """A Method that decodes on a model of its own, whatever model it is handed: plain BPD on a
    first_heads(k) view (Stern §7.3's block size k) in an interleaved run of the full model."""

    def __init__(self, name, model, drafter):
        super().__init__(name, drafter)
        self.own = model

    def decode(self, model, prompt, n, *args, **kw):
        return super().decode(self.own, prompt, n, *args, **kw)


def by_heads(run):
    """Stern §7.3: wall-clock speedup by block size k (Table 4), each k's block efficiency beside
    it (Fig. 4 plots speedup against that mean accepted block size). Greedy, then plain BPD on
    heads 1..k for k = 1..h (the model's first_heads(k), as `--heads k`; methods named "1".."h"),
    each decoding every prompt once for real (its block efficiency; its output checked against
    greedy's), then all timed interleaved (timings; greedy is the baseline of the speedups).
    -> {methods: {name: {block_efficiency, identical_to_greedy, tokens_per_s, speedup,
    timing_spread}}, timing_warnings, threads}"""
    h = run.model.config.n_bpd_heads
    methods = [decoders.Method(decoders.baseline_name(0))] + [
        OnModel(str(k), run.model.first_heads(k), ArgmaxDrafter()) for k in range(1, h + 1)]
    greedy, out = run.continuations(), {}
    for m in methods:
        decoded = [m.decode(run.model, p, k) for p, k in zip(run.prompts, run.lengths)]
        out[m.name] = {"block_efficiency": analysis.block_eff([s for _, s in decoded]),
                       "identical_to_greedy": [t for t, _ in decoded] == greedy}
    s = speed_summary(run, timings(run, methods), methods[0].name)
    for name in out:
        out[name].update({k: s[k][name] for k in ("tokens_per_s", "speedup", "timing_spread")})
    return {"methods": out, "timing_warnings": s["timing_warnings"], "threads": s["threads"]}


def speed_report(run):
    """The baseline and every decoder that does not peek, timed in one run (timings) -> the
    report's tokens_per_s, speedup, timing_spread, timing_warnings, threads and machine."""
    base = decoders.baseline_name(run.temperature)
    methods = [decoders.Method(base)] + [decoders.method(k, run.res, run.chosen[k])
                                         for k, d in decoders.active().items() if not d.peeks]
    return {**speed_summary(run, timings(run, methods), base),
            "machine": getattr(run.model, "machine", None)}


def speed_summary(run, times, base):
    """timings' seconds -> tokens_per_s, speedup over `base`, timing_spread, warnings, threads."""
    tps = tokens_per_s(times, len(run.prompts) * run.n)
    return {"tokens_per_s": tps, "speedup": {k: v / tps[base] for k, v in tps.items()},
            "timing_spread": {k: {"min": min(t), "median": statistics.median(t), "max": max(t)}
                              for k, t in times.items()},
            "timing_warnings": timing_warnings(times, base), "threads": torch.get_num_threads()}
