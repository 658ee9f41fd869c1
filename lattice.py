"""lattice: the top-k lattice of BPD's heads, its exact p-best global rescoring, and the drafters
that refine BPD's drafts (Kim et al. 2024, "Exploring and Improving Drafts in Blockwise Parallel
Decoding", arXiv 2404.09221v2; section numbers are v2's).

§6.3 defines the top-k lattice ("sausage") of the h heads and its oracle path; §7.1 rescores a
draft locally with a small neural LM; §7.2 rescores every path of the lattice globally with the
heads interpolated with an n-gram LM and verifies the p best.

Position i (0 .. h-1) holds head i's candidates for the token i ahead; position 0 is the base
model's greedy token, certain, so it holds one and a lattice has k^(h-1) paths. A path scores
    sum_i interpolate(head_logprob_i, lm.logprob(token_i, history + path[:i]), alpha)
(alpha = 0 or lm None: heads only, the paper's "0-gram" control). An order-n LM sees only the
last n-1 tokens, so a DP over (position, last n-1 tokens) finds the p best paths exactly. Ties
break by the rank tuple (each token's index in its position's list), lexicographically smaller
first: the heads' own ordering wins.

This module reads as the paper: the scoring rule `interpolate`, the settings and budgets, the
lattice, the readable DP `best_paths`, the oracle, local rescoring and the drafters; then one
drafter that is not in the papers, prompt lookup (PromptLookupDrafter: a copy from the context,
Saxena 2023). It imports nothing fast. The fast twins the decode loop runs by default build on it
and are checked against it (tests/test_lattice.py, tests/decoders/test_refine.py):
decoders/fastlattice.py (`best_paths_fast`, p-best by whole-array numpy operations) and
decoders/viterbi.py (the exact p = 1 Viterbi of `ngram`); `--reference` (one switch:
decoders.Resources(reference=True)) runs this module's versions instead.
"""
import math
import threading
from operator import index

import numpy as np
import torch
import torch.nn.functional as F

from minibpd import ArgmaxDrafter
from runtime.kvcache import KVCache, is_int, model_call, window_start

# ============================================================================= the scoring rule and its budgets

MAX_ORDER = 8            # n-gram orders above this take minutes to fit in pure Python
MAX_DP_CELLS = 2 ** 22   # the most partial-path scores the p-best DP may hold at one position


def interpolate(head_logprob, lm_logprob, alpha):
    """The score of one token: the heads' log-prob interpolated with an LM's (Kim §7). Works on
    floats, numpy arrays and torch tensors alike; every rescorer, path_score and the fast twins
    use it, so this is the one line to change. Our reading: Kim et al. interpolate logits; we interpolate log-probs,
    which differ per position by a constant (the log-normaliser) and so rank alike."""
    return (1 - alpha) * head_logprob + alpha * lm_logprob


def check_settings(k=1, p=1, alpha=0.0, order=1, nodes=0):
    """Clear errors for impossible settings (k larger than the vocabulary is clamped to it): the
    one check of every drafter, the registry, tuned files and the command line."""
    for name, value in (("k", k), ("p", p), ("order", order)):
        if not is_int(value) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not is_int(nodes) or nodes < 0:
        raise ValueError(f"nodes must be an integer >= 0 (0: no budget), got {nodes!r}")
    if order > MAX_ORDER:
        raise ValueError(f"order must be at most {MAX_ORDER} (a higher-order n-gram LM takes "
                         f"minutes to fit and the DP grows as k^order), got {order}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")


def dp_cells(k, p, order, V):
    """Most partial-path scores the p-best DP holds at one position: the candidates of the last
    `order` positions (the LM's state and the new token) x p. 5-gram, k=8, p=16: 524,288."""
    return min(k, V) ** order * p


def check_dp_budget(k, p, order, V):
    """Refuse, up front, a DP over MAX_DP_CELLS (docs/limits.md gives its cost)."""
    cells = dp_cells(k, p, order, V)
    if cells > MAX_DP_CELLS:
        raise ValueError(f"k={k}, p={p} with an order-{order} LM would make the p-best DP hold "
                         f"min(k, V)^order x p = {cells:,} scores a step; the budget is "
                         f"{MAX_DP_CELLS:,} (lower k, p or the order)")


def top_k_ids(lp, k):
    """The k best ids of each row of lp [h, V] (float64, NaN-free), best first, exact ties to
    the smaller id: np.argsort(-lp, axis=1, kind="stable")[:, :k], without sorting whole rows
    (SmolLM2's V = 49,152). np.partition finds each row's k-th best value; every id above it, then
    the smallest ids equal to it, make the k, and a stable sort of those k orders them."""
    h, V = lp.shape
    k = min(k, V)
    if V <= 8 * k:
        return np.argsort(-lp, axis=1, kind="stable")[:, :k]
    kth = -np.partition(-lp, k - 1, axis=1)[:, k - 1]                   # [h]
    out = np.empty((h, k), dtype=np.int64)
    for i, row in enumerate(lp):
        above = np.flatnonzero(row > kth[i])
        ids = np.sort(np.concatenate([above, np.flatnonzero(row == kth[i])[:k - len(above)]]))
        out[i] = ids[np.argsort(-row[ids], kind="stable")]
    return out


def lattice_lookups(positions, k, V, order):
    """(context, token) LM evaluations the p-best DP makes on a lattice of `positions` positions
    (the first certain): at position i, one per state x candidate."""
    K = [1] + [min(k, V)] * (positions - 1)
    return sum(math.prod(K[max(0, i - order + 1):i + 1]) for i in range(positions))


# ============================================================================= Part 1: the paper

class Lattice:
    """tokens[i]: distinct candidate ids of position i, best first; logprobs[i]: their head
    log-probs (finite, non-increasing). Position 0 holds exactly one token."""

    def __init__(self, tokens, logprobs):
        if len(tokens) == 0 or len(tokens) != len(logprobs):
            raise ValueError(f"need h >= 1 positions, got {len(tokens)} and {len(logprobs)}")
        self.tokens = [[index(t) for t in row] for row in tokens]
        self.logprobs = [[float(x) for x in row] for row in logprobs]
        for i, (toks, lps) in enumerate(zip(self.tokens, self.logprobs)):
            if not (0 < len(toks) == len(lps) == len(set(toks)) and min(toks) >= 0
                    and all(map(math.isfinite, lps)) and lps == sorted(lps, reverse=True)):
                raise ValueError(f"position {i}: need distinct ids >= 0 with finite logprobs, "
                                 f"best first; got {toks}, {lps}")
        if len(self.tokens[0]) != 1:
            raise ValueError("position 0 (the certain greedy token) needs exactly one candidate")

    @classmethod
    def from_logprobs(cls, head_logprobs, k, first=None):
        """Top-k lattice of head log-probs [h, V] (numpy, float32 or float64). Candidates are
        ordered by (logprob desc, token id asc); k is clamped to V; position 0 keeps only
        `first` (in BPD the token verification already chose) or else the argmax (smallest id
        among exact ties)."""
        k, lp = index(k), np.asarray(head_logprobs, dtype=np.float64)  # exact for float32
        if k < 1 or lp.ndim != 2 or 0 in lp.shape or np.isnan(lp).any():
            raise ValueError(f"need k >= 1 and NaN-free head_logprobs [h, V]; got k = {k}, "
                             f"shape {lp.shape}")
        # Descending lp, exact ties in id order (a stable sort of -lp, by top_k_ids). [h, min(k, V)]
        top = top_k_ids(lp, k).tolist()
        if first is not None and not 0 <= index(first) < lp.shape[1]:
            raise ValueError(f"first must be a token id in [0, {lp.shape[1]}), got {first}")
        top[0] = [index(first)] if first is not None else top[0][:1]
        return cls(top, [lp[i, toks].tolist() for i, toks in enumerate(top)])

    h = property(lambda self: len(self.tokens))
    k = property(lambda self: max(map(len, self.tokens)), doc="most candidates at a position")


def path_score(lattice, lm, history, tokens, alpha):
    """The reference score of one path (a token per position), summed left to right."""
    check_settings(alpha=alpha)
    history, path = [index(t) for t in history], [index(t) for t in tokens]
    if len(path) != lattice.h:
        raise ValueError(f"path has {len(path)} tokens, lattice has {lattice.h} positions")
    s = 0.0
    for i, tok in enumerate(path):
        if tok not in lattice.tokens[i]:
            raise ValueError(f"token {tok} is not a candidate of position {i}")
        lp = lattice.logprobs[i][lattice.tokens[i].index(tok)]
        if lm is None or alpha == 0.0:  # 0-gram control: never call the LM
            s = s + lp
        else:
            s = s + interpolate(lp, lm.logprob(tok, history + path[:i]), alpha)
    return s


def _prune(cands, p):
    """The p best (score, ranks, tokens) of one DP state. Float addition is monotone, so a
    partial path worse now stays no better after any common extension: keeping p is exact. But
    scores a few ulps apart can round to equal totals later, where ranks decide, so we also keep
    one within 1e-9 of a kept one with larger ranks (rare; assumes |score| << 1e5)."""
    cands.sort(key=lambda c: (-c[0], c[1]))
    keep = cands[:p]
    for c in cands[p:]:
        tol = 1e-9 * max(1.0, abs(c[0]))
        if cands[p - 1][0] > c[0] + tol:
            break  # this one and all worse ones are beaten by all p kept ones
        if any(y[0] <= c[0] + tol and y[1] > c[1] for y in cands[:p]):
            keep.append(c)
    return keep


def best_paths(lattice, lm, history, p, alpha):
    """The p best paths [(score, tokens)], best first (fewer if the lattice has fewer). DP over
    positions; the state, the last n-1 tokens of history + path (one state with no LM), is all
    the LM sees, so paths sharing it extend alike. Scores use path_score's float operations in
    the same order, so they are bitwise equal to it. Ties: smaller rank tuple first."""
    check_settings(p=p, alpha=alpha)
    use_lm = lm is not None and alpha != 0.0
    n = lm.order - 1 if use_lm else 0  # tokens of context the LM sees
    history = [index(t) for t in history]
    start = tuple(history[max(0, len(history) - n):]) if n else ()
    beams = {start: [(0.0, (), ())]}  # state -> [(score, rank tuple, token tuple)]
    for i in range(lattice.h):
        grown = {}
        for state, partials in beams.items():
            for r, (tok, lp) in enumerate(zip(lattice.tokens[i], lattice.logprobs[i])):
                term = interpolate(lp, lm.logprob(tok, list(state)), alpha) if use_lm else lp
                new_state = (state + (tok,))[-n:] if n else ()
                bucket = grown.setdefault(new_state, [])
                for s, ranks, toks in partials:
                    bucket.append((s + term, ranks + (r,), toks + (tok,)))
        beams = {state: _prune(cands, p) for state, cands in grown.items()}
    finals = sorted((c for cands in beams.values() for c in cands), key=lambda c: (-c[0], c[1]))
    return [(s, list(toks)) for s, _, toks in finals[:p]]


def oracle_path(lattice, greedy):
    """Kim §6.3 oracle: the path BPD verification accepts furthest, given the true greedy
    continuation greedy[0:h] (greedy[0] is position 0's token): follow greedy while it is a
    candidate, then take each position's top candidate. Verification accepts the longest prefix
    that matches greedy, and a path matching greedy on positions 0..L-1 needs greedy[i] among
    position i's candidates, so from one context no path of the lattice accepts more tokens."""
    greedy = [index(t) for t in greedy]
    if len(greedy) < lattice.h or greedy[0] != lattice.tokens[0][0]:
        raise ValueError(f"greedy needs >= {lattice.h} tokens, the first being the position 0 "
                         f"token {lattice.tokens[0][0]}; got {greedy[:lattice.h]}")
    path, hit = [], True
    for cands, g in zip(lattice.tokens, greedy):
        hit = hit and g in cands  # after the first miss nothing more is accepted
        path.append(g if hit else cands[0])
    return path


# ----------------------------------------------------------------------------- drafters (Kim §7)
# Each drafter is called by minibpd.bpd_decode as drafter(logprobs [m, V], context) and returns
# drafts of m tokens, the first being the verified token context[-1] (the contract is in
# minibpd.ArgmaxDrafter). `counts` tallies the drafting work, for the bench's cost table.
# reference=True runs the readable version of each (`--reference`): the same drafts.

def head_lattice(logprobs, context, k):
    """Top-k lattice of the heads' log-probs [m, V]; position 0 is the verified token context[-1]."""
    return Lattice.from_logprobs(logprobs.detach().double().cpu().numpy(), k, first=context[-1])


def reached_positions(logprobs, reach):
    """Cost-aware drafting (ours): how many leading positions of logprobs [m, V] verification
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


class PBestDrafter:
    """Global rescoring (Kim §7.2): the p best lattice paths under interpolate(head log-prob,
    n-gram log-prob, alpha), all verified in one call. p = 1 is 'ngram'; lm=None is the paper's
    '0-gram' control 'pbest0' (the p best paths by head scores alone). `search` is the readable
    DP best_paths; decoders.fastlattice.FastPBestDrafter replaces only it. nodes > 0 (ours, for
    speed) keeps the drafts' token tree within that many drafted tokens (within_budget).
    Settings whose DP exceeds MAX_DP_CELLS are refused here, before any decoding."""

    def __init__(self, k, p, alpha=0.0, lm=None, name="pbest", nodes=0):
        use_lm = lm is not None and alpha > 0
        check_settings(k, p, alpha, lm.order if use_lm else 1, nodes)
        check_dp_budget(k, p, lm.order if use_lm else 1, lm.vocab_size if lm is not None else k)
        self.k, self.p, self.alpha, self.lm, self.name, self.nodes = k, p, alpha, lm, name, nodes
        self.max_drafts, self.counts = p, {"ngram_lookups": 0}

    def search(self, lat, history):
        """The p best paths [(score, tokens)] of the lattice after `history`."""
        return best_paths(lat, self.lm, history, self.p, self.alpha)

    def __call__(self, logprobs, context):
        lat = head_lattice(logprobs, context, self.k)
        if self.lm is not None and self.alpha > 0:
            self.counts["ngram_lookups"] += lattice_lookups(lat.h, self.k, self.lm.vocab_size,
                                                            self.lm.order)
        drafts = [tokens for _, tokens in self.search(lat, context[:-1])]
        return within_budget(drafts, self.nodes) if self.nodes else drafts


def within_budget(drafts, nodes):
    """The drafts, best first, as long as their token tree (shared prefixes once, the certain
    first token not counted) holds at most `nodes` drafted tokens; the best draft always. The
    p best paths' trie truncated at whole paths: every draft keeps its full length, so the
    contract holds and the verified tokens per call stay at most max(nodes, m)."""
    kept, seen = [], set()
    for d in drafts:
        new = [tuple(d[:i + 1]) for i in range(1, len(d)) if tuple(d[:i + 1]) not in seen]
        if kept and len(seen) + len(new) > nodes:
            continue
        kept.append(d)
        seen.update(new)
    return kept


def rescore_locally(logprobs, context, k, alpha, lm_logprobs, positions=None):
    """Kim §7.1, local neural rescoring: walk the heads left to right; at head i pick, among its
    top-k tokens, the one maximising interpolate(head log-prob, small-LM log-prob, alpha), the
    small LM seeing the context and the tokens picked so far. logprobs [m, V]; lm_logprobs(seq)
    -> the small LM's next-token log-probs [V] after seq. Position 0 is the verified token
    context[-1]. Past `positions` (default: all) each head keeps its argmax. -> the draft."""
    top = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)             # values, indices: [m, k]
    draft = [context[-1]]
    for i in range(1, len(logprobs)):
        if positions is not None and i >= positions:
            draft.append(int(top.indices[i, 0]))
            continue
        lm = lm_logprobs(context + draft[1:]).to(top.values.dtype)        # [V]
        score = interpolate(top.values[i], lm[top.indices[i]], alpha)     # [k]
        draft.append(int(top.indices[i, score.argmax()]))
    return draft


class NeuralDrafter:
    """rescore_locally with a small LM (Kim §7.1). Fast: the small LM keeps its own KV cache across
    steps, so a step feeds it the newly accepted tokens once, then one token per drafted position,
    and rewinds its cache after. reference=True: one plain forward pass over the window per
    position (the readable loop; the same drafts). Beside the rescoring:
      reach > 0  rescore only while the heads' own estimate that verification gets that far (their
                 top-1 probabilities, multiplied) is at least `reach` (cost-aware; the rest keep
                 the heads' argmax, no LM call);
      lock       the small-LM cache is per-sequence state: sharing one drafter between threads is
                 safe (each call then finds another sequence and starts its cache afresh), one
                 drafter per thread is fast."""
    name, max_drafts = "neural", 1

    def __init__(self, small_lm, k, alpha, reach=0.0, reference=False):
        check_settings(k, 1, alpha)
        check_reach(reach)
        self.lm, self.k, self.alpha, self.reach, self.reference = small_lm, k, alpha, reach, reference
        self.cache, self.cached = KVCache(small_lm), []   # cached: the committed tokens it holds
        self.lock, self.counts = threading.Lock(), {"small_lm_calls": 0, "small_lm_tokens": 0}

    @torch.no_grad()
    def __call__(self, logprobs, context):
        with self.lock:
            if self.cached != context[:len(self.cached)]:  # a new sequence: start afresh
                self.cache.reset(0)
            lm = self.plain_logprobs if self.reference else self.cached_logprobs
            draft = rescore_locally(logprobs, context, self.k, self.alpha, lm,
                                    reached_positions(logprobs, self.reach))
            # The drafted tokens may be rejected: keep only context[:-1] in the cache, so that the
            # next step (whose context extends this one, or repeats it) feeds at least one token.
            self.cache.truncate(len(context) - 1 - self.cache.start)
            self.cached = list(context[:self.cache.start + self.cache.length])
            return [draft]

    def cached_logprobs(self, seq):
        """The small LM's next-token log-probs after seq [V], feeding only what its cache lacks."""
        z, fed = model_call(self.lm, self.cache, seq)
        self.cache.advance(fed)
        return self.counted(z[0, -1], fed)

    def plain_logprobs(self, seq):
        """The same, from one forward pass over the window and no cache (the readable version)."""
        window = seq[window_start(len(seq), self.lm.config.block_size):]
        z = self.lm(torch.tensor([window], device=self.lm.lm_head.weight.device))
        return self.counted(z[0, -1], len(window))

    def counted(self, z, fed):
        self.counts["small_lm_calls"] += 1
        self.counts["small_lm_tokens"] += fed
        return F.log_softmax(self.lm.lm_head(z), dim=-1)


# ----------------------------------------------------------------------------- prompt lookup

MAX_LOOKUP_NGRAM = 16   # ours: longer n-grams cost index entries and hardly ever match anew


def check_ngram(ngram):
    if not is_int(ngram) or not 1 <= ngram <= MAX_LOOKUP_NGRAM:
        raise ValueError(f"ngram must be an integer from 1 to {MAX_LOOKUP_NGRAM}, got {ngram!r}")


def check_copy(copy):
    if not is_int(copy) or copy < 0:
        raise ValueError(f"copy must be an integer >= 0 (0: h - 1 tokens), got {copy!r}")


def copied_continuation(context, ngram, length):
    """Prompt lookup's copy rule, the readable reverse scan: for n = ngram down to 1, the latest
    earlier occurrence of the context's last n tokens (one that ends before the last token: never
    the trailing occurrence itself, though it may overlap it) -> the at most `length` tokens that
    followed it; [] when no n matches."""
    for n in range(min(ngram, len(context) - 1), 0, -1):
        tail = context[-n:]
        for end in range(len(context) - 2, n - 2, -1):      # the occurrence ends at `end`
            if context[end - n + 1:end + 1] == tail:
                return context[end + 1:end + 1 + length]
    return []


class PromptLookupDrafter:
    """Prompt lookup decoding: copy what followed the last time the context's tail was seen
    (Saxena 2023, "Prompt Lookup Decoding"; Hugging Face transformers' `prompt_lookup_num_tokens`
    in generate()). Neither Stern nor Kim has it; here it rides on BPD's heads. The copy rule is
    copied_continuation: for n = ngram down to 1, the latest earlier occurrence of the last n
    tokens (ours: Saxena's code and transformers take the earliest); the draft is context[-1],
    then the copied tokens, and where the copy stops short, each remaining head's argmax (ours).

    The drafts, verified in one call: the base drafter's (default ArgmaxDrafter: plain BPD's
    draft; PBestDrafter for `lookup_pbest`), then the copy, unless no n matched or the copy is
    already among them. So max_drafts = base.max_drafts + 1, and the copy can only add accepted
    tokens to the base drafter's. `counts` is the base drafter's (the bench's cost table).
    nodes > 0 (ours, for speed): the copy only where the drafts' token tree stays within that
    many drafted tokens (within_budget), so that a call costs what the base drafter's does
    (SmolLM2: 7 fills an 8-row block with the tail token; docs/lookup.md).

    The fast path keeps an index {n-gram: where it last ended} and adds only the new tokens'
    n-grams each call; a context that does not extend the one indexed (another sequence) rebuilds
    it. reference=True runs the reverse scan instead: the same drafts. One drafter object serves
    one sequence at a time (the drafter contract).

    copy (ours): the most tokens one copy drafts. 0, the default: h - 1, the heads' reach. More
    (transformers' prompt_lookup_num_tokens is 10) declares max_draft_tokens = copy, so a copy
    may run past the heads; the base drafter's drafts keep their h tokens (a copy under h - 1
    shortens every draft to it, as max_draft_tokens does)."""

    def __init__(self, ngram=3, base=None, name="lookup", reference=False, copy=0, nodes=0):
        check_ngram(ngram)
        check_copy(copy)
        check_settings(nodes=nodes)
        self.base = ArgmaxDrafter() if base is None else base
        self.ngram, self.name, self.reference, self.copy = ngram, name, reference, int(copy)
        self.nodes = nodes
        if copy:
            self.max_draft_tokens = int(copy)
        self.max_drafts = getattr(self.base, "max_drafts", 1) + 1
        self.counts = getattr(self.base, "counts", {})
        self.seen, self.last = [], {}       # the context indexed; n-gram tuple -> its last end

    def __call__(self, logprobs, context):
        drafts = self.base(logprobs, context)
        most = self.copy or len(logprobs) - 1
        copy = (copied_continuation(context, self.ngram, most) if self.reference
                else self.indexed_continuation(context, most))
        if not copy:
            return drafts
        heads = logprobs[1 + len(copy):].argmax(-1).tolist()   # the positions the copy misses
        draft = [context[-1]] + copy + heads
        drafts = drafts if draft in drafts else drafts + [draft]
        return within_budget(drafts, self.nodes) if self.nodes else drafts

    def indexed_continuation(self, context, length):
        """copied_continuation by the index: O(len(context)) to check that the context extends
        the one indexed, then O(new tokens x ngram) to index them (all of it when rebuilt)."""
        if context[:len(self.seen)] != self.seen:            # another sequence: start afresh
            self.seen, self.last = [], {}
        for end in range(max(0, len(self.seen) - 1), len(context) - 1):   # never the last token
            for n in range(1, min(self.ngram, end + 1) + 1):
                self.last[tuple(context[end - n + 1:end + 1])] = end   # later ends overwrite
        self.seen = list(context)
        for n in range(min(self.ngram, len(context) - 1), 0, -1):
            end = self.last.get(tuple(context[-n:]))
            if end is not None:
                return context[end + 1:end + 1 + length]
        return []


class OracleDrafter:
    """Kim §6.3, for analysis only: it peeks at the greedy continuation (`answer` = prompt + greedy
    tokens) and proposes the lattice path that accepts the most (oracle_path). From any one
    context no drafter at the same k accepts more; over a whole generation a drafter can still
    end ahead now and then, because its steps start at different positions."""
    name, max_drafts = "oracle", 1

    def __init__(self, answer, k):
        check_settings(k)
        self.answer, self.k = answer, k

    def __call__(self, logprobs, context):
        lat = head_lattice(logprobs, context, self.k)
        n = len(context)
        if self.answer[:n] != context:  # a sampled sequence left the greedy answer: heads' top path
            return [[context[-1]] + [cands[0] for cands in lat.tokens[1:]]]
        return [oracle_path(lat, self.answer[n - 1:n - 1 + lat.h])]


