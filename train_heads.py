"""Train the minibpd model: a character-level GPT trunk with h BPD heads, trained jointly (Kim §4),
plus the small neural rescorer LM used for local rescoring (Kim §7.1).

    python train_heads.py --force               # retrain the shipped checkpoints/minibpd.pt
    python train_heads.py --data my.txt --out my.pt --steps 500

    # Python source, indentation kept (the standard library's json package):
    cat $(python -c "import os,json;print(os.path.dirname(json.__file__))")/*.py > /tmp/json_src.py
    python train_heads.py --data /tmp/json_src.py --out py.pt --steps 500
    python minibpd.py --checkpoint py.pt --prompt "def "

Default corpus: the reference documentation that ships with every CPython (`pydoc_data.topics`),
cleaned so that the model learns prose rather than whitespace runs and table borders. A --data
file is used as it is (--clean applies the same cleaning). An existing --out is only overwritten
with --force. Unless given, the rescorer's size and steps scale with the base model's.
The thread count and the order of the heads' products change floating-point sums in their last
bits, and training amplifies them: the shipped checkpoint was trained with 2 threads and the lab's
stacked heads (runtime/fast_heads.py), so `python -m training.cli --force --threads 2` repeats it
bit for bit; this file's GPT trains the same model, equal to it up to those last bits.
"""
# Top to bottom, like nanoGPT's train.py: the settings, the joint loss (Kim §4), the optimiser
# loop, the base run, its corpus, its command line (training/cli.py adds the lab's modes).
import argparse
import hashlib
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, fields, replace

import torch
import torch.nn.functional as F

from minibpd import CHECKPOINT, GPT, GPTConfig


@dataclass
class TrainConfig:
    """The base run's settings (the flags of the same names); the lab's fine-tuning extends them."""
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
            if not torch.isfinite(loss):    # NaN weights stay NaN: the last step's check sees any
                raise ValueError(f"[{label}] the loss is {loss.item()} at step {step}: lower --lr")
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


# ----------------------------------------------------------------------------- the corpus

MAX_DATA_BYTES = 16 * 2 ** 20   # --data: at most 16 MiB (training holds every character as a tensor)
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


def chunk_size(text):
    """The split's chunk: 2,000 characters, smaller for texts under 80,000 (at least 40 chunks)."""
    return max(1, min(2000, len(text) // 40))


def chunk_split(j):
    """The split of chunk j: tune if j % 20 == 18, test if j % 20 == 19, else train (90 / 5 / 5)."""
    return {18: "tune", 19: "test"}.get(j % 20, "train")


def split_corpus(text):
    """Fixed split by chunks (chunk_size, chunk_split): deterministic, every split spans the text."""
    chunk, parts = chunk_size(text), {"train": [], "tune": [], "test": []}
    for j in range(0, len(text), chunk):
        parts[chunk_split(j // chunk)].append(text[j:j + chunk])
    return {k: "".join(v) for k, v in parts.items()}


def check_data_size(path):
    """--data at most MAX_DATA_BYTES, refused before it is read: memory grows with the text."""
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise ValueError(f"--data {path}: cannot read it ({e.strerror})") from None
    if size > MAX_DATA_BYTES:
        raise ValueError(f"--data {path} holds {size:,} bytes, more than the {MAX_DATA_BYTES:,} "
                         "train_heads.py reads: pass a smaller file")


def load_corpus(path=None, clean=None):
    """-> (text, description). Default: pydoc_data.topics, topics in sorted order, cleaned (it
    ships with every CPython: no download). A file is kept as it is unless clean=True:
    indentation is the point of, say, Python source."""
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
        raise ValueError(f"{where} has only {len(text)} characters"
                         f"{' after cleaning' if cleaned else ''}; give at least a few thousand")
    return text, {"name": name, "chars": len(text), "cleaned": cleaned,
                  "sha256": hashlib.sha256(text.encode()).hexdigest()}


def as_tensors(texts, vocab):
    """{split: text} -> {split: 1-D tensor of token ids}."""
    stoi = {c: i for i, c in enumerate(vocab)}
    return {k: torch.tensor([stoi[c] for c in v]) for k, v in texts.items()}


def corpus_splits(args):
    """The corpus, its vocabulary and splits (texts and tensors), sized for the model."""
    text, corpus = load_corpus(args.data, True if args.clean else None)
    vocab, texts = "".join(sorted(set(text))), split_corpus(text)
    splits = as_tensors(texts, vocab)
    span = args.block_size + args.heads + 1
    if min(len(v) for v in splits.values()) <= span:
        raise ValueError(f"{'--data ' + args.data if args.data else 'the corpus'} is too small "
                         f"for --block-size {args.block_size} --heads {args.heads}: each split "
                         f"needs over {span} characters; test has {len(splits['test']):,}, tune "
                         f"{len(splits['tune']):,} (about 5% of the text each)")
    print(f"corpus: {corpus['name']}{', cleaned' if corpus['cleaned'] else ''}, "
          f"{corpus['chars']:,} chars, vocab {len(vocab)}, "
          + ", ".join(f"{k} {len(v):,}" for k, v in splits.items()))
    return corpus, vocab, texts, splits


# ----------------------------------------------------------------------------- the command line

FORMAT_VERSION = 1              # of the checkpoint dict (the lab's loader checks it)


def parser():
    """The base run's flags (the lab's command line adds its modes' flags to this parser)."""
    p = argparse.ArgumentParser(prog="train_heads.py", description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="The lab's modes: "
                                "--distill, --tasks, --smollm (`--smollm --help` lists them all).")

    def arg(flag, help, metavar="N", **kw):         # every flag has a help line, with its default
        shown = " (default: %(default)s)" if kw.get("default") is not None else ""
        p.add_argument(flag, help=help + shown, metavar=metavar, **kw)
    arg("--data", "UTF-8 text file, used as it is, at most "
        f"{MAX_DATA_BYTES // 2 ** 20} MiB (default: Python's own pydoc_data.topics, cleaned)",
        metavar="FILE")
    p.add_argument("--clean", action="store_true", help="clean --data like the default corpus: "
                   "collapse spaces (indentation too), drop reST rules and table borders (default: off)")
    arg("--out", "checkpoint file to write", default=CHECKPOINT, metavar="FILE")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists (default: off)")
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
    return p


def check_args(args):
    """Every flag checked before any work: a typo should cost a second, not a training run."""
    floors = dict.fromkeys(["steps", "batch_size", "n_layer", "n_head", "n_embd", "block_size",
                           "heads", "log_every", "threads", "rescorer_steps", "rescorer_layers"], 1)
    for name, least in {**floors, "warmup": 0, "rescorer_embd": 2}.items():
        value = getattr(args, name)
        if value is not None and value < least:             # None: a computed default
            raise ValueError(f"--{name.replace('_', '-')} must be >= {least}, got {value}")
    if args.n_embd % args.n_head:
        raise ValueError(f"--n-embd {args.n_embd} must be divisible by --n-head {args.n_head}")
    if args.rescorer_embd is not None and args.rescorer_embd % 2:
        raise ValueError(f"--rescorer-embd {args.rescorer_embd} must be even (2 attention heads)")
    if not (math.isfinite(args.lr) and args.lr > 0):
        raise ValueError(f"--lr must be a finite number > 0, got {args.lr}")
    if not 0 <= args.dropout < 1:                           # also false for nan
        raise ValueError(f"--dropout must be in [0, 1), got {args.dropout}")
    if not (math.isfinite(args.head_weight) and args.head_weight >= 0):
        raise ValueError(f"--head-weight must be a finite number >= 0, got {args.head_weight}")
    if not 0 <= args.seed <= 2**63 - 1:                     # torch.manual_seed's range
        raise ValueError(f"--seed must be in [0, 2**63 - 1], got {args.seed}")
    if args.data is not None:
        check_data_size(args.data)
    check_out(args.out, args.force)
    training_threads(args.threads)


def check_out(out, force):
    """--out refused now rather than after training. A symbolic link is written through."""
    if not out or os.path.isdir(out):
        raise ValueError(f"--out {out!r} is not a file name")
    if os.path.exists(out) and not force:
        raise ValueError(f"--out {out} already exists: pass --force to overwrite it")
    if not os.path.isdir(os.path.dirname(os.path.realpath(out))):
        raise ValueError(f"--out {out}: directory {os.path.dirname(out)} does not exist")
    if not writable(out):
        raise ValueError(f"--out {out}: not writable (the file cannot be opened for writing there)")


def writable(path):
    """Whether a file can be written at `path`, tried for real (os.access says yes to root in /proc)."""
    path, existed = os.path.realpath(path), os.path.exists(path)
    try:
        with open(path, "ab"):
            pass
    except OSError:
        return False
    if not existed:
        os.remove(path)
    return True


def training_threads(n=None):
    """-> (threads, why). Training uses every core on an idle machine (1-minute load average
    under 0.5), else 1: torch's threads wait for each other, far longer when a core is busy."""
    try:
        cores = len(os.sched_getaffinity(0))      # the cores this process may run on
    except AttributeError:                        # macOS, Windows
        cores = os.cpu_count() or 1
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= cores:
            raise ValueError(f"--threads must be an integer from 1 to {cores} (this machine's "
                             f"cores), got {n!r}")
        return n, "--threads"
    try:
        load = os.getloadavg()[0]                 # processes wanting a core, last minute
    except (AttributeError, OSError):             # Windows
        return cores, "load average unknown"
    return (cores, "machine idle") if load < 0.5 else \
        (1, f"load average {load:.2f}: another process is busy")


def git_revision():                     # the commit a checkpoint records
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def scale_rescorer(args):
    """Unless given: the rescorer has half the base's steps and width (even), a third of its layers."""
    args.rescorer_steps = args.rescorer_steps or max(1, args.steps // 2)
    args.rescorer_embd = args.rescorer_embd or max(2, args.n_embd // 4 * 2)
    args.rescorer_layers = args.rescorer_layers or max(1, args.n_layer // 3)


def run_base(args, cls=GPT):
    """The base model and its rescorer (train_both) on the corpus, saved to args.out."""
    scale_rescorer(args)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    corpus, vocab, texts, splits = corpus_splits(args)
    cfg = GPTConfig(len(vocab), args.block_size, args.n_layer, args.n_head, args.n_embd, args.heads,
                    args.dropout)
    run = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    (threads, why), before = training_threads(args.threads), torch.get_num_threads()
    print(f"threads: {threads} ({why}{'' if args.threads else '; --threads overrides'})")
    try:                # give the caller's threads back (main() may run inside another program)
        torch.set_num_threads(threads)
        ckpt = train_both(run, cfg, vocab, splits, gen, args.rescorer_layers, args.rescorer_embd,
                          git_revision(), cls)
    finally:
        torch.set_num_threads(before)
    ckpt = {"format_version": FORMAT_VERSION, **ckpt, "corpus": corpus, "splits": texts}
    ckpt["train"]["threads"] = threads                  # the checkpoint records how it was made
    torch.save(ckpt, args.out)
    print(f"saved {args.out} ({ckpt['train']['seconds'] / 60:.1f} min of training)")


def main(argv=None):
    args = parser().parse_args(argv)
    try:                                    # a refusal: one line, exit status 2, no traceback
        check_args(args)
        run_base(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)


if __name__ == "__main__":      # --distill, --tasks, --smollm: the lab's command line
    if not {"--distill", "--tasks", "--smollm"} & {a.split("=")[0] for a in sys.argv[1:]}:
        sys.exit(main())
    try:
        import training.cli
    except ModuleNotFoundError as e:        # the paper files alone train the character model
        sys.exit(f"error: --distill, --tasks and --smollm are the lab's (training/ ...): {e}")
    training.cli.train_main()
