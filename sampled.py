"""The command line at temperature T > 0 (`--temperature T`): `--prompt`, `--demo` and `--bench`
with sampling. Every decoder then samples exactly the base model's distribution (sampling.py);
outputs differ from run to run (the seed fixes them), so 'identical to greedy' becomes a
distribution check, and the baseline is sample_decode, one token per call.
"""
import json
import math
import random
import sys
import time
from collections import Counter

import torch

import bench as cli
import decoders
import figures
from decoders import Resources, split_text
from minibpd import bpd_decode, decode, encode, greedy_decode, target_probs, window_start


def generate(args):
    model, ck, cfg = cli.load(args)
    prompt, n = encode(args.prompt, ck["vocab"]), args.max_new_tokens
    drafter = cli.chosen_drafter(args, model, ck, cfg, prompt)
    name = "sample" if args.decoder == "greedy" else args.decoder
    gen = torch.Generator().manual_seed(args.seed)
    out, calls = cli.run_decoder(model, name, drafter, prompt, n, args.temperature, gen, args.verify)
    print(args.prompt + decode(out, ck["vocab"]))
    print(f"[{name}: {len(out)} tokens in {calls} calls, block efficiency {len(out) / calls:.2f}, "
          f"sampled at temperature {args.temperature} (seed {args.seed})]", file=sys.stderr)
    return 0


def demo(args):
    """Every decoder from one prompt at T, then BPD's first steps token by token: each draft
    token accepted with probability min(1, p/q) (p(d) for a deterministic draft)."""
    model, ck, cfg = cli.load(args)
    cli.check_decoders(model, cfg, decoders.DECODERS)
    vocab, n, T = ck["vocab"], min(args.max_new_tokens, 160), args.temperature
    text = split_text(ck, "test")
    if len(text) < 160:
        raise ValueError(f"checkpoint {args.checkpoint} holds no test text for the demo; use --prompt")
    prompt = random.Random(args.seed).choice(cli.make_prompts(text, vocab, 8, 80))
    res, show = Resources(model, ck), cli.show
    print(f"minibpd demo at temperature {T} (seed {args.seed}): every decoder samples exactly the "
          f"base model's distribution; outputs differ, block efficiency is what drafting buys\n")
    print(f"prompt (test split): '{show(prompt, vocab)}'")
    gen = torch.Generator().manual_seed(args.seed)
    full = prompt + greedy_decode(model, prompt, n)
    for name in decoders.DECODERS:
        drafter = decoders.make(name, res, cfg[name], full)
        out, stats = bpd_decode(model, prompt, n, drafter, T, gen, args.verify)
        if name == "bpd":
            bpd_stats = stats
        print(f"  {name:7s} {stats['calls']:3d} calls, block efficiency {stats['block_efficiency']:.2f}"
              f"  '{show(out[:40], vocab)}…'")
    print("\n  how BPD's draft tokens are checked (✓ kept, ✗ rejected; then a token is sampled"
          " from what is left of p):")
    for step in bpd_stats["steps"][:6]:
        tries = " ".join(f"'{show([tok], vocab)}' {'✓' if ok else '✗'} p={a:.2f}"
                         for _, tok, a, ok in step["tries"])
        print(f"    draft '{show(step['drafts'][0], vocab)}': {tries}  -> +{step['accepted']}")
    return 0


# ----------------------------------------------------------------------------- --bench

@torch.no_grad()
def second_token(model, prompt, T):
    """Exact distribution [V] of the 2nd new token: sum_x p(x | prompt) p(y | prompt + x)."""
    V, B, dev = model.config.vocab_size, model.config.block_size, model.lm_head.weight.device
    t = len(prompt)
    z = model(torch.tensor([prompt[window_start(t, B):t]], device=dev))[0, -1]
    p1 = target_probs(model.lm_head(z).double(), T).cpu()                            # [V]
    rows = torch.tensor([prompt[window_start(t + 1, B):] + [x] for x in range(V)], device=dev)
    return p1 @ target_probs(model.lm_head(model(rows)[:, -1]).double(), T).cpu()   # [V]


def distribution_check(model, make, prompt, T, seed, runs=1000, top=9):
    """The first drafted token (the 2nd new token) against its exact distribution, coarsened to
    its `top` likeliest tokens + 'other' (a coarsening keeps a correct sampler correct). L1
    distance of `runs` draws, and the bound it exceeds with probability < 1e-6 for a correct
    sampler (test_sampling.py explains it)."""
    marginal = second_token(model, prompt, T)
    keep = marginal.argsort(descending=True)[:top].tolist()
    cat = {tok: i for i, tok in enumerate(keep)}
    gen, counts = torch.Generator().manual_seed(seed), Counter()
    for _ in range(runs):
        counts[cat.get(bpd_decode(model, prompt, 2, make(), T, gen)[0][1], top)] += 1
    exact = marginal[keep].tolist() + [1 - float(marginal[keep].sum())]
    l1 = sum(abs(counts[i] / runs - p) for i, p in enumerate(exact))
    bound = math.sqrt(2 / runs * math.log((2 ** (top + 1) - 2) / 1e-6))
    return {"l1": l1, "bound": bound, "runs": runs, "ok": l1 < bound}


def bench(args):
    model, ck, cfg = cli.load(args)
    cli.check_decoders(model, cfg, decoders.DECODERS)
    prompts, n, T = cli.bench_prompts(ck, args), args.new_tokens, args.temperature
    res, t0, gen = Resources(model, ck), time.perf_counter(), torch.Generator().manual_seed(args.seed)
    full = [p + greedy_decode(model, p, n) for p in prompts] if any(
        d.peeks for d in decoders.DECODERS.values()) else [None] * len(prompts)
    # The check is most telling where the 2nd token is least certain: the prompt whose exact
    # distribution has the highest entropy.
    entropy = [float(-(m * m.clamp_min(1e-300).log()).sum()) for m in
               (second_token(model, p, T) for p in prompts)]
    at = entropy.index(max(entropy))
    be, check, steps = {"sample": 1.0}, {}, {}
    for name in decoders.DECODERS:
        runs = [bpd_decode(model, p, n, decoders.make(name, res, cfg[name], f), T, gen, args.verify)[1]
                for p, f in zip(prompts, full)]
        be[name] = len(prompts) * n / sum(r["calls"] for r in runs)
        steps[name] = [s for r in runs for s in r["steps"]]
        make = lambda: decoders.make(name, res, cfg[name], full[at])
        check[name] = distribution_check(model, make, prompts[at], T, args.seed)
    clock = cli.time_decoders(model, res, cfg, prompts, n, "sample", args.verify, T, gen)
    r = {"temperature": T, "seed": args.seed, "block_efficiency": be, "distribution_check": check,
         "distribution_check_prompt": at, "acceptance": {k: acceptance(v) for k, v in steps.items()},
         **clock, "prompts": len(prompts), "new_tokens": n,
         "checkpoint": args.checkpoint, "heads": model.config.n_bpd_heads, "settings": cfg,
         "seconds": time.perf_counter() - t0}
    if args.json:
        print(json.dumps(r, indent=1))
    else:
        figures.print_sampled(r, model)
    return 0 if all(c["ok"] for c in check.values()) else 1


def acceptance(steps):
    """Share of the tried draft tokens that were accepted (what temperature takes away)."""
    tries = [ok for s in steps for _, _, _, ok in s["tries"]]
    return sum(tries) / max(1, len(tries))
