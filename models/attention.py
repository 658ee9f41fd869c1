"""attention: the Llama's batch-invariant attention (models/llama.py's module docstring says why):
grouped-query attention on fixed-shape query blocks against key tiles whose partial sums are
added in a fixed order, a token tree's nodes attending to their keys gathered in one-token order,
and the biases made once a call.
"""
import functools
import math

import torch

from models.blocks import padded_copy

ALIGN = 16        # elements: attention's batch items start on 64-byte boundaries (batch invariance)


def bias_tiles(bias, g, rows, key_block):
    """bias [L, S] or [P, L, S] -> the bias in attention's blocks, [1 or P, 1, nq, nk, R, T]: each
    row repeated for the g query heads of a key head, padded keys hidden, padded rows seeing
    all. The same in every layer of a call: Llama.forward makes it once."""
    L, S = bias.shape[-2:]
    R, T = (g * L, S) if rows is None else (rows, key_block)
    bias = bias.view(-1, L, S).repeat(1, g, 1)                          # [1 or P, g L, S]
    bias = padded_copy(padded_copy(bias, 1, T, -math.inf), R, 1)        # padded keys: hidden
    nq, nk = bias.shape[1] // R, bias.shape[2] // T
    return bias.view(len(bias), 1, nq, R, nk, T).transpose(3, 4)        # padded rows: see all


def tiled_attention(q, keys, values, tiles, rows, key_block):
    """softmax(q k^T / sqrt(d) + bias) v with grouped-query attention, the bias already in blocks:
    tiles = bias_tiles(bias, H / Hkv, rows, key_block), bias [L, S] or, one per item, [P, L, S]
    (0: visible, -inf: hidden). q [P, H, L, d]; keys, values [P, Hkv, S, d].
    -> [P, H, L, d]. The g = H / Hkv query heads sharing a key head are g L rows against the
    same keys. rows=None: one product over all rows and keys. rows=R: R-row query blocks against
    key tiles of key_block slots (a multiple of VECTOR_LOOP), each product one fixed shape, the head
    size zero-padded to ALIGN so that every tile starts aligned; the tiles' numerators and
    denominators are added in order, so keys past a query's reach add exact zeros."""
    P, H, L, d = q.shape
    Hkv, S = keys.shape[1], keys.shape[2]
    n = H // Hkv * L                                      # query rows per key head
    R, T, D = (n, S, 1) if rows is None else (rows, key_block, ALIGN)
    q = padded_copy((q * d ** -0.5).reshape(P, Hkv, n, d), R, D)        # [P, Hkv, nq R, d']
    k, v = keys, values              # a cache's slots come rounded up to whole key tiles
    if rows is None or S % T or d % D:
        k, v = (padded_copy(t, T, D) for t in (keys, values))           # [P, Hkv, nk T, d']
    nq, nk, d2 = q.shape[2] // R, k.shape[2] // T, q.shape[3]
    qb = q.view(P, Hkv, nq, 1, R, d2)
    kb = k.view(P, Hkv, 1, nk, T, d2).transpose(-1, -2).contiguous()    # [.., nk, d', T]
    s = qb @ kb + tiles                                                 # [P, Hkv, nq, nk, R, T]
    e = torch.exp(s - s.amax(dim=(3, 5), keepdim=True))                 # the max is exact
    num = e @ v.view(P, Hkv, 1, nk, T, d2)                              # [P, Hkv, nq, nk, R, d']
    den = e.sum(-1, keepdim=True)                                       # [P, Hkv, nq, nk, R, 1]
    out, total = num[:, :, :, 0], den[:, :, :, 0]
    for t in range(1, nk):                                              # fixed order
        out, total = out + num[:, :, :, t], total + den[:, :, :, t]
    y = (out / total).reshape(P, Hkv, nq * R, d2)[:, :, :n, :d]
    return y.reshape(P, H, L, d)


def tree_plan(mask, dtype, g, rows, key_block):
    """What tree_attention needs of a token tree's mask [L, S] (bool: visible), the same in every
    layer, so made once a call: (prefix [L]: the rows whose visible slots are a prefix, their bias
    in tiles, and for the others the gathered slots idx [N, W] and their bias in tiles, one item
    each; None when all are prefix rows). g: query heads per key head (bias_tiles)."""
    seen = mask.sum(-1)                                                  # [L]
    prefix = mask.cumsum(-1).gather(-1, (seen - 1)[:, None])[:, 0] == seen
    idx = node_tiles = None
    if not prefix.all():
        idx, visible = gathered_slots(mask[~prefix], key_block)          # [N, W] each
        node_tiles = bias_tiles(mask_to_bias(visible, dtype)[:, None], g, rows, key_block)
    return prefix, bias_tiles(mask_to_bias(mask[prefix], dtype), g, rows, key_block), idx, node_tiles


def tree_attention(q, keys, values, plan, rows, key_block):
    """tiled_attention for one row holding a token tree (tree.tree_layout), batch-invariant
    (docs/real-model.md, "Tree verification on this model"): rows whose visible slots are a
    prefix run as they are; every other node's visible keys are gathered, in slot order, into
    keys of its own (as one-token decoding of its path holds them) and it runs as an item of its
    own. q [1, H, L, d]; keys, values [1, Hkv, S, d]; plan: tree_plan(mask). -> [1, H, L, d]."""
    prefix, tiles, idx, node_tiles = plan
    y = torch.empty_like(q)
    if prefix.any():
        y[:, :, prefix] = tiled_attention(q[:, :, prefix], keys, values, tiles, rows, key_block)
    if idx is not None:
        k, v = (t[0][:, idx].transpose(0, 1) for t in (keys, values))   # [N, Hkv, W, d]
        node_q = q[0, :, ~prefix].transpose(0, 1).unsqueeze(2)           # [N, H, 1, d]
        y_nodes = tiled_attention(node_q, k, v, node_tiles, rows, key_block)   # [N, H, 1, d]
        y[0, :, ~prefix] = y_nodes[:, :, 0].transpose(0, 1)
    return y


def gathered_slots(mask, key_block):
    """mask [N, S] -> (idx [N, W], visible [N, W]): row i's visible slots in slot order, then
    hidden padding (slot 0, not visible) to W, a multiple of key_block. A tree layout's slots all
    sit in slot order along a path (an ancestor comes before its child), so row i's gathered
    keys are one-token decoding's keys of its path."""
    seen = mask.sum(-1)
    W = int(seen.max()) + -int(seen.max()) % key_block
    idx = torch.zeros(len(mask), W, dtype=torch.long, device=mask.device)
    visible = torch.arange(W, device=mask.device)[None] < seen[:, None]  # [N, W]
    idx[visible] = mask.nonzero()[:, 1]                                  # row-major: in order
    return idx, visible


@functools.lru_cache(maxsize=4096)
def causal_bias(L, start, dtype, device):
    """[L, start + L]: 0 where query i (at slot start + i) sees slot j <= start + i, else -inf."""
    mask = torch.ones(L, start + L, dtype=torch.bool, device=device).tril(start)
    return mask_to_bias(mask, dtype)


def mask_to_bias(mask, dtype):
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, -math.inf)
