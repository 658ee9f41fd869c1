"""The bench report (a bench.BenchReport) in the terminal (tables and unicode bar charts, 80
columns, meaningful without colour) and, with `--plot DIR`, the same figures as PNG files
(matplotlib, optional). Reads the report's fields by attribute, so a misspelt one fails loudly."""
import os

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
    vmax = max((v for _, v in rows), default=0)
    for label, v in rows:
        b = bar(v, vmax, width)
        if color:
            b = f"\033[{'33' if label == mark else '36'}m{b}\033[0m"
        print(f"  {label:>9s} │{b} {fmt.format(v)}{' ◀' if label == mark else ''}")


def decoder_table(r):
    print(f"  {'decoder':8s} {'block eff.':>10s} {'vs bpd':>8s} {'= greedy':>9s} {'tok/s':>8s} "
          f"{'speedup':>8s}  settings")
    be, tps, plain = r.block_efficiency, r.tokens_per_s, decoders.PLAIN
    for k in be:
        t = f"{tps[k]:8.0f} {r.speedup[k]:7.2f}x" if k in tps else f"{'-':>8s} {'-':>8s}"
        rel = f"{100 * (be[k] / be[plain] - 1):+7.1f}%" if k not in (r.baseline, plain) else ""
        sets = ", ".join(f"{a}={b}" for a, b in r.settings.get(k, {}).items())
        print(f"  {k:8s} {be[k]:10.3f} {rel:>8s} {'yes' if r.identical_to_greedy[k] else 'NO':>9s}"
              f" {t}  {sets}")


def paper_tables(r):
    print("\n  repetition in drafts (Kim §6.1; paper: BPD 20-75%; with 2-gram rescoring it quotes\n"
          "  9.9-24.5%, which may be read as levels or as reductions)")
    for name, v in r.repetition.items():
        print(f"  {name:12s} adjacent repeats {100 * v['adjacent_repeat']:5.1f}%   "
              f"longest run {v['longest_run']:.2f}")
    print("\n  head top-1 accuracy vs greedy (ours; Kim §6.2 reports entropy): "
          + " ".join(f"{100 * a:.0f}%" for a in r.head_accuracy) + f"   h_max = {r.hmax}")
    print("\n  refined vs BPD (block efficiency, as in Kim Table 4; paper: +5% to +21%)")
    for name, g in r.relative_gain.items():
        w = r.win_tie_loss.get(name)
        wtl = (f"  steps won/tied/lost {100 * w['win']:.0f}/{100 * w['tie']:.0f}/{100 * w['loss']:.0f}%,"
               f" {100 * w['wins_replacing_repeat']:.0f}% of wins fixed a repeat") if w else ""
        print(f"  {name:7s} {g['percent']:+6.1f}%  closes {100 * g['gap_closed']:4.0f}% of the gap "
              f"to the oracle{wtl}")
    print("\n  cost per generated token (ours; Kim analyse cost in Fig. 2 and an appendix table)\n"
          "  FLOPs = 2 x params x tokens run; ratios to greedy")
    print(f"  {'decoder':8s} {'calls':>6s} {'tokens':>7s} {'small-LM':>9s} {'n-gram':>7s} "
          f"{'FLOPs':>6s} {'wall':>6s}")
    for name, c in r.cost.items():
        wall = f"{c['wall_clock_ratio']:6.2f}" if c["wall_clock_ratio"] else f"{'-':>6s}"
        print(f"  {name:8s} {c['base_calls']:6.3f} {c['base_tokens']:7.2f} {c['small_lm_calls']:9.2f}"
              f" {c['ngram_lookups']:7.0f} {c['flop_ratio']:6.2f} {wall}")
    print("  A large model on a GPU is memory-bound: its time follows 'calls' while the verified\n"
          "  tokens fit the compute headroom. This tiny model on a CPU follows 'FLOPs' and the\n"
          "  drafting work far more: see 'wall'.")


def peeks(name):
    return name in decoders.DECODERS and decoders.DECODERS[name].peeks


def print_report(r, model, color=False):
    """The whole report, at temperature 0 or above it (print_sampled)."""
    if r.temperature:
        return print_sampled(r, model)
    print(f"{r.prompts} prompts x {r.new_tokens} new tokens, {r.checkpoint}, "
          f"{next(model.parameters()).device}, {r.threads} thread(s), {r.seconds:.0f} s\n")
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
    if r.sweep:
        s = r.sweep
        chart("sweep (tune split): BPD block efficiency by heads used", list(s["heads"].items()),
              color=color)
        for key in ("k", "p", "alpha"):
            for name, row in s[key].items():
                chart(f"sweep: {name} block efficiency by {key}", list(row.items()), color=color)


def plot(r, folder):
    """The same figures as PNG files in `folder` -> their names. matplotlib stays optional: the
    command line checks for it before any work."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(folder, exist_ok=True)
    figs = {"head_entropy.png": ("head entropy (nats)", [f"{i + 1}" for i in range(len(r.head_entropy))],
                                 r.head_entropy, "head"),
            "oracle_by_k.png": ("oracle block efficiency", list(r.oracle_by_k),
                                list(r.oracle_by_k.values()), "k"),
            "block_efficiency.png": ("block efficiency", list(r.block_efficiency),
                                     list(r.block_efficiency.values()), "decoder")}
    for name, (ylabel, labels, values, xlabel) in figs.items():
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.bar(labels, values, color="#4c72b0")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        fig.tight_layout()
        fig.savefig(os.path.join(folder, name), dpi=120)
        plt.close(fig)
    return list(figs)


def print_sampled(r, model):
    """The bench report at temperature T > 0."""
    print(f"{r.prompts} prompts x {r.new_tokens} new tokens, temperature {r.temperature} "
          f"(seed {r.seed}), {r.checkpoint}, {next(model.parameters()).device}, "
          f"{r.threads} thread(s), {r.seconds:.0f} s\n")
    print(f"  {'decoder':8s} {'block eff.':>10s} {'accepted':>9s} {'distribution (L1 < bound)':>26s} "
          f"{'tok/s':>7s} {'speedup':>8s}")
    tps = r.tokens_per_s
    for k, be in r.block_efficiency.items():
        c, acc = r.distribution_check.get(k), r.acceptance.get(k)
        dist = f"{c['l1']:.3f} < {c['bound']:.3f} {'✓' if c['ok'] else '✗'}" if c else "reference"
        t = f"{tps[k]:7.0f} {r.speedup[k]:7.2f}x" if k in tps else f"{'-':>7s} {'-':>8s}"
        print(f"  {k:8s} {be:10.3f} {'' if acc is None else f'{100 * acc:8.0f}%':>9s} {dist:>26s} {t}")
    for w in r.timing_warnings:
        print(f"  warning: {w}")
    print("\n  accepted: the share of tried draft tokens kept (each with probability min(1, p/q)).\n"
          "  The distribution check compares the first drafted token's empirical distribution\n"
          "  with the exact one; test_sampling.py checks whole outputs on tiny models exactly.")
