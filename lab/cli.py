"""cli: the command line behind `python minibpd.py`: --demo, --prompt, --bench and --tune, at
temperature 0 (greedy: every decoder identical to it) or T > 0 (sampling: every decoder exact in
distribution).

Every argument is checked before the first model call (lab/checks.py: the flags alone, then
against the checkpoint's header, before any model is loaded; then the decoders' budgets once it
is); every error a user can cause is one line on stderr and exit status 2.
"""
import argparse
import functools
import importlib
import importlib.util
import json
import os
import random
import sys
import time

import torch

from lab import analysis
from lab import approximate
from lab import bench
from lab.checks import (DEMO_TOKENS, MAX_NEW_TOKENS, MAX_TEXT_BYTES, PROMPT_TOKENS, TASK_EXAMPLES,
                        SUBWORD_TASK_DECODERS, SUBWORD_TASK_EXAMPLES,
                        check_against_checkpoint, check_args, overrides, resolve_device)
import decoders
from decoders.budgets import MAX_DP_CELLS, MAX_ORDER
from lab import figures, figures_scale, figures_tasks
from lab import scale
from lab import tasks
from lab import trace
from lab.bench import make_prompts
from lab.run import Run
from decoders import Resources, baseline_name, split_text
from runtime.checkpoint import DTYPES, CheckpointError, file_sha256, read, train_kind
from runtime.corpus import decode, encode
from minibpd import greedy_decode
from runtime.checkpoint import build_model, family_module, load as load_fast
from runtime.contract import DrafterError
from runtime.loop import VERIFY_MODES
from runtime.threads import set_threads

PLUGINS = set()       # the module names import_plugin imported (a plug-in may be imported again)


def import_by_name(spec):
    """importlib.import_module(spec), but a module that is nowhere says where we looked and that
    a path to the .py file works (issue 43, trap 3: a bare ModuleNotFoundError said neither)."""
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as e:
        if e.name != spec.split(".")[0] and e.name != spec:
            raise                                    # the plug-in itself imports something missing
        raise ImportError(f"no module {spec!r} in the current directory ({os.getcwd()}) nor "
                          f"on Python's path; put {spec.split('.')[0]}.py in the folder you run "
                          f"from, or give its path, e.g. path/to/{spec.split('.')[-1]}.py") from None


def import_plugin(spec, taken_ok=False):
    """Import a student's module by name (looked up in the current directory first, then as any
    importable module) or by file path (`my_drafter.py`, `path/to/mine.py`). -> the module.
    A name taken by a module imported before (the project's `ngram`, `lattice`, Python's
    `json`, ...) is refused, naming it: importing would hand back that module, not run yours.
    taken_ok (--drafter minibpd:ArgmaxDrafter): such a module is handed back, unless a file of
    that name in the current directory (or at the path) is not it."""
    path = spec.endswith(".py") or os.sep in spec
    name = os.path.splitext(os.path.basename(spec))[0] if path else spec
    if not path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())             # a student's module next to where they run
    taken = sys.modules.get(name)
    if taken is not None and name not in PLUGINS:
        yours = os.path.abspath(spec) if path else own_file(spec)
        theirs = getattr(taken, "__file__", None)
        if not taken_ok or (yours is not None and not same_file(yours, theirs)):
            raise ImportError(f"the module name {name!r} is taken: {theirs or 'a built-in module'} "
                              f"is already imported, so {yours or 'your module'} would not run; "
                              f"rename yours (e.g. my_{name.split('.')[-1]}.py)")
        return taken
    if not path:
        module = import_by_name(spec)
        PLUGINS.add(name)
        return module
    where = importlib.util.spec_from_file_location(name, os.path.abspath(spec))
    if where is None or not os.path.isfile(spec):
        raise ImportError(f"no such file: {spec}")
    module = importlib.util.module_from_spec(where)
    sys.modules[name] = module
    PLUGINS.add(name)
    where.loader.exec_module(module)
    return module


def own_file(spec):
    """The file `import spec` finds in the current directory (a module or a package), or None."""
    base = os.path.join(os.getcwd(), *spec.split("."))
    return next((f for f in (base + ".py", os.path.join(base, "__init__.py")) if os.path.isfile(f)),
                None)


def same_file(a, b):
    return b is not None and os.path.realpath(a) == os.path.realpath(b)


def load_plugins(argv):
    """Import each `--plugin MODULE` first: its decoders.register(...) calls then add decoders
    to every command, --help and --decoder included. Any failure: one line naming the module."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)   # --p is not --plugin
    pre.add_argument("--plugin", action="append", default=[])
    for spec in pre.parse_known_args(argv)[0].plugin:
        try:
            import_plugin(spec)
        except (Exception, SystemExit) as e:  # ImportError, SyntaxError, register(), sys.exit()
            print(f"error: --plugin {spec}: {type(e).__name__}: {' '.join(str(e).split())}",
                  file=sys.stderr)
            raise SystemExit(2) from None


def epilog():
    w = decoders.label_width(decoders.DECODERS)
    listed = "\n".join(f"  {n:{w}s} {d.about}" for n, d in decoders.DECODERS.items())
    return (f"decoders (--decoder; the bench runs them all):\n  {'greedy':{w}s} one token per "
            f"call: the reference (sample at --temperature > 0)\n{listed}\n\nlimits: --max-new-tokens <= "
            f"{MAX_NEW_TOKENS:,}; p-best's DP holds at most min(k, V)^order x p <= "
            f"{MAX_DP_CELLS:,} scores; order <= {MAX_ORDER}; the KV cache (p rows) "
            f"at most 1 GiB; --text at most {MAX_TEXT_BYTES // 2 ** 20} MiB.")


def parse_args(argv=None):
    load_plugins(argv)
    p = argparse.ArgumentParser(description="Exact blockwise parallel decoding with a tiny GPT.",
                                allow_abbrev=False, epilog=epilog(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_modes(p)
    add_model_flags(p)
    add_run_flags(p)
    return p.parse_args(argv)


def add_modes(p):
    """What to do: one of these (none: --demo)."""
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--demo", action="store_true", help="show greedy vs BPD vs refined drafts")
    mode.add_argument("--prompt", help="generate a continuation of this text")
    mode.add_argument("--bench", action="store_true", help="benchmark every decoder")
    mode.add_argument("--tune", action="store_true", help="choose k, p, alpha, order (tune split)")
    mode.add_argument("--scale", action="store_true", help="the scale map: projected tokens/s of "
                      "every decoder for GPTs up to ~150x the shipped size, validated at its size")
    mode.add_argument("--tasks", action="store_true", help="per-task block efficiency and the paper's "
                      "analyses: the character model's five tasks (stored in its checkpoint, default "
                      "checkpoints/minibpd-tasks.pt), or SmolLM2's seven (--checkpoint "
                      "checkpoints/smollm2-heads.pt; built here, tasks.py); --prompts: examples per task")


def add_model_flags(p):
    """Which model, decoder and settings."""
    p.add_argument("--max-new-tokens", type=int, default=None, help=f"--prompt (default "
                   f"{PROMPT_TOKENS}), --demo (default and at most {DEMO_TOKENS})")
    p.add_argument("--decoder", default=None, help="decoder for --prompt (default bpd): greedy, "
                   + ", ".join(decoders.DECODERS) + f"; with --demo --trace: the decoder traced "
                   f"(default {trace.DEMO_DECODER})")
    p.add_argument("--plugin", metavar="MODULE", action="append", default=[],
                   help="import MODULE first: its decoders.register(...) calls add decoders")
    p.add_argument("--checkpoint", default=None, help="default: checkpoints/minibpd.pt "
                   "(--tasks: checkpoints/minibpd-tasks.pt)")
    p.add_argument("--tuned", metavar="FILE", help="tuned settings to read (--tune: to write); "
                   "default CHECKPOINT.tuned.json")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default=None, choices=list(DTYPES), help="default: the "
                   "checkpoint's (float32 for the character models); SmolLM2's is chosen for this "
                   "CPU at first load, by measurement (models/machine.py; int4, its 4-bit trunk "
                   "weights, where this torch has the kernel). The "
                   "character GPT takes float32 or float64 (bfloat16 is refused: it is not batch-"
                   "invariant, so BPD would not equal greedy); SmolLM2 (batch-invariant) takes all four")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default 1: fastest "
                   "for this model size, see docs/threads.md)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; T > 0: "
                   "sample at T, every decoder exactly as sample_decode (--demo, --prompt, --bench)")
    p.add_argument("--seed", type=int, default=0, help="picks the demo prompt; seeds torch and "
                   "the sampling generator")
    p.add_argument("--heads", type=int, default=None, help="use only heads 1..N (default: all; "
                   "SmolLM2's --demo and --prompt: the heads fastest on this CPU)")
    p.add_argument("--verify", default="auto", choices=VERIFY_MODES, help="verify several "
                   "drafts as P rows (batch) or one token tree (tree); auto: tree when a decoder "
                   "drafts several")
    p.add_argument("--reference", action="store_true", help="run the readable implementations "
                   "(each head through BPDHead.forward, lattice.best_paths, the plain neural "
                   "rescoring loop): the same tokens and steps, slower")
    p.add_argument("--k", type=int, default=None, help="lattice width (default: tuned)")
    p.add_argument("--p", type=int, default=None, help="drafts verified per call by p-best")
    p.add_argument("--alpha", type=float, default=None, help="LM interpolation weight in [0, 1]")
    p.add_argument("--copy", type=int, default=None, help="lookup, lookup_pbest: the most tokens "
                   "one copy drafts, past the heads' h - 1 (0: h - 1; transformers drafts 10)")
    p.add_argument("--nodes", type=int, default=None, help="pbest0, pbest, lookup, lookup_pbest: "
                   "the most drafted tokens in the token tree one call verifies (0: no budget)")
    p.add_argument("--accept", default="exact", metavar="RULE", help="--prompt: the acceptance "
                   "rule: exact (default) or an APPROXIMATE one of Stern §5 at temperature 0, topK "
                   "(a drafted token passes when among the base model's top K) or minB (every "
                   "step keeps at least B tokens): its output is NOT greedy decoding's")


def add_run_flags(p):
    """How much to run and what to print."""
    p.add_argument("--json", action="store_true", help="--bench, --tasks, --scale: print one JSON "
                   "object only")
    p.add_argument("--decoders", metavar="A,B", help="--bench, --tasks, --scale: run only these "
                   "decoders (and bpd, the comparison), e.g. --decoders lookup,pbest; default: "
                   f"all (--tasks on SmolLM2: {SUBWORD_TASK_DECODERS})")
    p.add_argument("--text", help="--bench: take prompts from this UTF-8 file, not the test split")
    p.add_argument("--prompts", type=int, default=None, help="--bench, --tune: number of prompts "
                   f"(default 16); --tasks: test examples per task (default {TASK_EXAMPLES}; SmolLM2: "
                   f"{SUBWORD_TASK_EXAMPLES})")
    p.add_argument("--new-tokens", type=int, default=None, help="--bench, --tune, --scale: tokens "
                   "per prompt (default 128)")
    p.add_argument("--objective", default=None, choices=analysis.OBJECTIVES,
                   help="--tune: what to maximise (default block_efficiency); tokens_per_s times "
                   "every setting (machine-specific: needs --tuned FILE)")
    p.add_argument("--force", action="store_true", help="--tune: overwrite a tuned file shipped "
                   "in checkpoints/, or one tuned for another checkpoint; --trace: overwrite a "
                   "file that is not a trace")
    p.add_argument("--trace", metavar="FILE.html", help="--prompt, --demo: write every step of "
                   "the run (drafts, lattice, verification, acceptance) as one self-contained page "
                   "to open in a browser; FILE.json: the same data as JSON (docs/trace.md)")
    p.add_argument("--sweep", action="store_true", help="--bench: sweep k, p, alpha, heads (tune split)")
    p.add_argument("--by-heads", action="store_true", help="--bench: time plain BPD on heads 1..k, "
                   "k = 1..h, beside greedy in one run (Stern §7.3, Fig. 4, Table 4; JSON: speedup_by_heads)")
    p.add_argument("--approximate", action="store_true", help="--bench: also run the APPROXIMATE "
                   f"acceptance rules {', '.join(approximate.RULES)} (Stern §5) on plain BPD's "
                   "drafts, in their own section (JSON: approximate) and never in "
                   "identical_to_greedy: their output is not greedy decoding's")
    p.add_argument("--plot", metavar="DIR", help="--bench, --tasks, --scale: also write PNG "
                   "figures (needs matplotlib)")
    p.add_argument("--no-color", action="store_true")


# ----------------------------------------------------------------------------- checks and loading

def load(args, used=None):
    """(model, checkpoint, {decoder: settings}, Resources), the settings of the decoders `used`
    (default: all) checked against the model's budgets; no model call yet."""
    # the lab's loader: FastGPT (minibpd.GPT's heads in one product) or another model family
    model, ck = load_fast(args.checkpoint, resolve_device(args.device), DTYPES.get(args.dtype))
    if args.heads is not None:
        model = model.first_heads(args.heads)
    else:                             # for speed in --prompt and --demo; the bench runs every head
        model = decoders.fastest_view(model, getattr(args, "heads_be", {}),
                                      args.mode in ("prompt", "demo"))
    chosen = decoders.settings(args.tuned_settings, overrides(args))    # read by the checks
    res = Resources(model, ck, reference=args.reference)    # --reference: the one switch
    build(decoders.active() if used is None else used, chosen, res)
    return res.model, ck, chosen, res


def build(names, chosen, res):
    """Check each decoder's settings against the model's budgets, and build its drafter (every
    drafter builds before any model call)."""
    for name in names:
        decoders.check(name, chosen[name], res.model)
        decoders.make(name, res, chosen[name])


def show(tokens, vocab):
    return decode(tokens, vocab).replace("\n", "⏎")


# ----------------------------------------------------------------------------- --prompt

def generate(args):
    """One continuation of --prompt with --decoder; at T = 0 checked against greedy."""
    T = args.temperature
    name = baseline_name(T) if args.decoder in decoders.BASELINES else args.decoder
    model, ck, chosen, res = load(args, [name] if name in decoders.DECODERS else [])
    if getattr(model, "machine", None):
        print(figures.machine_line(model).strip(), file=sys.stderr)
    prompt, n = encode(args.prompt, ck["vocab"]), args.max_new_tokens
    s = chosen.get(name, {})             # a flag it does not read: refused (checks.py)
    peeks = name in decoders.DECODERS and decoders.DECODERS[name].peeks
    greedy = greedy_decode(model, prompt, n) if T == 0 or peeks else None
    m = decoders.method(name, res, s, prompt + greedy if peeks else None, T, args.accept)
    if args.trace:                  # the same drafts; what its explain() says is kept
        m.drafter = trace.Recorder(m.drafter)
    approx = approximate.labelled(args.accept)      # top1, min1: the exact rule's tokens
    if approx:
        print(f"warning: --accept {args.accept} is APPROXIMATE (Stern §5): the text below is not "
              "greedy decoding's", file=sys.stderr)
    out, stats = m.decode(model, prompt, n, T, torch.Generator().manual_seed(args.seed), args.verify)
    print(args.prompt + decode(out, ck["vocab"]))
    how = (f"APPROXIMATE acceptance {args.accept}: NOT greedy's output, "
           f"{approximate.differing([out], [greedy]):.0%} of its tokens differ from greedy's" if approx
           else f"identical to greedy: {'yes' if out == greedy else 'NO'}" if T == 0 else
           f"sampled at temperature {T} (seed {args.seed})")
    print(f"[{name}: {len(out)} tokens in {stats['calls']} calls, block efficiency "
          f"{len(out) / stats['calls']:.2f}, {how}]", file=sys.stderr)
    if args.trace:
        print(trace.finish(args, model, ck, name, s, prompt, out, stats, m.drafter, greedy),
              file=sys.stderr)
    return 0 if T > 0 or approx or out == greedy else 1


# ----------------------------------------------------------------------------- --demo

def demo(args):
    """Every decoder on one test prompt (SmolLM2: an English and a Python request), the first BPD
    steps drawn, and greedy vs BPD timed."""
    t0 = time.perf_counter()
    model, ck, chosen, res = load(args, used=[])        # the drafters: those the demo runs, below
    family = family_module(ck)
    # A real model's demo leaves out its family's DEMO_SKIP (for time: issue 45's 45 s).
    skip = [k for k in decoders.active() if k in getattr(family, "DEMO_SKIP", ())]
    with decoders.select([k for k in decoders.active() if k not in skip]):
        build(decoders.active(), chosen, res)
        return show_demo(args, model, ck, chosen, res, family, t0, skip)


def show_demo(args, model, ck, chosen, res, family, t0, skip):
    """The demo, once loaded (demo)."""
    loaded = time.perf_counter() - t0
    vocab, T = ck["vocab"], args.temperature
    real = family is not None
    n = min(args.max_new_tokens, family.DEMO_TOKENS if real else DEMO_TOKENS)  # more: refused
    prompts = family.demo_prompts(vocab) if real else demo_prompts(args, ck, vocab)
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
            (draw_tries if T else draw_steps)(model, res, chosen, plain, prompt + greedy,
                                              len(prompt), vocab)
    base, prompt = baseline_name(T), prompts[0][1]
    methods = [decoders.Method(base), decoders.method(decoders.PLAIN, res, {})]
    once = Run(res, chosen, [prompt], n, T, verify=args.verify, generator=gen)
    tps = bench.tokens_per_s(bench.timings(once, methods, 3, warm_up=False), n)
    print(f"\nwall-clock on this machine (median of 3{', first prompt' if len(prompts) > 1 else ''}): "
          f"{base} {tps[base]:.0f} tok/s, BPD {tps[decoders.PLAIN]:.0f} tok/s: "
          f"{tps[decoders.PLAIN] / tps[base]:.2f}x (`--bench` times every decoder)"
          + figures.slower_hint(model, tps[decoders.PLAIN] / tps[base]))
    traced = trace.demo(args, model, ck, res, chosen, prompts[0][1], n)
    print(f"\n(load {loaded:.1f} s, decoding {time.perf_counter() - t0 - loaded:.1f} s)")
    print("\n" + traced)
    return 0 if all_same else 1


def demo_prompts(args, ck, vocab):
    """-> [(label, token ids)]: one prompt of the test split, chosen by --seed (a model family
    brings its own: its module's demo_prompts)."""
    text = split_text(ck, "test")
    if len(text) < 160:
        raise ValueError(f"checkpoint {args.checkpoint} holds no test text for the demo; use --prompt")
    prompt = random.Random(args.seed).choice(make_prompts(text, vocab, 8, 80))
    return [(f"(test split): '{show(prompt, vocab)}'", prompt)]


def demo_decoders(model, res, chosen, label, prompt, n, gen, args, names, left):
    """Greedy, then each decoder of `names` on one prompt, one line each (`left`: those left out,
    named). -> (greedy tokens, plain BPD's stats, whether every decoder matched greedy; at T > 0,
    True)"""
    T, vocab = args.temperature, res.ck["vocab"]
    print(f"prompt {label}" + (f" (not run here, for time: {', '.join(left)}; `--decoder NAME` "
                               "runs one)" if left else ""))
    greedy = greedy_decode(model, prompt, n)
    if T == 0:
        print(f"greedy, {n} calls: '{show(greedy, vocab)}'\n")
    all_same, plain, w = True, None, decoders.label_width(decoders.DECODERS)
    for name in names:
        m = decoders.method(name, res, chosen[name], prompt + greedy)
        out, stats = m.decode(model, prompt, n, T, gen, args.verify)
        all_same &= T > 0 or out == greedy
        plain = stats if name == decoders.PLAIN else plain
        sets = ", ".join(f"{a}={b}" for a, b in chosen[name].items())
        what = (f"'{show(out[:40], vocab)}…'" if T else
                f"{'identical to greedy ✓' if out == greedy else 'DIFFERENT from greedy ✗'}  {sets}")
        print(f"  {name:{w}s} {stats['calls']:3d} calls, block efficiency "
              f"{stats['block_efficiency']:.2f}  {what}")
    print()
    return greedy, plain, all_same


def draw_steps(model, res, chosen, stats, answer, plen, vocab, limit=5):
    """The first BPD calls: the heads guess (predict), the base model checks (verify), the prefix
    equal to greedy is kept (accept; Stern §3); under each, the refined drafts from the same
    context and head log-probs (Kim §7), with the tokens each would have gained."""
    heads = analysis.heads_along(model, answer, plen)
    drafters = {name: decoders.make(name, res, chosen[name])
                for name in [decoders.PLAIN] + decoders.refined()}
    print("\n  how the drafts are checked (• = head 1, the base model's own token; ✓ = equals "
          "greedy, kept; ✗ = first miss, the base model's token replaces it):")
    repeat = next((s for s in stats["steps"][limit:] if repaired(s)), None)
    w = decoders.label_width(drafters)
    for step in stats["steps"][:limit] + ([repeat] if repeat else []):
        known = step["context"]
        pending, m = known - 1, len(step["drafts"][0]) - 1
        if step is repeat:
            print("    ... later, a repeated token in BPD's draft, replaced by the refined drafts:")
        print(f"    after '…{show(answer[max(0, known - 24):known - 1], vocab)}':")
        for name, drafter in drafters.items():
            d = drafter(heads[pending][:m + 1], answer[:known])
            best = max(d, key=lambda x: analysis.marks(x, answer, pending)[1])
            tick, ok = analysis.marks(best, answer, pending)
            more = f" (best of {len(d)})" if len(d) > 1 else ""
            print(f"      {name:{w}s} '{show(best, vocab)}'  {tick}  +{ok}{more}")


def draw_tries(model, res, chosen, stats, answer, plen, vocab, limit=6):
    """At T > 0: BPD's first steps token by token: each draft token accepted with probability
    min(1, p/q) (p(d) for a deterministic draft), then a token sampled from what is left of p."""
    print("\n  how BPD's draft tokens are checked (✓ kept, ✗ rejected; then a token is sampled"
          " from what is left of p):")
    for step in stats["steps"][:limit]:
        tries = " ".join(f"'{show([tok], vocab)}' {'✓' if ok else '✗'} p={a:.2f}"
                         for _, tok, a, ok in step["tries"])
        print(f"    draft '{show(step['drafts'][0], vocab)}': {tries}  -> +{step['accepted']}")


def repaired(step):
    """BPD's first miss was a repeat of the token before it (Kim §6.1, §7.3). Our criterion: the
    paper counts improved drafts that repaired a repetition without defining it further."""
    d, j = step["drafts"][0], step["accepted"]
    return j < len(d) and d[j] == d[j - 1]


# ----------------------------------------------------------------------------- --bench, --tune

def bench_prompts(ck, args):
    """The prompts of --bench, --scale and --tune, from the text the checks read (prompt_text)."""
    return make_prompts(args.prompt_text, ck["vocab"], args.prompts)


def bench_run(args):
    """load(args), then the lab.run.Run of --bench, --scale and --tune: the bench's prompts x
    --new-tokens, at --temperature with --seed and --verify."""
    _, ck, chosen, res = load(args)
    return Run(res, chosen, bench_prompts(ck, args), args.new_tokens, args.temperature,
               args.seed, args.verify)


def bench_command(args):
    run = bench_run(args)
    r = bench.run_bench(run, args.sweep, args.by_heads)
    r.checkpoint = args.checkpoint
    if args.approximate:            # their own section: never in identical_to_greedy
        t0 = time.perf_counter()
        r.approximate = approximate.section(run)
        r.seconds += time.perf_counter() - t0
    if args.json:
        print(json.dumps(r.to_json(), indent=1))
    else:
        figures.print_report(r, run.model, color=not args.no_color and sys.stdout.isatty())
        if r.approximate:
            approximate.print_section(r.approximate, r.block_efficiency[decoders.PLAIN])
    if args.plot and not args.temperature:
        print(f"wrote {', '.join(figures.plot(r, args.plot))} to {args.plot}", file=sys.stderr)
    checks = r.identical_to_greedy.values() if r.identical_to_greedy else \
        [c["ok"] for c in r.distribution_check.values()]
    return 0 if all(checks) else 1


def tune_command(args):
    """`python minibpd.py --tune`: each decoder's settings from its grid on the tune split (never
    the test split), written with this checkpoint's sha256 for the bench and demo."""
    run = bench_run(args)
    out_path, prompts = args.tuned or decoders.tuned_path(args.checkpoint), run.prompts
    print(f"tuning on the tune split: {len(prompts)} prompts x {args.new_tokens} tokens, for "
          f"{args.objective}")
    t0 = time.perf_counter()
    chosen, scores = bench.tune_timed(run, args.objective)
    out = {"settings": chosen, "checkpoint_sha256": file_sha256(args.checkpoint),
           "plugins": args.plugin,           # a plug-in's decoder needs them to be read back
           "heads": run.model.config.n_bpd_heads, "objective": args.objective,
           "tune_block_efficiency": scores,
           "block_efficiency_by_heads": bench.analysis.be_by_heads(run),  # decoders.fastest_view
           "prompts": len(prompts), "new_tokens": args.new_tokens,
           "seconds": round(time.perf_counter() - t0)}
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"chosen: {chosen}\nwrote {out_path} ({out['seconds']} s)")
    return 0


def tasks_command(args):
    """`python minibpd.py --tasks`: Kim's per-task findings (bench.run_tasks) with the
    task-independent rescorers (the checkpoint's own) and an in-domain control (an n-gram LM
    fitted on the tasks' train examples, built by the running Python; the character model's small
    LM fine-tuned on them, stored). The character model runs the five tasks stored in its
    checkpoint; a subword model (SmolLM2) every task of tasks.TASKS, built here."""
    model, ck, chosen, res = load(args)          # it holds tasks: check_against_checkpoint
    subword = family_module(ck) is not None
    examples, python, text, small = subword_tasks(args, ck) if subword else char_tasks(args, ck, model)
    res_in = Resources(model, ck, small=small, reference=args.reference, text=text)
    log = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    r = bench.run_tasks(Run(res, chosen, verify=args.verify), examples, res_in, log,
                        bench.SUBWORD_TOKENS if subword else None, python,
                        ("neural",) if subword else ())     # its small LM: the base's early exit
    r.checkpoint = args.checkpoint
    if args.json:
        print(json.dumps(r.to_json(), indent=1))
    else:
        figures_tasks.print_tasks(r, color=not args.no_color and sys.stdout.isatty())
    if args.plot:
        print(f"wrote {', '.join(figures_tasks.plot_tasks(r, args.plot))} to {args.plot}", file=sys.stderr)
    return 0 if all(all(t.identical_to_greedy.values()) for t in r.tasks.values()) else 1


def char_tasks(args, ck, model):
    """The character model's tasks: the examples stored in its checkpoint (a note where this
    Python builds others), the in-domain text and its stored in-domain small LM."""
    for name in ck["tasks"]["tasks"]:
        if (w := tasks.compare(ck["tasks"], name, "test")):
            print(f"note: {w} (the stored examples are used)", file=sys.stderr)
    text = "".join(p + t + "\n\n" for name in ck["tasks"]["tasks"]          # in-domain: the train
                   for p, t in tasks.build(name, "train", ck["vocab"]))        # split, built here
    small = build_model(ck["rescorer_config"], ck["rescorer_tasks"], model.lm_head.weight.device,
                        model.lm_head.weight.dtype, "its in-domain rescorer", args.checkpoint,
                        train_kind(ck))
    return bench.task_examples(ck, args.prompts), ck["tasks"].get("python"), text, small


def subword_tasks(args, ck):
    """A subword model's tasks: every task built by the running Python (bench.built_tasks), the
    in-domain text (the tasks' train examples, as the model reads them); its own small LM."""
    vocab = ck["vocab"]
    text = "".join(bench.as_prompt(name, p, vocab) + t + "\n\n" for name in tasks.TASKS
                   for p, t in tasks.build(name, "train"))
    return bench.built_tasks(vocab, args.prompts), sys.version, text, None


def scale_command(args):
    """`python minibpd.py --scale`: the scale map (scale.py) for the bench's prompts and settings."""
    run = bench_run(args)
    log = (lambda s: print(s, file=sys.stderr)) if args.json else print
    r = scale.scale_map(run, device=resolve_device(args.device), log=log)
    r["checkpoint"] = args.checkpoint
    if args.json:
        print(json.dumps(r, indent=1))
    else:
        figures_scale.print_scale(r)
    if args.plot:
        print(f"wrote {figures_scale.plot_scale(r, args.plot)} to {args.plot}", file=sys.stderr)
    return 0 if all(r["identical_to_greedy"].values()) else 1


def interruptible(command):
    """Ctrl-C (or a KeyboardInterrupt a plug-in or a drafter raises) ends the command with one
    line, "interrupted", and exit status 130 (the shell's for SIGINT), not a traceback."""
    @functools.wraps(command)
    def run(argv=None):
        try:
            return command(argv)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
    return run


@interruptible
def main(argv=None):
    """The command line: every error a user can cause is one line on stderr and exit status 2."""
    args = parse_args(argv)
    try:
        check_args(args)                    # every check that needs no checkpoint, first
        set_threads(args.threads)
        torch.manual_seed(args.seed)
        check_against_checkpoint(args, read(args.checkpoint, needs=("config",)))   # no model yet
        if args.tune:
            return tune_command(args)
        with decoders.select(decoders.parse_selection(args.decoders)):
            if args.bench:
                return bench_command(args)
            if args.tasks:
                return tasks_command(args)
            if args.scale:
                return scale_command(args)
        if args.prompt is not None:
            return generate(args)
        return demo(args)
    except (ValueError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except DrafterError as e:               # a plug-in drafter failed while decoding
        print(f"error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:                 # e.g. `python minibpd.py --demo | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
