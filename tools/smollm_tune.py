"""`python minibpd.py --tune` for SmolLM2's heads checkpoint, with grids sized for its cost.

    python tools/smollm_tune.py --tune --force --checkpoint checkpoints/smollm2-heads.pt
    python tools/smollm_tune.py --tune --objective tokens_per_s --prompts 4 --new-tokens 64 \
        --checkpoint checkpoints/smollm2-heads.pt --tuned checkpoints/smollm2-heads.pt.speed-tuned.json --force

(--force: both files are shipped, in checkpoints/; --tune rewrites none without it.)

The arguments are minibpd.py's; the registry's grids are changed for this run only (for a
checkpoint of kind smollm2-heads; any other is tuned with the registry's grids), because:
  * nodes (p-best's node budget, tuned for tokens/s only): a call's cost grows with the nodes
    kept (the shipped speed-tuned file was tuned when p-best's paths were verified as rows, before
    llama.tree_attention made tree verification exact on this model). Here nodes is 7 or 15 (a few paths of up to 4 drafted tokens),
    or 0 (no budget).
  * lookup's nodes (tokens_per_s only): 7 keeps its copy where the token tree fits one 8-row
    block beside BPD's draft (bf16 on a CPU with AVX512-BF16), or 0 (the copy always).
  * tokens_per_s times one decode per grid point (a 135M-parameter call is ~20x a character
    model's): alpha 0.3 / 0.5 / 0.7 / 0.9, orders 3 and 4 (order 5's table takes 14 s to build
    and the 5-gram DP is the slowest), neural's k = 8 only, its reach 0, 0.05, 0.2, 0.5 (the
    early exit costs ~1/4 of a base call per position: skipping positions is its lever).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lab import cli
import decoders  # noqa: E402
from models import smollm

NODES = [0, 7, 15]
SPEED_GRID = {"neural": {"k": [8], "alpha": [0.3, 0.5, 0.7], "reach": [0.0, 0.05, 0.2, 0.5]},
              "ngram": {"order": [3, 4], "alpha": [0.3, 0.5, 0.7, 0.9]},
              "pbest0": {"nodes": [7, 15]},
              "pbest": {"order": [3, 4], "alpha": [0.3, 0.5, 0.7, 0.9], "nodes": [7, 15]},
              "lookup": {"nodes": [0, 7]}}


def checkpoint_kind(argv):
    path = argv[argv.index("--checkpoint") + 1] if "--checkpoint" in argv else None
    if path is None or not os.path.isfile(path):
        return None
    return torch.load(path, map_location="cpu", weights_only=True).get("kind")


def narrow(speed):
    """The registry's grids, changed in place for this process (see the docstring)."""
    for name in ("pbest0", "pbest"):
        decoders.DECODERS[name].grid["nodes"] = list(NODES)
    if speed:
        for name, grid in SPEED_GRID.items():
            decoders.DECODERS[name].grid.update({k: list(v) for k, v in grid.items()})
    return {name: d.grid for name, d in decoders.DECODERS.items()}


if __name__ == "__main__":
    argv = sys.argv[1:]
    if checkpoint_kind(argv) == smollm.KIND:
        grids = narrow("tokens_per_s" in argv)
        print(f"grids for SmolLM2: {grids}", file=sys.stderr)
    sys.exit(cli.main(argv))
