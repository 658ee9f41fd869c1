"""tasks: seven evaluation tasks built offline from files that ship with CPython itself.

Kim et al. (arXiv 2404.09221 v2) study block efficiency per task: language modelling
(LAMBADA), extractive QA (SQuAD v1), abstractive and extractive summarisation (XSum,
CNN/DailyMail), and more. minibpd's character model cannot use those data sets (nothing is
downloaded), so this module builds analogues, deterministically, from the running Python's
standard library and from `pydoc_data.topics` (the base model's own corpus); both summarisation
tasks are abstractive (doc2summary's lead, CNN/DM-style, is never in its prompt), so extractive
summarisation has no analogue. The character model was fine-tuned and is measured on the first
five (CHAR_TASKS: its checkpoint stores them); doc2code and rename (tasks_more.py, for the real
model) add code generation and a copy-heavy edit. INSTRUCTION says which tasks are instructions
(for an instruct model's chat template: instruction(name, prompt), the user message) and which
raw continuations:

    import tasks, torch
    ck = torch.load("checkpoints/minibpd.pt", weights_only=True)
    vocab = ck["vocab"]
    pairs = tasks.build("qa", "test")                # [(prompt, target), ...], raw text
    pairs = tasks.build("qa", "test", vocab)         # mapped into a checkpoint's characters
    data = tasks.build_all(vocab)                    # every task and split, plain lists and str
    tasks.compare(data, "qa", "test")                # None, or a one-line warning
    tasks.unknown_counts("qa", "test", vocab)        # the characters mapped or dropped
    tasks.lm_leakage(ck["splits"]["train"])          # lm targets seen by the base model

Every example has a key (module + qualified name; topic + paragraph index for `lm`); a stable hash
of the key picks its split, so the splits are disjoint by key and the same on every machine
(`lm` instead follows the base model's own split, see its section). Prompts keep to
PROMPT_MAX characters and prompt + target to WINDOW, the fine-tuning context; a prompt is cut at
its start, at a line (or word) boundary, except where the recipe says otherwise.
"""
import ast
import collections
import functools
import hashlib
import random
import re
import sys
import textwrap

from runtime import checkpoint
from lab import tasks_more
from lab.stdlib import first_line, functions, signature, source_lines
from train_heads import chunk_size, chunk_split, clean_text

SPLITS = ("train", "tune", "test")
PROMPT_MAX = 380       # characters of prompt (the fine-tuning window is WINDOW characters)
WINDOW = 512           # prompt + target
TARGET_MAX = 160

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
QUALITY = {"lm": "rouge_l", "qa": "exact_match", "code2doc": "rouge_l",   # analysis.QUALITY's
           "doc2summary": "rouge_l", "code": "rouge_l", "doc2code": "rouge_l",
           "rename": "exact_match"}
INSTRUCTION = {"lm": None, "code": None,            # raw continuations (no instruction)
               "qa": "", "rename": "",              # the prompt ends with its own instruction
               "code2doc": "Write a one-line summary of this function.",
               "doc2summary": "Write the first paragraph of this docstring.",
               "doc2code": "Write the body of this function."}


# ----------------------------------------------------------------------------- shared helpers

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


def one_line(paragraph):
    return " ".join(paragraph.split())


def paragraphs(doc):
    return [p for p in re.split(r"\n\s*\n", doc.strip()) if p.strip()]


def summary(doc):
    """PEP 257's summary: the docstring's first paragraph as one line. Not the first line: in a
    fifth of the stdlib's docstrings (1,097 of 5,253 in Python 3.11) the first paragraph runs on
    past it, so the first line alone is often half a sentence."""
    return one_line(paragraphs(doc)[0]) if doc and doc.strip() else ""


def dedupe(pool):
    """(key, prompt, target) sorted by key -> the first of each repeated prompt only, so that a
    prompt copied between modules cannot land in two splits."""
    seen, kept = set(), []
    for key, prompt, target in pool:
        if prompt not in seen:
            seen.add(prompt)
            kept.append((key, prompt, target))
    return kept


# ----------------------------------------------------------------------------- lm (LAMBADA-like)
# The shipped model was pre-trained on 90% of pydoc_data.topics (checkpoint.split_corpus:
# 2,000-character chunks, chunk j to tune if j % 20 == 18, to test if j % 20 == 19). A hash split
# of paragraphs would put most test targets in its training text, so `lm` takes each paragraph's
# split from the base model's split of the same text: lm/train lies in the base's train text,
# lm/tune and lm/test in its tune and test text.

LM_TARGET, LM_STRIDE, LM_MIN_PROMPT, LM_MIN_HEAD = 128, 64, 64, 24


@functools.lru_cache(maxsize=1)
def topics_text():
    """(text, topic starts): the base model's corpus exactly (train_heads.load_corpus: the
    cleaned topics in sorted order, joined by a blank line) and [(offset, topic name)]."""
    import pydoc_data.topics
    names = sorted(pydoc_data.topics.topics)
    parts = [clean_text(pydoc_data.topics.topics[k]).strip("\n") for k in names]
    starts, at = [], 0
    for name, part in zip(names, parts):
        starts.append((at, name))
        at += len(part) + 2
    return "\n\n".join(parts) + "\n", starts


def base_split(text):
    """Two functions of an offset into `text`: the base model's split of that character (the
    rule of checkpoint.split_corpus), and the first offset of the run of same-split chunks
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


def lm_leakage(train_text=None):
    """{recipe: {split: (targets found verbatim in the base's train text, targets)}} for this
    recipe and, as the measured reason for it, for a hash split of every tile of the same
    paragraphs. train_text: a checkpoint's ck["splits"]["train"] (default: recomputed)."""
    text, starts = topics_text()
    train_text = base_train_text(text) if train_text is None else train_text
    hashed = collections.defaultdict(list)
    for key, _, start, end in topic_paragraphs(text, starts):
        hashed[split_of(key)] += [text[a:b] for a, b in tiles(text, start, end)]
    chosen = {s: [t for _, t in build_lm(s)] for s in SPLITS}
    return {name: {s: (sum(t in train_text for t in got[s]), len(got[s])) for s in SPLITS}
            for name, got in (("base split", chosen), ("hash split", hashed))}


def build_lm(split):
    return [(p, t) for _, s, p, t in lm_pool() if s == split]


def last_word_variant(pairs):
    """LAMBADA proper: (prompt, target) -> (prompt + target up to its last word, that word),
    for targets ending in a word of >= 3 letters (trailing punctuation left out)."""
    out = []
    for prompt, target in pairs:
        m = re.search(r"(?:^|\s)([A-Za-z]{3,})[.,;:!?)\"']*$", target)
        if m:
            head = keep_tail(prompt + target[:m.start(1)], PROMPT_MAX, words=True)
            if head:
                out.append((head, m.group(1)))
    return out


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
    s = summary(ast.get_docstring(fn.node))
    return f"{signature(fn)}: {s}" if 8 <= len(s) <= TARGET_MAX else None


def qa_answer(fn):
    """The summary's first sentence after "Return(s) ", without its period (None if no such)."""
    first = re.split(r"\.\s+(?=[A-Z])", summary(ast.get_docstring(fn.node)))[0]
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
    body = getattr(node, "body", None)
    return (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body
            and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str))


def docstring_spans(node):
    """(first, last) line numbers of each docstring in node and in the definitions inside it."""
    return [(n.body[0].lineno, n.body[0].end_lineno) for n in ast.walk(node) if has_docstring(n)]


def without_docstrings(fn):
    """The function's dedented source with its docstrings' lines removed; None when a docstring
    shares a line with code or nothing but the docstring is left."""
    drop = set()
    for a, b in docstring_spans(fn.node):
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
        target = summary(ast.get_docstring(fn.node))
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
# A lead that the prompt repeats word for word (20 of 2,094 in Python 3.11, e.g. `os.execl`'s
# signature line) is left out.

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
        paras, target = paragraphs(doc) if doc else [], summary(doc)
        if len(paras) < 2 or not 8 <= len(target) <= TARGET_MAX:
            continue
        head = signature(fn) + "\n\n"
        limit = min(PROMPT_MAX, WINDOW - len(target)) - len(DOC2SUMMARY_CUE) - 1 - len(head)
        rest = cut_end("\n\n".join(paras[1:]) + "\n", limit)
        if len(rest.strip()) >= 32 and target not in head + rest:    # copying is no summary
            pool.append((fn.key, head + rest + "\n" + DOC2SUMMARY_CUE, target))
    return dedupe(pool)


# ----------------------------------------------------------------------------- code (completion)
# One cut per function, at a seeded line boundary after its docstring: the prompt is the
# function's source up to the cut (its start cut at a line boundary to fit), the target the next
# 1-3 lines, as many as fit TARGET_MAX. Cuts with a target of >= 64 characters after >= 96
# characters of the function are preferred: prompts under 96 characters fall from 34% of the
# examples (target length preferred alone) to 25% (the rest are short functions).

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


# ----------------------------------------------------------------- doc2code, rename (tasks_more)

@functools.lru_cache(maxsize=1)
def doc2code_pool():
    pool = [(fn.key, *ex) for fn in functions()
            if (ex := tasks_more.doc2code_example(fn, PROMPT_MAX, TARGET_MAX, WINDOW))]
    return dedupe(pool)


@functools.lru_cache(maxsize=1)
def rename_pool():
    pool = [(fn.key, *ex) for fn in functions()
            if (ex := tasks_more.rename_example(fn, rng(fn.key), PROMPT_MAX, TARGET_MAX, WINDOW))]
    return dedupe(pool)


# -------------------------------------------------------------------------- the model's characters
# A vocabulary build is the raw build mapped character by character (checkpoint.to_vocab: each
# character outside the vocabulary becomes ONE known character or is dropped), so every raw
# guarantee holds: lengths only shrink, a qa answer stays a span of its prompt.

def to_vocab(pairs, vocab, counts=None):
    """Map every character of the pairs into `vocab`; tally {"mapped"|"dropped": {char: n}}."""
    counts = counts if counts is not None else {}
    return [(checkpoint.to_vocab(p, vocab, counts), checkpoint.to_vocab(t, vocab, counts))
            for p, t in pairs]


def unknown_counts(name, split, vocab):
    """{"mapped": {char: n}, "dropped": {char: n}}: what build(name, split, vocab) changed."""
    counts = {"mapped": {}, "dropped": {}}
    to_vocab(build(name, split), vocab, counts)
    return {k: dict(sorted(v.items())) for k, v in counts.items()}


# ----------------------------------------------------------------------------- building

POOLS = {"qa": qa_pool, "code2doc": code2doc_pool, "doc2summary": doc2summary_pool,
         "code": code_pool, "doc2code": doc2code_pool, "rename": rename_pool}


def check(name, split="train"):
    if not isinstance(name, str) or name not in TASKS:         # a list: unhashable
        raise ValueError(f"unknown task {name!r}; the tasks are {', '.join(TASKS)}")
    if not isinstance(split, str) or split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; the splits are {', '.join(SPLITS)}")


def build(name, split, vocab=None):
    """-> [(prompt, target)] of one task and split, in key order; with `vocab` (a checkpoint's
    characters) every character is mapped into it (to_vocab), else the text is raw."""
    check(name, split)
    if name == "lm":
        pairs = build_lm(split)
    else:
        pairs = [(p, t) for key, p, t in POOLS[name]() if split_of(key) == split]
    return to_vocab(pairs, vocab) if vocab is not None else pairs


def instruction(name, prompt):
    """The user message of an instruction task's prompt (for a chat template): the prompt
    without the character model's trailing cue (`Summary: `) and final newlines, then the task's
    instruction text, if any (INSTRUCTION); a ValueError for a raw continuation (lm, code)."""
    check(name)
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
            pairs = build(name, split)
            pairs = to_vocab(pairs, vocab, counts) if vocab is not None else pairs
            data["tasks"][name][split] = [[p, t] for p, t in pairs]
            data["unknown"][name][split] = {k: sum(v.values()) for k, v in counts.items()}
    return data


def fingerprint(examples):
    """sha256 hex digest over the (prompt, target) pairs, in order (lists or tuples alike)."""
    h = hashlib.sha256()
    for prompt, target in examples:
        for text in (prompt, target):
            data = text.encode("utf-8")
            h.update(len(data).to_bytes(8, "big") + data)     # length-prefixed: unambiguous
    return h.hexdigest()


def compare(stored, name, split, vocab=None):
    """None if the running Python builds `stored` again, else a one-line message saying how the
    build differs. `stored`: the pairs, or a build_all() dict (its vocab and Python are used)."""
    check(name, split)
    python = "another Python"
    if isinstance(stored, dict):
        vocab = stored.get("vocab") if vocab is None else vocab
        python = "Python " + str(stored.get("python", "?")).split()[0]
        stored = stored["tasks"][name][split]
    built = build(name, split, None if vocab is None else list(vocab))
    if fingerprint(stored) == fingerprint(built):
        return None
    old = collections.Counter(map(tuple, stored))
    new = collections.Counter(map(tuple, built))
    missing, extra = sum((old - new).values()), sum((new - old).values())
    return (f"tasks {name}/{split}: Python {sys.version.split()[0]} builds {len(built)} examples, "
            f"the stored ones ({python}) are {len(stored)}: {missing} stored not rebuilt, "
            f"{extra} new" + ("" if missing or extra else ", same examples in another order"))
