"""decoders: the one table of decoders, their settings, and the methods every command runs.

Each entry names a drafter factory, its settings with their defaults, and the grid `--tune`
searches. The demo, `--prompt`, the bench, `--tune`, the cost table, the sweeps and the tests all
iterate DECODERS, so a new decoder is one drafter class plus one `register(...)` call:

    import decoders
    decoders.register("mine", lambda res, s, answer: MyDrafter(s["k"]), defaults={"k": 4},
                      grid={"k": [2, 4, 8]}, about="my drafter")

A factory gets `res` (a Resources: the base model, the small rescorer LM, n-gram LMs, and
`res.reference`: build the readable version), the settings `s` (the defaults, updated by the
tuned file and the command line) and `answer` (prompt + greedy continuation; only the oracle,
which peeks at it, reads it).

Settings named k (lattice width), p (drafts verified per call), alpha (LM interpolation weight)
and order (n-gram order) are checked by decoders.budgets.check_settings for every decoder that
has them; p-best's DP must fit settings.MAX_DP_CELLS and its p rows kvcache.MAX_CACHE_BYTES.

The drafters come from lattice.py (readable, `--reference`) and their fast twins here:
fastlattice.py (p-best), viterbi.py (p = 1), neural.py (the cached small LM), and lookup.py
(prompt lookup, in neither paper).

A Method is what the bench times and checks: the baseline (sample_decode, one token per call:
'greedy' at temperature 0, 'sample' above) or a decoder's drafter in bpd_decode.
"""
import contextlib
import copy
import inspect
import json
import math
import re
import sys
import threading
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

import lattice
from decoders.fastlattice import FastPBestDrafter, NgramTable
from decoders.lookup import PromptLookupDrafter, check_copy, check_ngram
from decoders.neural import CachedNeuralDrafter, check_reach
from decoders.budgets import check_dp_budget, check_settings
from decoders.viterbi import EAGER_BYTES, NgramAutomaton, ViterbiDrafter
from minibpd import ArgmaxDrafter, sample_decode
from runtime.kvcache import check_cache_budget
from runtime.loop import lab_decode
from runtime.checkpoint import build_model, family_module, file_sha256, retrain, train_kind
from runtime.corpus import encode
from ngram import NgramLM

ALPHAS = [0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
NODES = [0, 16, 32]          # the token tree's budget of drafted tokens (0: none), for --tune
COPIES = [0, 10]             # lookup: the most tokens one copy drafts (0: h - 1), for --tune
SPEED_SETTINGS = ("nodes", "reach")   # trade block efficiency for speed: tuned for tokens/s only
PLAIN = "bpd"                # the decoder every refinement is compared with (Kim Table 4)
BASELINES = ("greedy", "sample")   # the one-token-per-call reference at T = 0 and T > 0


@dataclass
class Decoder:
    name: str
    make: Callable                                # make(res, s, answer) -> drafter
    defaults: dict = field(default_factory=dict)  # setting -> default value
    grid: dict = field(default_factory=dict)      # setting -> values --tune tries (tune split)
    about: str = ""                               # one line for --help
    peeks: bool = False                           # reads the answer (oracle): analysis only
    refines: bool = True                          # a refinement of BPD's drafts (Kim §7)
    replaced: bool = False                        # registered over one of the same name


DECODERS = {}
ACTIVE = None                # the names `--decoders` chose (select), or None: every decoder


def register(name, make, defaults=None, grid=None, about="", peeks=False, refines=True):
    """Add (or replace) a decoder; it then appears in every command and in the tests. Everything
    is checked here, with errors naming the decoder: a name (a word, not a baseline's nor plain
    BPD's), a factory, settings {name: number}, a grid {setting: [values within the limits]}."""
    defaults, grid = {} if defaults is None else defaults, {} if grid is None else grid
    check_entry(name, make, defaults, grid, about)
    DECODERS[name] = Decoder(name, make, dict(defaults), {k: list(v) for k, v in grid.items()},
                             about, bool(peeks), bool(refines), name in DECODERS)
    return DECODERS[name]


def check_entry(name, make, defaults, grid, about):
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", name):
        raise ValueError(f"register: a decoder's name is one word (letters, digits, _ or -), got "
                         f"{name!r}")
    if name in BASELINES:
        raise ValueError(f"register: {name!r} is the baseline's name (one token per call); "
                         "choose another")
    if name == PLAIN and PLAIN in DECODERS:
        raise ValueError(f"register: {name!r} is plain BPD, the reference of every 'vs BPD' "
                         "figure, and cannot be replaced; choose another name")
    bad = lambda why: ValueError(f"register {name!r}: {why}")
    if not callable(make):
        raise bad("make must be a factory (res, s, answer) -> drafter")
    try:                                  # a lambda res, s: ... would fail only when first used
        inspect.signature(make).bind(None, {}, None)
    except TypeError:
        raise bad(f"its factory must take three arguments (res, s, answer), e.g. `lambda res, s, "
                  f"answer: MyDrafter()`; got {make.__name__}{inspect.signature(make)}") from None
    except ValueError:                    # a builtin without a signature: checked when used
        pass
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    if not isinstance(defaults, dict) or not all(isinstance(k, str) and number(v)
                                                 for k, v in defaults.items()):
        raise bad(f"defaults must be {{setting: number}}, got {defaults!r}")
    if not isinstance(grid, dict) or not all(isinstance(v, (list, tuple)) and v and
                                             all(map(number, v)) for v in grid.values()):
        raise bad(f"grid must be {{setting: [numbers]}}, got {grid!r}")
    if not set(grid) <= set(defaults):
        raise bad(f"grid settings {sorted(set(grid) - set(defaults))} have no default")
    if not isinstance(about, str):
        raise bad("about must be a string (one line for --help)")
    check(name, defaults)
    for key, values in grid.items():
        for v in values:
            check(name, {**defaults, key: v})


def check(name, s, model=None):
    """Clear errors for impossible settings (settings.check_settings) and, given the model, for
    settings over a budget (its vocabulary bounds k, its size the cache): all before any model
    call. Errors name the decoder."""
    known = {k: s[k] for k in ("k", "p", "alpha", "order", "nodes") if k in s}
    try:
        check_settings(**known)
        if "ngram" in s:
            check_ngram(s["ngram"])
        if "copy" in s:
            check_copy(s["copy"])
        if "reach" in s:
            check_reach(s["reach"])
        if model is None:
            return
        if "p" in s:                      # prompt lookup (an ngram setting) adds one more draft
            check_cache_budget(model, s["p"] + ("ngram" in s))
        if s.get("copy"):                 # a copy and the other drafts: one token tree
            check_copy_budget(model, s.get("p", 1) + 1, s["copy"])
        if "k" in s and ("p" in s or "order" in s):
            order = s.get("order", 1) if s.get("alpha", 0) > 0 else 1
            check_dp_budget(s["k"], s.get("p", 1), order, model.config.vocab_size)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def check_copy_budget(model, drafts, copy):
    """The token tree runtime.loop.verifier builds for `drafts` drafts of up to `copy` tokens
    (lookup's max_draft_tokens), within the KV cache's budget."""
    try:
        check_cache_budget(model, 1, (drafts - 1) * copy)
    except ValueError as e:
        raise ValueError(f"copy {copy}: a token tree of {drafts} drafts of up to {copy} tokens: "
                         f"{e}") from None


# ----------------------------------------------------------------------------- the decoders

class HeadSampler(ArgmaxDrafter):
    """Samples each draft token from its head's own distribution q_i = softmax(head_i / T) and
    declares q, so verification uses the textbook rule min(1, p/q) with residual max(0, p - q)
    (sampling.py). Beside the deterministic drafters (q = one-hot) it shows both halves of the
    rule. At temperature 0 it drafts each head's argmax: plain BPD."""
    name = "sampled"

    def sample(self, logprobs, context, temperature, generator=None):
        """-> ([draft], q [m, V]): q[i] is the distribution draft token i was drawn from."""
        q = F.softmax(logprobs.double().cpu() / temperature, dim=-1)       # [m, V]
        drawn = torch.multinomial(q[1:], 1, generator=generator).view(-1).tolist() if len(q) > 1 else []
        return [[context[-1]] + drawn], q



def pbest(res, k, p, alpha=0.0, order=None, name="pbest", nodes=0):
    """A p-best drafter: lattice.PBestDrafter's fast twin with the LM's lookup table (built once
    per order), or its readable search under res.reference (--reference)."""
    lm = None if order is None else res.ngram(order)
    table = res.table(order) if lm is not None and alpha > 0 and not res.reference else None
    return FastPBestDrafter(k, p, alpha, lm, table, name, nodes, reference=res.reference)


register("bpd", lambda res, s, answer: ArgmaxDrafter(),
         about="plain BPD: each head's most likely token (Stern §3)", refines=False)
register("neural", lambda res, s, answer: CachedNeuralDrafter(
             res.small_lm(), s["k"], s["alpha"], s["reach"], reference=res.reference),
         {"k": 8, "alpha": 0.5, "reach": 0.0}, {"k": [8, 16], "alpha": ALPHAS, "reach": [0.0, 0.05]},
         about="local rescoring of head i's top-k with the small LM (Kim §7.1)")
register("ngram", lambda res, s, answer: FastPBestDrafter(
             s["k"], 1, s["alpha"], res.ngram(s["order"]), name="ngram", reference=True)
         if res.reference else ViterbiDrafter(s["k"], s["alpha"], res.ngram(s["order"]),
                                              res.automaton(s["order"])),
         {"k": 8, "alpha": 0.5, "order": 4}, {"k": [8], "order": [3, 4, 5], "alpha": ALPHAS},
         about="the best lattice path under heads + n-gram LM (Kim §7.2, p = 1)")
register("pbest0", lambda res, s, answer: pbest(res, s["k"], s["p"], name="pbest0", nodes=s["nodes"]),
         {"k": 8, "p": 16, "nodes": 0}, {"k": [8], "p": [16], "nodes": NODES},
         about="the p best lattice paths by head scores alone: Kim's 0-gram row (our reading)")
register("pbest", lambda res, s, answer: pbest(res, s["k"], s["p"], s["alpha"], s["order"],
                                               nodes=s["nodes"]),
         {"k": 8, "p": 16, "alpha": 0.5, "order": 4, "nodes": 0},
         {"k": [8], "p": [16], "order": [3, 4, 5], "alpha": ALPHAS, "nodes": NODES},
         about="the p best lattice paths, verified in one call (Kim §7.2)")
register("lookup", lambda res, s, answer: PromptLookupDrafter(
             s["ngram"], reference=res.reference, copy=s["copy"], nodes=s["nodes"]),
         {"ngram": 3, "copy": 0, "nodes": 0}, {"ngram": [1, 2, 3, 4], "copy": COPIES},
         about="prompt lookup (Saxena 2023): BPD's draft and a copy from the context")
register("lookup_pbest", lambda res, s, answer: PromptLookupDrafter(
             s["ngram"], DECODERS["pbest"].make(res, {k: s[k] for k in DECODERS["pbest"].defaults},
                                                answer), name="lookup_pbest",
             reference=res.reference, copy=s["copy"]),
         {**DECODERS["pbest"].defaults, "ngram": 3, "copy": 0},
         {"ngram": [1, 2, 3, 4], "nodes": NODES, "copy": COPIES},
         about="pbest's p drafts plus lookup's copy, in one call: does refining add to copying?")
register("sampled", lambda res, s, answer: HeadSampler(),
         about="draws each draft token from its head at --temperature (at 0: bpd)", refines=False)
register("oracle", lambda res, s, answer: lattice.OracleDrafter(answer, s["k"]), {"k": 8},
         {"k": [8]}, about="peeks at the greedy answer: the best lattice path (Kim §6.3), "
         "analysis only", peeks=True)


def label_width(names):
    """Columns of the name column in the terminal tables: 8, or the longest of these names."""
    return max([8] + [len(n) for n in names])


def active():
    """{name: Decoder}: the decoders the commands run, in DECODERS order: every one, or those
    select() chose (`--decoders a,b`), plain BPD always (every refinement is compared with it)."""
    return {n: d for n, d in DECODERS.items() if ACTIVE is None or n in ACTIVE or n == PLAIN}


def parse_selection(spec):
    """'a,b' -> ['a', 'b'], each a registered decoder (a clear error otherwise); None -> None."""
    if spec is None:
        return None
    chosen = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in DECODERS]
    if not chosen or unknown:
        what = f"unknown decoder {', '.join(map(repr, unknown))}" if unknown else "names none"
        raise ValueError(f"--decoders {spec!r} {what}; choose from {', '.join(DECODERS)} "
                         "(comma-separated; bpd always runs)")
    return chosen


@contextlib.contextmanager
def select(names):
    """Within the block, active() holds only `names` (and plain BPD); None: every decoder."""
    global ACTIVE
    saved, ACTIVE = ACTIVE, None if names is None else frozenset(names)
    try:
        yield
    finally:
        ACTIVE = saved


def refined():
    """Names of the active decoders that refine BPD's drafts (not bpd itself, nor those that peek)."""
    return [n for n, d in active().items() if d.refines and not d.peeks]


def make(name, res, s, answer=None):
    """A fresh drafter of decoder `name` with settings s (see settings()). A factory that fails or
    returns something that cannot draft is refused, naming the decoder."""
    if name not in DECODERS:
        raise ValueError(f"unknown decoder {name!r}; choose from {', '.join(names())}")
    try:
        drafter = DECODERS[name].make(res, s, answer)
    except ValueError as e:
        raise ValueError(f"decoder {name}: {e}") from None
    except (Exception, SystemExit) as e:        # sys.exit() in a factory: its failure too
        raise ValueError(f"decoder {name}: its factory failed ({type(e).__name__}: {e})") from None
    if drafter is None or not callable(drafter):
        raise ValueError(f"decoder {name}: its factory returned {drafter!r}, not a drafter "
                         "(a callable: drafter(logprobs, context) -> drafts)")
    return drafter


# ----------------------------------------------------------------------------- methods

def baseline_name(temperature):
    """The one-token-per-call baseline: 'greedy' at temperature 0, 'sample' above."""
    return BASELINES[0] if temperature == 0 else BASELINES[1]


def names(temperature=0.0):
    """Every name --decoder takes: the baseline, then the registered decoders."""
    return [baseline_name(temperature), *DECODERS]


class Method:
    """Something to decode with: the baseline (drafter None: sample_decode, one token per call) or
    a registered decoder's drafter in bpd_decode, with its acceptance rule (`accept`: "exact", or
    an APPROXIMATE one of runtime/approximate.py, whose tokens are not greedy's). decode() ->
    (tokens, stats) for both."""

    def __init__(self, name, drafter=None, refines=False, accept="exact"):
        if drafter is None and accept != "exact":
            raise ValueError(f"{name} drafts nothing: the acceptance rule {accept!r} needs a "
                             "decoder's drafter")
        self.name, self.drafter, self.accept = name, drafter, accept
        self.reps = 3 if refines else 5       # timing repetitions: the slow refined ones get fewer

    def decode(self, model, prompt, n, temperature=0.0, generator=None, verify="auto"):
        if self.drafter is None:
            return sample_decode(model, prompt, n, temperature, generator), \
                {"calls": n, "block_efficiency": 1.0, "steps": [], "new_tokens": n}
        return lab_decode(model, prompt, n, self.drafter, temperature, generator, verify, self.accept)


def method(name, res, s, answer=None, temperature=0.0, accept="exact"):
    """The Method called `name` ('greedy' or 'sample': the baseline) with settings s."""
    if name == baseline_name(temperature):
        return Method(name, accept=accept)
    return Method(name, make(name, res, s, answer), DECODERS[name].refines, accept)


# ----------------------------------------------------------------------------- settings

def settings(tuned=None, overrides=None, only=None):
    """{name: settings}: each decoder's defaults, updated by the tuned file's settings (`tuned`,
    from load_tuned) and then by `overrides` ({'k': 3, ...}; a decoder takes only the keys it has)."""
    out = {}
    for name in only or DECODERS:
        s = dict(DECODERS[name].defaults)
        s.update((tuned or {}).get(name, {}))
        s.update({k: v for k, v in (overrides or {}).items() if k in s and v is not None})
        out[name] = s
    return out


def tuned_path(checkpoint):
    return checkpoint + ".tuned.json"


def load_tuned(path, checkpoint, heads=None, all_heads=None, required=False):
    """The settings in a tuned file, validated like command-line input. A missing file means
    none (an error when `required`: a file the user named); a file tuned for another checkpoint
    (its checkpoint_sha256) or with other heads than this run's (its `heads`; without one: the
    checkpoint's `all_heads`) is ignored, with a warning."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        if required:
            raise ValueError(f"tuned file {path} not found (run `python minibpd.py --tune --tuned "
                             f"{path}` to write it)") from None
        return {}
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:   # nested too deep
        raise ValueError(f"tuned file {path} is not valid JSON ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:200]}); fix it, delete it, or run "
                         "`python minibpd.py --tune`") from None
    settings = check_tuned(path, data)
    ignore = lambda why: print(f"warning: ignoring {path}: {why}; using the defaults", file=sys.stderr)
    if data.get("checkpoint_sha256") != file_sha256(checkpoint):
        return ignore("it was tuned for another checkpoint (checkpoint_sha256 differs)") or {}
    tuned_heads = data.get("heads", all_heads)
    if heads is not None and tuned_heads is not None and tuned_heads != heads:
        return ignore(f"it was tuned with {tuned_heads} heads, this run uses {heads} (settings for "
                      f"{heads}: `python minibpd.py --tune --heads {heads} --tuned FILE`, then "
                      "--tuned FILE)") or {}
    return settings


def tuned_be_by_heads(path, checkpoint):
    """The tuned file's plain-BPD block efficiency by heads used, {k: be} for k = 1..h (`--tune`
    writes it: lab.analysis.be_by_heads on the tune split, machine-independent), or {} where the
    file is missing, of another checkpoint, or holds no such entry."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict) or data.get("checkpoint_sha256") != file_sha256(checkpoint):
        return {}
    be = data.get("block_efficiency_by_heads")
    if not isinstance(be, dict):
        return {}
    try:
        out = {int(k): float(v) for k, v in be.items()}
    except (TypeError, ValueError):
        return {}
    return out if all(v > 0 and math.isfinite(v) for v in out.values()) else {}


def speed_heads(be, call_ms):
    """The number of heads k whose plain BPD is fastest here by the measure at hand: block
    efficiency with k heads (be, the tuned file's) over the cost of a k-row decode call on this
    machine (call_ms[k - 1], models/machine.call_costs): tokens per ms. Ours (Stern §7.3, Table 4:
    speedup rises with the block size k, then falls). None where either is missing; ties go to
    more heads."""
    if not be or not call_ms:
        return None
    ks = [k for k in range(1, len(call_ms) + 1) if k in be and call_ms[k - 1] > 0]
    return max(ks, key=lambda k: (be[k] / call_ms[k - 1], k)) if ks else None


def fastest_view(model, be, switch=True):
    """The model on the heads whose BPD is fastest on this machine (speed_heads: `be`, the tuned
    file's block efficiency by heads, over the model's measured call costs, model.call_ms:
    SmolLM2's), said in model.machine; the model itself where either is missing or all heads
    win. --prompt and --demo use it without --heads; the bench (switch False) keeps every head,
    its block efficiency the machine-independent one, and only says which would be fastest."""
    h = model.config.n_bpd_heads
    k = speed_heads(be, getattr(model, "call_ms", None))
    if k in (None, h):
        return model
    if not switch:
        model.machine = f"{model.machine}; BPD fastest here on {k} of its {h} heads (`--heads {k}`)"
        return model
    view = model.first_heads(k)
    view.machine = f"{model.machine}; BPD on {k} of its {h} heads, fastest here (`--heads {h}`: all)"
    return view


def check_tuned(path, data):
    """A tuned file's structure and settings, checked like command-line input. -> the settings of
    this run's decoders (another's, a plug-in's tuned with --plugin, are skipped with a warning
    naming the plug-ins the file records; so are those of a decoder a plug-in re-registered
    that do not fit it: the file was tuned for the one it replaced, and is not at fault)."""
    bad = lambda what: ValueError(f"tuned file {path}: {what}; fix it, delete it, or run "
                                  "`python minibpd.py --tune`")
    if not isinstance(data, dict) or not isinstance(data.get("settings"), dict):
        raise bad("'settings' must be an object {decoder: {setting: value}}")
    if "heads" in data and (not isinstance(data["heads"], int) or isinstance(data["heads"], bool)):
        raise bad("'heads' must be an integer")
    plugins = data.get("plugins", [])
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        raise bad("'plugins' must be a list of module names")
    warn = lambda what: print(f"warning: tuned file {path}: {what}; its settings are skipped",
                              file=sys.stderr)
    kept = {}
    for name, s in data["settings"].items():
        if name not in DECODERS:        # a plug-in's decoder, tuned with --plugin: skipped
            shown = " ".join(f"--plugin {p}" for p in plugins) or "--plugin"
            warn(f"settings.{name} is not a decoder of this run (was it tuned with {shown}?)")
            continue
        problem = tuned_problem(name, s)
        if problem and DECODERS[name].replaced:
            warn(f"{problem}, but they were tuned for the decoder a plug-in re-registered as "
                 f"{name!r}")
            continue
        if problem:
            raise bad(problem)
        kept[name] = s
    return kept


def tuned_problem(name, s):
    """'' if a tuned file's settings `s` fit decoder `name`, else why not."""
    keys = sorted(DECODERS[name].defaults)
    if not isinstance(s, dict) or not set(s) <= set(keys):
        return f"settings.{name} must be an object with keys from {keys or 'none'}"
    try:
        check(name, {**DECODERS[name].defaults, **s})
    except ValueError as e:
        return f"settings.{name}: {str(e).split(': ', 1)[-1]}"
    return ""


# ----------------------------------------------------------------------------- resources

def split_text(ck, name):
    """A split's text from the checkpoint (saved at training time, so it never depends on which
    Python's pydoc_data is installed here); "" where it has none, a clear error where its
    splits are not {split: text}."""
    splits = ck.get("splits", {})
    if not isinstance(splits, dict) or not isinstance(splits.get(name, ""), str):
        shown = type(splits).__name__ if not isinstance(splits, dict) else \
            f"a {type(splits[name]).__name__} for {name!r}"
        raise ValueError(f"the checkpoint's 'splits' must be {{split: text}}, got {shown}; "
                         f"{retrain(ck.get('path'), train_kind(ck))}")
    return splits.get(name) or ""


class Resources:
    """What the drafter factories need, built once: the base model, the small rescorer LM and
    n-gram LMs of each order fitted on the train split only. Tests pass `small` and `lms`.
    reference=True (`--reference`, the one switch of the readable path): self.model is a view of
    the model whose head_logits runs each head one by one, and the factories build the readable
    drafters (best_paths, the plain neural loop). Threads may share one: what it builds on
    first use (the small LM, an n-gram LM, its table and automaton) is built under its lock,
    once, so every drafter gets the one LM and the automaton built for it."""

    def __init__(self, model, ck=None, small=None, lms=None, reference=False, text=None):
        if reference:      # the one switch: the model's heads one by one, every drafter readable
            model = copy.copy(model)
            model.reference = True
        self.model, self.ck, self._small, self.reference = model, ck or {}, small, reference
        self.lms, self.tables, self.text = dict(lms or {}), {}, text
        self._train_ids = None            # train_text() as token ids, once
        self.lock = threading.RLock()      # re-entrant: automaton() builds ngram() inside

    def train_text(self):
        """What the n-gram LMs are fitted on: `text` (an in-domain control) or the checkpoint's
        train split (its pretraining corpus: task-independent, as Kim's C4 n-grams)."""
        return self.text if self.text is not None else split_text(self.ck, "train")

    def small_lm(self):
        """The rescorer of 'neural' (Kim §7.1): the checkpoint's small GPT, or what its model
        family builds (SmolLM2: an early exit of the base model itself, smollm.EarlyExit)."""
        with self.lock:
            return self._small_lm()

    def _small_lm(self):
        if self._small is None:
            if "rescorer" not in self.ck:
                raise ValueError("this checkpoint has no rescorer LM for 'neural'; "
                                 f"{retrain(self.ck.get('path'), train_kind(self.ck))}")
            family = family_module(self.ck)
            if family is not None:
                self._small = family.rescorer(self.model, self.ck).eval()
            else:
                w, path = self.model.lm_head.weight, self.ck.get("path")
                self._small = build_model(self.ck["rescorer_config"], self.ck["rescorer"],
                                          w.device, w.dtype, "the checkpoint's rescorer", path,
                                          train_kind(self.ck))
        return self._small

    def ngram(self, order):
        """The NgramLM of this order, fitted on train_text() (tokenized once: SmolLM2's BPE
        takes a second for its train split)."""
        with self.lock:
            if order not in self.lms:
                if self._train_ids is None:
                    self._train_ids = encode(self.train_text(), self.ck["vocab"])
                self.lms[order] = NgramLM(order, self.model.config.vocab_size).fit(self._train_ids)
            return self.lms[order]

    def table(self, order):
        """Its numpy lookup table, for p-best's DP in the decode loop."""
        with self.lock:
            if order not in self.tables:
                self.tables[order] = NgramTable(self.ngram(order))
            return self.tables[order]

    def automaton(self, order):
        """Its back-off automaton, for the p = 1 Viterbi; every row built up front when they fit
        viterbi.EAGER_BYTES (else on first use: the rows then persist across drafters)."""
        with self.lock:
            if ("automaton", order) not in self.tables:
                auto = NgramAutomaton(self.ngram(order))
                if auto.rows_bytes() <= EAGER_BYTES:
                    auto.build_all()
                self.tables["automaton", order] = auto
            return self.tables["automaton", order]
