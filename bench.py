"""The demo, the command-line generator and the benchmark behind `python minibpd.py`.

Block efficiency (tokens per serial model call) is exact and machine-independent; wall-clock is
measured as ratios inside one run, after a warm-up, as the median of several repetitions.
"""
import argparse
import json
import random
import statistics
import sys
import time

import torch

import analysis
import figures
from analysis import (REFINED, Resources, heads_along, make_drafter, marks, settings_for,
                      split_text)
from minibpd import (CHECKPOINT, ArgmaxDrafter, bpd_decode, decode, encode, greedy_decode,
                     load_checkpoint, resolve_device)

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Exact blockwise parallel decoding with a tiny GPT.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--demo", action="store_true", help="show greedy vs BPD vs refined drafts")
    mode.add_argument("--prompt", help="generate a continuation of this text")
    mode.add_argument("--bench", action="store_true", help="benchmark every decoder")
    mode.add_argument("--tune", action="store_true", help="choose k, p, alpha, order (tune split)")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--decoder", default="bpd", help="decoder for --prompt (see --bench for names)")
    p.add_argument("--checkpoint", default=CHECKPOINT)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--seed", type=int, default=0, help="picks the demo prompt; seeds torch")
    p.add_argument("--json", action="store_true", help="--bench: print one JSON object only")
    p.add_argument("--text", help="--bench: take prompts from this UTF-8 file, not the test split")
    p.add_argument("--prompts", type=int, default=16, help="--bench: number of prompts")
    p.add_argument("--new-tokens", type=int, default=128, help="--bench: tokens per prompt")
    p.add_argument("--k", type=int, default=None, help="lattice width (default: tuned)")
    p.add_argument("--p", type=int, default=None, help="drafts verified per call by p-best")
    p.add_argument("--alpha", type=float, default=None, help="LM interpolation weight in [0, 1]")
    p.add_argument("--sweep", action="store_true", help="--bench: sweep k, p, alpha, heads (tune split)")
    p.add_argument("--plot", metavar="DIR", help="--bench: also write PNG figures (needs matplotlib)")
    p.add_argument("--no-color", action="store_true")
    return p.parse_args(argv)


def load(args):
    """(model, checkpoint) on the requested device and dtype."""
    device = resolve_device(args.device)
    return load_checkpoint(args.checkpoint, device, DTYPES[args.dtype])


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


def run_decoder(model, name, drafter, prompt, n):
    """-> (tokens, calls). 'greedy' is greedy_decode; every other name is bpd_decode + drafter."""
    if name == "greedy":
        return greedy_decode(model, prompt, n), n
    out, stats = bpd_decode(model, prompt, n, drafter)
    return out, stats["calls"]


def seconds(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def timings(model, named, prompts, n, reps=5, slow_reps=3):
    """Tokens/s of each decoder over all prompts: one warm-up, then the median of `reps`
    repetitions for greedy and bpd (`slow_reps` for the slower refined decoders, to keep the
    bench short), the decoders interleaved so that machine noise hits them alike."""
    for name, d in named.items():
        run_decoder(model, name, d, prompts[0], min(n, 16))
    times = {name: [] for name in named}
    for r in range(reps):
        for name, d in named.items():
            if r < (reps if name in ("greedy", "bpd") else slow_reps):
                times[name].append(seconds(lambda: [run_decoder(model, name, d, p, n)
                                                    for p in prompts]))
    return {name: len(prompts) * n / statistics.median(t) for name, t in times.items()}


# ----------------------------------------------------------------------------- --prompt

def generate(args):
    model, ck = load(args)
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if not args.prompt:
        raise ValueError("the prompt is empty: pass some text, e.g. --prompt 'The import statement'")
    prompt, n = encode(args.prompt, ck["vocab"]), args.max_new_tokens
    greedy = greedy_decode(model, prompt, n)
    drafter = None
    if args.decoder != "greedy":
        cfg = settings_for(ck, args).get(args.decoder, {})
        drafter = make_drafter(args.decoder, Resources(model, ck), cfg, prompt + greedy)
    out, calls = run_decoder(model, args.decoder, drafter, prompt, n)
    print(args.prompt + decode(out, ck["vocab"]))
    print(f"[{args.decoder}: {len(out)} tokens in {calls} calls, block efficiency "
          f"{len(out) / calls:.2f}, identical to greedy: {'yes' if out == greedy else 'NO'}]",
          file=sys.stderr)
    return 0 if out == greedy else 1


# ----------------------------------------------------------------------------- --demo

def show(tokens, vocab):
    return decode(tokens, vocab).replace("\n", "⏎")


def draw_steps(model, res, cfg, stats, full, plen, vocab, limit=5):
    """The first BPD calls: the heads guess (predict), the base model checks (verify), the prefix
    equal to greedy is kept (accept; Stern §3); under each, the refined drafts from the same
    context and head log-probs (Kim §7), with the tokens each would have gained."""
    heads = heads_along(model, full, plen)
    drafters = {name: make_drafter(name, res, cfg.get(name)) for name in ["bpd"] + REFINED}
    print("\n  how the drafts are checked (• = head 1, the base model's own token; ✓ = equals "
          "greedy, kept; ✗ = first miss, the base model's token replaces it):")
    repeat = next((s for s in stats["steps"][limit:] if repaired(s, full)), None)
    for step in stats["steps"][:limit] + ([repeat] if repeat else []):
        known = step["context"]
        pending, m = known - 1, len(step["drafts"][0]) - 1
        if step is repeat:
            print("    ... later, a repeated token in BPD's draft, replaced by the refined drafts:")
        print(f"    after '…{show(full[max(0, known - 24):known - 1], vocab)}':")
        for name, drafter in drafters.items():
            d = drafter(heads[pending][:m + 1], full[:known])
            best = max(d, key=lambda x: marks(x, full, pending)[1])
            tick, ok = marks(best, full, pending)
            more = f" (best of {len(d)})" if len(d) > 1 else ""
            print(f"      {name:7s} '{show(best, vocab)}'  {tick}  +{ok}{more}")


def repaired(step, full):
    """BPD's first miss was a repeat of the token before it (Kim §6.1, §7.3)."""
    d, j = step["drafts"][0], step["accepted"]
    return j < len(d) and d[j] == d[j - 1]


def demo(args):
    model, ck = load(args)
    vocab, n = ck["vocab"], min(args.max_new_tokens, 160)
    prompt = random.Random(args.seed).choice(make_prompts(split_text(ck, "test"), vocab, 8, 80))
    res, cfg = Resources(model, ck), settings_for(ck, args)
    print(f"minibpd demo: {ck['config']['n_bpd_heads']} BPD heads on a "
          f"{sum(p.numel() for p in model.parameters()):,}-parameter character GPT "
          f"({ck['corpus']['name']}), {next(model.parameters()).device}\n")
    print(f"prompt (test split): '{show(prompt, vocab)}'")
    greedy = greedy_decode(model, prompt, n)
    print(f"greedy, {n} calls: '{show(greedy, vocab)}'\n")
    all_same = True
    for name in ["bpd"] + REFINED + ["oracle"]:
        out, stats = bpd_decode(model, prompt, n, make_drafter(name, res, cfg.get(name), prompt + greedy))
        all_same &= out == greedy
        if name == "bpd":
            bpd_stats = stats
        sets = ", ".join(f"{a}={b}" for a, b in (cfg.get(name) or {}).items())
        print(f"  {name:7s} {stats['calls']:3d} calls, block efficiency {stats['block_efficiency']:.2f}"
              f"  {'identical to greedy ✓' if out == greedy else 'DIFFERENT from greedy ✗'}  {sets}")
    draw_steps(model, res, cfg, bpd_stats, prompt + greedy, len(prompt), vocab)
    timed = {"greedy": None, "bpd": ArgmaxDrafter()}
    tps = timings(model, timed, [prompt], n, reps=3)
    print(f"\nwall-clock on this machine (median of 3): greedy {tps['greedy']:.0f} tok/s, "
          f"BPD {tps['bpd']:.0f} tok/s: {tps['bpd'] / tps['greedy']:.2f}x "
          "(`--bench` times every decoder)")
    return 0 if all_same else 1


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


def ngram_perplexities(res, ck, orders=(1, 2, 3, 4, 5)):
    """Held-out (test split) perplexity of the n-gram LM of each order, fitted on train."""
    test = encode(split_text(ck, "test"), ck["vocab"])
    return {str(o): res.ngram(o).perplexity(test) for o in orders}


def exactness(model, res, cfg, prompts, greedy, n, names):
    """Decode every prompt with every decoder for real: block efficiency (tokens / calls over
    all prompts), identical-to-greedy, and the runs' stats (for the cost and repetition tables)."""
    be, same, runs = {"greedy": 1.0}, {"greedy": True}, {}
    for name in names:
        runs[name], ok = [], True
        for p, g in zip(prompts, greedy):
            out, stats = bpd_decode(model, p, n, make_drafter(name, res, cfg.get(name), p + g))
            runs[name].append(stats)
            ok = ok and out == g
        be[name], same[name] = analysis.block_eff(runs[name], n), ok
    return be, same, runs


def paper_sections(model, res, cfg, prompts, greedy, n, be, runs, tps):
    """Kim et al. §6-7 at small scale: repetition, head confidence, oracle headroom, relative
    gains, win/tie/loss and cost (see analysis.py)."""
    items = analysis.prepare(model, prompts, n, greedy)
    by_k = analysis.oracle_by_k(model, items, n, res)
    oracle_at = {name: by_k.get(str(cfg[name]["k"])) or analysis.be_of(
        model, items, n, res, "oracle", {"k": cfg[name]["k"]}) for name in REFINED}
    return {"repetition": analysis.repetition_table(
                {k: v for k, v in runs.items() if k != "oracle"}, items),
            **analysis.head_confidence(items), "oracle_by_k": by_k,
            "relative_gain": analysis.relative_gain(be, oracle_at),
            "win_tie_loss": analysis.win_tie_loss(items, runs["bpd"], res, cfg),
            "cost": analysis.cost(model, res, cfg, runs, prompts, n, tps)}


def bench(args):
    model, ck = load(args)
    if args.new_tokens < 1:
        raise ValueError(f"--new-tokens must be >= 1, got {args.new_tokens}")
    prompts, n = bench_prompts(ck, args), args.new_tokens
    res, cfg = Resources(model, ck), settings_for(ck, args)
    t0 = time.perf_counter()
    greedy = [greedy_decode(model, p, n) for p in prompts]
    be, same, runs = exactness(model, res, cfg, prompts, greedy, n, ["bpd"] + REFINED + ["oracle"])
    timed = {"greedy": None, **{k: make_drafter(k, res, cfg.get(k)) for k in ["bpd"] + REFINED}}
    tps = timings(model, timed, prompts, n)
    r = {"block_efficiency": be, "identical_to_greedy": same, "tokens_per_s": tps,
         "speedup_vs_greedy": {k: v / tps["greedy"] for k, v in tps.items()},
         "prompts": len(prompts), "new_tokens": n, "checkpoint": args.checkpoint,
         "settings": cfg, "ngram_perplexity": ngram_perplexities(res, ck),
         **paper_sections(model, res, cfg, prompts, greedy, n, be, runs, tps)}
    if args.sweep:
        tune_items = analysis.prepare(model, make_prompts(split_text(ck, "tune"), ck["vocab"], 8), 96)
        r["sweep"] = analysis.sweep(model, tune_items, 96, res, cfg)
    r["seconds"] = time.perf_counter() - t0
    if args.json:
        print(json.dumps(r, indent=1))
    else:
        figures.print_report(r, model, color=not args.no_color and sys.stdout.isatty())
    if args.plot:
        figures.plot(r, args.plot)
    return 0 if all(same.values()) else 1


def tune(args):
    """`python minibpd.py --tune`: choose each method's k, p, alpha and n-gram order on the tune
    split (never the test split) and write them to CHECKPOINT.tuned.json for the bench."""
    model, ck = load(args)
    res, n = Resources(model, ck), args.new_tokens
    prompts = make_prompts(split_text(ck, "tune"), ck["vocab"], args.prompts)
    t0 = time.perf_counter()
    items = analysis.prepare(model, prompts, n)
    print(f"tuning on the tune split: {len(prompts)} prompts x {n} tokens")
    chosen, scores = analysis.tune(model, items, n, res)
    out = {"settings": chosen, "tune_block_efficiency": scores, "prompts": len(prompts),
           "new_tokens": n, "seconds": round(time.perf_counter() - t0)}
    with open(analysis.tuned_path(args.checkpoint), "w") as f:
        json.dump(out, f, indent=1)
    print(f"chosen: {chosen}\nwrote {analysis.tuned_path(args.checkpoint)} ({out['seconds']} s)")
    return 0
