"""Where minibpd's one-token forward spends its time, beside transformers' (the same GGUF, the
same dtype, 1 thread): the profile behind docs/real-model.md, "Against transformers".

    python tools/peer_profile.py [--dtype float32|bfloat16|int4] [--reps 20] [--ops 12]
    python tools/peer_profile.py --kernels      # only the matmul kernel: 1 row against 8 and 16
    python tools/peer_profile.py --unpacked     # minibpd's products by F.linear (as before packing)
    python tools/peer_profile.py --head8        # the output head on 8-bit weights against float32

One decode call with CACHED = 64 tokens cached and 1 new one, logits included (what a greedy step
costs): minibpd batch-invariant (what runs), minibpd plain (batch_invariant off), transformers
(LlamaForCausalLM, its DynamicCache cropped back to 64 after each call); the median ms of --reps
calls, the three interleaved in every repetition. Then minibpd's parts, each timed alone on the
shapes of that call (one layer's parts x n_layer): the fixed row blocks (by_rows/padded_copy)
against the same part on the single row. Then torch.profiler's operator table for each (self
CPU time; what the table does not account for is Python and dispatch overhead). The load average
is printed before and after (a shared machine: compare ratios inside one run).

--kernels (no model needed): x @ W^T for 1, 8 and 16 rows, float32 and bf16, on 30 random weights
of gate_up's shape (3,072 x 576) cycled so that they are not cached and on one of the tied
projection's (49,152 x 576), the same with the weight stored transposed ([K, N], a copy), and
blocks.linear's product on the weight packed once (oneDNN's, where this CPU has it).

--head8 (no model needed): the output head's product (49,152 x 576, random weights) for the row
counts a decode call of 1 to 5 rows makes, float32 packed (what runs) against 8-bit weights with
one scale per row (torch's _weight_int8pack_mm, bf16 inputs: its float32-input path is 3-40x
slower here), interleaved, the median of ROUNDS rounds of medians of 10 calls; and whether the
8-bit product of 8 rows gives each row the bits of a one-row product (row invariance).
"""
import argparse
import os
import statistics
import sys
import time
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from models import attention, blocks, llama, llama_layers, peer, smollm  # noqa: E402
from minibpd import KVCache  # noqa: E402

CACHED = 64
TEXT = "The history of the city goes back more than two thousand years. " * 12


def ms(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def callers(ours, hf, ids):
    """{name: one-token call} for ours (batch-invariant and plain) and transformers."""
    from transformers import DynamicCache
    cache = KVCache(ours)
    ours(torch.tensor([ids[:CACHED]]), cache)
    cache.advance(CACHED)
    new = torch.tensor([ids[CACHED:CACHED + 1]])
    hf_cache = DynamicCache(config=hf.config)
    hf(torch.tensor([ids[:CACHED]]), cache=hf_cache, use_cache=True)

    def ours_call(bi):
        def call():
            ours.batch_invariant = bi
            ours.lm_head.memo = None           # a new row each step: no logits to copy
            ours.lm_head(ours(new, cache)[:, -1])
        return call

    def hf_call():
        hf(new, cache=hf_cache, use_cache=True, logits_to_keep=1)
        hf_cache.crop(-1)                      # back to CACHED tokens
    return {"minibpd batch-invariant": ours_call(True), "minibpd plain": ours_call(False),
            "transformers": hf_call}


def parts(ours, reps):
    """ms of each part of minibpd's one-token call, x n_layer where per layer: the fixed blocks
    (rows=row_block: 8, or 16 in bf16 with AMX, smollm.row_block_for) and the single row (rows=None)."""
    cfg, b = ours.config, ours.blocks[0]
    H, Hkv, d, C = cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.n_embd
    x = torch.randn(1, 1, C)
    q, k, v = torch.randn(1, H, 1, d), torch.randn(1, Hkv, CACHED + 1, d), torch.randn(1, Hkv, CACHED + 1, d)
    bias, y = attention.causal_bias(1, CACHED, torch.float32, x.device), torch.randn(1, 1, C)
    rope = [t[CACHED:CACHED + 1].float() for t in ours.rope]
    z = torch.randn(1, C)
    rows = cfg.row_block
    L = cfg.n_layer
    table = {
        "norm + qkv": (lambda r: llama.by_rows(lambda t: b.qkv(b.attn_norm(t)), x, r), L),
        "rotary (q, k)": (lambda r: (llama_layers.rotate(q, *rope), llama_layers.rotate(k[:, :, :1], *rope)), L),
        "attention": (lambda r: attention.attention(q, k, v, bias, r, cfg.key_block), L),
        "out projection": (lambda r: llama.by_rows(b.out, y, r), L),
        "MLP (norm, gate_up, SiLU, down)": (lambda r: llama.by_rows(b.mlp, x, r), L),
        "final norm": (lambda r: llama.by_rows(ours.norm, x, r), 1),
        "output projection (49,152 x 576)": (lambda r: llama.by_rows(
            super(llama.TiedHead, ours.lm_head).forward, z, r), 1),
    }
    out = []
    with torch.no_grad():
        for name, (fn, times) in table.items():
            blocked, one = ms(lambda: fn(rows), reps) * times, ms(lambda: fn(None), reps) * times
            out.append((name, times, blocked, one))
    return out


def operator_table(fn, n, top):
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            fn()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events) / 1e3 / n
    rows = [(e.key, e.count // n, e.self_cpu_time_total / 1e3 / n) for e in events[:top]]
    return total, rows


def kernels():
    F = torch.nn.functional
    for dt in (torch.float32, torch.bfloat16):
        ws = [torch.randn(3072, 576).to(dt) for _ in range(30)]
        wts = [w.t().contiguous() for w in ws]
        big = torch.randn(49152, 576).to(dt)
        big_t = big.t().contiguous()
        layers = [types.SimpleNamespace(weight=w, bias=None) for w in ws]   # what linear() reads
        head = types.SimpleNamespace(weight=big, bias=None)
        for M in (1, 8, 16):
            x = torch.randn(M, 576).to(dt)
            with torch.no_grad():
                a = ms(lambda: [F.linear(x, w) for w in ws], 30) / 30
                b = ms(lambda: [x @ w for w in wts], 30) / 30
                e = ms(lambda: [blocks.linear(m, x) for m in layers], 30) / 30
                c, d = ms(lambda: F.linear(x, big), 10), ms(lambda: x @ big_t, 10)
                f = ms(lambda: blocks.linear(head, x), 10)
            packed = "packed" if blocks.packs(dt) else "F.linear: no packed kernel here"
            print(f"{str(dt)[6:]:<9} {M} row(s): 3,072 x 576 {a:.3f} ms (stored [K, N]: {b:.3f}; "
                  f"{packed}: {e:.3f}); 49,152 x 576 {c:.2f} ms (stored [K, N]: {d:.2f}; "
                  f"{packed}: {f:.2f})")


def head8(rounds=5):
    V, C = 49152, 576
    w = torch.randn(V, C) * 0.05
    scale = w.abs().amax(1) / 127                                     # one per row [V]
    q = torch.round(w / scale[:, None]).to(torch.int8)                # [V, C]
    head, s16 = types.SimpleNamespace(weight=w, bias=None), scale.bfloat16()
    int8 = lambda x: torch.ops.aten._weight_int8pack_mm(x.bfloat16(), q, s16)
    got = {}
    with torch.no_grad():
        for _ in range(rounds):
            for m in range(1, 6):
                x = torch.randn(m, C)
                got.setdefault(m, []).append((ms(lambda: blocks.linear(head, x), 10),
                                              ms(lambda: int8(x), 10)))
        x = torch.randn(8, C)
        same = torch.equal(int8(x), torch.cat([int8(x[i:i + 1].clone()) for i in range(8)]))
    print(f"output head 49,152 x 576, {torch.backends.cpu.get_cpu_capability()} kernels, ms:")
    for m, pairs in got.items():
        a, b = (statistics.median(col) for col in zip(*pairs))
        print(f"  {m} row(s): float32 packed {a:.2f}, 8-bit {b:.2f} ({b / a:.2f}x)")
    print(f"8-bit rows of an 8-row product == one-row products: {same}")


def load_average():
    return ' '.join(f'{x:.2f}' for x in os.getloadavg())


def interleaved(calls, reps):
    """{name: [ms of each of `reps` calls]}, the calls taking turns after one warm-up each."""
    got = {name: [] for name in calls}
    with torch.no_grad():
        for fn in calls.values():
            fn()
        for _ in range(reps):
            for name, fn in calls.items():
                t0 = time.perf_counter()
                fn()
                got[name].append(1e3 * (time.perf_counter() - t0))
    return got


def main():
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "int4"], default="float32",
                   help="minibpd's precision (int4: its 4-bit trunk, transformers in float32)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--ops", type=int, default=12)
    p.add_argument("--kernels", action="store_true")
    p.add_argument("--head8", action="store_true",
                   help="only the output head: float32 against 8-bit weights, 1 to 5 rows")
    p.add_argument("--unpacked", action="store_true",
                   help="minibpd's products by F.linear, not on packed weights (models/blocks.py)")
    args = p.parse_args()
    torch.set_num_threads(1)
    blocks.PACKED = not args.unpacked
    if args.kernels or args.head8:
        print(f"load average before: {load_average()}; 1 thread")
        kernels() if args.kernels else head8()
        return print(f"load average after: {load_average()}")
    dtype = smollm.INT4 if args.dtype == "int4" else getattr(torch, args.dtype)
    print(f"load average before: {load_average()}; {args.dtype}, 1 thread")
    ours, vocab = smollm.load(dtype=dtype)
    hf = peer.transformers_model(torch.float32 if args.dtype == "int4" else dtype)
    calls = callers(ours, hf, vocab.encode(TEXT)[:CACHED + 1])
    got = interleaved(calls, args.reps)
    base = statistics.median(got["transformers"])
    print(f"\none call, {CACHED} cached + 1 new, median of {args.reps} (interleaved):")
    for name, t in got.items():
        print(f"  {name:<24} {statistics.median(t):7.2f} ms  {statistics.median(t) / base:.2f}x transformers")
    print("\nminibpd's parts, each alone (ms per call: x layers where per layer):")
    print(f"| part | x | {ours.config.row_block}-row blocks (batch-invariant) | the one row | blocks / row |")
    print("| --- | ---: | ---: | ---: | ---: |")
    summed = [0.0, 0.0]
    for name, times, blocked, one in parts(ours, args.reps):
        summed = [summed[0] + blocked, summed[1] + one]
        print(f"| {name} | {times} | {blocked:.2f} | {one:.2f} | {blocked / one:.2f} |")
    print(f"| sum of the parts | | {summed[0]:.2f} | {summed[1]:.2f} | {summed[0] / summed[1]:.2f} |")
    for name, fn in calls.items():
        total, rows = operator_table(fn, 10, args.ops)
        print(f"\n{name}: operators' self CPU {total:.2f} ms per call (wall {statistics.median(got[name]):.2f};"
              f" the rest: Python and dispatch outside the operators' own time)")
        for key, count, t in rows:
            print(f"  {key:<40} x{count:<5} {t:7.2f} ms")
    print(f"\nload average after: {load_average()}")


if __name__ == "__main__":
    main()
