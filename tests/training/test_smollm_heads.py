"""Tests for SmolLM2's heads (training/smollm_heads.py) and their generated data
(training/generate.py): the length batches (sorted, each prompt's start dropped to the batch's
shortest), and, with SmolLM2 installed (else skipped, naming the pip command), the training run
shrunk to a few continuations and two steps."""
import pytest
import torch

from lab import task_text
from tests.helpers import real_model_or_skip
from training import generate


def test_length_batches_keep_each_prompts_end():
    ids = [[1, 2, 3, 4, 5], [9], [7, 8], [4, 5, 6, 7]]
    batches, cut = generate.length_batches(ids, rows=2, longest=3)
    assert [b.tolist() for b in batches] == [[[9], [8]], [[5, 6, 7], [3, 4, 5]]]
    assert cut == 1 + 1 + 2


@pytest.mark.parametrize("form, targets", [("stern", "exact"), ("chained", "all")])
def test_smollm_heads_trains_a_step(monkeypatch, form, targets):
    """`python train_heads.py --smollm`, shrunk to a few continuations and two steps: it builds
    its exit adapter (llama.bpd_head, in BPDHead's form whatever the heads' form: the call that
    once passed a config to BPDHead crashed here), trains, and returns the checkpoint's extra
    keys."""
    real_model_or_skip()
    from models import smollm
    from training import generate, smollm_heads, teacher
    from training.cli import RunConfig
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
