"""Prompt lookup decoding (decoders.lookup.PromptLookupDrafter; decoders `lookup` and `lookup_pbest`): the
copy rule on hand-made contexts, the n-gram index equal to the reverse scan (also when one drafter
moves to another sequence), the drafter contract, exactness on random float64 tiny models, and
more tokens per call than plain BPD where the text repeats itself."""
import pytest
import torch
from hypothesis import given, strategies as st

from lab import analysis
import decoders
import lattice
from runtime import contract
from conftest import examples, on_random_models, random_prompt, tiny_model
from decoders import lookup
from decoders.lookup import PromptLookupDrafter, copied_continuation
from minibpd import ArgmaxDrafter, greedy_decode
from ngram import NgramLM
from runtime.loop import lab_decode

pytestmark = pytest.mark.assignment9   # docs/coursework.md


# ----------------------------------------------------------------------------- the copy rule

@pytest.mark.parametrize("context, ngram, length, copy", [
    ([1, 2, 3, 7, 1, 2, 3, 8, 5, 1, 2, 3], 3, 3, [8, 5, 1]),   # the latest of two matches
    ([4, 2, 3, 9, 5, 2, 3], 3, 3, [9, 5, 2]),                  # no 3-gram match: the 2-gram's
    ([1, 2, 3, 6, 9, 2, 3, 7, 1, 2, 3], 3, 3, [6, 9, 2]),      # longer beats later
    ([1, 2, 3, 6, 9, 2, 3, 7, 1, 2, 3], 2, 3, [7, 1, 2]),      # ngram 2: the later 2-gram
    ([5, 8, 0, 4, 5], 3, 2, [8, 0]),                            # down to n = 1
    ([1, 2, 3, 4], 3, 5, []),                                   # no match
    ([1, 2, 3], 3, 5, []),                                      # the trailing occurrence is not one
    ([5], 3, 5, []),
    ([7, 7], 3, 5, [7]),                                        # n = 1: the earlier 7
    ([7, 7, 7], 2, 5, [7]),                                     # an occurrence may overlap the tail
    ([1, 2, 9, 1, 2], 2, 5, [9, 1, 2]),                         # stops at the context's end
    ([1, 2, 9, 1, 2], 2, 0, []),                                # nothing to copy into
])
def test_copy_rule(context, ngram, length, copy):
    assert copied_continuation(context, ngram, length) == copy
    assert PromptLookupDrafter(ngram).indexed_continuation(context, length) == copy


sequences = st.lists(st.integers(0, 3), min_size=1, max_size=40)     # a small alphabet: repeats


@examples(4)
@given(seqs=st.lists(sequences, min_size=1, max_size=4), ngram=st.integers(1, 5),
       length=st.integers(0, 6))
def test_index_equals_the_reverse_scan(seqs, ngram, length):
    """One drafter, its index kept across calls: every prefix of several sequences in turn (as
    the bench reuses a drafter over prompts), each sequence twice (a context that does not extend
    the one indexed, because it is shorter or differs, rebuilds the index)."""
    drafter = PromptLookupDrafter(ngram)
    for seq in seqs + seqs:
        for t in range(1, len(seq) + 1):
            assert drafter.indexed_continuation(seq[:t], length) == \
                copied_continuation(seq[:t], ngram, length), (seq, t)


def head_logprobs(argmaxes, V=10):
    """Log-probs [m, V] whose row i has its argmax at argmaxes[i]."""
    lp = torch.full((len(argmaxes), V), -5.0, dtype=torch.float64)
    lp[range(len(argmaxes)), argmaxes] = -0.1
    return lp


def test_drafts_bpd_then_the_copy_padded_with_argmax():
    lp = head_logprobs([2, 4, 5, 6, 7])                   # m = 5: the copy has room for 4
    context = [1, 2, 9, 1, 2]                             # [1, 2] ended at 1, then 9, 1, 2
    for reference in (False, True):
        drafts = PromptLookupDrafter(2, reference=reference)(lp, context)
        assert drafts == [[2, 4, 5, 6, 7],                # plain BPD: each head's argmax
                          [2, 9, 1, 2, 7]]                # the copy (3 tokens), head 4's argmax
        assert drafts[0] == ArgmaxDrafter()(lp, context)[0]


def test_one_draft_without_a_match_or_when_the_copy_is_bpds():
    lp = head_logprobs([3, 1, 2, 3, 1])
    drafter = PromptLookupDrafter(3)
    assert drafter(lp, [5, 6, 7, 3]) == [[3, 1, 2, 3, 1]]          # no n-gram of the tail recurs
    assert drafter(lp, [1, 2, 3, 1, 2, 3]) == [[3, 1, 2, 3, 1]]    # the copy [1, 2, 3, 1] is BPD's
    assert PromptLookupDrafter(3)(head_logprobs([3]), [3, 3]) == [[3]]   # m = 1: nothing to copy


@given(context=sequences, ngram=st.integers(1, 4), m=st.integers(1, 6), seed=st.integers(0, 99))
@examples()
def test_contract(context, ngram, m, seed):
    """1 or 2 drafts (lookup_pbest: 1..p + 1), each m ids in [0, V) starting with context[-1]."""
    V = 4
    lp = torch.randn(m, V, generator=torch.Generator().manual_seed(seed)).log_softmax(-1)
    base = lattice.PBestDrafter(3, 5)
    for drafter in (PromptLookupDrafter(ngram), PromptLookupDrafter(ngram, base)):
        drafts = drafter(lp, list(context))
        checked = contract.check_answer(drafts, m, context[-1], V, drafter.max_drafts, drafter.name)
        assert checked == drafts
        assert len(set(map(tuple, drafts))) == len(drafts)          # the copy is never a repeat
    assert PromptLookupDrafter(ngram).max_drafts == 2
    assert PromptLookupDrafter(ngram, base).max_drafts == 6


@given(context=sequences, ngram=st.integers(1, 4), m=st.integers(2, 6), nodes=st.integers(1, 9),
       seed=st.integers(0, 99))
@examples()
def test_nodes_bound_the_tree_and_keep_bpds_draft(context, ngram, m, nodes, seed):
    """With a node budget the copy is verified only where the token tree (shared prefixes once,
    the first token not counted) stays within `nodes` drafted tokens; BPD's draft always."""
    lp = torch.randn(m, 4, generator=torch.Generator().manual_seed(seed)).log_softmax(-1)
    full = PromptLookupDrafter(ngram)(lp, list(context))
    drafts = PromptLookupDrafter(ngram, nodes=nodes)(lp, list(context))
    tree = {tuple(d[:i + 1]) for d in drafts for i in range(1, len(d))}
    assert drafts[0] == full[0] and drafts == full[:len(drafts)]
    assert len(tree) <= max(nodes, m - 1)
    assert drafts == full or len({tuple(d[:i + 1]) for d in full for i in range(1, m)}) > nodes


def test_bad_ngram():
    for bad in (0, -1, 2.5, True, lookup.MAX_LOOKUP_NGRAM + 1):
        with pytest.raises(ValueError, match="ngram must be"):
            PromptLookupDrafter(bad)
    with pytest.raises(ValueError, match="lookup: ngram must be"):
        decoders.check("lookup", {"ngram": 0})


# ----------------------------------------------------------------------------- exactness

def registry(name, model, lm_order=2, **s):
    V = model.config.vocab_size
    lm = NgramLM(lm_order, V).fit(random_prompt(7, V, 200))
    res = decoders.Resources(model, lms={lm_order: lm})
    return decoders.make(name, res, {**decoders.settings()[name], "order": lm_order, **s})


@on_random_models(ngram=st.integers(1, 4), repeats=st.integers(1, 3), copy=st.sampled_from([0, 1, 10]),
                  verify=st.sampled_from(["batch", "tree"]))
def test_exact(device, m, plen, n, ngram, repeats, copy, verify):
    """bpd_decode with either lookup decoder returns greedy decoding's tokens; the prompt repeats
    a phrase `repeats` times, so that copies are drafted (and often wrong); copy 10 drafts past
    the heads, in drafts of two lengths."""
    model = tiny_model(*m, device=device)
    prompt = random_prompt(m[0], m[1], plen) * repeats
    greedy = greedy_decode(model, prompt, n)
    for name in ("lookup", "lookup_pbest"):
        drafter = registry(name, model, ngram=ngram, k=3, p=4, copy=copy, nodes=copy % 7)
        out, stats = lab_decode(model, prompt, n, drafter, verify=verify)
        assert out == greedy, name
        assert 1.0 <= stats["block_efficiency"] <= max(model.config.n_bpd_heads, copy + 1)


def test_a_long_copy_accepts_past_the_heads():
    """A greedy continuation that repeats itself is copied whole: with copy 10 a call gains up to
    11 tokens, past the h = 3 heads' reach, and still greedy's tokens."""
    model = tiny_model(3, 7, 1, 3, 256)
    greedy = greedy_decode(model, [1, 2, 3], 120)
    out, stats = lab_decode(model, [1, 2, 3], 120, registry("lookup", model, ngram=3, copy=10))
    _, short = lab_decode(model, [1, 2, 3], 120, registry("lookup", model, ngram=3, copy=0))
    assert out == greedy
    assert analysis.phrase_repetition_all([greedy]) > 0.5, "the test needs a repeating output"
    assert max(stats["accepted"]) == 11 and max(short["accepted"]) == 3
    assert stats["block_efficiency"] > short["block_efficiency"]


@pytest.mark.parametrize("bad", [-1, 2.5, "3", None])
def test_bad_copy(bad):
    with pytest.raises(ValueError, match="copy must be an integer >= 0"):
        PromptLookupDrafter(3, copy=bad)
    with pytest.raises(ValueError, match="lookup: copy must be an integer >= 0"):
        decoders.check("lookup", {"ngram": 3, "copy": bad})


@pytest.mark.parametrize("bad", [-1, 1.5, True, "7"])
def test_bad_nodes(bad):
    with pytest.raises(ValueError, match="nodes must be an integer >= 0"):
        PromptLookupDrafter(3, nodes=bad)
    with pytest.raises(ValueError, match="lookup: nodes must be an integer >= 0"):
        decoders.check("lookup", {"ngram": 3, "nodes": bad})


def test_a_repeated_phrase_is_copied():
    """The greedy text repeats a phrase (here with heads that never guess right): plain BPD gains
    one token a call, lookup copies whole blocks, and lookup_pbest accepts at least as much."""
    V, h, phrase = 20, 6, [3, 1, 4, 15, 9, 2, 6, 5, 11, 8]
    answer = phrase * 6
    plen, n = 2 * len(phrase), 4 * len(phrase)
    wrong = head_logprobs([0] * h, V)                      # every head's argmax: 0, not in the text
    heads = {t: wrong for t in range(plen, len(answer))}
    replay = lambda drafter: analysis.replay(drafter, heads, answer, plen, n, h, 64)
    bpd = replay(ArgmaxDrafter())["block_efficiency"]
    lookup = replay(PromptLookupDrafter(3))["block_efficiency"]
    both = replay(PromptLookupDrafter(3, lattice.PBestDrafter(2, 4)))["block_efficiency"]
    assert bpd == 1.0 and lookup > 4 and both >= lookup


def test_lookup_beats_bpd_on_a_looping_model():
    """For real: a random tiny model whose greedy text falls into a loop; bpd_decode with lookup
    is exact and gains more tokens a call than plain BPD."""
    model = tiny_model(11, 16, 1, 5, 64, std=0.3)
    prompt = random_prompt(11, 16, 12)
    greedy = greedy_decode(model, prompt, 48)
    assert analysis.phrase_repetition_all([greedy], 6) > 0.5       # the text does repeat
    out_b, plain = lab_decode(model, prompt, 48)
    out_l, lookup = lab_decode(model, prompt, 48, registry("lookup", model))
    assert out_b == out_l == greedy
    assert lookup["block_efficiency"] > plain["block_efficiency"]
