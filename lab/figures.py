"""The reports in the terminal (tables and unicode bar charts, 80 columns, meaningful without
colour) and, with `--plot DIR`, as PNG files (matplotlib, optional): the bench's (a
bench.BenchReport, read by attribute, so a misspelt field fails loudly), the tasks' and the
scale map's (lab/scale.py's result dict)."""
import os
import textwrap

import decoders

EIGHTHS = " ▏▎▍▌▋▊▉"


def bar(value, vmax, width):
    """A horizontal bar of `width` columns at full scale, in eighths of a block."""
    n = max(0.0, value / vmax * width) if vmax > 0 else 0.0
    full, part = int(n), int(round((n - int(n)) * 8))
    if part == 8:
        full, part = full + 1, 0
    return "█" * full + (EIGHTHS[part] if part else "")


def chart(title, rows, fmt="{:.2f}", width=44, color=False, mark=None):
    """rows: [(label, value)]. `mark` highlights one label (colour if allowed, '◀' always)."""
    print(f"\n  {title}")
    vmax, wide = max((v for _, v in rows), default=0), max([9] + [len(str(a)) for a, _ in rows])
    for label, v in rows:
        b = bar(v, vmax, width)
        if color:
            b = f"\033[{'33' if label == mark else '36'}m{b}\033[0m"
        print(f"  {label:>{wide}s} │{b} {fmt.format(v)}{' ◀' if label == mark else ''}")


def decoder_table(r):
    w = decoders.label_width(r.block_efficiency)
    print(f"  {'decoder':{w}s} {'block eff.':>10s} {'vs bpd':>8s} {'= greedy':>9s} {'tok/s':>8s} "
          f"{'speedup':>8s}  settings")
    be, tps, plain = r.block_efficiency, r.tokens_per_s, decoders.PLAIN
    for k in be:
        t = f"{tps[k]:8.0f} {r.speedup[k]:7.2f}x" if k in tps else f"{'-':>8s} {'-':>8s}"
        rel = f"{100 * (be[k] / be[plain] - 1):+7.1f}%" if k not in (r.baseline, plain) else ""
        sets = ", ".join(f"{a}={b}" for a, b in r.settings.get(k, {}).items())
        print(f"  {k:{w}s} {be[k]:10.3f} {rel:>8s} {'yes' if r.identical_to_greedy[k] else 'NO':>9s}"
              f" {t}  {sets}")


def won_tied_lost(c):
    """Counts, not rounded shares: 0/100/0% beside "100% of wins" read as a contradiction when
    1 step of 998 was won (issue 43, trap 5)."""
    return (f"steps won/tied/lost {c['win']}/{c['tie']}/{c['loss']} of {c['steps']}, "
            f"{c['wins_replacing_repeat']} of {c['win']} wins fixed a repeat")


def paper_tables(r):
    print("\n  repetition in drafts (Kim §6.1; paper: BPD 20-75%; with 2-gram rescoring it quotes\n"
          "  9.9-24.5%, which may be read as levels or as reductions)")
    for name, v in r.repetition.items():
        print(f"  {name:12s} adjacent repeats {100 * v['adjacent_repeat']:5.1f}%   "
              f"longest run {v['longest_run']:.2f}")
    print("\n  head top-1 accuracy vs greedy (ours; Kim §6.2 reports entropy): "
          + " ".join(f"{100 * a:.0f}%" for a in r.head_accuracy) + f"   h_max = {r.hmax}")
    print("\n  refined vs BPD (block efficiency, as in Kim Table 4; paper: +5% to +21%)")
    wide = decoders.label_width(r.relative_gain) - 1
    for name, g in r.relative_gain.items():
        w = r.win_tie_loss.get(name)
        wtl = f"  {won_tied_lost(w['counts'])}" if w else ""
        print(f"  {name:{wide}s} {g['percent']:+6.1f}%  closes {100 * g['gap_closed']:4.0f}% of the gap "
              f"to the oracle{wtl}")
    if r.loss_repeats:
        print_losses(r.loss_repeats)
    print("\n  cost per generated token (ours; Kim analyse cost in Fig. 2 and an appendix table)\n"
          "  FLOPs = 2 x params x tokens run; ratios to greedy")
    w = decoders.label_width(r.cost)
    print(f"  {'decoder':{w}s} {'calls':>6s} {'tokens':>7s} {'small-LM':>9s} {'n-gram':>7s} "
          f"{'FLOPs':>6s} {'wall':>6s}")
    for name, c in r.cost.items():
        wall = f"{c['wall_clock_ratio']:6.2f}" if c["wall_clock_ratio"] else f"{'-':>6s}"
        print(f"  {name:{w}s} {c['base_calls']:6.3f} {c['base_tokens']:7.2f} {c['small_lm_calls']:9.2f}"
              f" {c['ngram_lookups']:7.0f} {c['flop_ratio']:6.2f} {wall}")
    print("  A large model on a GPU is memory-bound: its time follows 'calls' while the verified\n"
          "  tokens fit the compute headroom. This tiny model on a CPU follows 'FLOPs' and the\n"
          "  drafting work far more: see 'wall'.")


def print_losses(losses):
    """Kim Table 5's losing side (analysis.loss_repeats): counts beside the shares."""
    print("\n  steps lost to BPD whose refined draft added a repeat BPD's draft lacked (Kim\n"
          "  Table 5's losing side; 'at its first miss' is ours): anywhere / at its first miss")
    wide = decoders.label_width(losses) - 1
    for name, v in losses.items():
        c = v["counts"]
        print(f"  {name:{wide}s} {c['introduced_repeat']} / {c['lost_on_repeat']} of {c['loss']} "
              f"losses ({100 * v['introduced_repeat']:.0f}% / {100 * v['lost_on_repeat']:.0f}%)")


def print_by_heads(s):
    """Stern §7.3 (timing.by_heads): a row per block size k, greedy first (Table 4's layout;
    Fig. 4 plots the speedup against the block efficiency column)."""
    print(f"\n  speedup by block size k (Stern §7.3, Table 4; Fig. 4 against block eff.): "
          f"plain BPD on heads 1..k, one "
          f"interleaved run, {s['threads']} thread(s)\n  {'k':>6s} {'block eff.':>10s} "
          f"{'tok/s':>8s} {'speedup':>8s} {'= greedy':>9s}")
    for name, m in s["methods"].items():
        print(f"  {name:>6s} {m['block_efficiency']:10.3f} {m['tokens_per_s']:8.0f} "
              f"{m['speedup']:7.2f}x {'yes' if m['identical_to_greedy'] else 'NO':>9s}")
    for w in s["timing_warnings"]:
        print(f"  warning: {w}")


def peeks(name):
    return name in decoders.DECODERS and decoders.DECODERS[name].peeks


def print_report(r, model, color=False):
    """The whole report, at temperature 0 or above it (print_sampled)."""
    if r.temperature:
        return print_sampled(r, model)
    print(f"{r.prompts} prompts x {r.new_tokens} new tokens, {r.checkpoint}, "
          f"{next(model.parameters()).device}, {r.threads} thread(s), {r.seconds:.0f} s"
          + (f"\nthis CPU: {r.machine}" if r.machine else "") + "\n")
    decoder_table(r)
    for w in r.timing_warnings:
        print(f"  warning: {w}")
    print(f"\n  draft tokens verified per call, P rows (batch) / one token tree (tree); this run: "
          f"--verify {r.verify}\n  " + ", ".join(f"{k} {v['batch']:.1f} / {v['tree']:.1f}"
                                                   for k, v in r.verify_tokens.items()))
    print("\n  n-gram held-out perplexity by order: " + ", ".join(
        f"{o}: {v:.2f}" for o, v in r.ngram_perplexity.items()))
    paper_tables(r)
    chart("head entropy (nats) by head (Kim §6.2: later heads are less sure)",
          [(f"head {i + 1}", e) for i, e in enumerate(r.head_entropy)], color=color,
          mark=f"head {r.hmax}")
    chart("oracle block efficiency by k (Kim §6.3; k = 1 is plain BPD)",
          list(r.oracle_by_k.items()), color=color)
    chart("block efficiency by method", list(r.block_efficiency.items()), color=color,
          mark=max(r.block_efficiency, key=lambda k: -1 if peeks(k) else r.block_efficiency[k]))
    if r.speedup_by_heads:
        print_by_heads(r.speedup_by_heads)
    if r.sweep:
        s = r.sweep
        chart("sweep (tune split): BPD block efficiency by heads used", list(s["heads"].items()),
              color=color)
        for key in ("k", "p", "alpha"):
            for name, row in s[key].items():
                chart(f"sweep: {name} block efficiency by {key}", list(row.items()), color=color)


def pyplot():
    """matplotlib's pyplot on a file backend (optional: the command line checks for it first)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def bars(ax, labels, values, reference=None, ref_label=None, fmt="{:.2f}"):
    """Bars with their values on top and, optionally, a dashed reference line (e.g. BPD)."""
    drawn = ax.bar(labels, values, color="#4c72b0")
    ax.bar_label(drawn, [fmt.format(v) for v in values], fontsize=8, padding=2)
    if reference is not None:
        ax.axhline(reference, color="#c44e52", linestyle="--", linewidth=1, label=ref_label)
        ax.legend(loc="upper left", fontsize=8)
    ax.margins(y=0.15)


def save(fig, folder, name):
    fig.tight_layout()
    fig.savefig(os.path.join(folder, name), dpi=120)
    return name


def plot(r, folder):
    """The bench's figures as PNG files in `folder` -> their names: each titled with what it
    reproduces, axes labelled with units, BPD as the reference where it applies."""
    plt = pyplot()
    os.makedirs(folder, exist_ok=True)
    bpd, names = r.block_efficiency[decoders.PLAIN], []
    specs = [("head_entropy.png", "Kim §6.2: later heads are less sure", "head",
              "mean entropy (nats)", [str(i + 1) for i in range(len(r.head_entropy))],
              r.head_entropy, None),
             ("oracle_by_k.png", "Kim §6.3: oracle block efficiency of the top-k lattice",
              "k (candidates per head)", "block efficiency (tokens / call)", list(r.oracle_by_k),
              list(r.oracle_by_k.values()), bpd),
             ("block_efficiency.png", "Block efficiency by decoder (test split)", "decoder",
              "block efficiency (tokens / call)", list(r.block_efficiency),
              list(r.block_efficiency.values()), bpd)]
    for name, title, xlabel, ylabel, labels, values, ref in specs:
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
        bars(ax, labels, values, ref, f"plain BPD {bpd:.2f}" if ref else None)
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        names.append(save(fig, folder, name))
        plt.close(fig)
    extras = [("head_entropy_distribution.png", r.head_entropy_quantiles, entropy_boxes),
              ("speedup_by_heads.png", r.speedup_by_heads, heads_speed)]
    for name, data, draw in extras:
        if data:
            fig = draw(plt, data, r.checkpoint)
            names.append(save(fig, folder, name))
            plt.close(fig)
    return names


def short(path):
    """A checkpoint's file name, for a figure's title."""
    return os.path.basename(str(path))


def entropy_boxes(plt, q, model):
    """Kim Fig. 3a from analysis.entropy_quantiles: a box per head (the quartiles, the median as
    a line, whiskers at the 5% and 95% quantiles, the mean as a triangle). -> the figure."""
    at = {p: i for i, p in enumerate(q["quantiles"])}
    stats = [{"whislo": b[at[0.05]], "q1": b[at[0.25]], "med": b[at[0.5]], "q3": b[at[0.75]],
              "whishi": b[at[0.95]], "mean": m, "label": str(i + 1), "fliers": []}
             for i, (b, m) in enumerate(zip(q["by_head"], q["mean"]))]
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ax.bxp(stats, showmeans=True, showfliers=False)
    ax.set(title=f"Kim Fig. 3a: entropy of each head's distribution\n{short(model)}, "
                 f"{q['positions']} positions; whiskers 5%-95%, ▲ mean",
           xlabel="head", ylabel="entropy (nats)")
    return fig


def heads_speed(plt, s, model):
    """Stern §7.3 from timing.by_heads, plain BPD on heads 1..k. Left, Fig. 4's view: the
    wall-clock speedup over greedy against the mean accepted block size (our block efficiency),
    one point per k. Right, Table 4's view: speedup and block efficiency by k. -> the figure."""
    ks = [k for k in s["methods"] if k.isdigit()]
    x = [int(k) for k in ks]
    be = [s["methods"][k]["block_efficiency"] for k in ks]
    up = [s["methods"][k]["speedup"] for k in ks]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    left.plot(be, up, "o-")
    for k, b, u in zip(ks, be, up):
        left.annotate(f"k={k}", (b, u), textcoords="offset points", xytext=(4, -10), fontsize=7)
    left.axhline(1.0, color="grey", linewidth=0.8)
    left.set(title="Stern Fig. 4: speedup against mean accepted block size",
             xlabel="block efficiency (tokens / call)", ylabel="speedup (x greedy, median)")
    right.plot(x, up, "o-", label="wall-clock speedup over greedy (median)")
    right.plot(x, be, "s--", label="block efficiency (tokens / call)")
    right.axhline(1.0, color="grey", linewidth=0.8)
    right.set_xticks(x)
    right.set(title="by block size k (Stern Table 4's view)", xlabel="k (heads used)",
              ylabel="speedup (x greedy) / tokens per call")
    right.legend(fontsize=8)
    fig.suptitle(f"{short(model)}, {s['threads']} thread(s)", fontsize=9)
    return fig


def rescorer_sizes(plt, out, model):
    """Kim §7.1's rescorer sizes (tools/rescorer_sizes.py): for each rescorer, smallest first,
    neural's block efficiency and its wall-clock speedup over greedy as a pair of bars, plain
    BPD's as dashed lines. -> the figure."""
    m, sizes = out["methods"], out["rescorers"]
    names = sorted(sizes, key=lambda k: sizes[k]["params"])
    fig, ax = plt.subplots(figsize=(7, 4))
    for j, (key, label) in enumerate((("block_efficiency", "block efficiency (tokens / call)"),
                                      ("speedup", "wall-clock speedup over greedy"))):
        xs = [i + (j - 0.5) * 0.4 for i in range(len(names))]
        drawn = ax.bar(xs, [m[f"neural {k}"][key] for k in names], 0.4, label=f"neural: {label}")
        ax.bar_label(drawn, [f"{m[f'neural {k}'][key]:.2f}" for k in names], fontsize=7)
        ax.axhline(m[decoders.PLAIN][key], linestyle="--", linewidth=1,
                   color=drawn.patches[0].get_facecolor(), label=f"plain BPD: {label}")
    ax.set_xticks(range(len(names)), [f"{k}\n{human(sizes[k]['params'])}" for k in names],
                  fontsize=8)
    ax.set(xlabel="rescorer (parameters a call multiplies by)",
           ylabel="tokens per call / speedup (x greedy)",
           title=f"Kim §7.1: neural rescoring by rescorer size\n{short(model)}, "
                 f"{out['threads']} thread(s)")
    ax.set_ylim(0, 1.4 * max(max(m[f"neural {k}"]["block_efficiency"] for k in names),
                             m[decoders.PLAIN]["block_efficiency"]))     # room for the legend
    ax.legend(fontsize=7, loc="upper center", ncol=2)
    return fig


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


def print_sampled(r, model):
    """The bench report at temperature T > 0."""
    print(f"{r.prompts} prompts x {r.new_tokens} new tokens, temperature {r.temperature} "
          f"(seed {r.seed}), {r.checkpoint}, {next(model.parameters()).device}, "
          f"{r.threads} thread(s), {r.seconds:.0f} s\n")
    w = decoders.label_width(r.block_efficiency)
    print(f"  {'decoder':{w}s} {'block eff.':>10s} {'accepted':>9s} {'distribution (L1 < bound)':>26s} "
          f"{'tok/s':>7s} {'speedup':>8s}")
    tps = r.tokens_per_s
    for k, be in r.block_efficiency.items():
        c, acc = r.distribution_check.get(k), r.acceptance.get(k)
        dist = f"{c['l1']:.3f} < {c['bound']:.3f} {'✓' if c['ok'] else '✗'}" if c else "reference"
        t = f"{tps[k]:7.0f} {r.speedup[k]:7.2f}x" if k in tps else f"{'-':>7s} {'-':>8s}"
        print(f"  {k:{w}s} {be:10.3f} {'' if acc is None else f'{100 * acc:8.0f}%':>9s} {dist:>26s} {t}")
    for w in r.timing_warnings:
        print(f"  warning: {w}")
    print("\n  accepted: the share of tried draft tokens kept (each with probability min(1, p/q)).\n"
          "  The distribution check compares the first drafted token's empirical distribution\n"
          "  with the exact one; test_sampling.py checks whole outputs on tiny models exactly.")


# ----------------------------------------------------------------------------- --tasks

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


def print_heads_by_task(by_task):
    """Kim Table 1: a row per task, plain BPD's block efficiency by the number of heads used."""
    heads = list(next(iter(by_task.values())))
    print("\n  BPD block efficiency by heads used (Kim Table 1)\n  " + f"{'task':12s}" +
          "".join(f"{h:>6s}" for h in heads))
    for name, row in by_task.items():
        print(f"  {name:12s}" + "".join(f"{row[h]:6.2f}" for h in heads))


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


def plot_tasks(r, folder):
    """--tasks --plot: Kim Fig. 3b (h_max and mean head entropy against BPD block efficiency, one
    point per task, the least-squares line and r), Figs. 5-6 (oracle block efficiency relative to
    BPD by k, a line per task) and block efficiency per task and decoder. -> the file names."""
    plt = pyplot()
    os.makedirs(folder, exist_ok=True)
    names, tasks_ = [], list(r.tasks.items())
    bpd = [t.block_efficiency[decoders.PLAIN] for _, t in tasks_]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, what, ys in ((axes[0], "h_max", [t.hmax for _, t in tasks_]),
                         (axes[1], "mean head entropy (nats)",
                          [sum(t.head_entropy) / len(t.head_entropy) for _, t in tasks_])):
        ax.scatter(bpd, ys, color="#4c72b0")
        for (name, _), x, y in zip(tasks_, bpd, ys):
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        fit = least_squares(bpd, ys)
        if fit:
            lo, hi = min(bpd), max(bpd)
            ax.plot([lo, hi], [fit[0] + fit[1] * lo, fit[0] + fit[1] * hi], "--", color="#c44e52",
                    label=f"least squares, r = {fit[2]:+.2f} (n = {len(bpd)})")
            ax.legend(fontsize=8)
        ax.set(xlabel="BPD block efficiency (tokens / call)", ylabel=what)
    fig.suptitle("Kim Fig. 3b: head confidence against block efficiency, one point per task")
    names.append(save(fig, folder, "tasks_hmax.png"))
    plt.close(fig)
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
    plt.close(fig)
    names.append(task_bars(plt, r, folder))
    fig = tasks_by_heads(plt, {n: t.block_efficiency_by_heads for n, t in tasks_}, r.checkpoint)
    names.append(save(fig, folder, "tasks_by_heads.png"))
    plt.close(fig)
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
    name = save(fig, folder, "tasks_block_efficiency.png")
    plt.close(fig)
    return name


def least_squares(xs, ys):
    """(intercept, slope, Pearson r) of ys on xs, or None when xs or ys do not vary."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    if not sxx or not syy:
        return None
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    return my - sxy / sxx * mx, sxy / sxx, sxy / (sxx * syy) ** 0.5


# ----------------------------------------------------------------------------- the scale map (lab/scale.py)

def human(count):
    """Parameters as 32k, 1.45M, 216M, 1.2B."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= size:
            v = count / size
            return f"{v:.3g}{unit}" if v < 100 else f"{v:.0f}{unit}"
    return str(count)


def print_costs(r):
    """Tight-loop ms by size: forward passes of 1, 8 and 64 new tokens, a whole window, the heads
    at one position; then each tree decoder's real tree (a row each: any number fits 80 columns)."""
    rows, trees = r["scale"], list(r["scale"][0]["tree_ms"])
    print(f"  ms per forward pass in a tight loop on a cache of {r['cached']} tokens: 1, 8, 32 new"
          f"\n  tokens in one row, a window of {r['window_tail']}, the heads; then each tree "
          "decoder's tree")
    print(f"  {'params':>7s} {'L':>3s} {'C':>5s} {'1':>7s} {'8':>7s} {'32':>7s} {'window':>7s} "
          f"{'heads':>6s}")
    for row in rows:
        c = row["call_ms"]
        cell = lambda k: f"{c[k]:7.2f}" if k in c else f"{'-':>7s}"
        print(f"  {human(row['params']):>7s} {row['n_layer']:3d} {row['n_embd']:5d} {cell('1')} "
              f"{cell('8')} {cell('32')} {row['window_ms']:7.2f} {row['heads_ms']:6.2f}")
    if trees:
        w = decoders.label_width(trees)
        print(f"  {'tree':{w}s}" + "".join(f" {human(row['params']):>7s}" for row in rows))
        for t in trees:
            print(f"  {t:{w}s}" + "".join(f" {row['tree_ms'][t]:7.2f}" for row in rows))


def print_profiles(r):
    """Per decoder: the real run's counts and the size-independent costs timed in situ."""
    print("\n  the real run (per token: calls, steps; per step: tokens verified, drafting ms)\n"
          "  and the rest of a call in situ (ms: outside the forward pass, cache refill)")
    w = decoders.label_width(r["profiles"])
    print(f"  {'decoder':{w}s} {'block eff.':>10s} {'calls':>6s} {'steps':>6s} {'verified':>9s} "
          f"{'drafting':>9s} {'outside':>8s} {'refill':>7s}")
    for k, p in r["profiles"].items():
        print(f"  {k:{w}s} {p['tokens'] / p['calls']:10.3f} {p['calls'] / p['tokens']:6.3f} "
              f"{p['steps'] / p['tokens']:6.3f} {p['verified']:9.1f} {p['drafting_ms']:9.3f} "
              f"{p['outside_ms']:8.3f} {p['refill_ms']:7.3f}")


def print_projection(r):
    rows, names = r["scale"], list(r["scale"][0]["projected_tokens_per_s"])
    w = decoders.label_width(names)
    print("\n  projected tokens/s by size (the bench below checks the first column)")
    print(f"  {'params':>{w}s}" + "".join(f" {human(row['params']):>8s}" for row in rows))
    for k in names:
        print(f"  {k:{w}s}" + "".join(f" {row['projected_tokens_per_s'][k]:8.1f}" for row in rows))
    print("\n  validation at the model's own size: the bench's measured tokens/s, projected,\n"
          "  error = projected / measured - 1, and the error without refill (tight loop)")
    for k, v in r["validation"].items():
        print(f"  {k:{w}s} {v['measured']:8.1f} {v['projected']:8.1f} {100 * v['error']:+6.1f}% "
              f"{100 * v['error_tight_loop']:+6.1f}%")
    wrong = [k for k, same in r["identical_to_greedy"].items() if not same]
    inexact = [f"{', '.join(wrong)} did not return greedy's tokens"] if wrong else []
    for w in r["timing_warnings"] + inexact:
        print(textwrap.fill(f"warning: {w}", 78, initial_indent="  ", subsequent_indent="    "))


def print_scale(r):
    """The map in the terminal, 80 columns: the costs by size, the real run, the projection and
    its validation, the crossovers, and a chart at the largest size."""
    print(f"scale map: {r['prompts']} prompts x {r['new_tokens']} new tokens, {r['device']}, "
          f"{r['threads']} thread(s), {r['seconds']:.0f} s\n")
    print_costs(r)
    print_profiles(r)
    print_projection(r)
    where = lambda d: ", ".join(f"{k} {human(v) if v else 'never'}" for k, v in d.items())
    print()
    for what, key in (("beats plain BPD from", "crossover_params"),
                      ("beats greedy from", "beats_greedy_params")):
        print(textwrap.fill(f"{what}: {where(r[key])}", 78, initial_indent="  ",
                            subsequent_indent="    "))
    rows = r["scale"]
    last = rows[-1]["projected_tokens_per_s"]
    chart(f"projected tokens/s relative to bpd at {human(rows[-1]['params'])} parameters",
                  [(k, v / last[decoders.PLAIN]) for k, v in last.items()], fmt="{:.2f}x",
                  mark=decoders.PLAIN)


def plot_scale(r, folder):
    """The map as a PNG in `folder`: projected tokens/s against parameters, log axes, one line
    per decoder, BPD and greedy drawn as references, each decoder's measured tokens/s at the
    model's own size as a cross. matplotlib is optional: imported here. -> the file name."""
    try:
        import matplotlib
    except ImportError:
        raise ValueError("plot_scale needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(folder, exist_ok=True)
    rows, fig = r["scale"], plt.figure(figsize=(7, 4.5))
    x = [row["params"] for row in rows]
    for name in rows[0]["projected_tokens_per_s"]:
        ref = name in (decoders.baseline_name(0.0), decoders.PLAIN)
        line, = plt.plot(x, [row["projected_tokens_per_s"][name] for row in rows],
                         "--" if ref else "-o", label=name, linewidth=2 if ref else 1.2,
                         color={decoders.baseline_name(0.0): "black", decoders.PLAIN: "grey"}.get(name), markersize=3)
        plt.plot(x[0], r["validation"][name]["measured"], "x", color=line.get_color())
    plt.plot([], [], "x", color="black", label="measured by the bench")
    plt.xscale("log")
    plt.yscale("log")
    plt.xlabel("base model parameters (log scale)")
    plt.ylabel("tokens per second (log scale)")
    plt.title(f"Projected decoding speed by model size ({r['device']}, {r['threads']} thread(s))",
              fontsize=10)
    plt.legend(fontsize=8)
    plt.grid(alpha=0.3, which="both")
    fig.tight_layout()
    name = "scale_map.png"
    fig.savefig(os.path.join(folder, name), dpi=120)
    plt.close(fig)
    return name


def slower_hint(model, ratio):
    """Why BPD may lose on this machine, and what to try (issue 43, trap 6)."""
    if ratio >= 1:
        return ""
    return ("\n  BPD pays when a verification call of h tokens costs little more than a one-token "
            "call.\n  Here it does not: see 'this CPU' above (a CPU without bf16 dot products "
            "pays per row in bf16),\n  other work on the machine, or --threads; "
            "docs/real-model.md, 'Which CPU gives what'.")


def machine_line(model):
    """What a model chose for this machine at load (SmolLM2: models/machine.py), as a clause."""
    why = getattr(model, "machine", None)
    return f"\nthis CPU: {why} (`--dtype` chooses another)" if why else ""
