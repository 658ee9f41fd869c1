"""The drafter contract (minibpd.ArgmaxDrafter's docstring states it), checked before anything a
drafter hands back is used: the numbers it declares (max_drafts, max_draft_tokens) and its
drafts. bpd_decode calls these at every step; the test suite's --drafter option calls them too."""
from runtime.kvcache import is_int, token_ids


def declared(drafter, attr, default, least):
    """A number the drafter declares (the contract): max_drafts (default 1, at least 1) or
    max_draft_tokens (default h - 1, at least 0), checked."""
    n = getattr(drafter, attr, default)
    if not is_int(n) or n < least:
        raise ValueError(f"drafter {drafter_name(drafter)}: {attr} must be an integer >= {least}, "
                         f"got {n!r}")
    return n


def max_drafts(drafter):
    return declared(drafter, "max_drafts", 1, 1)


def max_draft_tokens(drafter, h):
    return declared(drafter, "max_draft_tokens", h - 1, 0)


def drafter_name(drafter):
    return getattr(drafter, "name", None) or type(drafter).__name__


def longest_draft(drafter, rows, h, sampling=False):
    """The most tokens a draft may hold when the heads give `rows` rows: `rows`, or up to
    max_draft_tokens + 1 for a drafter that declares it (drafts past the heads; not with a
    declared q, which has one row per head)."""
    if sampling or not hasattr(drafter, "max_draft_tokens"):
        return rows
    return max(rows, max_draft_tokens(drafter, h) + 1)


def check_drafts(drafts, size, first, V, limit, drafter, longest=None):
    """The drafter contract (see ArgmaxDrafter) -> the drafts as new lists of ints, or a
    ValueError naming the rule broken and the drafter. Each draft holds `size` ints, or from
    `size` to `longest` where a drafter declares max_draft_tokens. At most p x h ints:
    microseconds."""
    longest = size if longest is None else longest
    def broken(rule, detail):
        return ValueError(f"drafter {drafter_name(drafter)} broke the drafter contract "
                          f"({rule}): {detail}")
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
