"""Tests for ngram.py (interpolated modified Kneser-Ney)."""
import math

import pytest
from hypothesis import given, strategies as st

from conftest import examples
from ngram import DEFAULT_DISCOUNTS, NgramLM, discounts_from_counts_of_counts


def probs(lm, history):
    return [math.exp(lm.logprob(w, history)) for w in range(lm.vocab_size)]


def assert_normalised(lm, history):
    p = probs(lm, history)
    assert all(x > 0 for x in p), (history, p)
    assert abs(sum(p) - 1.0) < 1e-9, (history, sum(p))


def reference_logprob(lm, token, history):
    """The documented recursion, written out independently."""
    J = min(lm.order - 1, len(history))
    p = 1.0 / lm.vocab_size
    for j in range(0, J + 1):
        c = tuple(history[len(history) - j:]) if j else ()
        p = lm.terms[j].get((c, token), 0.0) + lm.gammas[j].get(c, 1.0) * p
    return math.log(p)


@st.composite
def fitted_models(draw):
    vocab = draw(st.integers(1, 8))
    order = draw(st.integers(1, 5))
    corpus = draw(st.lists(st.integers(0, vocab - 1), max_size=200))
    extra = draw(st.integers(0, 2))  # ids vocab.. never occur in training
    return NgramLM(order, vocab + extra).fit(corpus), corpus


@examples(12)  # cheap: 12x the profile's examples (300 by default)
@given(fitted_models(), st.data())
def test_distributions_sum_to_one(model, data):
    lm, corpus = model
    V, n = lm.vocab_size, lm.order - 1
    # Seen histories: every position of the stream, including its very end.
    for i in range(len(corpus) + 1):
        assert_normalised(lm, corpus[max(0, i - n):i])
    # Every stored context, and the empty history.
    for j in range(lm.order):
        for ctx in lm.gammas[j]:
            assert_normalised(lm, list(ctx))
    assert_normalised(lm, [])
    # Random (mostly unseen) histories, short or long, possibly containing
    # ids never seen in training.
    tok = st.integers(0, V - 1)
    for _ in range(5):
        history = data.draw(st.lists(tok, max_size=lm.order + 2))
        assert_normalised(lm, history)
        w = data.draw(tok)
        assert lm.logprob(w, history) == reference_logprob(lm, w, history)
    assert_normalised(lm, [V - 1] * lm.order)
    # Structural invariants the numpy twin relies on.
    for j in range(lm.order):
        assert all(len(c) == j and v > 0 for (c, _), v in lm.terms[j].items())
        assert all(len(c) == j and 0 < g <= 1 for c, g in lm.gammas[j].items())


def test_hand_worked_bigram():
    # order 2, V = 3, corpus 0 1 0 1 2 0.
    lm = NgramLM(2, 3).fit([0, 1, 0, 1, 2, 0])
    # Bigram counts: 01:2, 10:1, 12:1, 20:1 -> counts of counts n3 = n4 = 0,
    # so the top order falls back to D1, D2, D3+ = 0.5, 1.0, 1.5.
    # Continuation counts N1+(. w): w=0 after {1,2} -> 2, w=1 after {0} -> 1,
    # w=2 after {1} -> 1; n3 = 0 again -> defaults.
    assert lm.discounts == [DEFAULT_DISCOUNTS, DEFAULT_DISCOUNTS]
    # Unigram level (A = 2+1+1 = 4):
    #   term(0) = (2-1.0)/4 = 1/4, term(1) = term(2) = (1-0.5)/4 = 1/8,
    #   gamma = (0.5*2 + 1.0*1)/4 = 1/2   (N1 = 2, N2 = 1)
    #   P0(0) = 1/4 + 1/2 * 1/3 = 5/12,  P0(1) = P0(2) = 1/8 + 1/6 = 7/24.
    assert lm.gammas[0][()] == 0.5
    assert math.exp(lm.logprob(0, [])) == pytest.approx(5 / 12, abs=1e-12)
    assert math.exp(lm.logprob(2, [])) == pytest.approx(7 / 24, abs=1e-12)
    # Context (0,): only "01" twice (A = 2; the final 0 is not followed):
    #   term(0->1) = (2-1.0)/2 = 1/2, gamma = 1.0*1/2 = 1/2
    #   P(1|0) = 1/2 + 1/2 * 7/24 = 31/48,  P(0|0) = 1/2 * 5/12 = 5/24.
    assert lm.terms[1][((0,), 1)] == 0.5 and lm.gammas[1][(0,)] == 0.5
    assert math.exp(lm.logprob(1, [2, 0])) == pytest.approx(31 / 48, abs=1e-12)
    assert math.exp(lm.logprob(0, [0])) == pytest.approx(5 / 24, abs=1e-12)
    # Context (1,): "10", "12" once each (A = 2):
    #   term = (1-0.5)/2 = 1/4 each, gamma = 0.5*2/2 = 1/2
    #   P(2|1) = 1/4 + 1/2 * 7/24 = 19/48.
    assert math.exp(lm.logprob(2, [1])) == pytest.approx(19 / 48, abs=1e-12)


def test_discount_formula_and_fallback():
    # n = 10, 5, 3, 2: Y = 10/20 = 1/2, D1 = 1 - 2*(1/2)*5/10 = 1/2,
    # D2 = 2 - 3*(1/2)*3/5 = 1.1, D3+ = 3 - 4*(1/2)*2/3 = 5/3.
    d = discounts_from_counts_of_counts(10, 5, 3, 2)
    assert d == pytest.approx((0.5, 1.1, 5 / 3), abs=1e-12)
    # n = 1, 1, 100, 1: Y = 1/3, D2 = 2 - 100 < 0 -> default 1.0;
    # D1 = 1/3, D3+ = 3 - 4/300 are in range and kept.
    d = discounts_from_counts_of_counts(1, 1, 100, 1)
    assert d == pytest.approx((1 / 3, 1.0, 3 - 4 / 300), abs=1e-12)
    assert discounts_from_counts_of_counts(3, 0, 1, 1) == DEFAULT_DISCOUNTS


@pytest.mark.parametrize("corpus", [[], [0], [1, 1], [0, 1, 0]])
def test_tiny_corpora_do_not_raise(corpus):
    for order in range(1, 5):
        lm = NgramLM(order, 2).fit(corpus)
        assert_normalised(lm, corpus)
        assert lm.perplexity([0, 1]) > 0


def test_empty_corpus_is_uniform():
    lm = NgramLM(3, 4).fit([])
    for h in ([], [1], [2, 3, 0]):
        assert probs(lm, h) == pytest.approx([0.25] * 4, abs=1e-15)


def test_perplexity_falls_with_order_on_text():
    import pydoc_data.topics as t
    text = "".join(t.topics.values())[:40000]
    ids = {c: i for i, c in enumerate(sorted(set(text)))}
    toks = [ids[c] for c in text]
    train, test = toks[:36000], toks[36000:]
    ppl = [NgramLM(k, len(ids)).fit(train).perplexity(test) for k in (1, 2, 3)]
    assert ppl[0] > ppl[1] > ppl[2], ppl


def test_perplexity_matches_definition():
    corpus = [0, 1, 2, 0, 1, 1, 2, 0]
    lm = NgramLM(3, 3).fit(corpus)
    seq = [1, 2, 0, 0]
    mean = sum(lm.logprob(w, seq[:i]) for i, w in enumerate(seq)) / len(seq)
    assert lm.perplexity(seq) == pytest.approx(math.exp(-mean), rel=1e-12)


def test_errors():
    with pytest.raises(ValueError, match="order"):
        NgramLM(0, 5)
    with pytest.raises(ValueError, match="vocab_size"):
        NgramLM(2, 0)
    lm = NgramLM(2, 3)
    with pytest.raises(ValueError, match="out of range"):
        lm.fit([0, 1, 3])
    with pytest.raises(ValueError, match="out of range"):
        lm.fit([-1])
    lm.fit([0, 1, 2])
    with pytest.raises(ValueError, match="out of range"):
        lm.logprob(3, [0])
    with pytest.raises(ValueError, match="out of range"):
        lm.logprob(0, [5])
    with pytest.raises(ValueError, match="empty"):
        lm.perplexity([])
