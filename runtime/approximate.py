"""approximate: Stern et al.'s APPROXIMATE acceptance rules (2018, §5, "approximate inference"),
at temperature 0 only, run only when named (`lab_decode(..., accept="top2")`, `python minibpd.py
--prompt TEXT --accept top2`, `--bench --approximate`). Their output is NOT greedy decoding's;
docs/approximate.md gives them exactly as implemented: topK (a drafted token passes when among
the verifier's k most likely) and minB (the first B - 1 drafted tokens pass unchecked); top1 and
min1 are the exact rule. A rule changes only what counts as the verifier's choice at each
position (`Relaxed.choices`); choosing the row and the prefix stays minibpd.GreedyRule's. Above
temperature 0 a relaxed rule has no meaning we could test, so it is refused.
"""
import re

import torch

from minibpd import GreedyRule, is_int
from runtime.kvcache import padded

EXACT = "exact"
SPEC = re.compile(r"(top|min)([1-9][0-9]{0,5})")


class Relaxed:
    """An APPROXIMATE acceptance rule (Stern §5): top-k selection (k) and a minimum block size
    (min_block), together if both are above 1. k = min_block = 1 accepts exactly what the exact
    rule accepts (tested: the same tokens and steps)."""
    approximate = True

    def __init__(self, k=1, min_block=1):
        for what, v in (("k", k), ("min_block", min_block)):
            if not is_int(v) or v < 1:
                raise ValueError(f"an approximate rule's {what} must be an integer >= 1, got {v!r}")
        self.k, self.min_block = int(k), int(min_block)

    @property
    def name(self):
        parts = [f"top{self.k}"] * (self.k > 1) + [f"min{self.min_block}"] * (self.min_block > 1)
        return "+".join(parts) or "top1"

    def __repr__(self):
        return f"Relaxed({self.name})"

    def passes(self, logits, drafted):
        """logits [P, m + 1, V] of the verification call, drafted [P, m] token ids -> [P, m]
        bools: whether drafted[j, i] passes at its position, the verifier's choice after draft
        j's first i drafted tokens (the rank of the drafted token among logits[j, i] below k, or
        i < min_block - 1)."""
        rows = logits[:, :drafted.shape[1]]                                   # [P, m, V]
        own = rows.gather(-1, drafted[..., None])                             # [P, m, 1]
        ids = torch.arange(rows.shape[-1], device=rows.device)
        ahead = ((rows > own) | ((rows == own) & (ids < drafted[..., None]))).sum(-1)
        forced = torch.arange(drafted.shape[1], device=rows.device) < self.min_block - 1
        return (ahead < self.k) | forced

    def choices(self, logits, drafts):
        """What minibpd.GreedyRule compares the drafts with, in place of the argmaxes: at each
        position the drafted token where it passes, else the verifier's argmax. logits
        [P, m + 1, V], drafts P lists of up to m + 1 ints (padded: runtime.kvcache.padded) -> P
        lists of m + 1 ints. A pad never passes: after a short draft's end comes the argmax."""
        best = logits.argmax(-1)                                              # [P, m + 1]
        if best.shape[1] > 1:
            drafted = torch.tensor(padded([d[1:] for d in drafts]), device=best.device)
            own = torch.tensor([len(d) - 1 for d in drafts], device=best.device)   # [P]
            real = torch.arange(drafted.shape[1], device=best.device) < own[:, None]
            ok = self.passes(logits, drafted) & real                          # [P, m]
            best[:, :-1] = torch.where(ok, drafted, best[:, :-1])
        return best.tolist()


def rule(spec, temperature=0.0):
    """The acceptance rule `spec` names: None for "exact" (None too: minibpd's exact rule), else
    a Relaxed: "topK" (top-k selection), "minB" (minimum block size B), or a Relaxed itself.
    An approximate rule above temperature 0 is refused (ValueError)."""
    if spec is None or spec == EXACT:
        return None
    if isinstance(spec, Relaxed):
        relaxed = spec
    elif isinstance(spec, str) and SPEC.fullmatch(spec):
        kind, size = SPEC.fullmatch(spec).groups()
        relaxed = Relaxed(k=int(size)) if kind == "top" else Relaxed(min_block=int(size))
    else:
        raise ValueError(f"the acceptance rule must be 'exact' or an approximate one: 'topK' or "
                         f"'minB' (K, B integers >= 1, e.g. 'top2', 'min3') or a "
                         f"runtime.approximate.Relaxed; got {spec!r}")
    if temperature != 0:
        raise ValueError(f"the acceptance rule {relaxed.name!r} is approximate (Stern §5) and "
                         f"defined for greedy decoding only, not at temperature {temperature}: "
                         "sampling keeps the exact rule")
    return relaxed


class RelaxedRule(GreedyRule):
    """minibpd.GreedyRule with a Relaxed rule's choices: the drafted token where it passes."""

    def __init__(self, model, relaxed):
        super().__init__(model)
        self.relaxed = relaxed

    def choices(self, z, drafts):
        return self.relaxed.choices(self.logits(z), drafts)
