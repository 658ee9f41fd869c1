"""Kim §7.1's rescorer-size ablation at our scale, measured on both models
(docs/results/paper-extras.md): the `neural` decoder (local rescoring with a small LM) with
rescorers of several sizes, each timed beside greedy and plain BPD in one interleaved run
(lab.bench.timed_methods: every output checked identical to greedy, block efficiency from the
real decode, wall-clock the median of the repetitions after a warm-up).

The character model: small GPT rescorers of three sizes trained here with the training code of
the shipped one (train_heads.train, the same loss, optimiser and seed; fewer steps), written
outside checkpoints/ (the shipped checkpoint is never touched); its shipped rescorer is measured
beside them. SmolLM2: its rescorer is an early exit of the base model (models.smollm.EarlyExit),
measured at several depths with an untrained adapter (the identity: the trunk's first layers,
the final norm and the tied output projection), and the shipped depth with its trained adapter.

    python tools/rescorer_sizes.py train --out /tmp/minibpd-rescorers --steps 2500          # ~10 min
    python tools/rescorer_sizes.py bench --rescorers /tmp/minibpd-rescorers --prompts 16 --new-tokens 128 --reps 5 --json --plot FILE.png   # 81 s
    python tools/rescorer_sizes.py bench --checkpoint checkpoints/smollm2-heads.pt --exits 6,12,18 --prompts 3 --new-tokens 64 --reps 3 --json --plot FILE.png   # 325 s
(the runs of docs/results/paper-extras.md, on 2 shared cores)
"""
import argparse
import glob
import json
import os
import sys
import time
from dataclasses import asdict, replace

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import decoders  # noqa: E402
import train_heads  # noqa: E402
from lab import bench, figures  # noqa: E402
from lab.run import Run  # noqa: E402
from minibpd import GPTConfig  # noqa: E402
from runtime.checkpoint import load  # noqa: E402 (the lab's loader: FastGPT, SmolLM2)
from runtime.checkpoint import build_model, family_module  # noqa: E402
from runtime.fast_heads import FastGPT  # noqa: E402
from train_heads import as_tensors  # noqa: E402

SIZES = ((1, 32), (2, 48), (3, 96))    # (n_layer, n_embd): about 1%, 4% and 25% of the base


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train the character model's rescorers of SIZES")
    t.add_argument("--out", default="/tmp/minibpd-rescorers", help="folder for the .pt files")
    t.add_argument("--steps", type=int, default=2500, help="optimizer steps of each rescorer (the shipped one's)")
    t.add_argument("--seed", type=int, default=1337)
    b = sub.add_parser("bench", help="time neural with each rescorer beside greedy and BPD")
    b.add_argument("--checkpoint", default="checkpoints/minibpd.pt")
    b.add_argument("--rescorers", default="/tmp/minibpd-rescorers", help="train's --out")
    b.add_argument("--exits", default="6,12,18", help="SmolLM2: early-exit depths (layers)")
    b.add_argument("--prompts", type=int, default=8, help="test-split prompts")
    b.add_argument("--new-tokens", type=int, default=128)
    b.add_argument("--reps", type=int, default=3, help="timed repetitions (after a warm-up)")
    b.add_argument("--json", action="store_true", help="print the result as JSON too")
    b.add_argument("--plot", metavar="FILE.png", help="write the figure (matplotlib)")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- train

def train_one(ck, layers, embd, steps, seed, out):
    """One rescorer as train_heads.train_both trains the shipped one (its config: the base's, with
    `layers` blocks, 2 attention heads, width `embd`, one head), `steps` steps -> its file."""
    rcfg = replace(GPTConfig(**ck["config"]), n_layer=layers, n_head=2, n_embd=embd, n_bpd_heads=1)
    torch.manual_seed(seed)
    gen, splits = torch.Generator().manual_seed(seed), as_tensors(ck["splits"], ck["vocab"])
    model = FastGPT(rcfg)         # the training class of the shipped checkpoint (training/cli.py)
    run = train_heads.TrainConfig(steps=steps, seed=seed, log_every=250)
    secs = train_heads.train(model, splits["train"], run, gen, f"rescorer {layers}x{embd}",
                             splits["tune"])
    path = os.path.join(out, f"rescorer-{layers}x{embd}.pt")
    torch.save({"rescorer_config": asdict(rcfg), "rescorer": train_heads.half(model),
                "test_loss": train_heads.evaluate(model, splits["test"])[0][0], "steps": steps,
                "seed": seed, "seconds": round(secs)}, path)
    return path


def train(args):
    _, ck = load("checkpoints/minibpd.pt")
    os.makedirs(args.out, exist_ok=True)
    for layers, embd in SIZES:
        print("wrote", train_one(ck, layers, embd, args.steps, args.seed, args.out), flush=True)


# ----------------------------------------------------------------------------- bench

def char_rescorers(model, ck, folder):
    """{label: (small LM, its size in words)}: the shipped rescorer and every one `train` wrote."""
    res = decoders.Resources(model, ck)
    out = {"shipped 2x64": (res.small_lm(), "shipped: 2 layers x 64, 2,500 steps")}
    for path in sorted(glob.glob(os.path.join(folder, "rescorer-*.pt"))):
        saved = torch.load(path, weights_only=True)
        lm = build_model(saved["rescorer_config"], saved["rescorer"], where=path)
        label = os.path.basename(path)[len("rescorer-"):-len(".pt")]
        out[label] = (lm, f"{saved['steps']:,} steps, seed {saved['seed']}, test loss "
                          f"{saved['test_loss']:.3f}")
    return out


def exit_rescorers(model, ck, depths):
    """SmolLM2: {label: (early exit, what it is)}: the shipped depth with its trained adapter,
    and each depth with an untrained one (models.smollm.EarlyExit: the identity adapter)."""
    from models.smollm import EarlyExit
    shipped = ck["rescorer_config"]["layers"]
    out = {f"exit {shipped} trained": (decoders.Resources(model, ck).small_lm(),
                                       "the shipped early exit, its adapter trained")}
    for d in depths:
        out[f"exit {d}"] = (EarlyExit(model, d).eval(), "untrained adapter (identity)")
    return out


def size_of(lm):
    """Parameters a rescorer call multiplies by (an early exit: its own layers, the norm, the
    adapter and the tied output projection)."""
    return lm.flop_params()


def bench_sizes(args):
    """neural with each rescorer, beside greedy and plain BPD, in one timed run."""
    model, ck = load(args.checkpoint)
    smol = family_module(ck) is not None
    lms = exit_rescorers(model, ck, [int(d) for d in args.exits.split(",")]) if smol else \
        char_rescorers(model, ck, args.rescorers)
    settings = decoders.settings(decoders.load_tuned(decoders.tuned_path(args.checkpoint),
                                                     args.checkpoint))
    res = decoders.Resources(model, ck)
    prompts = bench.make_prompts(decoders.split_text(ck, "test"), ck["vocab"], args.prompts)
    run = Run(res, settings, prompts, args.new_tokens)
    methods = [decoders.method("greedy", res, {}), decoders.method("bpd", res, {})] + [
        decoders.Method(f"neural {label}", decoders.make(
            "neural", decoders.Resources(model, ck, small=lm), settings["neural"]), True)
        for label, (lm, _) in lms.items()]
    t0 = time.time()
    out = bench.timed_methods(run, methods, args.reps)
    wrong = [k for k, m in out["methods"].items() if not m["identical_to_greedy"]]
    assert not wrong, f"not identical to greedy: {wrong}"
    out.update(checkpoint=args.checkpoint, prompts=args.prompts, new_tokens=args.new_tokens,
               neural=settings["neural"], seconds=round(time.time() - t0),
               rescorers={k: {"params": size_of(lm), "base_params": model.flop_params(),
                              "about": about} for k, (lm, about) in lms.items()})
    report(out)
    if args.plot:
        plt = figures.pyplot()
        fig = figures.rescorer_sizes(plt, out, args.checkpoint)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print("wrote", args.plot, file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=1))
    return out


def report(out):
    print(f"{out['checkpoint']}: {out['prompts']} prompts x {out['new_tokens']} tokens, neural "
          f"{out['neural']}, {out['threads']} thread(s), {out['seconds']} s")
    for name, m in out["methods"].items():
        r = out["rescorers"].get(name[len("neural "):]) if name.startswith("neural ") else None
        size = f"{r['params']:>11,} ({100 * r['params'] / r['base_params']:5.1f}%)" if r else " " * 20
        print(f"  {name:22s} {size} block eff. {m['block_efficiency']:.3f}  {m['tokens_per_s']:7.1f} "
              f"tok/s  {m['speedup']:.2f}x greedy  = greedy: {m['identical_to_greedy']}")
    for w in out["timing_warnings"]:
        print("  warning:", w)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    return train(args) if args.command == "train" else bench_sizes(args)


if __name__ == "__main__":
    main()
