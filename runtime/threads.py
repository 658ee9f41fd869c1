"""threads: torch's intra-op thread policy, the one of every command (docs/threads.md has the
measurements behind it)."""
import os

import torch

from runtime.ids import is_int


def choose_threads(n=None, training=False):
    """torch's intra-op threads, the one policy of every command (docs/threads.md has the
    measurements behind it): decoding uses 1 thread (torch's threads wait for each other at every
    small op, and far longer when another process is busy); training uses every core on an idle
    machine (1-minute load average under 0.5), else 1. n: an explicit choice, at most the
    machine's cores. -> (n, reason)"""
    try:
        cores = len(os.sched_getaffinity(0))      # the cores this process may run on
    except AttributeError:                        # macOS, Windows
        cores = os.cpu_count() or 1
    if n is not None:
        if not is_int(n) or not 1 <= n <= cores:
            raise ValueError(f"--threads must be an integer from 1 to {cores} (this machine's "
                             f"cores), got {n!r}")
        return n, "--threads"
    if not training:
        return 1, "decoding: 1 thread"
    try:
        load = os.getloadavg()[0]                 # processes wanting a core, last minute
    except (AttributeError, OSError):             # Windows
        return cores, "load average unknown"
    if load < 0.5:
        return cores, "machine idle"
    return 1, f"load average {load:.2f}: another process is busy"


def set_threads(n=None, training=False):
    """Apply choose_threads. -> the thread count."""
    n = choose_threads(n, training)[0]
    torch.set_num_threads(n)
    return n
