"""cli: the command line behind `python minibpd.py` (main): every flag checked before the first
model call (lab/checks.py), then one mode run (demo.py, modes.py), at temperature 0 (greedy: every
decoder identical to it) or T > 0 (sampling: every decoder exact in distribution).
"""
import sys

import torch

from lab.checks import check_against_checkpoint, check_flags
from lab.demo import run_demo
from lab.flags import parse_args
from lab.modes import bench_command, prompt_command, scale_command, tasks_command, tune_command
import decoders
from runtime.checkpoint import read
from runtime.contract import DrafterError
from runtime.threads import set_threads


def main(argv=None):
    """The command line: every error a user can cause is one line on stderr and exit status 2;
    Ctrl-C (or a KeyboardInterrupt a plug-in or a drafter raises) is one line, "interrupted", and
    exit status 130 (the shell's for SIGINT), not a traceback."""
    try:
        args = parse_args(argv)
        check_flags(args)                   # every check that needs no checkpoint, first
        set_threads(args.threads)
        torch.manual_seed(args.seed)
        check_against_checkpoint(args, read(args.checkpoint, needs=("config",)))   # no model yet
        if args.tune:
            return tune_command(args)
        with decoders.select(decoders.parse_selection(args.decoders)):
            if args.bench:
                return bench_command(args)
            if args.tasks:
                return tasks_command(args)
            if args.scale:
                return scale_command(args)
        if args.prompt is not None:
            return prompt_command(args)
        return run_demo(args)
    except ValueError as e:                 # minibpd.CheckpointError is one too
        print(f"error: {e}", file=sys.stderr)
        return 2
    except DrafterError as e:               # a plug-in drafter failed while decoding
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:                 # e.g. `python minibpd.py --demo | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
