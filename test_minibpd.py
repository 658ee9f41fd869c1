"""Property-based tests of the papers' claims: every decoding path returns exactly the greedy tokens
of the base model (Stern §3: BPD, with the paper's extremes; Kim §7: every refined drafter), the
KV cache changes nothing, Kim §7.2's DP returns the p best paths of a lattice, and each head is
trained on the token it drafts. Then the --drafter harness: the same properties on a drafter of
your own.

All exactness tests run in float64 on random tiny models: the verification call and the one-token
calls round differently, and only float64 makes those differences (~1e-16) far too small to flip
an argmax (minibpd's module docstring). Each runs on the CPU and, when present, on CUDA. These
tests import nothing of the folders: the lab's options (sampling, token trees, the fast twins)
and its fuller checks of bad input are tested under tests/.

    python -m pytest test_minibpd.py                                   # these properties
    python -m pytest test_minibpd.py --drafter my_module:MyDrafter     # ... on your drafter
"""
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

import lattice
import minibpd
import train_heads
from conftest import (DEVICES, Checked, Recorded, all_paths, examples, model_and_prompt, models,
                      on_random_models, random_prompt, tiny_model)
from minibpd import GPT, GPTConfig, KVCache, bpd_decode, greedy_decode, window_start
from ngram import NgramLM

HERE = os.path.dirname(os.path.abspath(__file__))


@torch.no_grad()
def naive_greedy(model, prompt, n):
    """Greedy decoding without a cache: the window seq[window_start(t):t] recomputed per token."""
    seq = list(prompt)
    for _ in range(n):
        t = len(seq)
        ctx = torch.tensor([seq[window_start(t, model.config.block_size):t]],
                           device=model.lm_head.weight.device)
        seq.append(int(model.lm_head(model(ctx)[0, -1]).argmax()))
    return seq[len(prompt):]


class AlwaysRight:
    """Proposes the true greedy continuation `full`: every drafted token is accepted (wrong=True:
    every token after the certain first one is wrong, so none is)."""
    max_drafts = 1

    def __init__(self, full, wrong=False):
        self.full, self.wrong = full, wrong

    def __call__(self, logprobs, context):
        n, V = len(context), logprobs.shape[-1]
        draft = self.full[n - 1:n - 1 + len(logprobs)]
        if self.wrong:
            draft = draft[:1] + [(t + 1) % V for t in draft[1:]]
        return [draft]


# ----------------------------------------------------------------------------- the model and its cache

def test_parameter_count_no_shared_heads():
    """Our heads are h - 1 distinct modules (Stern §6 has one layer of hidden size k x d_hidden
    for all k outputs; ours is closer to Kim §4's h layers); `[BPDHead(...)] * n` would share one."""
    model = GPT(GPTConfig(vocab_size=30, block_size=16, n_layer=2, n_head=2, n_embd=16,
                          n_bpd_heads=5))
    C, V, T, L, h = 16, 30, 16, 2, 5
    per_block = 4 * C + (3 * C * C + 3 * C) + (C * C + C) + (4 * C * C + 4 * C) + (4 * C * C + C)
    expected = V * C + T * C + L * per_block + 2 * C + (h - 1) * 2 * (C * C + C)
    assert sum(p.numel() for p in model.parameters()) == expected
    assert len({hd.fc.weight.data_ptr() for hd in model.heads}) == h - 1
    head, z = model.heads[0], torch.randn(3, C)                 # a residual layer (Stern Fig. 3)
    torch.testing.assert_close(head(z), z + head.proj(F.gelu(head.fc(z))))
    assert model.lm_head.weight is model.tok_emb.weight                 # tied (Kim §4)


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
    """Prefill + steps of several tokens in 2 rows, the rest of each rejected (the cache not
    advanced past it), past the window: every state equals a pass over the whole window."""
    model = tiny_model(*m, device=device)
    B, seq, cache = model.config.block_size, random_prompt(m[0], m[1], plen), KVCache(model, rows=2)
    for size in chunks:
        draft = random_prompt(m[0] + size, m[1], size)
        draft = draft[:max(0, window_start(len(seq), B) + B - len(seq))]
        with torch.no_grad():
            tail = cache.tail(seq)
            z = model(torch.tensor([tail + draft] * 2, device=device), cache)[:, len(tail) - 1:]
            t = len(seq) + len(draft)
            ref = model(torch.tensor([(seq + draft)[window_start(t, B):t]], device=device))
        torch.testing.assert_close(z[0], ref[0, -z.shape[1]:], rtol=1e-10, atol=1e-10)
        keep = len(draft) // 2                          # reject the rest: rewind by not advancing
        cache.advance(len(tail) + keep, 1)
        seq = seq + draft[:keep] + [int(model.lm_head(z[1, keep]).argmax())]


# ----------------------------------------------------------------------------- BPD (Stern §3-4)

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
    for step in stats["steps"]:                            # accepted = kept drafted + 1
        assert step["accepted"] == step["kept"] + 1 <= len(step["drafts"][0])


@on_random_models()
def test_extremes_all_and_none_accepted(device, m, plen, n):
    model, prompt = model_and_prompt(m, plen, device)
    full = prompt + greedy_decode(model, prompt, n + 8)
    out, stats = bpd_decode(model, prompt, n, AlwaysRight(full))
    assert out == full[plen:plen + n]
    h, B, end = model.config.n_bpd_heads, model.config.block_size, plen + n
    for step in stats["steps"]:     # every draft fully accepted, and as long as the heads, the
        t, m = step["context"], len(step["drafts"][0]) - 1         # end and the window allow
        assert step["accepted"] == m + 1 and m == min(h - 1, end - t, window_start(t, B) + B - t)
    out, stats = bpd_decode(model, prompt, n, AlwaysRight(full, wrong=True))
    assert out == full[plen:plen + n]
    assert stats["calls"] == n and stats["block_efficiency"] == 1.0


@pytest.mark.parametrize("h", [1, 2, 5, 8])
def test_all_accepted_reaches_h(h):
    """Steady state with perfect drafts: h tokens per call (Stern §4: one call a block)."""
    model = tiny_model(1, 17, 1, h, 256)
    prompt, n = random_prompt(2, 17, 5), 100
    full = prompt + greedy_decode(model, prompt, n)
    out, stats = bpd_decode(model, prompt, n, AlwaysRight(full))
    assert out == full[5:]
    assert stats["calls"] == 1 + math.ceil((n - 1) / h)
    assert all(a == h for a in stats["accepted"][1:-1])


class RightAmongWrong:
    """Several drafts a call (Kim §7.2's p-best): `wrong` random ones, the greedy continuation
    cut at a random length among them; max_drafts = wrong + 1."""

    def __init__(self, full, wrong, seed):
        self.full, self.max_drafts = full, wrong + 1
        self.rng = torch.Generator().manual_seed(seed)

    def __call__(self, logprobs, context):
        n, (r, V) = len(context), logprobs.shape
        cut = int(torch.randint(1, r + 1, (1,), generator=self.rng))
        right = self.full[n - 1:n - 1 + cut] + [(t + 1) % V for t in self.full[n - 1 + cut:n - 1 + r]]
        drafts = [[context[-1]] + torch.randint(V, (r - 1,), generator=self.rng).tolist()
                  for _ in range(self.max_drafts - 1)]
        spot = int(torch.randint(len(drafts) + 1, (1,), generator=self.rng))
        return drafts[:spot] + [right] + drafts[spot:]


@on_random_models(wrong=st.integers(0, 3), seed=st.integers(0, 99))
def test_each_drafter_sees_the_heads_at_the_last_accepted_position(device, m, plen, n, wrong, seed):
    """Stern §4: a drafter gets the heads' log-probs at the state that chose context[-1], as one
    uncached call over the window gives them (exactness cannot see a wrong row: it costs calls)."""
    model, prompt = model_and_prompt(m, plen, device)
    seen = Recorded(RightAmongWrong(prompt + greedy_decode(model, prompt, n + 8), wrong, seed))
    bpd_decode(model, prompt, n, seen)
    with torch.no_grad():
        for logprobs, context, _ in seen.seen:
            want = lattice.heads_after(model, context)[:len(logprobs)]
            torch.testing.assert_close(logprobs, want, rtol=1e-10, atol=1e-10)


@on_random_models(wrong=st.integers(1, 4), seed=st.integers(0, 99))
def test_several_drafts_keep_the_one_accepted_furthest(device, m, plen, n, wrong, seed):
    """p drafts verified in one call, as rows of a batch: the output is greedy's, and each step
    gains at least what its right draft holds (a wrong one may agree further by chance)."""
    model, prompt = model_and_prompt(m, plen, device)
    full = prompt + greedy_decode(model, prompt, n + 8)
    out, stats = bpd_decode(model, prompt, n, RightAmongWrong(full, wrong, seed), verify="batch")
    assert out == full[plen:plen + n]
    for step in stats["steps"]:
        t, ds = step["context"], step["drafts"]
        agree = [minibpd.matched(d[1:], full[t:]) for d in ds]
        assert step["kept"] == max(agree) and step["winner"] == agree.index(max(agree))


# ----------------------------------------------------------------------------- refined drafts (Kim §6-7)

@on_random_models(k=st.integers(1, 6), p=st.integers(1, 4), alpha=st.sampled_from([0.0, 0.5, 1.0]),
                  order=st.integers(1, 3))
def test_refined_drafts_are_exact(device, m, plen, n, k, p, alpha, order):
    """lattice.py's readable drafters (global rescoring with an n-gram LM and its 0-gram
    control, local rescoring with a small LM, the oracle) return greedy's tokens, and the
    oracle at k = V (a lattice that holds every token) accepts every drafted token."""
    model, prompt = model_and_prompt(m, plen, device)
    V, greedy = m[1], greedy_decode(model, prompt, n + 8)
    lm = NgramLM(order, V).fit(random_prompt(m[0] + 1, V, 300))
    small = tiny_model(m[0] + 2, V, 1, 1, m[4], device=device)
    zero = Recorded(lattice.PBestDrafter(k, p))
    for drafter in (lattice.PBestDrafter(k, p, alpha, lm), zero, lattice.NeuralDrafter(small, k, alpha),
                    lattice.OracleDrafter(prompt + greedy, k), lattice.OracleDrafter(prompt + greedy, V)):
        out, stats = bpd_decode(model, prompt, n, drafter)
        assert out == greedy[:n], type(drafter).__name__
    assert all(s["accepted"] == len(s["drafts"][0]) for s in stats["steps"])    # the oracle, k = V
    for lp, context, drafts in zero.seen:      # no LM: the p best paths by head score, best first
        scores = [sum(float(lp[i, t]) for i, t in enumerate(d) if i) for d in drafts]
        assert drafts[0] == [context[-1]] + lp[1:].argmax(-1).tolist()
        assert len(set(map(tuple, drafts))) == len(drafts) == min(p, min(k, V) ** (len(lp) - 1))
        assert scores == sorted(scores, reverse=True)


@examples(4)
@given(seed=st.integers(0, 10**6), h=st.integers(1, 4), k=st.integers(1, 4), p=st.integers(1, 12),
       alpha=st.sampled_from([0.0, 0.5, 1.0]), order=st.integers(1, 4), tied=st.booleans())
def test_best_paths_are_the_p_best_of_all_paths(seed, h, k, p, alpha, order, tied):
    """Kim §7.2's DP (lattice.best_paths) returns what scoring every path of the lattice with
    path_score and sorting returns: the same paths, in the same order (ties: smaller ranks first),
    with equal scores, for n-gram LMs of each order (alpha 0: the 0-gram control, no LM); and
    PBestDrafter drafts them, its LM reading the context, then the path from context[-1] on."""
    V, g = 6, torch.Generator().manual_seed(seed)
    logprobs = torch.randn(h, V, generator=g, dtype=torch.float64).log_softmax(-1)     # [h, V]
    if tied:                       # multiples of 1/4: their sums are exact, so ties stay ties
        logprobs = (logprobs * 4).floor() / 4
    lm = NgramLM(order, V).fit(random_prompt(seed, V, 100))
    context = random_prompt(seed + 1, V, 5)
    lat = lattice.head_lattice(logprobs, context, k)            # position 0: the verified context[-1]
    want = all_paths(lat, lm, context[:-1], alpha)[:p]
    assert lattice.best_paths(lat, lm, context[:-1], p, alpha) == [(s, t) for s, _, t in want]
    assert lattice.PBestDrafter(k, p, alpha, lm)(logprobs, context) == [t for _, _, t in want]


def test_local_rescoring_reads_the_context_then_the_tokens_picked():
    """Kim §7.1: at head i the small LM scores the top-k after the context and the tokens picked
    at heads 2..i-1; at alpha 1 it alone picks (here always the token after the last one)."""
    V, seen = 5, []

    def lm_logprobs(seq):                               # [V]: best at seq[-1] + 1, by far
        seen.append(list(seq))
        out = torch.full((V,), -9.0, dtype=torch.float64)
        out[(seq[-1] + 1) % V] = 0.0
        return out
    draft = lattice.rescore_locally(torch.zeros(4, V, dtype=torch.float64), [3, 1], V, 1.0, lm_logprobs)
    assert draft == [1, 2, 3, 4] and seen == [[3, 1], [3, 1, 2], [3, 1, 2, 3]]


@examples(4)
@given(seed=st.integers(0, 10**6), V=st.integers(1, 12), order=st.integers(1, 4),
       length=st.integers(0, 200), history=st.lists(st.integers(0, 11), max_size=5))
def test_the_ngram_lm_is_a_distribution(seed, V, order, length, history):
    lm = NgramLM(order, V).fit(random_prompt(seed, V, length))
    total = math.fsum(math.exp(lm.logprob(w, [t % V for t in history])) for w in range(V))
    assert abs(total - 1) < 1e-9


# ----------------------------------------------------------------------------- training the heads (Kim §4)

def test_head_i_is_trained_on_the_token_i_ahead():
    """At position t head i is scored on token t + i (head 1: the next token, the base LM's own
    loss); the joint loss weighs head 1 by 1 and heads 2..h by head_weight (ours)."""
    model, T, h = tiny_model(3, 11, 1, 4, 16), 12, 4
    chunk = torch.tensor([random_prompt(seed, 11, T + h) for seed in (4, 5)])       # [B, T + h]
    logits = model.head_logits(model(chunk[:, :T]))                                 # [B, T, h, V]
    want = torch.stack([torch.stack([F.cross_entropy(logits[:, t, i], chunk[:, t + i + 1])
                                     for t in range(T)]).mean() for i in range(h)])  # [h]
    joint, per_head = train_heads.joint_loss(model, chunk, head_weight=0.25)
    torch.testing.assert_close(per_head, want)
    torch.testing.assert_close(joint, (want[0] + 0.25 * want[1:].sum()) / (1 + 0.25 * (h - 1)))


# ----------------------------------------------------------------------------- drafts past the heads (ours)

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


@on_random_models(reach=st.integers(1, 12), seed=st.integers(0, 99))
def test_drafts_past_the_heads_are_exact(device, m, plen, n, reach, seed):
    """A drafter that declares max_draft_tokens drafts past the heads, in drafts of several
    lengths in one call: greedy's tokens, whole drafts accepted when right (gains up to
    reach + 1 a call, past h), cut at the output's end and at the window's edge."""
    model, prompt = model_and_prompt(m, plen, device)
    full = prompt + greedy_decode(model, prompt, n + reach + 1)
    out, stats = bpd_decode(model, prompt, n, LongDrafts(reach, seed, full))
    assert out == full[plen:plen + n]
    B = model.config.block_size
    for step in stats["steps"]:
        t, longest = step["context"], max(map(len, step["drafts"]))
        assert longest - 1 <= minibpd.draft_budget(t, plen + n, reach, B)
        right = [len(d) for d in step["drafts"] if d == full[t - 1:t - 1 + len(d)]]
        assert step["accepted"] >= max(right)      # the right one, whole (a random one may gain more)


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


# ----------------------------------------------------------------------------- your drafter
# `python -m pytest test_minibpd.py --drafter my_module:MyDrafter` runs these on your drafter.

@pytest.mark.assignment1
@on_random_models()
def test_your_drafter_is_exact(device, m, plen, n, drafter_factory):
    model, prompt = model_and_prompt(m, plen, device)
    drafter = drafter_factory(model)
    out, stats = bpd_decode(model, prompt, n, drafter)
    assert out == greedy_decode(model, prompt, n)
    reach = getattr(drafter, "max_draft_tokens", model.config.n_bpd_heads - 1)
    assert 1.0 <= stats["block_efficiency"] <= reach + 1


@pytest.mark.assignment1
@pytest.mark.parametrize("device", DEVICES)
@examples()
@given(m=models, data=st.data())
def test_your_drafter_keeps_the_contract(device, m, data, drafter_factory):
    """Called directly on random head log-probs and contexts, the drafter's answer passes the
    contract's checks (minibpd.check_drafts, as bpd_decode calls it, naming any rule it breaks). As in
    the decode loop, head 1's most likely token is context[-1], the token just verified."""
    model = tiny_model(*m, device=device)
    drafter, V, h = Checked(drafter_factory(model), model), m[1], m[3]
    for _ in range(3):
        size = data.draw(st.integers(1, h), label="rows of logprobs")
        context = data.draw(st.lists(st.integers(0, V - 1), min_size=1, max_size=20), label="context")
        logits = torch.randn(size, V, dtype=torch.float64, device=device)
        logits[0, context[-1]] = logits[0].max() + 1.0
        drafter(logits.log_softmax(-1), list(context))


def run_student_tests(tmp_path, source, tests="test_minibpd.py"):
    """pytest --drafter student_drafter:make on `tests` (a file of the repository), in a child."""
    (tmp_path / "student_drafter.py").write_text(source)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{HERE}", HYPOTHESIS_PROFILE="quick")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           os.path.join(HERE, tests), "-k", "your_drafter and cpu",
                           "--drafter", "student_drafter:make"],
                          capture_output=True, text=True, cwd=HERE, env=env, timeout=300)


@pytest.mark.assignment1
def test_drafter_option_passes_a_good_drafter_and_fails_a_bad_one(tmp_path):
    good = run_student_tests(tmp_path, "from minibpd import ArgmaxDrafter\n"
                                       "def make(model):\n    return ArgmaxDrafter()\n")
    assert good.returncode == 0 and "2 passed" in good.stdout, good.stdout[-2000:]
    bad = run_student_tests(tmp_path, "class Bad:\n    def __call__(self, logprobs, context):\n"
                                      "        return [logprobs.argmax(-1)]\n"
                                      "def make():\n    return Bad()\n")
    assert bad.returncode == 1 and "broke the drafter contract (lists of ints)" in bad.stdout


# ----------------------------------------------------------------------------- the contract, checked

class Broken:
    """A drafter that breaks one rule of the contract (or none: "ok"); falsy, as a sized object
    with no items, so that `drafter or ArgmaxDrafter()` would silently run plain BPD instead."""
    name = "broken"

    def __init__(self, how):
        self.how = how

    def __len__(self):
        return 0

    def __call__(self, logprobs, context):
        r, V = logprobs.shape
        d = [context[-1]] + [(context[-1] + 1) % V] * (r - 1)   # a distinctive wrong draft
        return {"ok": [d], "flat": d, "none": [], "many": [d, d], "long": [d + d[-1:]],
                "first": [[(d[0] + 1) % V] + d[1:]], "range": [d[:-1] + [V]],
                "tensor": [torch.tensor(d)], "bool": [[True] * r]}[self.how]


@pytest.mark.parametrize("how, rule", [("flat", "lists of ints"), ("none", "1..max_drafts"),
                                       ("many", "1..max_drafts"), ("long", "length"),
                                       ("first", "first token"), ("range", r"ids in \[0, V\)"),
                                       ("tensor", "lists of ints"), ("bool", "lists of ints")])
def test_a_broken_drafter_stops_with_the_rule_it_broke(how, rule):
    """The drafter contract as code (minibpd.check_drafts): one ValueError naming the rule."""
    model = tiny_model(0, 7, 1, 3, 8)
    with pytest.raises(ValueError, match=rf"drafter broken broke the drafter contract \({rule}"):
        bpd_decode(model, [1, 2], 6, Broken(how))


def test_a_falsy_drafter_is_the_one_used():
    """A drafter whose truth value is false (len 0) is used, not replaced by plain BPD: its
    drafts are the ones verified."""
    model = tiny_model(0, 7, 1, 3, 8)
    out, stats = bpd_decode(model, [1, 2], 6, Broken("ok"))
    assert out == greedy_decode(model, [1, 2], 6)
    assert all(set(s["drafts"][0][1:]) == {(s["drafts"][0][0] + 1) % 7} for s in stats["steps"])


@pytest.mark.parametrize("args, message", [(([], 3), "non-empty list"), (([9], 3), r"\[0, 7\)"),
                                           ((["a"], 3), "integer token ids"), (("ab", 3), "integer"),
                                           (([True], 3), "integer"), (([1], 0), "max_new_tokens"),
                                           (([1], 2.5), "max_new_tokens")])
def test_bad_requests_get_one_clear_error(args, message):
    model = tiny_model(0, 7, 1, 3, 8)
    for decode in (greedy_decode, bpd_decode):
        with pytest.raises(ValueError, match=message):
            decode(model, *args)


@pytest.mark.parametrize("sizes", [{"n_embd": 0}, {"n_embd": -4}, {"n_head": 0}, {"n_layer": 0},
                                   {"n_embd": 6, "n_head": 4}, {"n_head": 4.0}, {"n_layer": True}])
def test_a_config_no_model_can_have_gets_one_clear_error(sizes):
    with pytest.raises(ValueError, match="GPTConfig needs integer sizes >= 1"):
        GPTConfig(**sizes)


@pytest.mark.parametrize("kw", [{"verify": "tree"}, {"accept": "top2"}, {"temperature": 0.8},
                                {"verify": None}, {"accept": None}, {"drafter": 5}])
def test_the_labs_options_name_the_lab_call(kw):
    """Token trees, Stern §5's approximate rules and sampling are the lab's: one line naming the
    call that runs them, before any model call; so are a verifier, rule or drafter that is none."""
    message = "not callable" if "drafter" in kw else r"runtime\.loop\.lab_decode"
    with pytest.raises(ValueError, match=message):
        bpd_decode(tiny_model(0, 7, 1, 3, 8), [1, 2], 6, **kw)


def test_a_checkpoint_is_read_safely_and_checked(tmp_path):
    """load_checkpoint: the shipped model, then one CheckpointError for a missing, corrupt or
    mismatched file (sparse, meta, complex, int or NaN weights, a wrong vocabulary), another
    family's (the lab's)."""
    model, ck = minibpd.load_checkpoint()
    assert type(model) is GPT and len(ck["vocab"]) == model.config.vocab_size
    bad = {"missing": tmp_path / "none.pt", "corrupt": tmp_path / "corrupt.pt",
           "shape": tmp_path / "shape.pt", "kind": tmp_path / "kind.pt"}
    bad["corrupt"].write_bytes(b"not a checkpoint")
    state = dict(ck["model"], **{"tok_emb.weight": ck["model"]["tok_emb.weight"][:5]})
    torch.save({**ck, "model": state}, bad["shape"])
    torch.save({**ck, "kind": "smollm2-heads"}, bad["kind"])
    for what, message in [("missing", "not found"), ("corrupt", "unreadable"),
                          ("shape", "tok_emb.weight"), ("kind", "runtime.checkpoint.load")]:
        with pytest.raises(minibpd.CheckpointError, match=message):
            minibpd.load_checkpoint(str(bad[what]))
    emb = ck["model"]["tok_emb.weight"]          # weights torch can hold but a GPT cannot load
    for w, message in [(emb.to_sparse(), "dense"), (emb.to("meta"), "dense"), (emb / 0, "finite"),
                       (emb.to(torch.complex64), "dense float"), (emb.int(), "dense float")]:
        with pytest.raises(minibpd.CheckpointError, match=message):
            minibpd.load_checkpoint({**ck, "model": dict(ck["model"], **{"tok_emb.weight": w})})
    with pytest.raises(minibpd.CheckpointError, match="0 tensors"):
        minibpd.load_checkpoint({**ck, "model": list(ck["model"].values())})
    with pytest.raises(minibpd.CheckpointError, match="config"):
        minibpd.load_checkpoint({})                 # a dict that is no checkpoint: one error too
    for vocab in (ck["vocab"][:-1], ck["vocab"][:-1] + ck["vocab"][0], None):   # short, a repeat
        with pytest.raises(minibpd.CheckpointError, match="vocab"):
            minibpd.load_checkpoint({**ck, "vocab": vocab})
    for kw, message in [({"dtype": torch.int64}, "floating"), ({"dtype": "float64"}, "floating"),
                        ({"dtype": torch.complex64}, "floating"), ({"device": "gpu"}, "'gpu'")]:
        with pytest.raises(ValueError, match=message):
            minibpd.load_checkpoint(**kw)


def test_the_demo_refuses_what_it_cannot_run_in_one_line(tmp_path, capsys):
    """lattice.demo: a checkpoint without the texts or the rescorer it reads, more threads than
    cores, more tokens than it shows: exit status 2 and one line, never a traceback."""
    ck = minibpd.read_checkpoint()
    for key in ("splits", "rescorer"):
        torch.save({k: v for k, v in ck.items() if k not in (key, "path")}, tmp_path / f"{key}.pt")
    for argv, message in [(["--checkpoint", str(tmp_path / "splits.pt")], "train and test texts"),
                          (["--checkpoint", str(tmp_path / "rescorer.pt")], "rescorer"),
                          (["--threads", str((os.cpu_count() or 1) + 1)], "--threads"),
                          (["--max-new-tokens", "161"], "1 to 160")]:
        assert lattice.demo(["--demo", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
