"""kvcache: what the lab needs around minibpd.KVCache: its budget (MAX_CACHE_BYTES, checked
before anything is allocated), one model call on a sequence's uncached tail plus P drafts
(model_call), the prefill every decode path shares (prefill_length: models/llama.py runs it
apart) and the cache's shape (KVSpec).
"""
from typing import NamedTuple

import torch

from minibpd import is_int


class KVSpec(NamedTuple):
    """The shape of a model's KV cache (GPT.kv_spec)."""
    layers: int
    heads: int        # key/value heads (fewer than query heads under grouped-query attention)
    head_dim: int
    dtype: torch.dtype
    device: torch.device


def device_of(model):
    return model.lm_head.weight.device


def prefill_length(start, tail, block_size):
    """How many leading tokens of a call's uncached tail (`tail` tokens of a window that starts at
    `start`) are a prefill, which a model may run by other kernels than the rest (the forward's
    `prefix`, llama.Llama.prefilled): the same tokens in every decode path, the prompt's but its
    last in the first window, after a move the first block_size - shift, however many a verifier
    holds (why: docs/real-model.md, "Prefill"; test_a_window_move_prefills_what_greedy_prefills)."""
    shift = max(1, block_size // 2)
    return tail - 1 if start == 0 else min(tail - 1, block_size - shift)


MAX_CACHE_BYTES = 2 ** 30   # 1 GiB: the most a KVCache may allocate (p-best's p sets its rows)


def check_cache_budget(model, rows, spare=0):
    """Refuse, before allocating, a KVCache of `rows` rows over MAX_CACHE_BYTES."""
    (layers, heads, head_dim, dtype, _), slots = model.kv_spec(), model.config.block_size + spare
    row = 2 * layers * heads * slots * head_dim * dtype.itemsize
    most = MAX_CACHE_BYTES // row
    if most < 1:
        raise ValueError(f"even one KV cache row would need {row / 2**20:,.0f} MiB for this model "
                         f"({slots} slots); the budget is {MAX_CACHE_BYTES // 2**20} MiB")
    if not is_int(rows) or not 1 <= rows <= most:
        raise ValueError(f"a KV cache of {rows} rows would need {rows * row / 2**20:,.0f} MiB; the "
                         f"budget is {MAX_CACHE_BYTES // 2**20} MiB, i.e. 1 to {most} rows (drafts "
                         "verified per call) for this model")


def padded(rows):
    """Lists of up to m items -> lists of m: each short one repeats its last item (a row with
    none gets 0). Drafts of several lengths share a batch this way; what a pad predicts goes
    unused, because accept stops at a draft's own end."""
    m = max(len(r) for r in rows)
    return [list(r) + (list(r[-1:]) or [0]) * (m - len(r)) for r in rows]


def model_call(model, cache, seq, proposed=((),)):
    """One serial model call: the uncached tail of `seq` plus P proposed continuations (P lists of
    up to m tokens, padded: none, just the tail). -> (z [P, m + 1, C], tail length); z[:, i]
    predicts token len(seq) + i."""
    tail = cache.tail(seq)
    idx = torch.tensor([tail + d for d in padded(proposed)], dtype=torch.long,
                       device=device_of(model))
    z = model(idx, cache)
    return z[:, len(tail) - 1:], len(tail)
