"""threads: torch's intra-op thread policy, the one of every command (choose_threads)."""
import torch

from train_heads import training_threads


def choose_threads(n=None, training=False):
    """torch's intra-op threads, the one policy of every command (docs/threads.md has the
    measurements behind it): decoding uses 1 thread (torch's threads wait for each other at every
    small op, and far longer when another process is busy); training uses
    train_heads.training_threads' rule (every core on an idle machine, else 1). n: an explicit
    choice, at most the machine's cores. -> (n, reason)"""
    if training or n is not None:
        return training_threads(n)
    return 1, "decoding: 1 thread"


def set_threads(n=None, training=False):
    """Apply choose_threads. -> the thread count."""
    n = choose_threads(n, training)[0]
    torch.set_num_threads(n)
    return n
