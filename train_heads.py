"""Train the minibpd model: a character-level GPT trunk with h BPD heads, trained jointly (Kim §4),
plus the small neural rescorer LM used for local rescoring (Kim §7.1); or self-distil the heads
of a trained model on its own greedy output (--distill).

    python train_heads.py --force               # retrain the shipped checkpoints/minibpd.pt
    python train_heads.py --data my.txt --out my.pt --steps 500

    # Python source, indentation kept: the standard library's own json package. 500 steps
    # learn the look of the code, not yet where an indented block ends.
    cat $(python -c "import os,json;print(os.path.dirname(json.__file__))")/*.py > /tmp/json_src.py
    python train_heads.py --data /tmp/json_src.py --out py.pt --steps 500
    python minibpd.py --checkpoint py.pt --prompt "def "

    # Self-distillation: heads 2..h learn the model's own greedy future
    python train_heads.py --distill joint --threads 1    # -> checkpoints/minibpd-distilled.pt

Default corpus: the reference documentation that ships with every CPython (`pydoc_data.topics`),
cleaned so that the model learns prose rather than whitespace runs and table borders. A --data
file is used as it is (--clean applies the same cleaning). An existing --out is only overwritten
with --force. Unless given, the rescorer's size and steps scale with the base model's.
The thread count changes floating-point sums in their last bits, and training amplifies them:
the shipped checkpoint was trained with 2 threads (add --threads 2 to repeat it exactly).
"""
# This file reads top to bottom, like nanoGPT's train.py: the settings of a run, the joint loss
# (Kim §4), the one optimiser loop, and the base run (the model, then its rescorer LM, Kim §7.1).
# The command line (its flags, their checks, --distill, --tasks, --smollm) is training/cli.py.
import math
import time
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F

from minibpd import GPT


@dataclass
class TrainConfig:
    """The settings of the base model's run (train_heads.py's flags of the same names); the
    fine-tuning modes extend them (training/shared.py's RunConfig, from_args)."""
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


# ----------------------------------------------------------------------------- the joint loss

def batches(data, batch_size, length, gen):
    """Random windows of `length` tokens from the 1-D tensor `data`: [batch_size, length]."""
    ix = torch.randint(len(data) - length, (batch_size,), generator=gen)
    return torch.stack([data[i:i + length] for i in ix])


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
    """chunk [B, T + h] -> (joint loss, per-head losses [h]). Trunk and heads are trained jointly
    (Kim §4). The weighting is OUR choice: a weighted mean of the per-head losses, head 1 weighted
    1 and heads 2..h `head_weight` each (1.0: the plain mean). Stern trains one randomly chosen
    head a batch instead."""
    per_head, _ = head_losses(model, chunk)
    w = torch.full_like(per_head, float(head_weight))
    w[0] = 1.0
    return (w * per_head).sum() / w.sum(), per_head


# ----------------------------------------------------------------------------- the fit loop

def lr_at(step, steps, lr, warmup):
    """Linear warm-up, then cosine decay to lr / 10."""
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))))


def fit(model, cfg, loss_at, label, held_out=None, log=print):
    """The one optimiser loop (base model, rescorer, distillation, tasks): AdamW, warm-up + cosine
    decay, gradient clipping at 1.0, over the parameters that require grad. loss_at(step) ->
    (loss, the log's note on it). held_out: a token tensor whose head-1 loss the log shows now
    and then. -> seconds."""
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


# ----------------------------------------------------------------------------- the base run

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


def train_both(run, cfg, vocab, splits, gen, rescorer_layers, rescorer_embd, revision="unknown",
               cls=GPT):
    """The base model (cfg, a GPTConfig), then the small rescorer LM of Kim §7.1, both trained
    on splits["train"] (token tensors) -> the checkpoint dict, less its format_version, corpus
    and splits (the command line adds them). cls builds both models: GPT, or a twin of it that
    computes the same forward pass (training/cli.py hands in runtime.fast_heads.FastGPT)."""
    model = cls(cfg)
    print(f"model: {sum(p.numel() for p in model.parameters()):,} parameters, {cfg}")
    secs = train(model, splits["train"], run, gen, "heads", splits["tune"])
    losses, accs = evaluate(model, splits["test"])
    print("held-out (test) per head:  loss " + " ".join(f"{x:.3f}" for x in losses))
    print("                      top-1 acc " + " ".join(f"{x:.3f}" for x in accs))
    # The small rescorer LM (Kim §7.1): same class, one head, 2 attention heads.
    rcfg = replace(cfg, n_layer=rescorer_layers, n_head=2, n_embd=rescorer_embd, n_bpd_heads=1)
    rescorer = cls(rcfg)
    n, n_base = (sum(p.numel() for p in m.parameters()) for m in (rescorer, model))
    print(f"rescorer: {n:,} parameters ({n / n_base:.1%} of the base), n_layer {rcfg.n_layer}, "
          f"n_embd {rcfg.n_embd}, {run.rescorer_steps:,} steps")
    rsecs = train(rescorer, splits["train"], replace(run, steps=run.rescorer_steps),
                  gen, "rescorer", splits["tune"])
    print(f"rescorer: held-out loss {evaluate(rescorer, splits['test'])[0][0]:.3f}")
    return {"config": asdict(cfg), "model": half(model), "rescorer_config": asdict(rcfg),
            "rescorer": half(rescorer), "vocab": vocab, "seed": run.seed, "git_revision": revision,
            "train": {"steps": run.steps, "rescorer_steps": run.rescorer_steps,
                      "seconds": round(secs + rsecs), "test_loss": losses, "test_acc": accs,
                      "torch": str(torch.__version__)}}


if __name__ == "__main__":      # the command line: its flags, their checks, the other modes
    from training.cli import main
    main()
