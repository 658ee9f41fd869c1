"""Self-distillation of the BPD heads (issue 11): train heads 2..h on what verification checks.

Verification accepts draft token t + i only when it equals the base model's greedy token, but the
heads of the shipped checkpoint learned the corpus's next tokens. A sequence produced by greedy
decoding is its own distillation target: at any position t inside the generated part, the model's
greedy continuation of the prefix is exactly the sequence's next tokens. So ordinary "head i
predicts token t + i" training on greedy-generated windows trains heads 2..h on the right target.

Variants (--distill, starting from a trained checkpoint, --base):
  frozen  trunk and head 1 frozen (greedy output provably unchanged); heads 2..h learn the greedy
          future. The data never goes stale, but the frozen last hidden state limits the heads.
  joint   everything trains: head 1 keeps learning the corpus's next token (quality), heads
          2..h the model's own greedy future, regenerated every --regen-every steps from the
          current model (the trunk moves, so the greedy continuations go stale).
--teacher base makes a frozen copy of --base generate the greedy data instead (a control: the
data then cannot follow the trunk, whatever the trunk does to its own greedy text).
The rescorer, vocabulary and splits are copied from --base, so every command works unchanged.
"""
import copy
import hashlib
import os
import time

import torch
import torch.nn.functional as F

from minibpd import CHECKPOINT, KVCache, load_checkpoint, CheckpointError, window_start

DISTILLED = os.path.join(os.path.dirname(CHECKPOINT), "minibpd-distilled.pt")
VARIANTS = ("frozen", "joint")
TEACHERS = ("current", "base")
# Fine-tuning, not training from scratch: fewer steps and a gentler peak than the base run.
# Applied to every one of these flags that is not given on the command line.
DEFAULTS = {"steps": 600, "lr": 1e-3, "warmup": 30, "out": DISTILLED}


def add_arguments(p, arg):
    """The --distill flags, added to train_heads.py's parser (arg: its helper, help required)."""
    arg("--distill", "self-distil the heads of --base instead of training a model: 'frozen' "
        "(trunk + head 1 frozen) or 'joint' (see distill.py). Then --steps, --lr, --warmup and "
        f"--out default to {DEFAULTS['steps']}, {DEFAULTS['lr']}, {DEFAULTS['warmup']} and "
        "checkpoints/minibpd-distilled.pt (default: off)", metavar="VARIANT")
    arg("--base", "--distill: the trained checkpoint to start from (default: the shipped "
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
    given = set()
    for a in parser._actions:
        for opt in a.option_strings:
            if any(x == opt or x.startswith(opt + "=") for x in argv):
                given.add(a.dest)
    return given


def check_args(args, given, fail):
    """--distill's own checks, before any work; fail(message) exits 2 with one line."""
    if args.distill is None:
        for flag in ("base", "regen_every", "gen_rows", "teacher"):
            if flag in given:
                fail(f"--{flag.replace('_', '-')} only applies with --distill")
        return
    if args.distill not in VARIANTS:
        fail(f"--distill must be one of {', '.join(VARIANTS)}, got {args.distill!r}")
    if args.teacher not in TEACHERS:
        fail(f"--teacher must be one of {', '.join(TEACHERS)}, got {args.teacher!r}")
    for flag in ("data", "clean", "n_layer", "n_head", "n_embd", "block_size", "heads", "dropout",
                 "rescorer_steps", "rescorer_layers", "rescorer_embd"):
        if flag in given:          # the model and its corpus come from --base
            fail(f"--{flag.replace('_', '-')} does not apply with --distill: the model, its "
                 "corpus and its rescorer come from --base")
    for name, least in [("regen_every", 1), ("gen_rows", 1)]:
        if getattr(args, name) < least:
            fail(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(args, name)}")
    for name, value in DEFAULTS.items():
        if name not in given:
            setattr(args, name, value)
    args.base = args.base or CHECKPOINT
    if not os.path.isfile(args.base):
        fail(f"--base {args.base}: no such checkpoint (train one with `python train_heads.py`)")
    if os.path.abspath(args.base) == os.path.abspath(args.out):
        fail(f"--out {args.out} is --base: write the distilled model to another file")


class RowCache(KVCache):
    """A KVCache whose rows are independent sequences, not drafts of one shared prefix: advance
    keeps every row's own slots (KVCache.advance would copy one row's slots to every row)."""

    def advance(self, n, row=0):
        self.length += n


@torch.no_grad()
def greedy_batch(model, prompts, n):
    """prompts [P, L] -> [P, L + n]: every row continued greedily, with the same windows as
    minibpd.greedy_decode (window_start), P rows per model call. The cache is rebuilt when the
    window moves, as model_call does."""
    seq, B = prompts, model.config.block_size
    cache = RowCache(model, rows=prompts.shape[0])
    for _ in range(n):
        start = window_start(seq.shape[1], B)
        if start != cache.start:
            cache.reset(start)
        tail = seq[:, cache.start + cache.length:]
        z = model(tail, cache)
        cache.advance(tail.shape[1])
        seq = torch.cat([seq, model.lm_head(z[:, -1]).argmax(-1, keepdim=True)], dim=1)
    return seq


def greedy_windows(model, data, rows, gen):
    """-> (windows [rows, T + h], first [rows]): train-split prompts of one random length, each
    continued greedily to a full training window. Position t's targets are all greedy tokens
    from t = first - 1 on (first: the prompt length)."""
    T, h = model.config.block_size, model.config.n_bpd_heads
    plen = int(torch.randint(max(1, T // 8), max(2, 3 * T // 4) + 1, (1,), generator=gen))
    ix = torch.randint(len(data) - plen, (rows,), generator=gen)
    prompts = torch.stack([data[i:i + plen] for i in ix])
    was_training = model.training
    model.eval()
    seq = greedy_batch(model, prompts, T + h - plen)
    model.train(was_training)
    return seq, torch.full((rows,), plen)


def greedy_head_losses(model, windows, first, trunk_grad=True):
    """Per-head cross entropy of heads 2..h on greedy windows, over positions t >= first - 1 only
    (before that a head's target is corpus text, not the model's greedy future). -> [h - 1]."""
    T, h = model.config.block_size, model.config.n_bpd_heads
    with torch.set_grad_enabled(trunk_grad and torch.is_grad_enabled()):
        z = model(windows[:, :T])
    logits = model.head_logits(z)[:, :, 1:]                              # [B, T, h-1, V]
    targets = torch.stack([windows[:, 1 + i:1 + i + T] for i in range(1, h)], dim=-1)
    keep = torch.arange(T)[None, :] >= (first[:, None] - 1)              # [B, T]
    ce = F.cross_entropy(logits[keep].flatten(0, 1), targets[keep].flatten(), reduction="none")
    return ce.view(-1, h - 1).mean(0)


@torch.no_grad()
def greedy_agreement(model, data, rows=64, seed=0):
    """Per-head top-1 agreement with the model's own greedy tokens on continuations of `data`
    prompts (heads 2..h; head 1 is greedy by definition): what BPD's verification checks."""
    gen = torch.Generator().manual_seed(seed)
    windows, first = greedy_windows(model, data, rows, gen)
    T, h = model.config.block_size, model.config.n_bpd_heads
    pred = model.head_logits(model(windows[:, :T]))[:, :, 1:].argmax(-1)
    targets = torch.stack([windows[:, 1 + i:1 + i + T] for i in range(1, h)], dim=-1)
    keep = torch.arange(T)[None, :] >= (first[:, None] - 1)
    return (pred[keep] == targets[keep]).float().mean(0).tolist()


def freeze_trunk(model):
    """Variant frozen: only heads 2..h learn. lm_head is tied to the embedding, so it stays too."""
    for p in model.parameters():
        p.requires_grad_(False)
    for p in model.heads.parameters():
        p.requires_grad_(True)


def distill_loop(model, splits, args, gen, log, lr_at, evaluate):
    """The optimizer loop. -> (seconds, of which generating). joint: head 1 on a corpus batch
    plus head_weight x heads 2..h on a greedy batch (weighted mean as GPT.loss); frozen: heads
    2..h only, trunk evaluated without gradients."""
    joint, h = args.distill == "joint", model.config.n_bpd_heads
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    span, w = model.config.block_size + h, args.head_weight
    t0, gen_s, pool = time.time(), 0.0, None
    teacher = copy.deepcopy(model).eval() if args.teacher == "base" else model
    model.train()
    for step in range(args.steps):
        if step % args.regen_every == 0:
            g0 = time.time()
            pool = greedy_windows(teacher, splits["train"], args.gen_rows, gen)
            gen_s += time.time() - g0
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        pick = torch.randint(args.gen_rows, (args.batch_size,), generator=gen)
        heads = greedy_head_losses(model, pool[0][pick], pool[1][pick], trunk_grad=joint)
        if joint:
            chunk = batches(splits["train"], args.batch_size, span, gen)
            T = model.config.block_size
            z = model(chunk[:, :T])
            first = F.cross_entropy(model.lm_head(z).flatten(0, 1), chunk[:, 1:T + 1].flatten())
            loss = (first + w * heads.sum()) / (1 + w * (h - 1))
        else:
            first, loss = torch.tensor(float("nan")), heads.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % args.log_every == 0 or step == args.steps - 1:
            el = time.time() - t0
            tune = ""
            if joint and (step % (5 * args.log_every) == 0 or step == args.steps - 1):
                model.eval()
                tune = f" | tune loss head 1 {evaluate(model, splits['tune'], 16)[0][0]:.3f}"
                model.train()
            log(f"[distill {args.distill}] step {step:5d}/{args.steps} head 1 (corpus) "
                f"{first.item():.2f} heads 2..{h} (greedy) "
                + " ".join(f"{x:.2f}" for x in heads.tolist())
                + f" | {el / 60:.1f} min ({gen_s / 60:.1f} generating), "
                f"{(args.steps - step - 1) * el / (step + 1) / 60:.1f} min left" + tune)
    model.eval()
    return time.time() - t0, gen_s


def batches(data, batch_size, length, gen):
    """As train_heads.batches (not imported from there: train_heads imports this module)."""
    ix = torch.randint(len(data) - length, (batch_size,), generator=gen)
    return torch.stack([data[i:i + length] for i in ix])


def file_sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def run(args, lr_at, evaluate, fail, log=print):
    """Distil --base into --out. -> the checkpoint dict to write. train_heads.py passes its
    lr schedule, evaluate() and fail() (one error line, exit 2)."""
    try:
        model, ck = load_checkpoint(args.base)
    except CheckpointError as e:
        fail(f"--base: {e}")
    if model.config.n_bpd_heads < 2 or "splits" not in ck:
        fail(f"--base {args.base} has one head or no stored splits: nothing to distil")
    stoi = {c: i for i, c in enumerate(ck["vocab"])}
    splits = {k: torch.tensor([stoi[c] for c in v]) for k, v in ck["splits"].items()}
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    base_loss = evaluate(model, splits["test"])[0][0]
    base_agree = greedy_agreement(model, splits["tune"])
    log(f"base {args.base}: test loss head 1 {base_loss:.3f}; tune agreement with greedy, heads "
        f"2..{model.config.n_bpd_heads}: " + " ".join(f"{a:.0%}" for a in base_agree))
    if args.distill == "frozen":
        freeze_trunk(model)
    secs, gen_s = distill_loop(model, splits, args, gen, log, lr_at, evaluate)
    losses, accs = evaluate(model, splits["test"])
    agree = greedy_agreement(model, splits["tune"])
    log(f"distilled: test loss head 1 {losses[0]:.3f} (base {base_loss:.3f}); tune agreement "
        "with greedy: " + " ".join(f"{a:.0%}" for a in agree))
    log(f"{secs / 60:.1f} min of distillation, {gen_s / 60:.1f} of them generating greedy data")
    out = copy.copy(ck)              # config, vocab, splits, corpus, rescorer: as in --base
    out["model"] = {k: v.half() for k, v in model.state_dict().items()}
    out["distill"] = {"variant": args.distill, "base": os.path.basename(args.base),
                      "base_sha256": file_sha256(args.base), "steps": args.steps, "lr": args.lr,
                      "warmup": args.warmup, "batch_size": args.batch_size,
                      "head_weight": args.head_weight if args.distill == "joint" else None,
                      "regen_every": args.regen_every, "teacher": args.teacher,
                      "gen_rows": args.gen_rows, "seed": args.seed, "seconds": round(secs),
                      "seconds_generating": round(gen_s), "test_loss": losses, "test_acc": accs,
                      "tune_greedy_agreement": agree, "base_test_loss": base_loss,
                      "base_tune_greedy_agreement": base_agree, "torch": str(torch.__version__)}
    return out
