"""sampling: lossless sampling with BPD drafts (speculative sampling), in a few readable lines.

Kim et al. leave sampling to future work; Stern et al. define BPD for greedy decoding. The
speculative sampling rule (Leviathan, Kalman, Matias 2023; Chen et al. 2023) makes any draft
*lossless*: the output is distributed exactly as sampling the base model one token at a time.

The rule, for a draft token x proposed with probability q(x), where the base model wants p:
    accept x with probability min(1, p(x) / q(x));
    on rejection, sample from the residual  max(0, p - q) / sum(max(0, p - q)).
Then P(output = y) = min(p(y), q(y)) + (1 - sum_x min(p(x), q(x))) * residual(y) = p(y).
A deterministic draft token d is the case q = one-hot(d): accept d with probability p(d), else
sample from p with d removed and renormalised.

Several drafts (p-best) share prefixes, so they form a tree. SpecInfer's multi-draft rule (Miao
et al. 2024) walks it: at a node, try its distinct children in order, each accepted with its
probability under the *current* residual r, and r <- residual(r, q_child) after each rejection;
an accepted child becomes the node; when every child is rejected (or at a leaf), the next token
is sampled from r. With one-hot proposals each child is tried with probability r(child): the walk
samples the node's token from p exactly, so the whole output is exact.

Temperature 0 is greedy decoding: target_probs is then a one-hot on the argmax, and the decode
loop takes its greedy rule (minibpd.accept_greedy) instead. minibpd.HeadSampler is the drafter
that declares a proposal q.
"""
import torch
import torch.nn.functional as F


def target_probs(logits, temperature):
    """The base model's next-token distribution, [..., V] -> [..., V]: the one definition every
    path samples from. Temperature 0: a one-hot on the argmax (ties: the smallest id, as argmax)."""
    if temperature == 0:
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    return F.softmax(logits / temperature, dim=-1)


def check_temperature(temperature):
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or \
            not 0 <= temperature < float("inf"):
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")


def accept_probability(r, proposal, token):
    """Probability of accepting `token`, proposed with `proposal` [V], when the target is r [V]."""
    return min(1.0, float(r[token] / proposal[token]))


def residual(r, proposal):
    """Where the target's mass goes after a rejection: max(0, r - proposal), normalised."""
    left = (r - proposal).clamp_min(0)
    total = left.sum()
    return left / total if total > 0 else r   # total 0 only if r == proposal: never rejected


def verify_sampled(probs, proposed, q=None, generator=None):
    """Verify + accept under sampling (the rule above). probs [P, m + 1, V] (float64, CPU):
    row j's position i is the target after proposed[j][:i]. proposed: P drafts of m tokens. q:
    None (deterministic drafts) or [m, V], the proposal of a single sampled draft's token i (q[i]
    proposed proposed[0][i]). -> (row, accepted count a, next token, tries), tries listing
    (depth, token, acceptance probability, accepted) for the demo."""
    rows, depth, tries = list(range(len(proposed))), 0, []
    while True:
        r = probs[rows[0], depth]                   # every row in `rows` shares this node's path
        children = list(dict.fromkeys(proposed[j][depth] for j in rows if depth < len(proposed[j])))
        accepted = None
        for token in children:
            proposal = F.one_hot(torch.tensor(token), r.shape[-1]).to(r) if q is None else q[depth]
            a = accept_probability(r, proposal, token)
            ok = bool(torch.rand((), generator=generator, dtype=torch.float64) < a)
            tries.append((depth, token, a, ok))
            if ok:
                accepted = token
                break
            r = residual(r, proposal)
        if accepted is None:
            return rows[0], depth, int(torch.multinomial(r, 1, generator=generator)), tries
        rows = [j for j in rows if depth < len(proposed[j]) and proposed[j][depth] == accepted]
        depth += 1
