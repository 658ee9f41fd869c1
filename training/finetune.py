"""finetune: training a trained model further, from --base: self-distillation of its heads on its
own greedy output (--distill), and one model for the five tasks (--tasks). BPD heads for a
frozen pretrained LM (--smollm) are training/smollm_heads.py's. training/cli.py is the command
line; train_heads.py holds the fit loop all use.
"""
import copy
import dataclasses
import math
import os
import random
import time

import torch
import torch.nn.functional as F

from lab import tasks
from minibpd import CHECKPOINT, CheckpointError
from runtime.checkpoint import build_model, file_sha256, load, train_kind
from runtime.fast_heads import FastGPT
from runtime.loop import decode_rows
from train_heads import (as_tensors, batches, evaluate, fit, git_revision, half, head_losses,
                         train)


# ----------------------------------------------------------------------------- self-distillation
# Heads 2..h learn the model's own greedy continuations, what verification checks (a greedy
# window is its own target): docs/training.md, "Self-distilled heads". The variants (--distill
# frozen or joint, --teacher, --anchor) and what each did: docs/results/training.md,
# "Self-distillation variants". The rescorer, vocabulary and splits are copied from --base.

DISTILLED = os.path.join(os.path.dirname(CHECKPOINT), "minibpd-distilled.pt")
VARIANTS, TEACHERS = ("frozen", "joint"), ("current", "base")
# Fine-tuning, not training from scratch: fewer steps and a gentler peak than the base run.
# Applied to every one of these flags that is not given on the command line.
DISTILL_DEFAULTS = {"steps": 600, "lr": 1e-3, "warmup": 30, "out": DISTILLED}


def greedy_windows(model, data, rows, gen):
    """-> (windows [rows, T + h], mask [rows, T]): train-split prompts of one random length, each
    continued greedily to a full training window (runtime.loop.decode_rows, greedy_decode's windows);
    the mask keeps the positions whose targets are all generated (t >= prompt length - 1)."""
    T, h = model.config.block_size, model.config.n_bpd_heads
    plen = int(torch.randint(max(1, T // 8), max(2, 3 * T // 4) + 1, (1,), generator=gen))
    ix = torch.randint(len(data) - plen, (rows,), generator=gen)
    was_training = model.training
    model.eval()
    windows = decode_rows(model, torch.stack([data[i:i + plen] for i in ix]), T + h - plen)
    model.train(was_training)
    return windows, (torch.arange(T) >= plen - 1).expand(rows, T)


def anchor_kl(base, inputs, own, mask):
    """KL(base || model) of head 1 over the masked positions: own [B, T, V] the model's head-1
    logits on inputs [B, T], base a frozen model. Holds the next-token distribution to the base's
    on the model's own greedy text, so drifting into loops costs loss where it happens."""
    with torch.no_grad():
        ref = F.log_softmax(base.lm_head(base(inputs))[mask], dim=-1)            # [N, V]
    return F.kl_div(F.log_softmax(own[mask], dim=-1), ref, log_target=True, reduction="batchmean")


def greedy_agreement(model, data, rows=64, seed=0):
    """Per-head top-1 agreement with the model's own greedy tokens on continuations of `data`
    prompts (heads 2..h; head 1 is greedy by definition): what BPD's verification checks."""
    windows, mask = greedy_windows(model, data, rows, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return head_losses(model, windows, mask, skip=1)[1].tolist()


def distill_loss(model, splits, cfg, gen, teacher, base=None):
    """-> loss_at(step) for fit: joint: head 1 on a corpus batch plus head_weight x heads 2..h and
    anchor x head 1's KL from `base` (anchor_kl) on a greedy batch, a weighted mean as
    joint_loss; frozen: heads 2..h only."""
    T, h, w, a, pool = (model.config.block_size, model.config.n_bpd_heads, cfg.head_weight,
                        cfg.anchor, {})

    def loss_at(step):
        if step % cfg.regen_every == 0:
            g0 = time.time()
            pool["windows"], pool["mask"] = greedy_windows(teacher, splits["train"], cfg.gen_rows, gen)
            pool["gen_s"] = pool.get("gen_s", 0.0) + time.time() - g0
        pick = torch.randint(cfg.gen_rows, (cfg.batch_size,), generator=gen)
        windows, mask = pool["windows"][pick], pool["mask"][pick]
        logits = model.head_logits(model(windows[:, :T]))                  # [B, T, h, V]
        heads = head_losses(model, windows, mask, skip=1, logits=logits)[0]
        kl = anchor_kl(base, windows[:, :T], logits[:, :, 0], mask) if a else torch.zeros(())
        if cfg.distill == "joint":
            chunk = batches(splits["train"], cfg.batch_size, T + h, gen)
            first = F.cross_entropy(model.lm_head(model(chunk[:, :T])).flatten(0, 1),
                                    chunk[:, 1:T + 1].flatten())
            loss = (first + a * kl + w * heads.sum()) / (1 + a + w * (h - 1))
        else:
            first, loss = torch.tensor(float("nan")), heads.mean()
        return loss, lambda: (f"head 1 (corpus) {first.item():.2f} heads 2..{h} (greedy) "
                              + " ".join(f"{x:.2f}" for x in heads.tolist())
                              + (f" head 1 KL from base {kl.item():.3f}" if a else "")
                              + f" | {pool['gen_s'] / 60:.1f} min generating")
    return loss_at, pool


def distill(cfg, log=print):
    """Distil --base into a checkpoint dict (written by main)."""
    try:
        model, ck = load(cfg.base)      # the lab's FastGPT: trains as shipped
    except CheckpointError as e:
        raise ValueError(f"--base: {e}") from None
    if model.config.n_bpd_heads < 2 or "splits" not in ck:
        raise ValueError(f"--base {cfg.base} has one head or no stored splits: nothing to distil")
    splits = as_tensors(ck["splits"], ck["vocab"])
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    base_loss, base_agree = evaluate(model, splits["test"])[0][0], greedy_agreement(model, splits["tune"])
    log(f"base {cfg.base}: test loss head 1 {base_loss:.3f}; tune agreement with greedy, heads "
        f"2..{model.config.n_bpd_heads}: " + " ".join(f"{a:.0%}" for a in base_agree))
    if cfg.distill == "frozen":       # only heads 2..h learn; lm_head is the tied embedding
        model.requires_grad_(False)
        model.heads.requires_grad_(True)
    base = copy.deepcopy(model).eval() if cfg.teacher == "base" or cfg.anchor else None
    teacher = base if cfg.teacher == "base" else model
    loss_at, pool = distill_loss(model, splits, cfg, gen, teacher, base)
    secs = fit(model, cfg, loss_at, f"distill {cfg.distill}",
               splits["tune"] if cfg.distill == "joint" else None, log)
    losses, accs = evaluate(model, splits["test"])
    agree = greedy_agreement(model, splits["tune"])
    log(f"distilled: test loss head 1 {losses[0]:.3f} (base {base_loss:.3f}); tune agreement "
        "with greedy: " + " ".join(f"{a:.0%}" for a in agree))
    keep = ("steps", "lr", "warmup", "batch_size", "regen_every", "teacher", "gen_rows", "seed")
    record = {"variant": cfg.distill, "base": os.path.basename(cfg.base),
              "base_sha256": file_sha256(cfg.base), **{k: getattr(cfg, k) for k in keep},
              "head_weight": cfg.head_weight if cfg.distill == "joint" else None,
              "anchor": cfg.anchor if cfg.distill == "joint" else None,
              "seconds": round(secs), "seconds_generating": round(pool["gen_s"]),
              "test_loss": losses, "test_acc": accs, "tune_greedy_agreement": agree,
              "base_test_loss": base_loss, "base_tune_greedy_agreement": base_agree,
              "torch": str(torch.__version__), "git_revision": git_revision()}
    return {**ck, "model": half(model), "distill": record}


# ----------------------------------------------------------------------------- fine-tuning on the tasks
# ONE model on the mixture of the five tasks' train splits (tasks.py), trunk and heads jointly,
# where Kim et al. fine-tune per task (our choice, docs/tasks.md, "The model"): the window grown
# to --block-size (widen), the loss on whole examples, the base's rescorers kept and an
# in-domain control small LM fine-tuned on the same examples.

TASKS_OUT = os.path.join(os.path.dirname(CHECKPOINT), "minibpd-tasks.pt")
TASKS_DEFAULTS = {"steps": 2000, "lr": 1e-3, "warmup": 50, "batch_size": 8, "block_size": 512,
                  "out": TASKS_OUT, "rescorer_steps": 600}


def widen(model, block_size):
    """The model with a context window of block_size: its learned positions [B0, C] kept, the new
    ones started as copies of the last (our choice: the best of four starts measured on the
    tasks' tune text, docs/results/tasks.md)."""
    old = model.pos_emb.weight.detach()[:block_size]
    new = torch.cat([old, old[-1:].expand(block_size - len(old), -1)])
    wide = FastGPT(dataclasses.replace(model.config, block_size=block_size))
    wide.load_state_dict({**model.state_dict(), "pos_emb.weight": new.contiguous()})
    return wide


def task_stream(pairs_by_task, chars, seed):
    """One training text of about `chars` characters: examples (prompt + target, then a blank
    line) drawn with task probability proportional to the square root of its size (small tasks
    are not drowned, large ones not repeated beyond need), uniformly within a task."""
    rng, names = random.Random(seed), sorted(pairs_by_task)
    weights = [math.sqrt(len(pairs_by_task[t])) for t in names]
    parts, total = [], 0
    while total < chars:
        prompt, target = rng.choice(pairs_by_task[rng.choices(names, weights)[0]])
        parts.append(prompt + target + "\n\n")
        total += len(parts[-1])
    return "".join(parts)


def finetune_tasks(cfg, log=print):
    """Fine-tune --base on the tasks (see above). -> the checkpoint dict: the base's, with the
    widened model, the examples it is tuned and evaluated on (ck["tasks"]: tasks.build_all's
    tune and test splits) and the in-domain control rescorer (ck["rescorer_tasks"])."""
    try:
        base, ck = load(cfg.base)      # the lab's FastGPT: trains as shipped
    except CheckpointError as e:
        raise ValueError(f"--base: {e}") from None
    data = tasks.build_all(ck["vocab"])
    pairs = {t: s["train"] for t, s in data["tasks"].items()}
    span, gen = cfg.block_size + base.config.n_bpd_heads, torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    stream = task_stream(pairs, cfg.steps * cfg.batch_size * span, cfg.seed)
    tune = task_stream({t: s["tune"] for t, s in data["tasks"].items()}, 40 * span, cfg.seed)
    ids = as_tensors({"train": stream, "tune": tune}, ck["vocab"])
    model = widen(base, cfg.block_size)
    log(f"tasks: {sum(map(len, pairs.values())):,} train examples, a stream of {len(stream):,} "
        f"characters; window {base.config.block_size} -> {cfg.block_size}; tune loss head 1 "
        f"{evaluate(model, ids['tune'], 16)[0][0]:.3f} before")
    secs = train(model, ids["train"], cfg, gen, "tasks", ids["tune"])
    rescorer = build_model(ck["rescorer_config"], ck["rescorer"], where=f"--base {cfg.base}'s "
                           "rescorer", path=cfg.base, kind=train_kind(ck))
    rargs = dataclasses.replace(cfg, steps=cfg.rescorer_steps)
    rsecs = train(rescorer, ids["train"], rargs, gen, "tasks rescorer", ids["tune"])
    losses, accs = evaluate(model, ids["tune"])
    record = {"base": os.path.basename(cfg.base), "base_sha256": file_sha256(cfg.base),
              **{k: getattr(cfg, k) for k in ("steps", "lr", "warmup", "batch_size", "block_size",
                                                "head_weight", "seed", "rescorer_steps")},
              "seconds": round(secs + rsecs), "stream_chars": len(stream), "tune_loss": losses,
              "tune_acc": accs, "torch": str(torch.__version__), "git_revision": git_revision()}
    stored = {**data, "train_counts": {t: len(p) for t, p in pairs.items()},   # tune and test only:
              "tasks": {t: {s: v for s, v in d.items() if s != "train"}          # the train examples
                        for t, d in data["tasks"].items()}}                      # are 80% of the MB
    return {**ck, "config": dataclasses.asdict(model.config), "model": half(model), "tasks": stored,
            "rescorer_tasks": half(rescorer), "finetune": record}
