"""minibpd: blockwise parallel decoding (BPD) on a tiny character GPT, exactly.

Stern, Shazeer, Uszkoreit, "Blockwise Parallel Decoding for Deep Autoregressive Models", NeurIPS
2018 (arXiv 1811.03115): h heads guess the next h tokens (predict), the base model checks them in
one call (verify), the longest prefix equal to its greedy choices is kept (accept). "Kim §N": Kim
et al., arXiv 2404.09221v2. Top to bottom: the model (Stern §6), the KV cache, the reference
decoder, the drafter contract, predict, verify, accept and the one loop, bpd_decode (Stern §3-4).
Checks, sampling, tree verification, fast twins and other models live in the folders, on this.

Exact: bpd_decode returns greedy_decode's tokens, in float64 bit for bit in practice. The
verification call and greedy's one-token calls sum in different orders: ~1e-16 flips no argmax,
but in float32 (~1e-7) or bf16 (~1e-2) a near-tie can flip one. That is rounding, not a bug; the
tests run in float64 (models/llama.py is made batch-invariant instead).
"""
import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass
class GPTConfig:                # the defaults are the shipped checkpoints/minibpd.pt's
    vocab_size: int = 103       # characters of the corpus
    block_size: int = 128       # context window: the most tokens the model sees at once
    n_layer: int = 6
    n_head: int = 4
    n_embd: int = 128
    n_bpd_heads: int = 8        # h, counting head 1 (the base model's own next-token head)
    dropout: float = 0.0

    def __post_init__(self):    # a clear error, not a shape error deep in a forward pass
        if min(self.vocab_size, self.block_size, self.n_layer, self.n_bpd_heads) < 1 or \
                self.n_head < 1 or self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig needs sizes >= 1 and n_embd divisible by n_head: {self}")


# ----------------------------------------------------------------------------- the model

class SelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, self.n_head, self.dropout = cfg.n_embd, cfg.n_head, cfg.dropout
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)

    def forward(self, x, cache=None, layer=0, mask=None):
        """x [P, L, C]. With a cache the new keys and values go in and every valid slot is seen."""
        P, L, C = x.shape
        q, k, v = self.qkv(x).view(P, L, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        if cache is None:                        # q, k, v: [P, n_head, L, head_dim]
            drop = self.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop)
        else:
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
    """Proposal head i >= 2 (Stern §6, Fig. 3): one hidden layer with a residual on the final
    hidden state, z + W2 gelu(W1 z); GPT.head_logits reapplies the output projection. Ours: h - 1
    separate heads of width n_embd, head 1 the identity (Stern's footnote 1), closer to Kim §4's
    h distinct layers than to Stern §6's one layer of hidden size k x d_hidden for all k."""
    def __init__(self, n_embd):
        super().__init__()
        self.fc, self.proj = nn.Linear(n_embd, n_embd), nn.Linear(n_embd, n_embd)

    def forward(self, z):
        return z + self.proj(F.gelu(self.fc(z)))


class GPT(nn.Module):
    """nanoGPT-style decoder. Head 1 is the base LM itself; heads 2..h are BPDHeads. All heads
    share one output projection (Stern §6), tied to the token embedding (Kim §4)."""
    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb, self.drop = nn.Embedding(cfg.block_size, cfg.n_embd), nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        # Built in a loop: `[BPDHead(...)] * n` would share one module n times.
        self.heads = nn.ModuleList([BPDHead(cfg.n_embd) for _ in range(cfg.n_bpd_heads - 1)])
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight                      # weight tying (Kim §4)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx, cache=None, tree=None):
        """idx [P, L] -> final hidden states z [P, L, C]. With a cache the tokens sit at slots
        cache.length.. and see all before; tree = (positions, mask) of a token tree (runtime/)."""
        P, L = idx.shape
        start = 0 if cache is None else cache.length
        pos, mask = tree or (torch.arange(start, start + L, device=idx.device), None)
        if tree is None and cache is not None and L > 1:          # query i sees slots <= start + i
            mask = torch.ones(L, start + L, dtype=torch.bool, device=idx.device).tril(start)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for i, block in enumerate(self.blocks):
            x = block(x, cache, i, mask)
        return self.ln_f(x)

    def head_logits(self, z, last=None):
        """z [..., C] -> the logits of all h heads [..., h, V] (Stern §6): head 1 projects z,
        head i projects BPDHead_i(z), i - 1 tokens further ahead. `last`, the token chosen at z,
        is for heads that read it (models/llama.py). runtime/fast_heads.py: two matmuls."""
        return self.lm_head(torch.stack([z] + [head(z) for head in self.heads], dim=-2))

    def kv_spec(self):      # a KVCache's shape: layers, heads, head dim, dtype, device
        cfg, w = self.config, self.tok_emb.weight
        return cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, w.dtype, w.device


# ----------------------------------------------------------------------------- the KV cache

def window_start(t, block_size):
    """The first position seen when predicting position t (ours: the papers stop at the window):
    0 while t fits, then half a window at a time. Every decoder predicts t from exactly
    seq[window_start(t):t], so outputs past the window agree."""
    shift, over = max(1, block_size // 2), t - block_size
    return 0 if over <= 0 else -(-over // shift) * shift     # over, rounded up to a shift


class KVCache:
    """Keys and values per layer, preallocated, [rows, heads, block_size + spare, head_dim], and
    two integers: `start` (slot 0's position), `length` (slots in use). A call writes after
    `length`; the caller keeps what it accepts (advance): a rejected draft is dropped by not
    advancing past it, so no position is ever off by one. Rows: p drafts (Kim §7.2's p-best)."""
    def __init__(self, model, rows=1, spare=0):
        layers, heads, head_dim, dtype, device = model.kv_spec()
        self.block_size, self.rows, self.start, self.length = model.config.block_size, rows, 0, 0
        shape = (rows, heads, self.block_size + spare, head_dim)
        self.kv = [[torch.zeros(shape, dtype=dtype, device=device) for _ in "kv"]
                   for _ in range(layers)]

    def write(self, layer, k, v):
        """k, v [P, heads, L, d] into slots length.. of rows :P (one row: of every row, a shared
        prefix) -> all valid slots' keys, values [P, heads, length + L, d]."""
        P, end = k.shape[0], self.length + k.shape[2]
        rows = slice(None) if P == 1 else slice(0, P)
        kc, vc = self.kv[layer]
        kc[rows, :, self.length:end], vc[rows, :, self.length:end] = k, v
        return kc[:P, :, :end], vc[:P, :, :end]

    def advance(self, n, row=0):
        """Keep n of the slots just written: row `row`'s in every row (None: each its own)."""
        new = slice(self.length, self.length + n)
        if row is not None and self.rows > 1:
            for t in (t for kv in self.kv for t in kv):
                t[:, :, new] = t[row:row + 1, :, new]
        self.length += n

    def tail(self, seq):
        """The tokens of seq the cache lacks (the last at least), in a new window if need be."""
        start = window_start(len(seq), self.block_size)
        if start != self.start:                  # a new window: nothing cached holds
            self.start, self.length = start, 0
        return list(seq[self.start + self.length:])


# -------------------------------------------------------------------------- the reference decoder

def next_token(model, z, temperature=0.0, generator=None):
    """The token after final state z [C]: the argmax, or at T > 0 a softmax(logits / T) draw."""
    logits = model.lm_head(z)
    if temperature == 0:
        return int(logits.argmax())
    probs = F.softmax(logits.double() / float(temperature), dim=-1).cpu()
    return int(torch.multinomial(probs, 1, generator=generator))


@torch.no_grad()
def sample_decode(model, prompt, max_new_tokens, temperature=1.0, generator=None):
    """The reference decoder: one call per token with the KV cache (next_token). -> new tokens."""
    from runtime.request import check_request    # bad input: one clear error before any call
    seq, generator = check_request(model, prompt, max_new_tokens, temperature, generator)
    cache, device = KVCache(model), model.lm_head.weight.device
    for _ in range(max_new_tokens):
        tail = cache.tail(seq)                   # the prompt first, then one token a call
        z = model(torch.tensor([tail], device=device), cache)[0, -1]            # [C]
        cache.advance(len(tail))
        seq.append(next_token(model, z, temperature, generator))
    return seq[-max_new_tokens:]


def greedy_decode(model, prompt, max_new_tokens):    # what every BPD path must equal
    return sample_decode(model, prompt, max_new_tokens, temperature=0.0)


# ----------------------------------------------------------------------------- the drafter contract

class ArgmaxDrafter:
    """Plain BPD's drafter (Stern §3, predict): each head's most likely token.

    The drafter contract (runtime/contract.py checks it at every step, naming what broke):
      drafter(logprobs, context) -> drafts
        logprobs  [r, V]: the log-probs of heads 1..r at the last accepted position
        context   the tokens so far, prompt included; context[-1] was just chosen
        drafts    a list of 1 to max_drafts drafts, each a list of r token ids in [0, V) whose
                  first is context[-1] (head 1's token is certain: the base model chose it)
      max_drafts  attribute: the most drafts a call returns (default 1); all are verified in
                  one call and the one accepted furthest is kept (Kim §7.2's p-best)
      max_draft_tokens  attribute (ours): the most tokens a draft holds after context[-1]
                  (default h - 1); declared, drafts may hold r to max_draft_tokens + 1 tokens,
                  of lengths that differ (a copy from the context: decoders/lookup.py)
    Both arguments are the drafter's own copies. One drafter object serves one sequence at a
    time (it may keep state: a small LM's cache). A sampling drafter: runtime/sampling.py."""
    name, max_drafts = "bpd", 1

    def __call__(self, logprobs, context):
        # Under greedy decoding head 1's argmax is context[-1]; when sampling it need not be.
        return [[context[-1]] + logprobs[1:].argmax(-1).tolist()]


# ---------------------------------------------------------------- BPD: predict, verify, accept

def draft_budget(t, end, most, block_size):
    """Tokens to draft with t known: at most `most` (h - 1), none past `end` or the window."""
    return max(0, min(most, end - t, window_start(t, block_size) + block_size - t))


def predict(model, drafter, z, seq, m):
    """Stern §3, predict: the heads at the last accepted position (z [C]) give log-probs; head 1's
    token (seq[-1]) is chosen, so the drafter makes drafts of up to m + 1 tokens, seq[-1] first."""
    if m == 0:                                   # the window's edge: a plain one-token step
        return [[seq[-1]]]
    logprobs = F.log_softmax(model.head_logits(z, seq[-1])[:m + 1], dim=-1)   # [r, V]
    drafts = drafter(logprobs, list(seq))
    for d in drafts:
        del d[m + 1:]                  # a draft past the heads (max_draft_tokens) stops at m
    return drafts


class Verifier:
    """Stern §3, verify: ONE model call runs the base model on every draft, P drafts as P rows
    (runtime/tree.py: one token tree); `keep` moves the cache past the accepted tokens. It
    counts the tokens run (processed) and the drafted ones among them (verified)."""
    def __init__(self, model, n_drafts=1):
        self.model, self.cache = model, KVCache(model, rows=n_drafts)
        self.tail, self.processed, self.verified = 0, 0, 0

    def __call__(self, seq, drafts):
        """-> z [P, m + 1, C]: z[j, i] is the base model after seq + drafts[j][1:i + 1]."""
        tail, m = self.cache.tail(seq), max(map(len, drafts)) - 1
        rows = [tail + d[1:] + d[-1:] * (m + 1 - len(d)) for d in drafts]   # short ones padded
        z = self.model(torch.tensor(rows, device=self.model.lm_head.weight.device), self.cache)
        self.tail, self.processed = len(tail), self.processed + len(rows) * len(rows[0])
        self.verified += len(rows) * m
        return z[:, len(tail) - 1:]

    def keep(self, row, kept):    # the cache keeps the tail and row's first kept drafted tokens
        self.cache.advance(self.tail + kept, row)


def matched(drafted, choices):
    """How many drafted tokens equal the base model's choices, from the first on."""
    return next((i for i, (d, c) in enumerate(zip(drafted, choices)) if d != c),
                min(len(drafted), len(choices)))


def accept_longest(drafts, choices):
    """Stern §3, accept, for P drafts: the first whose drafted tokens agree longest with the base
    model's choices (choices[j]: its token after each prefix of draft j). -> (row, kept)."""
    kept = [matched(d[1:], c) for d, c in zip(drafts, choices)]
    row = kept.index(max(kept))
    return row, kept[row]


class GreedyRule:
    """Stern §3, accept at temperature 0: the verification call gives greedy's choice after every
    prefix of every draft; the draft agreeing longest wins and greedy's token after its kept ones
    comes free. So every call gains at least one token, and every token gained is greedy's."""
    def __init__(self, model):       # a model may project these rows with others: llama.py
        self.logits = getattr(model, "verified_logits", model.lm_head)

    def choices(self, z, drafts):    # z [P, m + 1, C] -> greedy's tokens [P][m + 1]
        return self.logits(z).argmax(-1).tolist()

    def __call__(self, z, drafts):
        """-> (row, kept, token, what it saw); choices[row] has m + 1 > kept entries."""
        choices = self.choices(z, drafts)
        row, kept = accept_longest(drafts, choices)
        return row, kept, choices[row][kept], {"choices": choices}


@torch.no_grad()
def bpd_decode(model, prompt, max_new_tokens, drafter=None, temperature=0.0, generator=None,
               verify="auto", accept="exact"):
    """Blockwise parallel decoding: Stern §3's predict, verify, accept, merged (Stern §4) so that
    each step is ONE call: the call verifying a block runs the heads at every position, and those
    at the last accepted one draft the next. -> (new tokens, stats: calls, accepted per call,
    steps with drafts, processed, verified, block_efficiency = new tokens / calls). The defaults
    are the paper (ArgmaxDrafter, Verifier, GreedyRule); runtime/loop.py checks every request and
    answer, and resolves the rest into objects of those shapes: temperature > 0 (speculative
    sampling: exactly sample_decode's distribution, drawn from `generator`), verify ("batch",
    "tree", "auto": a tree for several drafts), accept ("exact"; Stern §5's APPROXIMATE "top2")."""
    from runtime.loop import prepare    # checks, sampling, tree verification, Stern §5's rules
    seq, drafter, verifier, rule, generator = prepare(
        model, prompt, max_new_tokens, drafter or ArgmaxDrafter(), temperature, generator,
        verify, accept)
    end, most = len(seq) + max_new_tokens, drafter.max_draft_tokens
    z = verifier(seq, [seq[-1:]])[0, 0]                      # the prompt: one call
    verifier.keep(0, 0)
    seq.append(next_token(model, z, temperature, generator))
    stats = {"calls": 1, "accepted": [1], "steps": []}
    while len(seq) < end:
        m = draft_budget(len(seq), end, most, model.config.block_size)
        drafts = predict(model, drafter, z, seq, m)                        # predict
        zs = verifier(seq, drafts)                                         # verify
        row, kept, token, seen = rule(zs, drafts)                          # accept
        verifier.keep(row, kept)
        new = drafts[row][1:kept + 1] + [token]
        stats["calls"] += 1
        stats["accepted"].append(len(new))
        if m > 0:
            stats["steps"].append({"context": len(seq), "drafts": drafts, "winner": row,
                                   "kept": kept, "accepted": len(new), **seen})
        seq += new
        z = zs[row, kept]                   # Stern §4: the heads here draft the next block
    # The last call may add one token past `end` (the base model's, after a whole draft).
    return seq[end - max_new_tokens:end], {
        **stats, "processed": verifier.processed, "verified": verifier.verified,
        "block_efficiency": max_new_tokens / stats["calls"], "new_tokens": max_new_tokens}


def load_checkpoint(path=None, device="cpu", dtype=None):
    """-> (model, checkpoint dict) of a train_heads.py file (default: checkpoints/minibpd.pt): a
    GPT(GPTConfig(**ck["config"])) with ck["model"], read with torch.load(weights_only=True)."""
    from runtime.checkpoint import load    # validation, fast heads, other model families
    return load(path, device, dtype)


if __name__ == "__main__":    # the command line (the demo, the bench, ...) lives in lab/cli.py
    from lab.cli import main
    raise SystemExit(main())
