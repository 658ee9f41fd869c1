"""Tests for lattice.py: the DP against brute force, the numpy twin against the DP."""
import functools
import itertools
import math
import random
import struct
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from conftest import all_paths, examples
from decoders import viterbi
from decoders.budgets import dp_cells
from decoders.fastlattice import FastPBestDrafter, NgramTable, best_paths_fast, top_k_ids
from decoders.viterbi import NgramAutomaton, ViterbiDrafter, ngram_draft
from lattice import Lattice, PBestDrafter, best_paths, head_lattice, oracle_path, path_score

pytestmark = pytest.mark.assignment5   # docs/coursework.md

try:
    from ngram import NgramLM
except ImportError:  # written concurrently; the fake LM below covers the interface meanwhile
    NgramLM = None

V = 7  # small vocabulary: contexts repeat, so the LM states actually merge paths
SETTINGS = examples(6)  # cheap: 6x the profile's examples (150 by default)


class FakeLM:
    """The NgramLM interface with random terms/gammas (uniform=True: no terms, all gammas 1)."""

    def __init__(self, order, seed, uniform=False):
        rng = random.Random(seed)
        self.order, self.vocab_size = order, V
        self.terms, self.gammas = [], []
        for j in range(order):
            ctxs = [c for c in itertools.product(range(V), repeat=j) if rng.random() < 0.6]
            self.terms.append({} if uniform else {
                (c, w): rng.random() * 0.5 for c in ctxs for w in range(V) if rng.random() < 0.5})
            self.gammas.append({} if uniform else {c: rng.uniform(0.05, 1.0) for c in ctxs})

    def logprob(self, token, history):
        J = min(self.order - 1, len(history))
        p = 1.0 / V
        for j in range(J + 1):
            c = tuple(history[len(history) - j:]) if j else ()
            p = self.terms[j].get((c, token), 0.0) + self.gammas[j].get(c, 1.0) * p
        return math.log(p)


class NoCallLM(FakeLM):
    def logprob(self, token, history):
        raise AssertionError("the LM must not be called when alpha == 0")


@functools.lru_cache(maxsize=None)
def make_lm(kind, order, seed):
    if kind == "none":
        return None
    if kind == "real" and NgramLM is not None:
        rng = random.Random(seed)  # skewed, with repeats: every order has real statistics
        corpus = [min(int(rng.expovariate(0.6)), V - 1) for _ in range(400)]
        return NgramLM(order, V).fit(corpus)
    return FakeLM(order, seed, uniform=(kind == "uniform"))


TIED = [0.0, -0.25, -0.5, -1.0, -2.25]  # dyadic: sums of these are exact, ties stay ties


@st.composite
def lattices(draw, max_h=5, max_k=4):
    h = draw(st.integers(1, max_h))
    dyadic = draw(st.booleans())
    value = st.sampled_from(TIED) if dyadic else st.floats(-20, 0, allow_subnormal=False)
    tokens, logprobs = [], []
    for i in range(h):
        k = 1 if i == 0 else draw(st.integers(1, max_k))
        tokens.append(draw(st.permutations(range(V)))[:k])
        logprobs.append(sorted((draw(value) for _ in range(k)), reverse=True))
    return Lattice(tokens, logprobs), dyadic


problems = st.tuples(
    lattices(),
    st.sampled_from(["none", "fake", "real", "uniform"]),
    st.integers(1, 4),                                        # LM order
    st.integers(0, 3),                                        # LM seed
    st.lists(st.integers(0, V - 1), max_size=6),              # history
    st.integers(1, 20),                                       # p
    st.sampled_from([0.0, 1.0, 0.5]) | st.floats(0, 1),       # alpha
)


def bits(x):
    return struct.pack("<d", x)


@SETTINGS
@given(problems)
def test_best_paths_is_brute_force(problem):
    (lat, _), kind, order, seed, history, p, alpha = problem
    lm = make_lm(kind, order, seed)
    want = all_paths(lat, lm, history, alpha)[:p]
    got = best_paths(lat, lm, history, p, alpha)
    assert [t for _, t in got] == [t for _, _, t in want]
    assert [bits(s) for s, _ in got] == [bits(s) for s, _, _ in want]  # bitwise


def near_ties(scores, tol=1e-9):
    s = sorted(scores)
    return any(b - a <= tol * max(1.0, abs(a)) for a, b in zip(s, s[1:]))


def check_fast(lat, lm, history, p, alpha, exact_arith):
    ref1 = best_paths(lat, lm, history, p + 1, alpha)  # one more: ties across the cut matter
    got, ref = best_paths_fast(lat, lm, history, p, alpha), ref1[:p]
    if lm is not None:  # the dense tables (all of V = 7 fits) give exactly the sparse lookups
        sparse = best_paths_fast(lat, lm, history, p, alpha, NgramTable(lm, dense=False))
        assert [(bits(s), t) for s, t in sparse] == [(bits(s), t) for s, t in got]
        # context codes as suffix-trie ids (SmolLM2's V^order overflows base-V codes): the same
        wide = best_paths_fast(lat, lm, history, p, alpha, NgramTable(lm, wide=True))
        assert [(bits(s), t) for s, t in wide] == [(bits(s), t) for s, t in got]
    assert len(got) == len(ref)
    no_lm = lm is None or alpha == 0
    if no_lm:  # same float operations, no log: bitwise equal scores
        assert [bits(s) for s, _ in got] == [bits(s) for s, _ in ref]
    else:
        assert np.allclose([s for s, _ in got], [s for s, _ in ref], rtol=1e-12, atol=1e-12)
    ambiguous = near_ties([s for s, _ in ref1])
    if not ambiguous or (no_lm and exact_arith):
        assert [t for _, t in got] == [t for _, t in ref]
    else:  # near-ties: np.log vs math.log, or rounding, may legitimately swap equal-ish paths
        assert len({tuple(t) for _, t in got}) == len(got)
        for s, t in got:
            assert abs(path_score(lat, lm, history, t, alpha) - s) <= 1e-9 * max(1, abs(s))


@SETTINGS
@given(problems)
def test_fast_matches_reference(problem):
    (lat, dyadic), kind, order, seed, history, p, alpha = problem
    check_fast(lat, make_lm(kind, order, seed), history, p, alpha, dyadic)


@pytest.mark.parametrize("kind", ["none", "fake", "real"])
def test_fast_long_lattice(kind):
    # 4^39 paths, many exact ties: a base-k integer code of the rank tuples would overflow.
    rng = np.random.default_rng(1)
    head = np.log(rng.dirichlet(np.ones(V), size=40))
    lat = Lattice.from_logprobs(np.round(head * 2) / 2, 4)
    check_fast(lat, make_lm(kind, 2, 0), [1, 2], 5, 0.5, True)


@pytest.mark.parametrize("order", [1, 2, 3, 4])
@pytest.mark.parametrize("p", [1, 3, 16])
@pytest.mark.parametrize("tied", [False, True])
def test_fast_bigger_lattices(order, p, tied):
    # k = 5, h = 7: thousands of paths, big final groups (the twin's pre-filter), ties.
    rng = np.random.default_rng(order * 100 + p)
    head = np.log(rng.dirichlet(np.ones(V) * 0.5, size=7))
    lat = Lattice.from_logprobs(np.round(head) if tied else head, 5)
    for kind in ("real", "uniform"):
        check_fast(lat, make_lm(kind, order, 1), [3, 1, 4], p, 0.4, tied)


@SETTINGS
@given(st.integers(1, 4), st.integers(0, 3), st.sampled_from(["fake", "real"]),
       st.lists(st.lists(st.integers(0, V - 1), max_size=5), min_size=1, max_size=8),
       st.integers(0, 6))
def test_table_logprob_matches_lm(order, seed, kind, contexts, length):
    lm = make_lm(kind, order, seed)
    table = NgramTable(lm)
    J = min(length, min(len(c) for c in contexts))  # one context length per call
    ctx = np.array([c[len(c) - J:] for c in contexts], dtype=np.int64).reshape(len(contexts), J)
    toks = np.arange(len(contexts)) % V
    want = [lm.logprob(int(w), list(c)) for c, w in zip(ctx, toks)]
    np.testing.assert_allclose(table.logprob(ctx, toks), want, rtol=1e-12, atol=1e-12)
    wide = NgramTable(lm, dense=False, wide=True)
    assert wide.logprob(ctx, toks).tobytes() == NgramTable(lm, dense=False).logprob(ctx, toks).tobytes()


def test_alpha_zero_is_the_zero_gram_control():
    lat = Lattice([[3], [1, 2], [0, 4]], [[-0.1], [-0.5, -1.5], [-0.2, -0.3]])
    lm = NoCallLM(3, 0)
    for f in (best_paths, best_paths_fast):
        assert f(lat, lm, [1, 2], 4, 0.0) == f(lat, None, [1, 2], 4, 0.7)
    assert path_score(lat, lm, [], [3, 2, 4], 0) == path_score(lat, None, [], [3, 2, 4], 0.3)
    assert path_score(lat, None, [], [3, 2, 4], 0.3) == -0.1 + -1.5 + -0.3


@pytest.mark.parametrize("p", [1, 3])
def test_all_tied(p):
    # Every path scores the same: the answer is the p smallest rank tuples.
    lat = Lattice([[0]] + [[1, 2, 3, 4, 5]] * 5, [[0.0]] + [[-1.0] * 5] * 5)
    want = [[lat.tokens[i][r] for i, r in enumerate(rk)]
            for rk in itertools.islice(itertools.product([0], *[range(5)] * 5), p)]
    for lm in (None, make_lm("uniform", 3, 0)):
        for f in (best_paths, best_paths_fast):
            assert [t for _, t in f(lat, lm, [2], p, 0.5)] == want


def test_ties_prefer_the_heads_ordering():
    lat = Lattice([[5], [2, 1, 0], [4, 3]], [[0.0]] + [[0.0] * 3] + [[0.0] * 2])
    want = [[5, 2, 4], [5, 2, 3], [5, 1, 4], [5, 1, 3], [5, 0, 4], [5, 0, 3]]
    for f in (best_paths, best_paths_fast):
        assert [t for _, t in f(lat, None, [], 10, 0.5)] == want
        assert [t for _, t in f(lat, make_lm("uniform", 3, 0), [], 10, 0.5)] == want


@SETTINGS
@given(st.integers(1, 6), st.integers(1, 12), st.integers(1, 15), st.booleans(),
       st.integers(0, 2 ** 32 - 1))
def test_from_logprobs(h, vocab, k, f32, seed):
    rng = np.random.default_rng(seed)
    lp = np.round(rng.normal(size=(h, vocab)), 1).astype(np.float32 if f32 else np.float64)
    lat = Lattice.from_logprobs(lp, k)
    assert lat.h == h and lat.k == (1 if h == 1 else min(k, vocab))
    for i in range(h):
        order = sorted(range(vocab), key=lambda w: (-float(lp[i, w]), w))
        assert lat.tokens[i] == order[:1 if i == 0 else min(k, vocab)]
        assert lat.logprobs[i] == [float(lp[i, w]) for w in lat.tokens[i]]


@SETTINGS
@given(lattices(max_h=6), st.lists(st.integers(0, V - 1), min_size=6, max_size=8))
def test_oracle_accepts_the_most(lat_dyadic, greedy):
    lat, _ = lat_dyadic
    greedy = [lat.tokens[0][0]] + greedy[1:]
    accepted = lambda path: next((i for i, (a, b) in enumerate(zip(path, greedy)) if a != b),
                                 len(path))
    oracle = oracle_path(lat, greedy)
    assert all(t in c for t, c in zip(oracle, lat.tokens)) and len(oracle) == lat.h
    best = max(accepted(t) for _, _, t in all_paths(lat, None, [], 0.0))
    assert accepted(oracle) == best
    assert oracle[best:] == [c[0] for c in lat.tokens[best:]]


def test_errors():
    ok_tokens, ok_lps = [[1], [2, 3]], [[0.0], [-1.0, -2.0]]
    for tokens, lps in [([], []), ([[1]], []), ([[1, 2], [3]], [[0.0, -1.0], [0.0]]),
                        ([[1], []], [[0.0], []]), ([[1], [2, 2]], [[0.0], [-1.0, -2.0]]),
                        ([[1], [2, 3]], [[0.0], [-2.0, -1.0]]), ([[1], [2]], [[0.0], [-1.0, 0]]),
                        ([[1], [2]], [[0.0], [float("nan")]]), ([[1], [-2]], [[0.0], [-1.0]])]:
        with pytest.raises(ValueError):
            Lattice(tokens, lps)
    lat = Lattice(ok_tokens, ok_lps)
    for p, alpha in [(0, 0.5), (-1, 0.5), (1, -0.1), (1, 1.1), (1, float("nan"))]:
        for f in (best_paths, best_paths_fast):
            with pytest.raises(ValueError):
                f(lat, None, [], p, alpha)
    for bad in (dict(k=0), dict(head_logprobs=np.zeros(3)), dict(head_logprobs=np.zeros((0, 3))),
                dict(head_logprobs=np.full((2, 3), np.nan))):
        with pytest.raises(ValueError):
            Lattice.from_logprobs(**{"head_logprobs": np.zeros((2, 3)), "k": 2, **bad})
    with pytest.raises(ValueError):
        path_score(lat, None, [], [1, 4], 0.5)  # 4 is not a candidate
    with pytest.raises(ValueError):
        path_score(lat, None, [], [1], 0.5)  # too short
    for greedy in ([2, 2], [1]):
        with pytest.raises(ValueError):
            oracle_path(lat, greedy)
    with pytest.raises(ValueError):  # token 9 is outside the LM's vocabulary
        best_paths_fast(Lattice([[1], [9]], [[0.0], [0.0]]), FakeLM(2, 0), [], 1, 0.5)
    big = FakeLM(2, 0, uniform=True)
    big.vocab_size = 2 ** 32                 # V^order overflows base-V codes: suffix-trie ids
    assert NgramTable(big).wide and NgramTable(big).logprob([[5]], [7]).tolist() == [-32 * math.log(2)]
    big.vocab_size = 2 ** 63
    with pytest.raises(ValueError, match="do not fit int64 codes"):
        NgramTable(big)
    with pytest.raises(ValueError):
        NgramTable(FakeLM(2, 0)).logprob([[0]], [V])


def test_real_ngram_lm_available():
    if NgramLM is None:
        pytest.skip("ngram.py not written yet")
    assert isinstance(make_lm("real", 3, 0), NgramLM)


def test_rounding_tie_after_pruning():
    # After position 2, (l0 + x0) + y1 is one ulp below (l0 + x1) + y0, so pruning each state
    # to p = 2 partials (the best is (x0, y0)) would drop ranks (0, 1); adding -1000 rounds
    # both to the same total, where the tie rule wants ranks (0, 1) first. best_paths keeps
    # such near-ties, so it still agrees with brute force.
    lps = [[-0.2], [-0.09327186435241008, -0.9159944803568847],
           [-0.7102534236374868, -1.5329760396419614], [-1000.0]]
    lat = Lattice([[0], [1, 2], [3, 4], [5]], lps)
    want = all_paths(lat, None, [], 0.0)
    assert want[1][1] == (0, 0, 1, 0) and want[1][0] == want[2][0]
    assert (0.0 + lps[0][0] + lps[1][0]) + lps[2][1] < (0.0 + lps[0][0] + lps[1][1]) + lps[2][0]
    assert best_paths(lat, None, [], 2, 0.0) == [(s, t) for s, _, t in want[:2]]
    check_fast(lat, None, [], 2, 0.0, False)


def test_budgets_refuse_up_front():
    lm = make_lm("real", 4, 0)
    with pytest.raises(ValueError, match="budget"):
        FastPBestDrafter(100, 16, 0.5, NgramLM(4, 200))      # 100^4 x 16 scores a step
    with pytest.raises(ValueError, match="order must be at most"):
        FastPBestDrafter(2, 1, 0.5, NgramLM(40, 3))
    assert FastPBestDrafter(8, 16, 0.5, lm).max_drafts == 16   # within the budget
    assert dp_cells(8, 16, 5, 96) == 8 ** 5 * 16 and dp_cells(100, 1, 2, 7) == 49


def test_from_logprobs_first_out_of_range():
    lp = np.log(np.full((3, 5), 0.2))
    for first in (5, -1):
        with pytest.raises(ValueError, match="first must be a token id"):
            Lattice.from_logprobs(lp, 2, first=first)


def test_interpolate_is_the_one_rule():
    """path_score and the DP use lattice.interpolate: changing it changes both alike."""
    import lattice
    lat = Lattice([[0], [1, 2]], [[0.0], [-0.5, -1.0]])
    lm = make_lm("fake", 2, 1)
    before = best_paths(lat, lm, [3], 2, 0.5)
    original = lattice.interpolate
    try:
        lattice.interpolate = lambda h, l, a: h - 10 * l        # a different rule
        after = best_paths(lat, lm, [3], 2, 0.5)
        assert [s for s, _ in after] == [path_score(lat, lm, [3], t, 0.5) for _, t in after]
        assert after != before
    finally:
        lattice.interpolate = original


# ----------------------------------------------------------------------------- the scoring rule
# Assignment 5 changes lattice.interpolate. What a rule must be is checked here (rule_problems);
# the exactness checks above and below hold for any rule that passes it, never one formula.

def shipped_rule(head, lm, alpha):
    return (1 - alpha) * head + alpha * lm


def mixture_rule(head, lm, alpha):
    """A correct alternative (the assignment's example): log((1 - a) e^head + a e^lm). Installed
    as lattice.interpolate's code, so it reads lattice's globals (math, np, torch)."""
    wh = math.log1p(-alpha) if alpha < 1 else -math.inf
    wl = math.log(alpha) if alpha > 0 else -math.inf
    if torch.is_tensor(head) or torch.is_tensor(lm):
        head = torch.as_tensor(head)
        return torch.logaddexp(head + wh, torch.as_tensor(lm, dtype=head.dtype) + wl)
    out = np.logaddexp(np.asarray(head, dtype=float) + wh, np.asarray(lm, dtype=float) + wl)
    return float(out) if np.ndim(out) == 0 else out


def unnormalised_rule(head, lm, alpha):
    """Wrong: log(e^head + e^lm) weighs nothing, so its probabilities sum to 2."""
    return np.logaddexp(np.asarray(head, dtype=float), np.asarray(lm, dtype=float))


def use_rule(monkeypatch, rule):
    """Make `rule` lattice.interpolate everywhere, as editing its body would: the decoders
    import the function itself, so its code is swapped, not the module's name."""
    import lattice
    monkeypatch.setattr(lattice.interpolate, "__code__", rule.__code__)


def rule_problems(rule):
    """What keeps `rule` from being a scoring rule the decoders can use, [] if nothing: it takes
    and gives floats, numpy arrays and tensors alike; alpha 0 is the heads, 1 the LM; it is
    non-decreasing in both log-probs (the DP's bounds rely on it); and for two distributions
    its probabilities sum to at most 1 (a mixture: exactly 1; the shipped log-linear rule: below)."""
    rng, out = np.random.default_rng(0), []
    p, q = (np.log(rng.dirichlet(np.ones(V))) for _ in range(2))
    if not isinstance(rule(-1.0, -2.0, 0.5), float) or \
            np.shape(rule(p, q, 0.5)) != p.shape or \
            not torch.is_tensor(rule(torch.tensor(p), torch.tensor(q), 0.5)):
        out.append("interface: a float for floats, an array for arrays, a tensor for tensors")
    if not (np.allclose(rule(p, q, 0.0), p) and np.allclose(rule(p, q, 1.0), q)):
        out.append("endpoints: alpha 0 must give the heads' log-probs, alpha 1 the LM's")
    for a in (0.1, 0.5, 0.9):
        if np.exp(rule(p, q, a)).sum() > 1 + 1e-9:
            out.append(f"distribution: probabilities sum to {np.exp(rule(p, q, a)).sum():.3f} > 1")
        if (np.diff(rule(np.sort(p), q[0], a)) < 0).any() or \
                (np.diff(rule(p[0], np.sort(q), a)) < 0).any():
            out.append("monotone: a higher log-prob must never score lower")
    return out


def test_interpolate_is_a_scoring_rule():
    """The check of lattice.interpolate as it stands (the shipped rule, or yours)."""
    import lattice
    assert rule_problems(lattice.interpolate) == []


def test_the_rule_check_takes_a_mixture_and_refuses_wrong_rules():
    assert rule_problems(shipped_rule) == rule_problems(mixture_rule) == []
    assert any(p.startswith("distribution") for p in rule_problems(unnormalised_rule))
    as_probs = lambda h, l, a: (1 - a) * math.e ** h + a * math.e ** l    # not a log-prob
    assert any(p.startswith("endpoints") for p in rule_problems(as_probs))


def test_the_exactness_checks_hold_under_a_mixture(monkeypatch):
    """The checks of this file judge the DP and the decoders, not the shipped formula: under a
    correct alternative rule they pass (the full assignment runs them all the same way)."""
    use_rule(monkeypatch, mixture_rule)
    import lattice
    assert lattice.interpolate(math.log(0.5), math.log(0.25), 0.5) == pytest.approx(math.log(0.375))
    test_best_paths_is_brute_force()
    test_fast_matches_reference()
    test_ngram_draft_is_the_ngram_drafter()
    test_viterbi_is_best_paths(merge_at=viterbi.MERGE_AT)
    test_interpolate_is_the_one_rule()


# ----------------------------------------------------------------------------- p = 1: Viterbi
# best_path_viterbi / ngram_draft against the readable best_paths(..., p=1): the same path and
# the same score, bitwise (the same float operations and math.log), including the tie rule.


@functools.lru_cache(maxsize=None)
def make_automaton(kind, order, seed, sparse=False):
    """One automaton per LM, shared by all examples: its rows persist from call to call, as in
    a decode, so later examples also check rows built for earlier ones. sparse: no rows, each
    (state, token) computed alone (the mode of SmolLM2's 49,152 tokens)."""
    lm = make_lm(kind, order, seed)
    return None if lm is None else NgramAutomaton(lm, sparse=sparse)


@functools.lru_cache(maxsize=None)
def make_table(kind, order, seed):
    lm = make_lm(kind, order, seed)
    return None if lm is None else NgramTable(lm)


@pytest.fixture(params=[0, 8, 32], ids=["merge-always", "merge-above-8", "merge-above-32"])
def merge_at(request, monkeypatch):
    """Merging partials by LM state is an optimisation: exact whichever partials it applies to
    (never merging is exact too, but its live set can grow as k^h where ties stop pruning)."""
    monkeypatch.setattr(viterbi, "MERGE_AT", request.param)
    return request.param


def best_path_viterbi(lat, lm, history, alpha, automaton=None):
    """best_paths(lat, lm, history, 1, alpha)[0] by viterbi's search on any Lattice:
    (score, tokens). ngram_draft runs the same search on the lattice of the heads' top-k; a
    lattice built by hand reaches the ties and orders that one never makes."""
    first, lp0 = lat.tokens[0][0], lat.logprobs[0][0]
    tokens = [np.array(t, dtype=np.int64) for t in lat.tokens[1:]]
    logprobs = [np.array(x) for x in lat.logprobs[1:]]
    if lm is None or alpha == 0.0:  # heads only: rank 0 everywhere (float sums are monotone)
        score = 0.0
        for x in lat.logprobs:    # left to right, as best_paths (the builtin sum() rounds
            score = score + x[0]  # otherwise from Python 3.12 on: compensated summation)
        return score, [t[0] for t in lat.tokens]
    auto = viterbi._automaton(lm, automaton, history, max(max(t) for t in lat.tokens))
    with auto.lock:
        (score, ranks), _ = viterbi._viterbi(auto, first, lp0, tokens, logprobs, list(history),
                                             alpha)
    return score, [first] + [int(t[r]) for t, r in zip(tokens, ranks)]


def check_viterbi(lat, lm, automaton, history, alpha):
    want = best_paths(lat, lm, history, 1, alpha)[0]
    got = best_path_viterbi(lat, lm, history, alpha, automaton)
    assert got[1] == want[1]
    assert bits(got[0]) == bits(want[0])  # bitwise: |difference| <= 1e-12 a fortiori
    if lm is not None:                    # no rows: the same path, the same bits
        sparse = best_path_viterbi(lat, lm, history, alpha, sparse_automaton(lm))
        assert sparse[1] == want[1] and bits(sparse[0]) == bits(want[0])


def sparse_automaton(lm, cache={}):
    if id(lm) not in cache:
        cache[id(lm)] = (lm, NgramAutomaton(lm, sparse=True))   # lm kept: its id stays unique
    return cache[id(lm)][1]


@SETTINGS
@given(problem=problems)
def test_viterbi_is_best_paths(problem, merge_at):
    (lat, _), kind, order, seed, history, _, alpha = problem
    check_viterbi(lat, make_lm(kind, order, seed), make_automaton(kind, order, seed), history,
                  alpha)


@examples(4)
@given(lat_dyadic=lattices(max_h=6, max_k=5), kind=st.sampled_from(["fake", "real", "uniform"]),
       order=st.integers(1, 5), seed=st.integers(0, 3),
       history=st.lists(st.integers(0, V - 1), max_size=12),          # empty .. long
       alpha=st.sampled_from([0.0, 1.0, 0.5]) | st.floats(0, 1), shared=st.booleans())
def test_viterbi_orders_1_to_5(lat_dyadic, kind, order, seed, history, alpha, shared, merge_at):
    lm = make_lm(kind, order, seed)
    check_viterbi(lat_dyadic[0], lm, make_automaton(kind, order, seed) if shared else None,
                  history, alpha)


@pytest.mark.parametrize("kind", ["fake", "real", "uniform"])
def test_viterbi_long_and_tied_lattices(kind, merge_at):
    # 40 positions, rounded log-probs (many exact ties); then all paths tied (nothing prunes).
    rng = np.random.default_rng(1)
    head = np.round(np.log(rng.dirichlet(np.ones(V), size=40)) * 2) / 2
    check_viterbi(Lattice.from_logprobs(head, 4), make_lm(kind, 3, 0), None, [1, 2], 0.5)
    tied = Lattice([[0]] + [[1, 2, 3, 4, 5]] * 5, [[0.0]] + [[-1.0] * 5] * 5)
    for alpha in (0.0, 0.5, 1.0):
        check_viterbi(tied, make_lm("uniform", 3, 0), None, [2], alpha)
        assert best_path_viterbi(tied, make_lm("uniform", 3, 0), [2], alpha)[1] == [0] + [1] * 5


class TieLM(FakeLM):
    """An order-2 LM built for test_viterbi_rounding_tie_after_merging: uniform unigram,
    contexts 1 and 2 seen (gamma 0.01: tokens 3 after 1 and 4 after 2 are nearly impossible),
    contexts 3 and 4 unseen (after them the state is the empty one)."""
    order, vocab_size = 2, V

    def __init__(self):
        self.terms = [{}, {((1,), 4): 0.5, ((2,), 3): 0.5000000000000006}]
        self.gammas = [{}, {(1,): 0.01, (2,): 0.01}]


def test_viterbi_rounding_tie_after_merging(merge_at, monkeypatch):
    # This tests the merge's tie rule, not the scoring rule: its numbers make a rounding tie
    # under the shipped rule, so it runs under that rule whatever lattice.interpolate is.
    use_rule(monkeypatch, shipped_rule)
    # Paths (0, 1, 4, 5), ranks (0, 0, 1, 0), and (0, 2, 3, 5), ranks (0, 1, 0, 0), reach the
    # empty LM state at position 2, the first one ulp below; the -1000 then rounds both totals
    # to the same value, where the tie rule wants the first. A merge that kept only the better
    # partial at position 2 would return the second.
    lat = Lattice([[0], [1, 2], [3, 4], [5]], [[-0.2], [-0.3, -0.35], [-0.4, -0.45], [-1000.0]])
    lm, first, second = TieLM(), [0, 1, 4, 5], [0, 2, 3, 5]
    part = lambda toks: path_score(Lattice(lat.tokens[:3], lat.logprobs[:3]), lm, [], toks, 0.5)
    assert part(first[:3]) == np.nextafter(part(second[:3]), -np.inf)
    want = all_paths(lat, lm, [], 0.5)
    assert [t for _, _, t in want[:2]] == [first, second] and want[0][0] == want[1][0]
    check_viterbi(lat, lm, None, [], 0.5)
    assert best_path_viterbi(lat, lm, [], 0.5)[1] == first


def test_merge_keeps_near_ties_with_smaller_ranks():
    auto = NgramAutomaton(TieLM())
    x, below = -3.0, np.nextafter(-3.0, -np.inf)       # one ulp apart
    merge = lambda scores, tol=1e-9: viterbi._merge(auto, np.zeros(len(scores), np.int64),
                                                    np.array(scores), tol).tolist()
    assert merge([x, x]) == [0]                 # exact tie: the smaller rank tuple (index) wins
    assert merge([x, below]) == [0]             # worse and larger ranks: never wins
    assert merge([below, x]) == [0, 1]          # worse by an ulp but smaller ranks: kept
    assert merge([x - 1.0, x]) == [1]           # worse beyond the tolerance: dropped
    assert merge([below, x], tol=0.0) == [1]
    assert np.isneginf(auto.best).all() and (auto.first == viterbi.BIG).all()  # scratch reset


def random_head_logprobs(rng, m, vocab, f32, tied):
    logits = rng.normal(size=(m, vocab)) * 3
    logits = np.round(logits) if tied else logits          # exact ties among the log-probs
    return torch.log_softmax(torch.tensor(logits, dtype=torch.float32 if f32 else torch.float64),
                             dim=-1)


@examples(6)
@given(m=st.integers(1, 6), k=st.integers(1, 10), f32=st.booleans(), tied=st.booleans(),
       kind=st.sampled_from(["none", "fake", "real", "uniform"]), order=st.integers(1, 5),
       seed=st.integers(0, 3), context=st.lists(st.integers(0, V - 1), min_size=1, max_size=12),
       alpha=st.sampled_from([0.0, 1.0, 0.5]) | st.floats(0, 1), rs=st.integers(0, 2 ** 32 - 1))
def test_ngram_draft_is_the_ngram_drafter(m, k, f32, tied, kind, order, seed, context, alpha, rs):
    lp = random_head_logprobs(np.random.default_rng(rs), m, V, f32, tied)   # k > V: clamped
    lm = make_lm(kind, order, seed)
    ref = best_paths(head_lattice(lp, context, k), lm, context[:-1], 2, alpha)
    auto = make_automaton(kind, order, seed)
    assert ngram_draft(lp, context, k, alpha, lm, auto) == ref[0][1]
    assert ngram_draft(lp.numpy(), list(context), k, alpha, lm) == ref[0][1]   # array, fresh
    assert ViterbiDrafter(k, alpha, lm, auto)(lp, context) == [ref[0][1]]
    # The current drafter's np.log may differ from math.log by an ulp: equal unless a near-tie.
    if len(ref) == 1 or not near_ties([s for s, _ in ref]):
        assert PBestDrafter(k, 1, alpha, lm, make_table(kind, order, seed))(lp, context) == \
            [ref[0][1]]


@pytest.mark.parametrize("kind", ["none", "uniform", "real"])
def test_ngram_draft_ties_go_to_smaller_ids(kind):
    # Every head log-prob tied: the candidates are ids 0.. k-1 in that order (from_logprobs), and
    # where the LM ties too (uniform), every path ties: the rank tuple (0, .., 0) wins.
    lp, lm = torch.log_softmax(torch.zeros(5, V), -1), make_lm(kind, 3, 0)
    want = best_paths(head_lattice(lp, [4, 6], 3), lm, [4], 1, 0.5)[0][1]
    assert ngram_draft(lp, [4, 6], 3, 0.5, lm) == want
    if kind != "real":
        assert want == [6, 0, 0, 0, 0]


def test_automaton_rows_are_the_lm():
    for kind, order in [("real", 1), ("real", 3), ("real", 5), ("fake", 4), ("uniform", 2)]:
        lm, rng = make_lm(kind, order, 0), random.Random(order)
        auto = NgramAutomaton(lm)
        for _ in range(40):
            history = [rng.randrange(V) for _ in range(rng.randrange(8))]
            s = auto.start(history)
            assert [bits(x) for x in auto.logprob[s]] == \
                [bits(lm.logprob(w, history)) for w in range(V)]           # math.log, bitwise
            assert (auto.upper >= auto.logprob[s]).all()                   # the pruning bound
            w = rng.randrange(V)
            assert auto.next[s, w] == auto.start(history + [w])            # (state, w) suffices


def test_sparse_automaton_is_the_rows():
    # No rows (SmolLM2: 983 KB each): the pairs' log-probs bitwise the rows', the same next states.
    for kind, order in [("real", 1), ("real", 3), ("real", 5), ("fake", 4), ("uniform", 2)]:
        lm = make_lm(kind, order, 0)
        rows, sparse = NgramAutomaton(lm, eager=True), NgramAutomaton(lm, sparse=True)
        assert rows.states == sparse.states and not hasattr(sparse, "logprob")
        states = np.arange(len(rows.states))[:, None]
        lp, nxt = sparse.lookup(states, np.arange(V))                         # [R, V]
        assert lp.tobytes() == rows.logprob.tobytes() and (nxt == rows.next).all()
        some = np.array([len(rows.states) - 1, 0, 0])
        assert sparse.lookup(some, np.array([1, 2, 1]))[0].tolist() == rows.logprob[some, [1, 2, 1]].tolist()


def test_viterbi_alpha_zero_never_calls_the_lm():
    lp = torch.log_softmax(torch.randn(4, V), -1)
    assert ngram_draft(lp, [1, 2], 3, 0.0, NoCallLM(3, 0)) == ngram_draft(lp, [1, 2], 3, 0.7, None)


def test_viterbi_drafter_shared_between_threads():
    lm, rng = make_lm("real", 4, 1), np.random.default_rng(0)
    work = [(random_head_logprobs(rng, 6, V, True, False), rng.integers(V, size=5).tolist())
            for _ in range(40)]
    want = [best_paths(head_lattice(lp, c, 5), lm, c[:-1], 1, 0.6)[0][1] for lp, c in work]
    drafter = ViterbiDrafter(5, 0.6, lm, NgramAutomaton(lm))  # lazy: rows built concurrently
    got = [None] * len(work)

    def run(part):
        for j in part:
            got[j] = drafter(*work[j])[0]
    threads = [threading.Thread(target=run, args=(range(t, len(work), 4),)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want and drafter.counts["ngram_lookups"] > 0


def test_automaton_eager_rows_are_the_lazy_ones():
    for kind, order in [("real", 5), ("fake", 3), ("uniform", 4)]:
        lm = make_lm(kind, order, 2)
        lazy, eager = NgramAutomaton(lm), NgramAutomaton(lm, eager=True)
        lazy.ensure(np.arange(len(lazy.states))[::-1])  # longest states first: links built first
        assert eager.built.all() and eager.p is None
        assert lazy.logprob.tobytes() == eager.logprob.tobytes()
        assert (lazy.next == eager.next).all()
        assert ViterbiDrafter(3, 0.5, lm).automaton.built.all()     # small: built up front


def test_viterbi_errors():
    lm, lp = make_lm("real", 3, 0), torch.log_softmax(torch.randn(4, V), -1)
    auto = NgramAutomaton(lm)
    bad_calls = [
        (dict(k=0), "k must be"), (dict(alpha=1.5), "alpha must be"),
        (dict(logprobs=lp[0]), r"\[m, V\]"), (dict(logprobs=lp[:0]), r"\[m, V\]"),
        (dict(logprobs=torch.full((4, V), float("nan"))), "NaN"),
        (dict(logprobs=torch.full((4, V), -float("inf"))), "finite"),
        (dict(context=[]), "empty context"), (dict(context=[1, V]), "context"),
        (dict(logprobs=torch.log_softmax(torch.randn(4, V + 2), -1)), "token ids"),
        (dict(context=[V + 3, 1]), "token ids"),
        (dict(automaton=NgramAutomaton(make_lm("real", 3, 1))), "another LM")]
    for bad, match in bad_calls:
        args = {"logprobs": lp, "context": [1, 2], "k": 3, "alpha": 0.5, "lm": lm,
                "automaton": auto, **bad}
        with pytest.raises(ValueError, match=match):
            ngram_draft(**args)
    with pytest.raises(ValueError, match="k must be"):
        ViterbiDrafter(0, 0.5, lm)


@examples(4)
@given(h=st.integers(1, 6), vocab=st.integers(1, 400), k=st.integers(1, 40),
       tied=st.booleans(), inf=st.booleans(), rs=st.integers(0, 2 ** 32 - 1))
def test_top_k_ids_is_the_stable_sort(h, vocab, k, tied, inf, rs):
    """The candidates of every lattice: without sorting whole rows (V = 49,152 for SmolLM2),
    the same ids in the same order as a stable sort, exact ties and -inf (a masked id) included."""
    rng = np.random.default_rng(rs)
    lp = rng.normal(size=(h, vocab)) * 3
    lp = np.round(lp) if tied else lp                       # many exact ties across the k-th
    if inf:
        lp[rng.random(lp.shape) < 0.5] = -np.inf
    lp[rng.random(lp.shape) < 0.05] = -0.0                  # -0.0 ties 0.0
    want = np.argsort(-lp, axis=1, kind="stable")[:, :k]
    assert top_k_ids(lp, k).tolist() == want.tolist()


# ----------------------------------------------------------------------------- wide lattices
# p-best returned the right scores on the wrong paths once the DP held more than 8,192 states of
# one candidate each: numpy 2.x's np.unravel_index misreads an (N, 1) index array past its
# iterator's buffer (a numpy bug; the first test below shows it). Small lattices never reach
# that size, so these tests build wide ones (large k, orders up to 5) and check each returned
# path's OWN score.

def test_unravel_is_numpy_unravel_index_done_right():
    from decoders.fastlattice import ravel, unravel
    flat = np.arange(29_791).reshape(-1, 1)                      # the shape _select returns
    shape = (31, 31, 31, 1, 1)
    want = [flat // 961, flat // 31 % 31, flat % 31, 0 * flat, 0 * flat]
    assert all((a == b).all() for a, b in zip(unravel(flat, shape), want))
    assert (ravel(unravel(flat, shape), shape) == flat).all()


@pytest.mark.parametrize("V_, k, order, p, h", [(31, 31, 4, 3, 6), (12, 12, 5, 4, 7),
                                                (40, 16, 4, 4, 7), (21, 21, 4, 1, 5)])
def test_wide_lattices_return_each_path_with_its_own_score(V_, k, order, p, h):
    rng = random.Random(V_ * 1000 + order)
    lm = NgramLM(order, V_).fit([rng.randrange(V_) for _ in range(400)])
    head = np.log(np.random.default_rng(order).dirichlet(np.ones(V_), size=h))
    lat = Lattice.from_logprobs(head, k, first=rng.randrange(V_))
    history = [rng.randrange(V_) for _ in range(5)]
    got = best_paths_fast(lat, lm, history, p, 0.7)
    for s, tokens in got:
        assert abs(path_score(lat, lm, history, tokens, 0.7) - s) <= 1e-9 * max(1, abs(s)), tokens
    best = best_path_viterbi(lat, lm, history, 0.7)
    assert got[0][1] == best[1] and abs(got[0][0] - best[0]) <= 1e-9 * max(1, abs(best[0]))
    scores = [s for s, _ in got]
    assert scores == sorted(scores, reverse=True) and len({tuple(t) for _, t in got}) == len(got)
