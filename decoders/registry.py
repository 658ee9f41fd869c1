"""The one table of decoders: register() checks an entry and adds it to DECODERS, check() refuses
impossible settings (and, given the model, settings over a budget), make() builds a drafter, and
active() / select() say which decoders the commands run. The built-in decoders are registered
here, in the order every table shows them.
"""
import contextlib
import inspect
import re
from dataclasses import dataclass, field
from typing import Callable

import lattice
from decoders.fastlattice import FastPBestDrafter
from decoders.lookup import PromptLookupDrafter, check_copy, check_ngram
from decoders.neural import CachedNeuralDrafter, check_reach
from decoders.budgets import check_dp_budget, check_settings
from decoders.sampled import HeadSampler
from decoders.viterbi import ViterbiDrafter
from minibpd import ArgmaxDrafter
from runtime.kvcache import check_cache_budget

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
    """Clear errors for impossible settings (budgets.check_settings for k, p, alpha, order and
    nodes) and, given the model, for settings over a budget (p-best's DP: budgets.MAX_DP_CELLS;
    the cache: kvcache.MAX_CACHE_BYTES): all before any model call. Errors name the decoder."""
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
            drafts, copy = s.get("p", 1) + 1, s["copy"]
            try:                          # the tree runtime.loop.verifier builds for them
                check_cache_budget(model, 1, (drafts - 1) * copy)
            except ValueError as e:
                raise ValueError(f"copy {copy}: a token tree of {drafts} drafts of up to {copy} "
                                 f"tokens: {e}") from None
        if "k" in s and ("p" in s or "order" in s):
            order = s.get("order", 1) if s.get("alpha", 0) > 0 else 1
            check_dp_budget(s["k"], s.get("p", 1), order, model.config.vocab_size)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


# ----------------------------------------------------------------------------- the decoders

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


# ----------------------------------------------------------------------------- names

def baseline_name(temperature):
    """The one-token-per-call baseline: 'greedy' at temperature 0, 'sample' above."""
    return BASELINES[0] if temperature == 0 else BASELINES[1]


def names(temperature=0.0):
    """Every name --decoder takes: the baseline, then the registered decoders."""
    return [baseline_name(temperature), *DECODERS]
