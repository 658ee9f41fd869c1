"""drawable: what a drafter's explain() says, checked against what the trace page (lab/trace.html)
draws for its kind, before it is written. The page draws a "lattice", "neural", "lookup" or
"error" explanation from named fields (any other kind is shown as JSON); a field it cannot draw
would stop its script and leave the page blank, so check_drawable() names the field instead
(lab/trace.py shows it as the step's error note).
"""
import numbers

from minibpd import is_int

MAX_COLUMNS = 1024      # a neural explanation's k: the page draws k columns for it


class Undrawable(ValueError):
    """An explanation with a field the page cannot draw (the message names it)."""


def check_drawable(said):
    """Undrawable naming the first field of `said` the page cannot draw; None where it can."""
    if isinstance(said, dict) and said.get("kind") in CHECKS:
        CHECKS[said["kind"]](said, "")


def need(ok, field, what):
    if not ok:
        raise Undrawable(f"field {field!r} must be {what}")


def is_number(x):               # a score: a real number or None (JSON's null, a non-finite one)
    return x is None or isinstance(x, numbers.Real) and not isinstance(x, bool)


def is_token_id(x):
    return is_int(x) and x >= 0


def scored(c):                  # one candidate: [token, heads' log-prob, LM log-prob, score]
    return isinstance(c, list) and len(c) == 4 and is_token_id(c[0]) and all(map(is_number, c[1:]))


def lattice(x, at):
    """kind "lattice" (decoders.fastlattice.explained_lattice): positions, cells (one row of
    candidates, or None, per position), k (the longest row), paths of at most positions tokens."""
    h, cells, paths = x.get("positions"), x.get("cells"), x.get("paths")
    need(is_int(h) and h >= 1, at + "positions", "an integer >= 1")
    need(isinstance(cells, list) and len(cells) == h and all(isinstance(r, list) for r in cells),
         at + "cells", f"a list of {h} lists (one per position)")
    need(all(c is None or scored(c) for r in cells for c in r), at + "cells",
         "lists of candidates [token id, heads' log-prob, LM log-prob or None, score] or None")
    need(x.get("k") == max(map(len, cells)), at + "k",
         f"the most candidates at a position ({max(map(len, cells))})")
    need(is_number(x.get("alpha")), at + "alpha", "a number or None")
    need(x.get("order") is None or is_int(x["order"]) and x["order"] >= 1, at + "order",
         "an integer >= 1 (the LM's) or None")
    need(isinstance(paths, list) and all(isinstance(p, dict) for p in paths), at + "paths",
         "a list of {score, tokens}")
    for p in paths:
        tokens = p.get("tokens")
        need(isinstance(tokens, list) and len(tokens) <= h and all(map(is_token_id, tokens)),
             at + "paths.tokens", f"a list of at most {h} token ids")
        need(is_number(p.get("score")), at + "paths.score", "a number")


def neural(x, at):
    """kind "neural" (decoders.neural): k, alpha, positions with the candidates of each."""
    k, positions = x.get("k"), x.get("positions")
    need(is_int(k) and 1 <= k <= MAX_COLUMNS, at + "k", f"an integer from 1 to {MAX_COLUMNS}")
    need(is_number(x.get("alpha")), at + "alpha", "a number")
    need(isinstance(positions, list) and all(isinstance(p, dict) for p in positions),
         at + "positions", "a list of {chosen, rescored, candidates}")
    for p in positions:
        c = p.get("candidates")
        need(isinstance(c, list) and len(c) <= k and all(map(scored, c)), at + "positions.candidates",
             f"a list of at most k = {k} candidates [token id, heads' log-prob, LM log-prob or None, "
             "score]")
        need(is_token_id(p.get("chosen")), at + "positions.chosen", "a token id")


def lookup(x, at):
    """kind "lookup" (decoders.lookup): the copy and where it matched; a base drafter's lattice."""
    copy = x.get("copy")
    need(isinstance(copy, list) and all(map(is_token_id, copy)), at + "copy", "a list of token ids")
    need(is_int(x.get("ngram")) and x["ngram"] >= 1, at + "ngram", "an integer >= 1")
    need(is_int(x.get("matched")) and x["matched"] >= 0, at + "matched", "an integer >= 0")
    for field in ("match_start", "copy_start"):
        need(x.get(field) is None or is_token_id(x[field]), at + field,
             "a position (an integer >= 0) or None")
    base = x.get("base")
    if isinstance(base, dict) and base.get("kind") == "lattice":
        lattice(base, at + "base.")


def error(x, at):
    need(isinstance(x.get("error"), str), at + "error", "a string")


CHECKS = {"lattice": lattice, "neural": neural, "lookup": lookup, "error": error}
