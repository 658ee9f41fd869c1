"""Old code against new: greedy and BPD tokens/s of two checkouts, alternating in fresh processes
(the speed check of a restructuring: the fast path must not regress by more than noise).

    python tools/compare_speed.py OLD_CHECKOUT [ROUNDS]     # e.g. a `git worktree` of the old commit

Each round runs each checkout once: the bench's 16 test prompts x 128 tokens, greedy then BPD, one
warm-up, the median of 3 repetitions, 1 thread. Prints tokens/s per round and the medians.
"""
import json
import os
import statistics
import subprocess
import sys

CHILD = r'''
import json, statistics, sys, time, torch
sys.path.insert(0, ".")
torch.set_num_threads(1)
import minibpd
try:
    from lab.bench import make_prompts          # the layout with folders
except ImportError:
    from bench import make_prompts              # the flat layout before it
model, ck = minibpd.load_checkpoint()
prompts = make_prompts(ck["splits"]["test"], ck["vocab"], 16)
out = {}
for name, fn in (("greedy", lambda p: minibpd.greedy_decode(model, p, 128)),
                 ("bpd", lambda p: minibpd.bpd_decode(model, p, 128))):
    fn(prompts[0])
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        for p in prompts:
            fn(p)
        times.append(time.perf_counter() - t0)
    out[name] = 16 * 128 / statistics.median(times)
print(json.dumps(out))
'''


def run(folder):
    r = subprocess.run([sys.executable, "-c", CHILD], cwd=folder, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    old, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
    new = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    got = {"old": [], "new": []}
    for i in range(rounds):
        for label, folder in (("old", old), ("new", new)):
            got[label].append(run(folder))
            r = got[label][-1]
            print(f"round {i + 1} {label}: greedy {r['greedy']:.0f} tok/s, bpd {r['bpd']:.0f} tok/s, "
                  f"bpd/greedy {r['bpd'] / r['greedy']:.2f}", flush=True)
    for label, rows in got.items():
        med = {k: statistics.median(r[k] for r in rows) for k in ("greedy", "bpd")}
        ratio = statistics.median(r["bpd"] / r["greedy"] for r in rows)
        print(f"median {label}: greedy {med['greedy']:.0f}, bpd {med['bpd']:.0f} tok/s, "
              f"bpd/greedy {ratio:.2f}")


if __name__ == "__main__":
    main()
