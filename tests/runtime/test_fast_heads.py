"""The fast twin of GPT's heads (runtime/fast_heads.py): minibpd.GPT's readable head_logits to
rounding, the same decodes, its stacked weights cached and renewed, and heads views."""
import pytest
import torch

from conftest import model_and_prompt, on_random_models, random_prompt, tiny_model
from minibpd import greedy_decode
from runtime.fast_heads import FastGPT
from runtime.loop import lab_decode


def readable(model, z):
    return model.lm_head(torch.stack([z] + [hd(z) for hd in model.heads], dim=-2))


def test_batched_heads_equal_modules():
    model = tiny_model(0, 11, 1, 6, 8, cls=FastGPT)
    z = torch.randn(3, 4, 8, dtype=torch.float64)
    for mode in (True, False):
        model.train(mode)
        torch.testing.assert_close(model.head_logits(z), readable(model, z))
    with torch.no_grad():                   # inference: the stack is cached and must see changes
        torch.testing.assert_close(model.head_logits(z), readable(model, z))
        assert "_stacked" in model.heads.__dict__           # else nothing below reads a cache
        model.heads[2].proj.bias.add_(1.0)                  # in place: its _version
        torch.testing.assert_close(model.head_logits(z), readable(model, z))
        model.heads[1].fc.weight.data = model.heads[1].fc.weight * 2     # new data: its data_ptr
        torch.testing.assert_close(model.head_logits(z), readable(model, z))
        model.load_state_dict({k: v / 2 for k, v in model.state_dict().items()}, assign=True)
        torch.testing.assert_close(model.head_logits(z), readable(model, z))   # new parameters


def test_forward_equals_the_modules_to_rounding():
    """The stacked heads give the modules' float32 logits to within a few ulp, not bit for bit:
    one wide matmul and h - 1 small ones are different kernels (AVX2, AVX-512, AMX tiles), and
    each sums its products in its own order. The tolerance is far below what separates two
    heads, so a head read from the wrong slot still fails."""
    torch.manual_seed(0)
    model = FastGPT(__import__("minibpd").GPTConfig(103, 128, 1, 4, 128, 8)).eval()
    z = torch.randn(5, 128)
    with torch.no_grad():
        fast = model.head_logits(z)
        model.reference = True
        ref = model.head_logits(z)
    ulp = torch.finfo(torch.float32).eps * ref.abs().amax(-1, keepdim=True)  # of each row's largest
    assert ((fast - ref).abs() <= 8 * ulp).all()
    assert not ((fast[:, 2] - ref[:, 3]).abs() <= 8 * ulp[:, 3]).all()     # a wrong head fails


@on_random_models()
def test_fast_twin_decodes_like_the_paper(device, m, plen, n):
    model, prompt = model_and_prompt(m, plen, device, cls=FastGPT)
    out, stats = lab_decode(model, prompt, n)
    assert out == greedy_decode(model, prompt, n)
    model.reference = True
    assert lab_decode(model, prompt, n)[1]["accepted"] == stats["accepted"]


@pytest.mark.assignment2
def test_first_heads_is_bpd_with_fewer_heads():
    model = tiny_model(7, 13, 1, 6, 24, cls=FastGPT)
    prompt = random_prompt(8, 13, 9)
    greedy = greedy_decode(model, prompt, 40)
    for j in range(1, 7):
        view = model.first_heads(j)
        out, stats = lab_decode(view, prompt, 40)
        assert out == greedy and max(stats["accepted"]) <= j
        assert view.config.n_bpd_heads == j and len(view.heads) == j - 1
    assert model.config.n_bpd_heads == 6 and len(model.heads) == 5     # the original is intact
    assert lab_decode(model.first_heads(1), prompt, 40)[1]["calls"] == 40
    for bad in (0, 7, 2.5):
        with pytest.raises(ValueError, match="heads must be"):
            model.first_heads(bad)


@pytest.mark.assignment2
def test_first_heads_does_not_inherit_the_stacked_cache():
    """The batched heads are cached at inference; a first_heads view of a model that already
    cached its stack must stack its own heads (and the original keep its own)."""
    model = tiny_model(2, 11, 1, 6, 8, cls=FastGPT)
    z = torch.randn(4, 8, dtype=torch.float64)
    with torch.no_grad():                   # the cache is kept only here, at inference
        full = model.head_logits(z)                                 # caches all five heads
        assert "_stacked" in model.heads.__dict__
        view = model.first_heads(3)
        ref = model.lm_head(torch.stack([z] + [hd(z) for hd in list(model.heads)[:2]], dim=-2))
        torch.testing.assert_close(view.head_logits(z), ref)
        torch.testing.assert_close(model.head_logits(z), full)


@pytest.mark.parametrize("kw, message", [({"dtype": torch.int64}, "floating"),
                                         ({"dtype": "float64"}, "floating"), ({"device": "gpu"}, "'gpu'")])
def test_the_labs_loader_refuses_a_dtype_or_device_in_one_line(kw, message):
    """runtime.checkpoint.load places its fast twin as minibpd.load_checkpoint places the GPT."""
    from runtime import checkpoint
    with pytest.raises(ValueError, match=message):
        checkpoint.load(**kw)
