"""loop: the lab's entry to minibpd's one decode loop (lab_decode: the lab's names resolved into
the objects bpd_decode calls, docs/layout.md "The hand-offs"), and greedy decoding of P
independent sequences at once (decode_rows, for training data).
"""
import torch

from minibpd import ArgmaxDrafter, GreedyRule, KVCache, Verifier, bpd_decode, check_request
from runtime import approximate
from runtime.contract import CheckedDrafter
from runtime.kvcache import check_cache_budget
from runtime.sampling import SampledRule, own_generator, target_probs
from runtime.tree import TreeVerifier

VERIFY_MODES = ("auto", "batch", "tree")


def acceptance_rule(model, temperature, generator, spec="exact", drafter=None):
    """The rule for `spec` and the temperature: GreedyRule (exact, T = 0), SampledRule (exact
    in distribution, T > 0; it reads the checked `drafter`'s declared q) or RelaxedRule (an
    APPROXIMATE rule of Stern §5, T = 0 only), the temperature checked first (check_request)."""
    relaxed = approximate.rule(spec, temperature)            # None: the exact rule
    if relaxed is not None:
        return approximate.RelaxedRule(model, relaxed)
    return GreedyRule(model) if temperature == 0 else \
        SampledRule(model, temperature, generator, drafter)


def verifier(model, drafter, mode="auto"):
    """A Verifier for the checked drafter's drafts: P rows ("batch"), one token tree ("tree"),
    or a tree when it returns several ("auto"); its cache checked against the budget first."""
    if mode not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {', '.join(VERIFY_MODES)}, got {mode!r}")
    n = drafter.max_drafts
    tree = mode == "tree" or (mode == "auto" and n > 1)
    spare = (n - 1) * drafter.max_draft_tokens if tree else 0  # a tree's extra nodes, at most
    try:
        check_cache_budget(model, 1 if tree else n, spare)
    except ValueError as e:                 # over the budget: whose drafts are they?
        raise ValueError(f"drafter {drafter.name}: max_drafts {n}: {e}") from None
    return TreeVerifier(model, spare) if tree else Verifier(model, n)


def lab_decode(model, prompt, max_new_tokens, drafter=None, temperature=0.0, generator=None,
               verify="auto", accept="exact"):
    """minibpd.bpd_decode with the lab's options, every one checked before any model call:
    temperature > 0 (speculative sampling: exactly sample_decode's distribution, drawn from
    `generator`), verify ("batch", "tree", "auto": a tree for several drafts), accept ("exact";
    Stern §5's APPROXIMATE "top2", ...: runtime/approximate.py). -> (new tokens, stats)."""
    seq = check_request(model, prompt, max_new_tokens, temperature, generator)
    check_cache_budget(model, 1)                # before a cache is allocated
    own = own_generator(generator, temperature)  # what every draw of the loop comes from
    checked = CheckedDrafter(ArgmaxDrafter() if drafter is None else drafter, model, temperature,
                             own, keep_rng=generator is None and temperature > 0)
    rule = acceptance_rule(model, temperature, own, accept, checked)
    return bpd_decode(model, seq, max_new_tokens, checked, temperature, own,
                      verifier(model, checked, verify), rule)


@torch.no_grad()
def decode_rows(model, rows, n, temperature=0.0, generator=None, states=None):
    """rows [P, L] -> [P, L + n]: P independent sequences of one length, each continued one token
    per model call with the KV cache (each row its own sequence), in greedy_decode's windows.
    `states`, a list, gains each call's final hidden states z [P, C] (the states that chose the
    new tokens: self-distillation keeps them)."""
    cache, generator = KVCache(model, rows=len(rows)), own_generator(generator, temperature)
    for _ in range(n):
        fed = len(cache.tail(range(rows.shape[1])))     # how many tokens the cache lacks
        z = model(rows[:, -fed:], cache)[:, -1]                                 # [P, C]
        cache.advance(fed, row=None)
        if states is not None:
            states.append(z)
        logits = model.lm_head(z)                                               # [P, V]
        new = logits.argmax(-1, keepdim=True) if temperature == 0 else torch.multinomial(
            target_probs(logits.double(), temperature).cpu(), 1, generator=generator)
        rows = torch.cat([rows, new.to(rows.device)], dim=1)
    return rows
