"""llama: the Llama decoder that smollm.py loads SmolLM2-135M into (RMSNorm, rotary position
embeddings, grouped-query attention, SwiGLU, an output head tied to the token embedding), with
BPD proposal heads after Stern §6 (Stern et al. 2018) or chained, each reading the token drafted
before it (ChainedHead; ours, after Hydra), and a batch-invariant mode. It offers minibpd.GPT's
interface (docs/layout.md, "A new model family"), so bpd_decode runs it unchanged.

Batch invariance. BPD returns greedy's tokens only if a position's logits do not depend on how
many positions one call computes (Stern §3: verification must reproduce the greedy choices).
BLAS libraries pick kernels and reduction orders by matrix shape, so a row computed in a chunk of
16 can differ in its last bits from the same row computed alone, and an argmax can flip at a
near-tie (in bf16 often). In batch-invariant mode every matmul runs on blocks of ONE fixed
shape: `row_block` rows (tokens, zero-padded), each block a fresh, aligned tensor (linear_rows,
by_rows), and attention runs on key tiles of `key_block` slots whose partial results are added in
a fixed order (tiles a query cannot see add exact zeros); a token tree's node attends to its
keys gathered in the order one-token decoding holds them (attention.tree_attention). Three things decide a
kernel's rounding, and each is fixed: the shape, the memory alignment (kernels peel unaligned
starts), and an element's place in SIMD loops (SiLU's scalar tail rounds differently from its
vector body). Between the matmuls the row-wise operations (RMSNorm's mean and rsqrt, SiLU,
rotary products, residual adds) run on the call's own rows, zero-padded to a multiple of
`row_multiple` rows so that no SIMD loop ends in a scalar tail, whatever the row count: each
reduces or rounds a row, or an element, on its own, so only the matmuls pay for whole blocks
(docs/real-model.md, "Rows per block", measures what a block costs). What this rests on, that a
fixed-shape kernel treats its rows alike and a row-wise operation a row alike whatever the row
count, is what test_smollm.py checks bit for bit. Weights may be bf16;
activations, attention and the KV cache stay in fp32.
"""
import copy
import dataclasses
import math
import types
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from minibpd import KVCache
from models.attention import bias_tiles, causal_bias, mask_to_bias, tree_plan
from models.blocks import by_rows, derived, linear
from models.llama_layers import LlamaBlock, RMSNorm, TiedHead, bpd_head, rope_tables, stream_rows
from runtime.fast_heads import head_states, heads_view
from runtime.kvcache import KVSpec, prefill_length

VECTOR_LOOP = 64  # elements: a multiple of every SIMD loop's unrolled width, so no scalar tail
DRAFT_FILL = -1e9 # head logits outside a draft vocabulary (finite: 0 * log 0 stays 0, not NaN)
HEAD_FORMS = ("stern", "chained")   # LlamaConfig.head_form: bpd_head's two forms
DRAFT_ROWS = 1    # rows per fixed block of chained heads' drafting (Llama.chained_logits)


@dataclass
class LlamaConfig:
    vocab_size: int = 49152
    block_size: int = 512        # context window of the decode loop (minibpd.window_start)
    n_bpd_heads: int = 1         # h, counting head 1 (the base model's own next-token head)
    n_layer: int = 30
    n_head: int = 9              # query heads
    n_kv_head: int = 3           # key/value heads (grouped-query attention)
    n_embd: int = 576
    n_hidden: int = 1536         # SwiGLU intermediate size
    rope_theta: float = 100000.0
    rms_eps: float = 1e-5
    n_positions: int = 8192      # the most positions the model was trained for (rotary table)
    batch_invariant: bool = True
    row_block: int = 8           # rows per fixed-shape block in batch-invariant mode
    key_block: int = 64          # key slots per attention tile in batch-invariant mode
    wide_prefill: bool = False   # a prefill's bf16 products as float32 ones (linear_rows; ours)
    prefill_apart: int = 1       # the fewest prefill tokens that run apart (Llama.prefilled; ours)
    head_form: str = "stern"     # heads 2..h: "stern" (BPDHead) or "chained" (ChainedHead; ours)

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_bpd_heads", "n_layer", "n_head", "n_kv_head",
                     "n_embd", "n_hidden", "n_positions", "row_block", "key_block",
                     "prefill_apart"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"LlamaConfig.{name} must be an integer >= 1, got {value!r}")
        if self.n_embd % self.n_head or (self.n_embd // self.n_head) % 2:
            raise ValueError(f"n_embd ({self.n_embd}) must be n_head ({self.n_head}) times an "
                             "even head size (rotary embeddings rotate pairs)")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_kv_head "
                             f"({self.n_kv_head})")
        if self.key_block % VECTOR_LOOP:
            raise ValueError(f"key_block must be a multiple of {VECTOR_LOOP}, got {self.key_block}")
        if self.batch_invariant and self.row_block % self.row_multiple:
            raise ValueError(f"row_block must be a multiple of {self.row_multiple} for these layer "
                             f"widths (row_block x width a multiple of {VECTOR_LOOP} elements), got "
                             f"{self.row_block}")
        if self.head_form not in HEAD_FORMS:
            raise ValueError(f"head_form must be one of {', '.join(HEAD_FORMS)}, got "
                             f"{self.head_form!r}")
        if self.block_size > self.n_positions:
            raise ValueError(f"block_size ({self.block_size}) must be at most n_positions "
                             f"({self.n_positions}), the positions the model knows")

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    @property
    def row_multiple(self):
        """The smallest row count R such that R x every row width (residual, q/k/v, SwiGLU, the
        output projection's V) is a multiple of VECTOR_LOOP elements: 1 for SmolLM2's widths
        (576, 960, 1536, 49,152). V counts too: with V = 2 or 3 and 8-row blocks the projection
        rounded a row by its place in the block (test_chunked_equals_sequential_bitwise)."""
        widths = (self.n_embd, (self.n_head + 2 * self.n_kv_head) * self.head_dim, self.n_hidden,
                  self.vocab_size)
        return max(VECTOR_LOOP // math.gcd(VECTOR_LOOP, w) for w in widths)


# ----------------------------------------------------------------------------- the model

def activation_dtype(weights):
    """Activations, attention and the KV cache of a model with weights in `weights`: fp32 under
    bf16/fp16 weights."""
    return weights if weights in (torch.float32, torch.float64) else torch.float32


class Llama(nn.Module):
    """The Llama decoder with h heads: head 1 is the base LM, heads 2..h are BPDHeads or
    ChainedHeads (config.head_form), and all of them share the output projection, tied to the
    token embedding (Stern §6; Kim §4)."""
    draft_vocab = None      # token ids [S] (long) heads 2..h draft among, or None: all of them
    reference = False       # True: each head one by one (the readable version, --reference)

    def __init__(self, cfg):
        super().__init__()
        self.config, self.gguf_path = cfg, None
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.blocks = nn.ModuleList([LlamaBlock(cfg) for _ in range(cfg.n_layer)])
        self.norm = RMSNorm(cfg.n_embd, cfg.rms_eps)
        # Built in a loop: `[BPDHead(cfg)] * n` would share one module n times.
        self.heads = nn.ModuleList([bpd_head(cfg) for _ in range(cfg.n_bpd_heads - 1)])
        self.lm_head = TiedHead(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight
        self.lm_head.rows = cfg.row_block if cfg.batch_invariant else None
        with torch.device("cpu"):         # plain tensors, never on the meta device of load()
            self.rope = rope_tables(cfg.n_positions, cfg.head_dim, cfg.rope_theta)

    @property
    def batch_invariant(self):
        return self.config.batch_invariant

    @batch_invariant.setter
    def batch_invariant(self, on):
        """Switch the fixed-shape blocks on or off (for this model and its first_heads views,
        which share lm_head)."""
        self.config = dataclasses.replace(self.config, batch_invariant=bool(on))
        self.lm_head.rows = self.config.row_block if on else None

    @property
    def act_dtype(self):
        return activation_dtype(self.tok_emb.weight.dtype)

    def forward(self, idx, cache=None, tree=None, prefix=None):
        """idx [P, L] token ids -> final hidden states z [P, L, C] (after the final RMSNorm). With
        a cache the L tokens sit at window slots cache.length.. (positions = slots; the cache is
        written, not advanced). tree: (positions [L], mask [L, length + L]) of a token tree.
        prefix: the first `prefix` tokens are a prefill (the same in every row), which in
        batch-invariant mode runs apart from the rest (prefilled) from cfg.prefill_apart tokens on
        (fewer: in the call's blocks, as the rest; the same choice in every decoder); None: the
        cache's (prefill_of)."""
        prefix = self.prefill_of(idx, cache, tree) if prefix is None else prefix
        rows = self.lm_head.rows
        if rows is not None and prefix >= max(1, self.config.prefill_apart):
            return self.prefilled(idx, cache, tree, prefix)
        start = 0 if cache is None else cache.length
        x, rope, tiles, plan = self.inputs(idx, start, tree, rows)
        for i, block in enumerate(self.blocks):
            x = block(x, idx.shape, rope, cache, i, tiles, rows, plan)
        return self.norm(x)[:idx.numel()].view(*idx.shape, -1)

    def prefill_of(self, idx, cache, tree=None):
        """The prefill of a decode call (kvcache.prefill_length): on an empty cache, the leading
        tokens of the call but its last in the first window (a prompt: the decode loops meet an
        empty cache there only with one, never with a draft tree), block_size - shift of them in
        a moved one; 0 otherwise, and where the rows do not share those tokens (independent
        sequences: runtime.loop.decode_rows)."""
        if cache is None or cache.length > 0 or (tree is not None and cache.start == 0):
            return 0
        n = prefill_length(cache.start, idx.shape[1], self.config.block_size)
        return n if torch.equal(idx[:, :n], idx[:1, :n].expand(len(idx), n)) else 0

    def inputs(self, idx, start, tree, rows):
        """What every layer of a call needs: the residual stream x [M, C] of idx [P, L] (tokens at
        slots start..), rotary cos, sin [L, d], and the attention bias in tiles or a tree's plan
        (made once a call)."""
        P, L = idx.shape
        dtype, dev, cfg = self.act_dtype, idx.device, self.config
        if tree is None:
            pos, bias = torch.arange(start, start + L), causal_bias(L, start, dtype, dev)
        else:
            pos, bias = tree[0].cpu(), mask_to_bias(tree[1], dtype)
        if int(pos.max()) >= cfg.n_positions:
            raise ValueError(f"position {int(pos.max())} is past the model's "
                             f"{cfg.n_positions} positions")
        rope = [t[pos].to(dev, dtype) for t in self.rope]                 # cos, sin [L, d]
        x = stream_rows(self.tok_emb(idx).to(dtype).view(P * L, -1), cfg, rows)   # [M, C]
        plan = tiles = None
        if tree is not None and rows is not None:
            plan = tree_plan(tree[1], dtype, cfg.n_head // cfg.n_kv_head, rows, cfg.key_block)
        else:
            tiles = bias_tiles(bias, cfg.n_head // cfg.n_kv_head, rows, cfg.key_block)
        return x, rope, tiles, plan

    def prefilled(self, idx, cache, tree, n):
        """forward() whose first n tokens, a prompt's or a new window's (the decode loop passes
        the uncached tail but its last token), run ONCE, as one row in plain products (no fixed
        blocks; bf16 widened with cfg.wide_prefill), and the rest in fixed blocks as ever, layer
        by layer in one pass: every decoder prefills the same tokens with this same call, so
        exactness holds (ours; docs/real-model.md, "Prefill"). -> z [P, L, C]."""
        P, L = idx.shape
        if not 0 < n < L or not torch.equal(idx[:, :n], idx[:1, :n].expand(P, n)):
            raise ValueError(f"a prefill is 1 to L - 1 = {L - 1} tokens shared by every row, got {n}")
        cache = KVCache(self, 1) if cache is None else cache   # (states_along calls without one)
        after = copy.copy(cache)                    # the same slots, seen past the prefill
        after.length += n
        rest = None if tree is None else (tree[0][n:], tree[1][n:])
        head, h_rope, h_tiles, _ = self.inputs(idx[:1, :n], cache.length, None, None)
        x, rope, tiles, plan = self.inputs(idx[:, n:], after.length, rest, self.lm_head.rows)
        for i, block in enumerate(self.blocks):     # the prefill's keys first, then the rest's
            head = block(head, (1, n), h_rope, cache, i, h_tiles, None, None,
                         self.config.wide_prefill)
            x = block(x, (P, L - n), rope, after, i, tiles, self.lm_head.rows, plan)
        head = self.norm(head).view(1, n, -1).expand(P, n, -1)              # [P, n, C]
        return torch.cat([head, self.norm(x)[:P * (L - n)].view(P, L - n, -1)], dim=1)

    def head_logits(self, z, last=None):
        """z [..., C] -> logits of all h heads [..., h, V]; head i predicts i - 1 tokens further.
        Heads 2..h run stacked (fast_heads.head_states), or one by one with `reference` (the
        readable version, --reference), by fixed-shape row blocks either way; chained heads one
        after another (chained_logits, which reads `last`; Stern's ignore it). With
        `draft_vocab` (token ids; not under autograd) heads 2..h are projected onto those tokens
        only, DRAFT_FILL elsewhere: the drafts change, never verification, and head 1 keeps
        every token (lm_head's memo has its row from verification)."""
        if not self.heads:
            return self.lm_head(z).unsqueeze(-2)
        if self.config.head_form == "chained":
            return self.chained_logits(z, last)
        zs = self.head_rows(z)                                            # [..., h, C]
        if self.draft_vocab is None or torch.is_grad_enabled():
            return self.lm_head(zs)
        drafts = self._filled(self._draft_rows(zs[..., 1:, :], self.lm_head.rows))
        return torch.cat([self.lm_head(zs[..., :1, :]), drafts], -2)

    def chained_logits(self, z, last=None):
        """Heads 1..h in chained form (ChainedHead): z [..., C] -> [..., h, V]. Head i reads head
        i - 1's state and the embedding of the token head i - 1 drafts: its argmax, or for head
        1 `last` (token ids [...], or an int for one z: the token just chosen, which under
        sampling need not be head 1's argmax). Heads 2..h run in blocks of DRAFT_ROWS rows when
        batch-invariant: one fixed shape, as head_logits's blocks, and a lone state (a decode
        step's) pays for one row, not a whole block, at each of the h - 1 steps."""
        flat = z.reshape(-1, z.shape[-1])                                 # [N, C]
        first = self.lm_head(flat)                                        # head 1: [N, V]
        t = first.argmax(-1) if last is None else \
            torch.as_tensor(last, device=z.device).reshape(-1)           # [N]
        rows = None if self.lm_head.rows is None else DRAFT_ROWS
        sub = self.draft_vocab is not None and not torch.is_grad_enabled()
        f, later = flat, []
        for head in self.heads:
            x = torch.cat([f, self.tok_emb(t).to(f.dtype)], dim=-1)      # [N, 2C]
            f = by_rows(head, x, rows)                                    # [N, C]
            later.append(self._draft_rows(f, rows) if sub else self.lm_head(f))
            t = later[-1].argmax(-1)                                      # what head i drafts
            t = self.draft_vocab[t] if sub else t                         # [N] token ids
        later = torch.stack(later, dim=-2)                                # [N, h - 1, S or V]
        out = torch.cat([first[:, None], self._filled(later) if sub else later], dim=-2)
        return out.view(*z.shape[:-1], len(self.heads) + 1, -1)

    def head_rows(self, z):
        """z [..., C] -> the states Stern-form heads 1..h project, [..., h, C] (z itself first;
        chained heads need the token before theirs: chained_logits)."""
        zs = by_rows(self._head_states, z, self.lm_head.rows)             # [..., h C]
        return zs.view(*z.shape[:-1], len(self.heads) + 1, z.shape[-1])

    def verified_logits(self, z):
        """lm_head(z) for verification (minibpd.GreedyRule): z [P, m + 1, C] -> [P, m + 1, V].
        Batch-invariant, the block's spare rows carry heads 2..h's states at the first
        positions of draft 0: one projection block for the verified logits and the next
        draft's heads, which head_logits then copies from lm_head's memo when the next draft
        comes from one of those positions (most steps accept 0 or 1 drafted tokens). The
        verified rows' logits are the same bits either way: a fixed-shape block treats its
        rows alike."""
        rows, n, C = self.lm_head.rows, z.shape[0] * z.shape[1], z.shape[-1]
        k = 0 if rows is None or not self.heads or self.draft_vocab is not None or \
            self.config.head_form == "chained" else \
            min(z.shape[1], (-n % rows) // len(self.heads))               # positions that fit
        if k == 0:
            return self.lm_head(z)
        heads = self.head_rows(z[0, :k])[:, 1:].reshape(-1, C)           # [k (h - 1), C]
        return self.lm_head(torch.cat([z.reshape(n, C), heads]))[:n].view(*z.shape[:-1], -1)

    def _draft_rows(self, zs, rows):
        """zs [..., C] -> logits over draft_vocab only [..., S], by fixed blocks of `rows` (the
        embedding rows of those tokens, copied once)."""
        W, ids = self.lm_head.weight, self.draft_vocab
        sub_head = derived(self, "_draft_head", (W.data_ptr(), W._version, W.dtype, id(ids)),
                           lambda: types.SimpleNamespace(weight=W[ids].detach().contiguous(),
                                                         bias=None))     # weight [S, C]
        dtype = sub_head.weight.dtype
        return by_rows(lambda b: linear(sub_head, b.to(dtype)).to(b.dtype), zs, rows)

    def _filled(self, sub):
        """Logits over draft_vocab [..., S] -> over every token [..., V], DRAFT_FILL elsewhere."""
        out = sub.new_full((*sub.shape[:-1], self.config.vocab_size), DRAFT_FILL)
        out[..., self.draft_vocab] = sub
        return out

    def _head_states(self, x):
        """x [N, C] -> [N, h C]: z, then z + W2 silu(W1 z) for heads 2..h."""
        if self.reference:
            return torch.cat([x] + [head(x) for head in self.heads], dim=-1)
        return head_states(self.heads, x, F.silu).reshape(x.shape[0], -1)

    def kv_spec(self):
        """What a KVCache for this model holds: (layers, kv heads, head dim, dtype, device)."""
        cfg = self.config
        return KVSpec(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, self.act_dtype,
                      self.tok_emb.weight.device)

    def flop_params(self):
        """Parameters a token's forward pass multiplies by (rotary positions: no table): all."""
        return sum(p.numel() for p in self.parameters())

    def first_heads(self, n):
        return heads_view(self, n)
