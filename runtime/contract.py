"""contract: the drafter contract (minibpd.ArgmaxDrafter's docstring states it), checked before
anything a drafter hands back is used: the numbers it declares (max_drafts, max_draft_tokens),
its drafts and, for a sampling drafter, its declared q. bpd_decode calls its drafter through a
CheckedDrafter; the test suite's --drafter option checks the same rules.
"""
from operator import index

import torch

from minibpd import declared, is_int
from runtime.sampling import check_proposal


class DrafterError(RuntimeError):
    """A drafter (or its factory) raised: its own failure, not bad input to the decoder."""


class CheckedDrafter:
    """A drafter as the decode loop calls it. Its declared numbers are read and checked once
    (a drafter that changes them later is held to the first: the cache was sized by them); each
    answer is checked against the contract (check_answer) and handed back as fresh lists, and
    an exception inside the drafter becomes a DrafterError naming it. At temperature T > 0 a
    drafter with sample(logprobs, context, T, generator) -> (drafts, q) is called that way, with
    a generator of its own each call (drafter_generator) and its q checked (exact only if q is
    the distribution the drafts were drawn from: runtime/sampling.py; `pytest --drafter`
    tests it). `keep_rng`: torch's global generator is put back after each call, so that a
    drafter that reseeds it cannot make the next run draw the same seed (the loop's own
    generator is seeded from it). Every other attribute (name, counts, ...) is the drafter's
    own."""

    def __init__(self, drafter, model, temperature=0.0, generator=None, keep_rng=False):
        self.drafter, self.V, h = drafter, model.config.vocab_size, model.config.n_bpd_heads
        self.name, self.max_drafts, self.max_draft_tokens = declared(drafter, h)
        self.sampling = temperature > 0 and hasattr(drafter, "sample")
        self.temperature, self.generator = float(temperature), generator   # numpy's too
        self.keep_rng, self.q = keep_rng, None     # q: the proposal declared in the last call

    def __getattr__(self, attr):            # only for attributes not set above
        if attr == "drafter":
            raise AttributeError(attr)
        return getattr(self.drafter, attr)

    def __call__(self, logprobs, context):
        rows, first = len(logprobs), context[-1]       # before the drafter can change them
        state = torch.get_rng_state() if self.keep_rng else None
        try:
            if self.sampling:
                own = drafter_generator(self.generator)
                drafts, q = self.drafter.sample(logprobs, context, self.temperature, own)
            else:
                drafts, q = self.drafter(logprobs, context), None
        except (Exception, SystemExit, GeneratorExit) as e:     # sys.exit() too: its failure
            raise DrafterError(f"drafter {self.name} failed: {type(e).__name__}: {e}") from e
        finally:
            if state is not None:
                torch.set_rng_state(state)
        longest = rows       # past the heads only as declared, and not with a q (a row per head)
        if hasattr(self.drafter, "max_draft_tokens") and not self.sampling:
            longest = max(rows, self.max_draft_tokens + 1)
        out = check_answer(drafts, rows, first, self.V, self.max_drafts, self.name, longest)
        self.q = check_proposal(q, out, self.V, self.name) if self.sampling else None
        return out


def drafter_generator(generator):
    """A sampling drafter's generator for one call, seeded by one draw from the loop's own: what
    the drafter does to it (reseed it, restore it) cannot reach verification's draws, nor its
    next call's."""
    return torch.Generator().manual_seed(int(torch.randint(2 ** 62, (1,), generator=generator)))


def max_drafts(drafter):
    """The drafts a drafter declares it returns at most (minibpd.declared: checked)."""
    return declared(drafter, 1)[1]


def max_draft_tokens(drafter, h):
    return declared(drafter, h)[2]


BOOLS = ("torch.bool", "bool")      # the dtypes of torch's and numpy's bools, by name


def token_ids(items):
    """A sequence of integer token ids as a new list of ints; TypeError otherwise (bools too:
    True is not a token, nor is a torch or numpy bool, which index() reads as 1)."""
    if isinstance(items, (str, bytes)) or str(getattr(items, "dtype", "")) in BOOLS:
        raise TypeError("not token ids")
    items = list(items)
    if any(type(t) is not int and (isinstance(t, bool) or str(getattr(t, "dtype", "")) in BOOLS)
           for t in items):
        raise TypeError("a bool is not a token id")
    return [index(t) for t in items]


def check_answer(drafts, size, first, V, limit, name, longest=None):
    """A drafter's answer checked by the rules of minibpd.check_drafts, each broken one named with
    a hint to mend it -> the drafts as new lists of ints, or a ValueError naming the rule broken
    and the drafter (`name`). Each draft holds `size` ints, or from `size` to `longest` where a
    drafter declares max_draft_tokens. At most p x h ints: microseconds."""
    longest = size if longest is None else longest
    def broken(rule, detail):
        return ValueError(f"drafter {name} broke the drafter contract "
                          f"({rule}): {detail}")
    if isinstance(drafts, (list, tuple)) and drafts and all(is_int(t) for t in drafts):
        raise broken("1..max_drafts drafts", f"return a list of drafts, each a list of ints; got "
                                             f"one flat list of {len(drafts)} ints: wrap it in a "
                                             "list, [draft]")
    if not isinstance(drafts, (list, tuple)) or not 1 <= len(drafts) <= limit:
        got = f"{len(drafts)}" if isinstance(drafts, (list, tuple)) else f"a {type(drafts).__name__}"
        raise broken("1..max_drafts drafts", f"return a list of 1 to {limit} drafts; got {got}")
    out = []
    for j, d in enumerate(drafts):
        if not isinstance(d, (list, tuple)):
            hint = " (call .tolist())" if hasattr(d, "tolist") else ""
            raise broken("lists of ints", f"draft {j} is a {type(d).__name__}{hint}")
        if not size <= len(d) <= longest:
            most = f"{size} tokens, one per row of logprobs" if longest == size else \
                f"{size} (one per row of logprobs) to {longest} (max_draft_tokens + 1) tokens"
            raise broken("length", f"each draft has {most}; draft {j} has {len(d)}")
        try:
            d = token_ids(d)
        except TypeError:
            raise broken("lists of ints", f"draft {j} holds a non-integer token") from None
        if d[0] != first:
            raise broken("first token", f"each draft starts with context[-1] = {first}, the "
                                        f"verified token; draft {j} starts with {d[0]}")
        if min(d) < 0 or max(d) >= V:
            raise broken("ids in [0, V)", f"draft {j} holds {min(d) if min(d) < 0 else max(d)}, "
                                          f"outside [0, {V})")
        out.append(d)
    return out
