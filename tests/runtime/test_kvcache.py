"""The KV cache's row protocol (minibpd.KVCache) and its budget (runtime/kvcache.py)."""
import pytest
import torch

from conftest import on_random_models, model_and_prompt, tiny_model
from minibpd import KVCache, greedy_decode
from runtime import kvcache
from runtime.loop import lab_decode


def test_kv_cache_budget():
    model = tiny_model(0, 11, 2, 3, 16)
    row = 2 * 2 * 2 * 16 * 4 * 8                                  # bytes of one row
    ok = kvcache.MAX_CACHE_BYTES // row
    kvcache.check_cache_budget(model, 3)
    for rows in (0, ok + 1, 10**9, 2.0):
        with pytest.raises(ValueError, match="KV cache of"):
            kvcache.check_cache_budget(model, rows)


def test_kv_cache_protocol():
    """write/advance: a one-row call extends every row; after a P-row call, advance keeps the
    winner's slots in every row; lowering `length` rewinds."""
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
    cache.length = 2                                    # a rewind: the next write goes at 2
    keys, _ = cache.write(0, k3[:1], k3[:1])
    assert keys.shape == (1, 2, 4, 4) and torch.equal(cache.kv[0][0][0, :, 2:4], k3[0])


def test_tail_moves_the_window():
    """KVCache.tail: what the cache lacks; past the window, the new window whole."""
    model = tiny_model(2, 11, 1, 3, 8)
    cache = KVCache(model)
    assert cache.tail(list(range(5))) == [0, 1, 2, 3, 4]
    cache.advance(5)
    assert cache.tail(list(range(7))) == [5, 6]
    cache.advance(2)
    seq = list(range(9))                         # position 9 needs the window from 4 (B = 8)
    assert cache.tail(seq) == seq[4:] and (cache.start, cache.length) == (4, 0)


@on_random_models()
@pytest.mark.assignment2
def test_one_head_runs_exactly_what_greedy_runs(device, m, plen, n):
    """With head 1 alone nothing is drafted: every call feeds what greedy decoding feeds (the
    prompt's window, one token a step, the whole window again when it moves), so the cost
    bookkeeping (stats['processed']) must equal analysis.greedy_processed, prefill included."""
    from lab import analysis
    from runtime.fast_heads import FastGPT
    model, prompt = model_and_prompt(m, plen, device, cls=FastGPT)
    out, stats = lab_decode(model.first_heads(1), prompt, n)
    assert out == greedy_decode(model, prompt, n) and stats["calls"] == n
    assert stats["verified"] == 0
    assert stats["processed"] == analysis.greedy_processed(plen, n, model.config.block_size)
