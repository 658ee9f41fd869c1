"""checkpoint: reading a minibpd checkpoint file safely and building its model (load, behind
minibpd.load_checkpoint). Its text (the corpus and its split, characters <-> token ids) is
runtime/corpus.py's.

A checkpoint is a dict saved by train_heads.py: format_version, config and model (the GPT's
state, fp16), rescorer_config and rescorer (the small LM of Kim §7.1), vocab (its characters),
corpus, splits (train / tune / test texts), seed, git_revision and a train record. It is read
with torch.load(..., weights_only=True), so a checkpoint cannot run code, and every way it can be
missing, corrupt or mismatched becomes one CheckpointError with a way out.
"""
import hashlib
import importlib
import os
import shlex

import torch

from minibpd import CHECKPOINT, CheckpointError, GPTConfig, is_int, place
from train_heads import FORMAT_VERSION
from runtime.fast_heads import FastGPT
from runtime.kvcache import KVSpec

CHECKPOINTS = os.path.dirname(CHECKPOINT)     # the shipped checkpoints, beside minibpd.py


# A checkpoint's kind (train_kind) -> the train_heads.py mode that makes one afresh.
TRAIN_MODES = {None: "", "smollm2-heads": " --smollm", "tasks": " --tasks",
               "distill-frozen": " --distill frozen", "distill-joint": " --distill joint"}


def train_kind(ck):
    """The key of TRAIN_MODES for a checkpoint dict: its "kind" (a model family), else what
    fine-tuned it (--tasks, --distill VARIANT), else None (train_heads.py's character GPT)."""
    if not isinstance(ck, dict):
        return None
    if ck.get("kind") is not None:
        return ck["kind"]
    if "finetune" in ck or "tasks" in ck:
        return "tasks"
    variant = ck["distill"].get("variant") if isinstance(ck.get("distill"), dict) else None
    return f"distill-{variant}" if f"distill-{variant}" in TRAIN_MODES else None


def retrain(path=None, kind=None, ours=True):
    """How to make the checkpoint at `path` afresh: the train_heads.py command of its kind
    (train_kind). It names `--force` on `path` only where `path` holds a checkpoint of that kind
    (`ours`: a train_heads.py file, read or damaged) that is not shipped (shipped: under
    checkpoints/ in the repository); otherwise it trains a new file, which overwrites nothing."""
    if kind is not None and (not isinstance(kind, str) or kind not in TRAIN_MODES):
        return f"rebuild it with the tool that made {kind!r} checkpoints"
    mode = TRAIN_MODES[kind]
    if path is None or not ours or shipped(path):
        new = "my-heads.pt" if kind in MODEL_FAMILIES else "my-model.pt"
        return (f"train a new one with `python train_heads.py{mode} --out {new}` and pass "
                f"--checkpoint {new}")
    shown = os.path.relpath(path) if not os.path.relpath(path).startswith("..") else path
    return f"retrain it with `python train_heads.py{mode} --out {shlex.quote(shown)} --force`"


def shipped(path):
    """Whether `path` is (or links to) a file shipped in the repository's checkpoints/ folder."""
    folder = os.path.realpath(CHECKPOINTS)
    return os.path.commonpath([os.path.realpath(path), folder]) == folder


def sniffed_kind(path, size=1 << 16):
    """What a file torch cannot read (truncated, say) holds, from its first bytes: (whether it is
    a damaged train_heads.py checkpoint: a torch zip whose pickle, stored first, starts with
    its dict's format_version; its kind, from the model-family names there, or None)."""
    try:
        with open(path, "rb") as f:
            head = f.read(size)
    except OSError:
        return False, None
    ours = head.startswith(b"PK\x03\x04") and b"data.pkl" in head and b"format_version" in head
    kind = next((k for k in TRAIN_MODES if k and not k.startswith(("tasks", "distill"))
                 and k.encode() in head), None)
    return ours, kind if ours else None


def read(path=CHECKPOINT, needs=("config", "model", "vocab")):
    """The checkpoint dict at `path`, its format and keys checked (weights_only=True)."""
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        out = "" if path == CHECKPOINT else f" --out {path}"
        raise CheckpointError(f"checkpoint {path} not found: check the path, or train one there "
                              f"with `python train_heads.py{out}`") from None
    except Exception as e:  # truncated zip, not a torch file, unsafe pickle, ...
        ours, kind = sniffed_kind(path)
        raise CheckpointError(f"checkpoint {path} is corrupt or not a minibpd checkpoint "
                              f"({type(e).__name__}); {retrain(path, kind, ours)}") from None
    if not isinstance(ck, dict) or ck.get("format_version") != FORMAT_VERSION:
        found = ck.get("format_version") if isinstance(ck, dict) else None
        ours = isinstance(ck, dict) and "format_version" in ck    # another torch file: not ours
        raise CheckpointError(f"checkpoint {path} has format {found!r}, this code reads format "
                              f"{FORMAT_VERSION}; {retrain(path, train_kind(ck), ours)}")
    return require(ck, path, needs)


def require(ck, path, keys):
    for key in keys:
        if key not in ck:
            raise CheckpointError(f"checkpoint {path} lacks '{key}'; {retrain(path, train_kind(ck))}")
    return ck


INT4 = "int4"   # SmolLM2's precision with 4-bit trunk weights (models/blocks.int4_linear): no dtype
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "int4": INT4}


def dtype_of(ck, path):
    """The torch dtype a checkpoint asks for (its "dtype" key; float32 without one)."""
    name = ck.get("dtype", "float32")
    if not isinstance(name, str) or name not in DTYPES:     # a list: unhashable
        raise CheckpointError(f"checkpoint {path} has dtype {name!r}, not one of "
                              f"{', '.join(DTYPES)}; {retrain(path, train_kind(ck))}")
    return DTYPES[name]


# ----------------------------------------------------------------------------- building the model

def build_model(config, state, device="cpu", dtype=torch.float32, where="checkpoint", path=None,
                kind=None):
    """The GPT (its fast twin, runtime/fast_heads.py) of a saved config dict and state dict, with
    a clear error on any mismatch (which tensors disagree) and on weights that are not all
    finite (they would decode garbage); the way out names `path` and the train_heads.py mode of
    `kind` (train_kind). The config is checked against the weights' shapes before any model is
    built (a model built on the meta device holds no memory), so that a config asking for more
    than its weights hold (n_embd=65536, n_layer=10**7) is refused, never allocated."""
    how = retrain(path, kind)
    try:
        cfg = GPTConfig(**config)
        problem = tensors_problem(state) or blocks_problem(cfg, state)
        with torch.device("meta"):                          # shapes only, no memory
            shapes = None if problem else FastGPT(cfg).state_dict()
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: its config does not fit this minibpd.py ({e}); "
                              f"{how}") from None
    if problem:
        raise CheckpointError(f"{where}: {problem}; {how}")
    wrong = state_mismatch(shapes, state)
    if wrong:
        raise CheckpointError(f"{where} does not match its config ({wrong}); {how}")
    bad = first_nonfinite(state)
    if bad is not None:
        raise CheckpointError(f"{where}: tensor {bad} holds NaN or inf; {how}")
    model = FastGPT(cfg)
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return place(model, device, dtype)


def blocks_problem(cfg, state):
    """'' unless the config asks for more blocks or heads than the state dict holds weights
    for (then built, they would take memory in proportion before any shape could disagree)."""
    held = lambda part: len({k.split(".")[1] for k in state
                             if isinstance(k, str) and k.startswith(part + ".")})
    for name, want, have in (("n_layer", cfg.n_layer, held("blocks")),
                             ("n_bpd_heads", cfg.n_bpd_heads, held("heads") + 1)):
        if not is_int(want) or want > have:
            return f"its config says {name}={want!r}, its weights hold {have:,}"
    return ""


# A checkpoint's "kind" names the module that builds its model (absent: minibpd's GPT). That
# module offers from_checkpoint(ck, device, dtype) -> (model, vocab); adding a model family is
# one module and one line here.
MODEL_FAMILIES = {"smollm2-heads": "models.smollm"}


def family_module(ck, path="the checkpoint"):
    """The module of the checkpoint's model family (MODEL_FAMILIES), or None for minibpd's GPT."""
    family = ck.get("kind")
    if family is None:
        return None
    if not isinstance(family, str) or family not in MODEL_FAMILIES:     # a list: unhashable
        raise CheckpointError(f"checkpoint {path} is of kind {family!r}, which this minibpd does "
                              f"not know (known: {', '.join(MODEL_FAMILIES)})")
    return importlib.import_module(MODEL_FAMILIES[family])


class Outline:
    """What the budgets read of a model (config, kv_spec(): runtime.kvcache.check_cache_budget,
    decoders.check), from a checkpoint's header: no weights, so that a run's settings are
    checked against its model before the model is loaded."""

    def __init__(self, config, spec):
        self.config, self.spec = config, spec

    def kv_spec(self):
        return self.spec


def outline(ck, dtype=torch.float32):
    """The Outline of a checkpoint's model with weights in `dtype` (a model family's: its
    module's config_outline). A config that does not fit raises TypeError or ValueError."""
    family = family_module(ck)
    if family is not None:
        return family.config_outline(ck["config"], dtype)
    cfg = GPTConfig(**ck["config"])
    return Outline(cfg, KVSpec(cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, dtype,
                               torch.device("cpu")))


def load(path=None, device="cpu", dtype=None):
    """minibpd.load_checkpoint: -> (model, checkpoint dict). Read with weights_only=True: a
    checkpoint cannot run code. dtype None: the checkpoint's own (`ck["dtype"]`, else float32;
    a model family may choose: SmolLM2's is measured per machine, models/machine.py).
    A checkpoint of another model family (MODEL_FAMILIES, e.g. SmolLM2's heads) is built by its
    module; its ck["vocab"] may then be a tokenizer (encode/decode take either)."""
    path = CHECKPOINT if path is None else path
    ck = {**read(path, needs=("config",)), "path": path}      # path: for its errors
    asked, kind = dtype, train_kind(ck)
    dtype = dtype_of(ck, path) if dtype is None else dtype
    family = family_module(ck, path)
    if family is not None:          # its dtype None: the family's choice (SmolLM2: per machine)
        try:
            model, vocab = family.from_checkpoint(ck, device, asked)
        except (ValueError, ImportError) as e:
            raise CheckpointError(f"checkpoint {path}: {e}") from None
        return model.eval(), {**ck, "vocab": vocab}
    if dtype == INT4:
        raise CheckpointError(f"int4 is the real model's precision (SmolLM2's 4-bit GGUF weights); "
                              f"the character GPT of {path} takes float32 or float64")
    require(ck, path, ("model", "vocab"))
    model = build_model(ck["config"], ck["model"], device, dtype, f"checkpoint {path}", path, kind)
    vocab = ck["vocab"]
    if not isinstance(vocab, str) or len(set(vocab)) != len(vocab) or \
            len(vocab) != model.config.vocab_size:
        raise CheckpointError(f"checkpoint {path}: its vocab must be a string of "
                              f"{model.config.vocab_size} distinct characters, one per token; "
                              f"{retrain(path, kind)}")
    return model, ck


def first_nonfinite(state):
    """The name of the first tensor of a state dict holding NaN or inf, or None."""
    return next((k for k, v in state.items() if not torch.isfinite(v.float()).all()), None)


def tensors_problem(state):
    """'' if `state` is a dict of dense float tensors (what load_state_dict and a NaN check read),
    else what it is not: a sparse or meta tensor would fail deep inside torch, a complex one
    would load its real part with only a warning."""
    if not isinstance(state, dict) or not all(isinstance(k, str) and torch.is_tensor(v)
                                              for k, v in state.items()):
        return "its weights are not a dict of tensors by name"
    odd = next((k for k, v in state.items()
                if v.layout != torch.strided or v.is_meta or not v.is_floating_point()), None)
    if odd is not None:
        return f"tensor {odd} is not a dense float tensor ({state[odd].layout}, {state[odd].dtype})"
    return ""


def state_mismatch(want, got):
    """'' if the state dict `got` fits the model's `want`, else which tensors disagree."""
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    shapes = [f"{k}: {tuple(got[k].shape)} for {tuple(want[k].shape)}" for k in want
              if k in got and got[k].shape != want[k].shape]
    parts = [f"missing {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}"] if missing else []
    parts += [f"unexpected {', '.join(extra[:3])}{' ...' if len(extra) > 3 else ''}"] if extra else []
    return "; ".join(parts + [f"shapes {', '.join(shapes[:3])}"] * bool(shapes))


def file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):     # 1 MiB at a time: a GGUF is 98 MB
            digest.update(block)
    return digest.hexdigest()
