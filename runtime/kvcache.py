"""kvcache: the preallocated KV cache and the model calls that fill it: the uncached tail of a
sequence, P drafts as P rows of a batch, or P drafts as one token tree in one row.

Below minibpd (which re-exports these names): anything with `config` (block_size), `lm_head`,
`forward(idx, cache, tree, prefix)` and `kv_spec()` uses it, the character GPT and smollm's Llama alike.
A cache is one set of tensors and two integers (`start`, `length`); a rejected draft is dropped by
not advancing past it, so nothing is ever erased (the simplest correct design: a position off by
one after a rejection is the classic bug).
"""
import functools
import numbers
from operator import index
from typing import NamedTuple

import torch


class KVSpec(NamedTuple):
    """The shape of a model's KV cache (GPT.kv_spec)."""
    layers: int
    heads: int        # key/value heads (fewer than query heads under grouped-query attention)
    head_dim: int
    dtype: torch.dtype
    device: torch.device


@functools.lru_cache(maxsize=4096)
def causal_mask(L, start, device):
    """[L, start + L] bool: query i (at slot start + i) may see slots 0..start + i. Cached: the
    decode loop asks for the same few shapes over and over."""
    return torch.ones(L, start + L, dtype=torch.bool, device=device).tril(start)


def device_of(model):
    return model.lm_head.weight.device


def is_int(x):
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def token_ids(items):
    """A sequence of integer token ids as a new list of ints; TypeError otherwise (bools too:
    True is not a token)."""
    if isinstance(items, (str, bytes)):
        raise TypeError("not token ids")
    items = list(items)
    if any(isinstance(t, bool) for t in items):
        raise TypeError("a bool is not a token id")
    return [index(t) for t in items]


def window_start(t, block_size):
    """First position the model sees when it predicts the token at position t: 0 while t fits in the
    window, else jumps forward in steps of block_size // 2. Greedy and every BPD path predict
    position t from exactly seq[window_start(t):t], so running past the window (or a prompt longer
    than it) keeps them identical; the cache is rebuilt when the start jumps."""
    shift = max(1, block_size // 2)
    over = t - block_size
    return 0 if over <= 0 else -(-over // shift) * shift


def prefill_length(start, tail, block_size):
    """How many leading tokens of a call's uncached tail (`tail` tokens of a window that starts at
    `start`) are a prefill, which a model may run by other kernels than the rest (the forward's
    `prefix`, llama.Llama.prefilled): it must be the same tokens in every decode path. In the
    first window the cache is empty only for the prompt, which every path hands over whole: all
    its tokens but the last. After the window moved, greedy's call at the move holds
    block_size - shift + 1 tokens, but a verifier that accepted past the move holds more: the
    prefill is the first block_size - shift of them in both, and a verifier's others run with its
    drafts, which a batch-invariant model computes as greedy computed them, one token a call
    (test_a_window_move_prefills_what_greedy_prefills)."""
    shift = max(1, block_size // 2)
    return tail - 1 if start == 0 else min(tail - 1, block_size - shift)


MAX_CACHE_BYTES = 2 ** 30   # 1 GiB: the most a KVCache may allocate (p-best's p sets its rows)


def check_cache_budget(model, rows, spare=0):
    """Refuse, before allocating, a KVCache of `rows` rows over MAX_CACHE_BYTES."""
    spec, slots = model.kv_spec(), model.config.block_size + spare
    row = 2 * spec.layers * spec.heads * slots * spec.head_dim * spec.dtype.itemsize
    most = MAX_CACHE_BYTES // row
    if most < 1:
        raise ValueError(f"even one KV cache row would need {row / 2**20:,.0f} MiB for this model "
                         f"({slots} slots); the budget is {MAX_CACHE_BYTES // 2**20} MiB")
    if not is_int(rows) or not 1 <= rows <= most:
        raise ValueError(f"a KV cache of {rows} rows would need {rows * row / 2**20:,.0f} MiB; the "
                         f"budget is {MAX_CACHE_BYTES // 2**20} MiB, i.e. 1 to {most} rows (drafts "
                         "verified per call) for this model")


class KVCache:
    """Preallocated keys/values per layer, [R, kv heads, block_size + spare, head_dim], and two
    integers: `start`, the absolute position of slot 0, and `length`, the number of valid slots.
    Its row protocol (nothing outside this class moves `length`):
      write(layer, k, v)  a model call's L new keys/values go to slots length..length+L-1 of
                          rows 0..P-1; a one-row call (prefill, greedy step) writes every row,
                          because it extends the prefix that all rows share.
      advance(n, row)     keep n of the slots just written, those of `row`, in every row
                          (row=None: every row keeps its own: rows that are independent sequences).
      compact(tail, nodes) tree verification (one row): keep the tail and the accepted nodes.
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

    def write(self, layer, k, v, round_to=1):
        """k, v: [P, heads, L, head_dim] -> every valid slot's keys and values, new ones included:
        [P, heads, length + L, head_dim] each; with round_to, the slots after them up to a
        multiple of round_to too where the cache has them (stale or zero: the caller hides them,
        as batch-invariant attention does its key tiles' padding)."""
        P, end = k.shape[0], self.length + k.shape[2]
        rows = slice(None) if P == 1 else slice(0, P)
        kc, vc = self.kv[layer]
        kc[rows, :, self.length:end], vc[rows, :, self.length:end] = k, v
        self.written = P
        rounded = end + -end % round_to
        end = rounded if rounded <= kc.shape[2] else end
        return kc[:P, :, :end], vc[:P, :, :end]

    def advance(self, n, row=0):
        if self.written > 1 and row is not None:  # several drafts: the winner's slots to every row
            new = slice(self.length, self.length + n)
            for pair in self.kv:
                for t in pair:
                    t[:, :, new] = t[row:row + 1, :, new]
        self.length += n

    def compact(self, tail, nodes):
        """Tree verification: keep the `tail` slots just written and the accepted tree `nodes`
        (offsets after the tail, root to leaf), moved to consecutive slots; advance."""
        base = self.length + tail
        src = torch.tensor(nodes, dtype=torch.long, device=self.kv[0][0].device) + base
        for pair in self.kv:
            for t in pair:
                t[:, :, base:base + len(nodes)] = t[:, :, src]   # gathered first: overlap is safe
        self.length = base + len(nodes)

    def truncate(self, length):
        self.length = max(0, min(self.length, length))

    def reset(self, start):
        self.start, self.length = start, 0


def uncached_from(model, cache, t):
    """Where the tokens the cache does not hold begin, for a model call that predicts position t
    (the tail seq[uncached_from(t):t] is then at least one token). If the window must move for
    position t, the cache is emptied and the tail is the whole new window."""
    start = window_start(t, model.config.block_size)
    if start != cache.start:
        cache.reset(start)
    return cache.start + cache.length


def call_prefill(model, cache, tail):
    """prefill_length of a call whose uncached tail (uncached_from) is `tail` tokens."""
    return prefill_length(cache.start, tail, model.config.block_size) if cache.length == 0 else 0


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
    tail = seq[uncached_from(model, cache, len(seq)):]
    idx = torch.tensor([tail + d for d in padded(proposed)], dtype=torch.long,
                       device=device_of(model))
    z = model(idx, cache, prefix=call_prefill(model, cache, len(tail)))
    return z[:, len(tail) - 1:], len(tail)


def draft_tree(proposed):
    """The drafts as a token tree (a trie: shared prefixes once). -> (tokens [N], parents [N],
    -1 for a child of the certain token; paths: each draft's node indices, root to leaf)."""
    nodes, tokens, parents, paths = {}, [], [], []
    for d in proposed:
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


def tree_call(model, cache, seq, proposed):
    """model_call with the P drafts verified as ONE row: a token tree with a tree attention mask
    (each drafted token appears once). -> (z [P, m + 1, C] gathered along each draft's path,
    a short one's last node repeated,
    tail length, paths) for the same verification as model_call's; KVCache.compact keeps the
    accepted path."""
    tail = seq[uncached_from(model, cache, len(seq)):]
    tokens, parents, paths = draft_tree(proposed)
    dev, T = device_of(model), len(tail)
    idx = torch.tensor([tail + tokens], dtype=torch.long, device=dev)
    tree = tree_layout(T, parents, cache.length, dev)
    z = model(idx, cache, tree, prefix=call_prefill(model, cache, T))[0]        # [T + N, C]
    at = torch.tensor(padded([[T - 1] + [T + j for j in path] for path in paths]), device=dev)
    return z[at], T, paths
