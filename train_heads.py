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
import argparse
import copy
import dataclasses
import hashlib
import math
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict

import torch
import torch.nn.functional as F

from checkpoint import clean_text, split_corpus  # noqa: F401 (train_heads.clean_text, ...)
import tasks
from minibpd import (CHECKPOINT, FORMAT_VERSION, GPT, CheckpointError, GPTConfig, build_model,
                     choose_threads, decode_rows, file_sha256, load_checkpoint)

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
            fail(f"--data {path}: cannot read it as UTF-8 text ({e})")
        name, where = path, f"--data {path}"
    cleaned = path is None if clean is None else clean
    text = clean_text(raw) if cleaned else raw
    if len(text) < 1000:
        fail(f"{where} has only {len(text)} characters{' after cleaning' if cleaned else ''}; "
             "give at least a few thousand")
    return text, {"name": name, "chars": len(text), "cleaned": cleaned,
                  "sha256": hashlib.sha256(text.encode()).hexdigest()}


def as_tensors(texts, vocab):
    """{split: text} -> {split: 1-D tensor of token ids}."""
    stoi = {c: i for i, c in enumerate(vocab)}
    return {k: torch.tensor([stoi[c] for c in v]) for k, v in texts.items()}


# ----------------------------------------------------------------------------- losses and the fit loop

def head_losses(model, chunk, mask=None, skip=0):
    """Cross entropy and top-1 accuracy of heads skip+1..h on chunk [B, T + h]: head i at position
    t is scored on token t + i. mask [B, T] (optional): the positions that count. -> ([h'], [h'])"""
    h = model.config.n_bpd_heads
    T = chunk.shape[1] - h
    logits = model.head_logits(model(chunk[:, :T]))[:, :, skip:]                 # [B, T, h', V]
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


def fit(model, args, loss_at, label, held_out=None, log=print):
    """The one optimiser loop (base model, rescorer, distillation): AdamW, warm-up + cosine decay,
    gradient clipping at 1.0, over the parameters that require grad. loss_at(step) -> (loss,
    the log's note on it). held_out: a token tensor whose head-1 loss the log shows now and then.
    -> seconds."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    model.train()
    t0 = time.time()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        loss, note = loss_at(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % args.log_every == 0 or step == args.steps - 1:
            el, tune = time.time() - t0, ""
            if held_out is not None and (step % (5 * args.log_every) == 0 or step == args.steps - 1):
                model.eval()
                tune = f" | tune loss head 1 {evaluate(model, held_out, 16)[0][0]:.3f}"
                model.train()
            log(f"[{label}] step {step:5d}/{args.steps} {note()} | {el / 60:.1f} min, "
                f"{(args.steps - step - 1) * el / (step + 1) / 60:.1f} min left" + tune)
    model.eval()
    return time.time() - t0


@torch.no_grad()
def evaluate(model, data, n_windows=64):
    """Per-head held-out loss and top-1 accuracy on evenly spaced windows of `data`."""
    span = model.config.block_size + model.config.n_bpd_heads
    starts = torch.linspace(0, len(data) - span - 1, n_windows).long()
    losses, accs = head_losses(model, torch.stack([data[i:i + span] for i in starts]))
    return losses.tolist(), accs.tolist()


# ----------------------------------------------------------------------------- the base model and rescorer

def train(model, data, args, gen, label, held_out=None):
    """Joint training (joint_loss) on random windows of `data` -> seconds."""
    span, t0 = model.config.block_size + model.config.n_bpd_heads, time.time()

    def loss_at(step):
        loss, per_head = joint_loss(model, batches(data, args.batch_size, span, gen), args.head_weight)
        tok_s = (step + 1) * args.batch_size * span / max(1e-9, time.time() - t0)
        return loss, lambda: "loss/head " + " ".join(f"{x:.2f}" for x in per_head.tolist()) + \
            f" | {tok_s:,.0f} tok/s"
    return fit(model, args, loss_at, label, held_out)


def scale_rescorer(args):
    """The rescorer is a small LM beside the base model: half its steps, half its width (even:
    2 attention heads), a third of its layers, unless given. Defaults: 2 x 64, 2,500 steps."""
    if args.rescorer_steps is None:
        args.rescorer_steps = max(1, args.steps // 2)
    if args.rescorer_embd is None:
        args.rescorer_embd = max(2, args.n_embd // 4 * 2)      # half, rounded down to even
    if args.rescorer_layers is None:
        args.rescorer_layers = max(1, args.n_layer // 3)


def train_both(args, vocab, splits, gen):
    """The base model, then the rescorer: -> the checkpoint dict, less corpus and splits."""
    cfg = GPTConfig(len(vocab), args.block_size, args.n_layer, args.n_head, args.n_embd,
                    args.heads, args.dropout)
    model = GPT(cfg)
    print(f"model: {sum(p.numel() for p in model.parameters()):,} parameters, {cfg}")
    secs = train(model, splits["train"], args, gen, "heads", splits["tune"])
    losses, accs = evaluate(model, splits["test"])
    print("held-out (test) per head:  loss " + " ".join(f"{x:.3f}" for x in losses))
    print("                      top-1 acc " + " ".join(f"{x:.3f}" for x in accs))
    # The small rescorer LM (Kim §7.1): same class, one head, 2 attention heads.
    rcfg = GPTConfig(len(vocab), args.block_size, args.rescorer_layers, 2, args.rescorer_embd, 1,
                     args.dropout)
    rescorer = GPT(rcfg)
    n, n_base = (sum(p.numel() for p in m.parameters()) for m in (rescorer, model))
    print(f"rescorer: {n:,} parameters ({n / n_base:.1%} of the base), n_layer {rcfg.n_layer}, "
          f"n_embd {rcfg.n_embd}, {args.rescorer_steps:,} steps")
    rargs = argparse.Namespace(**{**vars(args), "steps": args.rescorer_steps})
    rsecs = train(rescorer, splits["train"], rargs, gen, "rescorer", splits["tune"])
    print(f"rescorer: held-out loss {evaluate(rescorer, splits['test'])[0][0]:.3f}")
    return {"format_version": FORMAT_VERSION, "config": asdict(cfg), "model": half(model),
            "rescorer_config": asdict(rcfg), "rescorer": half(rescorer), "vocab": vocab,
            "seed": args.seed, "git_revision": git_revision(),
            "train": {"steps": args.steps, "rescorer_steps": args.rescorer_steps,
                      "seconds": round(secs + rsecs), "test_loss": losses, "test_acc": accs,
                      "torch": str(torch.__version__)}}


def half(model):
    return {k: v.half() for k, v in model.state_dict().items()}   # fp16 on disk: half the MB


# ----------------------------------------------------------------------------- self-distillation
# Verification accepts draft token t + i only when it equals the base model's greedy token, but
# trained heads learn the corpus's next tokens. A greedily generated sequence is its own target:
# inside its generated part, the model's greedy continuation of any prefix IS the sequence's next
# tokens. So "head i predicts token t + i" on greedy windows trains heads 2..h on what
# verification checks. Variants (--distill, starting from a trained --base):
#   frozen  trunk and head 1 frozen (greedy output provably unchanged); heads 2..h learn.
#   joint   everything trains: head 1 keeps learning the corpus (quality), heads 2..h the greedy
#           future, regenerated every --regen-every steps from the current model.
# --teacher base: a frozen copy of --base generates the data instead (a control: the data then
# cannot follow the trunk). The rescorer, vocabulary and splits are copied from --base.

DISTILLED = os.path.join(os.path.dirname(CHECKPOINT), "minibpd-distilled.pt")
VARIANTS, TEACHERS = ("frozen", "joint"), ("current", "base")
# Fine-tuning, not training from scratch: fewer steps and a gentler peak than the base run.
# Applied to every one of these flags that is not given on the command line.
DISTILL_DEFAULTS = {"steps": 600, "lr": 1e-3, "warmup": 30, "out": DISTILLED}


def greedy_windows(model, data, rows, gen):
    """-> (windows [rows, T + h], mask [rows, T]): train-split prompts of one random length, each
    continued greedily to a full training window (minibpd.decode_rows, greedy_decode's windows);
    the mask keeps the positions whose targets are all generated (t >= prompt length - 1)."""
    T, h = model.config.block_size, model.config.n_bpd_heads
    plen = int(torch.randint(max(1, T // 8), max(2, 3 * T // 4) + 1, (1,), generator=gen))
    ix = torch.randint(len(data) - plen, (rows,), generator=gen)
    was_training = model.training
    model.eval()
    windows = decode_rows(model, torch.stack([data[i:i + plen] for i in ix]), T + h - plen)
    model.train(was_training)
    return windows, (torch.arange(T) >= plen - 1).expand(rows, T)


def greedy_agreement(model, data, rows=64, seed=0):
    """Per-head top-1 agreement with the model's own greedy tokens on continuations of `data`
    prompts (heads 2..h; head 1 is greedy by definition): what BPD's verification checks."""
    windows, mask = greedy_windows(model, data, rows, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return head_losses(model, windows, mask, skip=1)[1].tolist()


def distill_loss(model, splits, args, gen, teacher):
    """-> loss_at(step) for fit: joint: head 1 on a corpus batch plus head_weight x heads 2..h on
    a greedy batch (a weighted mean as joint_loss); frozen: heads 2..h only."""
    T, h, w, pool = model.config.block_size, model.config.n_bpd_heads, args.head_weight, {}

    def loss_at(step):
        if step % args.regen_every == 0:
            g0 = time.time()
            pool["windows"], pool["mask"] = greedy_windows(teacher, splits["train"], args.gen_rows, gen)
            pool["gen_s"] = pool.get("gen_s", 0.0) + time.time() - g0
        pick = torch.randint(args.gen_rows, (args.batch_size,), generator=gen)
        heads = head_losses(model, pool["windows"][pick], pool["mask"][pick], skip=1)[0]
        if args.distill == "joint":
            chunk = batches(splits["train"], args.batch_size, T + h, gen)
            first = F.cross_entropy(model.lm_head(model(chunk[:, :T])).flatten(0, 1),
                                    chunk[:, 1:T + 1].flatten())
            loss = (first + w * heads.sum()) / (1 + w * (h - 1))
        else:
            first, loss = torch.tensor(float("nan")), heads.mean()
        return loss, lambda: (f"head 1 (corpus) {first.item():.2f} heads 2..{h} (greedy) "
                              + " ".join(f"{x:.2f}" for x in heads.tolist())
                              + f" | {pool['gen_s'] / 60:.1f} min generating")
    return loss_at, pool


def distill(args, log=print):
    """Distil --base into a checkpoint dict (written by main)."""
    try:
        model, ck = load_checkpoint(args.base)
    except CheckpointError as e:
        fail(f"--base: {e}")
    if model.config.n_bpd_heads < 2 or "splits" not in ck:
        fail(f"--base {args.base} has one head or no stored splits: nothing to distil")
    splits = as_tensors(ck["splits"], ck["vocab"])
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    base_loss, base_agree = evaluate(model, splits["test"])[0][0], greedy_agreement(model, splits["tune"])
    log(f"base {args.base}: test loss head 1 {base_loss:.3f}; tune agreement with greedy, heads "
        f"2..{model.config.n_bpd_heads}: " + " ".join(f"{a:.0%}" for a in base_agree))
    if args.distill == "frozen":       # only heads 2..h learn; lm_head is the tied embedding
        for p in model.parameters():
            p.requires_grad_(False)
        for p in model.heads.parameters():
            p.requires_grad_(True)
    teacher = copy.deepcopy(model).eval() if args.teacher == "base" else model
    loss_at, pool = distill_loss(model, splits, args, gen, teacher)
    secs = fit(model, args, loss_at, f"distill {args.distill}",
               splits["tune"] if args.distill == "joint" else None, log)
    losses, accs = evaluate(model, splits["test"])
    agree = greedy_agreement(model, splits["tune"])
    log(f"distilled: test loss head 1 {losses[0]:.3f} (base {base_loss:.3f}); tune agreement "
        "with greedy: " + " ".join(f"{a:.0%}" for a in agree))
    keep = ("steps", "lr", "warmup", "batch_size", "regen_every", "teacher", "gen_rows", "seed")
    record = {"variant": args.distill, "base": os.path.basename(args.base),
              "base_sha256": file_sha256(args.base), **{k: getattr(args, k) for k in keep},
              "head_weight": args.head_weight if args.distill == "joint" else None,
              "seconds": round(secs), "seconds_generating": round(pool["gen_s"]),
              "test_loss": losses, "test_acc": accs, "tune_greedy_agreement": agree,
              "base_test_loss": base_loss, "base_tune_greedy_agreement": base_agree,
              "torch": str(torch.__version__), "git_revision": git_revision()}
    return {**ck, "model": half(model), "distill": record}


# ----------------------------------------------------------------------------- fine-tuning on the tasks
# Kim et al. fine-tune the BPD model per task; we fine-tune ONE model on the mixture of the five
# tasks' train splits (tasks.py), trunk and heads jointly (joint_loss), keeping the vocabulary
# (our choice: one checkpoint to ship). The window grows to --block-size (512: a task's prompt
# and target), the new learned positions starting as copies of the last (widen). The loss covers
# whole examples, prompt and target: the targets are short (a median of 41-124 characters) and the
# prompts are the same kinds of text (code, docstrings, prose), so they triple the signal;
# quality is measured on targets only. The rescorers stay the base's, task-independent (as
# Kim's C4 rescorers); an in-domain control small LM is fine-tuned on the same examples.

TASKS_OUT = os.path.join(os.path.dirname(CHECKPOINT), "minibpd-tasks.pt")
TASKS_DEFAULTS = {"steps": 2000, "lr": 1e-3, "warmup": 50, "batch_size": 8, "block_size": 512,
                  "out": TASKS_OUT, "rescorer_steps": 600}


def widen(model, block_size):
    """The model with a context window of block_size: its learned positions [B0, C] kept, the new
    ones started as copies of the last (our choice: of four starts measured on the tasks' tune
    text before fine-tuning, head-1 loss 5.11 nats; linear interpolation 5.51, tiling 5.72; the
    base at its own 128-character window 3.29; README, "Tasks")."""
    old = model.pos_emb.weight.detach()[:block_size]
    new = torch.cat([old, old[-1:].expand(block_size - len(old), -1)])
    wide = GPT(dataclasses.replace(model.config, block_size=block_size))
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


def finetune_tasks(args, log=print):
    """Fine-tune --base on the tasks (see above). -> the checkpoint dict: the base's, with the
    widened model, the examples it was tuned and evaluated on (ck["tasks"], tasks.build_all) and
    the in-domain control rescorer (ck["rescorer_tasks"])."""
    try:
        base, ck = load_checkpoint(args.base)
    except CheckpointError as e:
        fail(f"--base: {e}")
    data = tasks.build_all(ck["vocab"])
    pairs = {t: s["train"] for t, s in data["tasks"].items()}
    span, gen = args.block_size + base.config.n_bpd_heads, torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)
    stream = task_stream(pairs, args.steps * args.batch_size * span, args.seed)
    tune = task_stream({t: s["tune"] for t, s in data["tasks"].items()}, 40 * span, args.seed)
    ids = as_tensors({"train": stream, "tune": tune}, ck["vocab"])
    model = widen(base, args.block_size)
    log(f"tasks: {sum(map(len, pairs.values())):,} train examples, a stream of {len(stream):,} "
        f"characters; window {base.config.block_size} -> {args.block_size}; tune loss head 1 "
        f"{evaluate(model, ids['tune'], 16)[0][0]:.3f} before")
    secs = train(model, ids["train"], args, gen, "tasks", ids["tune"])
    rescorer = build_model(ck["rescorer_config"], ck["rescorer"])
    rargs = argparse.Namespace(**{**vars(args), "steps": args.rescorer_steps})
    rsecs = train(rescorer, ids["train"], rargs, gen, "tasks rescorer", ids["tune"])
    losses, accs = evaluate(model, ids["tune"])
    record = {"base": os.path.basename(args.base), "base_sha256": file_sha256(args.base),
              **{k: getattr(args, k) for k in ("steps", "lr", "warmup", "batch_size", "block_size",
                                                "head_weight", "seed", "rescorer_steps")},
              "seconds": round(secs + rsecs), "stream_chars": len(stream), "tune_loss": losses,
              "tune_acc": accs, "torch": str(torch.__version__), "git_revision": git_revision()}
    return {**ck, "config": dataclasses.asdict(model.config), "model": half(model), "tasks": data,
            "rescorer_tasks": half(rescorer), "finetune": record}


# ----------------------------------------------------------------------------- the command line

class UsageError(SystemExit):
    """Exit status 2, like `python minibpd.py` on bad input; str() keeps the message for callers."""
    def __init__(self, message):
        super().__init__(f"error: {message}")
        self.code = 2


def fail(message):
    print(f"error: {message}", file=sys.stderr)    # one line, no traceback
    raise UsageError(message)


def git_revision():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every default shown; a computed default (None) is spelled out in the flag's own help."""
    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter,
                                allow_abbrev=False)

    def arg(flag, help, metavar="N", **kw):         # every flag has a help line: its default shows
        p.add_argument(flag, help=help, metavar=metavar, **kw)
    arg("--data", "UTF-8 text file, used as it is (default: Python's own pydoc_data.topics, "
        "cleaned)", metavar="FILE")
    p.add_argument("--clean", action="store_true", help="clean --data like the default corpus: "
                   "collapse spaces (indentation too), drop reST rules and table borders")
    arg("--out", "checkpoint file to write", default=CHECKPOINT, metavar="FILE")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    arg("--seed", "seeds torch: weights and batches", type=int, default=1337)
    arg("--steps", "optimizer steps for the base model", type=int, default=5000)
    arg("--rescorer-steps", "optimizer steps for the rescorer LM (default: steps // 2)", type=int)
    arg("--rescorer-layers", "rescorer blocks (default: n_layer // 3, at least 1)", type=int)
    arg("--rescorer-embd", "rescorer width, even: it has 2 attention heads (default: "
        "n_embd // 2 rounded down to an even number, at least 2)", type=int)
    arg("--batch-size", "windows per step", type=int, default=32)
    arg("--lr", "peak learning rate (AdamW)", type=float, default=3e-3, metavar="X")
    arg("--warmup", "linear warm-up steps, then cosine decay to lr / 10", type=int, default=100)
    arg("--n-layer", "transformer blocks", type=int, default=6)
    arg("--n-head", "attention heads per block", type=int, default=4)
    arg("--n-embd", "embedding width", type=int, default=128)
    arg("--block-size", "context window, in characters", type=int, default=128)
    arg("--heads", "h, the number of BPD heads (head 1 included)", type=int, default=8)
    arg("--head-weight", "loss weight of heads 2..h relative to head 1 (1.0: plain mean)",
        type=float, default=0.2, metavar="X")
    arg("--dropout", "dropout probability", type=float, default=0.0, metavar="X")
    arg("--log-every", "steps between log lines", type=int, default=100)
    arg("--threads", "torch threads (default: every core if the 1-minute load average is "
        "under 0.5, else 1)", type=int)
    add_distill_args(p, arg)
    args = p.parse_args(argv)
    # which flags were written out: --distill changes the defaults of the others
    args.given = explicit_flags(p, sys.argv[1:] if argv is None else argv)
    return args


def add_distill_args(p, arg):
    """--distill and its flags (arg: parse_args' helper, a help line required)."""
    arg("--distill", "self-distil the heads of --base instead of training a model: 'frozen' "
        "(trunk + head 1 frozen) or 'joint' (see 'self-distillation' in train_heads.py). Then "
        f"--steps, --lr, --warmup and --out default to {DISTILL_DEFAULTS['steps']}, "
        f"{DISTILL_DEFAULTS['lr']}, {DISTILL_DEFAULTS['warmup']} and "
        "checkpoints/minibpd-distilled.pt (default: off)", metavar="VARIANT")
    p_tasks = "fine-tune --base on the five tasks' train splits (tasks.py) instead of training a "\
        "model; then " + ", ".join(f"--{k.replace('_', '-')} defaults to {v}" for k, v in
                                   TASKS_DEFAULTS.items() if k != "out") + \
        " and --out to checkpoints/minibpd-tasks.pt"
    p.add_argument("--tasks", help=p_tasks, action="store_true")
    arg("--base", "--distill, --tasks: the trained checkpoint to start from (default: the shipped "
        "checkpoints/minibpd.pt)", metavar="FILE")
    arg("--regen-every", "--distill: optimizer steps between regenerations of the greedy data",
        type=int, default=50)
    arg("--gen-rows", "--distill: greedy continuations generated per regeneration, as the rows "
        "of one batched KV cache", type=int, default=128)
    arg("--teacher", "--distill: which model generates the greedy data: 'current' (the model "
        "being trained, as it trains) or 'base' (a frozen copy of --base)", default="current",
        metavar="WHO")


def explicit_flags(parser, argv):
    """The dests of the flags written on the command line (so --distill can change defaults)."""
    return {a.dest for a in parser._actions for opt in a.option_strings
            if any(x == opt or x.startswith(opt + "=") for x in argv)}


def check_distill_args(args):
    """--distill's and --tasks' own checks (they set their defaults first), before any work."""
    mode = "--distill" if args.distill is not None else "--tasks" if args.tasks else None
    own = {"--distill": ("regen_every", "gen_rows", "teacher"), "--tasks": ()}
    for flag in ("base",) * (mode is None) + sum((v for k, v in own.items() if k != mode), ()):
        if flag in args.given:
            fail(f"--{flag.replace('_', '-')} only applies with "
                 f"{'--distill or --tasks' if flag == 'base' else '--distill'}")
    if mode is None:
        return
    if args.distill is not None and args.tasks:
        fail("--distill and --tasks are two ways to fine-tune: choose one")
    if args.distill is not None and args.distill not in VARIANTS:
        fail(f"--distill must be one of {', '.join(VARIANTS)}, got {args.distill!r}")
    if args.teacher not in TEACHERS:
        fail(f"--teacher must be one of {', '.join(TEACHERS)}, got {args.teacher!r}")
    fixed = ["data", "clean", "n_layer", "n_head", "n_embd", "heads", "dropout",
             "rescorer_layers", "rescorer_embd"] + ["block_size", "rescorer_steps"] * (mode == "--distill")
    for flag in fixed:
        if flag in args.given:          # the model and its corpus come from --base
            fail(f"--{flag.replace('_', '-')} does not apply with {mode}: the model, its "
                 "corpus and its rescorer come from --base")
    for name in ("regen_every", "gen_rows"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name, value in (DISTILL_DEFAULTS if mode == "--distill" else TASKS_DEFAULTS).items():
        if name not in args.given:
            setattr(args, name, value)
    args.base = args.base or CHECKPOINT
    if not os.path.isfile(args.base):
        fail(f"--base {args.base}: no such checkpoint (train one with `python train_heads.py`)")
    if os.path.abspath(args.base) == os.path.abspath(args.out):
        fail(f"--out {args.out} is --base: write the fine-tuned model to another file")


def check_args(args):
    """Every flag checked before any work: a typo should cost a second, not a training run."""
    check_distill_args(args)
    for name, least in [("steps", 1), ("batch_size", 1), ("warmup", 0), ("n_layer", 1),
                        ("n_head", 1), ("n_embd", 1), ("block_size", 1), ("heads", 1),
                        ("log_every", 1), ("threads", 1), ("rescorer_steps", 1),
                        ("rescorer_layers", 1), ("rescorer_embd", 2)]:
        value = getattr(args, name)
        if value is not None and value < least:             # None: a computed default
            fail(f"--{name.replace('_', '-')} must be >= {least}, got {value}")
    if args.n_embd % args.n_head:
        fail(f"--n-embd {args.n_embd} must be divisible by --n-head {args.n_head}")
    if args.rescorer_embd is not None and args.rescorer_embd % 2:
        fail(f"--rescorer-embd {args.rescorer_embd} must be even (the rescorer has 2 heads)")
    if not (math.isfinite(args.lr) and args.lr > 0):
        fail(f"--lr must be a finite number > 0, got {args.lr}")
    if not 0 <= args.dropout < 1:                           # also false for nan
        fail(f"--dropout must be in [0, 1), got {args.dropout}")
    if not (math.isfinite(args.head_weight) and args.head_weight >= 0):
        fail(f"--head-weight must be a finite number >= 0, got {args.head_weight}")
    if not 0 <= args.seed <= 2**63 - 1:                     # torch.manual_seed's range
        fail(f"--seed must be in [0, 2**63 - 1], got {args.seed}")
    # --out: refuse now rather than after training. The default is the shipped checkpoint.
    out, folder = args.out, os.path.dirname(os.path.abspath(args.out))
    if not out or os.path.isdir(out):
        fail(f"--out {out!r} is not a file name")
    if os.path.exists(out) and not args.force:
        fail(f"--out {out} already exists; pass --force to overwrite it")
    if not os.path.isdir(folder):
        fail(f"--out {out}: directory {folder} does not exist")
    if not writable(out):
        fail(f"--out {out}: not writable (tried: the file cannot be opened for writing there)")
    try:
        choose_threads(args.threads, training=True)
    except ValueError as e:
        fail(str(e))


def writable(path):
    """Whether a file can be written at `path`, tried for real: os.access says yes to root even
    where no file can be created (/proc). A probe file it creates is removed again."""
    existed = os.path.exists(path)
    try:
        with open(path, "ab"):
            pass
    except OSError:
        return False
    if not existed:
        os.remove(path)
    return True


def corpus_splits(args):
    """The corpus, its vocabulary and splits (texts and tensors), sized for the model."""
    text, corpus = load_corpus(args.data, True if args.clean else None)
    vocab, texts = "".join(sorted(set(text))), split_corpus(text)
    splits = as_tensors(texts, vocab)
    span = args.block_size + args.heads + 1
    if min(len(v) for v in splits.values()) <= span:
        fail(f"{'--data ' + args.data if args.data else 'the corpus'} is too small for "
             f"--block-size {args.block_size} --heads {args.heads}: each split needs over {span} "
             f"characters (about {20 * span} in all, it has {len(text)})")
    print(f"corpus: {corpus['name']}{', cleaned' if corpus['cleaned'] else ''}, "
          f"{corpus['chars']:,} chars, vocab {len(vocab)}, "
          + ", ".join(f"{k} {len(v):,}" for k, v in splits.items()))
    return corpus, vocab, texts, splits


def with_threads(args, work):
    """Run work() on the training thread policy (minibpd.choose_threads), giving the caller's
    threads back after (main() may run inside another program: the tests). -> (result, n)"""
    threads, reason = choose_threads(args.threads, training=True)
    print(f"threads: {threads} ({reason}{'' if args.threads else '; --threads overrides'})")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        return work(), threads
    finally:
        torch.set_num_threads(before)


def main(argv=None):
    args = parse_args(argv)
    check_args(args)
    if args.tasks:
        ckpt, threads = with_threads(args, lambda: finetune_tasks(args))
        ckpt["finetune"]["threads"] = threads
        torch.save(ckpt, args.out)
        print(f"saved {args.out} ({ckpt['finetune']['seconds'] / 60:.1f} min of fine-tuning)")
        return
    if args.distill:
        ckpt, threads = with_threads(args, lambda: distill(args))
        ckpt["distill"]["threads"] = threads
        torch.save(ckpt, args.out)
        d = ckpt["distill"]
        print(f"saved {args.out} ({d['seconds'] / 60:.1f} min of distillation, "
              f"{d['seconds_generating'] / 60:.1f} generating)")
        return
    scale_rescorer(args)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    corpus, vocab, texts, splits = corpus_splits(args)
    ckpt, threads = with_threads(args, lambda: train_both(args, vocab, splits, gen))
    ckpt.update(corpus=corpus, splits=texts)
    ckpt["train"]["threads"] = threads
    torch.save(ckpt, args.out)
    print(f"saved {args.out} ({ckpt['train']['seconds'] / 60:.1f} min of training)")


if __name__ == "__main__":
    main()
