"""checkpoint: loading a minibpd checkpoint safely, and characters <-> token ids.

A checkpoint is a dict saved by train_heads.py: format_version, config and model (the GPT's
state, fp16), rescorer_config and rescorer (the small LM of Kim §7.1), vocab (its characters),
corpus, splits (train / tune / test texts), seed, git_revision and a train record. It is loaded
with torch.load(..., weights_only=True), so a checkpoint cannot run code, and every way it can be
missing, corrupt or mismatched becomes one CheckpointError with a way out. minibpd re-exports
everything here (minibpd.load_checkpoint, minibpd.encode, ...).
"""
import os
import string

import torch

# The shipped checkpoint, found next to this file whatever the working directory.
CHECKPOINT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "checkpoints", "minibpd.pt")
FORMAT_VERSION = 1


class CheckpointError(Exception):
    """A checkpoint that is missing, corrupt, or does not match this code."""


def retrain(path=None):
    """How to make a checkpoint at `path` afresh (train_heads.py never overwrites without --force)."""
    out = "" if path in (None, CHECKPOINT) else f" --out {path}"
    return f"retrain it with `python train_heads.py{out} --force`"


def build_model(config, state, device="cpu", dtype=torch.float32, where="checkpoint", path=None):
    """GPT from a saved config dict and state dict, with a clear error on any mismatch."""
    from minibpd import GPT, GPTConfig      # here, not at the top: minibpd imports this module
    try:
        model = GPT(GPTConfig(**config))
        model.load_state_dict({k: v.float() for k, v in state.items()})
    except (TypeError, ValueError, RuntimeError, AttributeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{where} does not match this version of minibpd.py ({first}); "
                              f"{retrain(path)}") from None
    return model.to(device=device, dtype=dtype).eval()


def load_checkpoint(path=CHECKPOINT, device="cpu", dtype=torch.float32):
    """-> (model, checkpoint dict). Loaded with weights_only=True: a checkpoint cannot run code."""
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        out = "" if path == CHECKPOINT else f" --out {path}"
        raise CheckpointError(f"checkpoint {path} not found: run `python train_heads.py{out}` "
                              "to create it, or pass --checkpoint PATH") from None
    except Exception as e:  # truncated zip, not a torch file, unsafe pickle, ...
        raise CheckpointError(f"checkpoint {path} is corrupt or not a minibpd checkpoint "
                              f"({type(e).__name__}); {retrain(path)}") from None
    if not isinstance(ck, dict) or ck.get("format_version") != FORMAT_VERSION:
        found = ck.get("format_version") if isinstance(ck, dict) else None
        raise CheckpointError(f"checkpoint {path} has format {found!r}, this code reads format "
                              f"{FORMAT_VERSION}; {retrain(path)}")
    for key in ("config", "model", "vocab"):
        if key not in ck:
            raise CheckpointError(f"checkpoint {path} lacks '{key}'; {retrain(path)}")
    model = build_model(ck["config"], ck["model"], device, dtype, f"checkpoint {path}", path)
    if len(ck["vocab"]) != model.config.vocab_size:
        raise CheckpointError(f"checkpoint {path}: vocabulary size does not match its model")
    return model, ck


def encode(text, vocab):
    """Characters -> token ids, with a clear error for characters the model never saw."""
    stoi = {c: i for i, c in enumerate(vocab)}
    unknown = sorted({c for c in text if c not in stoi})
    if unknown:
        shown = ", ".join(repr(c) for c in unknown[:10])
        raise ValueError(f"the text contains characters the model never saw in training: {shown}; "
                         f"it knows {known_characters(vocab)}")
    return [stoi[c] for c in text]


def known_characters(vocab):
    """A short description of a vocabulary, e.g. "a-z, A-Z, 0-9 and ' !#(),.:' (68 in all)"."""
    runs = [r for r in (string.ascii_lowercase, string.ascii_uppercase, string.digits)
            if set(r) <= set(vocab)]
    rest = "".join(c for c in vocab if not any(c in r for r in runs))
    return ", ".join(f"{r[0]}-{r[-1]}" for r in runs) + (" and " if runs and rest else "") + \
        (repr(rest) if rest else "") + f" ({len(vocab)} in all)"


def decode(tokens, vocab):
    return "".join(vocab[t] for t in tokens)
