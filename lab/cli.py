"""cli: the command line behind `python minibpd.py`: --demo, --prompt, --bench and --tune, at
temperature 0 (greedy: every decoder identical to it) or T > 0 (sampling: every decoder exact in
distribution).

Every argument is checked before the first model call (lab/checks.py: the flags alone, then
against the checkpoint's header, before any model is loaded; then the decoders' budgets once it
is); every error a user can cause is one line on stderr and exit status 2.

Here: main, which checks the flags and runs one mode. The parser is flags.py (the plug-ins
imported first: plugins.py), the modes demo.py and modes.py, what they load loading.py.
"""
import functools
import sys

import torch

from lab.checks import check_against_checkpoint, check_args
from lab.demo import demo
from lab.flags import parse_args
from lab.modes import bench_command, generate, scale_command, tasks_command, tune_command
import decoders
from runtime.checkpoint import read
from runtime.contract import DrafterError
from runtime.threads import set_threads


def interruptible(command):
    """Ctrl-C (or a KeyboardInterrupt a plug-in or a drafter raises) ends the command with one
    line, "interrupted", and exit status 130 (the shell's for SIGINT), not a traceback."""
    @functools.wraps(command)
    def run(argv=None):
        try:
            return command(argv)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
    return run


@interruptible
def main(argv=None):
    """The command line: every error a user can cause is one line on stderr and exit status 2."""
    args = parse_args(argv)
    try:
        check_args(args)                    # every check that needs no checkpoint, first
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
            return generate(args)
        return demo(args)
    except ValueError as e:                 # minibpd.CheckpointError is one too
        print(f"error: {e}", file=sys.stderr)
        return 2
    except DrafterError as e:               # a plug-in drafter failed while decoding
        print(f"error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:                 # e.g. `python minibpd.py --demo | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
