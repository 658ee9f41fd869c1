"""Tests of lab/questions.py, the chat questions SmolLM2's heads train on (train split) and the
benchmarks ask (test split): each question comes from a function of its own split, never a private
one, in one of the four forms; the same questions in a fresh process; the benchmark's prompts in
their order; and training/generate.py's chat batches."""
import hashlib
import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from lab import questions, task_text
from training import generate

NAMED = (re.compile(r"What does (\S+) do in Python\?"),
         re.compile(r"How do I use (\S+) from Python's (\S+) module\? Show a short example\."))


def asked_about(q):
    """The function key a question names (its first two forms), else None."""
    what, how = (r.fullmatch(q) for r in NAMED)
    return what.group(1) if what else f"{how.group(2)}.{how.group(1)}" if how else None


@pytest.mark.parametrize("text, want", [
    ("Return the sum of x", "returns the sum of x"), ("Returns a list", "returns a list"),
    ("Match a name", "matches a name"), ("Processes files", "processes files"),
    ("Whether this path is a socket", None), ("Get", None), ("parse x", None), ("Push it", None)])
def test_as_request_conjugates_known_verbs_only(text, want):
    assert questions.as_request(text) == want


@pytest.mark.parametrize("split", task_text.SPLITS)
def test_each_question_is_of_its_own_splits_public_functions(split):
    asked = questions.questions(split)
    assert len(asked) > 300 and len(set(asked)) > 0.95 * len(asked)
    forms = {"What": 0, "How": 0, "Write": 0, "Explain": 0}
    for q in asked:
        forms[q.split()[0]] += 1                        # a KeyError: a fifth form
        key = asked_about(q)
        if key is not None:
            assert task_text.split_of(key) == split, q
            assert not any(part.startswith("_") for part in key.split(".")), q
        if q.startswith("Write"):
            assert q.startswith("Write a Python function that ") and q.endswith(".")
        if q.startswith("Explain"):
            assert q.endswith("\n```") and '"""' not in q   # its source, docstrings removed
    assert min(forms.values()) > 0.1 * len(asked), forms


@pytest.mark.assignment3
def test_the_benchmarks_never_ask_a_train_or_tune_question():
    """Two functions of one split each can share a question's text (the same docstring summary):
    chat_prompts skips the test split's that train or tune also has."""
    train, tune, test = (set(questions.questions(s)) for s in task_text.SPLITS)
    assert len((train | tune) & test) < 0.01 * len(test)
    every = len(questions.questions("test"))
    asked = questions.chat_prompts(CharVocab, every - len((train | tune) & test))
    assert not {CharVocab.asked(p) for p in asked} & (train | tune)


def test_the_same_questions_in_a_fresh_process():
    code = ("import hashlib; from lab import questions; "
            "print(hashlib.sha256(repr(questions.questions('test')).encode()).hexdigest())")
    env = dict(os.environ, PYTHONHASHSEED="4321", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, text=True,
                         capture_output=True, check=True).stdout.strip()
    assert out == hashlib.sha256(repr(questions.questions("test")).encode()).hexdigest()


class CharVocab:
    """A stand-in vocab: its chat template, one token id per character."""

    @staticmethod
    def chat(text):
        return f"<chat>{text}</chat>"

    @staticmethod
    def encode(text):
        return [ord(c) for c in text]

    @staticmethod
    def asked(ids):                                     # the question inside the template
        return "".join(map(chr, ids))[len("<chat>"):-len("</chat>")]


def test_chat_prompts_ask_the_first_questions_then_the_test_split():
    got = [CharVocab.asked(p) for p in questions.chat_prompts(CharVocab, 40, first=("Hi?",))]
    test = questions.questions("test")
    assert got[0] == "Hi?" and got[1:] == [q for q in test[:len(got) + 1] if q in got[1:]]
    with pytest.raises(ValueError, match="chat prompts asked"):
        questions.chat_prompts(CharVocab, len(questions.questions("test")) + 1, first=("Hi?",))
    with pytest.raises(ValueError, match="unknown split"):
        questions.questions("dev")


def test_chat_batches_are_seeded_sorted_and_keep_each_prompts_end(monkeypatch):
    monkeypatch.setattr(generate, "GEN_ROWS", 4)
    fits = generate.GEN_WINDOW - generate.GEN_TOKENS
    batches, cut = generate.chat_batches(CharVocab, "tune", 10, torch.Generator().manual_seed(0))
    again, _ = generate.chat_batches(CharVocab, "tune", 10, torch.Generator().manual_seed(0))
    assert [len(b) for b in batches] == [4, 4, 2] and cut >= 0
    assert all(torch.equal(a, b) for a, b in zip(batches, again))
    ends = {tuple(CharVocab.encode("</chat>"))}
    assert all(b.shape[1] <= fits and {tuple(r[-7:].tolist()) for r in b} == ends for b in batches)
    assert [b.shape[1] for b in batches] == sorted(b.shape[1] for b in batches)
    with pytest.raises(ValueError, match="chat continuations of the tune split asked"):
        generate.chat_batches(CharVocab, "tune", 10_000, torch.Generator())


def test_the_peer_bench_refuses_more_chat_prompts_than_there_are_questions():
    """Before any model loads (no optional package needed): one line, exit status 2."""
    out = subprocess.run([sys.executable, "tools/peer_bench.py", "--chat", "--prompts", "10000"],
                         cwd=ROOT, text=True, capture_output=True)
    assert out.returncode == 2 and "--prompts: at most" in out.stderr
    assert "Traceback" not in out.stderr
