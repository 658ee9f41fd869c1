"""The reports in the terminal (tables and unicode bar charts, 80 columns, meaningful without
colour) and, with `--plot DIR`, as PNG files (matplotlib, optional): the bench's (a
bench.BenchReport, read by attribute, so a misspelt field fails loudly) and the heads figures,
with the drawing tools that figures_tasks.py (the tasks' report) and figures_scale.py (the scale
map's) use too."""
import os

import decoders

EIGHTHS = " ▏▎▍▌▋▊▉"


def bar(value, vmax, width):
    """A horizontal bar of `width` columns at full scale, in eighths of a block."""
    n = max(0.0, value / vmax * width) if vmax > 0 else 0.0
    full, part = divmod(round(n * 8), 8)
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
    1 step of 998 was won."""
    return (f"steps won/tied/lost {c['win']}/{c['tie']}/{c['loss']} of {c['steps']}, "
            f"{c['wins_replacing_repeat']} of {c['win']} wins fixed a repeat")


def paper_tables(r):
    print("\n  repetition in drafts (Kim §6.1; paper: BPD 20-75%; with 2-gram rescoring it quotes\n"
          "  9.9-24.5%, levels or reductions; our rescorers run at their tuned order)")
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
        gap = "its oracle is plain BPD's: no gap to close" if g["gap_closed"] is None else \
            f"closes {100 * g['gap_closed']:4.0f}% of the gap to the oracle"
        print(f"  {name:{wide}s} {g['percent']:+6.1f}%  {gap}{wtl}")
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
          f"plain BPD on heads 1..k, one interleaved run, {s['threads']} thread(s)\n"
          f"  {'k':>6s} {'block eff.':>10s} {'tok/s':>8s} {'speedup':>8s} {'= greedy':>9s}")
    for name, m in s["methods"].items():
        print(f"  {name:>6s} {m['block_efficiency']:10.3f} {m['tokens_per_s']:8.0f} "
              f"{m['speedup']:7.2f}x {'yes' if m['identical_to_greedy'] else 'NO':>9s}")
    for w in s["timing_warnings"]:
        print(f"  warning: {w}")


def peeks(name):
    return name in decoders.DECODERS and decoders.DECODERS[name].peeks


def code_run(model):
    """Which implementations the bench timed: the lab's fast twins (tested equal to the paper
    files' readable code) unless --reference."""
    if getattr(model, "reference", True):
        return "the paper files' readable implementations (--reference)"
    return ("the lab's fast twins: the heads in one product (runtime/fast_heads.py), the p-best DP "
            "(decoders/fastlattice.py), several drafts as one token tree (runtime/tree.py, "
            "--verify); --reference runs minibpd.py's and lattice.py's own")


def print_report(r, model, color=False):
    """The whole report, at temperature 0 or above it (print_sampled)."""
    if r.temperature:
        return print_sampled(r, model)
    print(f"{r.prompts} prompts x {r.new_tokens} new tokens, {r.checkpoint}, "
          f"{next(model.parameters()).device}, {r.threads} thread(s), {r.seconds:.0f} s"
          + (f"\nthis CPU: {r.machine}" if r.machine else "") + f"\ncode: {code_run(model)}\n")
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


def save(fig, folder, name):
    """Write the figure to folder/name (the folder made if need be) and close it. -> name"""
    os.makedirs(folder, exist_ok=True)
    fig.tight_layout()
    fig.savefig(os.path.join(folder, name), dpi=120)
    pyplot().close(fig)
    return name


def plot(r, folder):
    """The bench's figures as PNG files in `folder` -> their names: each titled with what it
    reproduces, axes labelled with units, BPD as the reference where it applies."""
    plt = pyplot()
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
        drawn = ax.bar(labels, values, color="#4c72b0")      # the values on top of the bars
        ax.bar_label(drawn, [f"{v:.2f}" for v in values], fontsize=8, padding=2)
        if ref is not None:                                   # plain BPD, dashed
            ax.axhline(ref, color="#c44e52", linestyle="--", linewidth=1,
                       label=f"plain BPD {bpd:.2f}")
            ax.legend(loc="upper left", fontsize=8)
        ax.margins(y=0.15)
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        names.append(save(fig, folder, name))
    extras = [("head_entropy_distribution.png", r.head_entropy_quantiles, entropy_boxes),
              ("speedup_by_heads.png", r.speedup_by_heads, heads_speed)]
    for name, data, draw in extras:
        if data:
            fig = draw(plt, data, r.checkpoint)
            names.append(save(fig, folder, name))
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


# -------------------------------------------- sizes, the machine (the scale map: figures_scale.py)

def human(count):
    """Parameters as 32k, 1.45M, 216M, 1.2B."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= size:
            v = count / size
            return f"{v:.3g}{unit}" if v < 100 else f"{v:.0f}{unit}"
    return str(count)


def slower_hint(ratio):
    """Why BPD may lose on this machine, and what to try."""
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
