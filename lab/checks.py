"""checks: every check of the command line before any model is loaded: `check_args` (the flags
alone) and, once the checkpoint's header is read, `check_against_checkpoint` (the flags against
it). Every refusal is a ValueError (or a CheckpointError), one line on stderr and exit status 2.
"""
import os

import torch

import decoders
import lattice
from runtime.checkpoint import CHECKPOINT

MAX_NEW_TOKENS = 100_000      # more is refused: greedy alone would run for minutes
TUNE_SIZE = (16, 128)         # the documented --tune run: prompts x new tokens
DEMO_TOKENS = 160             # the demo's most new tokens (its text fits a terminal)
PROMPT_TOKENS = 200           # --prompt's default
TASK_EXAMPLES = 32            # --tasks: test examples per task (the run takes minutes)
TASKS_CHECKPOINT = os.path.join(os.path.dirname(CHECKPOINT), "minibpd-tasks.pt")


def overrides(args):
    return {"k": args.k, "p": args.p, "alpha": args.alpha}


def check_args(args):
    """Every check that needs no checkpoint, before anything is loaded or run."""
    demo = not (args.prompt is not None or args.bench or args.tune or args.tasks or args.scale)
    if args.checkpoint is None:
        args.checkpoint = TASKS_CHECKPOINT if args.tasks else CHECKPOINT
    if args.prompts is None:
        args.prompts = TASK_EXAMPLES if args.tasks else TUNE_SIZE[0]
    args.tokens_given = args.max_new_tokens is not None
    if args.max_new_tokens is None:
        args.max_new_tokens = DEMO_TOKENS if demo else PROMPT_TOKENS
    for flag, value in (("--max-new-tokens", args.max_new_tokens), ("--new-tokens", args.new_tokens)):
        if not 1 <= value <= MAX_NEW_TOKENS:
            raise ValueError(f"{flag} must be from 1 to {MAX_NEW_TOKENS:,}, got {value}")
    if demo and args.max_new_tokens > DEMO_TOKENS:
        raise ValueError(f"--demo shows at most {DEMO_TOKENS} new tokens, got --max-new-tokens "
                         f"{args.max_new_tokens}; use --prompt TEXT for longer generations")
    if args.prompts < 1:
        raise ValueError(f"--prompts must be >= 1, got {args.prompts}")
    if not 0 <= args.seed < 2 ** 63:
        raise ValueError(f"--seed must be from 0 to 2**63 - 1, got {args.seed}")
    if args.prompt is not None and not args.prompt:
        raise ValueError("the prompt is empty: pass some text, e.g. --prompt 'The import statement'")
    if args.decoder not in decoders.names(args.temperature) + list(decoders.BASELINES):
        raise ValueError(f"unknown decoder {args.decoder!r}; choose from {', '.join(decoders.names())}")
    given = {k: v for k, v in overrides(args).items() if v is not None}
    if not 0 <= args.temperature < float("inf"):
        raise ValueError(f"--temperature must be a number >= 0, got {args.temperature}")
    if (args.tune or args.scale or args.tasks) and args.temperature:
        raise ValueError(f"--{'tune' if args.tune else 'scale' if args.scale else 'tasks'} measures "
                         "greedy decoding: drop --temperature")
    if args.tune and given:
        raise ValueError(f"--tune chooses {', '.join('--' + k for k in given)} itself; drop the flag")
    lattice.check_settings(**given)    # the one settings rule; budgets once the model is loaded
    if args.plot:
        check_plot_dir(args.plot)
    if args.tune and args.objective == "tokens_per_s" and not args.tuned:
        raise ValueError("speed-tuned settings hold for this machine only: add --tuned FILE")
    documented = (args.prompts, args.new_tokens) == TUNE_SIZE and args.heads is None
    if args.tune and not documented and not args.tuned:
        raise ValueError(f"a --tune run other than the documented --prompts {TUNE_SIZE[0]} "
                         f"--new-tokens {TUNE_SIZE[1]} (all heads) writes only to a file you name: "
                         "add --tuned FILE")


def check_plot_dir(folder):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError("--plot needs matplotlib, which is not installed: pip install matplotlib") from None
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--plot {folder}: cannot create that folder ({e.strerror})") from None
    if not os.access(folder, os.W_OK):
        raise ValueError(f"--plot {folder}: that folder is not writable")


def resolve_device(name):
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but CUDA is not available; use --device cpu")
    return name


