"""The demo, the command-line generator, the benchmark and the tuner behind `python minibpd.py`.

Every argument is checked before the first model call (`check_args`, then `check_decoders` once
the checkpoint is loaded). Block efficiency (tokens per serial model call) is exact and
machine-independent; wall-clock is measured as ratios inside one run, after a warm-up, as the
median of several repetitions, with their spread reported.
"""
import argparse
import importlib
import json
import os
import random
import statistics
import sys
import time

import torch

import analysis
import decoders
import figures
import lattice
from decoders import Resources, split_text
from minibpd import (CHECKPOINT, CheckpointError, bpd_decode, decode, encode, greedy_decode,
                     load_checkpoint, sample_decode, set_threads)

DTYPES = {"float32": torch.float32, "float64": torch.float64}
MAX_NEW_TOKENS = 100_000      # more is refused: greedy alone would run for minutes
TUNE_SIZE = (16, 128)         # the documented --tune run: prompts x new tokens


def load_plugins(argv):
    """Import each `--plugin MODULE` first: its decoders.register(...) calls then add decoders
    to every command, --help and --decoder included."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)   # --p is not --plugin
    pre.add_argument("--plugin", action="append", default=[])
    plugins = pre.parse_known_args(argv)[0].plugin
    if plugins and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())             # a student's module next to where they run
    for module in plugins:
        try:
            importlib.import_module(module)
        except ImportError as e:
            print(f"error: --plugin {module}: {e}", file=sys.stderr)
            raise SystemExit(2) from None


def parse_args(argv=None):
    load_plugins(argv)
    names = "\n".join(f"  {n:8s} {d.about}" for n, d in decoders.DECODERS.items())
    p = argparse.ArgumentParser(
        description="Exact blockwise parallel decoding with a tiny GPT.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"decoders (--decoder; the bench runs them all):\n  greedy   one token per call: "
               f"the reference\n{names}\n\nlimits: --max-new-tokens <= {MAX_NEW_TOKENS:,}; p-best's"
               f" DP holds at most min(k, V)^order x p <= {lattice.MAX_DP_CELLS:,} scores; order <= "
               f"{lattice.MAX_ORDER}; the KV cache (p rows) at most 1 GiB.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--demo", action="store_true", help="show greedy vs BPD vs refined drafts")
    mode.add_argument("--prompt", help="generate a continuation of this text")
    mode.add_argument("--bench", action="store_true", help="benchmark every decoder")
    mode.add_argument("--tune", action="store_true", help="choose k, p, alpha, order (tune split)")
    p.add_argument("--max-new-tokens", type=int, default=200, help="--demo, --prompt (demo: <= 160)")
    p.add_argument("--decoder", default="bpd", help="decoder for --prompt: greedy, " + ", ".join(decoders.DECODERS))
    p.add_argument("--plugin", metavar="MODULE", action="append", default=[],
                   help="import MODULE first: its decoders.register(...) calls add decoders")
    p.add_argument("--checkpoint", default=CHECKPOINT)
    p.add_argument("--tuned", metavar="FILE", help="tuned settings to read (--tune: to write); "
                   "default CHECKPOINT.tuned.json")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--threads", type=int, default=None, help="torch threads (default 1: fastest "
                   "here for this model size, see README)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; T > 0: "
                   "sample at T, every decoder exactly as sample_decode (--demo, --prompt, --bench)")
    p.add_argument("--seed", type=int, default=0, help="picks the demo prompt; seeds torch and "
                   "the sampling generator")
    p.add_argument("--heads", type=int, default=None, help="use only heads 1..N (default: all)")
    p.add_argument("--verify", default="auto", choices=["auto", "batch", "tree"], help="verify "
                   "several drafts as P rows (batch) or one token tree (tree); auto: tree when a "
                   "decoder drafts several (measured faster here)")
    p.add_argument("--json", action="store_true", help="--bench: print one JSON object only")
    p.add_argument("--text", help="--bench: take prompts from this UTF-8 file, not the test split")
    p.add_argument("--prompts", type=int, default=16, help="--bench, --tune: number of prompts")
    p.add_argument("--new-tokens", type=int, default=128, help="--bench, --tune: tokens per prompt")
    p.add_argument("--k", type=int, default=None, help="lattice width (default: tuned)")
    p.add_argument("--p", type=int, default=None, help="drafts verified per call by p-best")
    p.add_argument("--alpha", type=float, default=None, help="LM interpolation weight in [0, 1]")
    p.add_argument("--objective", default="block_efficiency", choices=analysis.OBJECTIVES,
                   help="--tune: what to maximise; tokens_per_s times every setting (machine-"
                   "specific: needs --tuned FILE)")
    p.add_argument("--sweep", action="store_true", help="--bench: sweep k, p, alpha, heads (tune split)")
    p.add_argument("--plot", metavar="DIR", help="--bench: also write PNG figures (needs matplotlib)")
    p.add_argument("--no-color", action="store_true")
    return p.parse_args(argv)


def resolve_device(name):
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but CUDA is not available; use --device cpu")
    return name


def drop_unknown(text, vocab):
    """-> (text without the characters the model does not know, how many were dropped)."""
    known = set(vocab)
    kept = "".join(c for c in text if c in known)
    return kept, len(text) - len(kept)


def overrides(args):
    return {"k": args.k, "p": args.p, "alpha": args.alpha}


def check_args(args):
    """Every check that needs no checkpoint, before anything is loaded or run."""
    for flag, value in (("--max-new-tokens", args.max_new_tokens), ("--new-tokens", args.new_tokens)):
        if not 1 <= value <= MAX_NEW_TOKENS:
            raise ValueError(f"{flag} must be from 1 to {MAX_NEW_TOKENS:,}, got {value}")
    if args.prompts < 1:
        raise ValueError(f"--prompts must be >= 1, got {args.prompts}")
    if not 0 <= args.seed < 2 ** 63:
        raise ValueError(f"--seed must be from 0 to 2**63 - 1, got {args.seed}")
    if args.prompt is not None and not args.prompt:
        raise ValueError("the prompt is empty: pass some text, e.g. --prompt 'The import statement'")
    if args.decoder != "greedy" and args.decoder not in decoders.DECODERS:
        raise ValueError(f"unknown decoder {args.decoder!r}; choose from greedy, {', '.join(decoders.DECODERS)}")
    given = {k: v for k, v in overrides(args).items() if v is not None}
    if not 0 <= args.temperature < float("inf"):
        raise ValueError(f"--temperature must be a number >= 0, got {args.temperature}")
    if args.tune and args.temperature:
        raise ValueError("--tune chooses settings for greedy decoding: drop --temperature")
    if args.tune and given:
        raise ValueError(f"--tune chooses {', '.join('--' + k for k in given)} itself; drop the flag")
    lattice.check_settings(**{k: v for k, v in given.items()})
    if args.plot:
        check_plot_dir(args.plot)
    if args.tune and args.objective == "tokens_per_s" and not args.tuned:
        raise ValueError("speed-tuned settings hold for this machine only: add --tuned FILE")
    if args.tune and (args.prompts, args.new_tokens) != TUNE_SIZE and not args.tuned:
        raise ValueError(f"a --tune run other than the documented --prompts {TUNE_SIZE[0]} "
                         f"--new-tokens {TUNE_SIZE[1]} writes only to a file you name: add --tuned FILE")


def check_plot_dir(folder):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError("--plot needs matplotlib, which is not installed: pip install matplotlib") from None
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--plot {folder}: cannot create that folder ({e.strerror})") from None
    if not os.access(folder, os.W_OK):
        raise ValueError(f"--plot {folder}: that folder is not writable")


def load(args):
    """(model, checkpoint, settings {decoder: settings}), all checked; no model call yet."""
    model, ck = load_checkpoint(args.checkpoint, resolve_device(args.device), DTYPES[args.dtype])
    if args.heads is not None:
        model = model.first_heads(args.heads)
    tuned = args.tuned or decoders.tuned_path(args.checkpoint)
    cfg = decoders.settings(decoders.load_tuned(tuned, args.checkpoint) if not args.tune else {},
                            overrides(args))
    return model, ck, cfg


def check_decoders(model, cfg, names):
    """Budgets need the model (its vocabulary bounds k, its size the cache): still no call."""
    for name in names:
        decoders.check(name, cfg[name], model)


def make_prompts(text, vocab, n, length=64):
    """n prompts of `length` characters, evenly spaced over `text`, each starting at a line."""
    if len(text) < 2 * length:
        raise ValueError(f"the prompt text has {len(text)} characters; need at least {2 * length}")
    prompts = []
    for i in range(n):
        pos = (len(text) - 2 * length) * i // max(1, n - 1) if n > 1 else 0
        nl = text.find("\n", pos, pos + length)
        pos = nl + 1 if nl >= 0 else pos
        prompts.append(encode(text[pos:pos + length], vocab))
    return prompts


def run_decoder(model, name, drafter, prompt, n, temperature=0.0, generator=None, verify="auto"):
    """-> (tokens, calls). 'greedy' is greedy_decode, 'sample' sample_decode; every other name
    is bpd_decode with the drafter."""
    if name == "greedy":
        return greedy_decode(model, prompt, n), n
    if name == "sample":
        return sample_decode(model, prompt, n, temperature, generator), n
    out, stats = bpd_decode(model, prompt, n, drafter, temperature, generator, verify)
    return out, stats["calls"]


def seconds(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def timings(model, named, prompts, n, reps=5, slow_reps=3, temperature=0.0, generator=None,
            verify="auto"):
    """Seconds per repetition of each decoder over all prompts: one warm-up, then `reps`
    repetitions for the baseline and bpd (`slow_reps` for the slower refined decoders, to keep
    the bench short), the decoders interleaved so that machine noise hits them alike."""
    run = lambda name, d, p, k: run_decoder(model, name, d, p, k, temperature, generator, verify)
    for name, d in named.items():
        run(name, d, prompts[0], min(n, 16))
    times = {name: [] for name in named}
    for r in range(reps):
        for name, d in named.items():
            if r < (reps if name in ("greedy", "sample", "bpd") else slow_reps):
                times[name].append(seconds(lambda: [run(name, d, p, n) for p in prompts]))
    return times


def tokens_per_s(times, tokens):
    return {name: tokens / statistics.median(t) for name, t in times.items()}


def timing_warnings(times, base="greedy"):
    """Why the wall-clock ratios of this run may mean little: too short, or too noisy."""
    out = []
    if statistics.median(times[base]) < 1.0:
        out.append(f"{base} ran {statistics.median(times[base]):.2f} s per repetition: too short "
                   "for wall-clock ratios to mean much (the defaults take about 3.5 s)")
    for name, t in times.items():
        spread = (max(t) - min(t)) / statistics.median(t)
        if spread > 0.25:
            out.append(f"{name}'s repetitions varied by {100 * spread:.0f}% of their median: the "
                       "machine is busy; its ratios are noisy")
    return out


def time_decoders(model, res, cfg, prompts, n, base, verify, temperature=0.0, generator=None):
    """The bench's wall-clock section: the baseline (greedy or sample) and every decoder that
    does not peek, timed in one run -> tokens_per_s, speedup_vs_<base>, timing_spread,
    timing_warnings, threads."""
    timed = {base: None, **{k: decoders.make(k, res, cfg[k]) for k, d in decoders.DECODERS.items()
                            if not d.peeks}}
    times = timings(model, timed, prompts, n, temperature=temperature, generator=generator,
                    verify=verify)
    tps = tokens_per_s(times, len(prompts) * n)
    return {"tokens_per_s": tps, f"speedup_vs_{base}": {k: v / tps[base] for k, v in tps.items()},
            "timing_spread": {k: {"min": min(t), "median": statistics.median(t), "max": max(t)}
                              for k, t in times.items()},
            "timing_warnings": timing_warnings(times, base), "threads": torch.get_num_threads()}


# ----------------------------------------------------------------------------- --prompt

def chosen_drafter(args, model, ck, cfg, prompt):
    """The --decoder's drafter (None for greedy), its settings checked and unused flags named,
    before any model call except the oracle's: it needs the greedy answer first."""
    if args.decoder == "greedy":
        return None
    s = cfg[args.decoder]
    unused = [f"--{k}" for k, v in overrides(args).items() if v is not None and k not in s]
    if unused:
        print(f"warning: {', '.join(unused)} does nothing for decoder {args.decoder} (its "
              f"settings: {', '.join(s) or 'none'})", file=sys.stderr)
    check_decoders(model, cfg, [args.decoder])
    peeks = decoders.DECODERS[args.decoder].peeks
    full = prompt + greedy_decode(model, prompt, args.max_new_tokens) if peeks else None
    return decoders.make(args.decoder, Resources(model, ck), s, full)


def generate(args):
    model, ck, cfg = load(args)
    prompt, n = encode(args.prompt, ck["vocab"]), args.max_new_tokens
    drafter = chosen_drafter(args, model, ck, cfg, prompt)
    greedy = greedy_decode(model, prompt, n)
    out, calls = run_decoder(model, args.decoder, drafter, prompt, n, verify=args.verify)
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
    heads = analysis.heads_along(model, full, plen)
    drafters = {name: decoders.make(name, res, cfg[name]) for name in ["bpd"] + decoders.refined()}
    print("\n  how the drafts are checked (• = head 1, the base model's own token; ✓ = equals "
          "greedy, kept; ✗ = first miss, the base model's token replaces it):")
    repeat = next((s for s in stats["steps"][limit:] if repaired(s)), None)
    for step in stats["steps"][:limit] + ([repeat] if repeat else []):
        known = step["context"]
        pending, m = known - 1, len(step["drafts"][0]) - 1
        if step is repeat:
            print("    ... later, a repeated token in BPD's draft, replaced by the refined drafts:")
        print(f"    after '…{show(full[max(0, known - 24):known - 1], vocab)}':")
        for name, drafter in drafters.items():
            d = drafter(heads[pending][:m + 1], full[:known])
            best = max(d, key=lambda x: analysis.marks(x, full, pending)[1])
            tick, ok = analysis.marks(best, full, pending)
            more = f" (best of {len(d)})" if len(d) > 1 else ""
            print(f"      {name:7s} '{show(best, vocab)}'  {tick}  +{ok}{more}")


def repaired(step):
    """BPD's first miss was a repeat of the token before it (Kim §6.1, §7.3). Our criterion: the
    paper counts improved drafts that repaired a repetition without defining it further."""
    d, j = step["drafts"][0], step["accepted"]
    return j < len(d) and d[j] == d[j - 1]


def demo(args):
    model, ck, cfg = load(args)
    check_decoders(model, cfg, decoders.DECODERS)
    vocab, n = ck["vocab"], min(args.max_new_tokens, 160)
    text = split_text(ck, "test")
    if len(text) < 160:
        raise ValueError(f"checkpoint {args.checkpoint} holds no test text for the demo; use --prompt")
    prompt = random.Random(args.seed).choice(make_prompts(text, vocab, 8, 80))
    res = Resources(model, ck)
    print(f"minibpd demo: {model.config.n_bpd_heads} BPD heads on a "
          f"{sum(p.numel() for p in model.parameters()):,}-parameter character GPT "
          f"({ck.get('corpus', {}).get('name', 'unknown corpus')}), "
          f"{next(model.parameters()).device}, {torch.get_num_threads()} thread(s)\n")
    print(f"prompt (test split): '{show(prompt, vocab)}'")
    greedy = greedy_decode(model, prompt, n)
    print(f"greedy, {n} calls: '{show(greedy, vocab)}'\n")
    all_same = True
    for name in decoders.DECODERS:
        drafter = decoders.make(name, res, cfg[name], prompt + greedy)
        out, stats = bpd_decode(model, prompt, n, drafter, verify=args.verify)
        all_same &= out == greedy
        if name == "bpd":
            bpd_stats = stats
        sets = ", ".join(f"{a}={b}" for a, b in cfg[name].items())
        print(f"  {name:7s} {stats['calls']:3d} calls, block efficiency {stats['block_efficiency']:.2f}"
              f"  {'identical to greedy ✓' if out == greedy else 'DIFFERENT from greedy ✗'}  {sets}")
    draw_steps(model, res, cfg, bpd_stats, prompt + greedy, len(prompt), vocab)
    times = timings(model, {"greedy": None, "bpd": decoders.make("bpd", res, {})}, [prompt], n, reps=3,
                    verify=args.verify)
    tps = tokens_per_s(times, n)
    print(f"\nwall-clock on this machine (median of 3): greedy {tps['greedy']:.0f} tok/s, "
          f"BPD {tps['bpd']:.0f} tok/s: {tps['bpd'] / tps['greedy']:.2f}x "
          "(`--bench` times every decoder)")
    return 0 if all_same else 1


# ----------------------------------------------------------------------------- --bench

def bench_prompts(ck, args):
    if not args.text:
        return make_prompts(split_text(ck, "test"), ck["vocab"], args.prompts)
    try:
        with open(args.text, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read --text {args.text} as UTF-8: {e}") from None
    text, dropped = drop_unknown(text, ck["vocab"])
    if dropped:
        print(f"warning: --text {args.text}: dropped {dropped:,} characters the model does not "
              "know", file=sys.stderr)
    return make_prompts(text, ck["vocab"], args.prompts)


def ngram_perplexities(res, ck, orders=(1, 2, 3, 4, 5)):
    """Held-out (test split) perplexity of the n-gram LM of each order, fitted on train."""
    test = encode(split_text(ck, "test"), ck["vocab"])
    return {str(o): res.ngram(o).perplexity(test) for o in orders}


def exactness(model, res, cfg, prompts, greedy, n, verify="auto"):
    """Decode every prompt with every decoder for real: block efficiency (tokens / calls over
    all prompts), identical-to-greedy, the runs' stats and the drafters' summed work counts."""
    be, same, runs, work = {"greedy": 1.0}, {"greedy": True}, {}, {}
    for name in decoders.DECODERS:
        runs[name], work[name], ok = [], {}, True
        for p, g in zip(prompts, greedy):
            drafter = decoders.make(name, res, cfg[name], p + g)
            out, stats = bpd_decode(model, p, n, drafter, verify=verify)
            runs[name].append(stats)
            ok = ok and out == g
            for key, v in getattr(drafter, "counts", {}).items():
                work[name][key] = work[name].get(key, 0) + v
        be[name], same[name] = analysis.block_eff(runs[name], n), ok
    return be, same, runs, work


def paper_sections(model, res, cfg, prompts, greedy, n, be, runs, work, tps):
    """Kim et al. §6-7 at small scale: repetition, head confidence, oracle headroom, relative
    gains, win/tie/loss and cost (see analysis.py)."""
    items = analysis.prepare(model, prompts, n, greedy)
    by_k = analysis.oracle_by_k(model, items, n, res)
    oracle_at = {name: by_k.get(str(cfg[name].get("k"))) or analysis.be_of(
        model, items, n, res, "oracle", {"k": cfg[name].get("k", 1)}) for name in decoders.refined()}
    return {"repetition": analysis.repetition_table(
                {k: v for k, v in runs.items() if not decoders.DECODERS[k].peeks}, items),
            **analysis.head_confidence(items), "oracle_by_k": by_k,
            "relative_gain": analysis.relative_gain(be, oracle_at),
            "win_tie_loss": analysis.win_tie_loss(items, runs["bpd"], res, cfg),
            "cost": analysis.cost(model, res, runs, work, prompts, n, tps)}


def bench(args):
    model, ck, cfg = load(args)
    check_decoders(model, cfg, decoders.DECODERS)
    prompts, n = bench_prompts(ck, args), args.new_tokens
    res = Resources(model, ck)
    t0 = time.perf_counter()
    greedy = [greedy_decode(model, p, n) for p in prompts]
    be, same, runs, work = exactness(model, res, cfg, prompts, greedy, n, args.verify)
    clock = time_decoders(model, res, cfg, prompts, n, "greedy", args.verify)
    tps = clock["tokens_per_s"]
    r = {"block_efficiency": be, "identical_to_greedy": same, **clock,
         "prompts": len(prompts), "new_tokens": n, "checkpoint": args.checkpoint,
         "heads": model.config.n_bpd_heads, "settings": cfg, "verify": args.verify,
         "verify_tokens": {k: analysis.verify_tokens(v) for k, v in runs.items()},
         "ngram_perplexity": ngram_perplexities(res, ck),
         **paper_sections(model, res, cfg, prompts, greedy, n, be, runs, work, tps)}
    if args.sweep:                  # on the tune split, at most 8 prompts x 96 tokens
        sn = min(96, n)
        tune_items = analysis.prepare(model, make_prompts(split_text(ck, "tune"), ck["vocab"],
                                                          min(8, args.prompts)), sn)
        r["sweep"] = analysis.sweep(model, tune_items, sn, res, cfg)
    r["seconds"] = time.perf_counter() - t0
    if args.json:
        print(json.dumps(r, indent=1))
    else:
        figures.print_report(r, model, color=not args.no_color and sys.stdout.isatty())
    if args.plot:
        print(f"wrote {', '.join(figures.plot(r, args.plot))} to {args.plot}", file=sys.stderr)
    return 0 if all(same.values()) else 1


def tune(args):
    """`python minibpd.py --tune`: choose each decoder's settings from its grid on the tune split
    (never the test split) and write them, keyed to this checkpoint, for the bench and demo."""
    model, ck, _ = load(args)
    res, n = Resources(model, ck), args.new_tokens
    out_path = args.tuned or decoders.tuned_path(args.checkpoint)
    prompts = make_prompts(split_text(ck, "tune"), ck["vocab"], args.prompts)
    t0 = time.perf_counter()
    items = analysis.prepare(model, prompts, n)
    print(f"tuning on the tune split: {len(prompts)} prompts x {n} tokens, for {args.objective}")

    def speed(name, s):                 # tokens/s of one timed decode of the tune prompts
        drafter = decoders.make(name, res, s)
        run_decoder(model, name, drafter, prompts[0], min(n, 16), verify=args.verify)  # warm-up
        return len(prompts) * n / seconds(lambda: [run_decoder(
            model, name, drafter, p, n, verify=args.verify) for p in prompts])
    chosen, scores = analysis.tune(model, items, n, res, objective=args.objective, speed=speed)
    out = {"settings": chosen, "checkpoint_sha256": decoders.file_sha256(args.checkpoint),
           "objective": args.objective,
           "tune_block_efficiency": scores, "prompts": len(prompts), "new_tokens": n,
           "seconds": round(time.perf_counter() - t0)}
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"chosen: {chosen}\nwrote {out_path} ({out['seconds']} s)")
    return 0


# ----------------------------------------------------------------------------- entry point

def main(argv=None):
    """The command line: every error a user can cause is one line on stderr and exit status 2."""
    args = parse_args(argv)
    try:
        check_args(args)                    # every check that needs no checkpoint, first
        set_threads(args.threads)
        torch.manual_seed(args.seed)
        if args.tune:
            return tune(args)
        if args.temperature > 0:            # sampling: sampled.py, the same commands at T
            import sampled
            return (sampled.bench if args.bench else sampled.generate if args.prompt is not None
                    else sampled.demo)(args)
        if args.bench:
            return bench(args)
        if args.prompt is not None:
            return generate(args)
        return demo(args)
    except (ValueError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:                 # e.g. `python minibpd.py --demo | head`
        sys.stderr.close()
        return 0
