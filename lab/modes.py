"""modes: the command line's other modes, each a function of the parsed flags -> exit status:
--prompt (one continuation, checked against greedy), --bench, --tune (writes the tuned file),
--tasks and --scale. Their work is done by bench.py, task_runs.py and scale.py; here they are
loaded, run and printed.
"""
import json
import sys
import time

import torch

from lab import approximate
from lab import bench
from lab import figures
from lab import figures_scale
from lab import figures_tasks
from lab import scale
from lab import task_runs
from lab import tasks
from lab import trace
from lab.checks import resolve_device
from lab.loading import load_mode
from lab.run import Run
import decoders
from minibpd import greedy_decode
from runtime.checkpoint import build_model, family_module, file_sha256, train_kind
from runtime.corpus import decode, encode


# ----------------------------------------------------------------------------- --prompt

def prompt_command(args):
    """One continuation of --prompt with --decoder; at T = 0 checked against greedy."""
    T = args.temperature
    name = decoders.baseline_name(T) if args.decoder in decoders.BASELINES else args.decoder
    model, ck, chosen, res = load_mode(args, [name] if name in decoders.DECODERS else [])
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


# ----------------------------------------------------------------------------- --bench, --tune

def bench_run(args):
    """load_mode(args), then the lab.run.Run of --bench, --scale and --tune: the bench's prompts
    (from the text the checks read, prompt_text) x --new-tokens, at --temperature with --seed and
    --verify."""
    _, ck, chosen, res = load_mode(args)
    prompts = bench.make_prompts(args.prompt_text, ck["vocab"], args.prompts)
    return Run(res, chosen, prompts, args.new_tokens, args.temperature, args.seed, args.verify)


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
    """`python minibpd.py --tasks`: Kim's per-task findings (task_runs.run_tasks) with the
    task-independent rescorers (the checkpoint's own) and an in-domain control (an n-gram LM
    fitted on the tasks' train examples, built by the running Python; the character model's small
    LM fine-tuned on them, stored). The character model runs the five tasks stored in its
    checkpoint; a subword model (SmolLM2) every task of tasks.TASKS, built here."""
    model, ck, chosen, res = load_mode(args)          # it holds tasks: check_against_checkpoint
    subword = family_module(ck) is not None
    examples, python, text, small = subword_tasks(args, ck) if subword else char_tasks(args, ck, model)
    res_in = decoders.Resources(model, ck, small=small, reference=args.reference, text=text)
    log = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    r = task_runs.run_tasks(Run(res, chosen, verify=args.verify), examples, res_in, log,
                            task_runs.SUBWORD_TOKENS if subword else None, python,
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
    return task_runs.task_examples(ck, args.prompts), ck["tasks"].get("python"), text, small


def subword_tasks(args, ck):
    """A subword model's tasks: every task built by the running Python (task_runs.built_tasks), the
    in-domain text (the tasks' train examples, as the model reads them); its own small LM."""
    vocab = ck["vocab"]
    text = "".join(task_runs.as_prompt(name, p, vocab) + t + "\n\n" for name in tasks.TASKS
                   for p, t in tasks.build(name, "train"))
    return task_runs.built_tasks(vocab, args.prompts), sys.version, text, None


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
