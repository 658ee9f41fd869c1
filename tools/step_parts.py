"""Where the time of one bpd_decode step goes, part by part, inside real decodes (issue: cut any
part outside the model call above 5% of a call).

    python tools/step_parts.py [--tuned FILE]     # shipped checkpoint, CPU, 1 thread, ~1 minute

Each part of the loop (minibpd.predict: heads, log-softmax, the drafter and its checks; the
Verifier's model call; the acceptance rule; the cache bookkeeping `keep`; the statistics) is
wrapped by a timer while the bench's 16 test prompts x 128 tokens decode; the table gives ms per
step and the share of the model call. The timers add about a microsecond a part.
"""
import argparse
import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lab import bench
import decoders  # noqa: E402
import minibpd  # noqa: E402
from runtime import threads
from runtime import checkpoint, tree

SPENT = defaultdict(float)


def timed(name, fn):
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            SPENT[name] += time.perf_counter() - t0
    return wrapper


def instrument():
    """Time every part bpd_decode calls, by wrapping them where it looks them up."""
    minibpd.predict = timed("predict (heads, log-softmax, drafter, checks)", minibpd.predict)
    for V in (minibpd.Verifier, tree.TreeVerifier):
        V.__call__ = timed("verify: the model call", V.__call__)
        V.keep = timed("keep: cache bookkeeping", V.keep)
    minibpd.GreedyRule.__call__ = timed("accept: the rule", minibpd.GreedyRule.__call__)


def main():
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--tuned", default=None)
    p.add_argument("--decoders", default="bpd,ngram,pbest")
    args = p.parse_args()
    threads.set_threads()
    model, ck = minibpd.load_checkpoint()
    tuned = decoders.load_tuned(args.tuned or decoders.tuned_path(checkpoint.CHECKPOINT), checkpoint.CHECKPOINT)
    chosen = decoders.settings(tuned)
    res = decoders.Resources(model, ck)
    prompts = bench.make_prompts(ck["splits"]["test"], ck["vocab"], 16)
    instrument()
    print(f"| decoder | part | ms per step | share of the call |\n| --- | --- | ---: | ---: |")
    for name in args.decoders.split(","):
        m = decoders.method(name, res, chosen[name])
        m.decode(model, prompts[0], 32)                           # warm-up
        SPENT.clear()
        t0 = time.perf_counter()
        steps = sum(m.decode(model, p, 128)[1]["calls"] for p in prompts)
        total = time.perf_counter() - t0
        call = SPENT["verify: the model call"]
        rest = total - sum(SPENT.values())
        for part, s in sorted(SPENT.items(), key=lambda kv: -kv[1]) + [("the loop itself", rest)]:
            print(f"| {name} | {part} | {1e3 * s / steps:.3f} | {100 * s / call:.1f}% |")


if __name__ == "__main__":
    main()
