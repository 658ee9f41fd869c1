"""The APPROXIMATE acceptance rules (runtime/approximate.py, Stern §5), on float64 random tiny
models as in test_minibpd.py: top-1 and a minimum block of 1 are the exact rule (the same tokens
and steps); on every verification call top-k accepts at least what the exact rule accepts (and
top-(k + 1) at least what top-k accepts), and what it accepts is the rule written out; a minimum
block b gains at least b tokens a step where the draft has them; every approximate rule is
refused at T > 0, before any model call."""
import pytest
import torch
from hypothesis import strategies as st

import lattice
import minibpd
from conftest import model_and_prompt, on_random_models, tiny_model
from decoders.method import Method
from minibpd import GPT, greedy_decode
from decoders.lookup import PromptLookupDrafter
from runtime import loop
from runtime.approximate import Relaxed
from runtime.loop import lab_decode

pytestmark = pytest.mark.assignment8   # docs/coursework.md

DRAFTERS = {"bpd": minibpd.ArgmaxDrafter, "pbest": lambda: lattice.PBestDrafter(3, 4),
            "long lookup": lambda: PromptLookupDrafter(1, copy=10)}   # drafts of 2 lengths


def written_out(logits, drafts, k, b):
    """The rule as Stern §5 states it, one token at a time: a drafted token passes while it is
    among the verifier's top k (or within the first b - 1); the first draft with the most
    passing tokens wins; then the verifier's argmax. -> (row, accepted, token)"""
    best = None
    for j, d in enumerate(drafts):
        a = 0
        while a < len(d) - 1 and (a < b - 1 or d[a + 1] in
                                  logits[j, a].topk(min(k, logits.shape[-1])).indices.tolist()):
            a += 1
        if best is None or a > best[1]:
            best = (j, a, int(logits[j, a].argmax()))
    return best


def spy(mp, specs):
    """Every verification call of the next bpd_decode, judged by each rule of `specs` too (the
    same z and drafts): a list of (z's logits, drafts, {spec: (row, a, token)}) per call."""
    seen, real = [], loop.acceptance_rule

    def spied(model, T, gen, spec="exact", drafter=None):
        rule, others = real(model, T, gen, spec, drafter), {s: real(model, T, gen, s) for s in specs}

        def both(z, drafts):
            got = rule(z, drafts)
            seen.append((model.lm_head(z), drafts, {s: r(z, drafts)[:3] for s, r in others.items()}))
            return got
        return both
    mp.setattr(loop, "acceptance_rule", spied)
    return seen


@on_random_models(spec=st.sampled_from(["top1", "min1", Relaxed(1, 1)]),
                  drafter=st.sampled_from(sorted(DRAFTERS)), verify=st.sampled_from(["batch", "tree"]))
def test_top1_and_min1_are_exact_bpd(device, m, plen, n, spec, drafter, verify):
    model, prompt = model_and_prompt(m, plen, device)
    exact, stats = lab_decode(model, prompt, n, DRAFTERS[drafter](), verify=verify)
    out, relaxed = lab_decode(model, prompt, n, DRAFTERS[drafter](), verify=verify, accept=spec)
    assert out == exact == greedy_decode(model, prompt, n)
    assert relaxed["steps"] == stats["steps"] and relaxed["accepted"] == stats["accepted"]


@on_random_models(k=st.integers(2, 6), drafter=st.sampled_from(sorted(DRAFTERS)))
def test_topk_accepts_at_least_top1_each_step(device, m, plen, n, k, drafter, monkeypatch):
    model, prompt = model_and_prompt(m, plen, device)
    with monkeypatch.context() as mp:
        seen = spy(mp, ["exact", f"top{k}", f"top{k + 1}"])
        out, stats = lab_decode(model, prompt, n, DRAFTERS[drafter](), accept=f"top{k}")
    assert len(seen) == stats["calls"] - 1 and len(out) == n
    for logits, drafts, got in seen:
        exact, topk, wider = got["exact"], got[f"top{k}"], got[f"top{k + 1}"]
        assert exact[1] <= topk[1] <= wider[1] <= max(map(len, drafts)) - 1
        assert topk == written_out(logits, drafts, k, 1)
    drafting = lambda drafts: max(map(len, drafts)) > 1       # a call that verified a draft
    drafted = [s["accepted"] - 1 for s in stats["steps"] if drafting(s["drafts"])]
    assert drafted == [got[f"top{k}"][1] for _, d, got in seen if drafting(d)]


@on_random_models(b=st.integers(1, 9), k=st.sampled_from([1, 3]))
def test_min_block_gains_at_least_b_tokens_a_step(device, m, plen, n, b, k, monkeypatch):
    model, prompt = model_and_prompt(m, plen, device)
    with monkeypatch.context() as mp:
        seen = spy(mp, [Relaxed(k, b)])
        out, stats = lab_decode(model, prompt, n, accept=Relaxed(k, b))
    assert len(out) == n
    for step in stats["steps"]:                   # a draft of m drafted tokens has m + 1 tokens
        assert step["accepted"] >= min(b, len(step["drafts"][0]))
    for logits, drafts, got in seen:
        assert next(iter(got.values())) == written_out(logits, drafts, k, b)


def test_names_and_specs():
    assert [Relaxed(2).name, Relaxed(min_block=3).name, Relaxed(2, 3).name, Relaxed().name] == \
        ["top2", "min3", "top2+min3", "top1"]
    model = tiny_model(0, 11, 1, 4, 16)
    for spec in ("exact", None):
        assert lab_decode(model, [1, 2], 20, accept=spec) == lab_decode(model, [1, 2], 20)


@pytest.mark.parametrize("spec", ["top1", "top2", "min3", Relaxed(2, 2)])
def test_approximate_rules_refused_when_sampling(spec, monkeypatch):
    model = tiny_model(0, 11, 1, 4, 16)
    monkeypatch.setattr(GPT, "forward", lambda *a, **kw: pytest.fail("the model was called"))
    with pytest.raises(ValueError, match="is approximate .* for greedy decoding only"):
        lab_decode(model, [1, 2], 5, temperature=0.8, accept=spec)


@pytest.mark.parametrize("spec", ["top0", "min0", "top", "top-1", "TOP2", "top2 ", "exactly", 2,
                                  "top1.5", "min3+top2"])
def test_bad_specs_refused(spec, monkeypatch):
    model = tiny_model(0, 11, 1, 4, 16)
    monkeypatch.setattr(GPT, "forward", lambda *a, **kw: pytest.fail("the model was called"))
    with pytest.raises(ValueError, match="the acceptance rule must be 'exact' or an approximate"):
        lab_decode(model, [1, 2], 5, accept=spec)


@pytest.mark.parametrize("k, b", [(0, 1), (1, 0), (1.5, 1), (True, 1), ("2", 1)])
def test_bad_rules_refused(k, b):
    with pytest.raises(ValueError, match="must be an integer >= 1"):
        Relaxed(k, b)


def test_the_baseline_takes_no_rule():
    with pytest.raises(ValueError, match="greedy drafts nothing"):
        Method("greedy", accept="top2")
    model = tiny_model(0, 11, 1, 4, 16)
    assert Method("greedy").decode(model, [1, 2], 5)[0] == greedy_decode(model, [1, 2], 5)


def test_choices_with_nothing_drafted():
    logits = torch.tensor([[[0.0, 2.0, 1.0]]])
    assert Relaxed(2, 3).choices(logits, [[1]]) == [[1]]
