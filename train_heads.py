"""Train the minibpd model: a character-level GPT trunk with h BPD heads, trained jointly (Kim §4),
plus the small neural rescorer LM used for local rescoring (Kim §7.1).

    python train_heads.py --force               # retrain the shipped checkpoints/minibpd.pt
    python train_heads.py --data my.txt --out my.pt --steps 500

    # Python source, indentation kept: the standard library's own json package. 500 steps
    # (~6 min on 2 cores) learn the look of the code, not yet where an indented block ends.
    cat $(python -c "import os,json;print(os.path.dirname(json.__file__))")/*.py > /tmp/json_src.py
    python train_heads.py --data /tmp/json_src.py --out py.pt --steps 500
    python minibpd.py --checkpoint py.pt --prompt "def "

    # Self-distillation (distill.py): heads 2..h learn the model's own greedy future
    python train_heads.py --distill joint --threads 1    # -> checkpoints/minibpd-distilled.pt

Default corpus: the reference documentation that ships with every CPython (`pydoc_data.topics`),
cleaned so that the model learns prose rather than whitespace runs and table borders. A --data
file is used as it is (--clean applies the same cleaning). An existing --out is only overwritten
with --force. Unless given, the rescorer's size and steps scale with the base model's.
The thread count changes floating-point sums in their last bits, and training amplifies them:
the shipped checkpoint was trained with 2 threads (add --threads 2 to repeat it exactly).
"""
import argparse
import hashlib
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict

import torch

import distill
from minibpd import CHECKPOINT, FORMAT_VERSION, GPT, GPTConfig

RULE = re.compile(r"^[\s*=\-+|~^#.:`'\"_]*$")   # reST underlines, table borders, blank-ish lines


class UsageError(SystemExit):
    """Exit status 2, like `python minibpd.py` on bad input; str() keeps the message for callers."""
    def __init__(self, message):
        super().__init__(f"error: {message}")
        self.code = 2


def fail(message):
    print(f"error: {message}", file=sys.stderr)    # one line, no traceback
    raise UsageError(message)


def clean_text(text):
    """Collapse runs of spaces, drop reST underline/table-border lines and repeated blank lines."""
    lines = []
    for line in text.splitlines():
        line = re.sub(r"[ \t]+", " ", line).strip()
        if RULE.match(line) and line:
            continue                              # '*****', '+----+----+', '====' ...
        if line or (lines and lines[-1]):
            lines.append(line)
    return "\n".join(lines).strip() + "\n"


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


def split_corpus(text, chunk=2000):
    """Fixed split by 2,000-character chunks (smaller for texts under 80,000 characters, so that
    there are at least 40): chunk j goes to tune if j % 20 == 18, to test if j % 20 == 19, else to
    train (90 / 5 / 5). Deterministic, and every split spans the corpus."""
    chunk = max(1, min(chunk, len(text) // 40))
    parts = {"train": [], "tune": [], "test": []}
    for j in range(0, len(text), chunk):
        key = {18: "tune", 19: "test"}.get((j // chunk) % 20, "train")
        parts[key].append(text[j:j + chunk])
    return {k: "".join(v) for k, v in parts.items()}


def batches(data, batch_size, length, gen):
    """Random windows of `length` tokens from the 1-D tensor `data`: [batch_size, length]."""
    ix = torch.randint(len(data) - length, (batch_size,), generator=gen)
    return torch.stack([data[i:i + length] for i in ix])


def lr_at(step, steps, lr, warmup):
    """Linear warm-up, then cosine decay to lr / 10."""
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))))


def train(model, data, args, gen, label, held_out=None):
    """AdamW with warm-up + cosine decay and gradient clipping; the loss is the mean over heads."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    span = model.config.block_size + model.config.n_bpd_heads
    model.train()
    t0 = time.time()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        loss, per_head = model.loss(batches(data, args.batch_size, span, gen), args.head_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.log_every == 0 or step == args.steps - 1:
            el = time.time() - t0
            tok_s = (step + 1) * args.batch_size * span / el
            heads = " ".join(f"{x:.2f}" for x in per_head.tolist())
            tune = ""
            if held_out is not None and (step % (5 * args.log_every) == 0 or step == args.steps - 1):
                model.eval()
                tune = f" | tune loss head 1 {evaluate(model, held_out, 16)[0][0]:.3f}"
                model.train()
            print(f"[{label}] step {step:5d}/{args.steps} loss/head {heads} | {tok_s:,.0f} tok/s | "
                  f"{el / 60:.1f} min, {(args.steps - step - 1) * el / (step + 1) / 60:.1f} min left"
                  + tune, flush=True)
    model.eval()
    return time.time() - t0


@torch.no_grad()
def evaluate(model, data, n_windows=64):
    """Per-head held-out loss and top-1 accuracy on evenly spaced windows of `data`."""
    span = model.config.block_size + model.config.n_bpd_heads
    starts = torch.linspace(0, len(data) - span - 1, n_windows).long()
    chunk = torch.stack([data[i:i + span] for i in starts])
    T, h = model.config.block_size, model.config.n_bpd_heads
    logits = model.head_logits(model(chunk[:, :T]))                       # [N, T, h, V]
    targets = torch.stack([chunk[:, 1 + i:1 + i + T] for i in range(h)], dim=-1)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 2), targets.flatten(), reduction="none")
    acc = (logits.argmax(-1) == targets).float()
    return loss.view(-1, h).mean(0).tolist(), acc.view(-1, h).mean(0).tolist()


def auto_threads():
    """-> (n, reason). Measured on 2 cores, one default training step: idle, 1 thread 731 ms vs
    2 threads 433 ms; next to one busy process, 731 ms vs 1180 ms (the threads wait for each
    other). So: every core on an idle machine, else one thread."""
    try:
        cores = len(os.sched_getaffinity(0))      # the cores this process may run on
    except AttributeError:                        # macOS, Windows
        cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]                 # processes wanting a core, last minute
    except (AttributeError, OSError):             # Windows
        return cores, "load average unknown"
    if load < 0.5:
        return cores, "machine idle"
    return 1, f"load average {load:.2f}: another process is busy"


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
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)

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
    distill.add_arguments(p, arg)
    args = p.parse_args(argv)
    # which flags were written out: --distill changes the defaults of the others
    args.given = distill.explicit_flags(p, sys.argv[1:] if argv is None else argv)
    return args


def check_args(args):
    """Every flag checked before any work: a typo should cost a second, not a training run."""
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
    if not os.access(folder, os.W_OK) or (os.path.exists(out) and not os.access(out, os.W_OK)):
        fail(f"--out {out}: not writable")


def scale_rescorer(args):
    """The rescorer is a small LM beside the base model: half its steps, half its width (even:
    2 attention heads), a third of its layers, unless given. Defaults: 2 x 64, 2,500 steps."""
    if args.rescorer_steps is None:
        args.rescorer_steps = max(1, args.steps // 2)
    if args.rescorer_embd is None:
        args.rescorer_embd = max(2, args.n_embd // 4 * 2)      # half, rounded down to even
    if args.rescorer_layers is None:
        args.rescorer_layers = max(1, args.n_layer // 3)


def main(argv=None):
    args = parse_args(argv)
    distill.check_args(args, args.given, fail)      # first: it sets --distill's defaults
    check_args(args)
    if args.distill:
        return main_distill(args)
    scale_rescorer(args)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    text, corpus = load_corpus(args.data, True if args.clean else None)
    vocab = "".join(sorted(set(text)))
    stoi = {c: i for i, c in enumerate(vocab)}
    texts = split_corpus(text)
    splits = {k: torch.tensor([stoi[c] for c in v]) for k, v in texts.items()}
    span = args.block_size + args.heads + 1
    if min(len(v) for v in splits.values()) <= span:
        fail(f"{'--data ' + args.data if args.data else 'the corpus'} is too small for "
             f"--block-size {args.block_size} --heads {args.heads}: each split needs over {span} "
             f"characters (about {20 * span} in all, it has {len(text)})")
    print(f"corpus: {corpus['name']}{', cleaned' if corpus['cleaned'] else ''}, "
          f"{corpus['chars']:,} chars, vocab {len(vocab)}, "
          + ", ".join(f"{k} {len(v):,}" for k, v in splits.items()))
    threads, reason = (args.threads, "--threads") if args.threads else auto_threads()
    print(f"threads: {threads} ({reason}{'' if args.threads else '; --threads overrides'})")
    threads_before = torch.get_num_threads()
    try:            # main() may run inside another program (the tests): give its threads back
        torch.set_num_threads(threads)
        ckpt = train_both(args, vocab, splits, gen)
    finally:
        torch.set_num_threads(threads_before)
    ckpt.update(corpus=corpus, splits=texts)
    ckpt["train"]["threads"] = threads
    torch.save(ckpt, args.out)
    print(f"saved {args.out} ({ckpt['train']['seconds'] / 60:.1f} min of training)")


def main_distill(args):
    """--distill: fine-tune --base's heads (and, joint, its trunk) on its own greedy output."""
    threads, reason = (args.threads, "--threads") if args.threads else auto_threads()
    print(f"threads: {threads} ({reason}{'' if args.threads else '; --threads overrides'})")
    threads_before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        ckpt = distill.run(args, lr_at, evaluate, fail)
    finally:
        torch.set_num_threads(threads_before)
    ckpt["distill"].update(threads=threads, git_revision=git_revision())
    torch.save(ckpt, args.out)
    d = ckpt["distill"]
    print(f"saved {args.out} ({d['seconds'] / 60:.1f} min of distillation, "
          f"{d['seconds_generating'] / 60:.1f} generating)")


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
    half = lambda m: {k: v.half() for k, v in m.state_dict().items()}   # fp16 on disk: half the MB
    return {"format_version": FORMAT_VERSION, "config": asdict(cfg), "model": half(model),
            "rescorer_config": asdict(rcfg), "rescorer": half(rescorer), "vocab": vocab,
            "seed": args.seed, "git_revision": git_revision(),
            "train": {"steps": args.steps, "rescorer_steps": args.rescorer_steps,
                      "seconds": round(secs + rsecs), "test_loss": losses, "test_acc": accs,
                      "torch": str(torch.__version__)}}


if __name__ == "__main__":
    main()
