"""approximate: the bench's APPROXIMATE section (`python minibpd.py --bench --approximate`) and the
command line's checks of `--accept`: Stern §5's relaxed acceptance rules (runtime/approximate.py)
on plain BPD's drafts, each set against exact BPD (docs/approximate.md: what a rule buys and
costs). Their output is NOT greedy decoding's: their own section (BenchReport.approximate, the
JSON key `approximate`), never in identical_to_greedy.
"""
import math

import torch
import torch.nn.functional as F

import decoders
from decoders.method import Method
import runtime.approximate
from lab import analysis
from lab import timing
from runtime.loop import lab_decode

RULES = ("top2", "top3", "top5", "min2", "min3")    # what --bench --approximate runs


def check_spec(spec):
    """--accept SPEC checked before anything is loaded. -> whether it names an approximate rule."""
    try:
        return runtime.approximate.rule(spec) is not None
    except ValueError as e:
        raise ValueError(f"--accept {spec}: {e}") from None


def labelled(spec):
    """Whether --accept SPEC's output is labelled APPROXIMATE: a relaxed rule that can accept
    what greedy would not; top1 and min1 are the exact rule (runtime.approximate.Relaxed)."""
    relaxed = runtime.approximate.rule(spec)
    return relaxed is not None and (relaxed.k > 1 or relaxed.min_block > 1)


# ----------------------------------------------------------------------------- quality

@torch.no_grad()
def logprobs_along(model, seq, first):
    """log p(seq[t]) under the base model (head 1) for every t >= first, each in the context the
    decode loop gives position t (analysis.states_along), in float64. -> len(seq) - first floats."""
    out = []
    for t, z in analysis.states_along(model, seq, first):
        logp = F.log_softmax(model.lm_head(z).double(), dim=-1)        # [L, V]
        out += logp[torch.arange(len(logp)), torch.tensor(seq[t:t + len(logp)])].tolist()
    return out


def outputs_perplexity(model, prompts, outs):
    """The base model's perplexity of the generated tokens (each output after its prompt), all
    outputs together: every generated token counts once."""
    lp = [x for p, o in zip(prompts, outs) for x in logprobs_along(model, p + o, len(p))]
    return math.exp(-sum(lp) / max(1, len(lp)))


def differing(outs, greedy):
    """Share of the generated tokens that differ from greedy's at the same position (after a first
    difference the two texts are shifted, so most later positions differ too)."""
    pairs = [(a, b) for o, g in zip(outs, greedy) for a, b in zip(o, g)]
    return sum(a != b for a, b in pairs) / max(1, len(pairs))


def first_difference(outs, greedy):
    """Mean number of generated tokens before the first that differs from greedy's (an output
    equal to greedy's counts its length)."""
    firsts = [next((i for i, (a, b) in enumerate(zip(o, g)) if a != b), len(o))
              for o, g in zip(outs, greedy)]
    return sum(firsts) / max(1, len(firsts))


# ----------------------------------------------------------------------------- the section

def section(run, rules=RULES):
    """Each APPROXIMATE rule on plain BPD's drafts, on the prompts of a lab.run.Run at
    temperature 0 (run.n new tokens each, verifying as run.verify; greedy's continuations, the
    reference, are the run's), for real and timed beside exact BPD (one interleaved run,
    timing.timings). -> {rule: {block_efficiency, tokens_per_s, speedup_vs_bpd,
    differs_from_greedy, first_difference, quality: {perplexity, greedy_perplexity,
    phrase_repeat, greedy_phrase_repeat}}}"""
    model, prompts, n, verify = run.model, run.prompts, run.n, run.verify
    greedy = run.continuations()
    drafter = lambda: decoders.make(decoders.PLAIN, run.res, {})       # plain BPD's, fresh
    methods = [Method(decoders.PLAIN, drafter())] + [Method(r, drafter(), accept=r) for r in rules]
    tps = timing.tokens_per_s(timing.timings(run, methods), len(prompts) * n)
    base = {"greedy_perplexity": outputs_perplexity(model, prompts, greedy),
            "greedy_phrase_repeat": analysis.phrase_repetition_all(greedy)}
    out = {}
    for r in rules:
        runs = [lab_decode(model, p, n, drafter(), verify=verify, accept=r) for p in prompts]
        outs = [o for o, _ in runs]
        out[r] = {"block_efficiency": analysis.block_eff([s for _, s in runs]),
                  "tokens_per_s": tps[r], "speedup_vs_bpd": tps[r] / tps[decoders.PLAIN],
                  "differs_from_greedy": differing(outs, greedy),
                  "first_difference": first_difference(outs, greedy),
                  "quality": {"perplexity": outputs_perplexity(model, prompts, outs),
                              "greedy_perplexity": base["greedy_perplexity"],
                              "phrase_repeat": analysis.phrase_repetition_all(outs),
                              "greedy_phrase_repeat": base["greedy_phrase_repeat"]}}
    return out


def print_section(approx, bpd_block_efficiency):
    """The section in the terminal, after the exact report."""
    print("\n  APPROXIMATE acceptance (Stern §5, --approximate): NOT greedy decoding's output, so "
          "never\n  in '= greedy' above; plain BPD's drafts, tok/s timed against exact BPD in one "
          f"run\n  (exact BPD: block efficiency {bpd_block_efficiency:.3f})")
    print(f"  {'rule':6s} {'block eff.':>10s} {'tok/s':>7s} {'vs bpd':>7s} {'differ':>7s} "
          f"{'1st diff':>8s} {'perplexity':>10s} {'greedy':>7s} {'phrase rep.':>11s}")
    for r, v in approx.items():
        q = v["quality"]
        print(f"  {r:6s} {v['block_efficiency']:10.3f} {v['tokens_per_s']:7.0f} "
              f"{v['speedup_vs_bpd']:6.2f}x {100 * v['differs_from_greedy']:6.1f}% "
              f"{v['first_difference']:8.1f} "
              f"{q['perplexity']:10.3f} {q['greedy_perplexity']:7.3f} "
              f"{100 * q['phrase_repeat']:10.1f}%")
