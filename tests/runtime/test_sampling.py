"""Lossless sampling: every decoder's output is distributed exactly as sample_decode's.

Exact where it can be: tiny float64 models (vocabulary 2-3, 2-3 new tokens, context windows of
2-4 tokens, so generation crosses them) let us enumerate every continuation and its exact
probability under the base model. Each decoder then runs N times from a fixed seed, and the L1
distance between its empirical distribution and the exact one must stay under

    eps = sqrt(2 / N * ln((2^K - 2) / delta)),   K = V^n continuations, delta = 1e-6,

because P(L1 >= eps) <= (2^K - 2) exp(-N eps^2 / 2) for the empirical distribution of N draws
from any distribution on K outcomes (Weissman, Ordentlich, Seroussi, Verdu, Weinberger 2003).
So a correct decoder fails one check with probability at most 1e-6, and this file's ~40 checks
with probability at most 4e-5 over the choice of seeds; with the seeds fixed the test is
deterministic. The test has power: the same check fails for two deliberately wrong rules
(accept every draft token; resample from p instead of the normalised residual).
"""
import itertools
import math
from collections import Counter

import pytest
import torch
from hypothesis import settings

import decoders
from runtime import contract, loop, sampling
from conftest import (DEVICES, bound, exact, l1, model_and_prompt, on_random_models,
                      random_prompt, tiny_model)
import minibpd
from decoders.sampled import HeadSampler
from minibpd import greedy_decode, sample_decode
from runtime.sampling import target_probs
from ngram import NgramLM
from test_minibpd import LongDrafts
from runtime.loop import decode_rows, lab_decode

# (model: seed, vocabulary, layers, heads, window), prompt length, new tokens, temperature
CASES = [((11, 3, 1, 3, 4), 3, 3, 1.0), ((12, 2, 2, 4, 6), 1, 3, 1.0), ((13, 3, 1, 3, 4), 1, 2, 0.6)]


def runs():
    """Draws per check: 40 x the hypothesis profile's examples (1,000 by default)."""
    return 40 * settings().max_examples


def setup(case, device):
    (seed, V, layers, h, B), plen, n, T = case
    model = tiny_model(seed, V, layers, h, B, device=device)
    small = tiny_model(seed + 1, V, 1, 1, B, device=device)
    lm = NgramLM(2, V).fit(random_prompt(seed + 2, V, 200))
    res = decoders.Resources(model, small=small, lms={2: lm})
    prompt = random_prompt(seed, V, plen)
    full = prompt + greedy_decode(model, prompt, n)
    return model, res, prompt, full, n, T


def empirical(model, prompt, n, T, make, N, seed=0, verify="auto"):
    """Counts of N decoded continuations; asserts that drafts were verified (the rule was used)."""
    gen, counts, tried = torch.Generator().manual_seed(seed), Counter(), 0
    for _ in range(N):
        out, stats = lab_decode(model, prompt, n, make(), T, gen, verify)
        counts[tuple(out)] += 1
        tried += sum(len(step["tries"]) for step in stats["steps"])
    assert tried > N / 2, "the drafts were rarely verified: this case would test nothing"
    return counts


class IIDSampler(HeadSampler):
    """P drafts drawn i.i.d. from the heads' own q, which it declares (several sampled drafts
    share one q: the multi-round rule without de-duplication). reset: after drawing, it reseeds
    the generator it was given ("reproducible from here on"), which, were that generator
    verification's, would make every acceptance draw the same number."""
    name = "iid"

    def __init__(self, P=3, reset=False):
        self.max_drafts, self.reset = P, reset

    def sample(self, logprobs, context, temperature, generator=None):
        q = torch.softmax(logprobs.double().cpu() / temperature, dim=-1)       # [m, V]
        drawn = [torch.multinomial(q[1:], 1, generator=generator).view(-1).tolist()
                 for _ in range(self.max_drafts)]
        if self.reset:
            generator.manual_seed(0)
        return [[context[-1]] + d for d in drawn], q


EXTRA = {"iid3": lambda: IIDSampler(3), "resetter": lambda: IIDSampler(1, reset=True)}


def make_for(name, res, full):
    if name in EXTRA:
        return EXTRA[name]
    s = decoders.settings(overrides={"k": 2, "p": 3, "alpha": 0.5, "order": 2})[name]
    return lambda: decoders.make(name, res, s, full)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("name", ["sample_decode", *decoders.DECODERS, "pbest0:batch", "pbest:batch",
                                  "iid3", "iid3:batch", "resetter"])
def test_every_decoder_samples_the_base_model_exactly(device, case, name):
    """Multi-draft decoders verify as a token tree by default; ':batch' as P rows."""
    name, _, verify = name.partition(":")
    model, res, prompt, full, n, T = setup(CASES[case], device)
    probs, N = exact(model, prompt, n, T), runs()
    if name == "sample_decode":
        gen = torch.Generator().manual_seed(0)
        counts = Counter(tuple(sample_decode(model, prompt, n, T, gen)) for _ in range(N))
    else:
        counts = empirical(model, prompt, n, T, make_for(name, res, full), N, 0, verify or "auto")
    assert abs(sum(probs.values()) - 1) < 1e-9
    assert l1(counts, probs, N) < bound(len(probs), N), name


WRONG_RULES = {
    "accept every draft token": ("accept_probability", lambda r, proposal, token: 1.0),
    "resample from p, not the residual": ("residual", lambda r, proposal: r),
}


@pytest.mark.parametrize("rule", WRONG_RULES)
@pytest.mark.parametrize("name", ["bpd", "pbest", "sampled", "iid3"])
def test_the_check_has_power(monkeypatch, rule, name):
    """The same check, on the same cases, catches a deliberately wrong rule (in at least one
    case: a wrong rule can be harmless where the drafts are rarely tried)."""
    attr, wrong = WRONG_RULES[rule]
    monkeypatch.setattr(sampling, attr, wrong)
    for case in CASES:
        model, res, prompt, full, n, T = setup(case, "cpu")
        probs, N = exact(model, prompt, n, T), runs()
        counts = empirical(model, prompt, n, T, make_for(name, res, full), N)
        if l1(counts, probs, N) >= bound(len(probs), N):
            return                                                   # caught
    pytest.fail(f"the check missed the wrong rule {rule!r} with {name}")


# ----------------------------------------------------------------------------- properties

@on_random_models()
def test_temperature_zero_is_greedy(device, m, plen, n):
    model, prompt = model_and_prompt(m, plen, device)
    greedy = greedy_decode(model, prompt, n)
    assert sample_decode(model, prompt, n, 0.0) == greedy
    assert lab_decode(model, prompt, n, None, 0.0)[0] == greedy


@on_random_models()
def test_sampling_is_reproducible_and_in_bounds(device, m, plen, n):
    """Same seed, same output; block efficiency in [1, h]; every decoder of the registry."""
    model, prompt = model_and_prompt(m, plen, device)
    seed, V, _, _, B = m
    res = decoders.Resources(model, small=tiny_model(seed + 1, V, 1, 1, B, device=device),
                             lms={2: NgramLM(2, V).fit(random_prompt(seed + 2, V, 100))})
    full = prompt + greedy_decode(model, prompt, n)
    for name in decoders.DECODERS:
        make = make_for(name, res, full)
        a, stats = lab_decode(model, prompt, n, make(), 0.8, torch.Generator().manual_seed(seed))
        b, _ = lab_decode(model, prompt, n, make(), 0.8, torch.Generator().manual_seed(seed))
        assert a == b and len(a) == n and all(0 <= t < V for t in a), name
        assert 1.0 <= stats["block_efficiency"] <= model.config.n_bpd_heads, name


def test_target_probs():
    logits = torch.tensor([[1.0, 3.0, 3.0, -1.0]], dtype=torch.float64)
    assert target_probs(logits, 0).tolist() == [[0.0, 1.0, 0.0, 0.0]]     # ties: smallest id
    p = target_probs(logits, 2.0)
    assert torch.allclose(p, torch.softmax(logits / 2, -1)) and abs(float(p.sum()) - 1) < 1e-12
    for bad in (-0.1, float("nan"), float("inf"), "1", None):
        with pytest.raises(ValueError, match="temperature"):
            lab_decode(tiny_model(0, 5, 1, 2, 8), [1], 3, None, bad)


def test_residual_and_acceptance():
    """The two halves of the rule on a worked example."""
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.6, 0.2], dtype=torch.float64)
    assert sampling.accept_probability(p, q, 0) == 1.0 and abs(sampling.accept_probability(p, q, 1) - 0.5) < 1e-12
    assert torch.allclose(sampling.residual(p, q), torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))
    onehot = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)        # a deterministic draft
    assert torch.allclose(sampling.residual(p, onehot), torch.tensor([5 / 7, 0, 2 / 7], dtype=torch.float64))


def test_the_token_after_the_accepted_ones_is_drawn_at_their_depth():
    """verify_sampled on one-hot targets, where every draw is certain: row 1's draft [2, 0, 3]
    agrees with its own targets throughout (row 0's fails at depth 1), so 3 tokens are kept and
    the free token is row 1's target at depth 3. The statistical checks decode too few tokens
    to reach a depth past 1, where a target read at the wrong depth would hide."""
    probs = torch.nn.functional.one_hot(torch.tensor([[2, 0, 1, 1], [2, 0, 3, 2]]), 4).double()
    row, kept, token, _ = sampling.verify_sampled(probs, [[2, 3, 1], [2, 0, 3]], None,
                                                  torch.Generator().manual_seed(0))
    assert (row, kept, token) == (1, 3, 2)


class OffTheEnd(HeadSampler):
    name = "offtheend"

    def sample(self, logprobs, context, temperature, generator=None):
        drafts, q = super().sample(logprobs, context, temperature, generator)
        return [drafts[0][:-1] + [q.shape[-1]]], q             # its last token is V itself


def test_a_sampled_id_outside_the_vocabulary_is_refused_before_q_is_read():
    """The ids are checked before the declared q is read at them: an id of V is the contract's
    ValueError, not an IndexError from q[.., V]."""
    with pytest.raises(ValueError, match=r"drafter offtheend broke the drafter contract \(ids in"):
        lab_decode(tiny_model(3, 5, 1, 4, 16), [1, 2], 12, OffTheEnd(), 1.0,
                   torch.Generator().manual_seed(0))


def test_without_its_own_generator_the_resetter_is_caught(monkeypatch):
    """Power of the 'resetter' case above: hand the drafter verification's generator itself (the
    old behaviour) and its reseeding makes verification draw the same numbers at every step: the
    same check fails."""
    monkeypatch.setattr(contract, "drafter_generator", lambda generator: generator)
    for case in CASES:
        model, res, prompt, full, n, T = setup(case, "cpu")
        probs, N = exact(model, prompt, n, T), runs()
        if l1(empirical(model, prompt, n, T, EXTRA["resetter"], N), probs, N) >= bound(len(probs), N):
            return
    pytest.fail("the check missed a drafter sharing verification's generator")


class Reseeder(minibpd.ArgmaxDrafter):
    """A deterministic drafter that calls torch.manual_seed(0) at every step (a student making
    "its own" code reproducible)."""
    name = "reseeder"

    def __call__(self, logprobs, context):
        torch.manual_seed(0)
        return super().__call__(logprobs, context)


def reseeded(model, prompt, n, T, N):
    """Counts of N runs of bpd_decode with generator=None and the Reseeder, run i after
    torch.manual_seed(i) (how a caller without a generator varies the seed)."""
    counts = Counter()
    for i in range(N):
        torch.manual_seed(i)
        counts[tuple(lab_decode(model, prompt, n, Reseeder(), T)[0])] += 1
    return counts


@pytest.mark.parametrize("case", range(len(CASES)))
def test_without_a_generator_a_drafter_reseeding_torch_cannot_bias_the_output(case):
    """With generator=None, verification drew from torch's global generator, which this
    drafter reseeds at every step, so every acceptance draw after it was the same number (L1 1.90
    against a bound of 0.47). bpd_decode now seeds a generator of its own once, from torch's,
    before any drafter runs (sampling.own_generator): the exact-enumeration check passes, with
    the same false-failure rate (at most 1e-6 a case). The old behaviour fails the same check
    (test_without_its_own_loop_generator_the_reseeder_is_caught); sample_decode owns one too."""
    model, res, prompt, full, n, T = setup(CASES[case], "cpu")
    probs, N = exact(model, prompt, n, T), runs()
    assert l1(reseeded(model, prompt, n, T, N), probs, N) < bound(len(probs), N)
    torch.manual_seed(5)
    first = [sample_decode(model, prompt, n, T) for _ in range(3)]
    torch.manual_seed(5)
    assert [sample_decode(model, prompt, n, T) for _ in range(3)] == first   # reproducible


def test_without_its_own_loop_generator_the_reseeder_is_caught(monkeypatch):
    """Power of the check above: give verification torch's global generator again (the old
    behaviour: own_generator hands back None, and nothing puts torch's generator back after a
    drafter's call) and the same check fails."""
    monkeypatch.setattr(loop, "own_generator", lambda generator, temperature: generator)
    real = contract.CheckedDrafter.__init__
    monkeypatch.setattr(contract.CheckedDrafter, "__init__",
                        lambda self, *a, **k: real(self, *a, **{**k, "keep_rng": False}))
    for case in CASES:
        model, res, prompt, full, n, T = setup(case, "cpu")
        probs, N = exact(model, prompt, n, T), runs()
        if l1(reseeded(model, prompt, n, T, N), probs, N) >= bound(len(probs), N):
            return
    pytest.fail("the check missed verification drawing from a generator the drafter reseeds")


def node_output(p, q, drawn, sampled):
    """The exact distribution [V] of the token the rule picks at one tree node whose children are
    the drafted tokens `drawn`: sampling's own children_to_try, accept_probability and residual,
    with the coin flips replaced by their probabilities."""
    out, reach, r = torch.zeros_like(p), 1.0, p
    for tok in sampling.children_to_try(drawn, sampled):
        a = sampling.accept_probability(r, q, tok)
        out[tok] += reach * a
        reach *= 1 - a
        r = sampling.residual(r, q)
    return out + reach * r


@pytest.mark.parametrize("P", [1, 2, 3])
def test_iid_drafts_are_exact_by_enumeration(P):
    """P drafts drawn i.i.d. from q at one node: summing node_output over all V^P draws, weighted
    by their probability under q, gives exactly p. The rule without that care (de-duplicating
    the drawn tokens, right for deterministic drafts) is measurably wrong: its L1 distance to p
    is 0.045 for 2 drafts and 0.108 for 3 (the values asserted below). No sampling: exact."""
    p = torch.tensor([.05, .05, .45, .45], dtype=torch.float64)
    q = torch.tensor([.4, .4, .15, .05], dtype=torch.float64)
    for sampled, want in ((True, 0.0), (False, {1: 0.0, 2: 0.045, 3: 0.108}[P])):
        total = torch.zeros_like(p)
        for drawn in itertools.product(range(4), repeat=P):
            total += math.prod(float(q[t]) for t in drawn) * node_output(p, q, list(drawn), sampled)
        assert abs(float(total.sum()) - 1) < 1e-12
        assert abs(float((total - p).abs().sum()) - want) < 1e-3, (sampled, P)


class BadQ(HeadSampler):
    name = "badq"

    def __init__(self, how):
        self.how = how

    def sample(self, logprobs, context, temperature, generator=None):
        drafts, q = super().sample(logprobs, context, temperature, generator)
        d = drafts[0]
        if self.how == "unnormalised":
            q = q * 2
        elif self.how == "zero at the draft":
            q = q.clone()
            q[1, d[1]] = 0.0
            q[1] /= q[1].sum()
        elif self.how == "another token":
            q = torch.nn.functional.one_hot(torch.tensor((d[1:] + [0])[:1] * len(q)), q.shape[-1]).double()
            q[1] = torch.nn.functional.one_hot(torch.tensor((d[1] + 1) % q.shape[-1]), q.shape[-1])
        elif self.how == "nan":
            q = q.clone()
            q[-1, 0] = float("nan")
        elif self.how == "negative":
            q = q.clone()
            q[1, d[1]] += 0.5
            q[1, (d[1] + 1) % q.shape[-1]] -= 0.5
        elif self.how == "shape":
            q = q[1:]
        elif self.how == "list":
            q = q.tolist()
        return drafts, q


@pytest.mark.parametrize("how", ["unnormalised", "zero at the draft", "another token", "nan",
                                 "negative", "shape", "list"])
def test_a_declared_q_is_checked_before_use(how):
    """A q that cannot describe how the drafts were drawn is refused, naming the drafter, before
    it can bias verification (q(x) = 0 would accept every draft token)."""
    model = tiny_model(3, 5, 1, 4, 16)
    with pytest.raises(ValueError, match=r"drafter badq broke the drafter contract \(declared q\)"):
        lab_decode(model, [1, 2], 12, BadQ(how), 1.0, torch.Generator().manual_seed(0))
    assert len(lab_decode(model, [1, 2], 12, HeadSampler(), 1.0)[0]) == 12    # the good one runs


@pytest.mark.parametrize("generator", [42, "seed", torch.manual_seed])
def test_a_generator_that_is_not_one_is_refused_up_front(monkeypatch, generator):
    """generator=42 at T > 0: one ValueError before any model call, on every sampling path
    (torch's own TypeError came after the first call)."""
    model = tiny_model(0, 5, 1, 2, 8)
    monkeypatch.setattr(type(model), "forward", lambda *a, **k: pytest.fail("model called"))
    for decode in (lambda: lab_decode(model, [1], 3, None, 0.8, generator),
                   lambda: lab_decode(model, [1], 3, HeadSampler(), 0.8, generator),
                   lambda: sample_decode(model, [1], 3, 0.8, generator),
                   lambda: decode_rows(model, torch.tensor([[1, 2]]), 3, 0.8, generator)):
        with pytest.raises(ValueError, match="generator must be None or a torch.Generator"):
            decode()


def test_tiny_temperatures_are_refused_up_front(monkeypatch):
    model = tiny_model(0, 5, 1, 2, 8)
    monkeypatch.setattr(type(model), "forward", lambda *a, **k: pytest.fail("model called"))
    for T in (1e-300, 1e-320, 1e-7):
        for decode in (lab_decode, sample_decode):      # the lab checks through minibpd's check
            with pytest.raises(ValueError, match=r"temperature must be 0 .greedy. or in \[1e-6, 1e308\)"):
                decode(model, [1], 3, temperature=T)


# ----------------------------------------------------------------------------- drafts past the heads, your drafter

@pytest.mark.parametrize("device", DEVICES)
def test_drafts_past_the_heads_sample_exactly(device):
    """At T = 0.6, random drafts of several lengths, past the heads' reach, in one call: exactly
    the base model's distribution (600 draws against the enumerated probabilities, the L1
    distance under the bound a correct sampler exceeds with probability 1e-6: conftest)."""
    seed, V, T, plen, n, N = 13, 3, 0.6, 2, 3, 600
    model = tiny_model(seed, V, 1, 2, 4, device=device)
    prompt, gen, counts = random_prompt(seed, V, plen), torch.Generator().manual_seed(0), {}
    for i in range(N):
        out = tuple(lab_decode(model, prompt, n, LongDrafts(3, i), T, gen)[0])
        counts[out] = counts.get(out, 0) + 1
    probs = exact(model, prompt, n, T)
    assert l1(counts, probs, N) < bound(len(probs), N)



@pytest.mark.assignment1
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [((11, 3, 1, 3, 4), 3, 3, 1.0), ((13, 3, 1, 3, 4), 1, 2, 0.6)],
                         ids=["T=1", "T=0.6"])
def test_your_drafter_samples_exactly(device, case, drafter_factory):
    """At temperature T > 0 the decode loop with your drafter samples exactly the base model's
    distribution: 600 continuations from a fixed seed against their enumerated probabilities,
    the L1 distance under the bound a correct sampler exceeds with probability 1e-6 (conftest).
    A drafter that declares q (sample()) is held to the q it declares."""
    (seed, V, layers, h, B), plen, n, T = case
    model = tiny_model(seed, V, layers, h, B, device=device)
    prompt, N = random_prompt(seed, V, plen), 600
    gen, counts = torch.Generator().manual_seed(0), {}
    for _ in range(N):
        out = tuple(lab_decode(model, prompt, n, drafter_factory(model), T, gen)[0])
        counts[out] = counts.get(out, 0) + 1
    probs = exact(model, prompt, n, T)
    assert l1(counts, probs, N) < bound(len(probs), N)
