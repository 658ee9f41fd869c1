"""lattice: the top-k lattice of BPD's heads, its exact p-best rescoring, and the drafters that
refine BPD's drafts (T. Kim, A. T. Suresh, K. Papineni, M. Riley, S. Kumar, A. Benton,
"Exploring and Improving Drafts in Blockwise Parallel Decoding", arXiv 2404.09221v2; section
numbers are v2's).

Kim §6.3 keeps each head's k most likely tokens: the top-k lattice ("sausage") of the h heads,
and its oracle path. §7.1 rescores a draft locally with a small neural LM; §7.2 rescores every
path of the lattice with an n-gram LM and verifies the p best in one call.

Position i (0 .. h-1) holds head i's candidates for the token i ahead. Ours: position 0 is the
token verification has just chosen (Stern's merged step), certain, so it holds one candidate and
a lattice has k^(h-1) paths, where Kim §6.3 takes one of k tokens from each of the h heads
(k^h). A path scores
    sum_i interpolate(head_logprob_i, lm.logprob(token_i, history + path[:i]), alpha)
(alpha = 0 or no LM: heads only, the "0-gram" control, ours: it isolates what the LM adds). An
order-n LM sees only the last n - 1 tokens, so a dynamic program over (position, last n - 1
tokens) finds the p best paths exactly
(Kim et al. compose finite-state machines with OpenFST; the DP is exact for this score). Ties
break by the rank tuple (each token's index in its position's list), smaller first: the heads'
own order wins.

Every function here is the readable one. The decode loop runs fast twins by default, built on
these and checked against them (tests/test_lattice.py, tests/decoders/): decoders/fastlattice.py
(this DP in whole-array numpy) and decoders/viterbi.py (p = 1), decoders/neural.py (the small
LM with its own KV cache); `--reference` runs these instead.
"""
import math
from operator import index

import numpy as np
import torch
import torch.nn.functional as F

from minibpd import window_start


def interpolate(head_logprob, lm_logprob, alpha):
    """The score of one token: the heads' log-prob interpolated with an LM's. Kim §7.1's
    equation interpolates the heads' and the rescorer's logits; ours interpolates log-probs,
    which differ from logits per position by a constant (the log-normaliser), so at one position
    the two rank the k candidates alike. Floats, numpy arrays and tensors alike: every rescorer,
    path_score and the fast twins use it, so this is the one line to change."""
    return (1 - alpha) * head_logprob + alpha * lm_logprob


class Lattice:
    """tokens[i]: distinct candidate ids of position i, best first; logprobs[i]: their head
    log-probs (finite, non-increasing). Position 0 holds exactly one token."""

    def __init__(self, tokens, logprobs):
        if len(tokens) == 0 or len(tokens) != len(logprobs):
            raise ValueError(f"need h >= 1 positions, got {len(tokens)} and {len(logprobs)}")
        self.tokens = [[index(t) for t in row] for row in tokens]
        self.logprobs = [[float(x) for x in row] for row in logprobs]
        for i, (toks, lps) in enumerate(zip(self.tokens, self.logprobs)):
            if not (0 < len(toks) == len(lps) == len(set(toks)) and min(toks) >= 0
                    and all(map(math.isfinite, lps)) and lps == sorted(lps, reverse=True)):
                raise ValueError(f"position {i}: need distinct ids >= 0 with finite logprobs, "
                                 f"best first; got {toks}, {lps}")
        if len(self.tokens[0]) != 1:
            raise ValueError("position 0 (the certain greedy token) needs exactly one candidate")

    @classmethod
    def from_logprobs(cls, head_logprobs, k, first=None, top=None):
        """Top-k lattice of head log-probs [h, V] (numpy; float32 widens exactly): candidates by
        log-prob, then id (a stable sort); k is clamped to V; position 0 keeps only `first` (in
        BPD the token verification chose) or else its argmax. top: the candidate ids [h, k] when
        already known (decoders/fastlattice.py finds them without sorting whole rows)."""
        k, lp = index(k), np.asarray(head_logprobs, dtype=np.float64)
        if k < 1 or lp.ndim != 2 or 0 in lp.shape or np.isnan(lp).any():
            raise ValueError(f"need k >= 1 and NaN-free head_logprobs [h, V]; got k = {k}, "
                             f"shape {lp.shape}")
        if first is not None and not 0 <= index(first) < lp.shape[1]:
            raise ValueError(f"first must be a token id in [0, {lp.shape[1]}), got {first}")
        top = (np.argsort(-lp, axis=1, kind="stable")[:, :k] if top is None else top).tolist()
        top[0] = [index(first)] if first is not None else top[0][:1]
        return cls(top, [lp[i, toks].tolist() for i, toks in enumerate(top)])

    h = property(lambda self: len(self.tokens))
    k = property(lambda self: max(map(len, self.tokens)), doc="most candidates at a position")


def path_score(lattice, lm, history, tokens, alpha):
    """The reference score of one path (a token per position), summed left to right."""
    history, path = [index(t) for t in history], [index(t) for t in tokens]
    if len(path) != lattice.h:
        raise ValueError(f"path has {len(path)} tokens, lattice has {lattice.h} positions")
    s = 0.0
    for i, tok in enumerate(path):
        if tok not in lattice.tokens[i]:
            raise ValueError(f"token {tok} is not a candidate of position {i}")
        lp = lattice.logprobs[i][lattice.tokens[i].index(tok)]
        if lm is None or alpha == 0.0:  # 0-gram control: never call the LM
            s = s + lp
        else:
            s = s + interpolate(lp, lm.logprob(tok, history + path[:i]), alpha)
    return s


def _prune(cands, p):
    """The p best (score, ranks, tokens) of one DP state. Float addition is monotone, so a
    partial path worse now stays no better after any common extension: keeping p is exact. But
    scores a few ulps apart can round to equal totals later, where ranks decide, so we also keep
    one within 1e-9 of a kept one with larger ranks (rare; assumes |score| << 1e5)."""
    cands.sort(key=lambda c: (-c[0], c[1]))
    keep = cands[:p]
    for c in cands[p:]:
        tol = 1e-9 * max(1.0, abs(c[0]))
        if cands[p - 1][0] > c[0] + tol:
            break  # this one and all worse ones are beaten by all p kept ones
        if any(y[0] <= c[0] + tol and y[1] > c[1] for y in cands[:p]):
            keep.append(c)
    return keep


def best_paths(lattice, lm, history, p, alpha):
    """Kim §7.2: the p best paths [(score, tokens)], best first (fewer if the lattice has fewer).
    A DP over positions; the state, the last n-1 tokens of history + path (one state with no
    LM), is all the LM sees, so paths sharing it extend alike. Scores use path_score's float
    operations in the same order, so they are bitwise equal to it. Ties: smaller ranks first."""
    if p < 1 or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"need p >= 1 and alpha in [0, 1], got p = {p}, alpha = {alpha}")
    use_lm = lm is not None and alpha != 0.0
    n = lm.order - 1 if use_lm else 0  # tokens of context the LM sees
    history = [index(t) for t in history]
    start = tuple(history[max(0, len(history) - n):]) if n else ()
    beams = {start: [(0.0, (), ())]}  # state -> [(score, rank tuple, token tuple)]
    for i in range(lattice.h):
        grown = {}
        for state, partials in beams.items():
            for r, (tok, lp) in enumerate(zip(lattice.tokens[i], lattice.logprobs[i])):
                term = interpolate(lp, lm.logprob(tok, list(state)), alpha) if use_lm else lp
                new_state = (state + (tok,))[-n:] if n else ()
                bucket = grown.setdefault(new_state, [])
                for s, ranks, toks in partials:
                    bucket.append((s + term, ranks + (r,), toks + (tok,)))
        beams = {state: _prune(cands, p) for state, cands in grown.items()}
    finals = sorted((c for cands in beams.values() for c in cands), key=lambda c: (-c[0], c[1]))
    return [(s, list(toks)) for s, _, toks in finals[:p]]


def oracle_path(lattice, greedy):
    """Kim §6.3 oracle: the path BPD verification accepts furthest, given the true greedy
    continuation greedy[0:h] (greedy[0] is position 0's token): follow greedy while it is a
    candidate, then take each position's top candidate. Verification accepts the longest prefix
    that matches greedy, and a path matching greedy on positions 0..L-1 needs greedy[i] among
    position i's candidates, so from one context no path of the lattice accepts more tokens."""
    greedy = [index(t) for t in greedy]
    if len(greedy) < lattice.h or greedy[0] != lattice.tokens[0][0]:
        raise ValueError(f"greedy needs >= {lattice.h} tokens, the first being the position 0 "
                         f"token {lattice.tokens[0][0]}; got {greedy[:lattice.h]}")
    path, hit = [], True
    for cands, g in zip(lattice.tokens, greedy):
        hit = hit and g in cands  # after the first miss nothing more is accepted
        path.append(g if hit else cands[0])
    return path


# ------------------------------------------------------------------------ drafters (Kim §6.3, §7)
# Each is called by minibpd.bpd_decode as drafter(logprobs [r, V], context) and returns drafts of
# r tokens, the first being the verified token context[-1] (the contract: minibpd.ArgmaxDrafter).

def head_lattice(logprobs, context, k):
    """Top-k lattice of the heads' log-probs [r, V]; position 0: the verified token context[-1]."""
    return Lattice.from_logprobs(logprobs.detach().double().cpu().numpy(), k, first=context[-1])


class PBestDrafter:
    """Global rescoring (Kim §7.2): the p best lattice paths under interpolate(head log-prob,
    n-gram log-prob, alpha), all verified in one call (max_drafts = p). p = 1 is the `ngram`
    decoder; lm=None is the "0-gram" control `pbest0` (ours): the p best paths by head scores."""

    def __init__(self, k, p, alpha=0.0, lm=None, name="pbest"):
        self.k, self.p, self.alpha, self.lm, self.name, self.max_drafts = k, p, alpha, lm, name, p

    def search(self, lat, history):
        """The p best paths [(score, tokens)] of the lattice after `history`."""
        return best_paths(lat, self.lm, history, self.p, self.alpha)

    def __call__(self, logprobs, context):
        lat = head_lattice(logprobs, context, self.k)
        return [tokens for _, tokens in self.search(lat, context[:-1])]


def rescore_locally(logprobs, context, k, alpha, lm_logprobs):
    """Kim §7.1, local neural rescoring: walk the heads left to right; at head i pick, among its
    top-k tokens, the one maximising interpolate(head log-prob, small-LM log-prob, alpha), the
    small LM seeing the context and the tokens picked so far. logprobs [r, V]; lm_logprobs(seq)
    -> the small LM's next-token log-probs [V] after seq. Position 0 is the verified token
    context[-1]. -> the draft."""
    top = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)             # values, indices: [r, k]
    draft = [context[-1]]
    for i in range(1, len(logprobs)):
        lm = lm_logprobs(context + draft[1:]).to(top.values.dtype)        # [V]
        score = interpolate(top.values[i], lm[top.indices[i]], alpha)     # [k]
        draft.append(int(top.indices[i, score.argmax()]))
    return draft


class NeuralDrafter:
    """rescore_locally with a small LM (Kim §7.1; train_heads.py trains one beside the model),
    run over its window afresh for each position: r - 1 small-LM calls a draft.
    decoders/neural.py keeps the small LM's KV cache across steps instead: the same drafts."""
    name, max_drafts = "neural", 1

    def __init__(self, small_lm, k, alpha):
        self.lm, self.k, self.alpha = small_lm, k, alpha

    @torch.no_grad()
    def __call__(self, logprobs, context):
        return [rescore_locally(logprobs, context, self.k, self.alpha, self.logprobs_after)]

    def logprobs_after(self, seq):
        """The small LM's next-token log-probs after seq [V]: one pass over its window."""
        window = seq[window_start(len(seq), self.lm.config.block_size):]
        z = self.lm(torch.tensor([window], device=self.lm.lm_head.weight.device))[0, -1]
        return F.log_softmax(self.lm.lm_head(z), dim=-1)


class OracleDrafter:
    """Kim §6.3, for analysis only: it peeks at the greedy continuation (`answer` = prompt + greedy
    tokens) and proposes the lattice path that accepts the most (oracle_path). From any one
    context no drafter at the same k accepts more; over a whole generation a drafter can still
    end ahead now and then, because its steps start at different positions."""
    name, max_drafts = "oracle", 1

    def __init__(self, answer, k):
        self.answer, self.k = answer, k

    def __call__(self, logprobs, context):
        lat = head_lattice(logprobs, context, self.k)
        n = len(context)
        if self.answer[:n] != context:  # a sampled sequence left the greedy answer: heads' top path
            return [[context[-1]] + [cands[0] for cands in lat.tokens[1:]]]
        return [oracle_path(lat, self.answer[n - 1:n - 1 + lat.h])]
