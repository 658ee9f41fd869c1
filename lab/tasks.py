"""tasks: seven evaluation tasks built offline from files that ship with CPython itself, as
analogues of Kim et al.'s (arXiv 2404.09221 v2) per-task data sets; docs/tasks.md describes each
task, its recipe and split, and which ones the character model was fine-tuned on (CHAR_TASKS).

    pairs = tasks.build("qa", "test")                # [(prompt, target), ...], raw text
    pairs = tasks.build("qa", "test", vocab)         # mapped into a checkpoint's characters
    data = tasks.build_all(vocab)                    # every task and split, plain lists and str
    tasks.compare(data, "qa", "test")                # None, or a one-line warning

This module names the tasks and builds them; the examples come from task_lm.py (`lm`),
task_pools.py and tasks_more.py (the rest), all cut with task_text.py's tools.
"""
import collections
import sys

from lab.task_lm import build_lm
from lab.task_pools import (CODE2DOC_CUE, DOC2SUMMARY_CUE, code2doc_pool, code_pool,
                            doc2summary_pool, qa_pool)
from lab.tasks_more import doc2code_pool, rename_pool
from lab.task_text import SPLITS, split_of
from runtime import corpus


Task = collections.namedtuple("Task", "family recipe")
TASKS = {
    "lm": Task("LM (LAMBADA-like)",
               "pydoc_data.topics prose cut at a word boundary -> its next <= 128 characters, "
               "split as the base model's corpus was"),
    "qa": Task("extractive QA (SQuAD-like)",
               "4 `name(signature): summary` entries of one module + `What does NAME return?` "
               "-> the span after `Return`"),
    "code2doc": Task("abstractive summarisation (XSum-like)",
                     "a function's source, docstrings removed (ast) -> its one-line summary"),
    "doc2summary": Task("abstractive summarisation (a CNN/DM-style lead, never in the prompt)",
                        "signature + a docstring's later paragraphs -> its first paragraph"),
    "code": Task("code completion",
                 "a function's source up to a line boundary -> the next 1-3 lines"),
    "doc2code": Task("code generation (HumanEval-like)",
                     "a short function's def line and docstring (no nested definitions, a body "
                     "of 2-12 lines) -> its body"),
    "rename": Task("copy-heavy editing (a rename)",
                   "a short function's source + `# Rename the variable OLD to NEW:` (a seeded "
                   "local name, a seeded fresh one) -> the source renamed token by token"),
}
CHAR_TASKS = ("lm", "qa", "code2doc", "doc2summary", "code")    # the character model's (stored)
QUALITY = {"lm": "rouge_l", "qa": "exact_match", "code2doc": "rouge_l",   # analysis.METRICS's
           "doc2summary": "rouge_l", "code": "rouge_l", "doc2code": "rouge_l",
           "rename": "exact_match"}
INSTRUCTION = {"lm": None, "code": None,            # raw continuations (no instruction)
               "qa": "", "rename": "",              # the prompt ends with its own instruction
               "code2doc": "Write a one-line summary of this function.",
               "doc2summary": "Write the first paragraph of this docstring.",
               "doc2code": "Write the body of this function."}


# -------------------------------------------------------------------------- the model's characters
# A vocabulary build is the raw build mapped character by character (corpus.to_vocab: each
# character outside the vocabulary becomes ONE known character or is dropped), so every raw
# guarantee holds: lengths only shrink, a qa answer stays a span of its prompt.

def pairs_to_vocab(pairs, vocab, counts=None):
    """Map every character of the pairs into `vocab`; tally {"mapped"|"dropped": {char: n}}."""
    return [(corpus.to_vocab(p, vocab, counts), corpus.to_vocab(t, vocab, counts))
            for p, t in pairs]


# ----------------------------------------------------------------------------- building

POOLS = {"qa": qa_pool, "code2doc": code2doc_pool, "doc2summary": doc2summary_pool,
         "code": code_pool, "doc2code": doc2code_pool, "rename": rename_pool}


def check_task(name, split="train"):
    if not isinstance(name, str) or name not in TASKS:         # a list: unhashable
        raise ValueError(f"unknown task {name!r}; the tasks are {', '.join(TASKS)}")
    if not isinstance(split, str) or split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; the splits are {', '.join(SPLITS)}")


def build(name, split, vocab=None, counts=None):
    """-> [(prompt, target)] of one task and split, in key order; with `vocab` (a checkpoint's
    characters) each character is mapped into it (pairs_to_vocab: `counts`), else raw text."""
    check_task(name, split)
    if name == "lm":
        pairs = build_lm(split)
    else:
        pairs = [(p, t) for key, p, t in POOLS[name]() if split_of(key) == split]
    return pairs_to_vocab(pairs, vocab, counts) if vocab is not None else pairs


def instruction(name, prompt):
    """The user message of an instruction task's prompt (for a chat template): the prompt
    without the character model's trailing cue (`Summary: `) and final newlines, then the task's
    instruction text, if any (INSTRUCTION); a ValueError for a raw continuation (lm, code)."""
    check_task(name)
    if INSTRUCTION[name] is None:
        raise ValueError(f"task {name!r} is a raw continuation, not an instruction")
    cue = {"code2doc": CODE2DOC_CUE, "doc2summary": DOC2SUMMARY_CUE}.get(name, "")
    text = (prompt[:-len(cue)] if cue and prompt.endswith(cue) else prompt).rstrip("\n")
    return text + "\n\n" + INSTRUCTION[name] if INSTRUCTION[name] else text


def build_all(vocab=None):
    """The character model's tasks (CHAR_TASKS) and splits as plain lists and str (it can live in a torch checkpoint loaded with
    weights_only=True): {"python", "vocab", "tasks": {name: {split: [[p, t], ...]}},
    "unknown": {name: {split: {"mapped": n, "dropped": n}}}}."""
    data = {"python": sys.version, "vocab": None if vocab is None else "".join(vocab),
            "tasks": {}, "unknown": {}}
    for name in CHAR_TASKS:
        data["tasks"][name], data["unknown"][name] = {}, {}
        for split in SPLITS:
            counts = {"mapped": {}, "dropped": {}}
            pairs = build(name, split, vocab, counts)
            data["tasks"][name][split] = [[p, t] for p, t in pairs]
            data["unknown"][name][split] = {k: sum(v.values()) for k, v in counts.items()}
    return data


def compare(stored, name, split, vocab=None):
    """None if the running Python builds `stored` again, else a one-line message saying how the
    build differs. `stored`: the pairs, or a build_all() dict (its vocab and Python are used)."""
    check_task(name, split)
    python = "another Python"
    if isinstance(stored, dict):
        vocab = stored.get("vocab") if vocab is None else vocab
        python = "Python " + str(stored.get("python", "?")).split()[0]
        stored = stored["tasks"][name][split]
    built = build(name, split, None if vocab is None else list(vocab))
    if list(map(tuple, stored)) == built:
        return None
    old = collections.Counter(map(tuple, stored))
    new = collections.Counter(map(tuple, built))
    missing, extra = sum((old - new).values()), sum((new - old).values())
    return (f"tasks {name}/{split}: Python {sys.version.split()[0]} builds {len(built)} examples, "
            f"the stored ones ({python}) are {len(stored)}: {missing} stored not rebuilt, "
            f"{extra} new" + ("" if missing or extra else ", same examples in another order"))
