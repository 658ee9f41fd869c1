"""What the `ngram` drafter (Kim §7.2, p = 1) costs per decoding step, against one BPD call.

    python tools/viterbi_costs.py [--steps 200] [--reps 5]     # shipped checkpoint, CPU, ~5 min

The contexts are those of the first --steps steps of plain BPD (bpd_decode) on test-split
prompts: the heads' log-probs [m, V] and the tokens so far, exactly what a drafter gets. Timed in
this one run, 1 torch thread, interleaved: each of --reps rounds times 200 BPD calls (8 tokens,
as tools/step_costs.py), then every drafter once on every context. A drafter's figure is the median
over contexts of its median over rounds, after one warm-up pass; the BPD call's is the median
over rounds. PBestDrafter is the current `ngram` drafter, ViterbiDrafter the new one (its
automaton's rows all built up front for orders 3 and 4; at 5, built on first use and warm here).
`lazy first pass`: one pass over the contexts with a fresh automaton building its rows on first
use (as at the start of a decode), time / contexts. `eager`: building every row up front.
Every new draft is checked against PBestDrafter's and best_paths' (the reference, most of the
run time); the exit status is 1 if any differs.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import decoders  # noqa: E402
import lattice  # noqa: E402
from decoders.fastlattice import FastPBestDrafter  # noqa: E402
from minibpd import ArgmaxDrafter, bpd_decode, load_checkpoint
from runtime.threads import set_threads
from minibpd import KVCache
from runtime.kvcache import model_call
from runtime.corpus import encode
from decoders import viterbi

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


def bpd_call(model, ck):
    """One BPD call's work: the base model on 8 new tokens after a 100-token context."""
    seq = encode(ck["splits"]["test"][:100], ck["vocab"])
    cache = KVCache(model, rows=16)
    _, fed = model_call(model, cache, seq[:-1], [[]])
    cache.advance(fed)
    return lambda: model_call(model, cache, seq, [list(range(7))])


def timed(fn, args):
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def drafters(res, orders):
    """{(order, name): drafter}: the current one, PBestDrafter, and ViterbiDrafter."""
    out = {}
    for order in orders:
        lm, table = res.ngram(order), res.table(order)
        out[order, "PBestDrafter"] = FastPBestDrafter(K, 1, ALPHA, lm, table, name="ngram")
        out[order, "ViterbiDrafter"] = viterbi.ViterbiDrafter(K, ALPHA, lm)
    return out


def build_costs(lm, contexts):
    """Seconds to build the automaton (lazy) and to build all its rows (eager); ms per step of
    a first pass over the contexts with lazy rows, and the rows it built."""
    t0 = time.perf_counter()
    auto = viterbi.NgramAutomaton(lm)
    t1 = time.perf_counter()
    for lp, ctx in contexts:
        viterbi.ngram_draft(lp, ctx, K, ALPHA, lm, auto)
    t2 = time.perf_counter()
    viterbi.NgramAutomaton(lm, eager=True)
    t3 = time.perf_counter()
    return t1 - t0, t3 - t2, (t2 - t1) / len(contexts) * 1e3, int(auto.built.sum())


def differences(res, order, contexts):
    """How many contexts where ngram_draft differs from PBestDrafter, and from best_paths."""
    lm = res.ngram(order)
    old = FastPBestDrafter(K, 1, ALPHA, lm, res.table(order))
    auto, vs_old, vs_ref = viterbi.NgramAutomaton(lm), 0, 0
    for lp, ctx in contexts:
        new = viterbi.ngram_draft(lp, ctx, K, ALPHA, lm, auto)
        vs_old += new != old(lp, ctx)[0]
        ref = lattice.best_paths(lattice.head_lattice(lp, ctx, K), lm, ctx[:-1], 1, ALPHA)
        vs_ref += new != ref[0][1]
    return vs_old, vs_ref


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
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    builds = {order: build_costs(res.ngram(order), contexts) for order in args.orders}
    todo, call = drafters(res, args.orders), bpd_call(model, ck)
    for fn in todo.values():  # warm-up: every automaton row these contexts need
        for lp, ctx in contexts:
            fn(lp, ctx)
    call()
    bpd, times = [], {key: [[] for _ in contexts] for key in todo}
    for _ in range(args.reps):
        bpd.append(sum(timed(call, ()) for _ in range(200)) / 200 * 1e3)
        for key, fn in todo.items():
            for j, c in enumerate(contexts):
                times[key][j].append(timed(fn, c))
    per = {key: [statistics.median(t) * 1e3 for t in ts] for key, ts in times.items()}
    ref = statistics.median(bpd)
    print(f"{len(contexts)} BPD steps; k = {K}, alpha = {ALPHA}; 1 torch thread; load average "
          f"{load} (start), {' '.join(f'{x:.2f}' for x in os.getloadavg())} (end)")
    print(f"BPD call, 8 tokens: {ref:.3f} ms (median of {args.reps} rounds of 200 calls; "
          f"rounds {min(bpd):.3f}..{max(bpd):.3f})\n")
    print("| order | PBestDrafter ms | / BPD call | ViterbiDrafter ms | / BPD call | its mean, "
          "p90 ms | lazy first pass ms (rows) | automaton s, eager s | differs from PBest, "
          "best_paths |")
    print("|---|---|---|---|---|---|---|---|---|")
    bad = 0
    for order in args.orders:
        old, new = per[order, "PBestDrafter"], per[order, "ViterbiDrafter"]
        vs_old, vs_ref = differences(res, order, contexts)
        bad += vs_old + vs_ref
        lazy_s, eager_s, first_ms, rows = builds[order]
        print(f"| {order} | {statistics.median(old):.3f} | {statistics.median(old) / ref:.1%} | "
              f"{statistics.median(new):.3f} | {statistics.median(new) / ref:.1%} | "
              f"{np.mean(new):.3f}, {np.percentile(new, 90):.3f} | {first_ms:.3f} ({rows}) | "
              f"{lazy_s:.2f}, {eager_s:.2f} | {vs_old}, {vs_ref} of {len(contexts)} |")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
