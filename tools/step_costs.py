"""Where the time of one decode step goes on this machine (docs/results/bench.md's per-step table).

    python tools/step_costs.py            # shipped checkpoint, CPU, ~1 minute

Each figure is the median of 5 batches of repeated calls, all in this one run.
"""
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import decoders  # noqa: E402
from decoders.fastlattice import FastPBestDrafter  # noqa: E402
from decoders.neural import CachedNeuralDrafter  # noqa: E402
from lab.timing import seconds  # noqa: E402
from minibpd import GreedyRule, KVCache  # noqa: E402
from runtime.checkpoint import load  # noqa: E402 (the lab's loader: FastGPT, SmolLM2)
from runtime.kvcache import model_call  # noqa: E402
from runtime.tree import TreeCache, draft_tree, tree_call  # noqa: E402
from runtime.contract import check_answer
from runtime.threads import set_threads
from runtime.corpus import encode


def ms(fn, n):
    """Milliseconds a call of fn, after one warm-up call: the median of 5 batches of n calls."""
    fn()
    batches = [seconds(lambda: [fn() for _ in range(n)]) for _ in range(5)]
    return statistics.median(batches) / n * 1e3


@torch.no_grad()
def main():
    set_threads()                      # 1 thread, as every command (docs/threads.md)
    model, ck = load()
    res = decoders.Resources(model, ck)
    seq = encode(ck["splits"]["test"][:100], ck["vocab"])
    cache = KVCache(model, rows=16)
    z, fed = model_call(model, cache, seq[:-1], [[]])
    cache.advance(fed)
    print(f"base call, 1 token (greedy step):       {ms(lambda: model_call(model, cache, seq, [[]]), 200):6.2f} ms")
    print(f"base call, 8 tokens (BPD verification):  {ms(lambda: model_call(model, cache, seq, [list(range(7))]), 200):6.2f} ms")
    print(f"base call, 16 x 8 tokens (p-best):       {ms(lambda: model_call(model, cache, seq, [list(range(7))] * 16), 50):6.2f} ms")
    z8, _ = model_call(model, cache, seq, [list(range(7))])
    print(f"verify (argmax, match, pick a row):      {ms(lambda: GreedyRule(model)(z8, [[seq[-1]] + list(range(7))]), 500):6.2f} ms")
    one, sixteen = [[seq[-1]] + list(range(7))], [[seq[-1]] + list(range(7))] * 16
    V = model.config.vocab_size
    check_one = ms(lambda: check_answer(one, 8, seq[-1], V, 16, "bpd"), 2000)
    check_sixteen = ms(lambda: check_answer(sixteen, 8, seq[-1], V, 16, "pbest"), 500)
    print(f"drafter contract check, 1 / 16 drafts of 8: {check_one:6.3f} / {check_sixteen:6.3f} ms")
    lp = F.log_softmax(model.head_logits(z[0, -1]), dim=-1)
    print(f"heads at one position + log_softmax:     {ms(lambda: F.log_softmax(model.head_logits(z[0, -1]), dim=-1), 500):6.2f} ms")
    small = res.small_lm()
    sc = KVCache(small)
    zs, f2 = model_call(small, sc, seq[:-1], [[]])
    sc.advance(f2)
    print(f"small LM call, 1 token:                  {ms(lambda: model_call(small, sc, seq, [[]]), 200):6.2f} ms")
    neural = CachedNeuralDrafter(small, 16, 0.8)
    print(f"neural drafter, 8 positions:             {ms(lambda: neural(lp, seq), 50):6.2f} ms")
    print(f"p-best DP k=8 p=16, no LM (pbest0):      {ms(lambda: FastPBestDrafter(8, 16)(lp, seq), 20):6.2f} ms")
    for order in (3, 4, 5):
        t0 = time.perf_counter()
        lm = res.ngram(order)
        fit = time.perf_counter() - t0
        pb = FastPBestDrafter(8, 16, 0.9, lm, res.table(order))
        ng = FastPBestDrafter(8, 1, 0.7, lm, res.table(order))
        print(f"{order}-gram: fit {fit:.2f} s; DP k=8 p=16 {ms(lambda: pb(lp, seq), 20):6.2f} ms, "
              f"p=1 {ms(lambda: ng(lp, seq), 20):6.2f} ms")
    for name, pb in (("pbest0", FastPBestDrafter(8, 16)),
                     ("pbest 5-gram", FastPBestDrafter(8, 16, 0.9, res.ngram(5), res.table(5)))):
        extra = [d[1:] for d in pb(lp, seq)]
        tc = TreeCache(model, 1, spare=15 * 7)
        _, f3 = model_call(model, tc, seq[:-1], [[]])
        tc.advance(f3)
        nodes = len(draft_tree(extra)[0])
        print(f"{name} drafts verified as one tree ({nodes} nodes): "
              f"{ms(lambda: tree_call(model, tc, seq, extra), 100):6.2f} ms "
              f"(as 16 rows: {ms(lambda: model_call(model, cache, seq, extra), 50):6.2f} ms)")
    k16 = FastPBestDrafter(16, 16, 0.9, res.ngram(4), res.table(4))
    print(f"4-gram DP k=16 p=16:                     {ms(lambda: k16(lp, seq), 5):6.2f} ms")


if __name__ == "__main__":
    main()
