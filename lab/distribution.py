"""distribution: the check that replaces exactness at temperature T > 0. There every decoder must
sample the base model's distribution, so the first drafted token (the 2nd new token) is drawn
many times and compared with its exact distribution; beside it, the share of draft tokens
accepted (what temperature takes away).
"""
import math
from collections import Counter

import torch

import decoders
from minibpd import window_start
from runtime.kvcache import device_of
from runtime.loop import lab_decode
from runtime.sampling import target_probs


@torch.no_grad()
def second_token(model, prompt, T):
    """Exact distribution [V] of the 2nd new token: sum_x p(x | prompt) p(y | prompt + x)."""
    V, B, dev = model.config.vocab_size, model.config.block_size, device_of(model)
    t = len(prompt)
    z = model(torch.tensor([prompt[window_start(t, B):t]], device=dev))[0, -1]
    p1 = target_probs(model.lm_head(z).double(), T).cpu()                            # [V]
    rows = torch.tensor([prompt[window_start(t + 1, B):] + [x] for x in range(V)], device=dev)
    return p1 @ target_probs(model.lm_head(model(rows)[:, -1]).double(), T).cpu()   # [V]


def distribution_check(model, make, prompt, T, seed, runs=1000, top=9):
    """The first drafted token (the 2nd new token) against its exact distribution, coarsened to
    its `top` likeliest tokens + 'other' (a coarsening keeps a correct sampler correct). L1
    distance of `runs` draws, and the bound it exceeds with probability < 1e-6 for a correct
    sampler (test_sampling.py explains it)."""
    marginal = second_token(model, prompt, T)
    keep = marginal.argsort(descending=True)[:top].tolist()
    cat = {tok: i for i, tok in enumerate(keep)}
    gen, counts = torch.Generator().manual_seed(seed), Counter()
    for _ in range(runs):
        counts[cat.get(lab_decode(model, prompt, 2, make(), T, gen)[0][1], top)] += 1
    exact = marginal[keep].tolist() + [1 - float(marginal[keep].sum())]
    l1 = sum(abs(counts[i] / runs - p) for i, p in enumerate(exact))
    bound = math.sqrt(2 / runs * math.log((2 ** (top + 1) - 2) / 1e-6))
    return {"l1": l1, "bound": bound, "runs": runs, "ok": l1 < bound}


def accepted_share(steps):
    """Share of the tried draft tokens that were accepted (what temperature takes away)."""
    tries = [ok for s in steps for _, _, _, ok in s["tries"]]
    return sum(tries) / max(1, len(tries))


def sampled_sections(run, runs):
    """At run.temperature T > 0: distribution_check per decoder (seeded by run.seed), on the
    prompt whose 2nd token is least certain (highest exact entropy: where the check is most
    telling), and the share of draft tokens accepted in `runs` (decode_all's)."""
    T, prompts = run.temperature, run.prompts
    entropy = [float(-(m * m.clamp_min(1e-300).log()).sum()) for m in
               (second_token(run.model, p, T) for p in prompts)]
    at = entropy.index(max(entropy))
    answer = run.answer_keys()[at]
    check = {name: distribution_check(run.model, lambda: decoders.make(name, run.res,
                                                                       run.chosen[name], answer),
                                      prompts[at], T, run.seed)
             for name in decoders.active()}
    return {"distribution_check": check, "distribution_check_prompt": at,
            "acceptance": {k: accepted_share([s for r in v for s in r["steps"]])
                           for k, v in runs.items()}}
