"""questions: chat questions about the running Python's standard library, for SmolLM2's chat
prompts: its heads train on greedy answers to the train split's questions
(training/generate.py, --chat-continuations) and the benchmarks ask the test split's
(tools/peer_bench.py --chat, tools/heads_table.py --replay --chat) after the demo's own two.
One question per public stdlib function with a docstring, in its split, of one of four forms
(docs/training.md). Ours: the papers train and measure on their models' own data; the only
text that ships here offline is Python's own.
"""
import ast
import functools
import re

from lab import stdlib, task_pools, task_text

EXPLAIN_LINES = 12              # "explain this code" only for functions this short (lines)


def first_sentence(fn):
    """The docstring's first sentence on one line ('' without a docstring)."""
    first = task_text.doc_summary(ast.get_docstring(fn.node))
    return re.split(r"(?<=[.!?])\s", first)[0].rstrip(".")


VERBS = set("""add append apply build calculate call check clear close compare compute construct
convert copy create decode delete determine encode escape extract fetch find flush format generate
get handle initialize insert join load make match normalize open parse print process quote raise
read register remove replace reset return run save search send set sort split start stop strip test
translate update validate wait write yield""".split())


def as_request(text):
    """'Return the sum of x' -> 'returns the sum of x': a sentence that starts with a verb of
    VERBS (imperative or with its -s) as what a function does; None for any other sentence."""
    word, _, rest = text.partition(" ")
    stem = next((w for w in (word.lower(), word.lower()[:-1], word.lower()[:-2]) if w in VERBS), None)
    if stem is None or not word[:1].isupper() or not rest:
        return None
    return f"{stem}{'es' if stem.endswith(('sh', 'ch', 'x', 's')) else 's'} {rest}"


def question(fn):
    """One question about `fn`, of a form its key picks."""
    name, said = f"{fn.module}.{fn.qualname}", first_sentence(fn)
    code = task_pools.without_docstrings(fn)
    forms = [f"What does {name} do in Python?",
             f"How do I use {fn.qualname} from Python's {fn.module} module? Show a short example."]
    if as_request(said):
        forms.append(f"Write a Python function that {as_request(said)}.")
    if code and code.count("\n") <= EXPLAIN_LINES:      # its source, docstrings removed
        forms.append(f"Explain what this Python code does:\n\n```python\n{code.strip()}\n```")
    return task_text.rng(fn.key).choice(forms)


@functools.lru_cache(maxsize=None)
def questions(split):
    """The split's questions, in the stable order of their functions' keys' hashes."""
    if split not in task_text.SPLITS:
        raise ValueError(f"unknown split {split!r}; the splits are {', '.join(task_text.SPLITS)}")
    picked = [fn for fn in stdlib.functions() if task_text.split_of(fn.key) == split
              and not any(part.startswith("_") for part in fn.key.split("."))
              and first_sentence(fn)]
    return tuple(question(fn) for fn in sorted(picked, key=lambda fn: task_text.digest(fn.key)))


def benchmark_questions(first=()):
    """The questions a benchmark asks, in order: `first` (the demo's), then the test split's but
    the few whose text a train or tune function also gives (two functions of one docstring
    summary: 1 of 370 here)."""
    seen = set(questions("train")) | set(questions("tune"))
    return list(first) + [q for q in questions("test") if q not in seen]


def chat_prompts(vocab, n, first=()):
    """The first n benchmark_questions(first) as chat-template prompts (token ids), in the
    model's own template (vocab.chat)."""
    asked = benchmark_questions(first)
    if not 1 <= n <= len(asked):
        raise ValueError(f"{n} chat prompts asked; there are 1 to {len(asked)}")
    return [vocab.encode(vocab.chat(q)) for q in asked[:n]]
