"""neural: the fast twin of lattice.NeuralDrafter (Kim §7.1, local rescoring with a small LM),
the one the decode loop runs by default: the small LM keeps its own KV cache across steps, so a
step feeds it the newly accepted tokens once, then one token per drafted position, and rewinds
after; the same drafts as the readable drafter (tests/decoders/test_refine.py).
"""
import threading

import torch
import torch.nn.functional as F

from decoders.budgets import check_settings
from lattice import NeuralDrafter, interpolate, rescore_locally
from minibpd import KVCache, window_start
from runtime.kvcache import model_call


def reached_positions(logprobs, reach):
    """Cost-aware drafting (ours): how many leading positions of logprobs [r, V] verification
    reaches with probability >= reach, by the heads' own estimate (their top-1 probabilities,
    multiplied); reach 0: all of them. A rescorer then works on those only; beyond, each head
    keeps its argmax. The output stays exact whatever the draft."""
    if reach <= 0:
        return len(logprobs)
    reached = logprobs[1:].max(-1).values.cumsum(0).exp().tolist()
    return 1 + next((i for i, r in enumerate(reached) if r < reach), len(reached))


def check_reach(reach):
    if isinstance(reach, bool) or not isinstance(reach, (int, float)) or not 0.0 <= reach < 1.0:
        raise ValueError(f"reach must be a number in [0, 1), got {reach!r}")


class CachedNeuralDrafter(NeuralDrafter):
    """lattice.NeuralDrafter with the small LM's own KV cache (reference=True: the readable
    pass over the window for each position, as lattice.py's). Beside the rescoring:
      reach > 0  rescore only while the heads' own estimate that verification gets that far is
                 at least `reach` (reached_positions; the rest keep the heads' argmax, no LM call);
      counts     small-LM calls and the tokens they ran, for the bench's cost table;
      lock       the small-LM cache is per-sequence state: sharing one drafter between threads is
                 safe (each call then finds another sequence and starts its cache afresh), one
                 drafter per thread is fast."""

    def __init__(self, small_lm, k, alpha, reach=0.0, reference=False):
        check_settings(k, 1, alpha)
        check_reach(reach)
        super().__init__(small_lm, k, alpha)
        self.reach, self.reference = reach, reference
        self.cache, self.cached = KVCache(small_lm), []   # cached: the committed tokens it holds
        self.lock, self.counts = threading.Lock(), {"small_lm_calls": 0, "small_lm_tokens": 0}

    @torch.no_grad()
    def __call__(self, logprobs, context):
        with self.lock:
            if self.cached != context[:len(self.cached)]:  # a new sequence: start afresh
                self.cache.start, self.cache.length = 0, 0
            lm = self.counted_plain if self.reference else self.cached_logprobs
            if self.record:            # lab/trace.py: keep each position's small-LM log-probs
                lm, self.last_call = self.recorded(lm), {"logprobs": logprobs, "lm": []}
            r = reached_positions(logprobs, self.reach)
            draft = rescore_locally(logprobs[:r], context, self.k, self.alpha, lm)
            past = logprobs[r:].topk(min(self.k, logprobs.shape[-1]), dim=-1).indices[:, 0]
            draft += past.tolist()                  # past the reach: each head's top token
            if self.record:
                self.last_call.update(draft=draft, reach=r)
            # The drafted tokens may be rejected: keep only context[:-1] in the cache, so that the
            # next step (whose context extends this one, or repeats it) feeds at least one token.
            self.cache.length = min(self.cache.length, len(context) - 1 - self.cache.start)
            self.cached = list(context[:self.cache.start + self.cache.length])
            return [draft]

    record = False      # lab/trace.py turns it on: each call then keeps what explain() reads

    def recorded(self, lm):
        """lm, its answers kept in self.last_call["lm"] (one per rescored position)."""
        def call(seq):
            out = lm(seq)
            self.last_call["lm"].append(out)
            return out
        return call

    def explain(self):
        """The last call (record on), for lab/trace.py: per drafted position, the heads' top-k
        candidates [token, heads' log-prob, small-LM log-prob, score = interpolate(head, LM,
        alpha)] and the one chosen (Kim §7.1); past the reach, no LM: the heads' argmax."""
        last = self.last_call
        top = last["logprobs"].topk(min(self.k, last["logprobs"].shape[-1]), dim=-1)
        positions = []
        for i in range(1, len(last["logprobs"])):
            heads, ids = top.values[i], top.indices[i]
            lm = last["lm"][i - 1].to(heads.dtype)[ids] if i < last["reach"] else None
            score = heads if lm is None else interpolate(heads, lm, self.alpha)
            positions.append({"chosen": last["draft"][i], "rescored": lm is not None,
                              "candidates": [list(c) for c in zip(
                                  ids.tolist(), heads.tolist(),
                                  [None] * len(ids) if lm is None else lm.tolist(), score.tolist())]})
        return {"kind": "neural", "k": self.k, "alpha": self.alpha, "positions": positions}

    def cached_logprobs(self, seq):
        """The small LM's next-token log-probs after seq [V], feeding only what its cache lacks."""
        z, fed = model_call(self.lm, self.cache, seq)
        self.cache.advance(fed)
        return self.counted(fed, F.log_softmax(self.lm.lm_head(z[0, -1]), dim=-1))

    def counted_plain(self, seq):
        fed = len(seq) - window_start(len(seq), self.lm.config.block_size)
        return self.counted(fed, self.logprobs_after(seq))

    def counted(self, fed, logprobs):
        self.counts["small_lm_calls"] += 1
        self.counts["small_lm_tokens"] += fed
        return logprobs
