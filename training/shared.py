"""shared: what every training run shares beyond train_heads.py (which holds the joint loss, the
one fit loop and evaluation): the corpus, the settings of every mode (RunConfig), the git revision
a checkpoint records, and the anchor of self-distillation. Errors are ValueErrors; the command
line (training/cli.py) makes them one line and exit 2.
"""
import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

import train_heads
from runtime.corpus import clean_text


# ----------------------------------------------------------------------------- the corpus

MAX_DATA_BYTES = 16 * 2 ** 20   # --data: at most 16 MiB (training holds every character as a tensor)


def check_data_size(path):
    """--data at most MAX_DATA_BYTES, refused before it is read (issue 40: memory grows with the
    text, with no bound); the documented uses (the default corpus, 0.47 MB; a module's source)
    are far smaller."""
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise ValueError(f"--data {path}: cannot read it ({e.strerror})") from None
    if size > MAX_DATA_BYTES:
        raise ValueError(f"--data {path} holds {size:,} bytes, more than the {MAX_DATA_BYTES:,} "
                         "train_heads.py reads: pass a smaller file")


def load_corpus(path=None, clean=None):
    """-> (text, description). Default: pydoc_data.topics, topics in sorted order, cleaned.
    A file is kept as it is unless clean=True: indentation is the point of, say, Python source;
    it holds at most MAX_DATA_BYTES (check_data_size)."""
    if path is None:
        import pydoc_data.topics as topics
        raw = "\n\n".join(topics.topics[k] for k in sorted(topics.topics))
        name, where = f"pydoc_data.topics (Python {sys.version.split()[0]})", "the default corpus"
    else:
        check_data_size(path)
        try:
            with open(path, encoding="utf-8") as f:
                raw = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--data {path}: cannot read it as UTF-8 text ({e})") from None
        name, where = path, f"--data {path}"
    cleaned = path is None if clean is None else clean
    text = clean_text(raw) if cleaned else raw
    if len(text) < 1000:
        raise ValueError(f"{where} has only {len(text)} characters{' after cleaning' if cleaned else ''}; "
             "give at least a few thousand")
    return text, {"name": name, "chars": len(text), "cleaned": cleaned,
                  "sha256": hashlib.sha256(text.encode()).hexdigest()}


def as_tensors(texts, vocab):
    """{split: text} -> {split: 1-D tensor of token ids}."""
    stoi = {c: i for i, c in enumerate(vocab)}
    return {k: torch.tensor([stoi[c] for c in v]) for k, v in texts.items()}


# ----------------------------------------------------------------------------- the settings of a run

@dataclass
class RunConfig(train_heads.TrainConfig):
    """Every setting a training run reads: the base run's (train_heads.TrainConfig) and those of
    the fine-tuning modes, train_heads.py's flags of the same names (argparse stays in
    training/cli.py: RunConfig.from_args), so the library takes one typed object. The defaults
    are the base model's run; --distill, --tasks and --smollm change some (training/finetune.py)."""
    distill: str = None           # --distill: 'frozen' or 'joint'
    base: str = None              # --distill, --tasks: the checkpoint to start from
    regen_every: int = 50         # --distill: steps between regenerations of the greedy data
    gen_rows: int = 128           # --distill: greedy continuations per regeneration
    anchor: float = 0.0           # --distill joint: weight of head 1's KL from the base
    teacher: str = "current"      # --distill: who generates the greedy data
    teacher_tokens: int = 0       # --smollm: positions of teacher forcing before self-distillation
    teacher_steps: int = 0        # --smollm: optimizer steps on them
    teacher_targets: str = "exact"  # --smollm: 'exact' (greedy's tokens only) or 'all' argmaxes
    draft_vocab: int = 0          # --smollm: tokens heads 2..h draft among (0: all)
    head_form: str = "stern"      # --smollm: heads 2..h's form (models.llama.HEAD_FORMS)
    continuations: int = 0        # --smollm: train-split greedy continuations (0: CONTINUATIONS')
    chat_continuations: int = 0   # --smollm: train-split chat-question ones (0: none)

    @classmethod
    def from_args(cls, args):
        """The settings from an argparse Namespace (training.cli.parse_args), by field name."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


def git_revision():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# ----------------------------------------------------------------------------- quality guards

def anchor_kl(base, inputs, own, mask):
    """KL(base || model) of head 1 over the masked positions: own [B, T, V] the model's head-1
    logits on inputs [B, T], base a frozen model. Holds the next-token distribution to the base's
    on the model's own greedy text, so drifting into loops costs loss where it happens."""
    with torch.no_grad():
        ref = F.log_softmax(base.lm_head(base(inputs))[mask], dim=-1)            # [N, V]
    return F.kl_div(F.log_softmax(own[mask], dim=-1), ref, log_target=True, reduction="batchmean")
