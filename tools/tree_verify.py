"""Tree verification against rows on SmolLM2 (batch-invariant): for each decoder that returns
several drafts, the same decode verified as P rows of a batch (`verify="batch"`) and as one row
holding the drafts' token tree (`verify="tree"`, llama.tree_attention): whether each equals
greedy, block efficiency (the same: the same accepts), tokens the base model ran on per call,
and ms per token: the table behind docs/results/real-model-runs.md's tree table.

    python tools/tree_verify.py [--prompts 3] [--new-tokens 32] [--rounds 3] [--decoders pbest0,pbest]

Prompts: the demo's first question in the form that broke pbest0 under the old tree attention
(smollm.chat, 48 tokens) and --prompts of the bench's test prompts. Each decode is timed --rounds
times, batch and tree alternating, after one warm-up each; the median round. 1 thread.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import decoders  # noqa: E402
import minibpd  # noqa: E402
from lab import bench  # noqa: E402
from models import smollm  # noqa: E402
from runtime.threads import set_threads  # noqa: E402

HEADS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "checkpoints",
                     "smollm2-heads.pt")


def timed(model, prompt, n, drafter, verify, rounds):
    """-> (tokens, stats, median seconds) of `rounds` decodes after a warm-up."""
    out, stats = minibpd.bpd_decode(model, prompt, n, drafter, verify=verify)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        again, _ = minibpd.bpd_decode(model, prompt, n, drafter, verify=verify)
        times.append(time.perf_counter() - t0)
        assert again == out, f"{verify} decoded other tokens on a repetition"
    return out, stats, statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--decoders", default="pbest0,pbest,lookup_pbest")
    args = p.parse_args()
    set_threads(1)
    model, ck = minibpd.load_checkpoint(HEADS)
    res = decoders.Resources(model, ck)
    chosen = decoders.settings(decoders.load_tuned(decoders.tuned_path(HEADS), HEADS))
    cases = [(ck["vocab"].encode(smollm.chat(smollm.DEMO_QUESTIONS[0])), 48)]
    every = bench.make_prompts(ck["splits"]["test"], ck["vocab"], 16)
    cases += [(q, args.new_tokens) for q in every[::max(1, 16 // args.prompts)][:args.prompts]]
    print("| prompt | decoder | block efficiency | tokens a call, rows / tree | ms a token, rows / "
          "tree | tree / rows | both equal greedy |\n| ---: | --- | ---: | ---: | ---: | ---: | :---: |")
    for i, (prompt, n) in enumerate(cases):
        greedy = minibpd.greedy_decode(model, prompt, n)
        for name in args.decoders.split(","):
            got = {v: timed(model, prompt, n, decoders.make(name, res, chosen[name]), v, args.rounds)
                   for v in ("batch", "tree")}
            (rows, rs, rt), (tree, ts, tt) = got["batch"], got["tree"]
            assert rs["accepted"] == ts["accepted"], "rows and tree accepted differently"
            print(f"| {i} | {name} | {ts['block_efficiency']:.3f} | "
                  f"{rs['processed'] / rs['calls']:.1f} / {ts['processed'] / ts['calls']:.1f} | "
                  f"{1e3 * rt / n:.0f} / {1e3 * tt / n:.0f} | {tt / rt:.2f}x | "
                  f"{'yes' if rows == tree == greedy else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
