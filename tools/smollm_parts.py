"""Where the time of one bpd_decode step goes, part by part, for any checkpoint (step_parts.py's
timers; SmolLM2's heads by default).

    python tools/smollm_parts.py [--checkpoint PATH] [--tuned FILE] [--decoders bpd,ngram]
                               [--prompts 4] [--tokens 128]

The bench's test prompts (every 16/--prompts-th) decode with each decoder after a warm-up; the
table gives ms per step (serial call) and the share of the model call; greedy's one-token step
is timed the same way: a decoder's speedup over greedy is its block efficiency x greedy's step /
its own step (the implied speedup printed), so the parts show what bounds it. The load
average is printed before and after.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import step_parts  # noqa: E402  (tools/step_parts.py: the timers)
from lab import bench
import decoders  # noqa: E402
import minibpd  # noqa: E402
from step_parts import SPENT, instrument
from runtime import threads

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--checkpoint", default=os.path.join(HERE, "checkpoints", "smollm2-heads.pt"))
    p.add_argument("--tuned", default=None)
    p.add_argument("--decoders", default="bpd,ngram,pbest")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--tokens", type=int, default=128)
    args = p.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    threads.set_threads()
    model, ck = minibpd.load_checkpoint(args.checkpoint)
    tuned = decoders.load_tuned(args.tuned or decoders.tuned_path(args.checkpoint), args.checkpoint)
    chosen, res = decoders.settings(tuned), decoders.Resources(model, ck)
    prompts = bench.make_prompts(ck["splits"]["test"], ck["vocab"], 16)[::16 // args.prompts]
    t0 = time.perf_counter()
    for q in prompts:
        minibpd.greedy_decode(model, q, args.tokens)
    greedy_ms = 1e3 * (time.perf_counter() - t0) / (len(prompts) * args.tokens)
    instrument()
    print(f"greedy: {greedy_ms:.1f} ms per token (one call)\n")
    print("| decoder | part | ms per step | share of the call |\n| --- | --- | ---: | ---: |")
    for name in args.decoders.split(","):
        m = decoders.method(name, res, chosen[name])
        m.decode(model, prompts[0], 16)                            # warm-up
        SPENT.clear()
        t0 = time.perf_counter()
        stats = [m.decode(model, q, args.tokens)[1] for q in prompts]
        total, steps = time.perf_counter() - t0, sum(s["calls"] for s in stats)
        call, be = SPENT["verify: the model call"], len(prompts) * args.tokens / steps
        rest = total - sum(SPENT.values())
        for part, s in sorted(SPENT.items(), key=lambda kv: -kv[1]) + [("the loop itself", rest)]:
            print(f"| {name} | {part} | {1e3 * s / steps:.2f} | {100 * s / call:.1f}% |")
        step = 1e3 * total / steps
        print(f"| {name} | **step; block efficiency {be:.2f}; implied speedup {be * greedy_ms / step:.2f}x "
              f"greedy** | {step:.2f} | |")
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
