"""budgets: the one home of the drafters' settings checks and budgets (ours, for speed and
safety; the papers have none), each below with its use; docs/limits.md gives their costs."""
import math

from minibpd import is_int

MAX_ORDER = 8            # n-gram orders above this take minutes to fit in pure Python
MAX_DP_CELLS = 2 ** 22   # the most partial-path scores the p-best DP may hold at one position


def check_settings(k=1, p=1, alpha=0.0, order=1, nodes=0):
    """Clear errors for impossible settings (k larger than the vocabulary is clamped to it): the
    one check of every drafter, the registry, tuned files and the command line."""
    for name, value in (("k", k), ("p", p), ("order", order)):
        if not is_int(value) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not is_int(nodes) or nodes < 0:
        raise ValueError(f"nodes must be an integer >= 0 (0: no budget), got {nodes!r}")
    if order > MAX_ORDER:
        raise ValueError(f"order must be at most {MAX_ORDER} (a higher-order n-gram LM takes "
                         f"minutes to fit and the DP grows as k^order), got {order}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")


def dp_cells(k, p, order, V):
    """Most partial-path scores the p-best DP holds at one position: the candidates of the last
    `order` positions (the LM's state and the new token) x p. 5-gram, k=8, p=16: 524,288."""
    return min(k, V) ** order * p


def check_dp_budget(k, p, order, V):
    """Refuse, up front, a DP over MAX_DP_CELLS (docs/limits.md gives its cost)."""
    cells = dp_cells(k, p, order, V)
    if cells > MAX_DP_CELLS:
        raise ValueError(f"k={k}, p={p} with an order-{order} LM would make the p-best DP hold "
                         f"min(k, V)^order x p = {cells:,} scores a step; the budget is "
                         f"{MAX_DP_CELLS:,} (lower k, p or the order)")


def lattice_lookups(positions, k, V, order):
    """(context, token) LM evaluations the p-best DP makes on a lattice of `positions` positions
    (the first certain): at position i, one per state x candidate."""
    K = [1] + [min(k, V)] * (positions - 1)
    return sum(math.prod(K[max(0, i - order + 1):i + 1]) for i in range(positions))


def within_budget(drafts, nodes):
    """The drafts, best first, as long as their token tree (shared prefixes once, the certain
    first token not counted) holds at most `nodes` drafted tokens; the best draft always. The
    p best paths' trie truncated at whole paths: every draft keeps its full length, so the
    contract holds and the verified tokens per call stay at most max(nodes, m)."""
    kept, seen = [], set()
    for d in drafts:
        new = [tuple(d[:i + 1]) for i in range(1, len(d)) if tuple(d[:i + 1]) not in seen]
        if kept and len(seen) + len(new) > nodes:
            continue
        kept.append(d)
        seen.update(new)
    return kept
