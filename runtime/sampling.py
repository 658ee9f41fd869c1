"""sampling: lossless sampling with BPD drafts at temperature T > 0 (speculative sampling:
Leviathan et al. 2023; Chen et al. 2023), in a few readable lines; docs/exactness.md explains
why it is exact and where it comes from.

The rule, for a draft token x proposed with probability q(x), where the base model wants p:
    accept x with probability min(1, p(x) / q(x));
    on rejection, sample from the residual  max(0, p - q) / sum(max(0, p - q)).
Then P(output = y) = min(p(y), q(y)) + (1 - sum_x min(p(x), q(x))) * residual(y) = p(y).
A deterministic draft token d is the case q = one-hot(d).

Several drafts form a tree, which SpecInfer's multi-draft rule (Miao et al. 2024) walks: at a
node, try its children in order, each accepted with its probability under the *current*
residual r, and r <- residual(r, q_child) after each rejection; an accepted child becomes the
node; when every child is rejected (or at a leaf), the next token is sampled from r. Which
children are tried (children_to_try) depends on where the drafts came from:
- deterministic drafts: each distinct token once; the walk then samples the node's token from p
  exactly.
- drafts sampled i.i.d. from one declared proposal q (q[i]: every draft's token i): every
  draft's token, repeats included, in draft order: multi-round rejection sampling with i.i.d.
  proposals, exact for any number of them (de-duplicating would bias it). The drafts below an
  accepted child still hold i.i.d. draws from q[i + 1]. That q IS their distribution no check
  of one answer can see (check_proposal checks what it can): docs/exactness.md, "The
  precondition of a declared q".

At temperature 0 the decode loop takes minibpd.GreedyRule instead; SampledRule is the rule
above in its shape. decoders.HeadSampler is the drafter that declares a proposal q.
"""
import torch
import torch.nn.functional as F

from minibpd import check_temperature


def target_probs(logits, temperature):
    """The base model's next-token distribution, [..., V] -> [..., V]: softmax(logits / T), as
    minibpd.next_token draws from it (the one definition every path samples from). Temperature
    0: a one-hot on the argmax (ties: the smallest id, as argmax)."""
    if temperature == 0:
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    return F.softmax(logits / float(temperature), dim=-1)


def own_generator(generator, temperature):
    """The generator a sampling decode loop draws from: `generator`, or when None a fresh one,
    seeded once by one draw from torch's global generator (torch.manual_seed still reproduces a
    run), so that nothing inside the loop (a drafter calling torch.manual_seed, say) can reach
    its draws. Temperature 0 draws nothing: `generator` as given. Both checked first
    (minibpd.check_temperature)."""
    check_temperature(temperature, generator)
    if generator is not None or temperature == 0:
        return generator
    return torch.Generator().manual_seed(int(torch.randint(2 ** 62, (1,))))


def check_proposal(q, drafts, V, who):
    """A drafter's declared proposal, checked before any use: q [m + 1, V] (row i: the
    distribution its drafts' token i was drawn from, the precondition no check can see: the
    module's docstring; row 0, head 1's, is not used), finite, non-negative, rows 1..m summing
    to 1 within 1e-6, positive at every drafted token. -> q as float64 on the CPU, rows
    renormalised; or a ValueError naming the drafter (`who`)."""
    def broken(detail):
        return ValueError(f"drafter {who} broke the drafter contract (declared q): {detail}")
    m1 = len(drafts[0])
    if not isinstance(q, torch.Tensor) or tuple(q.shape) != (m1, V):
        got = tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__
        raise broken(f"sample() returns q as a tensor [{m1}, {V}] (one row per draft token); got {got}")
    if q.is_meta or q.is_complex():
        raise broken(f"q must hold real numbers one can read; got a {q.dtype} tensor on {q.device}")
    q = q.detach().to("cpu", torch.float64)
    if not torch.isfinite(q).all() or (q < 0).any():
        raise broken("q holds NaN, inf or negative entries")
    sums = q[1:].sum(-1)
    if m1 > 1 and (sums - 1).abs().max() > 1e-6:
        raise broken(f"each row of q sums to 1 (within 1e-6); got sums from {float(sums.min()):.6g} "
                     f"to {float(sums.max()):.6g}")
    at = q[torch.arange(1, m1)[None], torch.tensor([d[1:] for d in drafts]).view(len(drafts), -1)]
    if (at <= 0).any():
        raise broken("q is 0 at a drafted token: that token could not have been drawn from q")
    return torch.cat([q[:1], q[1:] / sums[:, None]]) if m1 > 1 else q


def children_to_try(tokens, sampled):
    """The children of a tree node to try, in order (see above): deterministic drafts each
    distinct token once; drafts sampled i.i.d. from a declared q every token, repeats included."""
    return list(tokens) if sampled else list(dict.fromkeys(tokens))


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
    None (deterministic drafts) or [m, V], the proposal every draft's token i was drawn from,
    i.i.d. (checked by check_proposal). -> (row, accepted count a, next token, tries), tries
    listing (depth, token, acceptance probability, accepted) for the demo."""
    rows, depth, tries = list(range(len(proposed))), 0, []
    while True:
        r = probs[rows[0], depth]                   # every row in `rows` shares this node's path
        children = children_to_try([proposed[j][depth] for j in rows if depth < len(proposed[j])],
                                   q is not None)
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


class SampledRule:
    """Accept at temperature T > 0 (verify_sampled), in minibpd.GreedyRule's shape: z [P, m + 1,
    C], drafts -> (row, kept, token, {"tries": ...}); `drafter` (a contract.CheckedDrafter) holds
    q, the proposal a sampling drafter declared for these drafts (None: deterministic drafts).
    Its draws come from the decode loop's own generator."""

    def __init__(self, model, temperature, generator, drafter=None):
        self.logits = getattr(model, "verified_logits", model.lm_head)
        self.temperature, self.generator, self.drafter = temperature, generator, drafter

    def __call__(self, z, drafts):
        probs = target_probs(self.logits(z).double(), self.temperature).cpu()   # [P, m + 1, V]
        q = getattr(self.drafter, "q", None)    # what the checked drafter declared this call
        row, kept, token, tries = verify_sampled(probs, [d[1:] for d in drafts],
                                                 None if q is None else q[1:], self.generator)
        return row, kept, token, {"tries": tries}
