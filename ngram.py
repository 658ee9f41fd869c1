"""Interpolated modified Kneser-Ney n-gram language model (pure Python).

Reference: S. F. Chen and J. Goodman, "An Empirical Study of Smoothing
Techniques for Language Modeling", TR-10-98, Harvard, 1998: section 3.5
(interpolated Kneser-Ney) and section 4.1.6 (modified Kneser-Ney, three
discounts).  Kim et al. (arXiv 2404.09221v2), section 7.2, rescore
blockwise-parallel drafts globally with an n-gram LM and leave how it was
trained to their Appendix C.3; this smoothing is our choice (a numpy twin
elsewhere reads `terms` and `gammas` and must reproduce `logprob` bit for
bit).

The input is one continuous token stream (e.g. characters), no sentence
markers.  V = vocab_size.  For context length j = 0 .. order-1, c_j is the
tuple of the last j history tokens (c_0 = ()), and with P_{-1}(w) = 1/V:

    P_j(w | c_j) = term_j(c_j, w) + gamma_j(c_j) * P_{j-1}(w | c_{j-1})
    term_j(c, w) = max(a_j(c w) - D_j(a_j(c w)), 0) / A_j(c)
    gamma_j(c)   = (D_j1 N1(c .) + D_j2 N2(c .) + D_j3+ N3+(c .)) / A_j(c)

a_j is the raw count c(c w) at the highest order (j = order-1) and the
continuation count N1+(. c w), the number of distinct tokens seen right
before c w, at lower orders.  A_j(c) = sum_w a_j(c w); at the highest order
that is the number of occurrences of c that are followed by something.
N_r(c .) counts the w with a_j(c w) = r (N3+: >= 3), and D_j(a) is D_j1,
D_j2 or D_j3+ for a = 1, 2, >= 3.  Since 0 < D_jr <= r, the terms at c sum
to exactly 1 - gamma_j(c), so every P_j sums to one over the vocabulary.
A context with A_j(c) = 0 (unseen, or seen only at the end of the stream)
has no entry: term 0 and gamma 1, i.e. pure back-off.

Discounts (Chen & Goodman eq. 26), per order, from the counts of counts
n_r = #{(c, w) : a_j(c w) = r} of that order's raw or continuation counts:

    Y = n1 / (n1 + 2 n2),  D1 = 1 - 2Y n2/n1,  D2 = 2 - 3Y n3/n2,
    D3+ = 3 - 4Y n4/n3.

Fallback (tiny corpora): if any of n1..n4 is zero, all three discounts are
DEFAULT_DISCOUNTS = (0.5, 1.0, 1.5); otherwise an estimate D_r outside
(0, r] is replaced by its default.  Zero is excluded as well as values
above r: D = 0 could make gamma = 0 and give unseen tokens probability 0.
"""
import math
from collections import Counter, defaultdict
from operator import index

DEFAULT_DISCOUNTS = (0.5, 1.0, 1.5)  # D1, D2, D3+ when the estimate fails


def discounts_from_counts_of_counts(n1, n2, n3, n4):
    """(D1, D2, D3+) from counts of counts, with the fallback rule above."""
    if min(n1, n2, n3, n4) == 0:
        return DEFAULT_DISCOUNTS
    y = n1 / (n1 + 2 * n2)
    estimates = (1 - 2 * y * n2 / n1, 2 - 3 * y * n3 / n2, 3 - 4 * y * n4 / n3)
    return tuple(d if 0 < d <= r else default for r, d, default
                 in zip((1, 2, 3), estimates, DEFAULT_DISCOUNTS))


def _distinct_ngrams(tokens, n):
    """Counter of the n-grams (tuples) of the stream."""
    return Counter(zip(*(tokens[i:] for i in range(n))))


def _continuation_counts(longer_grams):
    """N1+(. g) for every g: the number of distinct left extensions v g."""
    return Counter(gram[1:] for gram in longer_grams)


def _fit_order(counts):
    """terms, gammas and discounts of one order from its counts a(c w).

    `counts` maps (j+1)-gram tuples c + (w,) to raw or continuation counts.
    """
    coc = Counter(counts.values())
    d = discounts_from_counts_of_counts(coc[1], coc[2], coc[3], coc[4])
    # Per context: [A(c), N1(c .), N2(c .), N3+(c .)].
    stats = defaultdict(lambda: [0, 0, 0, 0])
    for gram, a in counts.items():
        s = stats[gram[:-1]]
        s[0] += a
        s[min(a, 3)] += 1
    terms = {}
    for gram, a in counts.items():
        ctx = gram[:-1]
        term = max(a - d[min(a, 3) - 1], 0) / stats[ctx][0]
        if term > 0:  # store only nonzero terms; absent means 0.0
            terms[(ctx, gram[-1])] = term
    gammas = {ctx: (d[0] * n1 + d[1] * n2 + d[2] * n3) / total
              for ctx, (total, n1, n2, n3) in stats.items()}
    return terms, gammas, d


class NgramLM:
    """Interpolated modified Kneser-Ney LM; see the module docstring.

    After `fit`, for j = 0 .. order-1:
      terms[j]:  {(context tuple of length j, w): term_j(c, w)}  (nonzero only)
      gammas[j]: {context tuple of length j: gamma_j(c)}  (() for j = 0)
      discounts[j]: (D1, D2, D3+) of that order.
    """

    def __init__(self, order: int, vocab_size: int):
        order, vocab_size = index(order), index(vocab_size)
        if order < 1:
            raise ValueError(f"order must be >= 1, got {order}")
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        self.order = order
        self.vocab_size = vocab_size
        self._reset()

    def _reset(self):
        # An unfitted (or empty-corpus) model is uniform: no terms, gamma 1.
        self.terms = [{} for _ in range(self.order)]
        self.gammas = [{} for _ in range(self.order)]
        self.discounts = [DEFAULT_DISCOUNTS] * self.order

    def _check(self, token):
        token = index(token)
        if not 0 <= token < self.vocab_size:
            raise ValueError(f"token id {token} out of range "
                             f"[0, {self.vocab_size})")
        return token

    def fit(self, tokens) -> "NgramLM":
        """Estimate the model from one continuous stream of token ids."""
        toks = list(map(index, tokens))
        if toks and (min(toks) < 0 or max(toks) >= self.vocab_size):
            bad = next(t for t in toks if not 0 <= t < self.vocab_size)
            self._check(bad)  # raises ValueError with the offending id
        self._reset()
        top = self.order - 1
        longer = _distinct_ngrams(toks, self.order)  # raw counts, top order
        for j in range(top, -1, -1):
            if j == top:
                counts = longer
            else:
                # Lower orders count distinct left extensions among the
                # (j+2)-grams, then move one order down.
                counts = _continuation_counts(longer)
                if j > 0:
                    longer = _distinct_ngrams(toks, j + 1)
            self.terms[j], self.gammas[j], self.discounts[j] = \
                _fit_order(counts)
        return self

    def logprob(self, token: int, history) -> float:
        """Natural log P(token | last order-1 tokens of history)."""
        token = self._check(token)
        k = min(self.order - 1, len(history))  # J, the longest context used
        ctx = tuple(self._check(t) for t in history[len(history) - k:])
        # Exactly this recursion (bottom up); the numpy twin mirrors it.
        p = 1.0 / self.vocab_size
        for j in range(0, k + 1):
            c = ctx[k - j:]
            p = self.terms[j].get((c, token), 0.0) + \
                self.gammas[j].get(c, 1.0) * p
        return math.log(p)

    def perplexity(self, tokens) -> float:
        """exp(-mean_i logprob(tokens[i], tokens[:i]))."""
        toks = list(tokens)
        if not toks:
            raise ValueError("perplexity of an empty sequence is undefined")
        n = self.order - 1
        total = sum(self.logprob(t, toks[max(0, i - n):i])
                    for i, t in enumerate(toks))
        return math.exp(-total / len(toks))
