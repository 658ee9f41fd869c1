"""task_lm: the `lm` task's examples (LAMBADA-like: pydoc_data.topics prose cut at a word
boundary -> its next <= LM_TARGET characters), split as the base model's own corpus was (tasks.py
builds them)."""
import functools
import itertools
import re

from lab.task_text import PROMPT_MAX, WINDOW, keep_tail
from train_heads import chunk_size, chunk_split, clean_text


# A hash split of paragraphs would put most test targets in the base model's training text
# (docs/tasks.md), so `lm` takes each paragraph's split from the base model's split of the same
# text (train_heads.split_corpus): lm/tune and lm/test lie in its tune and test text.

LM_TARGET, LM_STRIDE, LM_MIN_PROMPT, LM_MIN_HEAD = 128, 64, 64, 24


@functools.lru_cache(maxsize=1)
def topics_text():
    """(text, topic starts): the base model's corpus exactly (train_heads.load_corpus: the
    cleaned topics in sorted order, joined by a blank line) and [(offset, topic name)]."""
    import pydoc_data.topics
    names = sorted(pydoc_data.topics.topics)
    parts = [clean_text(pydoc_data.topics.topics[k]).strip("\n") for k in names]
    offsets = itertools.accumulate([len(part) + 2 for part in parts], initial=0)   # 2: "\n\n"
    return "\n\n".join(parts) + "\n", list(zip(offsets, names))


def base_split(text):
    """Two functions of an offset into `text`: the base model's split of that character (the
    rule of train_heads.split_corpus), and the first offset of the run of same-split chunks
    holding it."""
    chunk = chunk_size(text)
    of = lambda j: chunk_split(j // chunk)

    def run_start(j):
        c = j // chunk
        while c > 0 and of((c - 1) * chunk) == of(j):
            c -= 1
        return c * chunk
    return of, run_start


def is_prose(paragraph):
    """Mostly words (letters and spaces) and no grammar rules: not code, tables or grammar."""
    letters = sum(c.isalpha() or c == " " for c in paragraph)
    return (len(paragraph) >= LM_TARGET and letters >= 0.8 * len(paragraph)
            and "::=" not in paragraph)


def tiles(text, start, end):
    """(cut, stop) spans of <= LM_TARGET characters in the paragraph text[start:end], the first
    ending at its end, each next one ending LM_STRIDE or more characters earlier (neighbours
    overlap: the held-out text is short); each cut is a word start, each stop a word end, and
    the paragraph's first LM_MIN_HEAD characters always stay in the prompt."""
    spans = []
    while end - start >= LM_TARGET:
        m = re.search(r"\s\S", text[end - LM_TARGET:end])
        cut = end - LM_TARGET + m.start() + 1 if m else start
        if cut - start < LM_MIN_HEAD:
            break
        spans.append((cut, end))
        ends = [w.end() for w in re.finditer(r"\S(?=\s)", text[start:end - LM_STRIDE])]
        end = start + ends[-1] if ends else start
    return spans


def topic_paragraphs(text, starts):
    """(key, topic start, start, end) of every prose paragraph, keyed `topics/TOPIC#INDEX`."""
    for (t0, topic), (t1, _) in zip(starts, starts[1:] + [(len(text) + 1, "")]):
        for i, m in enumerate(re.finditer(r"[^\n]+(?:\n[^\n]+)*", text[t0:t1 - 2])):
            if is_prose(m.group()):
                yield f"topics/{topic}#{i}", t0, t0 + m.start(), t0 + m.end()


def base_train_text(text):
    """The base model's train split of `text` (the text of its "train" chunks, in order)."""
    of, chunk = base_split(text)[0], chunk_size(text)
    return "".join(text[j:j + chunk] for j in range(0, len(text), chunk) if of(j) == "train")


@functools.lru_cache(maxsize=1)
def lm_pool():
    """Every lm example, in text order: (key, split, prompt, target). A paragraph belongs to the
    base split of its last character; its tiles, and their prompts, stay inside that split's
    text (and inside the topic). The topics repeat some passages, so a tune or test target that
    also occurs in the base's train text is left out."""
    text, starts = topics_text()
    of, run_start = base_split(text)
    seen_in_training = base_train_text(text)
    pool = []
    for key, t0, start, end in topic_paragraphs(text, starts):
        split = of(end - 1)
        for cut, stop in tiles(text, start, end):
            lo, target = max(t0, run_start(cut)), text[cut:stop]
            if of(cut) != split or of(stop - 1) != split:
                continue                    # a tile across a split boundary
            if split != "train" and target in seen_in_training:
                continue
            prompt = keep_tail(text[lo:cut], min(PROMPT_MAX, WINDOW - len(target)), words=True)
            if prompt and len(prompt) >= LM_MIN_PROMPT:
                pool.append((key, split, prompt, target))
    return pool


def build_lm(split):
    return [(p, t) for _, s, p, t in lm_pool() if s == split]
