"""fastlattice: the fast twin of lattice.py's p-best DP, the code the decode loop runs by default
(Kim et al. 2024, arXiv 2404.09221v2, §7.2).

  best_paths_fast    the p best lattice paths by whole-array numpy operations (NgramTable: the
                     n-gram LM's lookups as sorted int64 codes, or whole dense tables);
  top_k_ids          a lattice's candidates without sorting whole rows (SmolLM2's 49,152);
  FastPBestDrafter   lattice.PBestDrafter with both, its settings checked, its drafting work
                     counted and a node budget (ours).
It builds on lattice.py (the scoring rule `interpolate`, Lattice) and returns exactly
lattice.best_paths' paths (tests/test_lattice.py: against it and brute force). The p = 1
Viterbi of `ngram` is decoders/viterbi.py.
"""
import math
from operator import index

import numpy as np

from decoders.budgets import (check_dp_budget, check_settings, lattice_lookups,
                               within_budget)
from lattice import Lattice, PBestDrafter, head_lattice, interpolate

DENSE_MAX = 2 ** 21   # log-prob tables up to this many entries (16 MB) are precomputed whole


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


def fast_lattice(logprobs, context, k):
    """lattice.head_lattice, its candidates found by top_k_ids: the same lattice."""
    lp = logprobs.detach().double().cpu().numpy()
    return Lattice.from_logprobs(lp, k, first=context[-1], top=top_k_ids(lp, k))


def lm_contexts(lm):
    """Every context an NgramLM has an entry for (a term or a gamma), as tuples."""
    return [tuple(c) for j in range(lm.order)
            for c in [*lm.gammas[j], *(c for c, _ in lm.terms[j])]]


def lookup_sorted(keys, values, query, default):
    """values at the sorted int64 keys equal to query (any shape), default where absent: the
    sparse tables' one lookup (NgramTable, the row-free NgramAutomaton)."""
    if len(keys) == 0:
        return np.full(np.shape(query), default)
    i = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
    return np.where(keys[i] == query, values[i], default)


class NgramTable:
    """numpy twin of an NgramLM's lookup: per context length j, the keys (c_j, w) of terms[j]
    and c_j of gammas[j] as sorted int64 codes, values alongside; np.searchsorted. A context's
    code is its tokens as a number in base V while V^order fits int64 (the character models),
    else its id in a suffix trie of the LM's contexts (SmolLM2's 49,152 tokens at order 5);
    either way the code of c_j is the code of c_{j-1} with one older token prepended (prepend),
    and (c, w) is code(c) x V + w. dense[J], where V^(J+1) <= DENSE_MAX: every log P(w | c_J) as
    an array [V] * (J + 1), computed by the same operations, so a lookup is one indexing (for a
    3-gram over 103 characters: 1.1M entries; the DP's per-step LM work then all but vanishes)."""

    def __init__(self, lm, dense=True, wide=None):
        self.order, self.V = index(lm.order), index(lm.vocab_size)
        self.wide = self.V ** self.order >= 2 ** 63 if wide is None else bool(wide)
        if self.wide:
            self._suffix_trie(lm)
        self.terms = [self._table({self._code(c) * self.V + w: v for (c, w), v in d.items()})
                      for d in lm.terms]
        self.gammas = [self._table({self._code(c): v for c, v in d.items()}) for d in lm.gammas]
        self.dense = []
        for J in range(self.order if dense else 0):
            if self.V ** (J + 1) > DENSE_MAX:
                break
            grid = np.indices([self.V] * (J + 1)).reshape(J + 1, -1).T      # [V^(J+1), J + 1]
            self.dense.append(self.logprob(grid[:, :J], grid[:, J]).reshape([self.V] * (J + 1)))

    def _suffix_trie(self, lm):
        """Ids of every context of the LM and of its suffixes (() is 0), and the trie's edges:
        key id(c[1:]) x V + c[0] -> id(c), sorted, for prepend."""
        contexts = {()} | {c[a:] for c in lm_contexts(lm) for a in range(len(c))}
        self.ids = {c: i for i, c in enumerate(sorted(contexts, key=lambda c: (len(c), c)))}
        if len(self.ids) * self.V >= 2 ** 63:
            raise ValueError(f"{len(self.ids):,} contexts x V = {self.V:,} do not fit int64 codes")
        edges = sorted((self.ids[c[1:]] * self.V + c[0], i) for c, i in self.ids.items() if c)
        self.edges = (np.array([e[0] for e in edges], dtype=np.int64),
                      np.array([e[1] for e in edges], dtype=np.int64))

    def _code(self, context):
        if self.wide:
            return self.ids[tuple(context)]
        return sum(t * self.V ** e for e, t in enumerate(reversed(context)))

    def prepend(self, code, token, j):
        """The code of (token,) + c from the code of c, a context of j - 1 tokens (broadcast).
        Wide codes: -1 for a context the LM never saw (nor, then, any extension of it)."""
        if not self.wide:
            return code + token * self.V ** (j - 1)
        return lookup_sorted(*self.edges, code * self.V + token, -1)

    @staticmethod
    def _table(codes):  # {int code: value} -> (sorted int64 codes, float64 values)
        keys = sorted(codes)
        return np.array(keys, dtype=np.int64), np.array([codes[c] for c in keys], dtype=float)

    def back_off(self, older, tokens, J):
        """log P(tokens | c_J), broadcast, by NgramLM.logprob's float operations, then np.log:
        for j = 0..J, p = term_j(c_j, w) + gamma_j(c_j) * p, where c_j is c_{j-1} after the
        token j positions back, older(j) (token ids that broadcast with tokens)."""
        p, code = 1.0 / self.V, np.zeros((), dtype=np.int64)    # the code of c_0 = ()
        for j in range(J + 1):
            if j:
                code = self.prepend(code, older(j), j)
            term = lookup_sorted(*self.terms[j], code * self.V + tokens, 0.0)
            p = term + lookup_sorted(*self.gammas[j], code, 1.0) * p
        return np.log(p)

    def logprob(self, contexts, tokens):
        """log P(tokens[r] | contexts[r]) [N]: contexts int [N, J] (only the last order-1
        columns count), tokens [N]. NgramLM.logprob's float operations, then np.log."""
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        ctx = np.asarray(contexts, dtype=np.int64).reshape(len(tokens), -1)
        ctx = ctx[:, ctx.shape[1] - min(self.order - 1, ctx.shape[1]):]
        if any(a.size and (a.min() < 0 or a.max() >= self.V) for a in (tokens, ctx)):
            raise ValueError(f"token ids must be in [0, {self.V})")
        return self.back_off(lambda j: ctx[:, -j], tokens, ctx.shape[1])


def _lm_block(table, hist, cands, i, n):
    """LM log-probs of position i's candidates after each state: [K_{i-m}, .., K_{i-1}, K_i],
    m = min(n, i) path positions of context (older ones come from hist). Context length j
    involves only the last j positions, so its lookups broadcast over the others."""
    m = min(n, i)
    axes = [np.array(cands[i - m + a], dtype=np.int64).reshape([-1] + [1] * (m - a))
            for a in range(m + 1)]  # axes[a]: ids of position i-m+a along axis a; axes[m]: next
    J = min(n, len(hist) + i)      # the context length the LM sees here
    if J < len(table.dense):       # precomputed: the same values, by indexing
        from_path = min(J, i)
        idx = [*hist[len(hist) - (J - from_path):], *axes[m - from_path:]]
        out = table.dense[J][tuple(idx)]
        return out.reshape((1,) * (m + 1 - out.ndim) + out.shape)

    def older(j):  # the token j positions back: a path position or history
        return axes[m - j] if j <= m else hist[len(hist) - (j - m)]
    return table.back_off(older, axes[m], J)


def _select(scores, p, ranks):
    """Column indices [G, min(p, M)] of the p best of each row of scores [G, M] by (score desc,
    rank tuple asc), unordered. np.partition finds each row's p-th best score; only rows with a
    tie across that cut need the rank tuples (ranks(flat indices) -> [.., L]) and a lexsort."""
    G, M = scores.shape
    if M <= p:
        return np.broadcast_to(np.arange(M), (G, M))
    if G == 1 and M >= 64 * p:  # one huge row (the last position): the p-th best of the maxima
        c = M // 64  # of 64-wide chunks (distinct elements) bounds its p-th best from below
        lb = np.partition(scores[0, :c * 64].reshape(c, 64).max(1), c - p)[c - p]
        keep = np.flatnonzero(scores[0] >= lb)
        if len(keep) < M:  # (else all tie: fall through)
            return keep[_select(scores[:, keep], p, lambda f: ranks(keep[f]))]
    kth = np.partition(scores, M - p, axis=1)[:, M - p, None]  # p-th largest per row [G, 1]
    mask = scores >= kth
    hard = mask.sum(1) > p
    if not hard.any():  # the common case: exactly p scores >= kth in every row
        return np.nonzero(mask)[1].reshape(G, p)
    cols = np.empty((G, p), dtype=np.int64)
    cols[~hard] = np.nonzero(mask[~hard])[1].reshape(-1, p)
    r = ranks(np.nonzero(hard)[0][:, None] * M + np.arange(M))  # [rows, M, L]
    cols[hard] = np.lexsort([*np.moveaxis(r, -1, 0)[::-1], -scores[hard]])[:, :p]
    return cols


def _extend(S, term, m, n):
    """Every partial in S [K.. (m), Q] extended by every candidate (term [K.. (m), K]) as E,
    laid out [new state axes.., competing axes..]; also E's axes of S's axes, of the rank at
    this position, and how many leading axes form the new state."""
    if m < n or n == 0:  # the state keeps all its axes and gains this position (or is empty)
        E = S[..., None, :] + term[..., None]  # [K.. (m), K, Q]
        return E, [*range(m), m + 1], m, (m + 1 if n else 0)
    # The oldest axis leaves the state: its partials compete in the new state.
    E = np.add(np.expand_dims(S.transpose([*range(1, m), 0, m]), m - 1),
               term.transpose([*range(1, m + 1), 0])[..., None], order="C")
    return E, [m, *range(m - 1), m + 1], m - 1, m  # E: [K.. (m - 1), K, K_oldest, Q]


def unravel(flat, shape):
    """np.unravel_index(flat, shape) by integer arithmetic. numpy 2.x's own returns wrong
    coordinates for an (N, 1) index array of more than 8,192 entries, the shape _select's
    columns have (a numpy bug, shown by tests/test_lattice.py): p-best then returned the right
    scores on the wrong paths. -> one int64 array per axis, each of flat's shape."""
    coords, flat = [], np.asarray(flat, dtype=np.int64)
    for size in reversed(shape):
        flat, r = np.divmod(flat, size)
        coords.append(r)
    return coords[::-1]


def ravel(coords, shape):
    """np.ravel_multi_index(coords, shape) by integer arithmetic (see unravel)."""
    flat = np.zeros(np.shape(coords[0]), dtype=np.int64)
    for c, size in zip(coords, shape):
        flat = flat * size + c
    return flat


def _trace(back, idx):
    """Rank tuples [.., len(back)] of the partials at indices idx (any shape) of the latest S,
    following back-pointers back[i] = (parent index in the previous S, rank at position i)."""
    cols = []
    for parent, rank in reversed(back):
        cols.append(rank[idx])
        idx = parent[idx]
    return np.stack(cols[::-1], axis=-1) if cols else np.zeros(np.shape(idx) + (0,), int)


def best_paths_fast(lattice, lm, history, p, alpha, table=None):
    """Vectorised twin of best_paths (same paths; scores equal up to np.log vs math.log).

    S holds partial scores [K_{i-m+1}, .., K_i, Q]: the state (candidate ranks of the last m <= n
    positions), then its Q <= p partial paths. Pass table=NgramTable(lm) in a loop: building it
    walks the whole LM. With the LM, token ids must be < lm.vocab_size.

    Worked shapes: h = 4 positions, k = 3, a 3-gram (n = 2 tokens of state), p = 2.
      i = 0  S [1]        -> E [1, 1]        position 0's one token is the state
      i = 1  S [1, 1]     -> E [1, 3, 1]     state (K0, K1), 1 partial each
      i = 2  S [1, 3, 1]  -> E [3, 3, 1, 1]  K0 leaves the state: [K1, K2, K0 competing, Q];
                                             9 groups keep their best min(p, 1) -> S [3, 3, 1]
      i = 3  S [3, 3, 1]  -> E [3, 3, 3, 1]  the last position: all 27 compete -> S [2]"""
    check_settings(p=p, alpha=alpha)
    use_lm = lm is not None and alpha != 0.0
    n = lm.order - 1 if use_lm else 0
    hist = [index(t) for t in history]
    hist = hist[max(0, len(hist) - n):] if n else []
    if use_lm:
        table = NgramTable(lm) if table is None else table
        if any(not 0 <= t < table.V for t in hist + sum(lattice.tokens, [])):
            raise ValueError(f"token ids must be in [0, {table.V}) to use the LM")
    S, back = np.zeros(1), []  # the empty path, no state axes yet; back-pointers per position
    for i in range(lattice.h):
        K, m = len(lattice.tokens[i]), min(n, i)  # m: state axes of S before position i
        term = np.array(lattice.logprobs[i]).reshape([1] * m + [K])  # [K.. (m), K]
        if use_lm:
            term = interpolate(term, _lm_block(table, hist, lattice.tokens, i, n), alpha)
        E, s_axes, r_axis, g = _extend(S, term, m, n)
        g = 0 if i == lattice.h - 1 else g  # last position: one group, the global p best

        def locate(flat):  # E flat index -> (parent index in S, rank at position i)
            at = unravel(flat, E.shape)
            return ravel([at[a] for a in s_axes], S.shape), at[r_axis]

        def ranks(flat):  # rank tuples [.., i + 1] of E's elements (only needed for ties)
            parent, rank = locate(flat)
            return np.concatenate([_trace(back, parent), rank[..., None]], axis=-1)

        E2 = E.reshape(math.prod(E.shape[:g]), -1)  # [groups, competitors]
        cols = _select(E2, p, ranks)
        parent, rank = locate(cols + np.arange(len(E2))[:, None] * E2.shape[1])
        back.append((parent.ravel(), rank.ravel()))
        S = np.take_along_axis(E2, cols, 1).reshape(E.shape[:g] + (-1,))
    S, R = S.ravel(), _trace(back, np.arange(S.size))  # R: rank tuples [N, h]
    order = np.lexsort([*R.T[::-1], -S]).tolist()  # best first, then smaller rank tuples
    return [(float(S[f]), [lattice.tokens[i][r] for i, r in enumerate(R[f])]) for f in order]


def explained_lattice(lat, paths, history, lm=None, alpha=0.0):
    """A lattice and its best paths [(score, tokens)] as plain data, for lab/trace.py to draw:
    cells[i]: position i's candidates, best first, each [token, heads' log-prob, LM log-prob
    (None without an LM), score]. The score is interpolate(head, LM, alpha) with the LM seeing
    the history and the best path's tokens before position i: what the candidate would add in
    the best path's place (an n-gram's term depends on the path before it; Kim §7.2)."""
    use_lm = lm is not None and alpha != 0.0
    best = list(paths[0][1]) if paths else [row[0] for row in lat.tokens]
    cells = []
    for i, (tokens, logprobs) in enumerate(zip(lat.tokens, lat.logprobs)):
        seen = list(history) + best[:i]
        lms = [lm.logprob(t, seen) for t in tokens] if use_lm else [None] * len(tokens)
        cells.append([[t, lp, x, lp if x is None else interpolate(lp, x, alpha)]
                      for t, lp, x in zip(tokens, logprobs, lms)])
    return {"kind": "lattice", "k": lat.k, "positions": lat.h, "alpha": alpha if use_lm else 0.0,
            "order": lm.order if use_lm else None, "cells": cells,
            "paths": [{"score": float(s), "tokens": list(map(int, t))} for s, t in paths]}


class FastPBestDrafter(PBestDrafter):
    """lattice.PBestDrafter searching with best_paths_fast on top_k_ids' lattice: the same
    drafts, fast (reference=True: lattice.py's own search and lattice, for --reference). Its
    settings are checked here, before any decoding (a DP over MAX_DP_CELLS is refused); `counts`
    tallies the n-gram lookups (the bench's cost table); nodes > 0 (ours, for speed) keeps the
    drafts' token tree within that many drafted tokens (within_budget). `table`: the LM's
    NgramTable, built once per LM (building it walks the whole LM)."""

    def __init__(self, k, p, alpha=0.0, lm=None, table=None, name="pbest", nodes=0,
                 reference=False):
        use_lm = lm is not None and alpha > 0
        check_settings(k, p, alpha, lm.order if use_lm else 1, nodes)
        check_dp_budget(k, p, lm.order if use_lm else 1, lm.vocab_size if lm is not None else k)
        super().__init__(k, p, alpha, lm, name)
        self.nodes, self.reference, self.counts = nodes, reference, {"ngram_lookups": 0}
        self.table = (table or NgramTable(lm)) if use_lm and not reference else None

    def search(self, lat, history):
        if self.reference:
            return super().search(lat, history)
        return best_paths_fast(lat, self.lm, history, self.p, self.alpha, self.table)

    record = False      # lab/trace.py turns it on: each call then keeps what explain() reads

    def __call__(self, logprobs, context):
        lat = (head_lattice if self.reference else fast_lattice)(logprobs, context, self.k)
        if self.lm is not None and self.alpha > 0:
            self.counts["ngram_lookups"] += lattice_lookups(lat.h, self.k, self.lm.vocab_size,
                                                            self.lm.order)
        paths = self.search(lat, context[:-1])
        if self.record:
            self.last_call = (lat, paths, context[:-1])
        drafts = [tokens for _, tokens in paths]
        return within_budget(drafts, self.nodes) if self.nodes else drafts

    def explain(self):
        """The last call (record on), for lab/trace.py: its lattice with each cell's scores and
        the p best paths with theirs (explained_lattice)."""
        lat, paths, history = self.last_call
        return explained_lattice(lat, paths, history, self.lm, self.alpha)
