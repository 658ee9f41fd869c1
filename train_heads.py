"""Train the minibpd model: a character-level GPT trunk with h BPD heads, trained jointly (Kim §4),
plus the small neural rescorer LM used for local rescoring (Kim §7.1).

    python train_heads.py                      # defaults: reproduces checkpoints/minibpd.pt
    python train_heads.py --data FILE --out ckpt.pt --max-steps 500

Default corpus: the reference documentation that ships with every CPython (`pydoc_data.topics`),
cleaned so that the model learns prose rather than whitespace runs and table borders.
"""
import argparse
import hashlib
import math
import re
import subprocess
import sys
import time
from dataclasses import asdict

import torch

from minibpd import CHECKPOINT, FORMAT_VERSION, GPT, GPTConfig

RULE = re.compile(r"^[\s*=\-+|~^#.:`'\"_]*$")   # reST underlines, table borders, blank-ish lines


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


def load_corpus(path=None):
    """-> (text, description). Default: pydoc_data.topics, topics in sorted order."""
    if path is None:
        import pydoc_data.topics as topics
        raw = "\n\n".join(topics.topics[k] for k in sorted(topics.topics))
        name = f"pydoc_data.topics (Python {sys.version.split()[0]})"
    else:
        try:
            with open(path, encoding="utf-8") as f:
                raw = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise SystemExit(f"error: cannot read {path} as UTF-8 text: {e}")
        name = path
    text = clean_text(raw)
    if len(text) < 1000:
        raise SystemExit(f"error: corpus {name} has only {len(text)} characters after cleaning; "
                         "give at least a few thousand")
    return text, {"name": name, "chars": len(text),
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


def git_revision():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", help="UTF-8 text file (default: Python's own pydoc_data.topics)")
    p.add_argument("--out", default=CHECKPOINT)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--steps", type=int, default=5000, help="optimizer steps for the base model")
    p.add_argument("--rescorer-steps", type=int, default=2500)
    p.add_argument("--rescorer-layers", type=int, default=2)
    p.add_argument("--rescorer-embd", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--heads", type=int, default=8, help="h, the number of BPD heads (head 1 included)")
    p.add_argument("--head-weight", type=float, default=0.2,
                   help="loss weight of heads 2..h relative to head 1 (1.0: plain mean)")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--log-every", type=int, default=100)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    text, corpus = load_corpus(args.data)
    vocab = "".join(sorted(set(text)))
    stoi = {c: i for i, c in enumerate(vocab)}
    texts = split_corpus(text)
    splits = {k: torch.tensor([stoi[c] for c in v]) for k, v in texts.items()}
    print(f"corpus: {corpus['name']}, {corpus['chars']:,} chars, vocab {len(vocab)}, "
          + ", ".join(f"{k} {len(v):,}" for k, v in splits.items()))
    span = args.block_size + args.heads + 1
    if min(len(v) for v in splits.values()) <= span:
        raise SystemExit(f"error: the corpus is too small for --block-size {args.block_size}: each "
                         f"split needs over {span} characters (about {20 * span} in all)")
    cfg = GPTConfig(len(vocab), args.block_size, args.n_layer, args.n_head, args.n_embd,
                    args.heads, args.dropout)
    model = GPT(cfg)
    print(f"model: {sum(p.numel() for p in model.parameters()):,} parameters, {cfg}")
    secs = train(model, splits["train"], args, gen, "heads", splits["tune"])
    losses, accs = evaluate(model, splits["test"])
    print("held-out (test) per head:  loss " + " ".join(f"{x:.3f}" for x in losses))
    print("                      top-1 acc " + " ".join(f"{x:.3f}" for x in accs))
    # The small rescorer LM (Kim §7.1): same class, one head, ~8% of the base parameters.
    rcfg = GPTConfig(len(vocab), args.block_size, args.rescorer_layers, 2, args.rescorer_embd, 1,
                     args.dropout)
    rescorer = GPT(rcfg)
    rargs = argparse.Namespace(**{**vars(args), "steps": args.rescorer_steps})
    rsecs = train(rescorer, splits["train"], rargs, gen, "rescorer", splits["tune"])
    print(f"rescorer: {sum(p.numel() for p in rescorer.parameters()):,} parameters, held-out loss "
          f"{evaluate(rescorer, splits['test'])[0][0]:.3f}")
    half = lambda m: {k: v.half() for k, v in m.state_dict().items()}   # fp16 on disk: half the MB
    torch.save({"format_version": FORMAT_VERSION, "config": asdict(cfg), "model": half(model),
                "rescorer_config": asdict(rcfg), "rescorer": half(rescorer), "vocab": vocab,
                "corpus": corpus, "splits": texts, "seed": args.seed, "git_revision": git_revision(),
                "train": {"steps": args.steps, "seconds": round(secs + rsecs),
                          "test_loss": losses, "test_acc": accs, "torch": str(torch.__version__)}},
               args.out)
    print(f"saved {args.out} ({(secs + rsecs) / 60:.1f} min of training)")


if __name__ == "__main__":
    main()
