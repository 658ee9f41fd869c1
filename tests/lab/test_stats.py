"""lab/stats.py on small inputs checked by hand."""
import pytest

from lab import stats


def block_efficiency(examples):
    """[(new tokens, calls), ...] -> sum of tokens / sum of calls."""
    return sum(t for t, _ in examples) / sum(c for _, c in examples)


def test_perfect_correlation_of_three_has_p_one_third():
    # 6 orderings of ys: r = +1 (identity), -1 (reversed), +-0.5 for the other four
    assert stats.exact_permutation_p([1, 2, 3], [1, 2, 3], stats.pearson) == pytest.approx(2 / 6)
    assert stats.exact_permutation_p([1, 2, 3], [3, 2, 1], stats.spearman) == pytest.approx(2 / 6)


def test_permutation_p_counts_ties_and_is_two_sided():
    # n = 4, rho = -0.4 (sum d^2 = 14): |rho| >= 0.4 in 18 of the 24 orderings, <= 0.2 in 6
    xs, ys = [1, 2, 3, 4], [2, 4, 3, 1]
    assert stats.spearman(xs, ys) == pytest.approx(-0.4)
    assert stats.exact_permutation_p(xs, ys, stats.spearman) == pytest.approx(18 / 24)
    # n = 5, rho = -0.7 (sum d^2 = 34): 28 of the 120 orderings have |rho| >= 0.7
    xs, ys = [1, 2, 3, 4, 5], [5, 4, 1, 3, 2]
    assert stats.spearman(xs, ys) == pytest.approx(-0.7)
    assert stats.exact_permutation_p(xs, ys, stats.spearman) == pytest.approx(28 / 120)


def test_permutation_p_undefined_and_too_many():
    assert stats.exact_permutation_p([1, 1, 1], [1, 2, 3], stats.pearson) is None
    with pytest.raises(ValueError, match="at most 8"):
        stats.exact_permutation_p(list(range(9)), list(range(9)), stats.pearson)
    with pytest.raises(ValueError, match="xs has 2"):
        stats.exact_permutation_p([1, 2], [1, 2, 3], stats.pearson)


def test_leave_one_out():
    # drop 1: r(2,3,4 ; 2,1,4) = 0.65..., drop 4: r(1,2,3 ; 1,2,1) = 0
    xs, ys = [1, 2, 3, 4], [1, 2, 1, 4]
    lo, hi = stats.leave_one_out(xs, ys, stats.pearson)
    expect = [stats.pearson(xs[:i] + xs[i + 1:], ys[:i] + ys[i + 1:]) for i in range(4)]
    assert (lo, hi) == (min(expect), max(expect)) and lo == pytest.approx(0.0)
    assert stats.leave_one_out([1, 2, 3], [1, 2, 3], stats.pearson) == (pytest.approx(1.0),
                                                                       pytest.approx(1.0))
    assert stats.leave_one_out([1, 1, 1], [1, 2, 3], stats.pearson) is None


def test_bootstrap_constant_data_has_zero_width():
    assert stats.bootstrap_interval([(3, 1)] * 10, block_efficiency) == (3.0, 3.0)


def test_bootstrap_is_seeded_and_brackets_the_estimate():
    examples = [(10, 5), (12, 3), (8, 4), (20, 5), (6, 3), (9, 3)]
    lo, hi = stats.bootstrap_interval(examples, block_efficiency)
    assert lo < block_efficiency(examples) < hi
    assert (lo, hi) == stats.bootstrap_interval(examples, block_efficiency)
    # the range of per-example block efficiencies bounds any resample's
    assert 2.0 <= lo and hi <= 4.0
    # two examples: the 4 equally likely resamples give 4/2, 8/3 (twice) and 12/4: lo 2, hi 3
    lo, hi = stats.bootstrap_interval([(2, 1), (6, 2)], block_efficiency, reps=4000)
    assert lo == pytest.approx(2.0) and hi == pytest.approx(3.0)


def test_summary():
    s = stats.summary([1, 2, 3], [1, 2, 3], stats.pearson, "r")
    assert s["r"] == pytest.approx(1.0) and s["n"] == 3 and s["p"] == pytest.approx(2 / 6)
    assert s["loo"] == [pytest.approx(1.0), pytest.approx(1.0)]
    assert stats.summary([1, 1], [1, 2], stats.pearson, "r") == {"r": None, "n": 2, "p": None,
                                                                  "loo": None}
