"""task_pools: the examples of the tasks built from the standard library's functions (qa,
code2doc, doc2summary, code; doc2code and rename: tasks_more.py): one (key, prompt, target)
list per task, in key order, deduplicated and cached; tasks.py splits them by key."""
import ast
import collections
import functools
import re
import textwrap

from lab.stdlib import first_line, functions, signature, source_lines
from lab.task_text import (PROMPT_MAX, TARGET_MAX, WINDOW, dedupe, keep_tail, paragraphs, rng,
                           split_of, doc_summary)


# ----------------------------------------------------------------------------- qa (SQuAD-like)
# Context: four `name(signature): summary` lines of one module, the answer's among them, in a
# seeded order; the question comes last. The answer is the summary after "Return(s) ", without
# its final period: a verbatim span of the context. A distractor never comes from a more held-out
# split than the example (train contexts hold train functions only), so no tune or test summary,
# which is also a code2doc target, appears in a train prompt.

QA_DISTRACTORS = 3
RANK = {"train": 0, "tune": 1, "test": 2}


def qa_entry(fn):
    """`qualname(args): summary`, or None for a function without a one-line-able summary."""
    s = doc_summary(ast.get_docstring(fn.node))
    return f"{signature(fn)}: {s}" if 8 <= len(s) <= TARGET_MAX else None


def qa_answer(fn):
    """The summary's first sentence after "Return(s) ", without its period (None if no such)."""
    first = re.split(r"\.\s+(?=[A-Z])", doc_summary(ast.get_docstring(fn.node)))[0]
    m = re.match(r"Returns? (.+?)\.?$", first)
    return m.group(1) if m and len(m.group(1)) >= 3 else None


def qa_example(fn, others):
    """(prompt, answer) for fn, with distractors drawn from `others` (Funcs of its module)."""
    answer, entry, split = qa_answer(fn), qa_entry(fn), split_of(fn.key)
    pool = [o for o in others if o.key != fn.key and RANK[split_of(o.key)] <= RANK[split]]
    if not answer or not entry or len(pool) < QA_DISTRACTORS:
        return None
    r = rng(fn.key)
    entries = [entry] + [qa_entry(o) for o in r.sample(pool, QA_DISTRACTORS)]
    r.shuffle(entries)
    question = f"What does {fn.qualname} return?\n"
    limit = min(PROMPT_MAX, WINDOW - len(answer)) - len(question)
    context = keep_tail("\n".join(entries) + "\n", limit)    # drops whole entries from the top
    if not context or entry not in context.splitlines():
        return None
    return context + question, answer


@functools.lru_cache(maxsize=1)
def qa_pool():
    by_module = collections.defaultdict(list)
    for fn in functions():
        if qa_entry(fn):
            by_module[fn.module].append(fn)
    pool = []
    for module in sorted(by_module):
        for fn in by_module[module]:
            example = qa_example(fn, by_module[module])
            if example:
                pool.append((fn.key, *example))
    return dedupe(pool)


# ----------------------------------------------------------------------------- code2doc (XSum-like)
# The whole function (decorators and nested definitions included) with every docstring inside it
# removed, dedented, then a cue; the target is its summary. Only functions whose stripped source
# fits the prompt whole are used: a summary is written about the whole function.

CODE2DOC_CUE = "Summary: "


def has_docstring(node):
    return (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and ast.get_docstring(node, clean=False) is not None)


def without_docstrings(fn):
    """The function's dedented source without the lines of its docstrings (nested definitions'
    too); None when a docstring shares a line with code or nothing but the docstring is left."""
    drop = set()
    for node in filter(has_docstring, ast.walk(fn.node)):
        a, b = node.body[0].lineno, node.body[0].end_lineno
        lines = "".join(fn.lines[a - 1:b]).strip()
        if lines[0] not in "\"'rRuU" or not lines.endswith(("'", '"')):
            return None                     # e.g. `def f(): "doc"; return 1`
        drop.update(range(a, b + 1))
    kept = [fn.lines[i - 1] for i in range(first_line(fn), fn.node.end_lineno + 1)
            if i not in drop]
    code = textwrap.dedent("".join(kept))
    try:
        ast.parse(code)                     # nothing left but a def line does not parse
    except SyntaxError:
        return None
    return code


@functools.lru_cache(maxsize=1)
def code2doc_pool():
    pool = []
    for fn in functions():
        target = doc_summary(ast.get_docstring(fn.node))
        if not 8 <= len(target) <= TARGET_MAX:
            continue
        code = without_docstrings(fn)
        limit = min(PROMPT_MAX, WINDOW - len(target)) - len(CODE2DOC_CUE) - 1
        if code and len(code) <= limit:
            pool.append((fn.key, code + "\n" + CODE2DOC_CUE, target))
    return dedupe(pool)


# ------------------------------------------------------ doc2summary (abstractive; CNN/DM's lead)
# The signature, then the docstring's paragraphs after the first, then a cue -> the first
# paragraph as one line (the "lead"). Here the prompt is cut at its END, at a line boundary: the
# signature must stay, and the paragraphs next to the lead are the ones that elaborate on it.
# A lead that the prompt repeats word for word is left out (docs/tasks.md: how many).

DOC2SUMMARY_CUE = "Summary: "


def cut_end(text, limit):
    """The longest start of `text` of <= limit characters that ends at a line boundary."""
    if len(text) <= limit:
        return text
    return text[:text.rfind("\n", 0, limit) + 1]


@functools.lru_cache(maxsize=1)
def doc2summary_pool():
    pool = []
    for fn in functions():
        doc = ast.get_docstring(fn.node)
        paras, target = paragraphs(doc) if doc else [], doc_summary(doc)
        if len(paras) < 2 or not 8 <= len(target) <= TARGET_MAX:
            continue
        head = signature(fn) + "\n\n"
        limit = min(PROMPT_MAX, WINDOW - len(target)) - len(DOC2SUMMARY_CUE) - 1 - len(head)
        rest = cut_end("\n\n".join(paras[1:]) + "\n", limit)
        if len(rest.strip()) >= 32 and target not in head + rest:    # copying is no summary
            pool.append((fn.key, head + rest + "\n" + DOC2SUMMARY_CUE, target))
    return dedupe(pool)


# ----------------------------------------------------------------------------- code (completion)
# One cut per function (code_cuts, choose_cut): its source up to the cut, the start cut at a line
# boundary to fit -> the next 1-3 lines (docs/tasks.md: what the preferred cuts change).

CODE_GOOD, CODE_CONTEXT = 64, 96


def code_cuts(fn):
    """[(i, target)]: line i of source_lines(fn), after the def line and the docstring, starts
    a target of 1-3 whole lines (as many as fit TARGET_MAX) with >= 16 non-blank characters."""
    lines = source_lines(fn)
    body = fn.node.body[1:] if has_docstring(fn.node) else fn.node.body
    if not body:
        return []
    cuts = []
    for i in range(body[0].lineno - first_line(fn), len(lines)):
        target = ""
        for line in lines[i:i + 3]:
            if len(target + line.rstrip("\n")) > TARGET_MAX:
                break
            target += line
        target = target.rstrip("\n")
        if lines[i].strip() and len(target.strip()) >= 16:
            cuts.append((i, target))
    return cuts


def choose_cut(fn, cuts):
    """A seeded choice, preferring targets of >= CODE_GOOD characters after >= CODE_CONTEXT
    characters of the function, then targets of >= CODE_GOOD characters, then any."""
    lines = source_lines(fn)
    before = lambda i: sum(len(x) for x in lines[:i])
    for tier in ([c for c in cuts if len(c[1]) >= CODE_GOOD and before(c[0]) >= CODE_CONTEXT],
                 [c for c in cuts if len(c[1]) >= CODE_GOOD], cuts):
        if tier:
            return rng(fn.key).choice(tier)
    return None


@functools.lru_cache(maxsize=1)
def code_pool():
    pool = []
    for fn in functions():
        cut = choose_cut(fn, code_cuts(fn))
        if not cut:
            continue
        i, target = cut
        prompt = keep_tail("".join(source_lines(fn)[:i]), min(PROMPT_MAX, WINDOW - len(target)))
        if prompt:
            pool.append((fn.key, prompt, target))
    return dedupe(pool)
