"""demo: `python minibpd.py` (--demo), every decoder on one test prompt (a real model: its own
prompts), the first BPD steps drawn with the refined drafts beside them, and greedy vs BPD timed.
"""
import random
import time

import torch

from lab import analysis
from lab import figures
from lab import timing
from lab import trace
from lab.bench import make_prompts
from lab.checks import MAX_DEMO_TOKENS
from lab.loading import build_drafters, load_mode
from lab.run import Run
import decoders
from lattice import draw_steps
from minibpd import greedy_decode
from runtime.checkpoint import family_module
from runtime.corpus import decode


def show_tokens(tokens, vocab):
    return decode(tokens, vocab).replace("\n", "⏎")


def run_demo(args):
    """Every decoder on one test prompt (SmolLM2: an English and a Python request), the first BPD
    steps drawn, and greedy vs BPD timed."""
    t0 = time.perf_counter()
    model, ck, chosen, res = load_mode(args, used=[])    # the drafters: those the demo runs, below
    family = family_module(ck)
    # A real model's demo leaves out its family's DEMO_SKIP (for time: they took 45 s).
    skip = [k for k in decoders.active() if k in getattr(family, "DEMO_SKIP", ())]
    with decoders.select([k for k in decoders.active() if k not in skip]):
        build_drafters(decoders.active(), chosen, res)
        return show_demo(args, model, ck, chosen, res, family, t0, skip)


def show_demo(args, model, ck, chosen, res, family, t0, skip):
    """The demo, once loaded (demo)."""
    loaded = time.perf_counter() - t0
    vocab, T = ck["vocab"], args.temperature
    real = family is not None
    n = min(args.max_new_tokens, family.DEMO_TOKENS if real else MAX_DEMO_TOKENS)  # more: refused
    prompts = family.demo_prompts(vocab) if real else split_prompt(args, ck, vocab)
    print(f"minibpd demo: {model.config.n_bpd_heads} BPD heads on a "
          f"{sum(p.numel() for p in model.parameters()):,}-parameter "
          f"{family.NAME if real else 'character GPT'} "
          f"({ck.get('corpus', {}).get('name', 'unknown corpus')}), "
          f"{next(model.parameters()).device}, {torch.get_num_threads()} thread(s)"
          + (f"; sampling at temperature {T} (seed {args.seed}): every decoder samples exactly "
             "the base model's distribution, block efficiency is what drafting buys" if T else "")
          + (f"; {n} new tokens a prompt (`--prompt` for longer)" if real else "")
          + f"; loaded in {loaded:.1f} s" + figures.machine_line(model) + "\n")
    gen, all_same = torch.Generator().manual_seed(args.seed), True
    for i, (label, prompt) in enumerate(prompts):
        later = getattr(family, "DEMO_LATER", ())          # a real model's later prompts
        names = [k for k in decoders.active() if not i or k == decoders.PLAIN or k in later]
        left = skip + [k for k in decoders.active() if k not in names]
        greedy, plain, same = demo_decoders(model, res, chosen, label, prompt, n, gen, args,
                                            names, left)
        all_same &= same
        if i == 0:
            (draw_tries if T else draw_decoder_steps)(model, res, chosen, plain, prompt + greedy,
                                              len(prompt), vocab)
    base, prompt = decoders.baseline_name(T), prompts[0][1]
    methods = [decoders.Method(base), decoders.method(decoders.PLAIN, res, {})]
    once = Run(res, chosen, [prompt], n, T, verify=args.verify, generator=gen)
    tps = timing.tokens_per_s(timing.timings(once, methods, 3, warm_up=False), n)
    print(f"\nwall-clock on this machine (median of 3{', first prompt' if len(prompts) > 1 else ''}): "
          f"{base} {tps[base]:.0f} tok/s, BPD {tps[decoders.PLAIN]:.0f} tok/s: "
          f"{tps[decoders.PLAIN] / tps[base]:.2f}x (`--bench` times every decoder)"
          + figures.slower_hint(tps[decoders.PLAIN] / tps[base]))
    traced = trace.trace_demo(args, model, ck, res, chosen, prompts[0][1], n)
    print(f"\n(load {loaded:.1f} s, decoding {time.perf_counter() - t0 - loaded:.1f} s)")
    print("\n" + traced)
    return 0 if all_same else 1


def split_prompt(args, ck, vocab):
    """-> [(label, token ids)]: one prompt of the test split, chosen by --seed (a model family
    brings its own: its module's demo_prompts)."""
    text = decoders.split_text(ck, "test")
    if len(text) < 160:
        raise ValueError(f"checkpoint {args.checkpoint} holds no test text for the demo; use --prompt")
    prompt = random.Random(args.seed).choice(make_prompts(text, vocab, 8, 80))
    return [(f"(test split): '{show_tokens(prompt, vocab)}'", prompt)]


def demo_decoders(model, res, chosen, label, prompt, n, gen, args, names, left):
    """Greedy, then each decoder of `names` on one prompt, one line each (`left`: those left out,
    named). -> (greedy tokens, plain BPD's stats, whether every decoder matched greedy; at T > 0,
    True)"""
    T, vocab = args.temperature, res.ck["vocab"]
    print(f"prompt {label}" + (f" (not run here, for time: {', '.join(left)}; `--decoder NAME` "
                               "runs one)" if left else ""))
    greedy = greedy_decode(model, prompt, n)
    if T == 0:
        print(f"greedy, {n} calls: '{show_tokens(greedy, vocab)}'\n")
    all_same, plain, w = True, None, decoders.label_width(decoders.DECODERS)
    for name in names:
        m = decoders.method(name, res, chosen[name], prompt + greedy)
        out, stats = m.decode(model, prompt, n, T, gen, args.verify)
        all_same &= T > 0 or out == greedy
        plain = stats if name == decoders.PLAIN else plain
        sets = ", ".join(f"{a}={b}" for a, b in chosen[name].items())
        what = (f"'{show_tokens(out[:40], vocab)}…'" if T else
                f"{'identical to greedy ✓' if out == greedy else 'DIFFERENT from greedy ✗'}  {sets}")
        print(f"  {name:{w}s} {stats['calls']:3d} calls, block efficiency "
              f"{stats['block_efficiency']:.2f}  {what}")
    print()
    return greedy, plain, all_same


def draw_decoder_steps(model, res, chosen, stats, answer, plen, vocab):
    """The first BPD calls drawn as the paper's demo draws them (lattice.draw_steps), with every
    refined decoder of the registry and the heads as the decode loop computed them."""
    along = analysis.heads_along(model, answer, plen)              # {position: [h, V]}
    drafters = {name: (decoders.make(name, res, chosen[name]), "")
                for name in [decoders.PLAIN] + decoders.refined()}
    draw_steps(model, drafters, stats, answer, vocab, show_tokens=show_tokens,
               heads=lambda model, seq: along[len(seq) - 1])


def draw_tries(model, res, chosen, stats, answer, plen, vocab, limit=6):
    """At T > 0: BPD's first steps token by token: each draft token accepted with probability
    min(1, p/q) (p(d) for a deterministic draft), then a token sampled from what is left of p."""
    print("\n  how BPD's draft tokens are checked (✓ kept, ✗ rejected; then a token is sampled"
          " from what is left of p):")
    for step in stats["steps"][:limit]:
        tries = " ".join(f"'{show_tokens([tok], vocab)}' {'✓' if ok else '✗'} p={a:.2f}"
                         for _, tok, a, ok in step["tries"])
        draft = show_tokens(step["drafts"][0], vocab)
        print(f"    draft '{draft}': {tries}  -> +{step['accepted']}")

