"""Tests for training/task_heads.py (per-task heads on SmolLM2; tools/task_heads.py, removed, in commit c2dce35): the task
prompt builder (even over tasks, seeded, the chat template for instruction tasks only), the
length batches (sorted, each prompt's start dropped to the batch's shortest), and, with SmolLM2
and its shipped heads installed (else skipped, naming the pip command), that finetune_on moves
the heads and the exit adapter and nothing else."""
import os

import pytest
import torch

from runtime import checkpoint
from lab import task_text, tasks
from conftest import ROOT
from tests.helpers import heads_or_skip, real_model_or_skip
from training import generate, task_heads

HEADS = os.path.join(ROOT, "checkpoints", "smollm2-heads.pt")


class ChatVocab:
    """What task_prompts reads of a vocab: its chat template."""

    @staticmethod
    def chat(text):
        return f"<chat>{text}</chat>"


def fake_build(name, split):
    """Small stand-ins for tasks.build (the real ones take seconds to build)."""
    assert split == "train"
    return [(f"{name} prompt {i}\n", f"target {i}") for i in range(5)]


def test_task_prompts_even_seeded_and_as_the_model_reads_them(monkeypatch):
    monkeypatch.setattr(tasks, "build", fake_build)
    names = ["qa", "code", "rename"]
    got = task_heads.task_prompts(ChatVocab(), names, 7, seed=3)
    assert [name for name, _ in got] == ["qa"] * 3 + ["code"] * 2 + ["rename"] * 2
    for name, text in got:
        pool = [p for p, _ in fake_build(name, "train")]
        if tasks.INSTRUCTION[name] is None:
            assert text in pool                                     # raw continuation
        else:
            assert any(text == ChatVocab.chat(tasks.instruction(name, p)) for p in pool)
    assert len(set(got)) == 7
    assert got == task_heads.task_prompts(ChatVocab(), names, 7, seed=3)
    assert got != task_heads.task_prompts(ChatVocab(), names, 7, seed=4)
    with pytest.raises(ValueError, match="fewer than"):
        task_heads.task_prompts(ChatVocab(), ["qa"], 6, seed=0)


def test_length_batches_keep_each_prompts_end():
    ids = [[1, 2, 3, 4, 5], [9], [7, 8], [4, 5, 6, 7]]
    batches, cut = generate.length_batches(ids, rows=2, longest=3)
    assert [b.tolist() for b in batches] == [[[9], [8]], [[5, 6, 7], [3, 4, 5]]]
    assert cut == 1 + 1 + 2


def test_finetune_on_moves_only_the_heads_and_the_exit_adapter():
    heads_or_skip()
    torch.set_num_threads(1)
    model, ck = checkpoint.load(HEADS)
    trunk = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("heads.")}
    heads = {k: v.clone() for k, v in model.heads.state_dict().items()}
    exit_head = task_heads.exit_adapter(model, ck)
    exit0 = {k: v.clone() for k, v in exit_head.state_dict().items()}
    prompts = [ck["vocab"].chat("What is 2 + 2?"), "def add(a, b):\n    return"]
    record = task_heads.finetune_on(model, ck["vocab"], prompts, 2, 0, lambda m: None, exit_head)
    after = model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in trunk.items())
    moved = model.heads.state_dict()
    assert any(not torch.equal(v, moved[k]) for k, v in heads.items())
    assert all(moved[k].dtype == v.dtype for k, v in heads.items())
    assert any(not torch.equal(v, exit_head.state_dict()[k]) for k, v in exit0.items())
    assert not any(p.requires_grad for p in model.parameters()) and model.batch_invariant
    assert record["prompts"] == 2 and record["exit_trained"] and len(record["train_agreement"]) == 5


@pytest.mark.parametrize("form, targets", [("stern", "exact"), ("chained", "all")])
def test_smollm_heads_trains_a_step(monkeypatch, form, targets):
    """`python train_heads.py --smollm`, shrunk to a few continuations and two steps: it builds
    its exit adapter (llama.bpd_head, in BPDHead's form whatever the heads' form: the call that
    once passed a config to BPDHead crashed here), trains, and returns the checkpoint's extra
    keys."""
    real_model_or_skip()
    from models import smollm
    from training import generate, smollm_heads, teacher
    from training.shared import RunConfig
    monkeypatch.setattr(generate, "CONTINUATIONS", {"train": 4, "tune": 2})
    monkeypatch.setattr(generate, "CHAT_TUNE", 2)
    monkeypatch.setattr(generate, "GEN_TOKENS", 6)
    monkeypatch.setattr(generate, "GEN_ROWS", 4)
    monkeypatch.setattr(smollm_heads, "smollm_corpus", lambda: (
        {s: "def f(x):\n    return x + 1\n" * 60 for s in task_text.SPLITS},
        {"name": "tiny", "chars": {s: [1560] for s in task_text.SPLITS}}))
    monkeypatch.setattr(smollm_heads, "teacher_text", lambda train: train * 4)
    monkeypatch.setattr(teacher, "TEACHER_WINDOW", 16)
    cfg = RunConfig(steps=2, lr=1e-3, warmup=1, batch_size=4, heads=3, log_every=1,
                      teacher_tokens=40, teacher_steps=2, draft_vocab=20, head_form=form,
                      teacher_targets=targets, continuations={"stern": 0, "chained": 8}[form],
                      chat_continuations={"stern": 0, "chained": 3}[form])
    model, extra = smollm_heads.smollm_heads(cfg, log=lambda *a: None)
    made = {"stern": 4, "chained": 8 + 3}[form]    # --continuations (else CONTINUATIONS') + chat
    record = extra["train"]
    assert record["continuations"]["train"] == made
    assert record["chat_continuations"]["train"] == {"stern": 0, "chained": 3}[form]
    tune = {"tune": 2 * 6} | ({"tune chat": 2 * 6} if form == "chained" else {})
    assert record["tokens_generated"] == {"train": made * 6, **tune}
    assert ("tune_chat" in record) == (form == "chained")     # the tune split's chat record
    assert {"rescorer", "rescorer_config", "train", "splits", "draft_vocab"} <= set(extra)
    assert len(model.heads) == 2 and extra["train"]["steps"] == 2
    forced = extra["train"]["teacher"]                  # two windows of 16: 32 of the 40 tokens
    assert forced["tokens"] == 32 and forced["steps"] == 2 and len(forced["tune_greedy_agreement"]) == 3
    assert forced["targets"] == targets and forced["with_target"][0] == 1.0
    assert model.config.head_form == extra["train"]["head_form"] == form
    assert all(type(hd).__name__ == {"stern": "SternHead", "chained": "ChainedHead"}[form]
               for hd in model.heads)
    assert type(smollm.rescorer(model, {**extra, "rescorer": extra["rescorer"]}).exit).__name__ \
        == "SternHead"
    assert len(extra["draft_vocab"]) == 20 and torch.equal(model.draft_vocab, extra["draft_vocab"])
    assert smollm.checked_draft_vocab(extra["draft_vocab"], model.config.vocab_size) is not None
