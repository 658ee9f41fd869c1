"""stats: how much a handful of numbers can hold, in pure Python (task_runs.py's `--tasks` uses it).

With five tasks a correlation coefficient alone says little; these say how little:

    exact_permutation_p(xs, ys, pearson)      # two-sided p over all n! pairings (n <= 8)
    leave_one_out(xs, ys, pearson)            # (min, max) of the coefficient, each point dropped
    bootstrap_interval(per_example, stat)     # 95% percentile interval, examples resampled

`statistic` is any function of (xs, ys) -> a number or None (undefined, e.g. a constant input),
such as the coefficients defined first here, pearson and spearman; bootstrap_interval's is a
function of a list of examples (task_runs.py: analysis.block_eff of a run's stats).
"""
import itertools
import math
import random
import statistics

MAX_EXACT = 8           # 8! = 40,320 pairings: exact; more would take long in pure Python
PERMUTATION_TIE = 1e-12    # a permuted coefficient this close to the observed one counts as equal


def pearson(xs, ys):
    if len(xs) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sx = math.sqrt(sum((x - mx) ** 2 for x in xs))
    sy = math.sqrt(sum((y - my) ** 2 for y in ys))
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / (sx * sy) if sx and sy else None


def ranks(xs):
    """Ranks from 0, tied values given their mean rank (Spearman's rho is Pearson's r on them)."""
    order = sorted(xs)
    return [sum(i for i, v in enumerate(order) if v == x) / order.count(x) for x in xs]


def spearman(xs, ys):
    """Spearman's rho: Pearson's r on the ranks."""
    return pearson(ranks(xs), ranks(ys))


def exact_permutation_p(xs, ys, statistic):
    """Two-sided exact permutation p: the fraction of all n! orderings of ys whose |statistic|
    is >= the observed |statistic| (the observed ordering included, so p >= 1/n! * ties).
    None if the observed statistic is undefined."""
    n = len(xs)
    if n != len(ys):
        raise ValueError(f"xs has {n} values, ys {len(ys)}")
    if n > MAX_EXACT:
        raise ValueError(f"an exact permutation test over {n}! orderings is too slow here "
                         f"(at most {MAX_EXACT} values)")
    observed = statistic(xs, ys)
    if observed is None:
        return None
    hits = 0
    for perm in itertools.permutations(ys):
        value = statistic(xs, list(perm))
        hits += value is not None and abs(value) >= abs(observed) - PERMUTATION_TIE
    return hits / math.factorial(n)


def leave_one_out(xs, ys, statistic):
    """(min, max) of the statistic over the n subsets that drop one point each (None values
    left out); None if no subset gives a value."""
    values = [statistic(xs[:i] + xs[i + 1:], ys[:i] + ys[i + 1:]) for i in range(len(xs))]
    values = [v for v in values if v is not None]
    return (min(values), max(values)) if values else None


def bootstrap_interval(values_per_example, statistic, reps=1000, seed=0):
    """(lo, hi): the 2.5th and 97.5th percentiles (linear interpolation, as numpy's default) of
    the statistic over `reps` resamples of the examples with replacement, seeded."""
    items = list(values_per_example)
    if not items:
        raise ValueError("no examples to resample")
    rng = random.Random(seed)
    draws = [statistic(rng.choices(items, k=len(items))) for _ in range(reps)]
    cuts = statistics.quantiles(draws, n=40, method="inclusive")
    return cuts[0], cuts[-1]


def summary(xs, ys, statistic, key):
    """{key: coefficient, "n", "p": exact permutation p, "loo": [min, max] or None} (a
    coefficient that is None has p and loo None too)."""
    value = statistic(xs, ys)
    loo = leave_one_out(xs, ys, statistic) if value is not None else None
    p = exact_permutation_p(xs, ys, statistic) if value is not None else None
    return {key: value, "n": len(xs), "p": p, "loo": list(loo) if loo else None}

