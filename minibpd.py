"""minibpd: exact blockwise parallel decoding (BPD): the model, the reference decoder, the drafter
contract and the one decode loop (Stern et al. 2018, "Blockwise Parallel Decoding for Deep
Autoregressive Models"; Kim et al. 2024, arXiv 2404.09221v2).

A tiny character-level GPT with h prediction heads (Stern §6), the reference decoder
(`sample_decode`; `greedy_decode` is it at temperature 0), and `bpd_decode`: Stern's predict,
verify and accept, merged so that each step is one model call (Stern §4). Every drafter (Kim §7;
lattice.py) plugs into that one loop; runtime/sampling.py holds the rule that keeps it exact when
sampling, runtime/kvcache.py the cache. Any model with runtime/protocol.py's interface runs in
the loop (GPT below; models/llama.py). `python minibpd.py --demo` hands over to lab/cli.py.

Exactness: BPD returns exactly the tokens of `greedy_decode` under its default acceptance rule
(the APPROXIMATE rules of Stern §5, runtime/approximate.py, run only when named and are not). In
float64 this holds bit for bit in practice: the batched verification pass and the one-token pass
sum in different orders, and the rounding differences (~1e-16) cannot flip an argmax unless two
logits tie that closely. In float32 (~1e-7) or bf16 (~1e-2) such near-ties do happen now and
then, so an argmax can flip and the two decoders can diverge: this is rounding, not a bug, and it
is why the tests run in float64. The same holds for sampling: the distribution is exact up to the
rounding of the probabilities.
"""
import copy
import dataclasses
import importlib
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from runtime import checkpoint
from runtime import approximate
from runtime.checkpoint import CHECKPOINT, CheckpointError, retrain
from runtime.contract import (check_drafts, drafter_name, longest_draft, max_draft_tokens,
                              max_drafts)
from runtime.kvcache import (KVCache, KVSpec, call_prefill, causal_mask, device_of, is_int,
                             model_call, tree_call, uncached_from, window_start)
from runtime.request import check_request
from runtime.sampling import (check_proposal, check_temperature, own_generator, target_probs,
                              verify_sampled)


@dataclasses.dataclass
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

    def forward(self, x, cache=None, layer=0, mask=None):
        """x: [P, L, C]. Training: no cache, plain causal attention. Decoding: the L new keys and
        values go into the cache (KVCache.write), and attention reads every valid slot."""
        P, L, C = x.shape
        q, k, v = self.qkv(x).view(P, L, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        if cache is None:  # q, k, v: [P, n_head, L, head_dim]
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
    """Proposal head i >= 2 (Stern §6, Fig. 3): one hidden layer and a residual on the final
    hidden state, z + W2 act(W1 z); the original output projection is then reapplied
    (GPT.head_logits). GPT's heads use GELU; a model family passes its own activation and linear
    layer (llama: SiLU, bf16 weights) and may start W2 at zero (`start_as_head_1`: an untrained
    head then predicts what head 1 does, as Medusa-style training starts). Stern shares one FFN
    across the k outputs; h - 1 separate FFNs are our choice (closer to Kim §4 and Medusa)."""

    def __init__(self, n_embd, act=F.gelu, linear=nn.Linear, start_as_head_1=False):
        super().__init__()
        self.fc, self.proj, self.act = linear(n_embd, n_embd), linear(n_embd, n_embd), act
        if start_as_head_1:
            nn.init.zeros_(self.proj.weight)
            nn.init.zeros_(self.proj.bias)

    def forward(self, z):
        return z + self.proj(self.act(self.fc(z)))


def head_states(heads, x):
    """x [N, C] -> [N, h, C]: z, then every BPDHead's z + W2 act(W1 z), as one wide matmul and
    one batched matmul over the heads' stacked weights (on a CPU, h - 1 separate small calls cost
    about as much as the trunk). Computes in the weights' dtype, returns x's. The readable
    version is calling each head (GPT.reference)."""
    w1, b1, w2, b2 = stacked_weights(heads)  # [(h-1)C, C], [(h-1)C], [h-1, C, C], [h-1, 1, C]
    N, C, H = x.shape[0], x.shape[1], len(heads)
    hidden = heads[0].act(F.linear(x.to(w1.dtype), w1, b1).to(x.dtype))        # [N, (h-1)C]
    hidden = hidden.view(N, H, C).transpose(0, 1).to(w2.dtype)                # [h-1, N, C]
    y = x + torch.baddbmm(b2, hidden, w2).to(x.dtype)                         # [h-1, N, C]
    return torch.cat([x[None], y]).transpose(0, 1)                            # [N, h, C]


def stacked_weights(heads):
    """The heads' weights stacked (a ModuleList of BPDHeads); cached on that list at inference,
    re-stacked when any weight changes (in place: its _version; replaced: its data_ptr), fresh
    under autograd. The parameter list is cached too: walking the modules costs more than the
    heads' arithmetic. A first_heads view has its own list, hence its own cache."""
    memo, training = heads.__dict__, heads.training or torch.is_grad_enabled()
    ps = memo.get("_params")
    if ps is None or training:
        ps = memo["_params"] = [p for hd in heads for p in (hd.fc.weight, hd.fc.bias,
                                                             hd.proj.weight, hd.proj.bias)]
    key = tuple((p.data_ptr(), p._version) for p in ps)
    if training or memo.get("_stack_key") != key:
        stacked = (torch.cat(ps[0::4]), torch.cat(ps[1::4]),          # fc: one wide linear
                   torch.stack([p.t() for p in ps[2::4]]),             # proj: [h-1, C_in, C_out]
                   torch.stack([p[None] for p in ps[3::4]]))           # [h-1, 1, C]
        if training:                                                    # keep autograd intact
            return stacked
        memo["_stack"], memo["_stack_key"] = stacked, key
    return memo["_stack"]


class GPT(nn.Module):
    """nanoGPT-style decoder. Head 1 is the base LM itself; heads 2..h are BPDHeads. All heads share
    one output projection (Stern §6), tied to the token embedding (Kim §4). `reference = True`
    runs each head through BPDHead.forward instead of the batched twin (`--reference`)."""
    reference = False

    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        # Built in a loop: `[BPDHead(cfg)] * n` would share one module n times.
        self.heads = nn.ModuleList([BPDHead(cfg.n_embd) for _ in range(cfg.n_bpd_heads - 1)])
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx, cache=None, tree=None, prefix=0):
        """idx: [P, L] token ids -> final hidden states z: [P, L, C]. With a cache the L tokens sit
        at window slots cache.length.. (the cache is written, not advanced; see KVCache.advance).
        tree: (positions [L], mask [L, length + L]) of a token tree in one row (tree_layout).
        prefix: how many leading tokens are a prefill; this model computes every token alike."""
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

    def head_logits(self, z, last=None):
        """z: [..., C] -> logits of all h heads: [..., h, V]; head i predicts i - 1 tokens further:
        lm_head(z) for head 1, lm_head(BPDHead_i(z)) for the others (Stern §6). `last`, the
        token just chosen, is for heads that read it (llama.ChainedHead); these do not."""
        if self.reference or not self.heads:   # the readable version: each head, one by one
            return self.lm_head(torch.stack([z] + [head(z) for head in self.heads], dim=-2))
        zs = head_states(self.heads, z.reshape(-1, z.shape[-1]))                 # [N, h, C]
        return self.lm_head(zs.view(*z.shape[:-1], *zs.shape[1:]))

    def kv_spec(self):
        """What a KVCache for this model holds: (layers, kv heads, head dim, dtype, device)."""
        cfg, w = self.config, self.tok_emb.weight
        return KVSpec(cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, w.dtype, w.device)

    def flop_params(self):
        """Parameters a token's forward pass multiplies by: all but the position table (a lookup)."""
        return sum(p.numel() for p in self.parameters()) - self.pos_emb.weight.numel()

    def first_heads(self, n):
        return heads_view(self, n)


def heads_view(model, n):
    """The model using only heads 1..n, weights shared: plain BPD with n heads (n = 1: greedy);
    every model family's first_heads. Its own module table and head list (hence its own stacked
    heads, stacked_weights), the config saying n heads."""
    if not is_int(n) or not 1 <= n <= model.config.n_bpd_heads:
        raise ValueError(f"heads must be an integer from 1 to {model.config.n_bpd_heads}, got {n!r}")
    view = copy.copy(model)                       # shares parameters; own module table
    view._modules = dict(model._modules)
    view.heads = nn.ModuleList(list(model.heads)[:n - 1])
    view.config = dataclasses.replace(model.config, n_bpd_heads=n)
    return view


# ----------------------------------------------------------------------------- the checkpoint

def build_model(config, state, device="cpu", dtype=torch.float32, where="checkpoint", path=None,
                kind=None):
    """GPT from a saved config dict and state dict, with a clear error on any mismatch (which
    tensors disagree) and on weights that are not all finite (they would decode garbage); the
    way out names `path` and the train_heads.py mode of `kind` (checkpoint.train_kind)."""
    try:
        model = GPT(GPTConfig(**config))
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: its config does not fit this minibpd.py ({e}); "
                              f"{retrain(path, kind)}") from None
    checkpoint.check_state(model.state_dict(), state, where, path, kind)
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return model.to(device=device, dtype=dtype).eval()


# A checkpoint's "kind" names the module that builds its model (absent: this file's GPT). That
# module offers from_checkpoint(ck, device, dtype) -> (model, vocab); adding a model family is
# one module and one line here, and this file never imports one.
MODEL_FAMILIES = {"smollm2-heads": "models.smollm"}


def family_module(ck, path="the checkpoint"):
    """The module of the checkpoint's model family (MODEL_FAMILIES), or None for this file's GPT."""
    family = ck.get("kind")
    if family is None:
        return None
    if family not in MODEL_FAMILIES:
        raise CheckpointError(f"checkpoint {path} is of kind {family!r}, which this minibpd does "
                              f"not know (known: {', '.join(MODEL_FAMILIES)})")
    return importlib.import_module(MODEL_FAMILIES[family])


def load_checkpoint(path=CHECKPOINT, device="cpu", dtype=None):
    """-> (model, checkpoint dict). Read with weights_only=True: a checkpoint cannot run code.
    dtype None: the checkpoint's own (`ck["dtype"]`, else float32). A checkpoint of another
    model family (MODEL_FAMILIES, e.g. SmolLM2's heads) is built by its module; its ck["vocab"]
    may then be a tokenizer (encode/decode take either)."""
    ck = {**checkpoint.read(path, needs=("config",)), "path": path}    # path: for its errors
    dtype, kind = checkpoint.dtype_of(ck, path) if dtype is None else dtype, checkpoint.train_kind(ck)
    family = family_module(ck, path)
    if family is not None:
        try:
            model, vocab = family.from_checkpoint(ck, device, dtype)
        except (ValueError, ImportError) as e:
            raise CheckpointError(f"checkpoint {path}: {e}") from None
        return model.eval(), {**ck, "vocab": vocab}
    checkpoint.require(ck, path, ("model", "vocab"))
    model = build_model(ck["config"], ck["model"], device, dtype, f"checkpoint {path}", path, kind)
    vocab = ck["vocab"]
    if not isinstance(vocab, str) or len(set(vocab)) != len(vocab) or \
            len(vocab) != model.config.vocab_size:
        raise CheckpointError(f"checkpoint {path}: its vocab must be a string of "
                              f"{model.config.vocab_size} distinct characters, one per token; "
                              f"{retrain(path, kind)}")
    return model, ck


# ----------------------------------------------------------------------------- the drafter contract

class ArgmaxDrafter:
    """Plain BPD drafter (Stern §3, predict): each head's most likely token.

    The drafter contract, checked by bpd_decode at every step (runtime/contract.py):
      drafter(logprobs, context) -> drafts
        logprobs  [m, V]: log-probs of heads 1..m at the last accepted position
        context   the tokens so far, prompt included; context[-1] was just verified
        drafts    a list of 1..max_drafts drafts, each a list of m ints in [0, V) whose first
                  is context[-1] (head 1 is the base model: its token is certain)
      max_drafts  attribute: the most drafts one call returns (default 1); p-best verifies up
                  to this many in one call
      max_draft_tokens  attribute (ours; neither paper has it): the most tokens a draft holds
                  after context[-1] (default h - 1, the heads' reach). A drafter that declares
                  it may return drafts of m to max_draft_tokens + 1 ints, of lengths that differ
                  (a copy from the context is not bound to the heads, PromptLookupDrafter);
                  the loop cuts each at the output's end and the window's edge
    Both arguments are the drafter's own copies: changing them cannot change the output. A
    drafter may keep per-sequence state (NeuralDrafter keeps a small LM's KV cache), so one
    drafter object serves one sequence at a time."""
    name = "bpd"
    max_drafts = 1

    def __call__(self, logprobs, context):
        # Under greedy decoding head 1's argmax is context[-1]; when sampling it need not be.
        return [[context[-1]] + logprobs[1:].argmax(-1).tolist()]


# ----------------------------------------------------------------------------- the reference decoder

def next_token(model, z, temperature, generator=None):
    """The base model's next token from final hidden states z [P, C]: the argmax (temperature 0)
    or a draw from target_probs at `temperature` (generator None: torch's global one; the decode
    loops pass their own). -> [P, 1] token ids."""
    logits = model.lm_head(z)
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    probs = target_probs(logits.double(), temperature).cpu()
    return torch.multinomial(probs, 1, generator=generator).to(logits.device)


@torch.no_grad()
def decode_rows(model, rows, n, temperature=0.0, generator=None, states=None):
    """rows [P, L] -> [P, L + n]: P independent sequences of one length, each continued one token
    per model call with the KV cache (each row its own sequence), with the windows of
    window_start. `states`, a list, gains each call's final hidden states z [P, C] (the states
    that chose the new tokens: self-distillation keeps them)."""
    cache, generator = KVCache(model, rows=len(rows)), own_generator(generator, temperature)
    for _ in range(n):
        tail = rows[:, uncached_from(model, cache, rows.shape[1]):]
        prefix = call_prefill(model, cache, tail.shape[1]) if len(rows) == 1 else 0
        z = model(tail, cache, prefix=prefix)[:, -1]                    # [P, C]
        cache.advance(tail.shape[1], row=None)
        if states is not None:
            states.append(z)
        rows = torch.cat([rows, next_token(model, z, temperature, generator)], dim=1)
    return rows


def sample_decode(model, prompt, max_new_tokens, temperature=1.0, generator=None):
    """The reference decoder: one token per call with the KV cache, each the argmax (temperature
    0) or drawn from target_probs at `temperature` (own_generator). -> new tokens."""
    seq = check_request(model, prompt, max_new_tokens)
    rows = torch.tensor([seq], dtype=torch.long, device=device_of(model))
    return decode_rows(model, rows, max_new_tokens, temperature, generator)[0, len(seq):].tolist()


def greedy_decode(model, prompt, max_new_tokens):
    """Greedy decoding with the KV cache: the reference every BPD path must equal, and the speed
    baseline."""
    return sample_decode(model, prompt, max_new_tokens, 0.0)


# ----------------------------------------------------------------------------- BPD: predict, verify, accept

def draft_budget(t, end, most, block_size):
    """How many tokens to draft when t tokens are known and the output ends at `end`: at most
    `most` (h - 1, or the drafter's max_draft_tokens), no more than are still missing, none that
    would cross the window."""
    return max(0, min(most, end - t, window_start(t, block_size) + block_size - t))


def drafter_generator(generator):
    """A sampling drafter's generator for one call, seeded by one draw from the loop's own: what
    the drafter does to it (reseed it, restore it) cannot reach verification's draws, nor its next call's."""
    return torch.Generator().manual_seed(int(torch.randint(2 ** 62, (1,), generator=generator)))


class DrafterError(RuntimeError):
    """A drafter (or its factory) raised: its own failure, not bad input to the decoder."""


def predict(model, drafter, z, seq, m, temperature=0.0, generator=None):
    """Stern §3, predict: the heads at the last accepted position (z [C]) give r = min(m, h - 1)
    + 1 rows of log-probs (head 1's token, seq[-1], is already chosen); the drafter turns them
    into drafts of r tokens (up to m + 1 if it declares max_draft_tokens), checked against the
    contract. -> (drafts, q): q [r, V] when a sampling drafter declares its proposal (checked
    too), else None. The drafter gets its own copy of seq and, when sampling, a generator of its
    own for this call, so nothing it does to either reaches verification."""
    if m == 0:                                   # nothing to draft: a plain one-token step
        return [[seq[-1]]], None
    logprobs = F.log_softmax(model.head_logits(z, seq[-1])[:m + 1], dim=-1)  # [r, V]
    sampling = temperature > 0 and hasattr(drafter, "sample")
    try:
        own = drafter_generator(generator) if sampling else None
        drafts, q = drafter.sample(logprobs, list(seq), temperature, own) if sampling else \
            (drafter(logprobs, list(seq)), None)
    except (Exception, SystemExit, GeneratorExit) as e:     # sys.exit() too: its failure, reported
        raise DrafterError(f"drafter {drafter_name(drafter)} failed: {type(e).__name__}: {e}") from e
    V, name, r = model.config.vocab_size, drafter_name(drafter), len(logprobs)
    longest = longest_draft(drafter, r, model.config.n_bpd_heads, sampling)
    drafts = check_drafts(drafts, r, seq[-1], V, max_drafts(drafter), drafter, longest)
    drafts = [d[:m + 1] for d in drafts]         # the output's end, the window's edge
    return drafts, None if not sampling else check_proposal(q, drafts, V, name)


class Verifier:
    """Stern §3, verify: ONE model call checks every draft. As P rows of a batch ("batch"), or
    as one row holding the drafts' token tree with a tree attention mask ("tree": each drafted
    token once; "auto": tree when a drafter returns several drafts). Both give the same z;
    `keep` then moves the cache past the accepted tokens. On a batch-invariant model (llama.py)
    a tree's nodes attend to their keys gathered in one-token order (llama.tree_attention): in a
    tree a node's ancestors sit at other cache slots than in one-token decoding."""
    MODES = ("auto", "batch", "tree")

    def __init__(self, model, n_drafts, mode="auto", who=None, reach=None):
        if mode not in self.MODES:
            raise ValueError(f"verify must be one of {', '.join(self.MODES)}, got {mode!r}")
        self.model = model
        self.tree = mode == "tree" or (mode == "auto" and n_drafts > 1)
        reach = model.config.n_bpd_heads - 1 if reach is None else reach   # drafted per draft
        spare = (n_drafts - 1) * reach                      # extra tree nodes, at most
        try:
            self.cache = KVCache(model, 1, spare) if self.tree else KVCache(model, n_drafts)
        except ValueError as e:                 # over the cache budget: whose drafts are they?
            raise ValueError(f"drafter {who}: max_drafts {n_drafts}: {e}" if who else str(e)) from None
        self.paths, self.tail = None, 0

    def prefill(self, seq):
        """The prompt in one call. -> z [C] at its last position."""
        z, self.tail = model_call(self.model, self.cache, seq)
        self.cache.advance(self.tail)
        return z[0, -1]

    def __call__(self, seq, drafts):
        """-> z [P, m + 1, C]: z[j, i] is the base model after seq + drafts[j][1:i + 1] (m: the
        longest draft's; past a shorter draft's end, rows that accept never reads)."""
        proposed, self.paths = [d[1:] for d in drafts], None
        if self.tree and any(proposed):        # (nothing drafted: a plain one-token call)
            z, self.tail, self.paths = tree_call(self.model, self.cache, seq, proposed)
        else:
            z, self.tail = model_call(self.model, self.cache, seq, proposed)
        return z

    def keep(self, row, a):
        """The cache keeps the tail and draft `row`'s first a drafted tokens."""
        if self.paths is not None:
            self.cache.compact(self.tail, self.paths[row][:a])
        else:
            self.cache.advance(self.tail + a, row)

    def cost(self, drafts):
        """(tokens the base model ran on, of which drafted) in the last call."""
        if self.paths is not None:
            drafted = len(set(sum(self.paths, [])))
            return drafted + self.tail, drafted
        drafted = len(drafts) * (max(map(len, drafts)) - 1)     # padded rows run in full
        return drafted + self.tail * len(drafts), drafted


def matched(proposed, truth):
    """Length of the longest prefix of `proposed` that equals `truth` (Stern §3, accept)."""
    return next((i for i, (a, b) in enumerate(zip(proposed, truth)) if a != b),
                min(len(proposed), len(truth)))


def accept(drafts, choices):
    """Stern §3, accept, for P drafts at once: the first draft with the longest prefix equal to
    the greedy choices (choices[j]: after each prefix of draft j's drafted tokens); the accept
    step of the decode loop and of every offline replay (lab/analysis.py). -> (row, accepted
    drafted tokens a, the token after them; None where choices stop at the draft's end)."""
    ok = [matched(d[1:], c) for d, c in zip(drafts, choices)]         # longest matching prefixes
    row = ok.index(max(ok))                                           # the first of the best
    return row, ok[row], choices[row][ok[row]] if ok[row] < len(choices[row]) else None


def verified_logits(model, z):
    """Head 1's logits [P, m + 1, V] at the verified positions z [P, m + 1, C]. A model may
    project more rows in the same call (Llama.verified_logits: the next draft's heads)."""
    own = getattr(model, "verified_logits", None)
    return model.lm_head(z) if own is None else own(z)


def accept_greedy(model, z, drafts):
    """accept on the verification call's z [P, m + 1, C]: its greedy choices, P lists of m + 1."""
    return accept(drafts, verified_logits(model, z).argmax(-1).tolist())


def acceptance_rule(model, temperature, generator, spec="exact"):
    """Accept at temperature 0 (accept_greedy) or above it (the speculative sampling rule,
    sampling.verify_sampled, which also lists its tries); or, only when `spec` names one, by an
    APPROXIMATE rule of Stern §5 at T = 0 (runtime/approximate.py: "top2", "min3", ...), whose
    tokens are not greedy decoding's. -> rule(z, drafts, q) -> (row, a, token, tries)."""
    check_temperature(temperature)
    relaxed = approximate.rule(spec, temperature)            # None: the exact rule
    if relaxed is not None:
        return lambda z, drafts, q: (*accept(drafts, relaxed.choices(verified_logits(model, z),
                                                                     drafts)), None)
    if temperature == 0:
        return lambda z, drafts, q: accept_greedy(model, z, drafts) + (None,)

    def sampled(z, drafts, q):
        probs = target_probs(verified_logits(model, z).double(), temperature).cpu()  # [P, m+1, V]
        return verify_sampled(probs, [d[1:] for d in drafts], None if q is None else q[1:],
                              generator)
    return sampled


class Stats:
    """What bpd_decode reports: calls (serial model calls, prefill included), accepted (tokens
    gained per call), steps (each draft step: context length, drafts, winner, accepted; when
    sampling, the tries), processed (tokens the base model ran on), verified (drafted tokens the
    base model ran on), new_tokens and block_efficiency (new tokens / calls)."""

    def __init__(self):
        self.calls, self.accepted, self.steps, self.processed, self.verified = 0, [], [], 0, 0

    def call(self, gained, cost=(0, 0)):
        self.calls += 1
        self.accepted.append(gained)
        self.processed, self.verified = self.processed + cost[0], self.verified + cost[1]

    def step(self, context, drafts, row, gained, tries):
        self.steps.append({"context": context, "drafts": drafts, "winner": row, "accepted": gained,
                           **({} if tries is None else {"tries": tries})})

    def result(self, n):
        return {**vars(self), "block_efficiency": n / self.calls, "new_tokens": n}


@torch.no_grad()
def bpd_decode(model, prompt, max_new_tokens, drafter=None, temperature=0.0, generator=None,
               verify="auto", accept="exact"):
    """Blockwise parallel decoding (Stern §3) with merged predict+verify (Stern §4): each call
    verifies the drafts and, through the heads at the last accepted position, yields the next.
    temperature 0 (default): exactly greedy decoding's tokens. temperature T > 0: exactly the
    distribution of sample_decode at T, whatever the drafts (sampling.py; `generator`, or one
    seeded once from torch's, drives all randomness: own_generator). verify: "batch", "tree" or
    "auto" (Verifier); the same tokens and steps. accept: "exact" (the default: all of the
    above), or an APPROXIMATE rule at T = 0 (Stern §5, runtime/approximate.py: "top2", "min3"):
    NOT greedy's tokens. -> (new tokens, stats: see Stats)."""
    seq, n = check_request(model, prompt, max_new_tokens), max_new_tokens
    generator = own_generator(generator, temperature)       # before any drafter runs
    drafter = drafter or ArgmaxDrafter()
    rule = acceptance_rule(model, temperature, generator, accept)   # greedy, sampled, approximate
    stats, end, reach = Stats(), len(seq) + n, max_draft_tokens(drafter, model.config.n_bpd_heads)
    call = Verifier(model, max_drafts(drafter), verify, drafter_name(drafter), reach)  # batch/tree
    z = call.prefill(seq)                                   # the prompt: one call, no draft
    seq.append(int(next_token(model, z[None], temperature, generator)))
    stats.call(1, (call.tail, 0))
    while len(seq) < end:
        m = draft_budget(len(seq), end, reach, model.config.block_size)
        drafts, q = predict(model, drafter, z, seq, m, temperature, generator)    # predict
        zs = call(seq, drafts)                                                     # verify
        row, a, token, tries = rule(zs, drafts, q)                                 # accept
        call.keep(row, a)
        new = drafts[row][1:a + 1] + [token]
        if m > 0:
            stats.step(len(seq), drafts, row, len(new), tries)
        stats.call(len(new), call.cost(drafts))
        seq += new
        z = zs[row, a]                        # the heads here draft the next block (Stern §4)
    return seq[end - n:end], stats.result(n)


if __name__ == "__main__":    # the script hand-off: the command line lives in cli.py
    from lab.cli import main
    sys.exit(main())
