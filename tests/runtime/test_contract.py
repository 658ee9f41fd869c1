"""The decode loop's checks (runtime/contract.py, runtime/loop.lab_decode): a drafter is held to
its contract at every step, whatever it hands back, and bad requests fail before any model call.
(test_minibpd.py holds the papers' properties; these are the hardening around them.)"""
import fractions
import re
import threading
import timeit

import numpy as np
import pytest
import torch
from hypothesis import strategies as st

import lattice
from conftest import model_and_prompt, on_random_models, random_prompt, tiny_model
from minibpd import GPT, ArgmaxDrafter, greedy_decode, sample_decode
from runtime import contract
from test_minibpd import LongDrafts
from runtime.loop import lab_decode


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
    _, plain = lab_decode(model, prompt, n)
    if len(plain["steps"]) <= after:
        out, _ = lab_decode(model, prompt, n, drafter)   # never reached the broken call
        assert out == greedy_decode(model, prompt, n)
        return
    rule = f"drafter breaker broke the drafter contract ({RULES[kind]})"
    with pytest.raises(ValueError, match=re.escape(rule)):
        lab_decode(model, prompt, n, drafter)


@pytest.mark.parametrize("rows", [0, -1, 1.5, None])
def test_bad_max_drafts(rows):
    drafter = ArgmaxDrafter()
    drafter.max_drafts = rows
    with pytest.raises(ValueError, match="max_drafts must be an integer >= 1"):
        lab_decode(tiny_model(0, 5, 1, 3, 8), [1, 2], 5, drafter)


@pytest.mark.parametrize("reach", [-1, 1.5, None, "4"])
def test_bad_max_draft_tokens(reach):
    drafter = ArgmaxDrafter()
    drafter.max_draft_tokens = reach
    with pytest.raises(ValueError, match="max_draft_tokens must be an integer >= 0"):
        lab_decode(tiny_model(0, 5, 1, 3, 8), [1, 2], 5, drafter)


@pytest.mark.parametrize("got, rule", [(9, "length"), (1, "length"), (6, None)])
def test_declared_draft_length_is_held(got, rule):
    """A drafter that declares max_draft_tokens = 5 may hand back 3 (the heads' rows) to 6
    tokens a draft, never more or fewer."""
    model = tiny_model(0, 5, 1, 3, 64)
    drafter = LongDrafts(5, 0)
    drafter.length = lambda rows: got
    if rule is None:
        assert lab_decode(model, [1, 2], 20, drafter)[0] == greedy_decode(model, [1, 2], 20)
        return
    with pytest.raises(ValueError, match=re.escape(f"broke the drafter contract ({rule}): each "
                                                   "draft has 3 (one per row of logprobs) to 6")):
        lab_decode(model, [1, 2], 20, drafter)


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
    _, plain = lab_decode(model, prompt, n)
    out, stats = lab_decode(model, prompt, n, Mutator(how))
    assert out == greedy_decode(model, prompt, n)
    assert stats["accepted"] == plain["accepted"]


def test_contract_check_costs_little():
    """The check runs at every step; on p-best's largest answer (16 drafts of 8) it costs
    microseconds, against a model call's milliseconds (the README reports the measurement)."""
    drafts = [[3] + [i % 50 for i in range(7)] for _ in range(16)]
    secs = min(timeit.repeat(lambda: contract.check_answer(drafts, 8, 3, 96, 16, "timed"),
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
        lab_decode(model, [1], 0)


def test_bad_requests_fail_before_any_model_call(monkeypatch):
    model = tiny_model(0, 5, 1, 2, 8)

    def no_call(*a, **kw):
        raise AssertionError("the model was called")
    monkeypatch.setattr(GPT, "forward", no_call)
    for args, message in (([1], 2.5), ([1], "3"), ([1], 0), ([], 3), ([1, 9], 3), ("ab", 3)):
        with pytest.raises(ValueError):
            lab_decode(model, args, message)
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
            got[i] = lab_decode(model, prompts[i], 30, drafter)[0]
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
    a = lab_decode(model, prompt, 40, lattice.NeuralDrafter(small, 4, 0.6))[1]
    b = lab_decode(model, prompt, 40, CachedNeuralDrafter(small, 4, 0.6))[1]
    assert [s["drafts"] for s in a["steps"]] == [s["drafts"] for s in b["steps"]]


def test_a_flat_draft_is_told_to_wrap_it():
    """One draft handed back as a flat list of ints was counted as that many
    drafts ("return a list of 1 to 1 drafts; got 2"); it is recognised and the fix named."""
    class Flat(ArgmaxDrafter):
        def __call__(self, logprobs, context):
            return super().__call__(logprobs, context)[0]
    with pytest.raises(ValueError, match=r"one flat list of \d+ ints: wrap it in a list, \[draft\]"):
        lab_decode(tiny_model(0, 7, 1, 3, 8), [1, 2], 6, Flat())


# ----------------------------------------------------------------------------- regressions

class Grower(ArgmaxDrafter):
    """Declares one draft, then raises its own max_drafts inside __call__ and returns three."""
    name = "grower"

    def __call__(self, logprobs, context):
        self.max_drafts = 3
        draft = super().__call__(logprobs, context)[0]
        return [draft, list(draft), list(draft)]


@pytest.mark.parametrize("verify", ["batch", "tree", "auto"])
def test_a_drafter_raising_its_max_drafts_gets_the_contract_error(verify):
    """The verifier's cache was sized by the declared max_drafts, the check read the
    raised one, and KVCache.write failed ("The expanded size of the tensor..."; with a tree no
    error). CheckedDrafter reads max_drafts once: the contract's ValueError names the drafter."""
    with pytest.raises(ValueError, match=re.escape("drafter grower broke the drafter contract "
                                                   "(1..max_drafts drafts): return a list of 1 to "
                                                   "1 drafts; got 3")):
        lab_decode(tiny_model(0, 7, 1, 3, 8), [1, 2], 6, Grower(), verify=verify)


def test_the_drafter_option_gives_a_raised_max_drafts_the_contract_error(tmp_path):
    """The same drafter under `pytest --drafter`: the contract's error, never the tensor's."""
    from test_minibpd import run_student_tests
    r = run_student_tests(tmp_path, "from tests.runtime.test_contract import Grower\n"
                                    "def make():\n    return Grower()\n")
    assert r.returncode == 1 and "(1..max_drafts drafts): return 1 to 1 (declared first), got 3" \
        in r.stdout, r.stdout[-2000:]
    assert "expanded size" not in r.stdout


class Reseeder(ArgmaxDrafter):
    """Plain BPD that reseeds torch's global generator at every call."""

    def __call__(self, logprobs, context):
        torch.manual_seed(0)
        return super().__call__(logprobs, context)


def distinct_samples(runs=20):
    model = tiny_model(11, 3, 1, 3, 4)
    return len({tuple(lab_decode(model, [1, 2, 0], 6, Reseeder(), temperature=1.0)[0])
                for _ in range(runs)})


def test_a_drafter_reseeding_torch_cannot_repeat_the_next_runs_sample(monkeypatch):
    """Without a generator each run seeds its own from torch's global generator,
    which a drafter calling torch.manual_seed(0) had reset: 20 runs gave 2 distinct outputs of
    6 tokens. CheckedDrafter(keep_rng=True) puts torch's state back after each drafter call;
    forced off, the same 20 runs repeat themselves."""
    assert distinct_samples() >= 15
    real = contract.CheckedDrafter.__init__
    monkeypatch.setattr(contract.CheckedDrafter, "__init__",
                        lambda self, *a, **k: real(self, *a, **{**k, "keep_rng": False}))
    assert distinct_samples() <= 3


class ArgminUniform:
    """Declares a uniform q but drafts each head's argmin: its q is not the
    distribution its drafts were drawn from, so min(1, p/q) is the wrong acceptance."""
    name = "argmin"

    def __call__(self, logprobs, context):
        return [[context[-1]] + logprobs[1:].argmin(-1).tolist()]

    def sample(self, logprobs, context, temperature, generator=None):
        V = logprobs.shape[-1]
        return self(logprobs, context), torch.full((len(logprobs), V), 1.0 / V, dtype=torch.float64)


def test_the_drafter_option_catches_a_q_its_drafts_were_not_drawn_from(tmp_path):
    """The precondition of a declared q (docs/exactness.md) cannot be checked on one answer; the
    harness's exact-distribution test catches this drafter: both its cases fail."""
    from test_minibpd import run_student_tests
    r = run_student_tests(tmp_path, "from tests.runtime.test_contract import ArgminUniform\n"
                                    "def make():\n    return ArgminUniform()\n",
                          "tests/runtime/test_sampling.py")
    assert r.returncode == 1, r.stdout[-2000:]
    assert r.stdout.count("FAILED tests/runtime/test_sampling.py::test_your_drafter_samples_exactly") == 2, \
        r.stdout[-2000:]


@pytest.mark.parametrize("prompt", [torch.tensor([True, False]), [torch.tensor(True), 1],
                                    np.array([True, False]), [np.bool_(True), 2]])
def test_bool_tensors_are_no_token_ids(prompt):
    """A torch (or numpy) bool tensor prompt was read as ids 1 and 0."""
    model = tiny_model(0, 5, 1, 2, 8)
    for decode in (greedy_decode, lambda *a: lab_decode(*a)):
        with pytest.raises(ValueError, match=r"integer token ids"):
            decode(model, prompt, 3)
    assert greedy_decode(model, torch.tensor([1, 2]), 3) == greedy_decode(model, [1, 2], 3)


@pytest.mark.parametrize("T", [np.float32(0.8), np.float64(0.8), fractions.Fraction(4, 5),
                               np.int64(1)])
def test_any_real_temperature_is_taken(T):
    """Temperature=np.float32(0.8) was refused ("must be a number"); any
    numbers.Real but a bool is a temperature, the same as float(T)."""
    model = tiny_model(0, 5, 1, 3, 8)
    for decode in (sample_decode, lab_decode):
        got = decode(model, [1, 2], 6, temperature=T, generator=torch.Generator().manual_seed(3))
        want = decode(model, [1, 2], 6, temperature=float(T),
                      generator=torch.Generator().manual_seed(3))
        assert got == want
    for bad in (True, np.bool_(True), "0.8", float("nan"), 10 ** 400):
        with pytest.raises(ValueError, match=r"temperature must be 0 \(greedy\) or in"):
            lab_decode(model, [1, 2], 3, temperature=bad)
