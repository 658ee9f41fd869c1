"""lab.run.Run, the one object the bench, the tuner, the analyses, the tasks, the approximate
section and the scale map take: the model is its resources' (one place of truth), greedy's
continuations and the replays' items are decoded once, on() starts afresh on other prompts, and
drafters peek at an answer only where greedy is decoded anyway or a decoder peeks."""
import json

import pytest

import decoders
from decoders.resources import Resources, split_text
from lab import analysis, cli
from lab import run as run_module
from lab.bench import make_prompts
from lab.run import Run
from minibpd import greedy_decode, load_checkpoint
from tests.helpers import tiny_ckpt  # noqa: F401 (a fixture)


@pytest.fixture
def tiny(tiny_ckpt):
    model, ck = load_checkpoint(tiny_ckpt)
    return model, ck, make_prompts(split_text(ck, "test"), ck["vocab"], 2, 24)


def test_model_is_the_resources(tiny):
    model, ck, prompts = tiny
    run = Run(Resources(model, ck), decoders.settings(), prompts, 8)
    assert run.model is model and run.ck is ck
    view = Run(Resources(model, ck, reference=True), decoders.settings(), prompts, 8)
    assert view.model is view.res.model and view.model is not model and view.model.reference


def test_greedy_and_items_are_decoded_once(tiny, monkeypatch):
    model, ck, prompts = tiny
    calls = []
    monkeypatch.setattr(run_module, "greedy_decode",
                        lambda *a: calls.append(a) or greedy_decode(*a))
    run = Run(Resources(model, ck), decoders.settings(), prompts, [8, 5])
    assert run.greedy is None and not calls                 # nothing decoded at construction
    assert run.lengths == [8, 5] and [len(g) for g in run.continuations()] == [8, 5]
    assert run.continuations() == [greedy_decode(model, p, k) for p, k in zip(prompts, [8, 5])]
    assert run.answers == [p + g for p, g in zip(prompts, run.greedy)]
    assert run.items is run.items and len(calls) == 2       # once per prompt, for everything
    assert run.items[0][:2] == analysis.prepare(model, prompts[:1], 8)[0][:2]
    other = run.on(prompts[:1], 4)
    assert other.greedy is None and other.lengths == [4] and other.chosen is run.chosen
    assert other.generator is run.generator and len(other.items[0][1]) == len(prompts[0]) + 4
    given = Run(run.res, run.chosen, prompts, 8, greedy=[[1], [2]])
    assert given.continuations() == [[1], [2]] and len(calls) == 3


def test_answer_keys_only_where_greedy_is_needed(tiny):
    model, ck, prompts = tiny
    greedy0 = Run(Resources(model, ck), decoders.settings(), prompts, 4)
    assert greedy0.answer_keys() == greedy0.answers
    sampled = Run(Resources(model, ck), decoders.settings(), prompts, 4, temperature=1.0)
    with decoders.select(["lookup"]):                        # nothing peeks: no greedy decode
        assert sampled.answer_keys() == [None, None] and sampled.greedy is None
    assert sampled.answer_keys() == sampled.answers          # the oracle peeks


def test_sampled_bench_without_a_peeking_decoder(tiny_ckpt, capsys):
    """--bench at T > 0 with only decoders that do not peek: no greedy decode, no traceback (it
    once indexed the missing answers)."""
    code = cli.main(["--bench", "--json", "--temperature", "1", "--decoders", "lookup",
                     "--prompts", "1", "--new-tokens", "4", "--checkpoint", tiny_ckpt])
    r = json.loads(capsys.readouterr().out)
    assert code == 0 and set(r["distribution_check"]) == {"bpd", "lookup"}
