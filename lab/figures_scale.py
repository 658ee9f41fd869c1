"""figures_scale: the scale map's report (lab/scale.py's result dict): tight-loop costs by size,
the decoders' profiles, the projection and where each refined decoder overtakes plain BPD, in
the terminal and, with `--plot DIR`, as a PNG file. The shared drawing tools are figures.py's."""
import textwrap

import decoders
from lab.figures import chart, human, pyplot, save


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
    model's own size as a cross. -> the file name."""
    plt = pyplot()
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
    return save(fig, folder, "scale_map.png")
