"""Per-task heads on SmolLM2 (issue 24; docs/results/tasks.md "Per-task heads on SmolLM2"): from the
shipped heads (start), heads 2..h and the early-exit adapter fine-tuned on the mixture of all
seven tasks' train prompts, and per task on one task's train prompts (training/task_heads.py:
the same steps, seed and data budget each run). For each head set and each chosen task's test
examples (lab.bench.built_tasks; greedy continuations computed once, batch-invariant, as the
model runs): plain BPD's and each refined decoder's exact block efficiency by offline replay
(lab.analysis.be_of, the tuned settings of checkpoints/smollm2-heads.pt.tuned.json for every head
set), and each head's agreement with greedy.

    python tools/task_heads.py --tasks qa,code2doc,rename --steps 100 --prompts 128 --examples 8   # docs/results/tasks.md, ~27 min on 2 shared cores
    python tools/task_heads.py ... --json > /tmp/w/task_heads.json
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import decoders  # noqa: E402
from lab import analysis, bench, tasks  # noqa: E402
from lab.run import Run  # noqa: E402
from minibpd import greedy_decode, load_checkpoint  # noqa: E402
from training import task_heads  # noqa: E402

CHECKPOINT = "checkpoints/smollm2-heads.pt"
DECODERS = ["bpd", "ngram", "pbest", "lookup", "lookup_pbest", "neural"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default="qa,code2doc,rename",
                   help=f"tasks with their own heads, and evaluated (of {','.join(tasks.TASKS)})")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps of each fine-tune")
    p.add_argument("--prompts", type=int, default=128, help="train prompts of each fine-tune")
    p.add_argument("--examples", type=int, default=8, help="test examples per task")
    p.add_argument("--new-tokens", type=int, default=32, help="greedy tokens per test example")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--save", metavar="DIR", help="write each trained head set (smollm.save_heads)")
    p.add_argument("--json", action="store_true", help="print the report as JSON too")
    args = p.parse_args(argv)
    args.tasks = [t for t in args.tasks.split(",") if t]
    bad = [t for t in args.tasks if t not in tasks.TASKS]
    if bad:
        p.error(f"unknown tasks {bad}; choose from {','.join(tasks.TASKS)}")
    return args


def test_sets(model, vocab, names, n, new_tokens):
    """{task: (prompts, greedy continuations)}: each task's n test examples, greedy once."""
    out = {}
    for name, examples in bench.built_tasks(vocab, n, names).items():
        prompts = [p for p, _ in examples]
        out[name] = (prompts, [greedy_decode(model, p, new_tokens) for p in prompts])
    return out


def head_agreement(items, h):
    """Share of positions where head i's argmax equals greedy's token, i = 1..h."""
    hits, counts = [0] * h, [0] * h
    for plen, answer, heads in items:
        for t in range(plen, len(answer)):
            top = heads[t].argmax(-1).tolist()
            for j in range(h):
                if t + j < len(answer):
                    hits[j] += top[j] == answer[t + j]
                    counts[j] += 1
    return [a / max(1, c) for a, c in zip(hits, counts)]


def evaluate(model, res, sets, settings):
    """{task: {"be": {decoder: block efficiency}, "agreement": [h]}} for the current heads."""
    out = {}
    for name, (prompts, greedy) in sets.items():
        run = Run(res, settings, prompts, [len(g) for g in greedy], greedy=greedy)   # greedy once
        out[name] = {"be": {d: analysis.be_of(run, d, settings[d]) for d in DECODERS},
                     "agreement": head_agreement(run.items, model.config.n_bpd_heads)}
    return out


def head_sets(names):
    """[(label, the tasks its heads train on, or None for the start)]"""
    return [("start", None), ("mixture", list(tasks.TASKS))] + [(n, [n]) for n in names]


def run_one(model, ck, vocab, label, train_on, args, start):
    """Restore the start heads, fine-tune them on `train_on`'s prompts (unless start) -> (the ck
    whose rescorer is the exit adapter, the training record)."""
    model.heads.load_state_dict(start)
    exit_head = task_heads.exit_adapter(model, ck)
    record = None
    if train_on is not None:
        texts = [t for _, t in task_heads.task_prompts(vocab, train_on, args.prompts, args.seed)]
        record = task_heads.finetune_on(model, vocab, texts, args.steps, args.seed,
                                        lambda m: print(f"  [{label}] {m}", file=sys.stderr),
                                        exit_head)
    rescorer = {k: v.detach().half() for k, v in exit_head.state_dict().items()}
    if args.save and record is not None:
        from models import smollm
        os.makedirs(args.save, exist_ok=True)
        smollm.save_heads(model, os.path.join(args.save, f"smollm2-heads-{label}.pt"),
                          {k: ck[k] for k in ("dtype", "corpus", "seed", "rescorer_config", "splits")
                           if k in ck} | {"rescorer": rescorer, "task_heads": record})
    return {**ck, "rescorer": rescorer}, record


def table(report, names):
    """The report as text: one row per (head set, task), block efficiency per decoder."""
    head = f"{'heads':10s} {'task':9s} " + " ".join(f"{d:>12s}" for d in DECODERS) + "  agreement h2..h"
    lines = [head]
    for label, run in report["head_sets"].items():
        for name in names:
            r = run["eval"][name]
            best = max(DECODERS, key=lambda d: r["be"][d])
            cells = " ".join(f"{r['be'][d]:11.3f}{'*' if d == best else ' '}" for d in DECODERS)
            agree = " ".join(f"{a:.0%}" for a in r["agreement"][1:])
            lines.append(f"{label:10s} {name:9s} {cells}  {agree}")
    return "\n".join(lines + ["(* the best decoder of the row)"])


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    t0, load0 = time.time(), [round(x, 2) for x in os.getloadavg()]
    model, ck = load_checkpoint(CHECKPOINT)
    vocab = ck["vocab"]
    settings = decoders.settings(decoders.load_tuned(decoders.tuned_path(CHECKPOINT), CHECKPOINT),
                                 only=DECODERS)
    sets = test_sets(model, vocab, args.tasks, args.examples, args.new_tokens)
    print(f"[greedy] {time.time() - t0:.0f}s", file=sys.stderr)
    start = {k: v.clone() for k, v in model.heads.state_dict().items()}
    report, lms = {"head_sets": {}}, {}
    for label, train_on in head_sets(args.tasks):
        ck_h, record = run_one(model, ck, vocab, label, train_on, args, start)
        res = decoders.Resources(model, ck_h, lms=lms)
        report["head_sets"][label] = {"train_on": train_on, "record": record,
                                      "eval": evaluate(model, res, sets, settings)}
        lms = res.lms
        print(f"[{label}] done at {time.time() - t0:.0f}s", file=sys.stderr)
    model.heads.load_state_dict(start)
    report.update(command="python tools/task_heads.py " + " ".join(sys.argv[1:] if argv is None else argv),
                  settings=settings, seconds=round(time.time() - t0), load_average_before=load0,
                  load_average_after=[round(x, 2) for x in os.getloadavg()],
                  examples=args.examples, new_tokens=args.new_tokens, torch=torch.__version__)
    print(table(report, args.tasks))
    print(f"{report['seconds']} s; load average before {load0}, after {report['load_average_after']}")
    if args.json:
        print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
