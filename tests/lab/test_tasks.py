"""Tests of tasks.py: determinism (also in a fresh process), disjoint splits, sizes, lengths, the
vocabulary mapping, each task's own guarantee, compare/fingerprint, and the quality metrics."""
import textwrap
import ast
import collections
import functools
import hashlib
import io
import json
import os
import random
import subprocess
import sys
import tokenize

import pytest
import torch
from hypothesis import given, strategies as st

from lab import stdlib, task_lm, task_pools, task_text, tasks, tasks_more
from lab import analysis, checks
from runtime import corpus
from runtime.checkpoint import CHECKPOINT
from conftest import ROOT
from conftest import examples
import train_heads

pytestmark = pytest.mark.assignment7   # docs/coursework.md

HERE = ROOT  # the repository
# Per task: (target min, target max) of the raw build; qa answers and summaries are shorter
# than 64 characters where the source is (see the report).
TARGET_RANGE = {"lm": (64, task_lm.LM_TARGET), "qa": (3, task_text.TARGET_MAX),
                "code2doc": (8, task_text.TARGET_MAX), "doc2summary": (8, task_text.TARGET_MAX),
                "code": (16, task_text.TARGET_MAX), "doc2code": (16, task_text.TARGET_MAX),
                "rename": (24, task_text.TARGET_MAX)}
MORE = [n for n in tasks.TASKS if n not in tasks.CHAR_TASKS]       # built by build(), not stored


@pytest.fixture(scope="module")
def ck():
    return torch.load(CHECKPOINT, map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def fresh():
    """A build in a fresh process with another hash seed (set or dict order would show), started
    before this process builds, so that the two builds run side by side: its tasks, as JSON."""
    code = "import json; from lab import tasks; print(json.dumps(tasks.build_all()['tasks']))"
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=HERE)
    return subprocess.Popen([sys.executable, "-c", code], cwd=HERE, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def raw(fresh):
    return tasks.build_all()


@pytest.fixture(scope="module")
def mapped(ck, raw):        # raw first: its build fills the caches
    return tasks.build_all(ck["vocab"])


@pytest.fixture(scope="module")
def every(ck, raw, mapped):
    """(raw, mapped) as build_all's {"tasks": ...} for every task: the stored ones and MORE."""
    out = []
    for data, vocab in ((raw, None), (mapped, ck["vocab"])):
        more = {n: {s: [list(x) for x in tasks.build(n, s, vocab)] for s in task_text.SPLITS}
                for n in MORE}
        out.append({"tasks": {**data["tasks"], **more}})
    return out


def fingerprint(examples):
    """sha256 hex digest over the (prompt, target) pairs, in order (lists or tuples alike)."""
    h = hashlib.sha256()
    for prompt, target in examples:
        for text in (prompt, target):
            data = text.encode("utf-8")
            h.update(len(data).to_bytes(8, "big") + data)     # length-prefixed: unambiguous
    return h.hexdigest()


def fingerprints(data):
    return {n: {s: fingerprint(data["tasks"][n][s]) for s in task_text.SPLITS}
            for n in tasks.CHAR_TASKS}


# ----------------------------------------------------------------------------- determinism

def test_table_and_names(raw):
    assert list(tasks.TASKS)[:7] == ["lm", "qa", "code2doc", "doc2summary", "code", "doc2code",
                                     "rename"]                # a student's task may follow
    assert list(tasks.TASKS)[:5] == list(tasks.CHAR_TASKS) == list(raw["tasks"])   # stored: five
    assert set(tasks.QUALITY) == set(tasks.INSTRUCTION) == set(tasks.TASKS)
    assert tasks.QUALITY["qa"] == tasks.QUALITY["rename"] == "exact_match"
    assert all(t.family and t.recipe for t in tasks.TASKS.values())
    assert [n for n in list(tasks.TASKS)[:7] if tasks.INSTRUCTION[n] is None] == ["lm", "code"]


def test_two_builds_equal(raw):
    for pool in (task_lm.lm_pool, task_pools.qa_pool, task_pools.code2doc_pool, task_pools.doc2summary_pool,
                 task_pools.code_pool):
        pool.cache_clear()                  # rebuild every example from the parsed files
    assert fingerprints(tasks.build_all()) == fingerprints(raw)


def test_more_tasks_build_the_same_twice():
    first = {n: [fingerprint(tasks.build(n, s)) for s in task_text.SPLITS] for n in MORE}
    for n in MORE:
        tasks.POOLS[n].cache_clear()
    assert first == {n: [fingerprint(tasks.build(n, s)) for s in task_text.SPLITS] for n in MORE}


def test_fresh_process_builds_the_same(fresh, raw):
    out, err = fresh.communicate(timeout=300)
    assert fresh.returncode == 0, err
    assert json.loads(out) == raw["tasks"]


def test_split_hash_is_stable_and_80_10_10():
    # Hand-recorded values: a change to the hash or the key format moves examples between splits.
    assert [task_text.split_of(k) for k in ("json.dumps", "os.path.join", "d", "k20")] \
        == ["train", "test", "test", "tune"]
    keys = [fn.key for fn in stdlib.functions()]
    share = {s: sum(task_text.split_of(k) == s for k in keys) / len(keys) for s in task_text.SPLITS}
    assert 0.78 < share["train"] < 0.82 and 0.09 < share["tune"] < 0.11
    assert 0.09 < share["test"] < 0.11


# -------------------------------------------------------------------------- splits, sizes, lengths

@pytest.mark.parametrize("name", tasks.TASKS)
def test_splits_disjoint(name, every):
    """No key, prompt or target-with-prompt in two splits."""
    if name == "lm":
        keys = {s: {k for k, sp, _, _ in task_lm.lm_pool() if sp == s} for s in task_text.SPLITS}
    else:
        keys = {s: {k for k, _, _ in tasks.POOLS[name]() if task_text.split_of(k) == s}
                for s in task_text.SPLITS}
    prompts = {s: {p for p, _ in every[0]["tasks"][name][s]} for s in task_text.SPLITS}
    for a, b in (("train", "tune"), ("train", "test"), ("tune", "test")):
        assert not keys[a] & keys[b] and not prompts[a] & prompts[b]
    assert all(keys.values())


@pytest.mark.parametrize("name", tasks.TASKS)
def test_sizes_and_lengths(name, every):
    raw, mapped = every
    # enough for a default --tasks run built by any Python this supports (lm: 80 in 3.11, 51 in 3.9)
    assert len(raw["tasks"][name]["test"]) >= checks.TASK_EXAMPLES
    lo, hi = TARGET_RANGE[name]
    for data in (raw, mapped):
        for split in task_text.SPLITS:
            for prompt, target in data["tasks"][name][split]:
                assert len(prompt) <= task_text.PROMPT_MAX and len(prompt) + len(target) <= task_text.WINDOW
                assert len(target) <= hi and (data is mapped or len(target) >= lo), (name, target)


@pytest.mark.parametrize("name", tasks.CHAR_TASKS)
def test_vocab_build_is_the_raw_build_mapped(name, ck, raw, mapped):
    known = set(ck["vocab"])
    for split in task_text.SPLITS:
        pairs, counts = mapped["tasks"][name][split], mapped["unknown"][name][split]
        assert all(set(p) <= known and set(t) <= known for p, t in pairs)
        assert pairs == [list(x) for x in tasks.pairs_to_vocab(raw["tasks"][name][split], ck["vocab"])]
        dropped = sum(len(p) + len(t) for p, t in raw["tasks"][name][split]) - \
            sum(len(p) + len(t) for p, t in pairs)
        assert counts["dropped"] == dropped       # each dropped character shortens the text by one
        detail = {"mapped": {}, "dropped": {}}    # per character: {char: n}
        tasks.pairs_to_vocab(tasks.build(name, split), ck["vocab"], detail)
        assert {k: sum(v.values()) for k, v in detail.items()} == counts


def test_build_all_fits_a_weights_only_checkpoint(mapped, tmp_path):
    torch.save({"tasks": mapped}, tmp_path / "t.pt")
    back = torch.load(tmp_path / "t.pt", weights_only=True)["tasks"]
    assert back == mapped and back["python"] == sys.version


# ----------------------------------------------------------------------------- the mapping

def test_char_map_examples():
    known = set("ab 'e\"-")
    assert [corpus.char_map(c, known) for c in "\t`é“—$ж"] == [" ", "'", "e", '"', "-", "", ""]
    assert corpus.char_map("“", set("“")) == "“"          # a known character stays


@examples(2)
@given(st.text(max_size=40), st.integers(0, 40), st.integers(0, 40))
def test_to_vocab_is_a_character_map(text, i, j):
    """Known characters only, never longer, and a substring maps to a substring (qa's spans)."""
    vocab = list("abc de\n'\"-")
    [(whole, part)] = tasks.pairs_to_vocab([(text, text[min(i, j):max(i, j)])], vocab)
    assert set(whole) <= set(vocab) and len(whole) <= len(text) and part in whole


@examples(2)
@given(st.text("ab \n", max_size=30), st.integers(1, 30), st.booleans())
def test_keep_tail_cuts_at_a_boundary(text, limit, words):
    tail = task_text.keep_tail(text, limit, words)
    if len(text) <= limit:
        assert tail == (text or None)
    elif tail is not None:
        before = text[len(text) - len(tail) - 1]
        assert text.endswith(tail) and len(tail) <= limit
        assert before == "\n" or (words and before.isspace() and not tail[0].isspace())


def test_each_function_text_once():
    texts = [textwrap.dedent("".join(stdlib.source_lines(f))) for f in stdlib.functions()]
    keys = [f.key for f in stdlib.functions()]
    assert len(set(texts)) == len(texts) and keys == sorted(set(keys))


# --------------------------------------------------------------------------- each task's guarantee

def lm_leakage(train_text=None):
    """{recipe: {split: (targets found verbatim in the base's train text, targets)}} for lm's
    recipe (task_lm) and, as the measured reason for it, for a hash split of every tile of the
    same paragraphs. train_text: a checkpoint's ck["splits"]["train"] (default: recomputed)."""
    text, starts = task_lm.topics_text()
    train_text = task_lm.base_train_text(text) if train_text is None else train_text
    hashed = collections.defaultdict(list)
    for key, _, start, end in task_lm.topic_paragraphs(text, starts):
        hashed[task_text.split_of(key)] += [text[a:b] for a, b in task_lm.tiles(text, start, end)]
    chosen = {s: [t for _, t in task_lm.build_lm(s)] for s in task_text.SPLITS}
    return {name: {s: (sum(t in train_text for t in got[s]), len(got[s]))
                   for s in task_text.SPLITS}
            for name, got in (("base split", chosen), ("hash split", hashed))}


def test_lm_split_is_the_base_models_and_does_not_leak(ck):
    text, _ = task_lm.topics_text()
    assert text == train_heads.load_corpus()[0]
    of = task_lm.base_split(text)[0]
    assert task_lm.base_train_text(text) == train_heads.split_corpus(text)["train"]
    assert "".join(c for j, c in enumerate(text) if of(j) == "test") == \
        train_heads.split_corpus(text)["test"]
    same = hashlib.sha256(text.encode()).hexdigest() == ck["corpus"]["sha256"]   # this Python's
    if same:                                                                    # topics as ck's
        assert "".join(c for j, c in enumerate(text) if of(j) == "test") == ck["splits"]["test"]
    leak = lm_leakage(ck["splits"]["train"] if same else None)
    assert leak["base split"]["tune"][0] == leak["base split"]["test"][0] == 0
    assert leak["hash split"]["test"][0] > leak["hash split"]["test"][1] // 2   # the reason


def test_qa_answers_are_spans_of_their_entry(raw, mapped):
    for data in (raw, mapped):
        for split in task_text.SPLITS:
            for prompt, answer in data["tasks"]["qa"][split]:
                *entries, question = prompt.rstrip("\n").split("\n")
                name = question[len("What does "):-len(" return?")]
                assert question.startswith("What does ") and question.endswith(" return?")
                assert 1 <= len(entries) <= 4
                [entry] = [e for e in entries if e.startswith(name + "(")]
                assert answer in entry


def test_code2doc_prompts_hold_no_docstring(raw):
    for split in task_text.SPLITS:
        for prompt, target in raw["tasks"]["code2doc"][split]:
            assert prompt.endswith("\n" + task_pools.CODE2DOC_CUE)
            tree = ast.parse(prompt[:-len(task_pools.CODE2DOC_CUE)])
            assert not any(task_pools.has_docstring(n) for n in ast.walk(tree))
            assert not any(isinstance(n, ast.Constant) and n.value == target
                           for n in ast.walk(tree))


def test_code_targets_are_the_next_lines(raw):
    for prompt, target in raw["tasks"]["code"]["test"]:
        assert prompt.endswith("\n") and 0 <= target.count("\n") <= 2 and target.strip()


def test_doc2summary_keeps_the_signature(raw):
    for prompt, target in raw["tasks"]["doc2summary"]["test"]:
        assert "(" in prompt.split("\n")[0] and prompt.endswith("\n" + task_pools.DOC2SUMMARY_CUE)
        assert target not in prompt


# --------------------------------------------------------------------- doc2code, rename (tasks_more)

def func(source, name="f"):
    """A stdlib.Func of the first definition in `source` (a made-up module)."""
    node = ast.parse(textwrap.dedent(source)).body[0]     # its lines stay indented
    return stdlib.Func(f"m.{name}", "m", name, node, io.StringIO(source).readlines())


def tokens(code):
    """[(start, type, string)] of code's tokens."""
    return [(t.start, t.type, t.string)
            for t in tokenize.generate_tokens(io.StringIO(code).readline)]


def differs_at_old_only(code, target, old, new):
    """The token streams pair up and differ exactly where `code` has the identifier `old`; `old`
    is no identifier of the target."""
    a, b = tokens(code.rstrip("\n")), tokens(target)
    names = {(r, c) for r, c, n in tasks_more.name_tokens(code) if n == old}
    assert len(a) == len(b) and names
    for (pos, kind, text), (_, kind2, text2) in zip(a, b):
        renamed = pos in names and kind == tokenize.NAME          # not a DEDENT there
        assert (kind2, text2) == ((kind, new) if renamed else (kind, text)), (text, text2)
    assert old not in [n for _, _, n in tasks_more.name_tokens(target)]


def test_doc2code_small():
    source = 'class C:\n    @staticmethod\n    def f(a, b):\n        """Sum.\n\n        More."""\n\n' \
             '        # add\n        return a + b\n'
    prompt, target = tasks_more.doc2code_example(func(source.split("\n", 1)[1]))
    assert prompt == '@staticmethod\ndef f(a, b):\n    """Sum.\n\n    More."""\n\n'
    assert target == "    # add\n    return a + b"
    one_line = 'def f(a):\n    """Doc."""\n    return a\n'           # a body of 1 line
    nested = 'def f(a):\n    """Doc."""\n    def g():\n        pass\n    return g\n'
    same_line = 'def f(a):\n    """Doc."""; a += 1\n    return a\n'
    assert [tasks_more.doc2code_example(func(s)) for s in (one_line, nested, same_line)] \
        == [None] * 3


def test_doc2code_targets_are_bodies(every):
    for split in task_text.SPLITS:
        for prompt, target in every[0]["tasks"]["doc2code"][split]:
            [node] = ast.parse(prompt + target).body
            assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            assert ast.get_docstring(node) is not None and len(node.body) >= 2
            assert 2 <= sum(bool(x.strip()) for x in target.split("\n")) <= 12
            assert prompt.endswith("\n") and target.strip() and target[0] == " "


def test_rename_small():
    source = ('def f(x, y):\n    """x stays here."""\n    x = x + y  # x too\n'
              '    return self.x, "x", x\n')
    assert tasks_more.local_names(func(source).node) == ["x", "y"]
    target = tasks_more.rename(source, "x", "value")
    assert target == ('def f(value, y):\n    """x stays here."""\n    value = value + y  # x too\n'
                      '    return self.x, "x", value\n')
    differs_at_old_only(source, target.rstrip("\n"), "x", "value")
    assert tasks_more.rename('def f(x):\n    return g(x=x)\n', "x", "value") is None  # a keyword
    # tokenize reads inside f-strings from Python 3.12 (PEP 701): renamed there, refused before
    renamed = 'def f(value):\n    return f"{value}"\n' if sys.version_info >= (3, 12) else None
    assert tasks_more.rename('def f(x):\n    return f"{x}"\n', "x", "value") == renamed
    prompt, target = tasks_more.rename_example(func(source), random.Random(0))
    cue = prompt.split("\n")[-2]
    old, new = cue[len("# Rename the variable "):-1].split(" to ")
    assert prompt == source + cue + "\n" and old in ("x", "y") and new in tasks_more.NEW_NAMES


def test_lines_are_split_where_ast_numbers_them(tmp_path, monkeypatch):
    """str.splitlines also splits at a form feed (Python 3.9's email/encoders.py holds one) and at
    U+2028; ast and tokenize do not. Every line after one must still be the line ast names."""
    path = tmp_path / "m.py"
    path.write_text('\x0c\ndef f(a, b):\n    """Sum."""\n    s = "\u2028"\n    return a + b + s\n',
                    encoding="utf-8")
    monkeypatch.setattr(stdlib, "stdlib_files", lambda: [("m", str(path))])
    [fn] = stdlib.functions.__wrapped__()                    # not the cached stdlib's
    source = "".join(stdlib.source_lines(fn))
    assert source == 'def f(a, b):\n    """Sum."""\n    s = "\u2028"\n    return a + b + s\n'
    assert tasks_more.doc2code_example(fn) == \
        ('def f(a, b):\n    """Sum."""\n', '    s = "\u2028"\n    return a + b + s')
    renamed = source.replace("(a,", "(x,").replace("return a", "return x")
    assert tasks_more.rename(source, "a", "x") == renamed


def test_rename_targets_rename_exactly(every):
    for split in task_text.SPLITS:
        for prompt, target in every[0]["tasks"]["rename"][split]:
            code, cue = prompt[:prompt.rindex("# Rename")], prompt.split("\n")[-2]
            assert prompt.endswith("\n") and cue.startswith("# Rename the variable ")
            old, new = cue[len("# Rename the variable "):-1].split(" to ")
            ast.parse(target)
            differs_at_old_only(code, target, old, new)


def test_instruction_messages():
    assert tasks.instruction("qa", "ctx\nWhat does f return?\n") == "ctx\nWhat does f return?"
    assert tasks.instruction("code2doc", "def f(): pass\n\n" + task_pools.CODE2DOC_CUE) == \
        "def f(): pass\n\nWrite a one-line summary of this function."
    assert tasks.instruction("doc2summary", "f()\n\nMore.\n\n" + task_pools.DOC2SUMMARY_CUE) == \
        "f()\n\nMore.\n\nWrite the first paragraph of this docstring."
    assert tasks.instruction("doc2code", 'def f():\n    """Doc."""\n') == \
        'def f():\n    """Doc."""\n\nWrite the body of this function.'
    prompt = "def f(x):\n    return x\n# Rename the variable x to value:\n"
    assert tasks.instruction("rename", prompt) == prompt.rstrip("\n")
    for name in ("lm", "code"):
        with pytest.raises(ValueError, match="raw continuation"):
            tasks.instruction(name, "text")


# ----------------------------------------------------------------------------- compare, fingerprint

def test_compare_detects_a_changed_example(raw):
    stored = [list(x) for x in raw["tasks"]["qa"]["test"]]
    assert tasks.compare(stored, "qa", "test") is None and tasks.compare(raw, "qa", "test") is None
    stored[3][1] += "!"
    message = tasks.compare(stored, "qa", "test")
    assert "1 stored not rebuilt, 1 new" in message and "\n" not in message
    old = dict(raw, python="3.99.0 (fake)", tasks={"qa": {"test": stored[::-1]}})
    assert "Python 3.99.0" in tasks.compare(old, "qa", "test")
    assert "another order" in tasks.compare(raw["tasks"]["qa"]["test"][::-1], "qa", "test")


def test_fingerprint():
    f = fingerprint
    assert f([("a", "b")]) == f([["a", "b"]]) != f([("ab", "")]) != f([("a", "b")] * 2)
    assert f([]) != f([("", "")])


# ----------------------------------------------------------------------------- quality metrics

@functools.lru_cache(maxsize=None)
def lcs_reference(a, b):
    if not a or not b:
        return 0
    return lcs_reference(a[1:], b[1:]) + 1 if a[0] == b[0] else \
        max(lcs_reference(a[1:], b), lcs_reference(a, b[1:]))


@examples(4)
@given(st.text("abc ", max_size=12), st.text("abc ", max_size=12))
def test_rouge_l_properties(a, b):
    assert analysis.lcs(a, b) == lcs_reference(a, b)
    assert analysis.rouge_l(a, b) == analysis.rouge_l(b, a) and 0 <= analysis.rouge_l(a, b) <= 1
    assert analysis.rouge_l(a, a) == 1.0
    upper = b.translate(str.maketrans("abc", "ABC"))
    assert analysis.rouge_l("x" + a.replace(" ", ""), "yz" + upper) == 0.0      # no common character
    assert (analysis.rouge_l(a, b) == 1.0) == (a.strip() == b.strip())


def test_rouge_l_by_hand_and_exact_match():
    # LCS("abcbdab", "bdcaba") = 4 ("bcba"): P = 4/7, R = 4/6, F1 = 2PR/(P+R) = 8/13
    assert analysis.lcs("abcbdab", "bdcaba") == 4
    assert analysis.rouge_l("abcbdab", "bdcaba") == pytest.approx(8 / 13)
    assert analysis.rouge_l("xyz", "abc") == 0.0 and analysis.rouge_l("", "") == 1.0
    assert analysis.rouge_l(" the sum\n", "the sum") == 1.0
    assert analysis.exact_match(" the sum\n", "the sum") == 1.0
    assert analysis.exact_match("sum", "Sum") == 0.0
    assert analysis.METRICS[tasks.QUALITY["qa"]]("a", "ab") == 0.0
    assert analysis.METRICS[tasks.QUALITY["lm"]]("a", "ab") == pytest.approx(2 / 3)


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("call, named", [
    (lambda: tasks.build("nope", "test"), "'nope'"),
    (lambda: tasks.build("qa", "dev"), "'dev'"),
    (lambda: tasks.compare([], "qa", "validation"), "'validation'"),
])
def test_errors_name_the_value(call, named):
    with pytest.raises(ValueError, match=named):
        call()


# ----------------------------------------------------------------------------- a subword model's tasks

class CharVocab:
    """A stand-in for a subword tokenizer (task_runs.built_tasks needs encode, decode, chat, stop_tokens)."""
    stop_tokens = frozenset({0})

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(map(chr, ids))

    def chat(self, message):
        return f"<u>{message}<a>"


def test_built_tasks_spread_examples_and_template_only_instructions():
    from lab import task_runs
    vocab, n = CharVocab(), 3
    built = task_runs.built_tasks(vocab, n)
    assert list(built) == list(tasks.TASKS) and all(len(v) == n for v in built.values())
    for name, examples in built.items():
        pairs = tasks.build(name, "test")
        expected = [pairs[i * len(pairs) // n] for i in range(n)]       # spread, in key order
        for (p, t), (raw_p, raw_t) in zip(examples, expected):
            text = vocab.decode(p)
            assert vocab.decode(t) == raw_t
            if tasks.INSTRUCTION[name] is None:
                assert text == raw_p, name
            else:
                assert text == f"<u>{tasks.instruction(name, raw_p)}<a>", name
    with pytest.raises(ValueError, match="fewer than --prompts"):
        task_runs.built_tasks(vocab, 10 ** 6, ["qa"])


def test_quality_reads_greedy_up_to_its_end_token():
    from lab import task_runs
    vocab = CharVocab()
    assert task_runs.up_to_stop([5, 6, 0, 7], vocab) == [5, 6] and task_runs.up_to_stop([5], vocab) == [5]
    examples = [([1], vocab.encode("abc"))]
    q = task_runs.quality_of([vocab.encode("abc") + [0] + vocab.encode("zzz")], examples, "exact_match", vocab)
    assert list(q) == ["exact_match", "rouge_l", "phrase_repeat"] and q["exact_match"] == 1.0
    assert task_runs.quality_of([vocab.encode("xyz")], examples, "rouge_l", vocab)["rouge_l"] == 0.0
