"""machine: the real model's precision and blocks chosen for this CPU by measurement (ours;
docs/real-model.md, "Which CPU gives what").

What a batch-invariant call's fixed blocks cost (models/llama.py) depends on the CPU: with bf16
dot products (AVX512-BF16, AMX) a bf16 block of 8 rows costs about what one row does; without
them it costs in proportion to its rows, while a float32 one of 8 rows costs about 1.4 times one
row. Some kernels need no block at all: where a product of m rows gives every row the bits that
row gets alone (blocks.row_invariance), a call runs its own rows and stays batch-invariant. A
one-token call is memory-bound: int4 (blocks.int4_linear) reads an eighth of float32's bytes.

choose() times each precision (PRECISIONS) and block on the products of one decode call and
keeps the fastest (its docstring; docs/real-model.md, "Which CPU gives what"); the answer is
cached (models/machine_cache.py) and applied at load (apply). --dtype still picks the precision.
"""
import copy
import statistics
import sys
import time

import torch

from minibpd import KVCache
from models import blocks
from models.machine_cache import (FORMAT, PRECISIONS, key_text, key_tuple, load_choice,
                                  machine_key, others_share, save_if_quiet)

TIE = 0.1          # verifications within 10% count as tied (fastest)
ROUNDS = 3         # rounds of timings, their fastest kept (measure)
MOST_FREE = 8      # rows a row-invariant product takes at once (a call splits into such chunks)


class Weight:
    """A stand-in Linear (weight, bias) of one of the model's shapes, random, in `dtype`, on
    4-bit groups with bits=4."""

    def __init__(self, out_features, in_features, dtype, bits=None):
        g = torch.Generator().manual_seed(out_features * 7 + in_features)
        self.weight = (torch.randn(out_features, in_features, generator=g) * 0.02).to(dtype)
        self.bias, self.bits = None, bits


def shapes(cfg):
    """(out, in, count) of every product a decode call makes per token row: each layer's q/k/v,
    attention output, gate/up and down projections, then the output head."""
    qkv = (cfg.n_head + 2 * cfg.n_kv_head) * cfg.head_dim
    return [(qkv, cfg.n_embd, cfg.n_layer), (cfg.n_embd, cfg.n_embd, cfg.n_layer),
            (2 * cfg.n_hidden, cfg.n_embd, cfg.n_layer), (cfg.n_embd, cfg.n_hidden, cfg.n_layer),
            (cfg.vocab_size, cfg.n_embd, 1)]


def to_stderr(line):
    """The default log: stderr, so that a command's stdout (its --json) stays its output."""
    print(line, file=sys.stderr)


def clock():
    """The timer of every measurement here: with one torch thread (the real model's default),
    this process's CPU time, which leaves out the time slices another process takes on a busy
    machine; with more threads, wall-clock, as CPU time would add the threads' times up."""
    return time.process_time() if torch.get_num_threads() == 1 else time.perf_counter()


def call_ms(layers, rows, m, free):
    """ms of the products of one decode call of m token rows (every layer's, one after another,
    as the model runs them): in fixed blocks of `rows`, or with `free` on the kernels' own rows
    (blocks.FREE set for these weights only while timing). One call timed after a warm-up
    (which packs the weights); measure() keeps the fastest of ROUNDS such timings."""
    keys, saved = {blocks.kernel_key(w) for w in layers}, dict(blocks.FREE)
    for key in keys:
        blocks.FREE.pop(key, None)
        if free:
            blocks.FREE[key] = MOST_FREE
    try:
        xs = {w.weight.shape[1]: torch.randn(m, w.weight.shape[1]) for w in layers}
        call = lambda: [blocks.linear_rows(w, xs[w.weight.shape[1]], rows) for w in layers]
        call()
        t0 = clock()
        call()
        ms = 1e3 * (clock() - t0)
    finally:
        blocks.FREE.clear()
        blocks.FREE.update(saved)
    return ms


def stand_ins(cfg, precision):
    """Stand-ins of every weight of one decode call (shapes), each its own tensor: a call streams
    the model's weights from memory, and one weight timed again and again would sit in the
    CPU's cache and flatter the formats with the most bytes (it did: float32 over int4)."""
    dtype, bits = PRECISIONS[precision], 4 if precision == "int4" else None
    *trunk, (vocab, width, _) = shapes(cfg)        # the output head stays in dtype
    layers = []
    for o, i, n in trunk:
        first = Weight(o, i, dtype, bits)
        layers += [first] + [copy.deepcopy(first) for _ in range(n - 1)]
    return layers + [Weight(vocab, width, dtype)]


def cpu_has(probe):
    """A torch.cpu probe (private: `_is_amx_tile_supported`, `_is_avx512_bf16_supported`); where
    this torch lacks it, the feature counts as absent."""
    return bool(getattr(torch.cpu, probe, lambda: False)())


def candidates(dtype):
    """Blocks worth timing for a dtype: 1 row, 8 rows (16 with AMX tiles)."""
    return [1, 8] + [16] * (cpu_has("_is_amx_tile_supported") and dtype == torch.bfloat16)


def measure(layers, precision, h):
    """-> ({label: (ms of a 1-row call's products, ms of an h-row call's)}, {kernel: the rows
    it is row-invariant for}) for one precision (PRECISIONS) and its stand-in weights (layers):
    fixed blocks, and the kernels' own rows where every shape allows it."""
    free = {}
    for w in layers:                                      # one probe per kernel
        key = key_text(blocks.kernel_key(w))
        if key not in free:
            free[key] = blocks.row_invariance(w, MOST_FREE)
    call = lambda rows, m, own: call_ms(layers, rows, m, own)
    settings = {f"blocks of {rows}": (rows, False) for rows in candidates(PRECISIONS[precision])}
    if all(v == MOST_FREE for v in free.values()):    # own rows: blocks of 1 without the cost
        settings["own rows"] = (1, True)
        del settings["blocks of 1"]
    # ROUNDS rounds, the candidates alternated, the fastest of each kept: another process on a
    # shared machine slows some timings, never speeds one up (one round flipped the choice here).
    rounds = [{k: (call(rows, 1, own), call(rows, h, own)) for k, (rows, own) in settings.items()}
              for _ in range(ROUNDS)]
    return {k: tuple(min(r[k][i] for r in rounds) for i in (0, 1)) for k in settings}, free


def precisions(cfg):
    """The precisions worth timing here: bf16 and float32, and int4 where this torch has its CPU
    kernel and it takes every trunk shape of cfg (blocks.int4_problem)."""
    fits = all(not blocks.int4_problem(Weight(o, i, torch.float32, 4))
               for o, i, _ in shapes(cfg)[:-1])
    return ["bfloat16", "float32"] + ["int4"] * fits


def choose(cfg, h, be=None):
    """The fastest batch-invariant setting of each precision (precisions()), and of
    all ("best"): per precision its row_block, the free rows of its kernels when it runs on
    their own rows, and every timing (call_costs_for adds the loaded model's call_ms). With `be`
    ({heads k: block efficiency}, the checkpoint's), "best" is the precision whose BPD costs the
    fewest ms of products a token (call_rows_ms, decode_ms); without it, the fastest verification."""
    out = {"format": FORMAT, "key": machine_key(), "h": h, "dtypes": {}}
    for name in precisions(cfg):
        layers = stand_ins(cfg, name)          # built once: measure and call_rows_ms time them
        ms, free = measure(layers, name, h)
        pick = fastest(ms)
        e = out["dtypes"][name] = {
            "row_block": 1 if pick == "own rows" else int(pick.split()[-1]), "pick": pick,
            "free": free if pick == "own rows" else {},
            "ms": {k: [round(a, 3), round(b, 3)] for k, (a, b) in ms.items()}}
        if be:
            e["rows_ms"] = call_rows_ms(layers, e, h)
            e["token_ms"] = round(decode_ms(e["rows_ms"], be)[0], 3)
    per = out["dtypes"]
    if be:
        out["best"] = min(per, key=lambda d: per[d]["token_ms"])
    else:
        out["best"] = fastest({d: per[d]["ms"][per[d]["pick"]] for d in per})
    return out


def call_rows_ms(layers, entry, h):
    """ms of the products of a decode call of 1 to h rows on a precision's stand-in weights
    (layers) in its picked setting (entry), the fastest of ROUNDS rounds: a kernel may cost the
    same for 1 to 4 rows and twice that for 5 (int4's on AVX2), which the 1-row and h-row
    timings alone cannot show."""
    one, most = entry["ms"][entry["pick"]]
    own = entry["pick"] == "own rows"
    mid = [min(call_ms(layers, entry["row_block"], m, own) for _ in range(ROUNDS))
           for m in range(2, h)]
    return [round(x, 3) for x in [one, *mid, most][:h]]


def decode_ms(rows_ms, be):
    """-> (ms of products a BPD token costs, on the heads k that make it cheapest): the ms of a
    k-row call over the block efficiency of k heads (be: {k: tokens a call}; k = 1 is greedy).
    Ours: a decode is a run of such calls. The products leave out attention, norms and Python,
    which narrow the gaps; on the CPU measured the products' order was decoding's
    (docs/results/real-model-runs.md, runs AG to AI)."""
    ks = [k for k in range(1, len(rows_ms) + 1) if 0 < be.get(k, 0) < float("inf")]
    k = min(ks, key=lambda k: rows_ms[k - 1] / be[k])
    return rows_ms[k - 1] / be[k], k


def fastest(ms):
    """The label of {label: (ms of a greedy step, ms of a verification)} whose verification is
    fastest, counting those within TIE of it as tied, the tie going to the fastest greedy step
    (ours: a verification a few per cent dearer is worth a much cheaper one-token call)."""
    best = min(v for _, v in ms.values())
    return min((k for k, (_, v) in ms.items() if v <= best * (1 + TIE)), key=lambda k: ms[k][0])


def choice_for(path, cfg, h, log=to_stderr, be=None):
    """The choice for the checkpoint at `path` (its block efficiency by heads: be): cached, or
    measured now (once per machine, seconds) and cached (save_if_quiet: not when other processes
    competed for the CPUs)."""
    data = load_choice(path, log)
    if data is None:
        t0 = time.perf_counter()
        data, share = others_share(lambda: choose(cfg, h, be=be))
        log(f"machine: measured this CPU's products ({time.perf_counter() - t0:.1f} s), "
            f"{save_if_quiet(path, data, share)}")
    return data


CALL_CACHED = 64   # tokens in the KV cache when call_costs times a call


@torch.no_grad()
def call_costs(model, reps=5):
    """ms of one whole decode call of the loaded model for k = 1..h new token rows after
    CALL_CACHED cached ones: the trunk, the verified logits of its k rows and the heads' at the
    last (k = 1: a greedy step; k = h: a BPD verification), products, attention and Python alike.
    The median of `reps`, the k interleaved, after a warm-up; decoders.speed_heads reads them
    (as call_rows_ms says, fewer heads can be the faster BPD)."""
    h, dev = model.config.n_bpd_heads, model.tok_emb.weight.device
    cache = KVCache(model)
    model(torch.zeros(1, CALL_CACHED, dtype=torch.long, device=dev), cache)
    cache.advance(CALL_CACHED)

    def call(k):
        model.lm_head.memo = None                # a new row each call: no logits to copy
        z = model(torch.ones(1, k, dtype=torch.long, device=dev), cache)    # [1, k, C]
        model.verified_logits(z)
        model.head_logits(z[:, -1])
    times = {k: [] for k in range(1, h + 1)}
    for rep in range(reps + 1):
        for k in times:
            t0 = clock()
            call(k)
            if rep:                               # rep 0: the warm-up
                times[k].append(1e3 * (clock() - t0))
    return [round(statistics.median(times[k]), 3) for k in times]


def call_costs_for(path, data, name, model, log=to_stderr):
    """call_costs of the loaded model in precision `name`, cached in the machine's choice (data,
    saved beside the checkpoint at `path`); measured once (a second or two)."""
    entry = data["dtypes"].get(name)
    if entry is None:
        return None
    got = entry.get("call_ms")
    if not (isinstance(got, list) and len(got) == model.config.n_bpd_heads):
        t0 = time.perf_counter()
        got, share = others_share(lambda: call_costs(model))
        entry["call_ms"] = got
        log(f"machine: timed {name} decode calls of 1 to {len(got)} rows "
            f"({time.perf_counter() - t0:.1f} s), {save_if_quiet(path, data, share)}")
    return got


def precision_name(dtype):
    """A torch dtype's name (torch.float32 -> "float32"); a precision's name as it is."""
    return dtype if isinstance(dtype, str) else str(dtype).split(".")[1]


def apply(data, dtype):
    """-> (row_block, a one-line reason) for `dtype` (a torch dtype, or "int4"), blocks.FREE
    updated with the kernels that run on their own rows."""
    name = precision_name(dtype)
    entry = data["dtypes"].get(name)
    if entry is None:
        return None, f"no measurement for {name} on this machine"
    for text, rows in entry["free"].items():
        blocks.FREE[key_tuple(text)] = rows
    one, h = entry["ms"][entry["pick"]]
    label = name + " (4-bit trunk weights, bf16 into its products)" * (name == "int4")
    token = f", of a BPD token {entry['token_ms']:.1f} ms" if "token_ms" in entry else ""
    return entry["row_block"], (f"{label}, {entry['pick']} (products of a greedy step {one:.1f} "
                                f"ms, of a verification of {data['h']} rows {h:.1f} ms{token} here)")
