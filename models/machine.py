"""machine: the real model's precision and blocks chosen for this CPU by measurement (ours).

A batch-invariant call pays for its products' fixed blocks (models/llama.py), and what a block
costs depends on the CPU: with bf16 dot products (AVX512-BF16, AMX) a bf16 block of 8 rows costs
about what one row does; without them a bf16 product is computed by widening to float32 and
costs in proportion to its rows, while a float32 one of 8 rows costs about 1.4 times one row.
And some kernels need no block at all: where a product of m rows gives every row the bits that
row gets alone (blocks.row_invariance; oneDNN's packed float32 kernels with AVX2, for one), a
call runs its own rows and stays batch-invariant.

choose() times, for each candidate (dtype; rows per block, or the kernel's own rows where it is
row-invariant), the products of one decode call of the model's shapes: one row (a greedy step)
and h rows (a BPD verification), and picks the fastest verification, those within 10% of it
counting as tied, then the fastest step (fastest). The
answer is cached beside the checkpoint (CHOICE_SUFFIX), keyed by the CPU, its kernel caps and
torch's version, and applied at load (apply). --dtype still chooses the dtype; the rest follows.
"""
import hashlib
import json
import os
import platform
import statistics
import time

import torch

from models import blocks

CHOICE_SUFFIX = ".machine.json"
FORMAT = 2         # the cache: {format, machines: [choice, one per machine key]}
CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
TIE = 0.1          # verifications within 10% count as tied (fastest)
ROUNDS = 3         # rounds of timings, their fastest kept (measure)
MOST_FREE = 8      # rows a row-invariant product takes at once (a call splits into such chunks)


def machine_key():
    """What decides the kernels here: the CPU's flags, the caps set on them, torch's version and
    its threads (a kernel may split rows among threads differently)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        flags = platform.processor()
    caps = {c: os.environ.get(c) for c in CAPS if os.environ.get(c)}
    return {"cpu_flags": hashlib.sha256(flags.encode()).hexdigest()[:16],
            "capability": torch.backends.cpu.get_cpu_capability(), "caps": caps,
            "torch": torch.__version__, "threads": torch.get_num_threads()}


class Weight:
    """A stand-in Linear (weight, bias) of one of the model's shapes, random, in `dtype`."""

    def __init__(self, out_features, in_features, dtype):
        g = torch.Generator().manual_seed(out_features * 7 + in_features)
        self.weight = (torch.randn(out_features, in_features, generator=g) * 0.02).to(dtype)
        self.bias = None


def shapes(cfg):
    """(out, in, count) of every product a decode call makes per token row: each layer's q/k/v,
    attention output, gate/up and down projections, then the output head."""
    qkv = (cfg.n_head + 2 * cfg.n_kv_head) * cfg.head_dim
    return [(qkv, cfg.n_embd, cfg.n_layer), (cfg.n_embd, cfg.n_embd, cfg.n_layer),
            (2 * cfg.n_hidden, cfg.n_embd, cfg.n_layer), (cfg.n_embd, cfg.n_hidden, cfg.n_layer),
            (cfg.vocab_size, cfg.n_embd, 1)]


def key_text(key):
    """A kernel key (blocks.kernel_key) as JSON text, and back (key_tuple)."""
    shape, dtype, device, packed = key
    return json.dumps([list(shape), dtype, device, packed])


def key_tuple(text):
    shape, dtype, device, packed = json.loads(text)
    return tuple(shape), dtype, device, packed


def call_ms(layer, rows, m, free, reps=5):
    """ms of one product of m token rows: in fixed blocks of `rows`, or with `free` on the
    kernel's own rows (blocks.FREE set for this weight only while timing)."""
    key, saved = blocks.kernel_key(layer.weight), dict(blocks.FREE)
    blocks.FREE.pop(key, None)
    if free:
        blocks.FREE[key] = MOST_FREE
    try:
        x = torch.randn(m, layer.weight.shape[1])
        blocks.linear_rows(layer, x, rows)                    # warm-up (and the packing)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            blocks.linear_rows(layer, x, rows)
            times.append(time.perf_counter() - t0)
    finally:
        blocks.FREE.clear()
        blocks.FREE.update(saved)
    return 1e3 * statistics.median(times)


def candidates(dtype):
    """Blocks worth timing for a dtype: 1 row, 8 rows (16 with AMX tiles)."""
    amx = bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())
    return [1, 8] + [16] * (amx and dtype == torch.bfloat16)


def measure(cfg, dtype, h):
    """-> ({label: (ms of a 1-row call's products, ms of an h-row call's)}, {kernel: the rows
    it is row-invariant for}) for one dtype: fixed blocks, and the kernels' own rows where every
    shape allows it."""
    layers = [(Weight(o, i, dtype), n) for o, i, n in shapes(cfg)]
    free = {key_text(blocks.kernel_key(w.weight)): blocks.row_invariance(w, MOST_FREE)
            for w, _ in layers}
    call = lambda rows, m, own: sum(n * call_ms(w, rows, m, own) for w, n in layers)
    settings = {f"blocks of {rows}": (rows, False) for rows in candidates(dtype)}
    if all(v == MOST_FREE for v in free.values()):
        settings["own rows"] = (1, True)
    # ROUNDS rounds, the candidates alternated, the fastest of each kept: another process on a
    # shared machine slows some timings, never speeds one up (one round flipped the choice here).
    rounds = [{k: (call(rows, 1, own), call(rows, h, own)) for k, (rows, own) in settings.items()}
              for _ in range(ROUNDS)]
    return {k: tuple(min(r[k][i] for r in rounds) for i in (0, 1)) for k in settings}, free


def choose(cfg, h, dtypes=(torch.bfloat16, torch.float32)):
    """The fastest batch-invariant setting of each dtype, and of all ("best"): per dtype its
    row_block, the free rows of its kernels when it runs on their own rows, and every timing."""
    out = {"format": FORMAT, "key": machine_key(), "h": h, "dtypes": {}}
    for dtype in dtypes:
        ms, free = measure(cfg, dtype, h)
        pick = fastest(ms)
        out["dtypes"][str(dtype).split(".")[1]] = {
            "row_block": 1 if pick == "own rows" else int(pick.split()[-1]), "pick": pick,
            "free": free if pick == "own rows" else {},
            "ms": {k: [round(a, 3), round(b, 3)] for k, (a, b) in ms.items()}}
    per = out["dtypes"]
    out["best"] = fastest({d: per[d]["ms"][per[d]["pick"]] for d in per})
    return out


def fastest(ms):
    """The label of {label: (ms of a greedy step, ms of a verification)} whose verification is
    fastest, counting those within TIE of it as tied, the tie going to the fastest greedy step
    (ours: a verification a few per cent dearer is worth a much cheaper one-token call)."""
    best = min(v for _, v in ms.values())
    return min((k for k, (_, v) in ms.items() if v <= best * (1 + TIE)), key=lambda k: ms[k][0])


def read_cache(path):
    """The choices cached beside a checkpoint, one per machine (a CPU capped at AVX2 is another
    machine): [choice], [] if none or unreadable."""
    try:
        with open(path + CHOICE_SUFFIX, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return []
    ok = isinstance(data, dict) and data.get("format") == FORMAT and \
        isinstance(data.get("machines"), list)
    return [c for c in data["machines"] if isinstance(c, dict)] if ok else []


def load_choice(path):
    """The cached choice beside a checkpoint, if one was made on this machine; else None."""
    key = machine_key()
    return next((c for c in read_cache(path) if c.get("key") == key and
                 isinstance(c.get("dtypes"), dict)), None)


def choice_for(path, cfg, h, log=print):
    """The choice for the checkpoint at `path`: cached, or measured now (once per machine, a
    few seconds) and cached beside it, with other machines' choices, where that folder is
    writable."""
    data = load_choice(path)
    if data is None:
        t0 = time.perf_counter()
        data = choose(cfg, h)
        others = [c for c in read_cache(path) if c.get("key") != data["key"]]
        try:
            with open(path + CHOICE_SUFFIX, "w", encoding="utf-8") as f:
                json.dump({"format": FORMAT, "machines": others + [data]}, f, indent=1)
        except OSError:
            pass
        log(f"machine: measured this CPU's products once ({time.perf_counter() - t0:.1f} s), "
            f"cached in {path + CHOICE_SUFFIX}")
    return data


def apply(data, dtype):
    """-> (row_block, a one-line reason) for `dtype` (a torch dtype), blocks.FREE updated with
    the kernels that run on their own rows."""
    name = str(dtype).split(".")[1]
    entry = data["dtypes"].get(name)
    if entry is None:
        return None, f"no measurement for {name} on this machine"
    for text, rows in entry["free"].items():
        blocks.FREE[key_tuple(text)] = rows
    one, h = entry["ms"][entry["pick"]]
    return entry["row_block"], (f"{name}, {entry['pick']} (products of a greedy step {one:.1f} "
                                f"ms, of a verification of {data['h']} rows {h:.1f} ms here)")
