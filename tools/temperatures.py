"""Block efficiency of every decoder at temperatures 0, 0.5 and 1 (docs/results/sampling.md's table).

    python tools/temperatures.py          # shipped checkpoint, test split, ~3 minutes on 2 cores

The bench's 16 test-split prompts x 128 new tokens, the tuned settings, one generator seeded 0
per temperature. Block efficiency is exact for a given seed; at T > 0 it varies a little with
the seed (the sampled tokens differ), and on another device the sampled tokens can differ too.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lab import bench
import decoders  # noqa: E402
from lab.distribution import accepted_share
from minibpd import greedy_decode
from runtime.checkpoint import CHECKPOINT, load  # noqa: E402 (the lab's loader: FastGPT, SmolLM2)
from runtime.loop import lab_decode  # noqa: E402 (T > 0 is the lab's: speculative sampling)
from runtime.threads import set_threads


def main(temperatures=(0.0, 0.5, 1.0), n=128):
    set_threads()
    model, ck = load()
    chosen = decoders.settings(decoders.load_tuned(decoders.tuned_path(CHECKPOINT), CHECKPOINT))
    prompts = bench.make_prompts(decoders.split_text(ck, "test"), ck["vocab"], 16)
    res = decoders.Resources(model, ck)
    answers = [p + greedy_decode(model, p, n) for p in prompts]
    rows = {name: [] for name in decoders.DECODERS}
    for T in temperatures:
        gen = torch.Generator().manual_seed(0)
        for name in decoders.DECODERS:
            runs = [lab_decode(model, p, n, decoders.make(name, res, chosen[name], f), T, gen)[1]
                    for p, f in zip(prompts, answers)]
            be = len(prompts) * n / sum(r["calls"] for r in runs)
            acc = accepted_share([s for r in runs for s in r["steps"]]) if T > 0 else None
            rows[name].append(f"{be:.3f}" + (f" ({100 * acc:.0f}%)" if acc is not None else ""))
            print(f"T={T} {name}: {rows[name][-1]}", file=sys.stderr, flush=True)
    print("| decoder | " + " | ".join(f"T = {T}" for T in temperatures) + " |")
    print("| --- |" + " ---: |" * len(temperatures))
    for name, cells in rows.items():
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
