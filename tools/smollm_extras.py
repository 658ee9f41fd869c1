"""Four of the papers' results on SmolLM2 (docs/results/paper-extras.md), small enough
to finish in minutes on 2 shared cores: the bench's and the tasks' own functions on a few
prompts, not the whole bench (8 prompts x 64 tokens took 1,197 s). Keys of the JSON are the
bench's and the tasks' (lab/bench.py: speedup_by_heads, head_entropy_quantiles, loss_repeats,
win_tie_loss; per task block_efficiency_by_heads).

  fig4     Stern §7.3: speedup against block efficiency (Fig. 4) and by k (Table 4) (by_heads)
  entropy  Kim §6.2, Fig. 3a: each head's entropy distribution (lab.analysis.entropy_quantiles)
  losses   Kim Table 5's losses for neural, ngram, pbest (lab.analysis.compared_steps,
           win_tie_loss, loss_repeats), by offline replay along greedy
  tasks    Kim Table 1: plain BPD's block efficiency by heads used on the seven tasks
           (lab.bench.built_tasks, lab.analysis.be_by_heads), by offline replay: exact, no timing

    python tools/smollm_extras.py --parts fig4,entropy,losses --prompts 3 --new-tokens 64 --plot DIR --json  # 190 s
    python tools/smollm_extras.py --parts entropy,losses --prompts 16 --new-tokens 64 --plot DIR --json   # 92 s
    python tools/smollm_extras.py --parts tasks --examples 16 --plot DIR --json                         # 167 s
(the runs of docs/results/paper-extras.md, on 2 shared cores)
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import decoders  # noqa: E402
from lab import analysis, bench, figures  # noqa: E402
from lab.run import Run  # noqa: E402
from minibpd import ArgmaxDrafter  # noqa: E402
from runtime.checkpoint import load  # noqa: E402 (the lab's loader: FastGPT, SmolLM2)

PARTS = ("fig4", "entropy", "losses", "tasks")
REFINED = ["neural", "ngram", "pbest"]
PREFIX = "paper_extras_smollm2_"        # the figures' file names, in --plot DIR


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default="checkpoints/smollm2-heads.pt")
    p.add_argument("--parts", default="fig4,entropy,losses", help=f"of {','.join(PARTS)}")
    p.add_argument("--prompts", type=int, default=3, help="test-split prompts (fig4, entropy, losses)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=3, help="fig4: timed repetitions after a warm-up")
    p.add_argument("--examples", type=int, default=5, help="tasks: test examples per task")
    p.add_argument("--plot", metavar="DIR", help=f"write the figures ({PREFIX}*.png; matplotlib)")
    p.add_argument("--json", action="store_true", help="print the result as JSON too")
    args = p.parse_args(argv)
    args.parts = [x for x in args.parts.split(",") if x]
    if not set(args.parts) <= set(PARTS):
        p.error(f"--parts: choose from {','.join(PARTS)}")
    return args


def prompt_parts(args, res, settings):
    """fig4, entropy and losses on the test split's prompts -> {JSON key: result}."""
    ck, out = res.ck, {}
    prompts = bench.make_prompts(decoders.split_text(ck, "test"), ck["vocab"], args.prompts)
    run = Run(res, settings, prompts, args.new_tokens)
    if "fig4" in args.parts:
        out["speedup_by_heads"] = bench.by_heads(run, args.reps)
    if "entropy" in args.parts:
        out["head_entropy_quantiles"] = analysis.entropy_quantiles(run.items)
    if "losses" in args.parts:           # BPD's steps by replay: the ones bpd_decode takes
        bpd = analysis.replay_all(run, lambda answer: ArgmaxDrafter())
        compared = analysis.compared_steps(run, bpd, REFINED)
        out["win_tie_loss"] = analysis.win_tie_loss(run, bpd, compared=compared)
        out["loss_repeats"] = analysis.loss_repeats(compared)
    return out


def task_part(args, res, settings):
    """Kim Table 1 on the seven tasks: {task: {block_efficiency_by_heads}}, each example decoded
    for its target's length within bench.SUBWORD_TOKENS, as `--tasks` does."""
    lo, hi = bench.SUBWORD_TOKENS
    out = {}
    for name, examples in bench.built_tasks(res.ck["vocab"], args.examples).items():
        lengths = [max(lo, min(len(t), hi)) for _, t in examples]
        run = Run(res, settings, [p for p, _ in examples], lengths)
        out[name] = {"block_efficiency_by_heads": analysis.be_by_heads(run)}
        print(f"  {name}: " + " ".join(f"{v:.2f}" for v in
                                       out[name]["block_efficiency_by_heads"].values()),
              file=sys.stderr, flush=True)
    return out


def plot(out, folder, model):
    """The figures of lab/figures.py for what was measured -> their file names."""
    plt = figures.pyplot()
    os.makedirs(folder, exist_ok=True)
    specs = [("speedup_by_heads", figures.heads_speed, out.get("speedup_by_heads")),
             ("head_entropy", figures.entropy_boxes, out.get("head_entropy_quantiles")),
             ("tasks_by_heads", figures.tasks_by_heads, out.get("tasks") and {
                 k: v["block_efficiency_by_heads"] for k, v in out["tasks"].items()})]
    names = []
    for name, draw, data in specs:
        if data:
            fig = draw(plt, data, model)
            names.append(figures.save(fig, folder, PREFIX + name + ".png"))
            plt.close(fig)
    return names


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.time()
    model, ck = load(args.checkpoint)
    settings = decoders.settings(decoders.load_tuned(decoders.tuned_path(args.checkpoint),
                                                     args.checkpoint))
    res = decoders.Resources(model, ck)
    out = {"checkpoint": args.checkpoint, "prompts": args.prompts, "new_tokens": args.new_tokens,
           "machine": getattr(model, "machine", None), **prompt_parts(args, res, settings)}
    if "tasks" in args.parts:
        out.update(tasks=task_part(args, res, settings), examples=args.examples)
    out["seconds"] = round(time.time() - t0)
    if out.get("speedup_by_heads"):
        figures.print_by_heads(out["speedup_by_heads"])
    if out.get("loss_repeats"):
        figures.print_losses(out["loss_repeats"])
    if out.get("tasks"):
        figures.print_heads_by_task({k: v["block_efficiency_by_heads"] for k, v in out["tasks"].items()})
    if args.plot:
        print(f"wrote {', '.join(plot(out, args.plot, args.checkpoint))} to {args.plot}",
              file=sys.stderr)
    print(f"{out['seconds']} s")
    if args.json:
        print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
