"""figures_tasks: the --tasks report (lab/tasks.py's tasks, measured by cli.py): block efficiency
by task and method, the paper's per-task analyses and the cross-task correlations (Kim §6-7), in
the terminal and, with `--plot DIR`, as PNG files. The shared drawing tools are figures.py's."""
import numpy as np

import decoders
from lab.figures import chart, pyplot, save, short
from lab.stats import pearson


def print_tasks(r, color=False):
    """The --tasks report: per task block efficiency of every method, the paper's analyses, and
    the cross-task correlations (Kim §6-7)."""
    print(f"{len(r.tasks)} tasks, {r.checkpoint}, examples built by Python "
          f"{str(r.python).split()[0]}, {r.seconds:.0f} s\n")
    methods = list(next(iter(r.tasks.values())).block_efficiency)
    w = decoders.label_width(methods)
    best = max([7] + [len(t.best_refined) for t in r.tasks.values()])
    print("  block efficiency (identical to greedy: ✓)\n  " + f"{'method':{w}s}" +
          "".join(f"{name:>12s}" for name in r.tasks))     # a row per method: any number fits
    for m in methods:
        cells = "".join(f"{t.block_efficiency[m]:11.2f}{'✓' if t.identical_to_greedy.get(m, True) else '✗'}"
                        for t in r.tasks.values())
        print(f"  {m:{w}s}{cells}")
    print(f"  {decoders.PLAIN + ' 95%':{w}s}" + "".join(    # bootstrap over the examples
        f"{'%.2f-%.2f' % tuple(t.block_efficiency_interval[decoders.PLAIN]):>12s}"
        for t in r.tasks.values() if t.block_efficiency_interval))
    print("\n  " + f"{'task':12s} {'ex.':>4s} {'best':>{best}s} {'gain':>7s} {'oracle8':>8s} {'h_max':>6s} "
          f"{'entropy':>8s} {'rep.':>6s} {'rep.2g':>6s} {'quality':>15s}")
    for name, t in r.tasks.items():
        k, v = next(iter(t.quality.items()))              # the task's own metric
        q = f"{k} {v:.2f}"
        print(f"  {name:12s} {t.examples:4d} {t.best_refined:>{best}s} {t.relative_gain[t.best_refined]:+6.1f}% "
              f"{t.oracle_by_k['8']:8.2f} {t.hmax:6d} {sum(t.head_entropy) / len(t.head_entropy):8.2f} "
              f"{100 * t.repetition['adjacent_repeat']:5.1f}% {100 * t.repetition_2gram['adjacent_repeat']:5.1f}% "
              f"{q:>15s}")
    if r.excluded:
        print(f"\n  degenerate (greedy's ROUGE-L < {r.degenerate_below}), left out of the correlations: "
              f"{', '.join(r.excluded)}")
    print_correlations(r.correlation)
    print_heads_by_task({n: t.block_efficiency_by_heads for n, t in r.tasks.items()})
    chart("BPD block efficiency by task", [(n, t.block_efficiency[decoders.PLAIN])
                                           for n, t in r.tasks.items()], color=color)


def print_correlations(c):
    """The cross-task coefficients with n, the exact permutation p and the range with one task
    left out (task_runs.correlations), one row each, within 80 columns."""
    fmt = lambda v: "n/a" if v is None else f"{v:+.2f}"
    rows = [("h_max", "r", c["hmax_vs_bpd_be"]), ("mean head entropy", "r", c["entropy_vs_bpd_be"])]
    rows += [(f"gain of {k}", "rho", v) for k, v in c["gain_vs_bpd_be"].items()]
    rows += [("oracle headroom (k = 8)", "rho", c["headroom_vs_bpd_be"])]
    print(f"\n  across tasks, against BPD block efficiency (p: exact permutation, two-sided)\n"
          f"  {'':24s} {'coef.':>10s} {'n':>3s} {'p':>6s} {'one task left out':>18s}")
    for what, key, e in rows:
        p = "n/a" if e["p"] is None else f"{e['p']:.3f}"
        loo = "n/a" if not e["loo"] else f"{fmt(e['loo'][0])} .. {fmt(e['loo'][1])}"
        print(f"  {what:24s} {key:>4s} {fmt(e[key]):>5s} {e['n']:3d} {p:>6s} {loo:>18s}")


def print_heads_by_task(by_task):
    """Kim Table 1: a row per task, plain BPD's block efficiency by the number of heads used."""
    heads = list(next(iter(by_task.values())))
    print("\n  BPD block efficiency by heads used (Kim Table 1)\n  " + f"{'task':12s}" +
          "".join(f"{h:>6s}" for h in heads))
    for name, row in by_task.items():
        print(f"  {name:12s}" + "".join(f"{row[h]:6.2f}" for h in heads))


def plot_tasks(r, folder):
    """--tasks --plot: Kim Fig. 3b (h_max and mean head entropy against BPD block efficiency, one
    point per task, the least-squares line and r), Figs. 5-6 (oracle block efficiency relative to
    BPD by k, a line per task) and block efficiency per task and decoder. -> the file names."""
    plt = pyplot()
    names, tasks_ = [], list(r.tasks.items())
    bpd = [t.block_efficiency[decoders.PLAIN] for _, t in tasks_]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, what, ys in ((axes[0], "h_max", [t.hmax for _, t in tasks_]),
                         (axes[1], "mean head entropy (nats)",
                          [sum(t.head_entropy) / len(t.head_entropy) for _, t in tasks_])):
        ax.scatter(bpd, ys, color="#4c72b0")
        for (name, _), x, y in zip(tasks_, bpd, ys):
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        coef = pearson(bpd, ys)            # None where bpd or ys do not vary: no line
        if coef is not None:
            slope, intercept = np.polyfit(bpd, ys, 1)     # Python 3.9 has no linear_regression
            lo, hi = min(bpd), max(bpd)
            ax.plot([lo, hi], [intercept + slope * lo, intercept + slope * hi], "--",
                    color="#c44e52", label=f"least squares, r = {coef:+.2f} (n = {len(bpd)})")
            ax.legend(fontsize=8)
        ax.set(xlabel="BPD block efficiency (tokens / call)", ylabel=what)
    fig.suptitle("Kim Fig. 3b: head confidence against block efficiency, one point per task")
    names.append(save(fig, folder, "tasks_hmax.png"))
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for name, t in tasks_:
        ks = list(t.oracle_by_k)
        ax.plot([int(k) for k in ks], [t.oracle_by_k[k] / t.block_efficiency[decoders.PLAIN]
                                       for k in ks], marker="o", label=name)
    ax.axhline(1.0, color="#c44e52", linestyle="--", linewidth=1, label="plain BPD")
    ax.set(xscale="log", xlabel="k (candidates per head)", ylabel="oracle / BPD block efficiency",
           title="Kim Figs. 5-6: oracle headroom of the top-k lattice, by task")
    ax.legend(fontsize=8)
    names.append(save(fig, folder, "tasks_oracle_by_k.png"))
    names.append(task_bars(plt, r, folder))
    fig = tasks_by_heads(plt, {n: t.block_efficiency_by_heads for n, t in tasks_}, r.checkpoint)
    names.append(save(fig, folder, "tasks_by_heads.png"))
    return names


def task_bars(plt, r, folder):
    """Grouped bars: block efficiency per task, one bar per decoder, BPD's value as a line."""
    decoders_ = [m for m in next(iter(r.tasks.values())).block_efficiency if m != "greedy"]
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / len(decoders_)
    for j, m in enumerate(decoders_):
        xs = [i + (j - len(decoders_) / 2 + 0.5) * width for i in range(len(r.tasks))]
        drawn = ax.bar(xs, [t.block_efficiency[m] for t in r.tasks.values()], width, label=m)
        ax.bar_label(drawn, [f"{t.block_efficiency[m]:.1f}" for t in r.tasks.values()], fontsize=6)
    for i, t in enumerate(r.tasks.values()):
        ax.hlines(t.block_efficiency[decoders.PLAIN], i - 0.45, i + 0.45, colors="#c44e52",
                  linestyles="--", linewidth=1)
    ax.set_xticks(range(len(r.tasks)), list(r.tasks))
    ax.set(ylabel="block efficiency (tokens / call)",
           title="Block efficiency per task and decoder (dashed: plain BPD)")
    ax.legend(fontsize=7, ncol=4)
    return save(fig, folder, "tasks_block_efficiency.png")


def tasks_by_heads(plt, by_task, model):
    """Kim Table 1: plain BPD's block efficiency against the number of heads, a line per task
    ({task: {heads: block efficiency}}). -> the figure."""
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for name, row in by_task.items():
        ax.plot([int(k) for k in row], list(row.values()), marker="o", label=name)
    ax.set_xticks([int(k) for k in row])
    ax.set(title=f"Kim Table 1: block efficiency by number of heads, per task\n{short(model)}",
           xlabel="heads used (h)", ylabel="block efficiency (tokens / call)")
    ax.legend(fontsize=8)
    return fig

