"""The demo, the command-line generator and the benchmark behind `python minibpd.py`.

Block efficiency (tokens per serial model call) is exact and machine-independent; wall-clock is
measured as ratios inside one run, after a warm-up, as the median of several repetitions.
"""
import json
import random
import statistics
import sys
import time

import torch

from minibpd import (ArgmaxDrafter, bpd_decode, decode, encode, greedy_decode, load_checkpoint,
                     resolve_device)

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def load(args):
    """(model, checkpoint) on the requested device and dtype."""
    device = resolve_device(args.device)
    return load_checkpoint(args.checkpoint, device, DTYPES[args.dtype])


def split_text(ck, name):
    """A split's text from the checkpoint (saved at training time, so it never depends on which
    Python's pydoc_data is installed here)."""
    return ck.get("splits", {}).get(name) or ""


def make_prompts(text, vocab, n, length=64):
    """n prompts of `length` characters, evenly spaced over `text`, each starting at a line."""
    if n < 1:
        raise ValueError(f"--prompts must be >= 1, got {n}")
    if len(text) < 2 * length:
        raise ValueError(f"the prompt text has {len(text)} characters; need at least {2 * length}")
    prompts = []
    for i in range(n):
        pos = (len(text) - 2 * length) * i // max(1, n - 1) if n > 1 else 0
        nl = text.find("\n", pos, pos + length)
        pos = nl + 1 if nl >= 0 else pos
        prompts.append(encode(text[pos:pos + length], vocab))
    return prompts


def drafters(model, ck, args):
    """name -> drafter for every decoder this checkpoint supports (more arrive with lattice.py)."""
    return {"bpd": ArgmaxDrafter()}


def run_decoder(model, name, drafter, prompt, n):
    """-> (tokens, calls). 'greedy' is greedy_decode; every other name is bpd_decode + drafter."""
    if name == "greedy":
        return greedy_decode(model, prompt, n), n
    out, stats = bpd_decode(model, prompt, n, drafter)
    return out, stats["calls"]


def median_time(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def timings(model, named, prompts, n, reps=5):
    """Tokens/s of each decoder over all prompts: one warm-up, then the median of `reps`
    repetitions, the decoders interleaved so that machine noise hits them alike."""
    for name, d in named.items():
        run_decoder(model, name, d, prompts[0], min(n, 16))
    times = {name: [] for name in named}
    for _ in range(reps):
        for name, d in named.items():
            times[name].append(median_time(lambda: [run_decoder(model, name, d, p, n)
                                                    for p in prompts], 1))
    return {name: len(prompts) * n / statistics.median(t) for name, t in times.items()}


# ----------------------------------------------------------------------------- --prompt

def generate(args):
    model, ck = load(args)
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if not args.prompt:
        raise ValueError("the prompt is empty: pass some text, e.g. --prompt 'The import statement'")
    prompt = encode(args.prompt, ck["vocab"])
    named = drafters(model, ck, args)
    if args.decoder not in named and args.decoder != "greedy":
        raise ValueError(f"unknown --decoder {args.decoder!r}; choose from greedy, {', '.join(named)}")
    out, calls = run_decoder(model, args.decoder, named.get(args.decoder), prompt, args.max_new_tokens)
    same = out == greedy_decode(model, prompt, args.max_new_tokens)
    print(args.prompt + decode(out, ck["vocab"]))
    print(f"[{args.decoder}: {len(out)} tokens in {calls} calls, block efficiency "
          f"{len(out) / calls:.2f}, identical to greedy: {'yes' if same else 'NO'}]", file=sys.stderr)
    return 0 if same else 1


# ----------------------------------------------------------------------------- --demo

def show(tokens, vocab):
    return decode(tokens, vocab).replace("\n", "⏎")


def draw_steps(stats, vocab, greedy_seq, limit=6):
    """Draft vs accepted for the first calls: the heads guess, the base model checks, the prefix
    that equals greedy is kept (Stern §3: predict, verify, accept)."""
    print("\n  how BPD decodes (• = head 1, the base model's own token; ✓ = equals greedy):")
    for i, step in enumerate(stats["steps"][:limit]):
        draft = step["drafts"][step["winner"]]
        ctx, kept = step["context"], step["accepted"]
        truth = greedy_seq[ctx - 1:ctx - 1 + len(draft)]
        marks = "•" + "".join("✓" if j < kept else ("✗" if j == kept else "·")
                              for j in range(1, len(draft)))
        print(f"    call {i + 2}: draft '{show(draft, vocab)}'  {marks}  kept '{show(draft[:kept], vocab)}'"
              f" (+ base model's next: '{show(truth[kept:kept + 1], vocab)}')")


def demo(args):
    model, ck = load(args)
    vocab, n = ck["vocab"], min(args.max_new_tokens, 160)
    text = split_text(ck, "test")
    prompt = random.Random(args.seed).choice(make_prompts(text, vocab, 8, 80))
    print(f"minibpd demo: {ck['config']['n_bpd_heads']} BPD heads on a "
          f"{sum(p.numel() for p in model.parameters()):,}-parameter character GPT "
          f"({ck['corpus']['name']}), {next(model.parameters()).device}\n")
    print(f"prompt (test split): {show(prompt, vocab)!r}")
    greedy = greedy_decode(model, prompt, n)
    print(f"\ngreedy ({n} calls): {show(greedy, vocab)!r}")
    out, stats = bpd_decode(model, prompt, n)
    ok = "identical to greedy ✓" if out == greedy else "DIFFERENT from greedy ✗"
    print(f"BPD    ({stats['calls']} calls): block efficiency {stats['block_efficiency']:.2f}, {ok}")
    draw_steps(stats, vocab, prompt + greedy)
    named = {"greedy": None, "bpd": ArgmaxDrafter()}
    tps = timings(model, named, [prompt], n, reps=3)
    print(f"\nwall-clock (median of 3, this machine): greedy {tps['greedy']:.0f} tok/s, "
          f"BPD {tps['bpd']:.0f} tok/s: {tps['bpd'] / tps['greedy']:.2f}x")
    return 0 if out == greedy else 1


# ----------------------------------------------------------------------------- --bench

def bench_prompts(ck, args):
    if args.text:
        try:
            with open(args.text, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"cannot read --text {args.text} as UTF-8: {e}") from None
    else:
        text = split_text(ck, "test")
    return make_prompts(text, ck["vocab"], args.prompts)


def bench(args):
    model, ck = load(args)
    if args.new_tokens < 1:
        raise ValueError(f"--new-tokens must be >= 1, got {args.new_tokens}")
    prompts, n = bench_prompts(ck, args), args.new_tokens
    named = drafters(model, ck, args)
    greedy = [greedy_decode(model, p, n) for p in prompts]
    be, same = {"greedy": 1.0}, {"greedy": True}
    for name, d in named.items():
        outs = [run_decoder(model, name, d, p, n) for p in prompts]
        be[name] = len(prompts) * n / sum(c for _, c in outs)
        same[name] = all(o == g for (o, _), g in zip(outs, greedy))
    tps = timings(model, {"greedy": None, **named}, prompts, n)
    result = {"block_efficiency": be, "identical_to_greedy": same, "tokens_per_s": tps,
              "speedup_vs_greedy": {k: v / tps["greedy"] for k, v in tps.items()},
              "prompts": len(prompts), "new_tokens": n, "checkpoint": args.checkpoint}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{len(prompts)} prompts x {n} new tokens, {args.checkpoint}, "
              f"{next(model.parameters()).device}\n")
        print(f"  {'decoder':10s} {'block eff.':>10s} {'= greedy':>9s} {'tok/s':>8s} {'speedup':>8s}")
        for k in be:
            print(f"  {k:10s} {be[k]:10.3f} {'yes' if same[k] else 'NO':>9s} {tps[k]:8.0f} "
                  f"{tps[k] / tps['greedy']:7.2f}x")
    return 0 if all(same.values()) else 1
