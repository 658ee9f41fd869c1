"""What the `ngram` drafter (Kim §7.2, p = 1) costs per step, against one BPD call (8 tokens).

    python .ci/viterbi_costs.py [--steps 200] [--reps 5]     # shipped checkpoint, CPU, ~2 min

The contexts are those of the first --steps steps of plain BPD (bpd_decode) on test-split
prompts: the heads' log-probs [m, V] and the tokens so far, as the drafter gets them. Every
figure comes from this one run, 1 torch thread. Per drafter and context: the median of --reps
timed calls after one warm-up pass (the warm automaton, as in a long decode); the table gives the
median over contexts. `cold` is one pass over the contexts with a fresh NgramAutomaton (its rows
built on first use, as at the start of a decode), total time / contexts. The BPD call is the
median of --reps batches of 200 calls, as .ci/step_costs.py times it. Then every new draft is
checked against PBestDrafter's (the current drafter) and best_paths' (the reference).
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import decoders  # noqa: E402
import lattice  # noqa: E402
from minibpd import (ArgmaxDrafter, KVCache, bpd_decode, encode, load_checkpoint,  # noqa: E402
                     model_call, set_threads)

K, ALPHA = 8, 0.5    # the speed-tuned settings of `ngram`


class Recorder(ArgmaxDrafter):
    """Plain BPD that keeps a copy of what each step's drafter gets."""

    def __init__(self):
        self.seen = []

    def __call__(self, logprobs, context):
        self.seen.append((logprobs.clone(), list(context)))
        return super().__call__(logprobs, context)


def bpd_contexts(model, ck, steps):
    """(logprobs [m, V], context) of the first `steps` BPD steps on test-split prompts."""
    text, rec, start = ck["splits"]["test"], Recorder(), 0
    while len(rec.seen) < steps and start + 64 <= len(text):
        bpd_decode(model, encode(text[start:start + 64], ck["vocab"]), 120, rec)
        start += 400
    return rec.seen[:steps]


def per_call_ms(fn, contexts, reps):
    """Median over contexts of the median of `reps` timed calls fn(logprobs, context)."""
    for lp, ctx in contexts:  # warm-up
        fn(lp, ctx)
    times = [[] for _ in contexts]
    for _ in range(reps):
        for j, (lp, ctx) in enumerate(contexts):
            t0 = time.perf_counter()
            fn(lp, ctx)
            times[j].append(time.perf_counter() - t0)
    return statistics.median(statistics.median(t) for t in times) * 1e3


def cold_ms(make, contexts):
    fn = make()
    t0 = time.perf_counter()
    for lp, ctx in contexts:
        fn(lp, ctx)
    return (time.perf_counter() - t0) / len(contexts) * 1e3


def bpd_call_ms(model, ck, reps):
    seq = encode(ck["splits"]["test"][:100], ck["vocab"])
    cache = KVCache(model, rows=16)
    _, fed = model_call(model, cache, seq[:-1], [[]])
    cache.advance(fed)
    call = lambda: model_call(model, cache, seq, [list(range(7))])
    call()
    runs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(200):
            call()
        runs.append((time.perf_counter() - t0) / 200 * 1e3)
    return statistics.median(runs)


@torch.no_grad()
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--orders", type=int, nargs="+", default=[3, 4, 5])
    args = ap.parse_args(argv)
    set_threads()
    model, ck = load_checkpoint()
    res = decoders.Resources(model, ck)
    contexts = bpd_contexts(model, ck, args.steps)
    print(f"{len(contexts)} BPD steps; k = {K}, alpha = {ALPHA}; 1 torch thread; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    bpd = bpd_call_ms(model, ck, args.reps)
    rows, mismatches = [], 0
    for order in args.orders:
        lm, table = res.ngram(order), res.table(order)
        auto = lattice.NgramAutomaton(lm)
        old = lattice.PBestDrafter(K, 1, ALPHA, lm, table, name="ngram")
        new = lambda lp, ctx: lattice.ngram_draft(lp, ctx, K, ALPHA, lm, auto)
        fresh = lambda: (lambda a: lambda lp, ctx: lattice.ngram_draft(lp, ctx, K, ALPHA, lm, a))(
            lattice.NgramAutomaton(lm))
        cold = cold_ms(fresh, contexts)
        t_old, t_new = per_call_ms(old, contexts, args.reps), per_call_ms(new, contexts, args.reps)
        same_old = same_ref = 0
        for lp, ctx in contexts:
            draft = new(lp, ctx)
            same_old += draft == old(lp, ctx)[0]
            ref = lattice.best_paths(lattice.head_lattice(lp, ctx, K), lm, ctx[:-1], 1, ALPHA)
            same_ref += draft == ref[0][1]
        mismatches += 2 * len(contexts) - same_old - same_ref
        rows.append((order, t_old, t_new, cold, same_old, same_ref, auto.built.sum()))
    bpd_after = bpd_call_ms(model, ck, args.reps)
    print(f"\nBPD call, 8 tokens: {bpd:.3f} ms (before the drafters), {bpd_after:.3f} ms (after); "
          f"ratios use the mean of the two\n")
    ref = (bpd + bpd_after) / 2
    print("| order | PBestDrafter ms | ratio | ngram_draft ms (warm) | ratio | cold ms | ratio "
          "| = PBestDrafter | = best_paths | automaton rows |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for order, t_old, t_new, cold, so, sr, built in rows:
        print(f"| {order} | {t_old:.3f} | {t_old / ref:.1%} | {t_new:.3f} | {t_new / ref:.1%} | "
              f"{cold:.3f} | {cold / ref:.1%} | {so}/{len(contexts)} | {sr}/{len(contexts)} | "
              f"{built} |")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
