"""training: the library behind train_heads.py: the corpus, the losses, the one fit loop of every
training run (base model, rescorer, distillation, tasks), evaluation. Trunk and heads are trained
jointly (Kim §4). Errors are ValueErrors; the command line makes them one line and exit 2.
"""
import hashlib
import math
import subprocess
import sys
import time
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from runtime.checkpoint import clean_text


# ----------------------------------------------------------------------------- the corpus

def load_corpus(path=None, clean=None):
    """-> (text, description). Default: pydoc_data.topics, topics in sorted order, cleaned.
    A file is kept as it is unless clean=True: indentation is the point of, say, Python source."""
    if path is None:
        import pydoc_data.topics as topics
        raw = "\n\n".join(topics.topics[k] for k in sorted(topics.topics))
        name, where = f"pydoc_data.topics (Python {sys.version.split()[0]})", "the default corpus"
    else:
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
class TrainConfig:
    """Every setting a training run reads: train_heads.py's flags (argparse stays there:
    TrainConfig.from_args), so the library takes one typed object. The defaults are the base
    model's run; --distill, --tasks and --smollm change some (training/finetune.py)."""
    steps: int = 5000             # optimizer steps
    lr: float = 3e-3              # peak learning rate (AdamW): linear warm-up, cosine decay
    warmup: int = 100
    batch_size: int = 32          # windows per step (SmolLM2: positions per step)
    head_weight: float = 0.2      # loss weight of heads 2..h relative to head 1
    log_every: int = 100
    seed: int = 1337
    block_size: int = 128         # the context window (--tasks widens it)
    heads: int = 8                # h, head 1 included
    rescorer_steps: int = None    # the rescorer LM's steps (default: steps // 2)
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
        """The settings from an argparse Namespace (train_heads.parse_args), by field name."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


# ----------------------------------------------------------------------------- losses and the fit loop

def head_losses(model, chunk, mask=None, skip=0, logits=None):
    """Cross entropy and top-1 accuracy of heads skip+1..h on chunk [B, T + h]: head i at position
    t is scored on token t + i. mask [B, T] (optional): the positions that count. logits: every
    head's on chunk[:, :T], if already computed. -> ([h'], [h'])"""
    h = model.config.n_bpd_heads
    T = chunk.shape[1] - h
    logits = model.head_logits(model(chunk[:, :T])) if logits is None else logits
    logits = logits[:, :, skip:]                                                 # [B, T, h', V]
    targets = torch.stack([chunk[:, 1 + i:1 + i + T] for i in range(skip, h)], dim=-1)
    if mask is not None:
        logits, targets = logits[mask], targets[mask]                            # [N, h', V]
    ce = F.cross_entropy(logits.flatten(0, -2), targets.flatten(), reduction="none")
    hits = (logits.argmax(-1) == targets).float()
    return ce.view(-1, h - skip).mean(0), hits.view(-1, h - skip).mean(0)


def joint_loss(model, chunk, head_weight=1.0):
    """chunk [B, T + h] -> (joint loss, per-head losses [h]). Trunk and heads trained jointly (Kim
    §4), with our weighting: a weighted mean of the per-head losses, head 1 weighted 1 and heads
    2..h `head_weight` each (1.0: the plain mean; Stern trains one randomly chosen head a batch)."""
    per_head, _ = head_losses(model, chunk)
    w = torch.full_like(per_head, float(head_weight))
    w[0] = 1.0
    return (w * per_head).sum() / w.sum(), per_head


def batches(data, batch_size, length, gen):
    """Random windows of `length` tokens from the 1-D tensor `data`: [batch_size, length]."""
    ix = torch.randint(len(data) - length, (batch_size,), generator=gen)
    return torch.stack([data[i:i + length] for i in ix])


def lr_at(step, steps, lr, warmup):
    """Linear warm-up, then cosine decay to lr / 10."""
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))))


def fit(model, cfg, loss_at, label, held_out=None, log=print):
    """The one optimiser loop (base model, rescorer, distillation): AdamW, warm-up + cosine decay,
    gradient clipping at 1.0, over the parameters that require grad. loss_at(step) -> (loss,
    the log's note on it). held_out: a token tensor whose head-1 loss the log shows now and then.
    -> seconds."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.1, betas=(0.9, 0.95))
    model.train()
    t0 = time.time()
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg.steps, cfg.lr, cfg.warmup)
        loss, note = loss_at(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            el, tune = time.time() - t0, ""
            if held_out is not None and (step % (5 * cfg.log_every) == 0 or step == cfg.steps - 1):
                model.eval()
                tune = f" | tune loss head 1 {evaluate(model, held_out, 16)[0][0]:.3f}"
                model.train()
            log(f"[{label}] step {step:5d}/{cfg.steps} {note()} | {el / 60:.1f} min, "
                f"{(cfg.steps - step - 1) * el / (step + 1) / 60:.1f} min left" + tune)
    model.eval()
    return time.time() - t0


@torch.no_grad()
def evaluate(model, data, n_windows=64):
    """Per-head held-out loss and top-1 accuracy on evenly spaced windows of `data`."""
    span = model.config.block_size + model.config.n_bpd_heads
    starts = torch.linspace(0, len(data) - span - 1, n_windows).long()
    losses, accs = head_losses(model, torch.stack([data[i:i + span] for i in starts]))
    return losses.tolist(), accs.tolist()


# ----------------------------------------------------------------------------- training runs

def train(model, data, cfg, gen, label, held_out=None):
    """Joint training (joint_loss) on random windows of `data` -> seconds."""
    span, t0 = model.config.block_size + model.config.n_bpd_heads, time.time()

    def loss_at(step):
        loss, per_head = joint_loss(model, batches(data, cfg.batch_size, span, gen), cfg.head_weight)
        tok_s = (step + 1) * cfg.batch_size * span / max(1e-9, time.time() - t0)
        return loss, lambda: "loss/head " + " ".join(f"{x:.2f}" for x in per_head.tolist()) + \
            f" | {tok_s:,.0f} tok/s"
    return fit(model, cfg, loss_at, label, held_out)


def half(model):
    return {k: v.half() for k, v in model.state_dict().items()}   # fp16 on disk: half the MB


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
