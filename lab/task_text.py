"""task_text: what every task's examples are cut with (tasks.py builds them): the length
limits, a stable hash of an example's key that picks its split (split_of) and seeds its choices
(rng), cutting text at a line or word boundary, a docstring's summary, and deduplication."""
import hashlib
import random
import re

SPLITS = ("train", "tune", "test")   # split_of's
PROMPT_MAX = 380       # characters of prompt (the fine-tuning window is WINDOW characters)
WINDOW = 512           # prompt + target
TARGET_MAX = 160


def digest(key):
    """A stable 64-bit integer for a key (hashlib: `hash()` changes from run to run)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


def split_of(key):
    """80 / 10 / 10 by the key's hash: train, tune, test."""
    return {8: "tune", 9: "test"}.get(digest(key) % 10, "train")


def rng(key):
    """A random.Random seeded by the key: the same choices on every run and machine."""
    return random.Random(digest("seed:" + key))


def keep_tail(text, limit, words=False):
    """The longest end of `text` of <= limit characters that starts at a line boundary, or with
    words=True at a word boundary when no line boundary keeps at least half; None if none."""
    start = len(text) - limit
    if start <= 0 or text[start - 1] == "\n":
        return text[max(start, 0):] or None
    tail = text[start:]
    line = tail.find("\n") + 1          # 0: no line boundary inside the tail
    if line and (not words or line <= limit // 2):
        return tail[line:] or None
    if words and text[start - 1].isspace() and not tail[0].isspace():
        return tail
    space = re.search(r"\s\S", tail) if words else None
    return tail[space.start() + 1:] if space else None


def paragraphs(doc):
    return [p for p in re.split(r"\n\s*\n", doc.strip()) if p.strip()]


def doc_summary(doc):
    """PEP 257's summary: the docstring's first paragraph as one line. Not the first line: in a
    fifth of the stdlib's docstrings (1,097 of 5,253 in Python 3.11) the first paragraph runs on
    past it, so the first line alone is often half a sentence."""
    return " ".join(paragraphs(doc)[0].split()) if doc and doc.strip() else ""


def dedupe(pool):
    """(key, prompt, target) sorted by key -> the first of each repeated prompt only, so that a
    prompt copied between modules cannot land in two splits."""
    kept = {}
    for key, prompt, target in pool:
        kept.setdefault(prompt, (key, prompt, target))
    return list(kept.values())
