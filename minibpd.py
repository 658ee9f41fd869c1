"""minibpd: exact blockwise parallel decoding (BPD) in one readable file.

A tiny character-level GPT with h prediction heads (Stern et al. 2018, "Blockwise Parallel
Decoding for Deep Autoregressive Models"), a preallocated KV cache, greedy decoding (the
reference), and BPD with Stern's merged predict+verify step: one model call per step, whose
verification pass also yields the next draft. Drafters (Kim et al. 2024, §7) plug into the one
decode loop; `lattice.py` holds the refined ones, `bench.py` the command line (demo, benchmark).

Exactness: BPD returns exactly the tokens of `greedy_decode`. In float64 this holds bit for bit
in practice: the batched verification pass and the one-token pass sum in different orders, and
the rounding differences (~1e-16) cannot flip an argmax unless two logits tie that closely. In
float32 (~1e-7) or bf16 (~1e-2) such near-ties do happen now and then, so an argmax can flip and
the two decoders can diverge: this is rounding, not a bug, and it is why the tests run in float64.
"""
import functools
import os
import sys
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

# The shipped checkpoint, found next to this file whatever the working directory.
CHECKPOINT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "checkpoints", "minibpd.pt")
FORMAT_VERSION = 1


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


# ----------------------------------------------------------------------------- the model

class SelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x, kv=None, length=0, mask=None):
        """x: [P, L, C]. Training: kv is None, plain causal attention. Decoding: kv = (k, v) cache
        tensors [R, n_head, block_size, head_dim]; the L new keys/values are written by position
        at slots length..length+L-1 and attention reads slots 0..length+L-1."""
        P, L, C = x.shape
        q, k, v = self.qkv(x).view(P, L, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        if kv is None:  # q, k, v: [P, n_head, L, head_dim]
            drop = self.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop)
        else:
            kc, vc = kv
            # P == 1 (prefill, greedy step): broadcast into every cache row, so that a later
            # batched verification of several drafts finds the same prefix in each row.
            rows = slice(None) if P == 1 else slice(0, P)
            kc[rows, :, length:length + L] = k
            vc[rows, :, length:length + L] = v
            y = F.scaled_dot_product_attention(q, kc[:P, :, :length + L], vc[:P, :, :length + L],
                                               attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(P, L, C))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        self.attn = SelfAttention(cfg)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd), nn.Dropout(cfg.dropout))

    def forward(self, x, kv=None, length=0, mask=None):
        x = x + self.attn(self.ln1(x), kv, length, mask)
        return x + self.mlp(self.ln2(x))


class BPDHead(nn.Module):
    """Proposal head i >= 2 (Stern §3): one hidden layer and a residual on the final hidden state."""

    def __init__(self, cfg):
        super().__init__()
        self.fc, self.proj = nn.Linear(cfg.n_embd, cfg.n_embd), nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, z):
        return z + self.proj(F.gelu(self.fc(z)))


class GPT(nn.Module):
    """nanoGPT-style decoder. Head 1 is the base LM itself; heads 2..h are BPDHeads. All heads share
    one output projection, tied to the token embedding (Stern §3, Kim §4)."""

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

    def forward(self, idx, cache=None):
        """idx: [P, L] token ids -> final hidden states z: [P, L, C]. With a cache the L tokens sit
        at window slots cache.length.. (the cache is written, not advanced; see KVCache.advance)."""
        P, L = idx.shape
        start = 0 if cache is None else cache.length
        pos = torch.arange(start, start + L, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        mask = causal_mask(L, start, idx.device) if cache is not None and L > 1 else None
        for i, block in enumerate(self.blocks):
            x = block(x, None if cache is None else cache.kv[i], start, mask)
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
        on token t + i. Joint loss (Kim §4): weighted mean of the per-head losses, head 1 weighted
        1 and heads 2..h `head_weight` each (1.0: the plain mean)."""
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


class KVCache:
    """Preallocated keys/values [R, n_head, block_size, head_dim] per layer, one integer `length`
    (valid slots) and the absolute position `start` of slot 0. Rejected draft tokens are dropped
    by not advancing `length` past them; R rows let p drafts be verified in one batched call."""

    def __init__(self, model, rows=1):
        cfg, w = model.config, model.tok_emb.weight
        self.shape = (cfg.n_head, cfg.block_size, cfg.n_embd // cfg.n_head)
        self.kv = [[torch.zeros(rows, *self.shape, dtype=w.dtype, device=w.device)
                    for _ in range(2)] for _ in range(cfg.n_layer)]
        self.rows, self.start, self.length = rows, 0, 0

    def ensure_rows(self, rows):
        if rows > self.rows:  # grow, copying the shared prefix of row 0 into the new rows
            self.kv = [[torch.cat([t, t[:1].expand(rows - self.rows, *self.shape)]) for t in pair]
                       for pair in self.kv]
            self.rows = rows

    def reset(self, start):
        self.start, self.length = start, 0

    def advance(self, row, n):
        """Keep the first n slots just written by `row` and copy them to the other rows; row None:
        the call had one row, which was already written to every row."""
        if self.rows > 1 and row is not None:
            for pair in self.kv:
                for t in pair:
                    t[:, :, self.length:self.length + n] = t[row:row + 1, :, self.length:self.length + n]
        self.length += n


def model_call(model, cache, seq, extra):
    """One serial model call. Feeds the uncached tail of `seq` plus P candidate continuations
    `extra` (P lists of m tokens) and returns (z [P, m + 1, C], tail length); z[:, i] predicts
    token len(seq) + i. If the window must move for position len(seq), the cache is rebuilt
    within this same call."""
    n, B = len(seq), model.config.block_size
    start = window_start(n, B)
    if start != cache.start:
        cache.reset(start)
    tail = seq[cache.start + cache.length:n]
    idx = torch.tensor([tail + e for e in extra], dtype=torch.long, device=model.lm_head.weight.device)
    z = model(idx, cache)
    return z[:, len(tail) - 1:], len(tail)


def check_request(model, prompt, max_new_tokens):
    if len(prompt) == 0:
        raise ValueError("the prompt is empty: give at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    V = model.config.vocab_size
    if min(prompt) < 0 or max(prompt) >= V:
        raise ValueError(f"prompt token ids must lie in [0, {V})")


# ----------------------------------------------------------------------------- decoding

@torch.no_grad()
def greedy_decode(model, prompt, max_new_tokens):
    """Greedy decoding with the KV cache: the reference and the speed baseline. -> new tokens."""
    check_request(model, prompt, max_new_tokens)
    cache, seq = KVCache(model), list(prompt)
    for _ in range(max_new_tokens):
        z, fed = model_call(model, cache, seq, [[]])
        cache.advance(0, fed)
        seq.append(int(model.lm_head(z[0, -1]).argmax()))
    return seq[len(prompt):]


class ArgmaxDrafter:
    """Plain BPD drafter (Stern §3, predict): each head's most likely token.

    The drafter interface: `drafter(logprobs, context) -> list of drafts`, where logprobs [m, V]
    are the log-probs of heads 1..m at the last accepted position and context is the sequence so
    far; each draft is a list of m tokens, the first being the greedy token context[-1] (head 1
    is the base model, so its argmax is certain). The loop verifies every draft in one batched
    call and keeps the longest accepted; drafters may keep state (e.g. a small LM's cache)."""
    name = "bpd"
    max_drafts = 1

    def __call__(self, logprobs, context):
        return [logprobs.argmax(-1).tolist()]


def matched(proposed, truth):
    """Length of the longest prefix of `proposed` that equals `truth` (Stern §3, accept)."""
    return next((i for i, (a, b) in enumerate(zip(proposed, truth)) if a != b),
                min(len(proposed), len(truth)))


def verify(model, z, extra):
    """Stern §3, verify + accept. z [P, m + 1, C] from model_call; extra: P lists of the drafts'
    m tokens after the certain one. -> (winning row, accepted tokens a of extra[row], the greedy
    tokens of that row [m + 1]: g[i] is the base model's choice after extra[row][:i])."""
    g = model.lm_head(z).argmax(-1).tolist()                         # P lists of m + 1
    ok = [matched(ex, gr) for ex, gr in zip(extra, g)]               # longest matching prefixes
    row = ok.index(max(ok))                                          # the first of the best
    return row, ok[row], g[row]


@torch.no_grad()
def bpd_decode(model, prompt, max_new_tokens, drafter=None):
    """Blockwise parallel decoding with merged predict+verify (Stern §4): each call verifies the
    drafts and, through the heads at the last accepted position, yields the next draft.
    -> (new tokens, stats). stats: calls (serial model calls, prefill included), accepted (tokens
    gained per call), block_efficiency (new tokens / calls), steps (drafts, winner, accepted),
    processed (tokens the base model ran on: p-best verifies p rows per call)."""
    check_request(model, prompt, max_new_tokens)
    drafter = drafter or ArgmaxDrafter()
    h, B = model.config.n_bpd_heads, model.config.block_size
    cache = KVCache(model, rows=getattr(drafter, "max_drafts", 1))
    seq, n0 = list(prompt), len(prompt)
    extra = [[]]                                  # the prefill call verifies nothing
    stats, drafts = {"calls": 0, "accepted": [], "steps": [], "processed": 0}, None
    while True:
        z, fed = model_call(model, cache, seq, extra)
        row, a, g = verify(model, z, extra)
        cache.advance(row if len(extra) > 1 else None, fed + a)
        new = extra[row][:a] + [g[a]]
        if drafts is not None:
            stats["steps"].append({"context": len(seq), "drafts": drafts, "winner": row,
                                   "accepted": len(new)})
        seq += new
        stats["calls"] += 1
        stats["accepted"].append(len(new))
        stats["processed"] += len(extra) * (fed + len(extra[0]))       # tokens the model ran on
        left = max_new_tokens - (len(seq) - n0)
        if left <= 0:
            break
        # Draft up to m more tokens: no more than needed, none that would cross the window.
        m = min(h - 1, left, window_start(len(seq), B) + B - len(seq))
        extra, drafts = [[]], None
        if m > 0:
            logprobs = F.log_softmax(model.head_logits(z[row, a])[:m + 1], dim=-1)  # [m + 1, V]
            drafts = drafter(logprobs, seq)
            cache.ensure_rows(len(drafts))
            extra = [d[1:m + 1] for d in drafts]
    stats["block_efficiency"] = max_new_tokens / stats["calls"]
    return seq[n0:n0 + max_new_tokens], stats


# ----------------------------------------------------------------------------- checkpoints, text

class CheckpointError(Exception):
    """A checkpoint that is missing, corrupt, or does not match this code."""


def build_model(config, state, device="cpu", dtype=torch.float32, where="checkpoint"):
    """GPT from a saved config dict and state dict, with a clear error on any mismatch."""
    try:
        model = GPT(GPTConfig(**config))
        model.load_state_dict({k: v.float() for k, v in state.items()})
    except (TypeError, ValueError, RuntimeError, AttributeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{where} does not match this version of minibpd.py ({first}); "
                              "retrain it with `python train_heads.py`") from None
    return model.to(device=device, dtype=dtype).eval()


def load_checkpoint(path=CHECKPOINT, device="cpu", dtype=torch.float32):
    """-> (model, checkpoint dict). Loaded with weights_only=True: a checkpoint cannot run code."""
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} not found: run `python train_heads.py` "
                              "to create it, or pass --checkpoint PATH") from None
    except Exception as e:  # truncated zip, not a torch file, unsafe pickle, ...
        raise CheckpointError(f"checkpoint {path} is corrupt or not a minibpd checkpoint "
                              f"({type(e).__name__}); retrain it with `python train_heads.py`") from None
    if not isinstance(ck, dict) or ck.get("format_version") != FORMAT_VERSION:
        found = ck.get("format_version") if isinstance(ck, dict) else None
        raise CheckpointError(f"checkpoint {path} has format {found!r}, this code reads format "
                              f"{FORMAT_VERSION}; retrain it with `python train_heads.py`")
    for key in ("config", "model", "vocab"):
        if key not in ck:
            raise CheckpointError(f"checkpoint {path} lacks '{key}'; retrain it with `python train_heads.py`")
    model = build_model(ck["config"], ck["model"], device, dtype, f"checkpoint {path}")
    if len(ck["vocab"]) != model.config.vocab_size:
        raise CheckpointError(f"checkpoint {path}: vocabulary size does not match its model")
    return model, ck


def encode(text, vocab):
    """Characters -> token ids, with a clear error for characters the model never saw."""
    stoi = {c: i for i, c in enumerate(vocab)}
    unknown = sorted({c for c in text if c not in stoi})
    if unknown:
        shown = ", ".join(repr(c) for c in unknown[:10])
        raise ValueError(f"the text contains characters the model never saw in training: {shown}; "
                         "use characters from its training text (plain English / ASCII)")
    return [stoi[c] for c in text]


def decode(tokens, vocab):
    return "".join(vocab[t] for t in tokens)


def resolve_device(name):
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but CUDA is not available; use --device cpu")
    return name


# ----------------------------------------------------------------------------- command line

def main(argv=None):
    import bench                            # the command line: demo, generator, benchmark
    args = bench.parse_args(argv)
    try:
        torch.manual_seed(args.seed)
        if args.tune:
            return bench.tune(args)
        if args.bench:
            return bench.bench(args)
        if args.prompt is not None:
            return bench.generate(args)
        return bench.demo(args)
    except (ValueError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:                 # e.g. `python minibpd.py --demo | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    import minibpd  # run main() from the importable module, so bench.py shares its classes
    sys.exit(minibpd.main())
