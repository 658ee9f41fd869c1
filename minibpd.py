"""minibpd: blockwise parallel decoding (BPD) on a tiny character GPT, exactly.

Stern, Shazeer, Uszkoreit, "Blockwise Parallel Decoding for Deep Autoregressive Models", NeurIPS
2018 (arXiv 1811.03115): h heads guess the next h tokens (predict), the base model checks them in
one call (verify), the longest prefix equal to its greedy choices is kept (accept). "Kim §N": Kim
et al., arXiv 2404.09221v2. Top to bottom: the model, the KV cache, the reference decoder, the
drafter contract, the one loop bpd_decode, checkpoints. The lab (the folders) builds on this file.

Exact: bpd_decode returns greedy_decode's tokens. The verification call and greedy's one-token
calls sum in different orders: in float64 (~1e-16) that flips no argmax, but in float32 (~1e-7)
or bf16 (~1e-2) a near-tie can flip one: rounding, not a bug. So the tests run in float64.
"""
import dataclasses
import math
import numbers
import os

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
        sizes = (self.vocab_size, self.block_size, self.n_layer, self.n_head, self.n_embd,
                 self.n_bpd_heads)
        if not all(map(is_int, sizes)) or min(sizes) < 1 or self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig needs integer sizes >= 1, n_embd divisible by n_head: {self}")


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
    """Proposal head i >= 2 (Stern §6, Fig. 3): z + W2 gelu(W1 z) on the final hidden state; the
    output projection follows. Ours: h - 1 separate heads of width n_embd, head 1 the identity
    (Stern's footnote 1), nearer Kim §4's h layers than Stern §6's one layer of k x d_hidden."""
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
        """z [..., C] -> all h heads' logits [..., h, V] (Stern §6): head i, i - 1 tokens further
        ahead. `last` (the token chosen at z) is for heads that read it (models/llama.py)."""
        return self.lm_head(torch.stack([z] + [head(z) for head in self.heads], dim=-2))

    def kv_spec(self):      # a KVCache's shape: layers, heads, head dim, dtype, device
        cfg, w = self.config, self.tok_emb.weight
        return cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, w.dtype, w.device


# ----------------------------------------------------------------------------- the KV cache

def window_start(t, block_size):
    """The first position seen when predicting position t (ours: neither paper discusses decoding
    past the model's window): 0 while t fits, then half a window at a time. Every decoder
    predicts t from exactly seq[window_start(t):t], so outputs past the window agree."""
    shift, over = max(1, block_size // 2), t - block_size
    return 0 if over <= 0 else -(-over // shift) * shift     # over, rounded up to a shift


class KVCache:
    """Keys and values per layer, preallocated, [rows, heads, block_size + spare, head_dim]; `start`
    is slot 0's position, `length` the slots in use. A call writes after `length` and the caller
    keeps what it accepts (advance): a rejected draft is dropped by not advancing past it."""
    def __init__(self, model, rows=1, spare=0):
        layers, heads, head_dim, dtype, device = model.kv_spec()
        self.block_size, self.rows, self.start, self.length = model.config.block_size, rows, 0, 0
        shape = (rows, heads, self.block_size + spare, head_dim)
        if 2 * layers * math.prod(shape) * dtype.itemsize > 2 ** 30:    # before allocating it
            raise ValueError(f"a KV cache of {rows} row(s) of this model would pass 1 GiB")
        self.kv = [[torch.zeros(shape, dtype=dtype, device=device) for _ in "kv"]
                   for _ in range(layers)]

    def write(self, layer, k, v):
        """k, v [P, heads, L, d] into slots length.. of rows :P (one row: every row's, a shared
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

def check_request(model, prompt, max_new_tokens, temperature=0.0, generator=None):
    """Bad input -> one clear ValueError before any model call. -> the prompt as a new list."""
    prompt = prompt.tolist() if hasattr(prompt, "tolist") else prompt      # a tensor, an array
    seq = list(prompt) if isinstance(prompt, (list, tuple, range)) else []
    if not seq or not all(map(is_int, seq)) or not 0 <= min(seq) <= max(seq) < model.config.vocab_size:
        raise ValueError(f"the prompt must be a non-empty list of integer token ids in [0, "
                         f"{model.config.vocab_size}) (encode text first)")
    if not is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    check_temperature(temperature, generator)
    return [int(t) for t in seq]


def check_temperature(temperature, generator=None):
    """0 (greedy) or a real number in [1e-6, 1e308) (below, logits / T overflow), of any type but
    bool; at T > 0 the generator is None or a torch.Generator."""
    T = temperature.item() if hasattr(temperature, "item") else temperature  # numpy: no casts
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or \
            not (T == 0 or 1e-6 <= T < 1e308):                            # True is no temperature
        raise ValueError(f"temperature must be 0 (greedy) or in [1e-6, 1e308): got {temperature!r}")
    if temperature > 0 and not isinstance(generator, (torch.Generator, type(None))):
        raise ValueError("generator must be None or a torch.Generator().manual_seed(seed)")


def is_int(t):                # an integer, not a bool (True is no token id, no count)
    return isinstance(t, numbers.Integral) and not isinstance(t, bool)


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
    seq = check_request(model, prompt, max_new_tokens, temperature, generator)
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
    """Plain BPD's drafter (Stern §3, predict): each head's most likely token. The drafter
    contract (check_drafts states it as code): drafter(logprobs [r, V] of heads 1..r at the last
    accepted position, the tokens so far) -> 1 to `max_drafts` drafts of r token ids, each
    starting with context[-1]; ours: up to `max_draft_tokens` past it, if declared (a copy from
    the context, decoders/lookup.py). It gets its own copies and serves one sequence at a time."""
    name, max_drafts = "bpd", 1

    def __call__(self, logprobs, context):
        # Under greedy decoding head 1's argmax is context[-1]; when sampling it need not be.
        return [[context[-1]] + logprobs[1:].argmax(-1).tolist()]


def declared(drafter, h):
    """A drafter's name and declared numbers, checked: (name, max_drafts, max_draft_tokens)."""
    out = [getattr(drafter, "name", None) or type(drafter).__name__]
    if not callable(drafter):
        raise ValueError(f"drafter {out[0]} is not callable: drafter(logprobs, context) -> drafts")
    for attr, default, least in (("max_drafts", 1, 1), ("max_draft_tokens", h - 1, 0)):
        n = getattr(drafter, attr, default)
        if not is_int(n) or n < least:
            raise ValueError(f"drafter {out[0]}: {attr} must be an integer >= {least}, got {n!r}")
        out.append(int(n))
    return out


def check_drafts(drafts, drafter, rows, first, V, most=None):
    """The drafter contract as code: whatever a drafter hands back is checked before it is used,
    so a broken one stops the decode with one ValueError naming the rule, never a wrong token.
    `most`: the max_drafts it declared first (the cache's rows). -> the drafts, new int lists."""
    name, now, reach = declared(drafter, rows)
    most = now if most is None else most
    longest = max(rows, reach + 1)              # undeclared, reach is rows - 1: exactly rows

    def broken(rule, detail):
        return ValueError(f"drafter {name} broke the drafter contract ({rule}): {detail}")
    if not isinstance(drafts, (list, tuple)) or not all(
            isinstance(d, (list, tuple)) and all(map(is_int, d)) for d in drafts):
        raise broken("lists of ints", "return a list of drafts, each a list of ints (.tolist())")
    if not 1 <= len(drafts) <= most:
        raise broken("1..max_drafts drafts", f"return 1 to {most} (declared first), got {len(drafts)}")
    for j, d in enumerate(drafts):
        if not rows <= len(d) <= longest:
            raise broken("length", f"draft {j} has {len(d)} tokens, not {rows} to {longest}")
        if d[0] != first:
            raise broken("first token", f"draft {j} starts with {d[0]}, not context[-1] = {first}")
        if not 0 <= min(d) <= max(d) < V:
            raise broken("ids in [0, V)", f"draft {j} holds a token outside [0, {V})")
    return [[int(t) for t in d] for d in drafts]


# ---------------------------------------------------------------- BPD: predict, verify, accept

def draft_budget(t, end, most, block_size):
    """Tokens to draft with t known: at most `most` (h - 1), none past `end` or the window."""
    return max(0, min(most, end - t, window_start(t, block_size) + block_size - t))


def predict(model, drafter, z, seq, m, most=1):
    """Stern §3, predict: the heads' log-probs at the last accepted position (z [C]) -> 1 to
    `most` drafts of up to m + 1 tokens, each starting with seq[-1] (head 1's, already chosen)."""
    if m == 0:                                   # the window's edge: a plain one-token step
        return [[seq[-1]]]
    logprobs = F.log_softmax(model.head_logits(z, seq[-1])[:m + 1], dim=-1)   # [r, V]
    drafts = check_drafts(drafter(logprobs, list(seq)), drafter, len(logprobs), seq[-1],
                          model.config.vocab_size, most)
    return [d[:m + 1] for d in drafts]     # a draft past the heads (max_draft_tokens) stops at m


class Verifier:
    """Stern §3, verify: ONE call runs the base model on P drafts as P rows (Kim §7.2's p-best);
    `keep` moves the cache past the accepted tokens. Counts: tokens run, drafted ones among them."""
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
    """Accept among P drafts (Kim §7.2; Stern §3 has one): the first accepted furthest, our reading
    of Kim's "verified in parallel". choices[j]: greedy's tokens along draft j. -> (row, kept)"""
    kept = [matched(d[1:], c) for d, c in zip(drafts, choices)]
    row = kept.index(max(kept))
    return row, kept[row]


class GreedyRule:
    """Stern §3, accept at temperature 0: the draft agreeing longest with greedy's choices wins,
    and greedy's token after its kept ones comes free: every call gains >= 1 token, all greedy's."""
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
               verify="batch", accept="exact"):
    """Blockwise parallel decoding: Stern §3's predict, verify, accept, merged (Stern §4) so that
    each step is ONE call, whose heads at the last accepted position draft the next block.
    -> (new tokens, stats: calls, accepted, steps, processed, verified, block_efficiency = new
    tokens / calls). verify/accept: the lab's objects of the Verifier's and GreedyRule's shapes."""
    seq = check_request(model, prompt, max_new_tokens, temperature, generator)
    if not callable(verify) and verify not in ("batch", "auto") or \
            not callable(accept) and (accept != "exact" or temperature > 0):   # trees, sampling
        raise ValueError(f"verify={verify!r}, accept={accept!r} at T={temperature}: here 'batch', "
                         "'exact' at T=0 or objects like Verifier, GreedyRule; the lab's options "
                         "(in neither paper) run in runtime.loop.lab_decode, with the same arguments")
    drafter = ArgmaxDrafter() if drafter is None else drafter
    _, most, reach = declared(drafter, model.config.n_bpd_heads)
    verifier = Verifier(model, most) if isinstance(verify, str) else verify   # or the lab's objects
    rule = GreedyRule(model) if isinstance(accept, str) else accept
    end = len(seq) + max_new_tokens
    z = verifier(seq, [seq[-1:]])[0, 0]                      # the prompt: one call
    verifier.keep(0, 0)
    seq.append(next_token(model, z, temperature, generator))
    stats = {"calls": 1, "accepted": [1], "steps": []}
    while len(seq) < end:
        m = draft_budget(len(seq), end, reach, model.config.block_size)
        drafts = predict(model, drafter, z, seq, m, most)                  # predict
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


# ----------------------------------------------------------------------------- checkpoints

CHECKPOINT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "checkpoints", "minibpd.pt")


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt, or does not match this code."""


def read_checkpoint(path=CHECKPOINT):
    """train_heads.py's dict at `path` (default: the shipped one); weights_only: it runs no code."""
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:      # missing, truncated, not a torch file, an unsafe pickle, ...
        why, out = ("not found", path) if isinstance(e, FileNotFoundError) else (   # broken: a new file
            f"unreadable as a torch file of tensors ({type(e).__name__}; weights_only=True)", "my-model.pt")
        raise CheckpointError(f"checkpoint {path} {why}; `python train_heads.py --out {out}` "
                              "trains one") from None
    if not isinstance(ck, dict) or ck.get("format_version") != 1 or "config" not in ck:
        raise CheckpointError(f"checkpoint {path} is not a minibpd checkpoint of format 1")
    return {**ck, "path": path}


def build_gpt(config, state, where, dtype=torch.float32, device="cpu"):
    """A GPT of a saved config and state dict, shapes compared on the meta device first (nothing
    allocated for a config that asks too much); a mismatch is one CheckpointError."""
    state = state if isinstance(state, dict) else {}            # not a dict: no weights at all
    try:
        cfg = GPTConfig(**config)
        if cfg.n_layer + cfg.n_bpd_heads > len(state):     # a module per weight at least: no huge build
            raise ValueError(f"{cfg.n_layer} layers and {cfg.n_bpd_heads} heads, {len(state)} tensors")
        with torch.device("meta"):
            want = {k: v.shape for k, v in GPT(cfg).state_dict().items()}
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: its config does not fit this minibpd.py ({e})") from None
    got = {k: v.shape for k, v in state.items() if torch.is_tensor(v) and v.is_floating_point()
           and v.layout == torch.strided and not v.is_meta}        # no sparse, meta or complex one
    bad = sorted(set(want) ^ set(state), key=str) or [k for k in want if got.get(k) != want[k]] or \
        [k for k in want if not torch.isfinite(state[k].float()).all()]
    if bad:
        raise CheckpointError(f"{where}: tensor {bad[0]} is missing, extra, not a dense float "
                              "tensor of its shape or not finite")
    model = GPT(cfg)
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return place(model, device, dtype)


def place(model, device, dtype):    # for inference; a dtype with no argmax, a device torch lacks
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating torch.dtype (torch.float64, ...), got {dtype!r}")
    try:
        return model.to(device=device, dtype=dtype).eval()
    except (RuntimeError, AssertionError) as e:              # a typo; CUDA in a CPU build
        raise ValueError(f"device {device!r}: {e}") from None


def load_checkpoint(path=CHECKPOINT, device="cpu", dtype=None):
    """-> (GPT, checkpoint dict) of a train_heads.py file (or of read_checkpoint's dict), ck["vocab"]
    its characters. Other model families (ck["kind"]) are the lab's: runtime.checkpoint.load."""
    ck = path if isinstance(path, dict) else read_checkpoint(path)
    where = f"checkpoint {ck.get('path', '(a dict)')}"
    if ck.get("kind") is not None:
        raise CheckpointError(f"{where} holds a {ck['kind']!r} model: runtime.checkpoint.load builds it")
    model = build_gpt(ck.get("config"), ck.get("model"), where, dtype or torch.float32, device)
    vocab = ck.get("vocab")
    if not isinstance(vocab, str) or not len(set(vocab)) == len(vocab) == model.config.vocab_size:
        raise CheckpointError(f"{where}: its vocab is not {model.config.vocab_size} distinct characters")
    return model, ck


if __name__ == "__main__":    # `--demo` is the papers' (lattice.demo); other commands are the lab's
    import sys

    import lattice            # built on this file: only the command line imports it here
    code = lattice.demo(sys.argv[1:])      # None: the lab's, which lattice.demo found installed
    if code is None:
        from lab.cli import main           # the lab's command line: lab/cli.py
    raise SystemExit(main() if code is None else code)
