"""minibpd: exact blockwise parallel decoding (BPD): the model, the cache, the decode loop.

A tiny character-level GPT with h prediction heads (Stern et al. 2018, "Blockwise Parallel
Decoding for Deep Autoregressive Models"), a preallocated KV cache, greedy decoding (the
reference), and BPD with Stern's merged predict+verify step: one model call per step, whose
verification pass also yields the next draft. Drafters (Kim et al. 2024, §7) plug into the one
decode loop; `lattice.py` holds the refined ones, `sampling.py` the rule that keeps BPD exact when
sampling, `checkpoint.py` loading and text (re-exported here), `bench.py` the command line.

Exactness: BPD returns exactly the tokens of `greedy_decode`. In float64 this holds bit for bit
in practice: the batched verification pass and the one-token pass sum in different orders, and
the rounding differences (~1e-16) cannot flip an argmax unless two logits tie that closely. In
float32 (~1e-7) or bf16 (~1e-2) such near-ties do happen now and then, so an argmax can flip and
the two decoders can diverge: this is rounding, not a bug, and it is why the tests run in float64.
The same holds for sampling: the distribution is exact up to the rounding of the probabilities.
"""
import copy
import dataclasses
import functools
import numbers
import sys
from dataclasses import dataclass
from typing import NamedTuple
from operator import index

import torch
import torch.nn as nn
import torch.nn.functional as F

from checkpoint import (CHECKPOINT, FORMAT_VERSION, CheckpointError, build_model,  # noqa: F401
                        decode, encode, known_characters, load_checkpoint, retrain)
from sampling import check_temperature, target_probs, verify_sampled  # noqa: F401 (public)



@dataclass
class GPTConfig:
    vocab_size: int = 96
    block_size: int = 128   # context window: the most tokens the model sees at once
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    n_bpd_heads: int = 8    # h, counting head 1 (the base model's own next-token head)
    dropout: float = 0.0

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "n_bpd_heads"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"GPTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")


class KVSpec(NamedTuple):
    """The shape of a model's KV cache (GPT.kv_spec): any model with this, `config`, forward and
    head_logits runs in the decode loop."""
    layers: int
    heads: int        # key/value heads (fewer than query heads under grouped-query attention)
    head_dim: int
    dtype: torch.dtype
    device: torch.device


# ----------------------------------------------------------------------------- the model

class SelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x, cache=None, layer=0, mask=None):
        """x: [P, L, C]. Training: no cache, plain causal attention. Decoding: the L new keys and
        values go into the cache (KVCache.write), and attention reads every valid slot."""
        P, L, C = x.shape
        q, k, v = self.qkv(x).view(P, L, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        if cache is None:  # q, k, v: [P, n_head, L, head_dim]
            drop = self.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop)
        else:  # the cache stores the L new keys/values and hands back every valid slot's
            keys, values = cache.write(layer, k, v)          # [P, n_head, length + L, head_dim]
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(P, L, C))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        self.attn = SelfAttention(cfg)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd), nn.Dropout(cfg.dropout))

    def forward(self, x, cache=None, layer=0, mask=None):
        x = x + self.attn(self.ln1(x), cache, layer, mask)
        return x + self.mlp(self.ln2(x))


class BPDHead(nn.Module):
    """Proposal head i >= 2 (Stern §6, Fig. 3): one hidden layer and a residual on the final
    hidden state; the original output projection is then reapplied (GPT.head_logits)."""

    def __init__(self, cfg):
        super().__init__()
        self.fc, self.proj = nn.Linear(cfg.n_embd, cfg.n_embd), nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, z):
        return z + self.proj(F.gelu(self.fc(z)))


class GPT(nn.Module):
    """nanoGPT-style decoder. Head 1 is the base LM itself; heads 2..h are BPDHeads. All heads share
    one output projection (Stern §6), tied to the token embedding (Kim §4)."""

    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        # Built in a loop: `[BPDHead(cfg)] * n` would share one module n times.
        self.heads = nn.ModuleList([BPDHead(cfg) for _ in range(cfg.n_bpd_heads - 1)])
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx, cache=None, tree=None):
        """idx: [P, L] token ids -> final hidden states z: [P, L, C]. With a cache the L tokens sit
        at window slots cache.length.. (the cache is written, not advanced; see KVCache.advance).
        tree: (positions [L], mask [L, length + L]) of a token tree in one row (tree_layout)."""
        P, L = idx.shape
        start = 0 if cache is None else cache.length
        if tree is None:
            pos = torch.arange(start, start + L, device=idx.device)
            mask = causal_mask(L, start, idx.device) if cache is not None and L > 1 else None
        else:
            pos, mask = tree
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for i, block in enumerate(self.blocks):
            x = block(x, cache, i, mask)
        return self.ln_f(x)

    def head_logits(self, z):
        """z: [..., C] -> logits of all h heads: [..., h, V]; head i predicts i - 1 tokens further.
        Heads 2..h run as one batched matmul over their stacked weights: the same maths as calling
        each BPDHead, but on a CPU h - 1 separate small calls would cost about as much as the trunk."""
        if not self.heads:
            return self.lm_head(z).unsqueeze(-2)
        w1, b1, w2, b2 = self._stacked_heads()   # [(h-1)C, C], [(h-1)C], [h-1, C, C], [h-1, 1, C]
        C, H = z.shape[-1], len(self.heads)
        x = z.reshape(-1, C)                                                 # [N, C]
        hidden = F.gelu(F.linear(x, w1, b1)).view(-1, H, C).transpose(0, 1)  # [h-1, N, C]
        y = x + torch.baddbmm(b2, hidden, w2)                                # [h-1, N, C]
        zs = torch.cat([x[None], y]).transpose(0, 1).reshape(*z.shape[:-1], H + 1, C)
        return self.lm_head(zs)                                              # [..., h, V]

    def kv_spec(self):
        """What a KVCache for this model holds: (layers, kv heads, head dim, dtype, device)."""
        cfg, w = self.config, self.tok_emb.weight
        return KVSpec(cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, w.dtype, w.device)

    def first_heads(self, n):
        """This model using only heads 1..n, weights shared: plain BPD with n heads (n = 1: greedy)."""
        if not is_int(n) or not 1 <= n <= self.config.n_bpd_heads:
            raise ValueError(f"heads must be an integer from 1 to {self.config.n_bpd_heads}, got {n!r}")
        view = copy.copy(self)                       # shares parameters; own module table
        view._modules = dict(self._modules)
        view.heads = nn.ModuleList(list(self.heads)[:n - 1])
        view.config = dataclasses.replace(self.config, n_bpd_heads=n)
        return view

    def _stacked_heads(self):
        """The heads' weights stacked; cached at inference, re-stacked when any weight changes."""
        ps = [p for hd in self.heads for p in (hd.fc.weight, hd.fc.bias, hd.proj.weight, hd.proj.bias)]
        key = tuple((p.data_ptr(), p._version) for p in ps)
        if self.training or getattr(self, "_stack_key", None) != key:
            stacked = (torch.cat(ps[0::4]), torch.cat(ps[1::4]),          # fc: one wide linear
                        torch.stack([p.t() for p in ps[2::4]]),            # proj: [h-1, C_in, C_out]
                        torch.stack([p[None] for p in ps[3::4]]))          # [h-1, 1, C]
            if self.training:                                               # keep autograd intact
                return stacked
            self._stack, self._stack_key = stacked, key
        return self._stack

    def loss(self, chunk, head_weight=1.0):
        """chunk: [B, T + h] -> (joint loss, per-head losses [h]). Head i at position t is trained
        on token t + i. Joint training of trunk and heads (Kim §4), with our weighting: a weighted
        mean of the per-head losses, head 1 weighted 1 and heads 2..h `head_weight` each (1.0: the
        plain mean; Stern instead trains one randomly chosen head per batch)."""
        T, h = chunk.shape[1] - self.config.n_bpd_heads, self.config.n_bpd_heads
        logits = self.head_logits(self(chunk[:, :T]))            # [B, T, h, V]
        targets = torch.stack([chunk[:, 1 + i:1 + i + T] for i in range(h)], dim=-1)  # [B, T, h]
        per_tok = F.cross_entropy(logits.flatten(0, 2), targets.flatten(), reduction="none")
        per_head = per_tok.view(-1, h).mean(0)
        w = torch.full((h,), float(head_weight), device=chunk.device)
        w[0] = 1.0
        return (w * per_head).sum() / w.sum(), per_head


@functools.lru_cache(maxsize=4096)
def causal_mask(L, start, device):
    """[L, start + L] bool: query i (at slot start + i) may see slots 0..start + i. Cached: the
    decode loop asks for the same few shapes over and over."""
    return torch.ones(L, start + L, dtype=torch.bool, device=device).tril(start)


# ----------------------------------------------------------------------------- the KV cache

def window_start(t, block_size):
    """First position the model sees when it predicts the token at position t: 0 while t fits in the
    window, else jumps forward in steps of block_size // 2. Greedy and every BPD path predict
    position t from exactly seq[window_start(t):t], so running past the window (or a prompt longer
    than it) keeps them identical; the cache is rebuilt when the start jumps."""
    shift = max(1, block_size // 2)
    over = t - block_size
    return 0 if over <= 0 else -(-over // shift) * shift


MAX_CACHE_BYTES = 2 ** 30   # 1 GiB: the most a KVCache may allocate (p-best's p sets its rows)


def check_cache_budget(model, rows, spare=0):
    """Refuse, before allocating, a KVCache of `rows` rows over MAX_CACHE_BYTES."""
    spec, slots = model.kv_spec(), model.config.block_size + spare
    row = 2 * spec.layers * spec.heads * slots * spec.head_dim * spec.dtype.itemsize
    if not is_int(rows) or not 1 <= rows <= MAX_CACHE_BYTES // row:
        raise ValueError(f"a KV cache of {rows} rows would need {rows * row / 2**20:,.0f} MiB; the "
                         f"budget is {MAX_CACHE_BYTES // 2**20} MiB, i.e. 1 to {MAX_CACHE_BYTES // row}"
                         " rows (drafts verified per call) for this model")


class KVCache:
    """Preallocated keys/values per layer, [R, n_head, block_size, head_dim], and two integers:
    `start`, the absolute position of slot 0, and `length`, the number of valid slots. Its row
    protocol (nothing outside this class moves `length`):
      write(layer, k, v)  a model call's L new keys/values go to slots length..length+L-1 of
                          rows 0..P-1; a one-row call (prefill, greedy step) writes every row,
                          because it extends the prefix that all rows share.
      advance(n, row)     keep n of the slots just written, those of `row`, in every row.
      compact(fed, nodes) tree verification (one row): keep the tail and the accepted nodes.
      truncate(length)    forget every slot from `length` on (rewind after rejected drafts).
      reset(start)        empty, for a window that starts at position `start`.
    Rejected draft tokens are dropped by not advancing past them: nothing is ever erased. R rows
    let p drafts be verified in one batched call (Kim §7.2); `spare` slots past the window hold a
    token tree's extra branches until compact() keeps the accepted one."""

    def __init__(self, model, rows=1, spare=0):
        spec = model.kv_spec()
        check_cache_budget(model, rows, spare)
        shape = (rows, spec.heads, model.config.block_size + spare, spec.head_dim)
        self.kv = [[torch.zeros(shape, dtype=spec.dtype, device=spec.device) for _ in range(2)]
                   for _ in range(spec.layers)]
        self.rows, self.start, self.length, self.written = rows, 0, 0, 1

    def write(self, layer, k, v):
        """k, v: [P, n_head, L, head_dim] -> every valid slot's keys and values, new ones included:
        [P, n_head, length + L, head_dim] each."""
        P, end = k.shape[0], self.length + k.shape[2]
        rows = slice(None) if P == 1 else slice(0, P)
        kc, vc = self.kv[layer]
        kc[rows, :, self.length:end], vc[rows, :, self.length:end] = k, v
        self.written = P
        return kc[:P, :, :end], vc[:P, :, :end]

    def advance(self, n, row=0):
        if self.written > 1:  # several drafts were written: copy the winner's slots to every row
            new = slice(self.length, self.length + n)
            for pair in self.kv:
                for t in pair:
                    t[:, :, new] = t[row:row + 1, :, new]
        self.length += n

    def compact(self, fed, nodes):
        """Tree verification: keep the `fed` tail slots just written and the accepted tree
        `nodes` (offsets after the tail, root to leaf), moved to consecutive slots; advance."""
        base = self.length + fed
        src = torch.tensor(nodes, dtype=torch.long, device=self.kv[0][0].device) + base
        for pair in self.kv:
            for t in pair:
                t[:, :, base:base + len(nodes)] = t[:, :, src]   # gathered first: overlap is safe
        self.length = base + len(nodes)

    def truncate(self, length):
        self.length = max(0, min(self.length, length))

    def reset(self, start):
        self.start, self.length = start, 0


def uncached_tail(model, cache, seq):
    """The tokens of seq the cache does not hold yet (at least seq[-1]). If the window must move
    for position len(seq), the cache is emptied and the tail is the whole new window."""
    start = window_start(len(seq), model.config.block_size)
    if start != cache.start:
        cache.reset(start)
    return seq[cache.start + cache.length:]


def model_call(model, cache, seq, extra):
    """One serial model call. Feeds the uncached tail of `seq` plus P candidate continuations
    `extra` (P lists of m tokens) and returns (z [P, m + 1, C], tail length); z[:, i] predicts
    token len(seq) + i."""
    tail = uncached_tail(model, cache, seq)
    idx = torch.tensor([tail + e for e in extra], dtype=torch.long, device=model.lm_head.weight.device)
    z = model(idx, cache)
    return z[:, len(tail) - 1:], len(tail)


def draft_tree(extra):
    """The drafts as a token tree (a trie: shared prefixes once). -> (tokens [N], parents [N],
    -1 for a child of the certain token; paths: each draft's node indices, root to leaf)."""
    nodes, tokens, parents, paths = {}, [], [], []
    for d in extra:
        node, path = -1, []
        for tok in d:
            if (node, tok) not in nodes:
                nodes[(node, tok)] = len(tokens)
                tokens.append(tok)
                parents.append(node)
            node = nodes[(node, tok)]
            path.append(node)
        paths.append(path)
    return tokens, parents, paths


def tree_layout(T, parents, length, device):
    """Positions [T + N] and attention mask [T + N, length + T + N] of one row: T tail tokens
    (causal), then N tree nodes; node j sees the cache, the tail, its ancestors and itself, and
    sits at the position of its depth, as if its path alone had been fed."""
    N, depth = len(parents), []
    see = torch.eye(N, dtype=torch.bool)                     # see[j, i]: node j attends to node i
    for j, par in enumerate(parents):
        depth.append(1 if par < 0 else depth[par] + 1)
        if par >= 0:
            see[j] |= see[par]
    mask = torch.ones(T + N, length + T + N, dtype=torch.bool)         # all see the cache
    mask[:T, length:] = False
    mask[:T, length:length + T] = torch.ones(T, T, dtype=torch.bool).tril()   # the tail: causal
    mask[T:, length + T:] = see                                  # nodes: the tail + ancestors
    pos = torch.cat([torch.arange(length, length + T), length + T - 1 + torch.tensor(depth)])
    return pos.to(device), mask.to(device)


def tree_call(model, cache, seq, extra):
    """model_call with the P drafts verified as ONE row: a token tree with a tree attention mask
    (each drafted token appears once). -> (z [P, m + 1, C] gathered along each draft's path,
    tail length, paths) for the same verification as model_call's; KVCache.compact keeps the
    accepted path."""
    tail = uncached_tail(model, cache, seq)
    tokens, parents, paths = draft_tree(extra)
    dev, T = model.lm_head.weight.device, len(tail)
    idx = torch.tensor([tail + tokens], dtype=torch.long, device=dev)
    z = model(idx, cache, tree_layout(T, parents, cache.length, dev))[0]       # [T + N, C]
    at = torch.tensor([[T - 1] + [T + j for j in path] for path in paths], device=dev)
    return z[at], T, paths


def check_request(model, prompt, max_new_tokens):
    """Clear errors for a bad request, before any model call. -> the prompt as a new list."""
    try:
        seq = [index(t) for t in prompt]
    except TypeError:
        raise ValueError("the prompt must be a sequence of integer token ids") from None
    if not seq:
        raise ValueError("the prompt is empty: give at least one token")
    V = model.config.vocab_size
    if min(seq) < 0 or max(seq) >= V:
        raise ValueError(f"prompt token ids must lie in [0, {V})")
    if not is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    return seq


def is_int(x):
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


# ----------------------------------------------------------------------------- decoding

@torch.no_grad()
def sample_decode(model, prompt, max_new_tokens, temperature=1.0, generator=None):
    """The reference decoder: one token per call with the KV cache, each the argmax (temperature
    0) or drawn from target_probs at `temperature`. -> new tokens."""
    seq = check_request(model, prompt, max_new_tokens)
    check_temperature(temperature)
    cache, n0 = KVCache(model), len(seq)
    for _ in range(max_new_tokens):
        z, fed = model_call(model, cache, seq, [[]])
        cache.advance(fed)
        logits = model.lm_head(z[0, -1])
        token = logits.argmax() if temperature == 0 else torch.multinomial(
            target_probs(logits.double(), temperature).cpu(), 1, generator=generator)
        seq.append(int(token))
    return seq[n0:]


def greedy_decode(model, prompt, max_new_tokens):
    """Greedy decoding with the KV cache: the reference every BPD path must equal, and the speed
    baseline."""
    return sample_decode(model, prompt, max_new_tokens, 0.0)


class ArgmaxDrafter:
    """Plain BPD drafter (Stern §3, predict): each head's most likely token.

    The drafter contract, checked by bpd_decode at every step (check_drafts):
      drafter(logprobs, context) -> drafts
        logprobs  [m, V]: log-probs of heads 1..m at the last accepted position
        context   the tokens so far, prompt included; context[-1] was just verified
        drafts    a list of 1..max_drafts drafts, each a list of m ints in [0, V) whose first
                  is context[-1] (head 1 is the base model: its token is certain)
      max_drafts  attribute: the most drafts one call returns (default 1); p-best verifies up
                  to this many in one batched call
    Both arguments are the drafter's own copies: changing them cannot change the output. A
    drafter may keep per-sequence state (NeuralDrafter keeps a small LM's KV cache), so one
    drafter object serves one sequence at a time."""
    name = "bpd"
    max_drafts = 1

    def __call__(self, logprobs, context):
        # Under greedy decoding head 1's argmax is context[-1]; when sampling it need not be.
        return [[context[-1]] + logprobs[1:].argmax(-1).tolist()]


def max_drafts(drafter):
    rows = getattr(drafter, "max_drafts", 1)
    if not is_int(rows) or rows < 1:
        raise ValueError(f"drafter {drafter_name(drafter)}: max_drafts must be an integer >= 1, "
                         f"got {rows!r}")
    return rows


def drafter_name(drafter):
    return getattr(drafter, "name", None) or type(drafter).__name__


def check_drafts(drafts, size, first, V, most, drafter):
    """The drafter contract (see ArgmaxDrafter) -> the drafts as new lists of ints, or a
    ValueError naming the rule broken and the drafter. At most p x h ints: microseconds."""
    def broken(rule, detail):
        return ValueError(f"drafter {drafter_name(drafter)} broke the drafter contract "
                          f"({rule}): {detail}")
    if not isinstance(drafts, (list, tuple)) or not 1 <= len(drafts) <= most:
        got = f"{len(drafts)}" if isinstance(drafts, (list, tuple)) else f"a {type(drafts).__name__}"
        raise broken("1..max_drafts drafts", f"return a list of 1 to {most} drafts; got {got}")
    out = []
    for j, d in enumerate(drafts):
        if not isinstance(d, (list, tuple)):
            hint = " (call .tolist())" if hasattr(d, "tolist") else ""
            raise broken("lists of ints", f"draft {j} is a {type(d).__name__}{hint}")
        if len(d) != size:
            raise broken("length", f"each draft has {size} tokens, one per row of logprobs; "
                                   f"draft {j} has {len(d)}")
        try:
            d = [index(t) for t in d]
        except TypeError:
            raise broken("lists of ints", f"draft {j} holds a non-integer token") from None
        if d[0] != first:
            raise broken("first token", f"each draft starts with context[-1] = {first}, the "
                                        f"verified token; draft {j} starts with {d[0]}")
        if min(d) < 0 or max(d) >= V:
            raise broken("ids in [0, V)", f"draft {j} holds {min(d) if min(d) < 0 else max(d)}, "
                                          f"outside [0, {V})")
        out.append(d)
    return out


def matched(proposed, truth):
    """Length of the longest prefix of `proposed` that equals `truth` (Stern §3, accept)."""
    return next((i for i, (a, b) in enumerate(zip(proposed, truth)) if a != b),
                min(len(proposed), len(truth)))


def verify_greedy(model, z, extra):
    """Stern §3, verify + accept. z [P, m + 1, C] from model_call; extra: P lists of the drafts'
    m tokens after the certain one. -> (winning row, accepted tokens a of extra[row], the base
    model's greedy token after extra[row][:a]: the one the call adds beyond the draft)."""
    g = model.lm_head(z).argmax(-1).tolist()                         # P lists of m + 1
    ok = [matched(ex, gr) for ex, gr in zip(extra, g)]               # longest matching prefixes
    row = ok.index(max(ok))                                          # the first of the best
    return row, ok[row], g[row][ok[row]]


VERIFY_MODES = ("auto", "batch", "tree")   # auto: tree for drafters of several drafts (faster here)


@torch.no_grad()
def bpd_decode(model, prompt, max_new_tokens, drafter=None, temperature=0.0, generator=None,
               verify="auto"):
    """Blockwise parallel decoding with merged predict+verify (Stern §4): each call verifies the
    drafts and, through the heads at the last accepted position, yields the next draft.
    temperature 0 (default): exactly greedy decoding's tokens. temperature T > 0: exactly the
    distribution of sample_decode at T, whatever the drafts (sampling.py; `generator` drives all
    randomness). verify: "batch" (P drafts as P rows of one call), "tree" (one row, each drafted
    token once: tree_call) or "auto" (tree when max_drafts > 1); the same tokens and steps.
    -> (new tokens, stats). stats: calls (serial model calls, prefill included), accepted (tokens
    gained per call), block_efficiency (new tokens / calls), steps (drafts, winner, accepted;
    when sampling, the tries), processed (tokens the base model ran on), verified (draft
    tokens the base model ran on)."""
    seq, h = check_request(model, prompt, max_new_tokens), model.config.n_bpd_heads
    check_temperature(temperature)
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {', '.join(VERIFY_MODES)}, got {verify!r}")
    drafter = drafter or ArgmaxDrafter()
    rows, B, V, n0 = max_drafts(drafter), model.config.block_size, model.config.vocab_size, len(seq)
    verify = ("tree" if rows > 1 else "batch") if verify == "auto" else verify
    # A tree of `rows` drafts of at most h - 1 tokens has at most (rows - 1)(h - 1) extra nodes.
    cache = KVCache(model, 1, (rows - 1) * (h - 1)) if verify == "tree" else KVCache(model, rows)
    extra, drafts, q = [[]], None, None           # the prefill call verifies nothing
    stats = {"calls": 0, "accepted": [], "steps": [], "processed": 0, "verified": 0}
    while True:
        tree = verify == "tree" and drafts is not None
        z, fed, paths = tree_call(model, cache, seq, extra) if tree else \
            model_call(model, cache, seq, extra) + (None,)
        if temperature == 0:
            row, a, token = verify_greedy(model, z, extra)
        else:
            probs = target_probs(model.lm_head(z).double(), temperature).cpu()   # [P, m + 1, V]
            row, a, token, tries = verify_sampled(probs, extra, q, generator)
        if tree:
            cache.compact(fed, paths[row][:a])
        else:
            cache.advance(fed + a, row)
        new = extra[row][:a] + [token]
        if drafts is not None:
            stats["steps"].append({"context": len(seq), "drafts": drafts, "winner": row,
                                   "accepted": len(new), **({"tries": tries} if temperature else {})})
        seq += new
        stats["calls"] += 1
        stats["accepted"].append(len(new))
        ran = len(set(sum(paths, []))) if tree else len(extra) * len(extra[0])  # draft tokens
        stats["processed"] += ran + (fed if tree else len(extra) * fed)     # tokens the model ran on
        stats["verified"] += ran
        left = max_new_tokens - (len(seq) - n0)
        if left <= 0:
            break
        # Draft up to m more tokens: no more than needed, none that would cross the window.
        m = min(h - 1, left, window_start(len(seq), B) + B - len(seq))
        extra, drafts, q = [[]], None, None
        if m > 0:
            logprobs = F.log_softmax(model.head_logits(z[row, a])[:m + 1], dim=-1)  # [m + 1, V]
            drafts, q = draft(drafter, logprobs, seq, temperature, generator)
            drafts = check_drafts(drafts, m + 1, seq[-1], V, rows, drafter)
            extra, q = [d[1:] for d in drafts], None if q is None else q[1:]
    stats["block_efficiency"] = max_new_tokens / stats["calls"]
    return seq[n0:n0 + max_new_tokens], stats


def draft(drafter, logprobs, seq, temperature, generator):
    """-> (drafts, q): q [m + 1, V] when a sampling drafter declares its proposal, else None.
    The drafter gets its own copy of seq: what it does to it cannot reach the output."""
    if temperature > 0 and hasattr(drafter, "sample"):
        return drafter.sample(logprobs, list(seq), temperature, generator)
    return drafter(logprobs, list(seq)), None


def set_threads(n=None):
    """torch's intra-op threads for every command. Default 1: measured here (README, 'Threads'),
    one thread decodes as fast as two on an idle 2-core machine and 4x faster when one other
    process is busy, because torch's threads wait for each other at every small op."""
    n = 1 if n is None else n
    if not is_int(n) or n < 1:
        raise ValueError(f"--threads must be an integer >= 1, got {n!r}")
    torch.set_num_threads(n)
    return n


# ----------------------------------------------------------------------------- command line

def main(argv=None):
    """`python minibpd.py ...`: the command line lives in bench.py (demo, generator, bench, tune)."""
    import bench
    return bench.main(argv)


if __name__ == "__main__":
    import minibpd  # run main() from the importable module, so bench.py shares its classes
    sys.exit(minibpd.main())
