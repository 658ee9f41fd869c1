"""bpd against sampled (the heads' argmax against draws from them) at T = 0.5 and 1, seeds 0-4:
is sampled's lead in docs/results/sampling.md's one-seed table more than the run-to-run spread?

    python tools/sampled_seeds.py         # shipped checkpoint, about a minute on 1 thread

tools/temperatures.py's setup (the bench's 16 test prompts x 128 tokens, the tuned settings),
except that each decoder gets a fresh generator seeded with the seed (temperatures.py runs every
decoder on one generator in turn).
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lab import bench  # noqa: E402
import decoders  # noqa: E402
from runtime.checkpoint import CHECKPOINT  # noqa: E402
from minibpd import bpd_decode, greedy_decode, load_checkpoint  # noqa: E402
from runtime.threads import set_threads  # noqa: E402


def main():
    set_threads()
    t0 = time.time()
    model, ck = load_checkpoint()
    chosen = decoders.settings(decoders.load_tuned(decoders.tuned_path(CHECKPOINT), CHECKPOINT))
    prompts = bench.make_prompts(decoders.split_text(ck, "test"), ck["vocab"], 16)
    res = decoders.Resources(model, ck)
    n = 128
    answers = [p + greedy_decode(model, p, n) for p in prompts]
    for T in (0.5, 1.0):
        for seed in range(5):
            row = []
            for name in ("bpd", "sampled"):
                gen = torch.Generator().manual_seed(seed)
                runs = [bpd_decode(model, p, n, decoders.make(name, res, chosen[name], f), T, gen)[1]
                        for p, f in zip(prompts, answers)]
                row.append(len(prompts) * n / sum(r["calls"] for r in runs))
            print(f"T={T} seed={seed} bpd={row[0]:.3f} sampled={row[1]:.3f}", flush=True)
    print(f"{time.time() - t0:.0f} s", torch.get_num_threads(), "threads")


if __name__ == "__main__":
    main()
