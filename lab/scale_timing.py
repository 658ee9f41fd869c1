"""scale_timing: the clocks of the scale map (scale.py): a call of a model timed in a tight
loop at a given number of new tokens, as a draft tree, or as the heads alone (row_pass,
tree_pass, heads_pass, timed together by timed_all: interleaved batches, the median kept), and,
inside real decodes of the shipped model, the time spent in the trunk's forward passes and in
the drafter (ForwardTimer, TimedDrafter, InSitu)."""
import statistics
import time

import torch
import torch.nn.functional as F

import decoders
from minibpd import KVCache
from runtime.kvcache import device_of
from runtime.tree import draft_tree, tree_layout

REPS = 5                            # repetitions of a timed call (the median is kept)
BATCH_S = 0.05                      # a timed batch repeats a short call for about this long


# ----------------------------------------------------------------------------- timing a call

def synchronize(device):
    if torch.device(device).type == "cuda":      # CUDA runs asynchronously: wait before the clock
        torch.cuda.synchronize(device)


def timed_all(fns, reps=None, device="cpu"):
    """{key: median wall-clock ms of one fns[key]()}. Each is warmed up, then `reps` rounds
    (default REPS) run one batch of every fn in turn, interleaved so that machine noise hits them
    alike; a batch repeats its fn for about BATCH_S, so that a sub-millisecond call is not lost
    in the noise."""
    def batch(fn, k):
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        synchronize(device)
        return (time.perf_counter() - t0) / k

    ks = {}
    for key, fn in fns.items():
        batch(fn, 1)                                          # warm-up
        ks[key] = max(1, int(BATCH_S / max(batch(fn, 1), 1e-7)))
    times = {key: [] for key in fns}
    for _ in range(REPS if reps is None else reps):
        for key, fn in fns.items():
            times[key].append(batch(fn, ks[key]))
    return {key: 1e3 * statistics.median(t) for key, t in times.items()}


def filled_cache(model, cached, spare=0):
    """A one-row KV cache holding `cached` tokens (any tokens: the cost does not depend on them)."""
    cache = KVCache(model, 1, spare)
    if cached:
        ids = torch.arange(cached, device=device_of(model))[None] % model.config.vocab_size
        model(ids, cache)
        cache.advance(cached)
    return cache


def row_pass(model, tokens, cached):
    """A forward pass feeding `tokens` new tokens as one causal row on top of a KV cache holding
    `cached` tokens: the model's part of a call (kvcache.model_call; building its input does not
    grow with the model and is timed in situ). It writes the cache without advancing it, so
    every repetition sees the same state. -> a function that runs it."""
    B = model.config.block_size
    if not (1 <= tokens and 0 <= cached and cached + tokens <= B):
        raise ValueError(f"row_pass: tokens ({tokens}) >= 1 and cached ({cached}) >= 0 "
                         f"must fit the window together ({B} tokens)")
    cache = filled_cache(model, cached)
    ids = torch.arange(tokens, device=device_of(model))[None] % model.config.vocab_size
    return lambda: model(ids, cache)


def tree_pass(model, drafts, cached):
    """The forward pass of one tree verification (tree.tree_call): the new token and the
    drafts' token tree (each distinct prefix once) in one row under the tree attention mask
    (tree.tree_layout), on a cache holding `cached` tokens. drafts: P lists of 1 + m tokens,
    the first the certain token, as a run's steps record them. -> a function that runs it."""
    h, B, dev = model.config.n_bpd_heads, model.config.block_size, device_of(model)
    proposed = [d[1:] for d in drafts]
    if not proposed or not 1 <= len(proposed[0]) < h or cached + 1 + len(proposed[0]) > B:
        raise ValueError(f"tree_pass: drafts of 1 to {h - 1} tokens after the certain one, "
                         f"fitting the window ({B}) after {cached} cached tokens")
    tokens, parents, _ = draft_tree(proposed)
    cache = filled_cache(model, cached, spare=(len(proposed) - 1) * (h - 1))
    ids = torch.tensor([[drafts[0][0]] + tokens], device=dev)
    layout = tree_layout(1, parents, cached, dev)
    return lambda: model(ids, cache, layout)


def heads_pass(model):
    """The heads at one position and their log-softmax (bpd_decode's predict): h - 1 BPD heads
    of 2 x width^2 weights each, so, unlike the rest of a step, they grow with the model."""
    z = torch.randn(model.config.n_embd, generator=torch.Generator().manual_seed(0))
    z = z.to(model.lm_head.weight)
    return lambda: F.log_softmax(model.head_logits(z), dim=-1)


# ----------------------------------------------------------------------------- inside real decodes

class ForwardTimer:
    """Seconds spent in model.forward (the trunk: the base model's part of a call) while active,
    through torch's module hooks; CUDA is synchronized around each pass."""

    def __init__(self, model):
        self.model, self.seconds, self.handles, self.t0 = model, 0.0, [], 0.0

    def __enter__(self):
        def before(module, args):
            synchronize(device_of(self.model))
            self.t0 = time.perf_counter()

        def after(module, args, out):
            synchronize(device_of(self.model))
            self.seconds += time.perf_counter() - self.t0
        self.handles = [self.model.register_forward_pre_hook(before),
                        self.model.register_forward_hook(after)]
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()


class TimedDrafter:
    """A drafter (the contract of minibpd.ArgmaxDrafter) that times its inner drafter's calls. It
    declares what the inner one declares (name, max_drafts, max_draft_tokens): a copy that runs
    past the heads (decoders/lookup.py) is timed drafting as far as it does untimed."""

    def __init__(self, drafter):
        self.drafter, self.seconds = drafter, 0.0

    def __getattr__(self, attr):            # only for attributes not set above
        if attr == "drafter":
            raise AttributeError(attr)
        return getattr(self.drafter, attr)

    def __call__(self, logprobs, context):
        t0 = time.perf_counter()
        drafts = self.drafter(logprobs, context)
        self.seconds += time.perf_counter() - t0
        return drafts


class InSitu(decoders.Method):
    """A decoders.Method timed from inside as it decodes: per decode, the seconds of its forward
    passes (ForwardTimer) and of its drafter's calls (TimedDrafter), its calls and draft steps."""

    def __init__(self, method):
        drafter = None if method.drafter is None else TimedDrafter(method.drafter)
        super().__init__(f"{method.name} in situ", drafter)
        self.reps, self.records = method.reps, []

    def decode(self, model, prompt, n, *args):
        before = self.drafted()
        with ForwardTimer(model) as fwd:
            out, stats = super().decode(model, prompt, n, *args)
        drafted = self.drafted() - before
        self.records.append((fwd.seconds, drafted, stats["calls"], len(stats["steps"])))
        return out, stats

    def drafted(self):
        """Seconds in the drafter's calls so far (the baseline drafts nothing)."""
        return 0.0 if self.drafter is None else self.drafter.seconds

    def medians(self, times, prompts):
        """-> medians over the repetitions of (drafter ms per draft step, forward ms per call, the
        rest ms per call), given timing.timings' seconds per repetition. The rest is the decode
        minus its forward passes and drafter calls: each call's input and tree mask, the heads,
        acceptance, the cache's bookkeeping and the loop. timing.timings decodes once to warm up,
        then every prompt per repetition: the records are grouped so."""
        recs, parts = self.records[1:], ([], [], [])
        for r, seconds in enumerate(times):
            fwd, drafted, calls, steps = map(sum, zip(*recs[r * prompts:(r + 1) * prompts]))
            for part, v in zip(parts, (drafted / max(1, steps), fwd / calls,
                                       (seconds - fwd - drafted) / calls)):
                part.append(v)
        return tuple(1e3 * statistics.median(p) for p in parts)
