"""The command line of train_heads.py: every mode's settings (RunConfig), its flags
(parse_train_args; the help text is train_heads.py's docstring), every check before any work
(check_train_args: a typo should cost a second, not a training run), and the hand-off: the base
run to train_heads.run_base, --distill and --tasks to finetune.py, --smollm to smollm_heads.py.
Bad input: one `error:` line on stderr, exit status 2.
"""
import math
import os
import sys
from dataclasses import dataclass, fields

import torch

import train_heads
from lab.questions import questions
from models.llama import HEAD_FORMS
from minibpd import CHECKPOINT, CheckpointError
from runtime.checkpoint import read, shipped, train_kind
from runtime.fast_heads import FastGPT
from runtime.threads import choose_threads
from training.finetune import (DISTILL_DEFAULTS, TASKS_DEFAULTS, TEACHERS, VARIANTS, distill,
                               finetune_tasks)
from training.smollm_heads import SMOLLM_DEFAULTS, smollm_heads


# ---------------------------------------------------------------------------- the settings of a run

@dataclass
class RunConfig(train_heads.TrainConfig):
    """Every setting a training run reads: the base run's (train_heads.TrainConfig) and those of
    the fine-tuning modes, train_heads.py's flags of the same names (RunConfig.from_args), so
    the library takes one typed object, not argparse's Namespace. The defaults
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
        """The settings from an argparse Namespace (parse_train_args), by field name."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


# ----------------------------------------------------------------------------- the command line

class UsageError(SystemExit):
    """Exit status 2, like `python minibpd.py` on bad input; str() keeps the message for callers."""
    def __init__(self, message):
        super().__init__(f"error: {message}")
        self.code = 2


def fail(message):
    print(f"error: {message}", file=sys.stderr)    # one line, no traceback
    raise UsageError(message)


def parse_train_args(argv=None):
    """train_heads.py's flags (train_heads.parser) and the lab's modes: --distill, --tasks, --smollm."""
    p = train_heads.parser()
    p.epilog = None

    def arg(flag, help, metavar="N", **kw):         # every flag has a help line, with its default
        shown = " (default: %(default)s)" if kw.get("default") is not None else ""
        p.add_argument(flag, help=help + shown, metavar=metavar, **kw)
    add_distill_args(p, arg)
    add_smollm_args(p, arg)
    args = p.parse_args(argv)
    # which flags were written out: --distill changes the defaults of the others
    written = sys.argv[1:] if argv is None else argv
    args.given = {a.dest for a in p._actions for opt in a.option_strings
                  if any(x == opt or x.startswith(opt + "=") for x in written)}
    return args


def add_distill_args(p, arg):
    """--distill and its flags (arg: parse_args' helper, a help line required)."""
    arg("--distill", "self-distil the heads of --base instead of training a model: 'frozen' "
        "(trunk + head 1 frozen) or 'joint' (see training/finetune.py's self-distillation). Then "
        f"--steps, --lr, --warmup and --out default to {DISTILL_DEFAULTS['steps']}, "
        f"{DISTILL_DEFAULTS['lr']}, {DISTILL_DEFAULTS['warmup']} and "
        "checkpoints/minibpd-distilled.pt (default: off)", metavar="VARIANT")
    p_tasks = "fine-tune --base on the five tasks' train splits (tasks.py) instead of training a "\
        "model; then " + ", ".join(f"--{k.replace('_', '-')} defaults to {v}" for k, v in
                                   TASKS_DEFAULTS.items() if k != "out") + \
        " and --out to checkpoints/minibpd-tasks.pt"
    p.add_argument("--tasks", help=p_tasks + " (default: off)", action="store_true")
    arg("--base", "--distill, --tasks: the trained checkpoint to start from (default: the shipped "
        "checkpoints/minibpd.pt)", metavar="FILE")
    arg("--regen-every", "--distill: optimizer steps between regenerations of the greedy data",
        type=int, default=50)
    arg("--gen-rows", "--distill: greedy continuations generated per regeneration, as the rows "
        "of one batched KV cache", type=int, default=128)
    arg("--anchor", "--distill joint: loss weight of KL(base || model) of head 1 on the greedy "
        "windows (next to head 1's weight 1 on the corpus)", type=float, default=0.0, metavar="X")
    arg("--teacher", "--distill: which model generates the greedy data: 'current' (the model "
        "being trained, as it trains) or 'base' (a frozen copy of --base)", default="current",
        metavar="WHO")


def add_smollm_args(p, arg):
    """--smollm and its flags (arg: parse_args' helper, a help line required)."""
    p_smollm = "train BPD heads 2..h for SmolLM2-135M (smollm.py; frozen base, self-distilled on "\
        "its own greedy continuations of offline text and chat questions) instead of training a "\
        "model; then " + \
        ", ".join(f"--{k.replace('_', '-')} defaults to {v}" for k, v in SMOLLM_DEFAULTS.items()
                  if k != "out") + " and --out to checkpoints/smollm2-heads.pt"
    p.add_argument("--smollm", help=p_smollm + " (default: off)", action="store_true")
    arg("--teacher-tokens", "--smollm: positions of offline train text run through the base in "
        "batched windows (teacher forcing, no generation), whose argmaxes (--teacher-targets) the "
        f"heads pre-train on before self-distillation; 0: none (default: "
        f"{SMOLLM_DEFAULTS['teacher_tokens']:,} with --smollm)", type=int)
    arg("--teacher-targets", "--smollm: which teacher-forced argmaxes are targets: 'exact' "
        "(only where the text's tokens in between were greedy's, so that the target is greedy's "
        "own token) or 'all' (default: 'all' for chained heads, which read the text's tokens in "
        "between, so that every argmax is the base's choice after what they read; 'exact' for "
        "Stern's)", metavar="WHICH")
    arg("--teacher-steps", "--smollm: optimizer steps on the teacher-forced positions "
        f"(default: {SMOLLM_DEFAULTS['teacher_steps']} with --smollm)", type=int)
    arg("--head-form", "--smollm: heads 2..h like Stern §6's ('stern': each reads the final "
        "hidden state alone) or 'chained' (each also reads the token the head before it drafted; "
        "ours, after Hydra; models/llama_layers.py ChainedHead) (default: "
        f"{SMOLLM_DEFAULTS['head_form']} with --smollm)", metavar="FORM")
    arg("--draft-vocab", "--smollm: heads 2..h train on, and draft among, the S tokens the base "
        "chose most often (exact: verification keeps every token); 0: all of them (default: "
        f"{SMOLLM_DEFAULTS['draft_vocab']} with --smollm)", type=int, metavar="S")
    arg("--continuations", "--smollm: greedy continuations of train-split prompts generated for "
        "self-distillation, 128 tokens each (the tune split's 64 are fixed) (default: "
        f"{SMOLLM_DEFAULTS['continuations']:,} with --smollm)", type=int, metavar="N")
    arg("--chat-continuations", "--smollm: more of them, answers to train-split questions about "
        "the standard library in the model's chat template (lab/questions.py); 0: none, and no "
        "tune-split chat record (default: "
        f"{SMOLLM_DEFAULTS['chat_continuations']:,} with --smollm)", type=int, metavar="M")


def check_distill_args(args):
    """--distill's and --tasks' own checks (they set their defaults first), before any work."""
    chosen = [m for m, on in (("--distill", args.distill is not None), ("--tasks", args.tasks),
                              ("--smollm", args.smollm)) if on]
    if len(chosen) > 1:
        fail(f"{' and '.join(chosen)} are different ways to train: choose one")
    mode = chosen[0] if chosen else None
    own = {"--distill": ("regen_every", "gen_rows", "teacher", "anchor"), "--tasks": (),
           "--smollm": ("teacher_tokens", "teacher_steps", "teacher_targets", "draft_vocab",
                        "head_form", "continuations", "chat_continuations")}
    for flag in ("base",) * (mode in (None, "--smollm")) + sum((v for k, v in own.items() if k != mode), ()):
        if flag in args.given:
            fail(f"--{flag.replace('_', '-')} only applies with "
                 + ("--distill or --tasks" if flag == "base" else
                    next(m for m, names in own.items() if flag in names)))
    if mode is None:
        return
    if args.distill is not None and args.distill not in VARIANTS:
        fail(f"--distill must be one of {', '.join(VARIANTS)}, got {args.distill!r}")
    if args.teacher not in TEACHERS:
        fail(f"--teacher must be one of {', '.join(TEACHERS)}, got {args.teacher!r}")
    fixed = ["data", "clean", "n_layer", "n_head", "n_embd", "dropout", "rescorer_layers",
             "rescorer_embd"] + ["block_size", "rescorer_steps"] * (mode != "--tasks")
    fixed += ["head_weight"] if mode == "--smollm" else ["heads"]   # SmolLM2: its own corpus
    for flag in fixed:
        if flag in args.given:          # the model and its corpus come from --base
            fail(f"--{flag.replace('_', '-')} does not apply with {mode}: the model, its "
                 "corpus and its rescorer come from " + ("SmolLM2 and finetune.py" if mode ==
                                                         "--smollm" else "--base"))
    if not (math.isfinite(args.anchor) and args.anchor >= 0):
        fail(f"--anchor must be a finite number >= 0, got {args.anchor}")
    if args.distill == "frozen" and "anchor" in args.given:
        fail("--anchor does not apply with --distill frozen: head 1 is frozen")
    for name in ("regen_every", "gen_rows"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    defaults = {"--distill": DISTILL_DEFAULTS, "--tasks": TASKS_DEFAULTS, "--smollm": SMOLLM_DEFAULTS}
    for name, value in defaults[mode].items():
        if name not in args.given:
            setattr(args, name, value)
    if mode == "--smollm":
        check_smollm_args(args)
        return
    args.base = args.base or CHECKPOINT
    if not os.path.isfile(args.base):
        fail(f"--base {args.base}: no such checkpoint (train one with `python train_heads.py`)")
    check_base(args.base, mode)
    if os.path.abspath(args.base) == os.path.abspath(args.out):
        fail(f"--out {args.out} is --base: write the fine-tuned model to another file")


def check_base(path, mode):
    """--base is read (its header, no model built) before any work: it must be train_heads.py's
    own character GPT, which --distill and --tasks fine-tune."""
    try:
        kind = read(path, needs=("config",)).get("kind")
    except CheckpointError as e:
        fail(f"--base: {e}")
    if kind is not None:
        fail(f"--base {path} is a {kind!r} checkpoint: {mode} fine-tunes a character GPT that "
             "train_heads.py trained (e.g. checkpoints/minibpd.pt)"
             + ("; SmolLM2's heads are trained with --smollm" if "smollm" in kind else ""))


def check_smollm_args(args):
    """--smollm: heads 2..h need h >= 2, the teacher-forced phase steps if it has positions, a
    draft vocabulary at least 2 tokens and at most the vocabulary; the optional packages."""
    if args.heads < 2:
        fail(f"--heads must be >= 2 with --smollm (head 1 is the base model itself), got {args.heads}")
    if args.continuations < 1:
        fail(f"--continuations must be >= 1, got {args.continuations}")
    for name in ("teacher_tokens", "teacher_steps", "draft_vocab", "chat_continuations"):
        if getattr(args, name) < 0:
            fail(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    most = len(questions("train")) if args.chat_continuations > 0 else 0   # seconds: the stdlib
    if args.chat_continuations > most:
        fail(f"--chat-continuations must be at most the {most:,} train-split questions "
             f"(lab/questions.py), got {args.chat_continuations:,}")
    if args.head_form not in HEAD_FORMS:
        fail(f"--head-form must be {' or '.join(map(repr, HEAD_FORMS))}, got {args.head_form!r}")
    if args.teacher_targets is None:
        args.teacher_targets = "all" if args.head_form == "chained" else "exact"
    if args.teacher_targets not in ("exact", "all"):
        fail(f"--teacher-targets must be 'exact' or 'all', got {args.teacher_targets!r}")
    if args.teacher_tokens and not args.teacher_steps:
        fail("--teacher-tokens needs --teacher-steps >= 1 (or --teacher-tokens 0: no teacher forcing)")
    if args.draft_vocab == 1 or args.draft_vocab > 49152:
        fail(f"--draft-vocab must be 0 (all tokens) or 2..49152 (SmolLM2's vocabulary), got "
             f"{args.draft_vocab}")
    from models import smollm_gguf
    try:
        smollm_gguf.optional_packages()
        smollm_gguf.find_gguf()
    except ImportError as e:
        fail(str(e))


def check_train_args(args):
    """Every flag checked before any work (train_heads.check_args), the modes' first; an existing
    --out gets the lab's advice (overwrite_advice) before train_heads.py's plain refusal."""
    check_distill_args(args)
    if args.out and os.path.exists(args.out) and not args.force:
        fail(f"--out {args.out} already exists; {overwrite_advice(args.out, mode_kind(args))}")
    try:
        train_heads.check_args(args)
    except ValueError as e:
        fail(str(e))


def mode_kind(args):
    """The kind of checkpoint this run writes (runtime.checkpoint.train_kind of its file)."""
    if args.smollm:
        return "smollm2-heads"
    if args.tasks:
        return "tasks"
    return f"distill-{args.distill}" if args.distill else None


def overwrite_advice(out, kind):
    """What to do about an existing --out: --force only where it holds a checkpoint of the kind
    this run writes and is not shipped (runtime.checkpoint.retrain's rule); else a new file."""
    new = "my-heads.pt" if kind == "smollm2-heads" else "my-model.pt"
    if shipped(out):
        return f"it is shipped in checkpoints/: write to a new file, e.g. --out {new}"
    try:
        ours = train_kind(read(out, needs=("config",))) == kind
    except CheckpointError:
        ours = False
    if ours:
        return "pass --force to overwrite it"
    return f"it holds no checkpoint of the kind this run writes: write to a new file, e.g. --out {new}"


def with_threads(args, work):
    """Run work() on the training thread policy (threads.choose_threads), giving the caller's
    threads back after (train_main() may run inside another program: the tests). -> (result, n)"""
    threads, reason = choose_threads(args.threads, training=True)
    print(f"threads: {threads} ({reason}{'' if args.threads else '; --threads overrides'})")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        return work(), threads
    finally:
        torch.set_num_threads(before)


def train_main(argv=None):
    args = parse_train_args(argv)
    check_train_args(args)
    try:
        run(args)
    except ValueError as e:                 # the library's refusals: one line, exit status 2
        fail(str(e))


def run(args):
    if args.smollm:
        from models import smollm
        (model, ck), threads = with_threads(args, lambda: smollm_heads(RunConfig.from_args(args)))
        key, what = "train", "in all"
    elif args.tasks or args.distill:
        work = finetune_tasks if args.tasks else distill
        ck, threads = with_threads(args, lambda: work(RunConfig.from_args(args)))
        key, what = ("finetune", "of fine-tuning") if args.tasks else ("distill", "of distillation")
    else:
        # The stacked heads (FastGPT): the same forward pass to rounding, but their gradients sum
        # in another order, and training amplifies the last bits. The shipped checkpoint was
        # trained this way: `python -m training.cli --force --threads 2` repeats it bit for bit.
        train_heads.run_base(args, cls=FastGPT)
        return
    ck[key]["threads"] = threads
    if args.smollm:
        smollm.save_heads(model, args.out, ck)      # ck: the checkpoint's extra keys
    else:
        torch.save(ck, args.out)
    record = ck[key]
    generating = "seconds_generating" in record     # --tasks generates nothing
    print(f"saved {args.out} ({record['seconds'] / 60:.1f} min {what}"
          + (f", {record['seconds_generating'] / 60:.1f} generating)" if generating else ")"))


if __name__ == "__main__":
    train_main()
