"""Tests for analysis.repeated_positions / phrase_repetition_all: the loop guard for greedy text.
Brute force from the definition, exact shares of known loops, bad spans."""
import pytest
from hypothesis import given, strategies as st

from lab.analysis import phrase_repetition_all, repeated_positions
from conftest import examples

tokens = st.lists(st.integers(0, 3), max_size=40)      # a small alphabet: repeats happen


def phrase_repetition(tokens, span=12):
    """The share of one output's tokens inside a repeated phrase (0.0 for an empty output)."""
    return sum(repeated_positions(tokens, span)) / max(1, len(tokens))


def brute_force(t, span):
    """The definition, literally: i counts when a window [s, s + span) holding i equals a window
    that starts at some s' < s."""
    windows = range(len(t) - span + 1)
    rep = {s for s in windows if any(t[q:q + span] == t[s:s + span] for q in range(s))}
    return [any(s <= i < s + span for s in rep) for i in range(len(t))]


@examples(4)
@given(t=tokens, span=st.integers(1, 8))
def test_matches_the_definition(t, span):
    assert repeated_positions(t, span) == brute_force(t, span)


@examples()
@given(phrase=st.lists(st.integers(0, 50), min_size=12, max_size=30, unique=True),
       k=st.integers(1, 6))
def test_a_loop_counts_from_its_second_copy_on(phrase, k):
    """k copies of a phrase with no repeat of its own: all but the first copy counts."""
    out = phrase * k
    assert repeated_positions(out) == [False] * len(phrase) + [True] * (len(out) - len(phrase))
    assert phrase_repetition(out) == (k - 1) / k


@examples()
@given(t=tokens, more=tokens, span=st.integers(1, 6))
def test_more_text_never_unmarks_earlier_text(t, more, span):
    before, after = repeated_positions(t, span), repeated_positions(t + more, span)
    assert all(a for b, a in zip(before, after[:len(t)]) if b)


def test_known_texts():
    ids = lambda s: [ord(c) for c in s]
    loop = 'defines "__eq__()", "__del__()", "__del__()", "__del__()"'
    seen = "..........................^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^"  # from '__()", "__de' on
    assert "".join("^" if m else "." for m in repeated_positions(ids(loop))) == seen
    assert repeated_positions(loop) == repeated_positions(ids(loop))  # any sequence: a str too
    prose = ids("A call is a wrapper object an assigning that in the abstract character")
    assert phrase_repetition(prose) == 0.0                 # ordinary text: nothing repeats
    assert repeated_positions(ids("aaaa"), 2) == [False, True, True, True]   # overlapping copies
    assert repeated_positions(ids("abcab"), 3) == [False] * 5               # shorter than span
    assert phrase_repetition([]) == 0.0 and phrase_repetition_all([]) == 0.0


@examples()
@given(outs=st.lists(tokens, max_size=5), span=st.integers(1, 6))
def test_aggregate_weights_every_token_once(outs, span):
    total = sum(map(len, outs))
    weighted = sum(phrase_repetition(o, span) * len(o) for o in outs) / max(1, total)
    assert phrase_repetition_all(outs, span) == pytest.approx(weighted)
    if len(outs) == 1:
        assert phrase_repetition_all(outs, span) == phrase_repetition(outs[0], span)


@pytest.mark.parametrize("span", [0, -3, 1.5, True, "12", None])
def test_bad_span_is_one_value_error(span):
    with pytest.raises(ValueError, match=f"span must be an int >= 1, got {span!r}"):
        repeated_positions([1, 2, 3], span)
    with pytest.raises(ValueError, match="span must be"):
        phrase_repetition_all([[1, 2]], span)
