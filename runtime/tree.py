"""tree: tree verification (ours: neither paper has it; as in SpecInfer and Medusa). Several
drafts verified as ONE row holding their token tree (a trie: each drafted token once) under a
tree attention mask, instead of P rows of a batch (minibpd.Verifier): the same z for every
draft, fewer tokens run when drafts share prefixes (p-best's do). `verify="tree"` (or "auto"
with several drafts) in bpd_decode; TreeCache.compact keeps the accepted path.
"""
import torch

from minibpd import KVCache, Verifier
from runtime.kvcache import device_of, padded


class TreeCache(KVCache):
    """minibpd.KVCache for tree verification: one row, `spare` slots past the window for the
    tree's other branches, and compact() to keep the accepted path."""

    def compact(self, tail, nodes):
        """Keep the `tail` slots just written and the accepted tree `nodes` (offsets after the
        tail, root to leaf), moved to consecutive slots; advance."""
        base = self.length + tail
        src = torch.tensor(nodes, dtype=torch.long, device=self.kv[0][0].device) + base
        for pair in self.kv:
            for t in pair:
                t[:, :, base:base + len(nodes)] = t[:, :, src]   # gathered first: overlap is safe
        self.length = base + len(nodes)


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
    (each drafted token appears once). -> (z [P, m + 1, C] gathered along each draft's path, a
    short one's last node repeated, tail length, paths) for the same verification as
    model_call's; TreeCache.compact keeps the accepted path."""
    tail = cache.tail(seq)
    tokens, parents, paths = draft_tree(proposed)
    dev, T = device_of(model), len(tail)
    idx = torch.tensor([tail + tokens], dtype=torch.long, device=dev)
    tree = tree_layout(T, parents, cache.length, dev)
    z = model(idx, cache, tree)[0]                                          # [T + N, C]
    at = torch.tensor(padded([[T - 1] + [T + j for j in path] for path in paths]), device=dev)
    return z[at], T, paths


class TreeVerifier(Verifier):
    """minibpd.Verifier with the drafts as one token tree (tree_call) in a one-row TreeCache,
    `spare` slots past the window for the branches; a step with nothing drafted is one plain
    call. On a batch-invariant model (llama.py) a tree's nodes attend to their keys gathered
    in one-token order (attention.tree_attention): in a tree a node's ancestors sit at other cache
    slots than in one-token decoding."""

    def __init__(self, model, spare):
        self.model, self.cache = model, TreeCache(model, 1, spare)
        self.tail, self.processed, self.verified, self.paths = 0, 0, 0, None

    def __call__(self, seq, drafts):
        proposed, self.paths = [d[1:] for d in drafts], None
        if not any(proposed):                     # nothing drafted: a plain one-token call
            return super().__call__(seq, drafts)
        z, self.tail, self.paths = tree_call(self.model, self.cache, seq, proposed)
        nodes = len({n for path in self.paths for n in path})
        self.processed, self.verified = self.processed + self.tail + nodes, self.verified + nodes
        return z

    def keep(self, row, kept):
        if self.paths is None:
            return super().keep(row, kept)
        self.cache.compact(self.tail, self.paths[row][:kept])
