"""The decode loop's checks (runtime/contract.py, runtime/request.py): a drafter is held to its
contract at every step, whatever it hands back, and bad requests fail before any model call.
(test_minibpd.py holds the papers' properties; these are the hardening around them.)"""
import re
import threading
import timeit

import pytest
import torch
from hypothesis import strategies as st

import lattice
from conftest import model_and_prompt, on_random_models, random_prompt, tiny_model
from minibpd import GPT, ArgmaxDrafter, bpd_decode, greedy_decode
from runtime import contract
from test_minibpd import LongDrafts


def malformed(kind, draft, V, most):
    """One way to break the drafter contract, applied to a valid draft (a list of ints)."""
    return {"empty": [], "too many": [draft] * (most + 1), "not a list": None,
            "tensor": [torch.tensor(draft)], "short": [draft[:-1]], "long": [draft + draft[:1]],
            "float token": [draft[:-1] + [0.5]], "first token": [[(draft[0] + 1) % V] + draft[1:]],
            "id >= V": [draft[:-1] + [V]], "negative id": [draft[:-1] + [-1]]}[kind]


RULES = {"empty": "1..max_drafts drafts", "too many": "1..max_drafts drafts",
         "not a list": "1..max_drafts drafts", "tensor": "lists of ints", "short": "length",
         "long": "length", "float token": "lists of ints", "first token": "first token",
         "id >= V": "ids in [0, V)", "negative id": "ids in [0, V)"}


class Breaker:
    """Plain BPD for `after` calls, then one malformed answer."""
    name = "breaker"

    def __init__(self, kind, after, most):
        self.kind, self.after, self.max_drafts = kind, after, most

    def __call__(self, logprobs, context):
        draft = logprobs.argmax(-1).tolist()
        self.after -= 1
        if self.after >= 0:
            return [draft]
        return malformed(self.kind, draft, logprobs.shape[-1], self.max_drafts)


@on_random_models(kind=st.sampled_from(sorted(RULES)), after=st.integers(0, 5),
                  most=st.integers(1, 3))
def test_malformed_drafts_always_get_the_contract_error(device, m, plen, n, kind, after, most):
    """Whatever the step at which a drafter breaks the contract, bpd_decode raises the one
    ValueError naming the drafter and the rule, and returns nothing: never a wrong output."""
    model, prompt = model_and_prompt(m, plen, device)
    drafter = Breaker(kind, after, most)
    _, plain = bpd_decode(model, prompt, n)
    if len(plain["steps"]) <= after:
        out, _ = bpd_decode(model, prompt, n, drafter)   # never reached the broken call
        assert out == greedy_decode(model, prompt, n)
        return
    rule = f"drafter breaker broke the drafter contract ({RULES[kind]})"
    with pytest.raises(ValueError, match=re.escape(rule)):
        bpd_decode(model, prompt, n, drafter)


@pytest.mark.parametrize("rows", [0, -1, 1.5, None])
def test_bad_max_drafts(rows):
    drafter = ArgmaxDrafter()
    drafter.max_drafts = rows
    with pytest.raises(ValueError, match="max_drafts must be an integer >= 1"):
        bpd_decode(tiny_model(0, 5, 1, 3, 8), [1, 2], 5, drafter)


@pytest.mark.parametrize("reach", [-1, 1.5, None, "4"])
def test_bad_max_draft_tokens(reach):
    drafter = ArgmaxDrafter()
    drafter.max_draft_tokens = reach
    with pytest.raises(ValueError, match="max_draft_tokens must be an integer >= 0"):
        bpd_decode(tiny_model(0, 5, 1, 3, 8), [1, 2], 5, drafter)


@pytest.mark.parametrize("got, rule", [(9, "length"), (1, "length"), (6, None)])
def test_declared_draft_length_is_held(got, rule):
    """A drafter that declares max_draft_tokens = 5 may hand back 3 (the heads' rows) to 6
    tokens a draft, never more or fewer."""
    model = tiny_model(0, 5, 1, 3, 64)
    drafter = LongDrafts(5, 0)
    drafter.length = lambda rows: got
    if rule is None:
        assert bpd_decode(model, [1, 2], 20, drafter)[0] == greedy_decode(model, [1, 2], 20)
        return
    with pytest.raises(ValueError, match=re.escape(f"broke the drafter contract ({rule}): each "
                                                   "draft has 3 (one per row of logprobs) to 6")):
        bpd_decode(model, [1, 2], 20, drafter)


class Mutator:
    """A correct drafter (plain BPD) that then damages its arguments in one of several ways."""

    def __init__(self, how):
        self.how = how

    def __call__(self, logprobs, context):
        draft = logprobs.argmax(-1).tolist()
        if self.how == "append":
            context.append(0)
        elif self.how == "clear":
            context.clear()
        elif self.how == "overwrite":
            context[:] = [0] * len(context)
        elif self.how == "logprobs":
            logprobs.fill_(0.0)
        elif self.how == "return alias":      # hand back a list that it then keeps mutating
            self.last = draft
        return [draft]


@on_random_models(how=st.sampled_from(["append", "clear", "overwrite", "logprobs", "return alias"]))
def test_a_drafter_cannot_corrupt_the_output(device, m, plen, n, how):
    model, prompt = model_and_prompt(m, plen, device)
    _, plain = bpd_decode(model, prompt, n)
    out, stats = bpd_decode(model, prompt, n, Mutator(how))
    assert out == greedy_decode(model, prompt, n)
    assert stats["accepted"] == plain["accepted"]


def test_contract_check_costs_little():
    """The check runs at every step; on p-best's largest answer (16 drafts of 8) it costs
    microseconds, against a model call's milliseconds (the README reports the measurement)."""
    drafts = [[3] + [i % 50 for i in range(7)] for _ in range(16)]
    secs = min(timeit.repeat(lambda: contract.check_drafts(drafts, 8, 3, 96, 16, None),
                             number=200, repeat=3)) / 200
    assert secs < 1e-3


def test_config_validation():
    from minibpd import GPTConfig
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(vocab_size=10, n_embd=10, n_head=3)
    with pytest.raises(ValueError, match="sizes >= 1"):
        GPTConfig(n_bpd_heads=0)
    model = tiny_model(0, 5, 1, 2, 8)
    for bad in ([], [5], [-1]):
        with pytest.raises(ValueError):
            greedy_decode(model, bad, 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        bpd_decode(model, [1], 0)


def test_bad_requests_fail_before_any_model_call(monkeypatch):
    model = tiny_model(0, 5, 1, 2, 8)

    def no_call(*a, **kw):
        raise AssertionError("the model was called")
    monkeypatch.setattr(GPT, "forward", no_call)
    for args, message in (([1], 2.5), ([1], "3"), ([1], 0), ([], 3), ([1, 9], 3), ("ab", 3)):
        with pytest.raises(ValueError):
            bpd_decode(model, args, message)
        with pytest.raises(ValueError):
            greedy_decode(model, args, message)


def test_neural_like_state_is_safe_across_threads():
    """One cached NeuralDrafter shared by two threads: every output stays exact (the lock)."""
    from decoders.neural import CachedNeuralDrafter
    model, small = tiny_model(3, 20, 1, 6, 16), tiny_model(4, 20, 1, 1, 16)
    drafter = CachedNeuralDrafter(small, 4, 0.6)
    prompts = [random_prompt(s, 20, 9) for s in range(6)]
    want = [greedy_decode(model, p, 30) for p in prompts]
    got, errors = {}, []

    def run(i):
        try:
            got[i] = bpd_decode(model, prompts[i], 30, drafter)[0]
        except Exception as e:                                       # pragma: no cover
            errors.append(e)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and [got[i] for i in range(6)] == want


def test_readable_neural_drafter_equals_the_cached_one():
    """lattice.NeuralDrafter (a pass over the window per position) and its cached twin draft
    alike on a random float64 model."""
    from decoders.neural import CachedNeuralDrafter
    model, small = tiny_model(5, 20, 1, 6, 16), tiny_model(6, 20, 1, 1, 16)
    prompt = random_prompt(7, 20, 30)
    a = bpd_decode(model, prompt, 40, lattice.NeuralDrafter(small, 4, 0.6))[1]
    b = bpd_decode(model, prompt, 40, CachedNeuralDrafter(small, 4, 0.6))[1]
    assert [s["drafts"] for s in a["steps"]] == [s["drafts"] for s in b["steps"]]
