"""One refinement step worked by hand on the shipped model's real lattice (docs/worked-step.md):
the heads' top-k candidates at one BPD step, plain BPD's draft, the best path under heads + n-gram
LM (Kim §7.2), each token's interpolated score, and what verification keeps of each draft.

    python tools/worked_step.py [--k 3] [--alpha 0.9] [--order 4] [--step N] [--prompt TEXT]   # ~10 s
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import decoders  # noqa: E402
import lattice  # noqa: E402
from lab import analysis  # noqa: E402
from lab.bench import make_prompts  # noqa: E402
from minibpd import ArgmaxDrafter  # noqa: E402
from runtime.checkpoint import load  # noqa: E402 (the lab's loader: FastGPT, SmolLM2)
from runtime.corpus import decode, encode  # noqa: E402
from runtime.threads import set_threads  # noqa: E402


def show(tokens, vocab):
    return decode(tokens, vocab).replace("\n", "⏎").replace(" ", "␣")


def parse(argv=None):
    """-> (the parser, its arguments, checked)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--k", type=int, default=3, help="candidates per position: the heads' top k "
                   "(the lattice's width, Kim §6.3)")
    p.add_argument("--alpha", type=float, default=0.9, help="weight of the heads' log-prob against "
                   "the n-gram LM's in each token's score (lattice.interpolate)")
    p.add_argument("--order", type=int, default=4, help="the n-gram LM's order n (ngram.NgramLM, "
                   "trained on the checkpoint's training split)")
    p.add_argument("--prompt", default=None, help="the text to continue (default: the bench's "
                   "first test prompt); characters of the model's vocabulary")
    p.add_argument("--step", type=int, default=None, help="BPD step to show (default: the first "
                   "where the n-gram path gains more than BPD's draft)")
    args = p.parse_args(argv)
    if args.k < 1 or not 0 <= args.alpha <= 1 or args.order < 1:
        p.error("--k and --order must be at least 1, --alpha within [0, 1]")
    if args.prompt is not None and not args.prompt:
        p.error("--prompt is empty: give some text to continue")
    return p, args


def main(argv=None):
    p, args = parse(argv)
    set_threads()
    model, ck = load()
    vocab, res = ck["vocab"], decoders.Resources(model, ck)
    lm = res.ngram(args.order)
    try:
        prompt = make_prompts(ck["splits"]["test"], vocab, 1)[0] if args.prompt is None else \
            encode(args.prompt, vocab)
    except ValueError as e:
        p.error(f"--prompt: {e}")
    (plen, answer, heads), = analysis.prepare(model, [prompt], 64)
    steps = analysis.replay(ArgmaxDrafter(), heads, answer, plen, 64, model.config.n_bpd_heads,
                            model.config.block_size)["steps"]
    for i, s in enumerate(steps):
        pending, m = s["pending"], len(s["drafts"][0]) - 1
        lat = lattice.head_lattice(heads[pending][:m + 1], answer[:s["context"]], args.k)
        (score, best), = lattice.best_paths(lat, lm, answer[:pending], 1, args.alpha)
        if args.step == i or (args.step is None and analysis.gain(best, answer, pending) > s["accepted"]):
            break
    context = answer[:s["context"]]
    print(f"after '…{show(answer[max(0, pending - 30):pending], vocab)}' (step {i}; the verified "
          f"token '{show([answer[pending]], vocab)}' is position 0):\n")
    print(f"| position | head's top-{args.k} (log-prob) | BPD | n-gram path: token, head lp, LM lp, score | greedy |")
    print("| ---: | --- | --- | --- | --- |")
    bpd = s["drafts"][0]
    for j in range(lat.h):
        cands = ", ".join(f"'{show([t], vocab)}' {x:.2f}" for t, x in zip(lat.tokens[j], lat.logprobs[j]))
        head = lat.logprobs[j][lat.tokens[j].index(best[j])]
        lmlp = lm.logprob(best[j], context[:-1] + best[:j])
        term = lattice.interpolate(head, lmlp, args.alpha)
        print(f"| {j} | {cands} | '{show([bpd[j]], vocab)}' | '{show([best[j]], vocab)}': "
              f"{head:.2f}, {lmlp:.2f}, {term:.2f} | '{show([answer[pending + j]], vocab)}' |")
    print(f"\npath score (sum of the scores) {score:.2f}; BPD keeps {s['accepted']} tokens "
          f"{analysis.marks(bpd, answer, pending)[0]}, the n-gram path keeps "
          f"{analysis.gain(best, answer, pending)} {analysis.marks(best, answer, pending)[0]} "
          f"(k = {args.k}, alpha = {args.alpha}, a {args.order}-gram LM)")


if __name__ == "__main__":
    main()
