"""machine: the real model's precision and blocks chosen for this CPU by measurement (ours).

A batch-invariant call pays for its products' fixed blocks (models/llama.py), and what a block
costs depends on the CPU: with bf16 dot products (AVX512-BF16, AMX) a bf16 block of 8 rows costs
about what one row does; without them a bf16 product is computed by widening to float32 and
costs in proportion to its rows, while a float32 one of 8 rows costs about 1.4 times one row.
And some kernels need no block at all: where a product of m rows gives every row the bits that
row gets alone (blocks.row_invariance; oneDNN's packed float32 kernels with AVX2, for one), a
call runs its own rows and stays batch-invariant. A one-token call is memory-bound: it reads every
weight once, so the fewer bytes a weight the faster; the int4 precision (blocks.int4_linear)
reads an eighth of float32's for the trunk, whose GGUF weights are 4-bit already.

choose() times, for each candidate (precision: PRECISIONS; rows per block, or the kernel's own rows where it is
row-invariant), the products of one decode call of the model's shapes: one row (a greedy step)
and h rows (a BPD verification), and picks the fastest verification, those within 10% of it
counting as tied, then the fastest step (fastest). The
answer is cached beside the checkpoint (CHOICE_SUFFIX; in the user's cache where that folder is
read-only), keyed by the CPU, its kernel caps and torch's version, checked when read (a malformed
one is measured again), and applied at load (apply). --dtype still chooses the precision; the rest
follows.
"""
import copy
import hashlib
import json
import os
import platform
import statistics
import sys
import time

import torch

from minibpd import KVCache
from models import blocks

CHOICE_SUFFIX = ".machine.json"
FORMAT = 3         # the cache: {format, machines: [choice, one per machine key]}
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


PRECISIONS = {"bfloat16": torch.bfloat16, "float32": torch.float32, "int4": torch.float32}
# a precision's name -> its weights' dtype; int4: the trunk's products on 4-bit groups of its
# float32 weights (blocks.int4_linear), the output head in float32 (smollm.INT4)


class Weight:
    """A stand-in Linear (weight, bias) of one of the model's shapes, random, in `dtype`, on
    4-bit groups with bits=4."""

    def __init__(self, out_features, in_features, dtype, bits=None):
        g = torch.Generator().manual_seed(out_features * 7 + in_features)
        self.weight = (torch.randn(out_features, in_features, generator=g) * 0.02).to(dtype)
        self.bias, self.bits = None, bits

    def copy(self):
        out = copy.copy(self)
        out.__dict__.pop("_derived", None)         # its own packed forms (blocks.derived)
        out.weight = self.weight.clone()
        return out


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


def key_text(key):
    """A kernel key (blocks.kernel_key) as JSON text, and back (key_tuple)."""
    shape, *rest = key
    return json.dumps([list(shape), *rest])


def key_tuple(text):
    shape, *rest = json.loads(text)
    return (tuple(shape), *rest)


def call_ms(layers, rows, m, free, reps=1):
    """ms of the products of one decode call of m token rows (every layer's, one after another,
    as the model runs them): in fixed blocks of `rows`, or with `free` on the kernels' own rows
    (blocks.FREE set for these weights only while timing). The median of `reps` calls after a
    warm-up (which packs the weights); measure() keeps the fastest of ROUNDS such timings."""
    keys, saved = {blocks.kernel_key(w) for w in layers}, dict(blocks.FREE)
    for key in keys:
        blocks.FREE.pop(key, None)
        if free:
            blocks.FREE[key] = MOST_FREE
    try:
        xs = {w.weight.shape[1]: torch.randn(m, w.weight.shape[1]) for w in layers}
        call = lambda: [blocks.linear_rows(w, xs[w.weight.shape[1]], rows) for w in layers]
        call()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
    finally:
        blocks.FREE.clear()
        blocks.FREE.update(saved)
    return 1e3 * statistics.median(times)


def stand_ins(cfg, precision):
    """Stand-ins of every weight of one decode call (shapes), each its own tensor: a call streams
    the model's weights from memory, and one weight timed again and again would sit in the
    CPU's cache and flatter the formats with the most bytes (it did: float32 over int4)."""
    dtype, bits = PRECISIONS[precision], 4 if precision == "int4" else None
    *trunk, (vocab, width, _) = shapes(cfg)        # the output head stays in dtype
    layers = []
    for o, i, n in trunk:
        first = Weight(o, i, dtype, bits)
        layers += [first] + [first.copy() for _ in range(n - 1)]
    return layers + [Weight(vocab, width, dtype)]


def candidates(dtype):
    """Blocks worth timing for a dtype: 1 row, 8 rows (16 with AMX tiles)."""
    amx = bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())
    return [1, 8] + [16] * (amx and dtype == torch.bfloat16)


def measure(cfg, precision, h):
    """-> ({label: (ms of a 1-row call's products, ms of an h-row call's)}, {kernel: the rows
    it is row-invariant for}) for one precision (PRECISIONS): fixed blocks, and the kernels' own
    rows where every shape allows it."""
    layers = stand_ins(cfg, precision)
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


def choose(cfg, h, names=None):
    """The fastest batch-invariant setting of each precision (default: precisions()), and of
    all ("best"): per precision its row_block, the free rows of its kernels when it runs on
    their own rows, and every timing (call_costs_for adds the loaded model's call_ms)."""
    out = {"format": FORMAT, "key": machine_key(), "h": h, "dtypes": {}}
    for name in precisions(cfg) if names is None else names:
        ms, free = measure(cfg, name, h)
        pick = fastest(ms)
        out["dtypes"][name] = {
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


def cache_files(path):
    """Where the choices for the checkpoint at `path` are cached: beside it, and, for a folder
    that is read-only, in the user's cache ($XDG_CACHE_HOME or ~/.cache, then minibpd/), under
    a name made from the checkpoint's absolute path."""
    full = os.path.abspath(path)
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    name = f"{os.path.basename(full)}-{hashlib.sha256(full.encode()).hexdigest()[:12]}"
    return [full + CHOICE_SUFFIX, os.path.join(home, "minibpd", name + CHOICE_SUFFIX)]


def read_cache(file):
    """The choices cached in `file`, one per machine (a CPU capped at AVX2 is another machine):
    [choice], [] if none or unreadable."""
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return []
    ok = isinstance(data, dict) and data.get("format") == FORMAT and \
        isinstance(data.get("machines"), list)
    return [c for c in data["machines"] if isinstance(c, dict)] if ok else []


def is_count(x, least=0):
    return isinstance(x, int) and not isinstance(x, bool) and x >= least


def is_ms(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < float("inf")


def entry_problem(name, e):
    """What is wrong with one precision's entry of a cached choice, or None."""
    if name not in PRECISIONS:
        return f"unknown precision {name!r}"
    if not isinstance(e, dict) or not isinstance(e.get("ms"), dict) or \
            not isinstance(e.get("free"), dict):
        return f"{name}: not an entry with 'ms' and 'free'"
    if not is_count(e.get("row_block"), 1) or e.get("pick") not in e["ms"]:
        return f"{name}: row_block or pick out of range"
    if not all(isinstance(v, list) and len(v) == 2 and all(map(is_ms, v)) for v in e["ms"].values()):
        return f"{name}: ms must be pairs of non-negative numbers"
    if "call_ms" in e and not (isinstance(e["call_ms"], list) and all(map(is_ms, e["call_ms"]))):
        return f"{name}: call_ms must be non-negative numbers"
    for text, rows in e["free"].items():
        try:
            key_tuple(text)
        except (ValueError, TypeError):
            return f"{name}: free kernel {text!r} is not a kernel key"
        if not is_count(rows, 1):
            return f"{name}: free rows must be positive integers"
    return None


def choice_problem(c):
    """What is wrong with a cached choice (hand-edited or damaged), or None: apply and
    call_costs_for read it without further checks."""
    if not is_count(c.get("h"), 1) or not isinstance(c.get("dtypes"), dict) or not c["dtypes"]:
        return "no positive 'h' or no 'dtypes'"
    if c.get("best") not in c["dtypes"]:
        return "'best' is not one of its precisions"
    return next(filter(None, (entry_problem(k, e) for k, e in c["dtypes"].items())), None)


def load_choice(path, log=lambda s: None):
    """The cached choice for the checkpoint at `path` (cache_files), if one was made on this
    machine and is well formed; else None. A malformed one is logged and ignored."""
    key = machine_key()
    for file in cache_files(path):
        for c in read_cache(file):
            if c.get("key") == key:
                problem = choice_problem(c)
                if problem is None:
                    return c
                log(f"machine: ignoring the malformed choice in {file} ({problem})")
    return None


BUSY = 0.25        # others' share of the CPUs while timing above which a choice is not cached


def others_share(fn):
    """-> (fn(), the share of all CPUs' time that other processes used while fn ran, or None
    where /proc/stat is not there to say). Ours: a timing taken while another process competes
    for the cores can pick another precision (it did: int4 under load, bf16 quiet, on one Xeon),
    and a cached choice is kept for good, so choice_for does not cache one measured busy."""
    def busy_s():           # (all CPUs' busy seconds, this process's CPU seconds)
        with open("/proc/stat", encoding="ascii") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]     # user .. steal
        mine = os.times()
        return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK"), mine[0] + mine[1]
    try:
        before, t0 = busy_s(), time.perf_counter()
    except (OSError, ValueError, AttributeError):            # not Linux: unknown
        return fn(), None
    out = fn()
    after, wall = busy_s(), time.perf_counter() - t0
    others = (after[0] - before[0]) - (after[1] - before[1])
    return out, max(0.0, others) / (wall * (os.cpu_count() or 1))


def save_if_quiet(path, data, share):
    """save_choice unless other processes used more than BUSY of the CPUs while `data` was
    measured. -> where it went, in words."""
    if share is not None and share > BUSY:
        return (f"not cached: other processes used {share:.0%} of the CPUs meanwhile, so the next "
                "load measures again (`--dtype` pins a precision)")
    file = save_choice(path, data)
    return f"cached in {file}" if file else \
        f"not cached: neither {' nor '.join(cache_files(path))} could be written"


def choice_for(path, cfg, h, log=to_stderr):
    """The choice for the checkpoint at `path`: cached, or measured now (once per machine, a
    few seconds) and cached (save_if_quiet: not when other processes competed for the CPUs)."""
    data = load_choice(path, log)
    if data is None:
        t0 = time.perf_counter()
        data, share = others_share(lambda: choose(cfg, h))
        log(f"machine: measured this CPU's products ({time.perf_counter() - t0:.1f} s), "
            f"{save_if_quiet(path, data, share)}")
    return data


def save_choice(path, data):
    """Cache a machine's choice, with other machines' choices, beside the checkpoint, or in the
    user's cache where that folder is read-only (cache_files). -> the file written, or None."""
    for file in cache_files(path):
        others = [c for c in read_cache(file) if c.get("key") != data["key"]]
        try:
            os.makedirs(os.path.dirname(file), exist_ok=True)
            with open(file, "w", encoding="utf-8") as f:
                json.dump({"format": FORMAT, "machines": others + [data]}, f, indent=1)
            return file
        except OSError:
            continue
    return None


CALL_CACHED = 64   # tokens in the KV cache when call_costs times a call


@torch.no_grad()
def call_costs(model, reps=5):
    """ms of one whole decode call of the loaded model for k = 1..h new token rows after
    CALL_CACHED cached ones: the trunk, the verified logits of its k rows and the heads' at the
    last (k = 1: a greedy step; k = h: a BPD verification), products, attention and Python alike.
    The median of `reps`, the k interleaved, after a warm-up. A kernel that costs the same for 1
    to 4 rows and twice that for 5 (int4's, AVX2) makes fewer heads the faster BPD
    (decoders.speed_heads)."""
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
            t0 = time.perf_counter()
            call(k)
            if rep:                               # rep 0: the warm-up
                times[k].append(1e3 * (time.perf_counter() - t0))
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
    return entry["row_block"], (f"{label}, {entry['pick']} (products of a greedy step {one:.1f} "
                                f"ms, of a verification of {data['h']} rows {h:.1f} ms here)")
