"""checks: every check of the command line before any model is loaded: `check_flags` (the flags
alone) and, once the checkpoint's header is read, `check_against_checkpoint` (the flags against
it). Every refusal is a ValueError (or a CheckpointError), one line on stderr and exit status 2.
"""
import json
import os
import sys

import torch

import decoders
from lab import approximate, bench, trace
from lab import task_runs
from minibpd import is_int
from decoders.lookup import check_copy
from decoders.budgets import check_settings
from runtime.checkpoint import (CHECKPOINT, CHECKPOINTS, DTYPES, dtype_of, family_module,
                                file_sha256, outline)
from runtime.corpus import check_unicode, encode, to_vocab
from train_heads import writable

MAX_NEW_TOKENS = 100_000      # more is refused: greedy alone would run for minutes
TUNE_SIZE = (16, 128)         # the documented --tune run: prompts x new tokens
MAX_DEMO_TOKENS = 160         # the demo's most new tokens (its text fits a terminal)
DEFAULT_PROMPT_TOKENS = 200   # --prompt's default
TASK_EXAMPLES = 32            # --tasks: test examples per task (the run takes minutes)
SUBWORD_TASK_EXAMPLES = 5     # ... on SmolLM2 (a call costs ~100x the character model's), and
SUBWORD_TASK_DECODERS = "neural,ngram,pbest,lookup,lookup_pbest"   # its decoders (and bpd): not
# sampled (bpd's drafts at T = 0), pbest0 (pbest without the LM) nor oracle (replayed by k)
TASKS_CHECKPOINT = os.path.join(os.path.dirname(CHECKPOINT), "minibpd-tasks.pt")
MAX_TEXT_BYTES = 64 * 2 ** 20  # --text: more is refused (the bench needs --prompts x 64 characters)


def overrides(args):
    return {"k": args.k, "p": args.p, "alpha": args.alpha, "copy": args.copy, "nodes": args.nodes}


MODES = ("demo", "prompt", "bench", "tune", "scale", "tasks")
# Each flag that only some modes read -> those modes; given to another, it is refused.
APPLIES = {"max_new_tokens": ("demo", "prompt"), "decoder": ("prompt", "demo"),
           "json": ("bench", "tasks", "scale"), "text": ("bench", "scale"),
           "prompts": ("bench", "tune", "scale", "tasks"), "new_tokens": ("bench", "tune", "scale"),
           "objective": ("tune",), "sweep": ("bench",), "by_heads": ("bench",),
           "plot": ("bench", "tasks", "scale"),
           "force": ("tune", "demo", "prompt"), "approximate": ("bench",),
           "trace": ("demo", "prompt")}     # --decoder, --force with --demo, --prompt: check_trace
DEFAULTS = {"decoder": "bpd", "new_tokens": TUNE_SIZE[1], "objective": "block_efficiency"}


def check_modes(args):
    """Every flag a mode would ignore is refused (APPLIES; --verify with --scale, --sweep and
    --plot when sampling); then the defaults that depend on the mode are set."""
    mode = args.mode = next((m for m in MODES[1:] if getattr(args, m) not in (None, False)),
                            "demo")                      # the mode asked for; none: the demo
    for name, modes in APPLIES.items():
        if mode not in modes and getattr(args, name) not in (None, False):
            flag = "--" + name.replace("_", "-")
            hint = f"; --{mode} takes --new-tokens" if name == "max_new_tokens" else ""
            raise ValueError(f"{flag} does nothing with --{mode} (it applies to "
                             f"{', '.join('--' + m for m in modes)}): drop it{hint}")
    if mode == "scale" and args.verify != "auto":
        raise ValueError(f"--scale times every decoder with its own verification (auto: a token "
                         f"tree for several drafts): drop --verify {args.verify}")
    for flag in ("sweep", "plot", "by_heads"):
        if mode == "bench" and args.temperature and getattr(args, flag):
            flag = flag.replace("_", "-")
            raise ValueError(f"--{flag} draws on the greedy bench (temperature 0): drop --{flag} "
                             "or --temperature")
    for name, value in DEFAULTS.items():
        setattr(args, name, value if getattr(args, name) is None else getattr(args, name))
    if args.checkpoint is None:
        args.checkpoint = TASKS_CHECKPOINT if args.tasks else CHECKPOINT
    args.prompts_given = args.prompts is not None
    if args.prompts is None:
        args.prompts = TASK_EXAMPLES if args.tasks else TUNE_SIZE[0]
    args.tokens_given = args.max_new_tokens is not None
    if args.max_new_tokens is None:
        args.max_new_tokens = MAX_DEMO_TOKENS if mode == "demo" else DEFAULT_PROMPT_TOKENS


def check_approximate(args):
    """--accept RULE (--prompt only; --approximate, --bench only, is in APPLIES): temperature 0
    only, and never where it would do nothing."""
    if approximate.check_spec(args.accept):
        if args.prompt is None:
            raise ValueError(f"--accept {args.accept} works with --prompt only (--bench "
                             "--approximate runs the approximate rules)")
        if args.temperature:
            raise ValueError(f"--accept {args.accept} is an approximate rule for greedy decoding "
                             "only: drop --temperature (sampling keeps the exact rule)")
        if args.decoder in decoders.BASELINES:
            raise ValueError(f"--decoder {args.decoder} drafts nothing for --accept "
                             f"{args.accept} to accept: choose a BPD decoder (e.g. bpd)")
    if args.approximate and args.temperature:
        raise ValueError("--approximate runs approximate rules for greedy decoding only: drop "
                         "--temperature (sampling keeps the exact rule)")


def check_flags(args):
    """Every check that needs no checkpoint, before anything is loaded or run."""
    decoder = args.decoder                # None unless given (check_modes sets the default)
    check_modes(args)
    check_trace(args, decoder)
    check_approximate(args)
    for flag, value in (("--max-new-tokens", args.max_new_tokens), ("--new-tokens", args.new_tokens)):
        if not 1 <= value <= MAX_NEW_TOKENS:
            raise ValueError(f"{flag} must be from 1 to {MAX_NEW_TOKENS:,}, got {value}")
    if args.mode == "demo" and args.max_new_tokens > MAX_DEMO_TOKENS:
        raise ValueError(f"--demo shows at most {MAX_DEMO_TOKENS} new tokens, got "
                         f"--max-new-tokens {args.max_new_tokens}; use --prompt TEXT for longer "
                         "generations")
    if args.prompts < 1:
        raise ValueError(f"--prompts must be >= 1, got {args.prompts}")
    if not 0 <= args.seed < 2 ** 63:
        raise ValueError(f"--seed must be from 0 to 2**63 - 1, got {args.seed}")
    if args.prompt is not None and not args.prompt:
        raise ValueError("the prompt is empty: pass some text, e.g. --prompt 'The import statement'")
    if args.decoder not in decoders.names(args.temperature) + list(decoders.BASELINES):
        raise ValueError(f"unknown decoder {args.decoder!r}; choose from {', '.join(decoders.names())}")
    if args.decoders is not None and args.mode not in ("bench", "tasks", "scale"):
        raise ValueError("--decoders chooses what --bench, --tasks or --scale run; --decoder "
                         "(one) picks what --prompt runs")
    given = {k: v for k, v in overrides(args).items() if v is not None}
    if not 0 <= args.temperature < float("inf"):
        raise ValueError(f"--temperature must be a number >= 0, got {args.temperature}")
    if args.mode in ("tune", "scale", "tasks") and args.temperature:
        raise ValueError(f"--{args.mode} measures greedy decoding: drop --temperature")
    if args.tune and given:
        raise ValueError(f"--tune chooses {', '.join('--' + k for k in given)} itself; drop the flag")
    if "copy" in given:
        try:
            check_copy(given["copy"])
        except ValueError as e:
            raise ValueError(f"--copy: {e}") from None
    check_decoder_flags(args, given)
    check_settings(**{k: v for k, v in given.items() if k != "copy"})   # budgets: later
    if args.plot:
        check_plot_dir(args.plot)
    if args.tune and args.objective == "tokens_per_s" and not args.tuned:
        raise ValueError("speed-tuned settings hold for this machine only: add --tuned FILE")
    documented = (args.prompts, args.new_tokens) == TUNE_SIZE and args.heads is None
    if args.tune and not documented and not args.tuned:
        raise ValueError(f"a --tune run other than the documented --prompts {TUNE_SIZE[0]} "
                         f"--new-tokens {TUNE_SIZE[1]} (all heads) writes only to a file you name: "
                         "add --tuned FILE")


def check_trace(args, decoder):
    """--trace FILE (--demo, --prompt; lab/trace.py checks the file): a decoder that drafts (the
    demo's: --decoder, default pbest), --force only to overwrite a file that is not a trace, and
    a warning where the run may make more calls than a page shows."""
    mode = args.mode
    if args.trace is None:
        if mode == "demo" and decoder is not None:
            raise ValueError("--decoder does nothing with --demo without --trace (it picks the "
                             "decoder --trace FILE.html shows): add --trace, or run one decoder "
                             "with --prompt TEXT --decoder NAME")
        if args.force and mode in ("demo", "prompt"):
            raise ValueError(f"--force does nothing with --{mode} (it applies to --tune, and to "
                             "--trace FILE: overwrite a file that is not a trace): drop it")
        return
    if mode == "demo":
        args.decoder = decoder or trace.DEMO_DECODER
    if args.decoder in decoders.BASELINES:
        raise ValueError(f"--trace shows BPD's steps and --decoder {args.decoder} drafts nothing "
                         "(one token per call): choose a decoder, e.g. --decoder pbest")
    trace.check_path(args.trace, args.force)
    if args.max_new_tokens > trace.MAX_STEPS:
        print(f"warning: --trace shows the first {trace.MAX_STEPS:,} steps of a run; this one may "
              f"make up to {args.max_new_tokens:,} calls (the page says how many it shows)",
              file=sys.stderr)


def check_decoder_flags(args, given):
    """Settings flags the run's decoders would ignore are refused: --k with --prompt --decoder bpd
    (whose settings are none), and --tasks without a decoder that refines BPD's drafts (its
    tables compare refinements with bpd)."""
    if args.mode == "prompt":
        name = decoders.baseline_name(args.temperature) if args.decoder in decoders.BASELINES \
            else args.decoder
        s = decoders.DECODERS[name].defaults if name in decoders.DECODERS else {}
        unused = [f"--{k}" for k in given if k not in s]
        if unused:
            raise ValueError(f"{', '.join(unused)} does nothing for decoder {name} (its settings: "
                             f"{', '.join(s) or 'none'}): drop it")
    chosen = decoders.parse_selection(args.decoders)
    if args.mode == "tasks" and chosen is not None and not any(
            decoders.DECODERS[n].refines and not decoders.DECODERS[n].peeks for n in chosen):
        raise ValueError(f"--tasks compares decoders that refine BPD's drafts with bpd, and "
                         f"--decoders {args.decoders} names none: add one, e.g. "
                         f"--decoders {args.decoders},pbest")


def check_plot_dir(folder):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError("--plot needs matplotlib, which is not installed: pip install matplotlib") from None
    parent = os.path.abspath(folder)          # created when the figures are written: a run
    while not os.path.exists(parent):         # refused later leaves no folder behind
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"--plot {folder}: cannot create that folder ({parent} is a file)")
    if not os.access(parent, os.W_OK | os.X_OK):
        what = "that folder is" if parent == os.path.abspath(folder) else f"{parent} is"
        raise ValueError(f"--plot {folder}: {what} not writable")


def resolve_device(name):
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but CUDA is not available; use --device cpu")
    return name


# ----------------------------------------------------------------------------- against the checkpoint

def check_against_checkpoint(args, ck):
    """Every flag against the checkpoint's header (`ck`, from runtime.checkpoint.read: its config,
    kind, dtype, splits and tasks), before any model is loaded (SmolLM2's takes 30-70 s). Sets
    args.tuned_settings (the tuned file, read) and, for --bench, --scale and --tune,
    args.prompt_text (the text their prompts come from)."""
    path, cfg, kind = args.checkpoint, ck["config"], ck.get("kind")
    family = family_module(ck, path)                 # an unknown kind: refused here
    if args.mode == "demo" and family is not None and args.tokens_given and \
            args.max_new_tokens > family.DEMO_TOKENS:
        raise ValueError(f"the {family.NAME} demo shows at most {family.DEMO_TOKENS} new tokens a "
                         f"prompt, got --max-new-tokens {args.max_new_tokens}; use --prompt TEXT "
                         "for longer generations")
    check_prompt_text(args, ck)
    if args.dtype is None:
        dtype_of(ck, path)                           # the checkpoint's own: a torch dtype?
    if not isinstance(cfg, dict):
        return                                       # the load says what is wrong with it
    check_model_flags(args, ck, cfg)
    if args.scale and kind is not None:
        raise ValueError(f"--scale projects the character GPT family (minibpd.GPT) to larger "
                         f"sizes; {path} holds a {kind!r} model: run it on a character checkpoint "
                         "such as checkpoints/minibpd.pt")
    if args.tasks and kind is not None:                # a subword model: tasks built here
        args.prompts = args.prompts if args.prompts_given else SUBWORD_TASK_EXAMPLES
        args.decoders = SUBWORD_TASK_DECODERS if args.decoders is None else args.decoders
        task_runs.check_built_counts(args.prompts)      # seconds, before a load of 30-70 s
    elif args.tasks:
        if "tasks" not in ck or "rescorer_tasks" not in ck:
            raise ValueError(f"checkpoint {path} holds no tasks: use {TASKS_CHECKPOINT} or "
                             "fine-tune one with `python train_heads.py --tasks`")
        task_runs.stored_tasks(ck, args.prompts)
    if args.bench or args.scale or args.tune:
        args.prompt_text = prompt_text(args, ck)
    heads = args.heads or cfg.get("n_bpd_heads")
    if args.tune:
        check_tune_out(args)
    args.tuned_settings = {} if args.tune else decoders.load_tuned(
        args.tuned or decoders.tuned_path(path), path, heads, cfg.get("n_bpd_heads"),
        required=args.tuned is not None)
    args.heads_be = {} if args.tune or not args.tuned_settings else decoders.tuned_be_by_heads(
        args.tuned or decoders.tuned_path(path), path)
    check_budgets(args, ck)


def check_prompt_text(args, ck):
    """--prompt TEXT against the checkpoint: Unicode text (check_unicode: no lone surrogate) and,
    for a character vocabulary, only characters it knows (a tokenizer's comes with the model)."""
    if args.prompt is None:
        return
    check_unicode(args.prompt)
    vocab = ck.get("vocab")
    if isinstance(vocab, str) and len(set(vocab)) == len(vocab):    # else the load says what is
        encode(args.prompt, vocab)                                   # wrong with the vocabulary


def check_budgets(args, ck):
    """The settings of every decoder the run builds (the tuned file's, then the flags) against
    the model's budgets (decoders.check: its KV cache, the p-best DP, lookup's token tree), on
    the model the header's config describes (runtime.checkpoint.outline), before any model is
    loaded; lab.loading.load_mode checks them again on the model."""
    try:
        model = outline(ck, DTYPES[args.dtype] if args.dtype else dtype_of(ck, args.checkpoint))
    except (TypeError, ValueError, KeyError, AttributeError):
        return                                       # the load says what is wrong with it
    chosen = decoders.settings(args.tuned_settings, overrides(args))
    if args.mode == "prompt":
        used = [args.decoder] if args.decoder in decoders.DECODERS else []
    else:
        selected = decoders.parse_selection(args.decoders)
        used = [n for n in decoders.DECODERS if selected is None or n in selected or
                n == decoders.PLAIN]
    for name in used:
        decoders.check(name, chosen[name], model)


def check_model_flags(args, ck, cfg):
    """--heads, --verify and --dtype against the model the checkpoint's config describes."""
    path, h = args.checkpoint, cfg.get("n_bpd_heads")
    if args.heads is not None and is_int(h) and not 1 <= args.heads <= h:
        raise ValueError(f"--heads: heads must be an integer from 1 to {h} (the heads of {path}), "
                         f"got {args.heads}")
    if args.dtype == "int4" and ck.get("kind") is None:
        raise ValueError(f"--dtype int4 is the real model's precision (SmolLM2's 4-bit GGUF "
                         f"weights); the character GPT of {path} takes float32 or float64")
    invariant = bool(cfg.get("batch_invariant", False))
    if (args.dtype or ck.get("dtype", "float32")) == "bfloat16" and not invariant:
        raise ValueError(f"bfloat16 is refused for {path}: its model is not batch-invariant, so its "
                         "batched verification and one-token decoding round differently in "
                         "bfloat16 and BPD would not equal greedy; use --dtype float32 or float64")


def prompt_text(args, ck):
    """The text --bench and --scale (the test split, or --text) and --tune (the tune split) take
    their prompts from, checked to hold --prompts of them (bench.make_prompts' rule)."""
    if args.tune:
        text = decoders.split_text(ck, "tune")
    elif args.text:
        text = read_text(args.text, ck.get("vocab"))
    else:
        text = decoders.split_text(ck, "test")
    bench.check_prompt_count(text, args.prompts)
    return text


def read_text(path, vocab):
    """--text: at most MAX_TEXT_BYTES of UTF-8, mapped into the model's characters (to_vocab;
    a tokenizer's vocabulary: unchanged), with a warning for what was dropped or mapped."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TEXT_BYTES + 1)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read --text {path} as UTF-8: {e}") from None
    if len(raw) > MAX_TEXT_BYTES:
        raise ValueError(f"--text {path} holds more than {MAX_TEXT_BYTES:,} bytes, the most the "
                         "bench reads (its prompts are --prompts x 64 characters): pass a smaller "
                         "file")
    counts = {}
    text = to_vocab(text, vocab, counts)
    dropped, mapped = (sum(counts.get(k, {}).values()) for k in ("dropped", "mapped"))
    if dropped or mapped:
        print(f"warning: --text {path}: dropped {dropped:,} characters the model does not "
              f"know, mapped {mapped:,} to look-alikes it knows", file=sys.stderr)
    return text


def check_tune_out(args):
    """--tune writes its settings to --tuned FILE (default CHECKPOINT.tuned.json): refused before
    the run where that cannot be written, where it holds anything but a tuned file of this
    checkpoint, or where it is shipped (checkpoints/), unless --force (not for non-tuned files)."""
    out = args.tuned or decoders.tuned_path(args.checkpoint)
    if os.path.isdir(out):
        raise ValueError(f"--tuned {out} is a folder: name a file")
    shipped = os.path.realpath(CHECKPOINTS)
    if os.path.commonpath([os.path.realpath(out), shipped]) == shipped and not args.force:
        raise ValueError(f"--tune would overwrite {out}, shipped in {CHECKPOINTS}: write your "
                         "settings to a new file, e.g. --tuned my.tuned.json")
    if os.path.exists(out):
        try:
            with open(out, encoding="utf-8") as f:
                data = json.load(f)
            decoders.check_tuned(out, data)
        except (OSError, ValueError, RecursionError) as e:   # not UTF-8, not JSON, not settings
            what = "JSON" if isinstance(e, (OSError, UnicodeDecodeError, json.JSONDecodeError,
                                            RecursionError)) else "tuned settings"
            raise ValueError(f"--tuned {out} exists and holds no {what}: --tune overwrites only a "
                             "tuned file of this checkpoint; remove it or name another file") from None
        if data.get("checkpoint_sha256") != file_sha256(args.checkpoint) and not args.force:
            raise ValueError(f"--tuned {out} holds settings tuned for another checkpoint (its "
                             "checkpoint_sha256 differs): pass --force to replace them, or name "
                             "another file")
    if not writable(out):
        raise ValueError(f"--tuned {out}: not writable (tried: the file cannot be opened for "
                         "writing there)")
