"""The cross-task evidence of docs/results/tasks.md from one `--tasks --json` file: each correlation with
n, its coefficient, the exact permutation p and the leave-one-out range (lab/stats.py), with every
task and without the degenerate ones, and the verdict by docs/tasks.md's threshold; then BPD's
block efficiency per task with its 95% bootstrap interval, and the spread.

    python minibpd.py --tasks --json > /tmp/w/tasks.json
    python tools/task_verdicts.py /tmp/w/tasks.json [--table]    # --table: docs/results/tasks.md's table

Degenerate (greedy ROUGE-L < 0.1) and the four verdicts: docs/tasks.md, by its rule ("reproduces":
p < 0.05 with n >= 5 non-degenerate tasks and the sign Kim's claim expects).
"""
import json
import os
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lab import task_runs  # noqa: E402

DEGENERATE_ROUGE = task_runs.DEGENERATE_ROUGE
ALPHA, MIN_TASKS = 0.05, 5
# the sign each claim expects: h_max up with block efficiency (Fig. 3b), head entropy down with
# it, refinement gains and the oracle's headroom down with it
EXPECTED = {"hmax_vs_bpd_be": +1, "entropy_vs_bpd_be": -1, "gain_vs_bpd_be": -1,
            "headroom_vs_bpd_be": -1}


def is_degenerate(t):
    """The run's own flag (`degenerate`); a JSON written before it had one: the same rule."""
    return t.get("degenerate", t["quality"]["rouge_l"] < DEGENERATE_ROUGE)


def verdict(entry, key, sign, real):
    """real: the number of non-degenerate tasks behind the entry."""
    value = entry[key]
    if value is None:
        return "cannot be tested"
    if value * sign > 0 and entry["p"] < ALPHA and real >= MIN_TASKS:
        return "reproduces"
    return "same direction, not established" if value * sign > 0 else "does not reproduce"


def rows(correlation):
    """[(name, key, entry, expected sign)], one per coefficient."""
    out = []
    for name, entry in correlation.items():
        subs = entry.items() if name == "gain_vs_bpd_be" else [(None, entry)]
        for sub, e in subs:
            key = "r" if "r" in e else "rho"
            out.append((name + (f".{sub}" if sub else ""), key, e, EXPECTED[name]))
    return out


def main(path):
    tasks = json.load(open(path))["tasks"]
    bad = [n for n, t in tasks.items() if is_degenerate(t)]
    real = {n: t for n, t in tasks.items() if n not in bad}
    print(f"degenerate (greedy ROUGE-L < {DEGENERATE_ROUGE}): {', '.join(bad) or 'none'}")
    for label, chosen in (("all tasks", tasks), ("without " + ", ".join(bad), real))[:2 if bad else 1]:
        c = task_runs.correlations({n: SimpleNamespace(**t) for n, t in chosen.items()})
        print(f"\n{label} (n = {len(chosen)})")
        for name, key, e, sign in rows(c):
            loo = "n/a" if not e["loo"] else f"[{e['loo'][0]:+.2f}, {e['loo'][1]:+.2f}]"
            value = "n/a" if e[key] is None else f"{e[key]:+.2f}"
            p = "n/a" if e["p"] is None else f"{e['p']:.3f}"
            print(f"  {name:28s} {key:>3s} {value:>5s}  p {p:>5s}  loo {loo:16s} "
                  f"{verdict(e, key, sign, len(chosen) - len([n for n in chosen if n in bad]))}")
    print("\nBPD block efficiency [95% bootstrap interval over examples]")
    for n, t in tasks.items():
        lo, hi = t["block_efficiency_interval"]["bpd"]
        print(f"  {n:12s} {t['block_efficiency']['bpd']:.2f} [{lo:.2f}, {hi:.2f}]"
              + ("  degenerate" if n in bad else ""))
    for label, chosen in (("all", tasks), ("non-degenerate", real)):
        be = [t["block_efficiency"]["bpd"] for t in chosen.values()]
        print(f"  spread, {label}: {min(be):.2f}-{max(be):.2f} ({max(be) / min(be):.2f}x)")


def table(path):
    """The per-task table of docs/results/tasks.md (markdown) from one `--tasks --json` file."""
    tasks = json.load(open(path))["tasks"]
    methods = [m for m in next(iter(tasks.values()))["block_efficiency"] if m not in ("greedy", "bpd")]
    print("| task | BPD [95% interval] | " + " | ".join(methods) + " | oracle k=8 | mean head entropy "
          "| h_max | adjacent repeats: BPD -> 2-gram | greedy quality | phrase repetition |")
    print("| --- | ---: | " + " | ".join("---:" for _ in methods) + " | ---: | ---: | ---: | --- | --- | ---: |")
    for n, t in tasks.items():
        be, (lo, hi) = t["block_efficiency"], t["block_efficiency_interval"]["bpd"]
        best = max([m for m in methods if m != "oracle"], key=be.get)     # the oracle peeks
        cells = [f"**{be[m]:.2f}**" if m == best else f"{be[m]:.2f}" for m in methods]
        metric, value = next(iter(t["quality"].items()))
        quality = f"{ {'rouge_l': 'ROUGE-L'}.get(metric, metric.replace('_', ' '))} {value:.2f}" + (
            "" if metric == "rouge_l" else f" (ROUGE-L {t['quality']['rouge_l']:.2f})")
        quality += " **degenerate**" if is_degenerate(t) else ""
        entropy = sum(t["head_entropy"]) / len(t["head_entropy"])
        print(f"| {n} | {be['bpd']:.2f} [{lo:.2f}, {hi:.2f}] | " + " | ".join(cells) +
              f" | {t['oracle_by_k']['8']:.2f} | {entropy:.2f} | {t['hmax']} | "
              f"{100 * t['repetition']['adjacent_repeat']:.1f}% -> "
              f"{100 * t['repetition_2gram']['adjacent_repeat']:.1f}% | {quality} | "
              f"{100 * t['quality']['phrase_repeat']:.0f}% |")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--table"]
    (table if "--table" in sys.argv else main)(args[0] if args else "/tmp/w/tasks.json")
