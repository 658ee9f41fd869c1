"""scale: the scale map. At which model size does each refined decoder beat plain BPD?

Refined drafts (Kim et al. 2024, arXiv 2404.09221v2, §7) raise block efficiency (Stern et al.
2018, §3) but verify more tokens per call and draft with work of their own; the bigger the model,
the more a call costs beside that work. docs/results/scale-map.md says how the map measures it:
one real run of the bench's prompts (`Profile`, `measure_decoders`); what does not grow with the
base model timed inside real decodes of the shipped model (`time_decoders`, `InSitu`,
`Profile.refill_ms`); what does grow timed at every size in SIZES on random weights (`row_pass`,
`tree_pass`, `size_costs`); and `ms_per_token`, which combines them, checked at the model's own
size against the bench (`validation`); `crossover_params` reads the map.

The clocks are scale_timing.py's. Nothing imports this module except modes.py.
"""
import dataclasses
import itertools
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

import decoders
from lab import analysis, bench, timing
from lab.scale_timing import InSitu, heads_pass, row_pass, timed_all, tree_pass
from minibpd import GPTConfig, window_start
from runtime.contract import max_drafts
from runtime.fast_heads import FastGPT
from runtime.kvcache import device_of
from runtime.tree import draft_tree

# The shipped shape (6 layers of width 128, 4 attention heads of 32 dims, 8 BPD heads, the shipped
# vocabulary and window), then wider and deeper ones with 32 dims per attention head: 1.45M to
# 216M parameters. scale_map() takes vocabulary, window and BPD heads from the model it is given.
SIZES = [GPTConfig(103, 128, n_layer, n_embd // 32, n_embd, 8)
         for n_layer, n_embd in ((6, 128), (8, 192), (8, 256), (12, 384), (12, 512), (16, 768),
                                 (16, 1024))]
TOKENS = (1, 2, 4, 8, 16, 32, 64)   # new tokens per call at which row_pass is timed (call_ms)
GREEDY = decoders.baseline_name(0.0)


# ----------------------------------------------------------------------------- one real run

@dataclass
class Profile:
    """One decoder's real run over the bench's prompts (counts are totals over all prompts), and
    its costs that do not grow with the base model, timed in situ at the shipped size."""
    tokens: int                 # new tokens generated
    calls: int                  # serial model calls, the prefills included
    steps: int                  # calls that verified drafts (the others: prefill, window edges)
    windows: int                # calls feeding a whole window (the prefill, each window move)
    window_tail: float          # their mean tail: the tokens each feeds on an empty cache
    verified: float = 0.0       # drafted tokens per step as verified: m in a row, or tree nodes
    tree: bool = False          # several drafts, verified as one token tree (verify "auto")
    drafts: list = None         # a tree decoder's real step nearest its mean tree size
    drafting_ms: float = 0.0    # in situ: the drafter's calls, per draft step
    forward_ms: float = 0.0     # in situ: the forward passes, per call
    rest_ms: float = 0.0        # in situ: the rest of the decode, per call (the heads included)
    outside_ms: float = 0.0     # rest_ms less the heads: the work outside the call, per call
    refill_ms: float = 0.0      # forward_ms less the same passes timed in a tight loop, per call

    def to_json(self):
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "drafts"}

    def split_rest(self, cost, name):
        """outside_ms and refill_ms, from the tight-loop costs at the size timed in situ. The
        refill: a forward pass inside a decode, after the drafter and the loop (and whatever else
        the machine runs), finds less of the model in the CPU's caches than one right after
        another. It is kept as a constant per call; where the weights outgrow the caches, a tight
        loop streams them too, and the constant then overstates every call alike."""
        self.outside_ms = self.rest_ms - cost["heads_ms"] * self.steps / self.calls
        self.refill_ms = self.forward_ms - forward_total(self, cost, name) / self.calls


def window_tails(plen, accepted, B):
    """Tails of the calls that feed a whole window: the prefill, and each call after the window
    moved (KVCache.tail empties the cache; the tail is then the new window up to t). ts: the
    position each call predicts, the prefill plen, call i plen + the tokens gained before it
    (bpd_decode's Stats.accepted: one entry per call)."""
    ts = list(itertools.accumulate(accepted[:-1], initial=plen))
    starts = [window_start(t, B) for t in ts]
    return [t - s for i, (t, s) in enumerate(zip(ts, starts)) if i == 0 or s != starts[i - 1]]


def profile(runs, prompts, n, B, tree=False):
    """The Profile of one decoder's runs (bpd_decode stats, one per prompt); greedy: runs=None,
    one token per call. verified comes from analysis.verify_tokens (per call), made per step."""
    accepted = [r["accepted"] for r in runs] if runs else [[1] * n for _ in prompts]
    tails = [t for p, a in zip(prompts, accepted) for t in window_tails(len(p), a, B)]
    steps = [s for r in runs or [] for s in r["steps"]]
    calls = sum(map(len, accepted))
    p = Profile(tokens=len(prompts) * n, calls=calls, steps=len(steps), windows=len(tails),
                window_tail=statistics.mean(tails), tree=tree)
    if steps:
        p.verified = analysis.verify_tokens(runs)["tree" if tree else "batch"] * calls / len(steps)
    if steps and tree:
        nodes = lambda s: len(draft_tree([d[1:] for d in s["drafts"]])[0])
        p.drafts = min(steps, key=lambda s: abs(nodes(s) - p.verified))["drafts"]
    return p


def measure_decoders(run):
    """One real run of greedy and every decoder that does not peek on the run's prompts
    (bench.decode_all). -> ({name: Profile}, greedy first; {name: its outputs equal greedy's};
    plain BPD's runs)."""
    prompts, n, B = run.prompts, run.n, run.model.config.block_size
    greedy = run.continuations()
    runs, outs, _ = bench.decode_all(run)
    names = [k for k, d in decoders.active().items() if not d.peeks]
    out = {GREEDY: profile(None, prompts, n, B)}
    for name in names:
        several = max_drafts(decoders.make(name, run.res, run.chosen[name])) > 1
        out[name] = profile(runs[name], prompts, n, B, several)
    return out, {k: outs[k] == greedy for k in names}, runs[decoders.PLAIN]


def time_decoders(run, profiles):
    """timing.timings of the run over every profiled method, each next to its InSitu twin
    (interleaved, so that machine noise hits both alike); fills each Profile's in-situ costs.
    -> timing.speed_summary of the plain methods (the bench's tokens_per_s, timing_warnings)."""
    plain = [decoders.method(k, run.res, run.chosen.get(k, {})) for k in profiles]
    twins = [InSitu(decoders.method(k, run.res, run.chosen.get(k, {}))) for k in profiles]
    times = timing.timings(run, [m for pair in zip(plain, twins) for m in pair])
    for (name, p), twin in zip(profiles.items(), twins):
        p.drafting_ms, p.forward_ms, p.rest_ms = twin.medians(times[twin.name], len(run.prompts))
    return timing.speed_summary(run, {m.name: times[m.name] for m in plain}, GREEDY)


# ----------------------------------------------------------------------------- the projection

def interp(costs, tokens):
    """A forward pass's ms at `tokens` new tokens, linear between the measured token counts."""
    xs = sorted(costs, key=int)
    return float(np.interp(tokens, [int(x) for x in xs], [costs[x] for x in xs]))


def forward_total(p, cost, name=None):
    """ms of a run's forward passes at one size: its draft steps verify, the other calls feed one
    token, and each window call feeds a whole window instead of one token. verify is
    call(1 + verified) for one draft (the new token and m drafted tokens in one row), or the
    decoder's real tree (cost["tree_ms"][name]) for several."""
    one = interp(cost["call_ms"], 1)
    tree = p.tree and p.steps
    verify = cost["tree_ms"][name] if tree else interp(cost["call_ms"], 1 + p.verified)
    return p.steps * verify + (p.calls - p.steps) * one + p.windows * (cost["window_ms"] - one)


def ms_per_token(p, cost, name=None, refill=True):
    """Projected ms per generated token of a decoder with Profile p at one size, from that size's
    tight-loop costs (call_ms {tokens: ms}, tree_ms {decoder: ms}, window_ms, heads_ms):

        [ forward_total                                  the forward passes at this size
          + calls x (outside + refill)                   the rest of each call, timed in situ
          + steps x (drafting + heads) ] / tokens        the drafter; the heads at this size

    That is calls/token x [call + the work outside it] + drafting x steps/token, with three terms
    found by measurement: the whole-window calls, the heads' growth with the model, and the
    refill of the CPU's caches before each forward pass (refill=False leaves it out: the
    tight-loop prediction). Greedy (steps 0): call(1) per token, its whole-window calls and its
    own work outside the call."""
    outside = p.outside_ms + (p.refill_ms if refill else 0.0)
    total = forward_total(p, cost, name) + p.calls * outside + p.steps * (p.drafting_ms +
                                                                           cost["heads_ms"])
    return total / p.tokens


def crossover_params(rows, against=decoders.PLAIN, names=None):
    """{decoder: the parameters of the smallest size in the map at which its projected tokens/s
    beats `against`'s, or None if it never does}; names: default every refined decoder."""
    names = names if names is not None else [n for n in decoders.refined()
                                             if n in rows[0]["projected_tokens_per_s"]]
    beats = lambda r, n: r["projected_tokens_per_s"][n] > r["projected_tokens_per_s"][against]
    return {n: next((r["params"] for r in rows if beats(r, n)), None) for n in names}


# ----------------------------------------------------------------------------- the map

def sizes(model):
    """The map's configurations: the model's own shape first (where the projection is checked),
    then each SIZES entry with more layers x width^2, with the model's vocabulary, window and
    BPD heads."""
    c, weight = model.config, lambda s: s.n_layer * s.n_embd ** 2
    fit = lambda s: dataclasses.replace(s, vocab_size=c.vocab_size, block_size=c.block_size,
                                        n_bpd_heads=c.n_bpd_heads)
    return [dataclasses.replace(c, dropout=0.0)] + [fit(s) for s in SIZES if weight(s) > weight(c)]


@torch.no_grad()
def size_costs(cfg, profiles, cached, window, device, dtype):
    """Every cost the projection needs at one size, timed together (timed_all) on a random model
    of config cfg: call_ms {tokens: ms}, tree_ms {decoder: ms}, window_ms, heads_ms."""
    with torch.random.fork_rng(devices=[]):          # its random weights leave torch's seed alone
        model = FastGPT(cfg).to(device=device, dtype=dtype).eval()
    fns = {("call_ms", str(t)): row_pass(model, t, cached) for t in TOKENS
           if t <= cfg.block_size - cached}
    fns.update({("tree_ms", name): tree_pass(model, p.drafts, cached)
                for name, p in profiles.items() if p.tree and p.drafts})
    fns.update({("window_ms", None): row_pass(model, window, 0), ("heads_ms", None): heads_pass(model)})
    row = {"params": sum(p.numel() for p in model.parameters()), "n_layer": cfg.n_layer,
           "n_embd": cfg.n_embd, "call_ms": {}, "tree_ms": {}}
    for (key, sub), ms in timed_all(fns, device=device).items():
        if sub is None:
            row[key] = ms
        else:
            row[key][sub] = ms
    del model, fns
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return row


def mean_costs(a, b):
    """The mean of two timings of one size's costs (size_costs)."""
    avg = lambda x, y: {k: avg(x[k], y[k]) for k in x} if isinstance(x, dict) else (x + y) / 2
    return {**a, **{k: avg(a[k], b[k]) for k in ("call_ms", "tree_ms", "window_ms", "heads_ms")}}


def check_run(run, device):
    """Clear errors for bad input to scale_map(), before any model call."""
    model, prompts, n = run.model, run.prompts, run.n
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but CUDA is not available; use 'cpu'")
    if dev.type != device_of(model).type:
        raise ValueError(f"device {device!r}, but the model is on {device_of(model)}: both must be "
                         "timed on one device (load the checkpoint there)")
    if not prompts or isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"run needs at least one prompt and n >= 1 new tokens, got "
                         f"{len(prompts)} prompts and n={n!r}")
    if run.temperature or run.verify != "auto":      # what the profiles and projection assume
        raise ValueError(f"the scale map times greedy decoding with each decoder's own "
                         f"verification: temperature 0 and verify 'auto', got {run.temperature} "
                         f"and {run.verify!r}")


def mean_cached(runs, B):
    """Mean tokens in the KV cache at plain BPD's draft steps: context - 1 - the window's start."""
    return round(statistics.mean(s["context"] - 1 - window_start(s["context"], B)
                                 for r in runs for s in r["steps"]))


def scale_map(lab_run, device="cpu", log=print):
    """The scale map (see the module docstring) of a lab.run.Run (its prompts, n new tokens each,
    at temperature 0 with verify 'auto'): measure, project, validate at the model's own size,
    find the crossovers. -> a JSON-ready dict."""
    check_run(lab_run, device)
    model, prompts, n = lab_run.model, lab_run.prompts, lab_run.n
    t0, B, dtype = time.perf_counter(), model.config.block_size, model.lm_head.weight.dtype
    log("decoding the prompts with every decoder")
    profiles, identical, bpd_runs = measure_decoders(lab_run)
    cached = mean_cached(bpd_runs, B) if any(r["steps"] for r in bpd_runs) else B // 2
    cached = min(cached, B - model.config.n_bpd_heads)      # room for a draft after it
    window = round(statistics.mean(p.window_tail for p in profiles.values()))

    def timed_size(cfg):
        log(f"  timing a random {cfg.n_layer}-layer, width-{cfg.n_embd} model")
        return size_costs(cfg, profiles, cached, window, device, dtype)
    own, *bigger = sizes(model)
    before = timed_size(own)
    log("timing every decoder as the bench does, each beside its twin timed inside")
    measured = time_decoders(lab_run, profiles)
    rows = [mean_costs(before, timed_size(own))]  # the tight loop at the model's size, timed
    for name, p in profiles.items():              # before and after the decoders: their mean
        p.split_rest(rows[0], name)
    rows += [timed_size(cfg) for cfg in bigger]
    for row in rows:
        row["projected_tokens_per_s"] = projected(profiles, row)
    tight = [{"params": row["params"], "projected_tokens_per_s": projected(profiles, row, False)}
             for row in rows]
    return {"scale": rows, "drafting_ms": {k: p.drafting_ms for k, p in profiles.items()},
            "validation": validation(profiles, rows[0], measured["tokens_per_s"]),
            "crossover_params": crossover_params(rows),
            "beats_greedy_params": crossover_params(rows, GREEDY, list(profiles)[1:]),
            "crossover_params_tight_loop": crossover_params(tight),
            "profiles": {k: p.to_json() for k, p in profiles.items()},
            "identical_to_greedy": identical,
            "cached": cached, "window_tail": window, "settings": lab_run.chosen,
            "timing_warnings": measured["timing_warnings"], "prompts": len(prompts),
            "new_tokens": n, "device": str(device_of(model)), "threads": torch.get_num_threads(),
            "seconds": time.perf_counter() - t0}


def projected(profiles, cost, refill=True):
    """{decoder: projected tokens/s} at the size whose costs are `cost` (ms_per_token)."""
    return {k: 1e3 / ms_per_token(p, cost, k, refill) for k, p in profiles.items()}


def validation(profiles, own, tps):
    """Projected (at the model's own size, costs `own`) vs the bench's measured tokens/s `tps`:
    error = projected / measured - 1; error_tight_loop leaves the cache refill out."""
    full, tight = projected(profiles, own), projected(profiles, own, False)
    return {k: {"measured": tps[k], "projected": full[k], "error": full[k] / tps[k] - 1,
                "error_tight_loop": tight[k] / tps[k] - 1} for k in profiles}
