"""trace: every step of one decode as a self-contained HTML page (`--trace FILE.html` on --prompt
and --demo; FILE.json: the same data as JSON, for notebooks). docs/trace.md shows the page and
the drafter's optional explain() it draws (Kim §7.1, §7.2).

The data are what bpd_decode already records (stats["steps"]: each call's context, drafts,
winner, kept tokens and, at T = 0, the base model's choices after each prefix of each draft (Stern
§3), or at T > 0 each try: depth, token, acceptance probability, accepted) and what the drafter
says about its last call. A trace never changes what is decoded (Recorder). The page
(lab/trace.html, read at run time) holds its data inline: no network, no CDN.
"""
import json
import math
import os

import torch

import lattice
import decoders
from decoders.fastlattice import explained_lattice
from lab import approximate, drawable
from minibpd import greedy_decode
from runtime.checkpoint import family_module
from runtime.corpus import decode
from train_heads import writable

MARKER = "minibpd-trace"          # in every file we write, near its start: ours to overwrite
TRACE_FORMAT = MARKER + "/1"
MAX_STEPS = 1000                  # steps a page shows (the first ones); more: said on the page
MAX_EXPLAIN_BYTES = 100_000       # what one step keeps of a drafter's explain() (a plug-in's)
DEMO_DECODER = "pbest"            # what --demo --trace shows without --decoder
SUFFIXES = (".html", ".htm", ".json")
TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trace.html")
SLOT = "__MINIBPD_TRACE_DATA__"   # where the template takes the data


# ----------------------------------------------------------------------------- recording

class Recorder:
    """A drafter as the trace sees it: the wrapped drafter's drafts, unchanged, and after each of
    its first MAX_STEPS calls what it says about that call (explain). Every other attribute the
    decode loop reads (max_drafts, max_draft_tokens, name, counts, sample, ...) is the drafter's
    own, so the run is the run without a trace. A drafter with a `record` flag (and the drafter it
    builds on, `base`) is asked to keep what its explain() needs while recording."""

    def __init__(self, drafter):
        self.drafter, self.explained = drafter, []
        record(drafter, True)

    def __getattr__(self, attr):            # only for attributes not set above
        if attr == "drafter":
            raise AttributeError(attr)
        if attr == "name":                  # a drafter without one: named by its class
            return getattr(self.drafter, "name", None) or type(self.drafter).__name__
        if attr == "sample":                # a sampling drafter (T > 0): recorded too
            sample = self.drafter.sample    # AttributeError where the drafter has none
            return lambda logprobs, context, *a: self.noted(
                sample(logprobs, context, *a), logprobs, context, sampled=True)
        return getattr(self.drafter, attr)

    def __call__(self, logprobs, context):
        return self.noted(self.drafter(logprobs, context), logprobs, context)

    def noted(self, answer, logprobs, context, sampled=False):
        if len(self.explained) < MAX_STEPS:
            drafts = answer[0] if sampled else answer
            self.explained.append(explain(self.drafter, logprobs, context, drafts))
            if len(self.explained) == MAX_STEPS:
                record(self.drafter, False)
        return answer


def record(drafter, on):
    """Turn a drafter's `record` flag (a bool, where it has one) on or off, and its base's."""
    for _ in range(8):                      # a base of a base ...; never a loop of them
        if isinstance(getattr(drafter, "record", None), bool):
            drafter.record = on
        drafter = getattr(drafter, "base", None)
        if drafter is None:
            return


def explain(drafter, logprobs, context, drafts):
    """What a drafter says about the call just made: its explain(), or for lattice.OracleDrafter
    (in the paper layer, no explain) its lattice computed here; None for a drafter with neither.
    An explain() that fails, returns what JSON cannot hold or what the page cannot draw
    (drawable.check_drawable) becomes an error note: it never stops the decode nor blanks the
    page."""
    try:
        if callable(getattr(drafter, "explain", None)):
            said = drafter.explain()
        elif isinstance(drafter, lattice.OracleDrafter):
            said = oracle_lattice(drafter, logprobs, context, drafts)
        else:
            return None
        size = len(json.dumps(said))                # JSON-able, or the except below
        if size > MAX_EXPLAIN_BYTES:
            return {"kind": "error", "error": f"explain() returned {size:,} bytes of JSON; a step "
                    f"keeps at most {MAX_EXPLAIN_BYTES:,}"}
        drawable.check_drawable(said)
        return said
    except drawable.Undrawable as e:
        return {"kind": "error", "error": f"explain() returned a {said['kind']} the page cannot "
                f"draw: {e}"}
    except Exception as e:
        return {"kind": "error", "error": f"explain() failed: {type(e).__name__}: {e}"}


def oracle_lattice(drafter, logprobs, context, drafts):
    """lattice.OracleDrafter's step (Kim §6.3): its top-k lattice and the one path it proposes,
    scored by the heads alone (the oracle ranks by the greedy answer, not by a score)."""
    lat = lattice.head_lattice(logprobs, context, drafter.k)
    path = [int(t) for t in drafts[0]]
    score = lattice.path_score(lat, None, context[:-1], path, 0.0)
    return explained_lattice(lat, [(score, path)], context[:-1])


# ----------------------------------------------------------------------------- the data

def steps_of(stats, seq, plen, explained):
    """One entry per call after the prompt's (the first MAX_STEPS): bpd_decode's step where the call
    drafted, a one-token step where it could not (the window's edge), each with the drafter's
    explanation, the token the call added and the running block efficiency. seq: prompt + output."""
    by_context = {s["context"]: (j, s) for j, s in enumerate(stats["steps"])}
    acc, n, steps = stats["accepted"], len(seq) - plen, []
    done = acc[0]
    for c in range(1, min(len(acc), MAX_STEPS + 1)):
        context = plen + done
        j, s = by_context.get(context, (None, None))
        step = dict(s) if s else {"context": context, "drafts": [[seq[context - 1]]], "winner": 0,
                                  "kept": 0, "accepted": acc[c], "edge": True}
        step["explain"] = explained[j] if j is not None and j < len(explained) else None
        at = context + step["kept"]
        step["added"] = seq[at] if at < len(seq) else past_end(step)
        done += acc[c]
        step.update(call=c + 1, done=min(done, n), block_efficiency=min(done, n) / (c + 1))
        steps.append(step)
    return steps


def past_end(step):
    """The token a last call added past --max-new-tokens (dropped): greedy's choice at T = 0,
    unknown (None) when sampling."""
    choices = step.get("choices")
    return choices[step["winner"]][step["kept"]] if choices else None


def check_of(out, greedy, temperature, accept, seed):
    """The check the header shows: identical to greedy (T = 0), approximate, or what exactness
    means when sampling. top1 and min1 are the exact rule by another name: checked as it."""
    if approximate.labelled(accept):
        return {"kind": "approximate", "ok": None, "text": f"APPROXIMATE acceptance {accept} "
                "(Stern §5): this output is not greedy decoding's, by design"}
    if temperature == 0:
        same = out == greedy
        return {"kind": "greedy", "ok": same, "text": "identical to greedy decoding" if same else
                "DIFFERENT from greedy decoding"}
    return {"kind": "sampled", "ok": None, "text": f"sampled at temperature {temperature} (seed "
            f"{seed}): exact in distribution, not token by token. Each drafted token is accepted "
            "with probability min(1, p/q) (p: the base model's probability of it, q: the "
            "drafter's; q = 1 for a deterministic draft) and after the rejections the call "
            "samples its token from what is left of p, so this output is a draw from exactly the "
            "distribution of sampling the base model one token at a time (docs/exactness.md)"}


def trace_data(run, vocab, prompt, out, stats, explained, check):
    """The trace's data: the run's description (`run`, see describe), the prompt and output as
    text and token ids, the calls and tokens accepted per call, the check, the steps (steps_of)
    and the text of every token id they hold."""
    seq = list(prompt) + list(out)
    steps = steps_of(stats, seq, len(prompt), explained)
    data = {"format": TRACE_FORMAT, **run,
            "prompt": decode(prompt, vocab), "output": decode(out, vocab),
            "prompt_tokens": list(prompt), "tokens": list(out), "calls": stats["calls"],
            "accepted": stats["accepted"], "block_efficiency": len(out) / stats["calls"],
            "check": check, "steps_total": stats["calls"] - 1, "steps": steps}
    data = tidy(data)
    data["vocab"] = token_texts(data, vocab)
    return data


def tidy(x):
    """JSON-ready: tuples as lists, floats to 4 decimals (None where not finite)."""
    if isinstance(x, float):
        return round(x, 4) if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): tidy(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [tidy(v) for v in x]
    return x


def token_texts(data, vocab):
    """{id: its text} for every integer in the steps, prompt and output that is a token id (a
    few counts among them cost an entry each)."""
    ids, V = set(), len(vocab)
    def walk(x):
        if isinstance(x, bool):
            return
        if isinstance(x, int) and 0 <= x < V:
            ids.add(x)
        elif isinstance(x, dict):
            list(map(walk, x.values()))
        elif isinstance(x, list):
            list(map(walk, x))
    walk([data["prompt_tokens"], data["tokens"], data["steps"]])
    return {str(t): decode([t], vocab) for t in sorted(ids)}


def describe(model, ck, checkpoint, name, settings, args):
    """The run as the header shows it: model, checkpoint, decoder and settings, the options."""
    family = family_module(ck)
    params = sum(p.numel() for p in model.parameters())
    what = family.NAME if family is not None else "character GPT"
    corpus = ck.get("corpus", {}).get("name", "")
    return {"model": f"{what}, {params:,} parameters, {model.config.n_bpd_heads} heads"
                     + (f" ({corpus})" if corpus else ""),
            "checkpoint": shown_path(checkpoint), "decoder": name, "settings": dict(settings),
            "about": decoders.DECODERS[name].about if name in decoders.DECODERS else "",
            "temperature": args.temperature, "seed": args.seed, "verify": args.verify,
            "accept": args.accept, "dtype": precision(model, family)}


def precision(model, family):
    """The precision the run computed in: its family's precision_of where it has one (SmolLM2's
    int4 keeps float32 tensors around its 4-bit products), else its weights' dtype."""
    named = getattr(family, "precision_of", None)
    return named(model) if named is not None else str(next(model.parameters()).dtype).split(".")[1]


def shown_path(path):
    """A path as the header shows it: relative to the current folder when inside it."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


# ----------------------------------------------------------------------------- files

def check_path(path, force=False):
    """--trace FILE, before any model loads: a .html/.htm (the page) or .json (the data) file in
    an existing folder, writable, and if it exists one of our traces (MARKER) or --force."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"--trace {path}: name a .html file (the page to open in a browser) or a "
                         ".json file (the same data, for notebooks)")
    if os.path.isdir(path):
        raise ValueError(f"--trace {path} is a folder: name a file, e.g. {path.rstrip('/')}/trace.html")
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise ValueError(f"--trace {path}: there is no folder {folder}")
    if os.path.exists(path):
        check_existing(path, force)
    if suffix != ".json":
        template()
    if not writable(path):
        raise ValueError(f"--trace {path}: not writable (tried: the file cannot be opened for "
                         "writing there)")


def check_existing(path, force):
    """--trace naming a file that exists: a regular file (opening a FIFO would wait forever),
    never the page template (every later trace would show this run), and one of our traces
    unless --force."""
    if not os.path.isfile(path):
        raise ValueError(f"--trace {path} is not a regular file (a FIFO, socket or device): name "
                         "a file to write the trace to")
    if os.path.isfile(TEMPLATE) and os.path.samefile(path, TEMPLATE):     # links to it too
        raise ValueError(f"--trace {path} is the page template every trace is written from "
                         f"({shown_path(TEMPLATE)}): name another file")
    if not force and not is_trace(path):
        raise ValueError(f"--trace {path} exists and is not a trace minibpd wrote: pass --force "
                         "to overwrite it, or name another file")


def is_trace(path):
    """Whether the file at path is a trace we wrote: MARKER in its first 4 KB, and no SLOT (a
    copy of the template holds one: its data were never written in)."""
    try:
        with open(path, "rb") as f:
            if MARKER.encode() not in f.read(4096):
                return False
            f.seek(0)
            return not any(SLOT.encode() in chunk for chunk in iter(lambda: f.read(1 << 20), b""))
    except OSError:
        return False


def write(path, data):
    """The data as JSON (.json) or inside the page (lab/trace.html; every '<' escaped, so no text
    of the run can end the script that holds it)."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    if not path.lower().endswith(".json"):
        text = template().replace(SLOT, text.replace("<", "\\u003c"))
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def template():
    """The page (lab/trace.html), with its data slot: one that lost it (overwritten by a run)
    would give every page that run's data."""
    try:
        with open(TEMPLATE, encoding="utf-8") as f:
            page = f.read()
    except OSError as e:
        raise ValueError(f"the page template {TEMPLATE} cannot be read ({e.strerror}): restore "
                         "it (git checkout lab/trace.html)") from None
    if SLOT not in page:
        raise ValueError(f"the page template {TEMPLATE} has no data slot ({SLOT}): it was "
                         "overwritten; restore it (git checkout lab/trace.html)")
    return page


def finish(args, model, ck, name, settings, prompt, out, stats, recorder, greedy, where=""):
    """--trace FILE after a run of decoder `name` whose drafter was wrapped in `recorder`: the
    file written. greedy: greedy's tokens (at T = 0) for the check. -> the line saying what was
    written (and a warning naming the first error note, where the drafter's explain() gave any:
    the page shows them per step)."""
    check = check_of(out, greedy, args.temperature, args.accept, args.seed)
    run = describe(model, ck, args.checkpoint, name, settings, args)
    data = trace_data(run, ck["vocab"], prompt, out, stats, recorder.explained, check)
    write(args.trace, data)
    shown, total = len(data["steps"]), data["steps_total"]
    what = f"all {total} steps" if shown == total else f"the first {shown} of {total} steps"
    page = "open it in a browser" if not args.trace.lower().endswith(".json") else "JSON"
    line = f"trace: wrote {args.trace}, {what} of {name}'s run{where} ({page})"
    notes = [s["explain"]["error"] for s in data["steps"]
             if isinstance(s["explain"], dict) and s["explain"].get("kind") == "error"]
    if notes:
        line += f"\nwarning: {len(notes)} of its steps show an error note, not what the drafter " \
                f"says; the first: {notes[0]}"
    return line


def trace_demo(args, model, ck, res, chosen, prompt, n):
    """The demo's last lines: one decoder (--decoder, default pbest) on its first prompt, traced
    to --trace FILE; without --trace, the flag that writes one. Its own generator (seeded by
    --seed): the demo's runs draw exactly as without a trace."""
    name = args.decoder if args.trace else DEMO_DECODER
    if not args.trace:
        return (f"see every step of {name}'s run on the first prompt (drafts, lattice, "
                "verification) in a browser: add --trace FILE.html (--decoder NAME for another)")
    T, peeks = args.temperature, decoders.DECODERS[name].peeks
    greedy = greedy_decode(model, prompt, n) if T == 0 or peeks else None
    m = decoders.method(name, res, chosen[name], prompt + greedy if peeks else None, T)
    m.drafter = Recorder(m.drafter)
    out, stats = m.decode(model, prompt, n, T, torch.Generator().manual_seed(args.seed), args.verify)
    return finish(args, model, ck, name, chosen[name], prompt, out, stats, m.drafter, greedy,
                  " on the demo's first prompt")
