"""viterbi: the `ngram` decoder's exact p = 1 search (Kim et al. 2024, arXiv 2404.09221v2, §7.2):
the single best lattice path by a Viterbi over the n-gram LM as a back-off automaton
(NgramAutomaton), with branch-and-bound pruning. It returns exactly lattice.best_paths(..., p=1)'s
path, score bitwise (tests/test_lattice.py: against it and brute force); ViterbiDrafter is
lattice.PBestDrafter(k, 1, alpha, lm)'s fast twin.
"""
import math
import threading
from operator import index

import numpy as np
import torch

from decoders.fastlattice import (explained_lattice, fast_lattice, lm_contexts, lookup_sorted,
                                  top_k_ids)
from decoders.budgets import check_settings
from lattice import interpolate, path_score

# At p = 1 the DP is Viterbi, one partial path per state, cheap enough for every decoding step
# on a CPU by the shared rows of NgramAutomaton, exact pruning (_viterbi) and a handful of
# whole-array numpy operations per position (numpy's per-call overhead is the cost at these sizes).

class NgramAutomaton:
    """An NgramLM (anything with order, vocab_size, terms and gammas, as in ngram.py) as a
    back-off automaton, for the p = 1 DP.

    The state of a history h is the longest suffix of h (at most order-1 tokens) in Q: the
    contexts the LM has an entry for (a term or a gamma), with all their prefixes. Exact because:
      * P(w | h) depends only on the state: a level whose context c_j is not in Q has no entry,
        so the LM's recursion computes 0.0 + 1.0 * p = p there, bitwise unchanged, and every
        level longer than the state is such a level.
      * The next state depends only on (state, w): if a suffix u + (w,) of h + (w,) is in Q,
        so is its prefix u (Q is closed under prefixes), so u is a suffix of h in Q, hence of
        the state: the next state is the longest suffix of state + (w,) in Q.
    Row s: logprob[s, w] = log P(w | state s), by NgramLM.logprob's float operations and
    math.log (bitwise equal to it); next[s, w] = the state after w. Rows are built on first use
    (or all at once: eager=True; eager=None, the decoders': when they take <= EAGER_BYTES) and
    kept; the arrays have a row per state of Q (50,429 for the shipped 5-gram), allocated up
    front but untouched until built, so only the rows built take memory (20 bytes x V each;
    eager: 12, the probabilities before the log are dropped).
    upper[w] >= log P(w | any history) bounds the DP's pruning.
    The lock serialises the DP's calls (rows and scratch arrays are shared)."""

    def __init__(self, lm, eager=False, sparse=None):
        self.lm, self.order, self.V = lm, index(lm.order), index(lm.vocab_size)
        self.n = self.order - 1                       # tokens of history the LM sees
        Q = {()} | {c[:a] for c in lm_contexts(lm) for a in range(1, len(c) + 1)}
        self.states = sorted(Q, key=lambda q: (len(q), q))   # row -> state, by length; row 0: ()
        self.ids = {q: s for s, q in enumerate(self.states)}
        R, self.lock = len(self.states), threading.Lock()
        # Per state: its suffix link (the state of q[1:]), its gamma (1.0 if none), its terms
        # and its children (the w with q + (w,) in Q) as slices of flat arrays.
        self.link = np.array([0] + [self.state(q[1:]) for q in self.states[1:]])
        self.gamma = np.array([lm.gammas[len(q)].get(q, 1.0) for q in self.states])
        self.terms = self._slices([(self.ids[tuple(c)], w, v)
                                   for j in range(self.order) for (c, w), v in lm.terms[j].items()])
        self.children = self._slices([(self.ids[q[:-1]], q[-1], s)
                                      for s, q in enumerate(self.states) if q])
        self.upper = np.log(self._upper_probs()) + 1e-9  # slack for the LM's rounding
        self.best, self.first = np.full(R, -np.inf), np.full(R, BIG)         # _merge's scratch
        self.sparse = self.V > SPARSE_V if sparse is None else bool(sparse)
        if self.sparse:
            self._sparse_tables()
            return
        self.p, self.logprob = np.empty((R, self.V)), np.empty((R, self.V))  # untouched until
        self.next = np.empty((R, self.V), dtype=np.int32)                    # built
        self.built = np.zeros(R, dtype=bool)
        self.p[0], self.next[0] = 1.0 / self.V, 0   # P_{-1} = 1/V; () after an unseen token
        self._level(np.array([0]), self.p[:1].copy())
        if eager or eager is None and self.rows_bytes() <= EAGER_BYTES:
            self.ensure(np.arange(R))   # every row now: none is built later, so the
            self.p = None               # probabilities before the log are dropped

    def _sparse_tables(self):
        """Sparse mode: each state's suffix-link chain, deepest first, padded with -1 [R, n + 1],
        and the terms and children as sorted int64 keys state x V + token."""
        R = len(self.states)
        self.chain = np.full((R, self.n + 1), -1, dtype=np.int64)
        self.chain[:, 0] = np.arange(R)
        for c in range(1, self.n + 1):              # link of the previous column, until the root
            prev = self.chain[:, c - 1]
            deeper = prev > 0
            self.chain[deeper, c] = self.link[prev[deeper]]
        self.term_keys, self.term_values = self._keys(self.terms)
        self.child_keys, self.child_ids = self._keys(self.children)

    def _keys(self, table):
        """A _slices table as (sorted keys state x V + token, values alongside)."""
        start, tokens, values = table
        owner = np.repeat(np.arange(len(self.states)), np.diff(start))
        keys = owner * self.V + tokens
        order = np.argsort(keys, kind="stable")
        return keys[order], values[order]

    def _slices(self, rows):
        """[(state id, token, value)] -> (start [R + 1], tokens, values): state s's entries are
        tokens[start[s]:start[s + 1]] and values[start[s]:start[s + 1]]."""
        rows.sort(key=lambda r: r[0])
        ids = np.array([r[0] for r in rows], dtype=np.int64)
        return (np.searchsorted(ids, np.arange(len(self.states) + 1)),
                np.array([r[1] for r in rows], dtype=np.int64), np.array([r[2] for r in rows]))

    @staticmethod
    def _entries(table, ids):
        """The entries of states ids [B] in a _slices table: (row in ids, token, value) each."""
        start, tokens, values = table
        counts = start[ids + 1] - start[ids]
        row = np.repeat(np.arange(len(ids)), counts)
        at = np.arange(counts.sum()) + np.repeat(start[ids] - np.cumsum(counts) + counts, counts)
        return row, tokens[at], values[at]

    def _upper_probs(self):
        """max over histories of P(w | h), bounded level by level: a context with a term for w
        gives at most term + gamma * (the bound below); one without, gamma * (the bound below)."""
        bound = [1.0 / self.V] * self.V
        for j in range(self.order):
            pair = [0.0] * self.V
            for (c, w), v in self.lm.terms[j].items():
                pair[w] = max(pair[w], v + self.lm.gammas[j].get(c, 1.0) * bound[w])
            g = max(1.0, max(self.lm.gammas[j].values(), default=1.0))
            bound = [max(g * b, t) for b, t in zip(bound, pair)]
        return bound

    def lookup(self, states, tokens):
        """(log P(token | state), the state after token) for state ids and token ids of one
        broadcast shape (states [N, 1] with tokens [K]: a grid [N, K]). Dense: rows, built on
        first use. Sparse: the pairs alone, by the LM's recursion along each state's chain."""
        if not self.sparse:
            self.ensure(np.asarray(states))
            return self.logprob[states, tokens], self.next[states, tokens]
        states, tokens = np.broadcast_arrays(np.asarray(states), np.asarray(tokens))
        return self._sparse_logprob(states, tokens), self._sparse_next(states, tokens)

    def _sparse_logprob(self, states, tokens):
        """_level's recursion for single (state, token) pairs: from the root up the chain,
        p = term(q, w) + gamma(q) * p, the same float operations in the same order, then math.log."""
        p = np.full(states.shape, 1.0 / self.V)
        for c in range(self.n, -1, -1):              # root first (the last valid column)
            q = self.chain[states, c]
            at = q >= 0
            term = lookup_sorted(self.term_keys, self.term_values, q * self.V + tokens, 0.0)
            p = np.where(at, term + self.gamma[np.maximum(q, 0)] * p, p)
        return np.fromiter(map(math.log, p.ravel().tolist()), float, p.size).reshape(p.shape)

    def _sparse_next(self, states, tokens):
        """The state after token: the child (q, w) of the deepest q on the chain that has one,
        else the root (as _level's rows: a state's own children override its link's)."""
        out = np.zeros(states.shape, dtype=np.int64)
        found = np.zeros(states.shape, dtype=bool)
        for c in range(self.n + 1):                  # deepest first
            q = self.chain[states, c]
            child = lookup_sorted(self.child_keys, self.child_ids, q * self.V + tokens, -1)
            new = ~found & (q >= 0) & (child >= 0)
            out[new], found = child[new], found | new
        return out

    def rows_bytes(self):
        """Memory that building every row takes (p, logprob: 8 bytes a token; next: 4)."""
        return len(self.states) * self.V * 20

    def state(self, h):
        """The state id of a history tuple h of at most order-1 tokens: its longest suffix in Q."""
        return self.ids[next(h[a:] for a in range(len(h) + 1) if h[a:] in self.ids)]

    def start(self, history):
        """The state id after `history` (token ids), its row built (dense mode)."""
        s = self.state(tuple(history[max(0, len(history) - self.n):]) if self.n else ())
        if not self.sparse:
            self.ensure(s)
        return s

    def ensure(self, ids):
        """Build the rows of state ids (an int or an int array) not built yet, and first those
        of their links (shorter states) not built yet: one batch per length, shortest first."""
        if not self.built[ids].all():
            batches = [np.unique(np.asarray(ids)[~self.built[ids]])]
            while True:
                links = self.link[batches[-1]]
                links = links[~self.built[links]]
                if len(links) == 0:
                    break
                batches.append(np.unique(links))
            for batch in reversed(batches):
                self._level(batch, self.p[self.link[batch]])

    def _level(self, ids, p):
        """Rows ids from their links' probabilities p [B, V]: the LM's recursion for state q is
        its link's, then level len(q): term(q, w) + gamma(q) * p, where a state with no entry
        computes 0.0 + 1.0 * p = p, bitwise (levels in between have no entry either)."""
        term, (row, tokens, values) = np.zeros_like(p), self._entries(self.terms, ids)
        term[row, tokens] = values
        p = term + self.gamma[ids][:, None] * p
        self.p[ids], self.next[ids] = p, self.next[self.link[ids]]
        self.logprob[ids] = np.fromiter(map(math.log, p.ravel().tolist()), float,  # as NgramLM
                                        p.size).reshape(p.shape)
        row, tokens, children = self._entries(self.children, ids)  # the link's next states, but
        self.next[ids[row], tokens] = children                     # for q's own children
        self.built[ids] = True


BIG = np.iinfo(np.int64).max
EAGER_BYTES = 2 ** 26   # ViterbiDrafter builds all automaton rows up front if they take <= 64 MB
SPARSE_V = 4096         # larger vocabularies (SmolLM2's 49,152: 983 KB a row) skip the rows
MERGE_AT = 32   # merge partials by LM state only above this many (merging costs ~13 numpy calls)


def _bounds(upper, tokens, logprobs, alpha):
    """rest[i]: an upper bound on what positions i+1.. add to any path (every LM log-prob at
    its maximum `upper`; interpolate is monotone in it), and sum_i |bound_i|, the scale of the
    tolerance. tokens, logprobs: [h, K] arrays (one operation) or lists of [K_i] arrays."""
    if isinstance(tokens, np.ndarray):
        bound = interpolate(logprobs, upper[tokens], alpha).max(1)
    else:
        bound = np.array([interpolate(x, upper[t], alpha).max() for t, x in zip(tokens, logprobs)])
    rest = np.zeros(len(bound))
    rest[:-1] = np.cumsum(bound[:0:-1])[::-1]  # rest[i] = sum of bound[i + 1:]
    return rest.tolist(), float(np.abs(bound).sum())


def _greedy(auto, s, score, tokens, logprobs, alpha):
    """The score of one real path, a lower bound on the best: left to right, the candidate with
    the best term given the state so far (its float sum, as best_paths adds it)."""
    for toks, lps in zip(tokens, logprobs):
        lm, after = auto.lookup(s, toks)
        terms = interpolate(lps, lm, alpha)
        c = terms.argmax()
        score, s = score + terms[c], after[c]
    return score


def _merge(auto, states, scores, tol):
    """Which partials (indices, ascending) survive when several reach one LM state. They are in
    rank-tuple order, and the LM cannot tell them apart from here on: every later term is the
    same for all, bitwise. So the winner is the best score, the smallest index among equal
    ones; one with a larger index and no better score never beats it. One with a smaller index
    is dropped only if more than tol below: rounding could still tie them later (as _prune)."""
    np.maximum.at(auto.best, states, scores)                 # the best score per state
    top, idx = auto.best[states], np.arange(len(states))
    tied = scores == top
    np.minimum.at(auto.first, states[tied], idx[tied])       # the winner per state
    keep = np.flatnonzero((idx <= auto.first[states]) & (scores >= top - tol))
    auto.best[states], auto.first[states] = -np.inf, BIG     # reset the scratch
    return keep


def _viterbi(auto, first, lp0, tokens, logprobs, history, alpha):
    """best_paths' p = 1 DP, exact, with pruning. Position 0 (token `first`, head log-prob lp0)
    is certain; tokens, logprobs: positions 1.. (see _bounds). -> (score, ranks of positions
    1..), lookups (LM log-probs read).

    Live partials: LM state ids [N], scores [N], in rank-tuple order. At each position every
    live partial extends by every candidate, E [N, K], flattened in rank-tuple order too; those
    that cannot reach `lower` (a greedy path's score, raised where many survive) are dropped.
    Exact, by three facts:
      * the best path P* survives pruning: its partial x_i >= score(P*) - rest[i] >= lower -
        rest[i] (rounding aside; tol covers it), since score(P*) >= lower, a real path's score;
      * it survives merging (_merge), as its state's winner or within tol of it;
      * the live set stays in rank-tuple order, so the final argmax (the first of equal
        maxima) is the smaller rank tuple of equal scores: best_paths' tie rule.
    tol = 1e-9 x (the largest |score| a surviving partial can have) exceeds the rounding of h
    additions by far: no assumption on the size of scores."""
    lm, after = auto.lookup(auto.start(history), first)
    score0 = 0.0 + interpolate(lp0, float(lm), alpha)
    s = int(after)
    if len(tokens) == 0:
        return (float(score0), []), 1
    lower = _greedy(auto, s, score0, tokens, logprobs, alpha)
    rest, scale = _bounds(auto.upper, tokens, logprobs, alpha)
    tol = 1e-9 * max(1.0, abs(lower) + abs(score0) + scale)
    states, scores, back, lookups = np.array([s]), np.array([score0]), [], 1 + len(tokens)
    for i, (toks, lps) in enumerate(zip(tokens, logprobs)):
        lm, after = auto.lookup(states[:, None], toks)                   # [N, K] each
        E = scores[:, None] + interpolate(lps, lm, alpha)
        lookups += E.size
        if i == len(tokens) - 1:
            break  # the last position: no next state, no pruning; the first of the best wins
        E = E.ravel()                                                    # [N x K]
        alive = np.flatnonzero(E >= lower - tol - rest[i])              # [M] flat indices
        if len(alive) > MERGE_AT:  # many: raise the lower bound to the best partial's greedy
            j = E.argmax()         # completion (a real path too), prune again
            lower = max(lower, _greedy(auto, after.ravel()[j], E[j], tokens[i + 1:],
                                       logprobs[i + 1:], alpha))
            alive = np.flatnonzero(E >= lower - tol - rest[i])
        nxt = after.ravel()[alive]                                       # their next states
        if len(alive) > MERGE_AT:  # many partials: merge those in one state (few: cheaper not to)
            keep = _merge(auto, nxt, E[alive], tol)
            alive, nxt = alive[keep], nxt[keep]
        states, scores = nxt, E[alive]
        back.append(alive)                                               # flat index in E
    return _backtrace(E.ravel(), back, tokens), lookups


def _backtrace(E, back, tokens):
    """The best final partial of E [N x K] (the first of equal maxima) and its ranks, followed
    back through `back` (each position's surviving flat indices). -> (score, ranks)"""
    flat, ranks = int(E.argmax()), []
    score = float(E[flat])
    for i in reversed(range(len(tokens))):  # flat index in E = parent x K + rank
        parent, rank = divmod(flat, len(tokens[i]))
        ranks.append(rank)
        flat = int(back[i - 1][parent]) if i else 0
    return score, ranks[::-1]


def _automaton(lm, automaton, history, top):
    """The automaton of lm (built if None), checked against lm and the token ids it will see."""
    auto = NgramAutomaton(lm) if automaton is None else automaton
    if auto.lm is not lm:
        raise ValueError("the automaton was built for another LM: pass NgramAutomaton(lm)")
    bad = [t for t in history[max(0, len(history) - auto.n):] if not 0 <= t < auto.V]
    if bad or top >= auto.V:
        raise ValueError(f"token ids must be in [0, {auto.V}) to use the LM, got "
                         f"{bad[0] if bad else top}")
    return auto


def ngram_draft(logprobs, context, k, alpha, lm, automaton=None, counts=None):
    """The `ngram` drafter's one draft (Kim §7.2, p = 1) from the heads' log-probs [m, V] (a
    tensor or an array) at the last accepted position: exactly best_paths(Lattice.from_logprobs(
    logprobs, k, first=context[-1]), lm, context[:-1], 1, alpha)[0][1], without a Lattice.
    top_k_ids gives from_logprobs' candidate order (log-prob desc, id asc); float32 widens
    to float64 exactly, as there. counts (a dict), if given, gains the LM log-probs read."""
    use_lm = lm is not None and alpha != 0.0
    check_settings(k, 1, alpha, lm.order if use_lm else 1)
    a = logprobs
    if isinstance(a, torch.Tensor):                      # float32 stays float32: widened below
        a = (a if a.dtype in (torch.float32, torch.float64) else a.double()).detach().cpu().numpy()
    a = np.asarray(a)
    if a.ndim != 2 or 0 in a.shape or np.isnan(a).any():
        raise ValueError(f"need NaN-free head log-probs [m, V], got shape {a.shape}")
    if len(context) == 0 or not 0 <= index(context[-1]) < a.shape[1]:
        raise ValueError(f"context[-1] must be a token id in [0, {a.shape[1]}), got "
                         f"{context[-1] if len(context) else 'an empty context'}")
    first = index(context[-1])
    lp = a[1:].astype(np.float64)                         # positions 1.. [m - 1, V], exact
    top = top_k_ids(lp, k)                                 # from_logprobs' order [m - 1, min(k, V)]
    values = lp[np.arange(len(top))[:, None], top]        # their log-probs, best first
    if not (np.isfinite(values).all() and np.isfinite(a[0, first])):
        raise ValueError("head log-probs must be finite among each position's top-k")
    if not use_lm:  # heads only: each position's first candidate
        return [first] + top[:, 0].tolist()
    n = lm.order - 1
    history = [index(t) for t in context[max(0, len(context) - 1 - n):len(context) - 1]]
    auto = _automaton(lm, automaton, history, a.shape[1] - 1)
    with auto.lock:
        (_, ranks), lookups = _viterbi(auto, first, float(a[0, first]), top, values, history,
                                       alpha)
    if counts is not None:
        counts["ngram_lookups"] = counts.get("ngram_lookups", 0) + lookups
    return [first] + top[np.arange(len(ranks)), ranks].tolist()


class ViterbiDrafter:
    """The `ngram` decoder's drafter (Kim §7.2, p = 1) on the fast path: the same drafts as
    lattice.PBestDrafter(k, 1, alpha, lm), by ngram_draft. Build it once per LM: its automaton walks
    the LM once; it builds all its rows up front when they take at most EAGER_BYTES (the
    shipped 3- and 4-gram), else each on first use. Sharing it between threads is safe (a lock)."""
    name, max_drafts = "ngram", 1

    def __init__(self, k, alpha, lm, automaton=None):
        use_lm = lm is not None and alpha > 0
        check_settings(k, 1, alpha, lm.order if use_lm else 1)
        self.k, self.alpha, self.lm = k, alpha, lm
        if use_lm and automaton is None:
            automaton = NgramAutomaton(lm, eager=None)
        self.automaton, self.counts = automaton, {"ngram_lookups": 0}

    record = False      # lab/trace.py turns it on: each call then keeps what explain() reads

    def __call__(self, logprobs, context):
        draft = ngram_draft(logprobs, context, self.k, self.alpha, self.lm, self.automaton,
                            self.counts)
        if self.record:
            self.last_call = (logprobs, list(context), draft)
        return [draft]

    def explain(self):
        """The last call (record on), for lab/trace.py: its lattice (fast_lattice, the same
        candidates) with each cell's scores and the one best path (explained_lattice), scored by
        lattice.path_score."""
        logprobs, context, draft = self.last_call
        lat = fast_lattice(logprobs, context, self.k)
        score = path_score(lat, self.lm, context[:-1], draft, self.alpha)
        return explained_lattice(lat, [(score, draft)], context[:-1], self.lm, self.alpha)
