"""machine_cache: where models/machine.py's choice for a checkpoint is kept, and when: beside
the checkpoint (CHOICE_SUFFIX), or in the user's cache where that folder is read-only, one choice
per machine (machine_key: the CPU, its kernel caps, torch and its threads), checked when read (a
malformed one is measured again), and not kept at all when other processes competed for the CPUs
while it was measured (others_share, save_if_quiet).
"""
import hashlib
import json
import os
import platform
import time

import torch

CHOICE_SUFFIX = ".machine.json"
FORMAT = 4         # the cache: {format, machines: [choice, one per machine key]}
CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
PRECISIONS = {"bfloat16": torch.bfloat16, "float32": torch.float32, "int4": torch.float32}
# a precision's name -> its weights' dtype; int4: the trunk's products on 4-bit groups of its
# float32 weights (blocks.int4_linear), the output head in float32 (smollm.INT4)
BUSY = 0.25        # others' share of the CPUs while timing above which a choice is not cached


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


def key_text(key):
    """A kernel key (blocks.kernel_key) as JSON text, and back (key_tuple)."""
    shape, *rest = key
    return json.dumps([list(shape), *rest])


def key_tuple(text):
    shape, *rest = json.loads(text)
    return (tuple(shape), *rest)


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
    for key in ("call_ms", "rows_ms"):
        if key in e and not (isinstance(e[key], list) and all(map(is_ms, e[key]))):
            return f"{name}: {key} must be non-negative numbers"
    if "token_ms" in e and not is_ms(e["token_ms"]):
        return f"{name}: token_ms must be a non-negative number"
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
