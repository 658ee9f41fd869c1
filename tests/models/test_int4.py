"""Tests of SmolLM2's int4 precision (models/blocks.int4_linear, models/smollm.int4_trunk) and of
the speed choices that go with it (models/machine.call_costs, decoders.speed_heads).

int4 is another precision of the same model, as bf16 is: its greedy text may leave float32's at a
near-tie (docs/real-model.md, "int4"), so exactness here means what it means in bf16: every
decoder returns the int4 model's own greedy tokens, because batch invariance holds for the 4-bit
kernel too (fixed blocks, or its own rows where blocks.row_invariance finds it row-invariant).
Random tiny Llamas with widths the kernel takes (rows a multiple of 16, columns of 32), then the
real model when it is installed. Skipped where this torch has no CPU int4 kernel.

    python -m pytest -q tests/models/test_int4.py
"""
import dataclasses
import json
import types

import pytest
import torch
from hypothesis import given, strategies as st

import decoders
from conftest import examples, random_prompt
from minibpd import greedy_decode
from models import blocks, llama, machine, smollm
from lab import bench
from runtime import checkpoint
from runtime.checkpoint import DTYPES
from tests.models.test_smollm import TopTwoDrafter, perplexity
from tests.helpers import SMOLLM_HEADS as HEADS, heads_or_skip
from runtime.loop import lab_decode

pytestmark = pytest.mark.skipif(not blocks.int4_ready(), reason="this torch has no CPU int4 kernel")


@pytest.fixture
def no_free_rows():
    """blocks.FREE is the process's: a test that sets it starts and ends without entries (the
    real model's, set at its load, are kept for the tests that run it)."""
    saved = dict(blocks.FREE)
    blocks.FREE.clear()
    yield blocks.FREE
    blocks.FREE.clear()
    blocks.FREE.update(saved)


def layer(n, k, seed=0, bias=False):
    """A stand-in Linear [n, k] on 4-bit groups (what blocks.linear reads)."""
    g = torch.Generator().manual_seed(seed)
    return types.SimpleNamespace(weight=torch.randn(n, k, generator=g) * 0.05, bits=4,
                                 bias=torch.zeros(n) if bias else None)


@pytest.mark.parametrize("n, k, m", [(16, 32, 1), (48, 64, 5), (960, 576, 3), (576, 1536, 8)])
def test_int4_product_is_the_product_of_its_dense_weights(n, k, m):
    """int4_linear computes x (rounded to bf16) times the 4-bit weights it reports (`dense`),
    summed in float32 and rounded to bf16: within bf16's rounding of the result."""
    lin = layer(n, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1))
    want = x.to(torch.bfloat16).float() @ blocks.int4_weight(lin.weight).dense.T
    got = blocks.int4_linear(lin, x)
    assert got.dtype == torch.float32 and got.shape == (m, n)
    assert ((got - want).abs() <= want.abs() * 2 ** -7 + 1e-3).all()


def test_int4_finds_the_q4_1_blocks_of_a_gguf_weight():
    """A weight made as the GGUF's Q4_1 makes it (per 32 weights: d q + m, q = 0..15, both ends
    used) comes back as the same 4-bit values, up to d and m rounded to bf16: the int4 model
    computes with the file's own 4-bit weights."""
    g = torch.Generator().manual_seed(2)
    q = torch.randint(0, 16, (32, 4, 32), generator=g).float()
    q[..., 0], q[..., 1] = 0, 15                                     # each block spans 0..15
    d = (torch.rand(32, 4, 1, generator=g) * 0.01 + 0.001).to(torch.bfloat16).float()
    mn = (-torch.rand(32, 4, 1, generator=g) * 0.05).to(torch.bfloat16).float()
    w = (d * q + mn).reshape(32, 128)
    dense = blocks.int4_weight(w).dense.reshape(32, 4, 32)
    low, high = dense.amin(-1, keepdim=True), dense.amax(-1, keepdim=True)
    levels = (dense - low) / ((high - low) / 15)                    # each weight's 4-bit value
    assert (levels - q).abs().max() < 1e-3
    z = (mn + 8 * d).abs()                                          # bf16 rounds s and z alone
    assert ((dense - w.reshape(32, 4, 32)).abs() <= z * 2 ** -8 + 8 * d * 2 ** -8).all()


def test_int4_refusals():
    assert "multiple of 16" in blocks.int4_problem(layer(24, 64))
    assert "multiple of 32" in blocks.int4_problem(layer(32, 48))
    assert "bias" in blocks.int4_problem(layer(32, 64, bias=True))
    assert blocks.int4_problem(layer(32, 64)) == ""
    w = torch.randn(16, 32, requires_grad=True)
    with pytest.raises(RuntimeError, match="no gradients"):
        blocks.int4_linear(types.SimpleNamespace(weight=w, bias=None), torch.randn(1, 32))
    model = int4_llama((0, 40, 1, 3, 16, 1, 1), 1)
    model.blocks[0].qkv.weight = torch.nn.Parameter(torch.randn(24, 32))
    with pytest.raises(ValueError, match="int4: .*multiple of 16"):
        smollm.int4_trunk(model)


# (seed, vocabulary, layers, heads h, window, kv heads, queries per kv head): head size 32 and
# SwiGLU width 64, so every trunk product has the shapes the 4-bit kernel takes
int4_llamas = st.tuples(st.integers(0, 10**6), st.integers(2, 64), st.integers(1, 2),
                        st.integers(2, 6), st.integers(1, 16), st.integers(1, 2), st.integers(1, 2))


def int4_llama(m, rows, form="stern"):
    """A random batch-invariant tiny Llama (float32 weights) on int4 trunk products."""
    seed, vocab, n_layer, h, block, n_kv, group = m
    torch.manual_seed(seed)
    cfg = llama.LlamaConfig(vocab_size=vocab, block_size=block, n_bpd_heads=h, n_layer=n_layer,
                            n_head=n_kv * group, n_kv_head=n_kv, n_embd=32 * n_kv * group,
                            n_hidden=64, rope_theta=100.0, n_positions=block + 32,
                            head_form=form, batch_invariant=False)
    cfg = dataclasses.replace(cfg, batch_invariant=True, row_block=rows * cfg.row_multiple)
    model = llama.Llama(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return smollm.int4_trunk(model.eval())


@examples(0.4)
@given(m=int4_llamas, plen=st.integers(1, 30), n=st.integers(1, 30),
       form=st.sampled_from(llama.HEAD_FORMS), own=st.booleans())
def test_bpd_equals_greedy_in_int4(no_free_rows, m, plen, n, form, own):
    """The product in int4: BPD (one draft, several as rows, a token tree) returns the int4
    model's greedy tokens, on fixed 8-row blocks, or (own) on the kernel's own rows wherever the
    probe finds every trunk shape row-invariant here; prompts longer than the window included."""
    model = int4_llama(m, 8 if not own else 1, form)
    if own:
        trunk = [b.qkv for b in model.blocks] + [b.out for b in model.blocks] + \
            [b.mlp.gate_up for b in model.blocks] + [b.mlp.down for b in model.blocks]
        for lin in trunk:
            n_free = blocks.row_invariance(lin, machine.MOST_FREE)
            if n_free < machine.MOST_FREE:           # not row-invariant here: blocks of 1
                blocks.FREE.clear()
                break
            blocks.FREE[blocks.kernel_key(lin)] = n_free
    prompt = random_prompt(m[0], m[1], plen)
    greedy = greedy_decode(model, prompt, n)
    assert lab_decode(model, prompt, n)[0] == greedy
    assert lab_decode(model, prompt, n, TopTwoDrafter(), verify="batch")[0] == greedy
    if form == "stern":
        assert lab_decode(model, prompt, n, TopTwoDrafter(), verify="tree")[0] == greedy


def test_int4_rows_are_row_invariant_on_smollm2s_shapes_or_the_choice_says_so():
    """Where the 4-bit kernel gives every row of a product of up to 8 rows the bits of that row
    alone on all of SmolLM2's trunk shapes (AVX2 and AVX-512 here), the machine choice may run it
    on its own rows; where not, measure() offers fixed blocks only."""
    cfg = llama.LlamaConfig(n_bpd_heads=5)
    found = [blocks.row_invariance(machine.Weight(o, i, torch.float32, 4), machine.MOST_FREE)
             for o, i, _ in machine.shapes(cfg)[:-1]]
    print(f"int4 row invariance on SmolLM2's trunk shapes: {found}")
    assert all(0 <= f <= machine.MOST_FREE for f in found)


def test_speed_heads_trades_block_efficiency_for_call_cost():
    be = {1: 1.0, 2: 1.6, 3: 1.75, 4: 1.86, 5: 1.91}
    flat = [40.0] * 5                                   # every row count costs one call
    assert decoders.speed_heads(be, flat) == 5
    int4_avx2 = [44.9, 47.3, 49.7, 53.9, 68.2]         # measured here, capped (docs)
    assert decoders.speed_heads(be, int4_avx2) == 3
    assert decoders.speed_heads({}, flat) is None and decoders.speed_heads(be, None) is None
    assert decoders.speed_heads({1: 1.0, 2: 1.0}, [10.0, 10.0]) == 2      # a tie: more heads


def test_fastest_view_switches_heads_for_the_demo_and_only_names_them_for_the_bench():
    model = int4_llama((0, 40, 1, 4, 24, 1, 2), 1)
    model.machine, model.call_ms = "int4", [44.9, 47.3, 49.7, 68.2]
    be = {1: 1.0, 2: 1.6, 3: 1.75, 4: 1.8}
    view = decoders.fastest_view(model, be)
    assert view.config.n_bpd_heads == 3 and "BPD on 3 of its 4 heads" in view.machine
    model.machine = "int4"
    kept = decoders.fastest_view(model, be, switch=False)
    assert kept is model and kept.config.n_bpd_heads == 4 and "`--heads 3`" in kept.machine
    assert decoders.fastest_view(model, {}) is model          # no tuned file: every head


def test_tuned_be_by_heads_reads_only_its_checkpoints_file(tmp_path):
    ck = tmp_path / "m.pt"
    ck.write_bytes(b"weights")
    good = {"checkpoint_sha256": checkpoint.file_sha256(str(ck)),
            "block_efficiency_by_heads": {"1": 1.0, "2": 1.5}}
    f = tmp_path / "t.json"
    for data, want in ((good, {1: 1.0, 2: 1.5}), ({**good, "checkpoint_sha256": "x"}, {}),
                       ({**good, "block_efficiency_by_heads": {"1": "a"}}, {}),
                       ({**good, "block_efficiency_by_heads": {"1": -1}}, {}), ([1], {})):
        f.write_text(json.dumps(data))
        assert decoders.tuned_be_by_heads(str(f), str(ck)) == want
    assert decoders.tuned_be_by_heads(str(tmp_path / "none.json"), str(ck)) == {}


def test_call_costs_time_every_row_count_on_the_loaded_model():
    model = int4_llama((3, 50, 1, 4, 128, 1, 1), 8)
    ms = machine.call_costs(model, reps=2)
    assert len(ms) == 4 and all(t > 0 for t in ms)


def test_the_char_model_refuses_int4(capsys):
    from lab import cli
    assert cli.main(["--dtype", "int4", "--prompt", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "int4 is the real model's precision" in err[0]


# ----------------------------------------------------------------------------- the real model

@pytest.fixture(scope="module")
def shipped_int4():
    model, ck = checkpoint.load(heads_or_skip(), dtype=DTYPES["int4"])
    return model, ck, decoders.Resources(model, ck)


def test_every_decoder_equals_its_greedy_on_the_real_model_in_int4(shipped_int4):
    """The product on SmolLM2 in int4: every decoder of the registry at its tuned settings
    returns the int4 model's greedy tokens (one of the bench's test prompts and the demo's
    second question, 24 tokens each), on all 5 heads and on the 3 the speed choice picks here;
    the model says what it runs."""
    model, ck, res = shipped_int4
    assert smollm.precision_of(model) == "int4" and model.machine.startswith("int4")
    assert all(b.mlp.down.bits == 4 for b in model.blocks) and model.lm_head.weight.dtype == torch.float32
    chosen = decoders.settings(decoders.load_tuned(decoders.tuned_path(HEADS), HEADS))
    prompts = [bench.make_prompts(ck["splits"]["test"], ck["vocab"], 16)[6],
               smollm.demo_prompts(ck["vocab"])[1][1]]
    for view in (model, model.first_heads(3)):
        vres = decoders.Resources(view, ck) if view is not model else res
        for prompt in prompts:
            greedy = greedy_decode(view, prompt, 24)
            for name in decoders.DECODERS:
                drafter = decoders.make(name, vres, chosen[name], prompt + greedy)
                assert lab_decode(view, prompt, 24, drafter)[0] == greedy, name


def test_int4_perplexity_is_float32s_within_a_percent(shipped_int4):
    """The guard on int4's quality: perplexity on 256 test-split tokens within 1% of float32's
    (measured: 20.64 vs 20.63 over 2,048 tokens, tools/smollm_precision.py --precision int4,
    removed; in commit 1f2d995)."""
    model, ck, _ = shipped_int4
    m32, _ = checkpoint.load(HEADS, dtype=torch.float32)
    ids = ck["vocab"].encode(ck["splits"]["test"][:2000])[:256]
    p4, p32 = perplexity(model, ids), perplexity(m32, ids)
    print(f"perplexity on 256 test tokens: int4 {p4:.3f}, float32 {p32:.3f}")
    assert abs(p4 / p32 - 1) < 0.01
