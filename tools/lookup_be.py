"""Block efficiency of bpd, lookup, lookup_pbest and pbest by offline replay (analysis.prepare,
then analysis.be_of: the same accepted lengths as bpd_decode, test_refine.py) on the bench's test
prompts (modes.bench_run: make_prompts over the checkpoint's test split), with each decoder's
settings as the bench takes them (the tuned file, else the registry's defaults). docs/results/lookup.md.

    python tools/lookup_be.py                                          # 16 prompts x 128 tokens
    python tools/lookup_be.py --checkpoint checkpoints/smollm2-heads.pt --first 8 --new-tokens 64

--first N keeps the first N of the bench's --prompts prompts (SmolLM2's greedy decoding, which
prepare runs, is the slow part). --real N also decodes the first N prompts for real (as --bench)
with each of the four: identical to greedy, and the same block efficiency as the replay.

Beside the four: lookup_pbest with pbest's own (tuned) settings, so that it differs from pbest by
the copy alone; lookup at ngram 1..4; and how often lookup's copy was drafted and how often it
gained more than BPD's draft (per step of lookup's own replay).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lab import analysis  # noqa: E402
import decoders  # noqa: E402
from lab.bench import decode_all, make_prompts  # noqa: E402
from lab.run import Run  # noqa: E402
from decoders.resources import split_text  # noqa: E402
from runtime.checkpoint import CHECKPOINT, load  # noqa: E402 (the lab's loader: FastGPT, SmolLM2)
from runtime.threads import set_threads  # noqa: E402

NAMES = ("bpd", "lookup", "lookup_pbest", "pbest")


def copy_share(run, s):
    """(share of lookup's steps with a copy drafted, share where the copy gained more than BPD's
    draft), over lookup's own replay on the run's prompts."""
    runs = analysis.replay_all(run, lambda a: decoders.make("lookup", run.res, s, a))
    steps = [(st, answer) for r, (_, answer, _) in zip(runs, run.items) for st in r["steps"]]
    copied = [(st, answer) for st, answer in steps if len(st["drafts"]) == 2]
    better = sum(analysis.gain(st["drafts"][1], answer, st["pending"]) >
                 analysis.gain(st["drafts"][0], answer, st["pending"]) for st, answer in copied)
    return len(copied) / max(1, len(steps)), better / max(1, len(steps))


def real(run, n):
    """The run's first n prompts decoded for real (bench.decode_all, as --bench decodes): {name:
    (identical to greedy, online block efficiency, the replay's)}."""
    first = run.on(run.prompts[:n], run.n, run.continuations()[:n])
    with decoders.select(NAMES):
        runs, outs, _ = decode_all(first)
    return {name: {"identical_to_greedy": outs[name] == first.continuations(),
                   "block_efficiency": analysis.block_eff(runs[name]),
                   "replay": analysis.be_of(first, name, run.chosen[name])} for name in NAMES}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", default=CHECKPOINT)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--first", type=int, default=None, help="only the first N of those prompts")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--real", type=int, default=0, help="decode the first N prompts for real too")
    args = p.parse_args()
    set_threads(1)
    t0 = time.perf_counter()
    model, ck = load(args.checkpoint)
    tuned = decoders.load_tuned(decoders.tuned_path(args.checkpoint), args.checkpoint,
                                model.config.n_bpd_heads, ck["config"].get("n_bpd_heads"))
    chosen = decoders.settings(tuned)
    prompts = make_prompts(split_text(ck, "test"), ck["vocab"], args.prompts)[:args.first]
    run = Run(decoders.Resources(model, ck), chosen, prompts, args.new_tokens)
    items = run.items                                  # greedy and the heads, once
    prepared = time.perf_counter() - t0
    be = {name: analysis.be_of(run, name, chosen[name]) for name in NAMES}
    same = {**chosen["pbest"], "ngram": chosen["lookup_pbest"]["ngram"], "copy": chosen["lookup_pbest"]["copy"]}
    be["lookup_pbest (pbest's settings)"] = analysis.be_of(run, "lookup_pbest", same)
    by_ngram = {str(g): analysis.be_of(run, "lookup", {**chosen["lookup"], "ngram": g})
                for g in (1, 2, 3, 4)}
    by_copy = {str(c): analysis.be_of(run, "lookup", {**chosen["lookup"], "copy": c})
               for c in (0, 10, 16)}
    drafted, won = copy_share(run, chosen["lookup"])
    report = {"checkpoint": args.checkpoint, "prompts": f"{len(prompts)} of {args.prompts}",
              "new_tokens": args.new_tokens, "greedy_phrase_repeat": analysis.phrase_repetition_all(
                  [answer[plen:] for plen, answer, _ in items]),
              "heads": model.config.n_bpd_heads, "block_efficiency": be,
              "lookup_by_ngram": by_ngram, "lookup_by_copy": by_copy, "lookup_copy_drafted": drafted,
              "lookup_copy_beat_bpd": won,
              "settings": {**{n: chosen[n] for n in NAMES}, "lookup_pbest (pbest's settings)": same},
              "seconds_prepare": round(prepared)}
    if args.real:
        report[f"real_first_{args.real}"] = real(run, args.real)
    report["seconds"] = round(time.perf_counter() - t0)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
