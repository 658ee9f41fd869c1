"""Property-based tests: every decoding path returns exactly the greedy tokens of the base model,
and the decode loop holds every drafter to its contract.

All exactness tests run in float64 on random tiny models: the verification pass and the one-token
pass round differently, and only float64 makes those differences (~1e-16) far too small to flip an
argmax (see the minibpd module docstring). Each test runs on the CPU and, when present, on CUDA.

    python -m pytest test_minibpd.py --drafter my_module:MyDrafter   # these properties, your drafter
"""
import math
import os
import re
import subprocess
import sys
import threading

import pytest
import torch
from hypothesis import given, strategies as st

import minibpd
from runtime import contract
from conftest import (DEVICES, bound, exact, examples, l1, model_and_prompt, models,
                      on_random_models, random_prompt, tiny_model)
from minibpd import GPT, ArgmaxDrafter, GPTConfig, bpd_decode, greedy_decode
from runtime.kvcache import KVCache, model_call, window_start
from runtime import kvcache
from runtime import checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))


@torch.no_grad()
def naive_greedy(model, prompt, n):
    """Reference without a cache: recompute the window seq[window_start(t):t] for every token."""
    seq = list(prompt)
    for _ in range(n):
        t = len(seq)
        ctx = torch.tensor([seq[window_start(t, model.config.block_size):t]],
                           device=model.lm_head.weight.device)
        seq.append(int(model.lm_head(model(ctx)[0, -1]).argmax()))
    return seq[len(prompt):]


class AlwaysRight:
    """Test drafter that proposes the true greedy continuation: every draft token is accepted
    (wrong=True: every token after the certain first one is wrong, so none is)."""
    max_drafts = 1

    def __init__(self, full, wrong=False):
        self.full, self.wrong = full, wrong

    def __call__(self, logprobs, context):
        n, V = len(context), logprobs.shape[-1]
        draft = self.full[n - 1:n - 1 + len(logprobs)]
        if self.wrong:
            draft = draft[:1] + [(t + 1) % V for t in draft[1:]]
        return [draft]


# ----------------------------------------------------------------------------- exactness

@on_random_models()
def test_bpd_equals_greedy(device, m, plen, n):
    model, prompt = model_and_prompt(m, plen, device)
    greedy = greedy_decode(model, prompt, n)
    assert greedy == naive_greedy(model, prompt, n)        # the cache does not change the maths
    out, stats = bpd_decode(model, prompt, n)
    assert out == greedy
    assert sum(stats["accepted"]) >= n and len(stats["accepted"]) == stats["calls"]
    assert 1.0 <= stats["block_efficiency"] <= model.config.n_bpd_heads
    assert stats["block_efficiency"] == n / stats["calls"]


@on_random_models()
def test_extremes_all_and_none_accepted(device, m, plen, n):
    model, prompt = model_and_prompt(m, plen, device)
    full = prompt + greedy_decode(model, prompt, n + 8)
    out, stats = bpd_decode(model, prompt, n, AlwaysRight(full))
    assert out == full[plen:plen + n]
    for step in stats["steps"]:                             # every draft fully accepted
        assert step["accepted"] == len(step["drafts"][0])
    out, stats = bpd_decode(model, prompt, n, AlwaysRight(full, wrong=True))
    assert out == full[plen:plen + n]
    assert stats["calls"] == n and stats["block_efficiency"] == 1.0


class LongDrafts:
    """Drafts past the heads' reach (max_draft_tokens = reach): each call, `right` (the greedy
    continuation, of a random length from the heads' rows to reach + 1) beside a wrong draft of
    another length; None: random tokens (under sampling, where no continuation is known)."""
    name, max_drafts = "long", 2

    def __init__(self, reach, seed, right=None):
        self.max_draft_tokens, self.right = reach, right
        self.rng = torch.Generator().manual_seed(seed)

    def length(self, rows):
        return int(torch.randint(rows, self.max_draft_tokens + 2, (1,), generator=self.rng))

    def __call__(self, logprobs, context):
        n, V, rows = len(context), logprobs.shape[-1], len(logprobs)
        a, b = self.length(rows), self.length(rows)
        wrong = [context[-1]] + torch.randint(V, (b - 1,), generator=self.rng).tolist()
        if self.right is None or self.right[:n] != context:
            return [wrong, [context[-1]] + torch.randint(V, (a - 1,), generator=self.rng).tolist()]
        right = self.right[n - 1:n - 1 + a]
        return [wrong, right] if wrong[1:2] != right[1:2] else [right]


@on_random_models(reach=st.integers(1, 12), verify=st.sampled_from(["batch", "tree"]),
                  seed=st.integers(0, 99))
def test_drafts_past_the_heads_are_exact(device, m, plen, n, reach, verify, seed):
    """A drafter that declares max_draft_tokens drafts past the heads, in drafts of several
    lengths in one call: greedy's tokens, whole drafts accepted when right (gains up to
    reach + 1 a call, past h), cut at the output's end and at the window's edge."""
    model, prompt = model_and_prompt(m, plen, device)
    full = prompt + greedy_decode(model, prompt, n + reach + 1)
    out, stats = bpd_decode(model, prompt, n, LongDrafts(reach, seed, full), verify=verify)
    assert out == full[plen:plen + n]
    B = model.config.block_size
    for step in stats["steps"]:
        t, longest = step["context"], max(map(len, step["drafts"]))
        assert longest - 1 <= minibpd.draft_budget(t, plen + n, reach, B)
        right = [len(d) for d in step["drafts"] if d == full[t - 1:t - 1 + len(d)]]
        assert step["accepted"] >= max(right)      # the right one, whole (a random one may gain more)


@pytest.mark.parametrize("h", [1, 2, 5, 8])
def test_all_accepted_reaches_h(h):
    """Steady state with perfect drafts: h tokens per call (window never full here)."""
    model = tiny_model(1, 17, 1, h, 256)
    prompt, n = random_prompt(2, 17, 5), 100
    full = prompt + greedy_decode(model, prompt, n)
    out, stats = bpd_decode(model, prompt, n, AlwaysRight(full))
    assert out == full[5:]
    assert stats["calls"] == 1 + math.ceil((n - 1) / h)
    assert all(a == h for a in stats["accepted"][1:-1])


@pytest.mark.parametrize("h, reach", [(1, 4), (2, 7), (5, 12)])
def test_all_accepted_reaches_past_h(h, reach):
    """Perfect drafts of reach tokens past the certain one (max_draft_tokens): reach + 1 tokens
    per call, past the heads' h; at the end, the loop cuts the last draft to what is missing."""
    model = tiny_model(1, 17, 1, h, 256)
    prompt, n = random_prompt(2, 17, 5), 100
    full = prompt + greedy_decode(model, prompt, n)
    drafter = LongDrafts(reach, 0, full)
    drafter.length = lambda rows: reach + 1
    out, stats = bpd_decode(model, prompt, n, drafter)
    assert out == full[5:]
    assert stats["calls"] == 1 + math.ceil((n - 1) / (reach + 1))
    assert all(a == reach + 1 for a in stats["accepted"][1:-1])


def test_window_start_definition():
    for B in range(1, 20):
        starts = [window_start(t, B) for t in range(200)]
        for t, s in enumerate(starts):
            assert 0 <= t - s <= B and (t > B or s == 0)
            assert s % max(1, B // 2) == 0
        assert starts == sorted(starts)


@pytest.mark.parametrize("device", DEVICES)
@examples()
@given(m=models, plen=st.integers(1, 30), chunks=st.lists(st.integers(1, 5), min_size=1, max_size=6))
def test_cache_equals_recompute(device, m, plen, chunks):
    """Prefill + one-token steps + multi-token steps with rejections == a full forward pass."""
    model = tiny_model(*m, device=device)
    B = model.config.block_size
    seq = random_prompt(m[0], m[1], plen)
    cache = KVCache(model, rows=2)
    for size in chunks:
        draft = random_prompt(m[0] + size, m[1], size)
        draft = draft[:max(0, window_start(len(seq), B) + B - len(seq))]
        with torch.no_grad():
            z, fed = model_call(model, cache, seq, [draft, draft])
            t = len(seq) + len(draft)
            s = window_start(t, B)
            ref = model(torch.tensor([(seq + draft)[s:t]], device=device))
        torch.testing.assert_close(z[0], ref[0, -z.shape[1]:], rtol=1e-10, atol=1e-10)
        keep = len(draft) // 2                          # reject the rest: rewind by not advancing
        cache.advance(fed + keep, 1)
        seq = seq + draft[:keep] + [int(model.lm_head(z[1, keep]).argmax())]


# ----------------------------------------------------------------------------- the model

def test_parameter_count_no_shared_heads():
    cfg = GPTConfig(vocab_size=30, block_size=16, n_layer=2, n_head=2, n_embd=16, n_bpd_heads=5)
    model = GPT(cfg)
    C, V, T, L, h = 16, 30, 16, 2, 5
    per_block = 4 * C + (3 * C * C + 3 * C) + (C * C + C) + (4 * C * C + 4 * C) + (4 * C * C + C)
    expected = V * C + T * C + L * per_block + 2 * C + (h - 1) * 2 * (C * C + C)
    assert sum(p.numel() for p in model.parameters()) == expected
    ptrs = {hd.fc.weight.data_ptr() for hd in model.heads}
    assert len(ptrs) == h - 1
    assert model.lm_head.weight is model.tok_emb.weight


def test_batched_heads_equal_modules():
    model = tiny_model(0, 11, 1, 6, 8)
    z = torch.randn(3, 4, 8, dtype=torch.float64)
    ref = model.lm_head(torch.stack([z] + [hd(z) for hd in model.heads], dim=-2))
    for mode in (True, False):
        model.train(mode)
        torch.testing.assert_close(model.head_logits(z), ref)
    with torch.no_grad():
        model.heads[2].proj.bias.add_(1.0)                  # the inference cache must notice
    ref = model.lm_head(torch.stack([z] + [hd(z) for hd in model.heads], dim=-2))
    torch.testing.assert_close(model.head_logits(z), ref)


def test_config_validation():
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(vocab_size=10, n_embd=10, n_head=3)
    with pytest.raises(ValueError, match="n_bpd_heads"):
        GPTConfig(n_bpd_heads=0)
    model = tiny_model(0, 5, 1, 2, 8)
    for bad in ([], [5], [-1]):
        with pytest.raises(ValueError):
            greedy_decode(model, bad, 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        bpd_decode(model, [1], 0)


def test_clean_and_split():
    text = "Title\n*****\n\n\n+----+----+\n| a  |   b |\nSome    words   here.\n"
    assert checkpoint.clean_text(text) == "Title\n\n| a | b |\nSome words here.\n"
    parts = checkpoint.split_corpus("x" * 100_000)
    assert sum(len(v) for v in parts.values()) == 100_000
    assert len(parts["test"]) == len(parts["tune"]) == 4000      # chunks 18, 38 and 19, 39 of 50




def test_first_heads_is_bpd_with_fewer_heads():
    model = tiny_model(7, 13, 1, 6, 24)
    prompt = random_prompt(8, 13, 9)
    greedy = greedy_decode(model, prompt, 40)
    for j in range(1, 7):
        view = model.first_heads(j)
        out, stats = bpd_decode(view, prompt, 40)
        assert out == greedy and max(stats["accepted"]) <= j
        assert view.config.n_bpd_heads == j and len(view.heads) == j - 1
    assert model.config.n_bpd_heads == 6 and len(model.heads) == 5     # the original is intact
    assert bpd_decode(model.first_heads(1), prompt, 40)[1]["calls"] == 40
    for bad in (0, 7, 2.5):
        with pytest.raises(ValueError, match="heads must be"):
            model.first_heads(bad)


# ----------------------------------------------------------------------------- your drafter
# `python -m pytest test_minibpd.py --drafter my_module:MyDrafter` runs these two on your drafter.

@on_random_models()
def test_your_drafter_is_exact(device, m, plen, n, drafter_factory):
    model, prompt = model_and_prompt(m, plen, device)
    drafter = drafter_factory(model)
    out, stats = bpd_decode(model, prompt, n, drafter)
    assert out == greedy_decode(model, prompt, n)
    h = model.config.n_bpd_heads
    assert 1.0 <= stats["block_efficiency"] <= contract.max_draft_tokens(drafter, h) + 1


@pytest.mark.parametrize("device", DEVICES)
@examples()
@given(m=models, data=st.data())
def test_your_drafter_keeps_the_contract(device, m, data, drafter_factory):
    """Called directly on random head log-probs and contexts, the drafter's answer passes the
    contract check (runtime.contract.check_drafts names the rule it breaks). As in the decode
    loop, head 1's most likely token is context[-1], the token just verified."""
    model = tiny_model(*m, device=device)
    drafter, V, h = drafter_factory(model), m[1], m[3]
    for _ in range(3):
        size = data.draw(st.integers(1, h), label="rows of logprobs")
        context = data.draw(st.lists(st.integers(0, V - 1), min_size=1, max_size=20), label="context")
        logits = torch.randn(size, V, dtype=torch.float64, device=device)
        logits[0, context[-1]] = logits[0].max() + 1.0
        logprobs = logits.log_softmax(-1)
        contract.check_drafts(drafter(logprobs, list(context)), size, context[-1], V,
                              contract.max_drafts(drafter), drafter,
                              contract.longest_draft(drafter, size, h))


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
        out = tuple(bpd_decode(model, prompt, n, drafter_factory(model), T, gen)[0])
        counts[out] = counts.get(out, 0) + 1
    probs = exact(model, prompt, n, T)
    assert l1(counts, probs, N) < bound(len(probs), N)


@pytest.mark.parametrize("device", DEVICES)
def test_drafts_past_the_heads_sample_exactly(device):
    """At T = 0.6, random drafts of several lengths, past the heads' reach, in one call: still
    exactly the base model's distribution (the check and its bound as above)."""
    seed, V, T, plen, n, N = 13, 3, 0.6, 2, 3, 600
    model = tiny_model(seed, V, 1, 2, 4, device=device)
    prompt, gen, counts = random_prompt(seed, V, plen), torch.Generator().manual_seed(0), {}
    for i in range(N):
        out = tuple(bpd_decode(model, prompt, n, LongDrafts(3, i), T, gen)[0])
        counts[out] = counts.get(out, 0) + 1
    probs = exact(model, prompt, n, T)
    assert l1(counts, probs, N) < bound(len(probs), N)


def run_student_tests(tmp_path, source):
    (tmp_path / "student_drafter.py").write_text(source)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{HERE}", HYPOTHESIS_PROFILE="quick")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           os.path.join(HERE, "test_minibpd.py"), "-k", "your_drafter and cpu",
                           "--drafter", "student_drafter:make"],
                          capture_output=True, text=True, cwd=HERE, env=env, timeout=300)


def test_drafter_option_passes_a_good_drafter_and_fails_a_bad_one(tmp_path):
    good = run_student_tests(tmp_path, "from minibpd import ArgmaxDrafter\n"
                                       "def make(model):\n    return ArgmaxDrafter()\n")
    assert good.returncode == 0 and "4 passed" in good.stdout, good.stdout[-2000:]
    bad = run_student_tests(tmp_path, "class Bad:\n    def __call__(self, logprobs, context):\n"
                                      "        return [logprobs.argmax(-1)]\n"
                                      "def make():\n    return Bad()\n")
    assert bad.returncode == 1 and "broke the drafter contract (lists of ints)" in bad.stdout


# ----------------------------------------------------------------------------- the contract

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
    import timeit
    drafts = [[3] + [i % 50 for i in range(7)] for _ in range(16)]
    secs = min(timeit.repeat(lambda: contract.check_drafts(drafts, 8, 3, 96, 16, None),
                             number=200, repeat=3)) / 200
    assert secs < 1e-3


# ----------------------------------------------------------------------------- the KV cache

def test_kv_cache_budget():
    model = tiny_model(0, 11, 2, 3, 16)
    row = 2 * 2 * 2 * 16 * 4 * 8                                  # bytes of one row
    ok = kvcache.MAX_CACHE_BYTES // row
    assert KVCache(model, rows=3).rows == 3
    for rows in (0, ok + 1, 10**9, 2.0):
        with pytest.raises(ValueError, match="KV cache of"):
            KVCache(model, rows=rows)


def test_kv_cache_protocol():
    """write/advance/truncate/reset: a one-row call extends every row; after a P-row call,
    advance keeps the winner's slots in every row; truncate rewinds."""
    model = tiny_model(1, 11, 1, 3, 16)
    cache = KVCache(model, rows=3)
    k = torch.randn(1, 2, 4, 4, dtype=torch.float64)
    keys, _ = cache.write(0, k, k)
    assert keys.shape == (1, 2, 4, 4) and all(torch.equal(cache.kv[0][0][r, :, :4], k[0]) for r in range(3))
    cache.advance(4)
    k3 = torch.randn(3, 2, 2, 4, dtype=torch.float64)
    keys, _ = cache.write(0, k3, k3)
    assert keys.shape == (3, 2, 6, 4)
    cache.advance(1, row=2)
    assert cache.length == 5
    assert all(torch.equal(cache.kv[0][0][r, :, 4], k3[2, :, 0]) for r in range(3))
    cache.truncate(2)
    assert cache.length == 2
    cache.truncate(10)
    assert cache.length == 2
    cache.reset(8)
    assert (cache.start, cache.length) == (8, 0)


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
    """One NeuralDrafter shared by two threads: every output stays exact (the lock)."""
    import lattice
    model, small = tiny_model(3, 20, 1, 6, 16), tiny_model(4, 20, 1, 1, 16)
    drafter = lattice.NeuralDrafter(small, 4, 0.6)
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


@on_random_models()
def test_one_head_runs_exactly_what_greedy_runs(device, m, plen, n):
    """With head 1 alone nothing is drafted: every call feeds what greedy decoding feeds (the
    prompt's window, one token a step, the whole window again when it moves), so the cost
    bookkeeping (stats['processed']) must equal analysis.greedy_processed, prefill included."""
    from lab import analysis
    model, prompt = model_and_prompt(m, plen, device)
    out, stats = bpd_decode(model.first_heads(1), prompt, n)
    assert out == greedy_decode(model, prompt, n) and stats["calls"] == n
    assert stats["verified"] == 0
    assert stats["processed"] == analysis.greedy_processed(plen, n, model.config.block_size)


def test_first_heads_does_not_inherit_the_stacked_cache():
    """The batched heads are cached at inference; a first_heads view of a model that already
    cached its stack must stack its own heads (and the original keep its own)."""
    model = tiny_model(2, 11, 1, 6, 8)
    z = torch.randn(4, 8, dtype=torch.float64)
    full = model.head_logits(z)                                     # caches all five heads
    view = model.first_heads(3)
    ref = model.lm_head(torch.stack([z] + [hd(z) for hd in list(model.heads)[:2]], dim=-2))
    torch.testing.assert_close(view.head_logits(z), ref)
    torch.testing.assert_close(model.head_logits(z), full)
