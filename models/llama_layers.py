"""llama_layers: the layers models/llama.py builds its Llama from: rotary tables, the linear
layers that compute in their weight's dtype (Linear, the tied output head TiedHead), RMSNorm,
SwiGLU (MLP), the transformer block (LlamaBlock) with its KV-cache write, and the two forms of
BPD proposal heads (Stern §6's SternHead, ours ChainedHead). Every matmul goes through
models/blocks.py's fixed-shape products when a row block is set, which is what makes the model
batch-invariant (llama.py's docstring says why)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from minibpd import BPDHead
from models.attention import tiled_attention, tree_attention
from models.blocks import by_rows, derived, linear, linear_rows, padded_copy

MEMO_ROWS = 64    # TiedHead remembers the logits of its last call of at most this many rows


def rope_tables(n_positions, head_dim, theta):
    """cos, sin [n_positions, head_dim] in float64, computed once: a position's angles never
    depend on the call. Pairs (i, i + d/2) rotate by position / theta^(2i/d) (the HF layout)."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(n_positions, dtype=torch.float64), inv)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate(x, cos, sin):
    """x [P, heads, L, d], cos/sin [L, d]: the rotary embedding, one rounding per product."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class Linear(nn.Linear):
    """nn.Linear computing in its weight's dtype (bf16 weights: bf16 matmul; blocks.linear) and
    returning the input's dtype (fp32 activations)."""

    def forward(self, x):
        return linear(self, x.to(self.weight.dtype)).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x):
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        w = self.weight
        if w.dtype != x.dtype:          # bf16 weight, fp32 activations: cast once while unchanged
            w = w.to(x.dtype) if torch.is_grad_enabled() else derived(   # (61 norms a call)
                self, "_weight", (w.data_ptr(), w._version, x.dtype), lambda: w.detach().to(x.dtype))
        return x * w


class TiedHead(Linear):
    """The output projection, weight tied to the token embedding; logits [..., V] from z [..., C]
    by fixed-shape row blocks when `rows` is set. In that mode a row's logits depend on that row
    alone (batch invariance), so a row equal to one already projected, in this call or in the
    last small one (MEMO_ROWS), is copied, not recomputed: a token tree's paths repeat their
    shared nodes (p-best's 16 drafts of 8: 128 rows, ~46 distinct), and the next draft's head 1
    is the row that verification has just projected. One row costs a whole block (56 MB of bf16
    weights read), so this saves blocks, not rows."""
    rows = None
    memo = None      # the last small call: (weight version, distinct rows [n, C], logits [n, V])
    memo_rows = MEMO_ROWS     # 0: no memo (tests of batch invariance itself)

    def forward(self, z):
        if self.rows is None or torch.is_grad_enabled():
            return by_rows(super().forward, z, self.rows)
        flat = z.reshape(-1, z.shape[-1])
        x, where = torch.unique(flat, dim=0, return_inverse=True)         # [n, C], [N]
        if len(x) == len(flat):         # all distinct (most calls): no gather of [N, V] logits
            return self.distinct(flat).view(*z.shape[:-1], -1)
        logits = self.distinct(x)                                         # [n, V]
        return logits[where].view(*z.shape[:-1], logits.shape[-1])

    def distinct(self, x):
        """Logits of distinct rows x [n, C]: copied from the memo where it has them, by blocks
        otherwise (the memo only holds for the weight it was made with). Threads sharing the
        model share the memo: it is read once, so each call uses one memo whole (a row's logits
        are the same bits whichever call projected it), and replaced whole (one assignment)."""
        version = (self.weight.data_ptr(), self.weight._version, self.weight.dtype, x.dtype)
        same, memo = None, self.memo
        if memo is not None and memo[0] == version and len(x) * len(memo[1]) <= self.memo_rows ** 2:
            same = (x[:, None] == memo[1][None]).all(-1)                  # [n, N]
        if same is None or not same.any():                                # nothing to copy
            out = linear_rows(self, x, self.rows)                         # (rows set: no recursion)
        else:
            out = torch.empty(len(x), self.weight.shape[0], dtype=x.dtype, device=x.device)
            new = ~same.any(-1)
            out[~new] = memo[2][same[~new].int().argmax(-1)]
            if new.any():
                out[new] = linear_rows(self, x[new], self.rows)
        self.memo = (version, x, out) if len(x) <= self.memo_rows else None
        return out


class MLP(nn.Module):
    """The pre-norm SwiGLU feed-forward sub-layer with its residual: x + W_down(silu(g) * u)."""

    def __init__(self, cfg):
        super().__init__()
        self.norm = RMSNorm(cfg.n_embd, cfg.rms_eps)
        self.gate_up = Linear(cfg.n_embd, 2 * cfg.n_hidden, bias=False)   # gate and up, stacked
        self.down = Linear(cfg.n_hidden, cfg.n_embd, bias=False)

    def forward(self, x, rows=None, wide=False):                          # x [M, C]
        gate, up = linear_rows(self.gate_up, self.norm(x), rows, wide).chunk(2, dim=-1)  # [M, hidden]
        return x + linear_rows(self.down, F.silu(gate) * up, rows, wide)


class LlamaBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.attn_norm = RMSNorm(cfg.n_embd, cfg.rms_eps)
        q_kv = (cfg.n_head + 2 * cfg.n_kv_head) * cfg.head_dim
        self.qkv = Linear(cfg.n_embd, q_kv, bias=False)                   # q, k, v rows, stacked
        self.out = Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.mlp = MLP(cfg)

    def forward(self, x, shape, rope, cache, layer, tiles, rows, tree=None, wide=False):
        """x [M, C]: the residual stream of a call's P x L tokens (shape), a row each, and in
        batch-invariant mode zero rows up to a multiple of row_multiple (they stay zero) ->
        [M, C]. rope: cos, sin [L, d]; tiles: bias_tiles of the bias [L, cache.length + L];
        tree: tree_plan of the mask when a batch-invariant row holds a token tree
        (tree_attention; tiles unused). rows: the matmuls' fixed block (None: no blocks; then
        `wide`: bf16 products widened, blocks.widened)."""
        cfg, (P, L), C = self.cfg, shape, x.shape[1]
        H, Hkv, d, N = cfg.n_head, cfg.n_kv_head, cfg.head_dim, P * L
        qkv = linear_rows(self.qkv, self.attn_norm(x), rows, wide)[:N]    # [N, (H + 2Hkv) d]
        qkv = qkv.view(P, L, H + 2 * Hkv, d).transpose(1, 2)              # [P, heads, L, d]
        q, k = rotate(qkv[:, :H + Hkv], *rope).split([H, Hkv], dim=1)     # q and k: one rotation
        v = qkv[:, H + Hkv:]
        if cache is not None:          # the new keys/values go in; every valid slot comes back
            k, v = cached(cache, layer, k, v, cfg.key_block if rows else 1)  # [P, Hkv, S, d]
        if tree is not None:                                              # batch-invariant tree
            y = tree_attention(q, k, v, tree, rows, cfg.key_block)
        else:
            y = tiled_attention(q, k, v, tiles, rows, cfg.key_block)      # [P, H, L, d]
        y = stream_rows(y.transpose(1, 2).reshape(N, C), cfg, rows)       # [M, C]
        x = x + linear_rows(self.out, y, rows, wide)
        return self.mlp(x, rows, wide)


def cached(cache, layer, k, v, round_to):
    """cache.write(layer, k, v), its slots rounded up to a multiple of round_to where the cache
    has them (stale or zero: batch-invariant attention hides them as its key tiles' padding,
    and the tiles then need no padded copy)."""
    keys, values = cache.write(layer, k, v)
    end, (kc, vc) = keys.shape[2], cache.kv[layer]
    rounded = end + -end % round_to
    if rounded == end or rounded > kc.shape[2]:
        return keys, values
    return kc[:k.shape[0], :, :rounded], vc[:k.shape[0], :, :rounded]


def stream_rows(flat, cfg, rows):
    """flat [N, C] -> the residual stream's rows [M, C]: in batch-invariant mode zero-padded to
    a multiple of cfg.row_multiple, so that no elementwise loop ends in a scalar tail."""
    return flat if rows is None else padded_copy(flat, cfg.row_multiple, 1)


# ----------------------------------------------------------------------------- the proposal heads

class ChainedHead(nn.Module):
    """Proposal head i >= 2 in chained form (ours, after Hydra: Ankner et al. 2024, "Hydra:
    Sequentially-Dependent Draft Heads for Medusa Decoding"): f_i = f_{i-1} + W2 silu(W1
    [f_{i-1}; e(t_{i-1})]), f_1 = z, where t_{i-1} is the token head i - 1 drafted and e the
    token embedding; the tied output projection then gives head i's logits (Llama.chained_logits).
    Why: docs/training.md, "The heads' form". Hydra feeds each head z and every earlier drafted
    token; ours reads the previous head's state and one token (a recurrence, as EAGLE's feature
    chain, without its attention layer). W2 starts at zero, as bpd_head's."""

    def __init__(self, n_embd):
        super().__init__()
        self.fc, self.proj = Linear(2 * n_embd, n_embd), Linear(n_embd, n_embd)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, x):
        """x [N, 2C]: [f_{i-1}; e(t_{i-1})] -> f_i [N, C]."""
        return x[:, :self.proj.out_features] + self.proj(F.silu(self.fc(x)))


class SternHead(BPDHead):
    """minibpd.BPDHead (like Stern §6's) for this model: SiLU as the trunk's MLP, weights in the
    model's dtype (Linear), W2 at zero, so that an untrained head predicts what head 1 does
    (Medusa-style training starts there)."""

    def __init__(self, n_embd):
        nn.Module.__init__(self)
        self.fc, self.proj = Linear(n_embd, n_embd), Linear(n_embd, n_embd)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, z):
        return z + self.proj(F.silu(self.fc(z)))


def bpd_head(cfg):
    """A proposal head for this model: SternHead, or chained (cfg.head_form, ChainedHead: an
    untrained one predicts the token it is given)."""
    return ChainedHead(cfg.n_embd) if cfg.head_form == "chained" else SternHead(cfg.n_embd)
