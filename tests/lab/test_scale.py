"""The scale map (scale.py): the projection on hand-made numbers, the window accounting against
real decodes, the in-situ timers, crossover detection, call costs that grow with tokens, and
run() end to end on the tiny checkpoint with small sizes."""
import json
import math

import pytest
import torch
from hypothesis import given, strategies as st

import decoders
from decoders.lookup import PromptLookupDrafter
import lattice
from lab import figures_scale, scale, scale_timing
from lab.analysis import greedy_processed
from lab.bench import make_prompts
from lab.run import Run
from conftest import examples, on_random_models, random_prompt, tiny_model
from minibpd import window_start
from decoders.resources import Resources, split_text
from minibpd import GPT, GPTConfig, ArgmaxDrafter, greedy_decode, load_checkpoint
from runtime import kvcache
from runtime.loop import lab_decode
from tests.helpers import tiny_ckpt  # noqa: F401 (a fixture)

pytestmark = pytest.mark.assignment6   # docs/coursework.md

COST = {"call_ms": {"1": 1.0, "8": 3.0}, "tree_ms": {"tree": 6.0}, "window_ms": 10.0,
        "heads_ms": 0.5}


def hand_profile(**kw):
    base = dict(tokens=10, calls=4, steps=3, windows=1, window_tail=64, verified=7.0,
                drafting_ms=2.0, outside_ms=0.5, refill_ms=0.25)
    return scale.Profile(**{**base, **kw})


# ----------------------------------------------------------------------------- the projection

def test_ms_per_token_by_hand():
    # forward: 3 steps x call(8) = 9, 1 call of one token = 1, 1 refill: 10 - 1 = 9 -> 19;
    # outside + refill: 4 calls x 0.75 = 3; drafting + heads: 3 steps x 2.5 = 7.5 -> 29.5 / 10
    assert scale.ms_per_token(hand_profile(), COST) == pytest.approx(2.95)
    assert scale.ms_per_token(hand_profile(), COST, refill=False) == pytest.approx(2.85)
    # a tree decoder verifies with its tree (6 ms) instead: 3 x 6 + 1 + 9 + 3 + 7.5 = 38.5
    assert scale.ms_per_token(hand_profile(tree=True), COST, "tree") == pytest.approx(3.85)
    # 4.5 drafted tokens: a row of 5.5 tokens, 1 + 4.5 / 7 x 2 ms, linear between 1 and 8
    v = 1 + 4.5 / 7 * 2
    assert scale.ms_per_token(hand_profile(verified=4.5), COST) == pytest.approx(
        (3 * v + 1 + 9 + 3 + 7.5) / 10)
    # greedy: 10 one-token calls, 1 refill, 0.1 ms outside each: (10 + 9 + 1) / 10
    greedy = hand_profile(calls=10, steps=0, verified=0.0, drafting_ms=0.0, outside_ms=0.1,
                          refill_ms=0.0)
    assert scale.ms_per_token(greedy, COST) == pytest.approx(2.0)


def test_split_rest_by_hand():
    p = hand_profile(forward_ms=5.0, rest_ms=1.0, outside_ms=0.0, refill_ms=0.0)
    p.split_rest(COST, None)
    assert p.outside_ms == pytest.approx(1.0 - 0.5 * 3 / 4)          # the heads taken out
    assert p.refill_ms == pytest.approx(5.0 - 19 / 4)                # in situ - tight loop


def test_crossover_params():
    row = lambda params, tps: {"params": params, "projected_tokens_per_s": tps}
    rows = [row(1, {"greedy": 9, "bpd": 10, "slow": 5, "late": 8, "tie": 10}),
            row(2, {"greedy": 5, "bpd": 6, "slow": 4, "late": 7, "tie": 6}),
            row(3, {"greedy": 2, "bpd": 3, "slow": 3, "late": 4, "tie": 3})]
    assert scale.crossover_params(rows, names=["slow", "late", "tie"]) == \
        {"slow": None, "late": 2, "tie": None}                       # a tie does not beat
    assert scale.crossover_params(rows, "greedy", ["bpd", "slow"]) == {"bpd": 1, "slow": 3}
    assert set(scale.crossover_params([row(1, {d: 1 for d in decoders.DECODERS})])) == \
        set(decoders.refined())


# ----------------------------------------------------------------------------- the run's accounting

@given(plen=st.integers(1, 40), n=st.integers(1, 60), B=st.integers(1, 16))
@examples(4)
def test_window_tails_match_greedy(plen, n, B):
    """Greedy feeds one token per call, and each whole window it refeeds (greedy_processed)."""
    tails = scale.window_tails(plen, [1] * n, B)
    assert tails[0] == plen - window_start(plen, B)
    assert sum(tails) + n - len(tails) == greedy_processed(plen, n, B)


@on_random_models(p=st.integers(1, 4))
def test_window_tails_match_bpd(device, m, plen, n, p):
    """Every call of a real decode feeds one token, or a whole window, plus what it verifies
    (one row, or a tree: Stats.processed counts each token once)."""
    model, prompt = tiny_model(*m, device=device), random_prompt(m[0], m[1], plen)
    drafter = ArgmaxDrafter() if p == 1 else lattice.PBestDrafter(2, p)
    _, stats = lab_decode(model, prompt, n, drafter)
    tails = scale.window_tails(plen, stats["accepted"], model.config.block_size)
    assert sum(tails) + stats["calls"] - len(tails) + stats["verified"] == stats["processed"]


def test_timers_leave_decoding_alone():
    model, prompt = tiny_model(3, 20, 1, 4, 12), random_prompt(3, 20, 9)
    timed = scale_timing.TimedDrafter(ArgmaxDrafter())
    with scale_timing.ForwardTimer(model) as fwd:
        out, stats = lab_decode(model, prompt, 30, timed)
    assert out == greedy_decode(model, prompt, 30)
    assert fwd.seconds > 0 and timed.seconds > 0 and timed.name == "bpd"
    assert not model._forward_hooks and not model._forward_pre_hooks      # removed on exit


def test_a_timed_drafter_declares_what_its_drafter_declares():
    """The timed copy of a drafter that runs past the heads (prompt lookup's copy,
    max_draft_tokens) drafts as far as the drafter does untimed, and decodes the same."""
    model, prompt = tiny_model(3, 20, 1, 4, 12), random_prompt(3, 20, 9) * 3
    lookup = PromptLookupDrafter(ngram=1, copy=7)
    timed = scale_timing.TimedDrafter(PromptLookupDrafter(ngram=1, copy=7))
    assert (timed.name, timed.max_drafts, timed.max_draft_tokens) == ("lookup", 2, 7)
    out, stats = lab_decode(model, prompt, 30, lookup)
    timed_out, timed_stats = lab_decode(model, prompt, 30, timed)
    assert out == timed_out == greedy_decode(model, prompt, 30)
    assert stats["calls"] == timed_stats["calls"] and timed.seconds > 0


class Falsy(ArgmaxDrafter):
    """Plain BPD's drafts from a drafter whose truth value is false (a sized object, no items)."""
    def __len__(self):
        return 0


def test_in_situ_times_a_falsy_drafter():
    """A falsy drafter is timed like any other: `drafter and TimedDrafter(drafter)` left it bare."""
    model, prompt, falsy = tiny_model(3, 20, 1, 4, 12), random_prompt(3, 20, 9), Falsy()
    twin = scale_timing.InSitu(decoders.Method("falsy", falsy))
    assert isinstance(twin.drafter, scale_timing.TimedDrafter) and twin.drafter.drafter is falsy
    out, _ = twin.decode(model, prompt, 30)
    assert out == greedy_decode(model, prompt, 30) and twin.records[-1][3] > 0


def test_in_situ_medians_by_hand():
    twin = scale_timing.InSitu(decoders.Method("bpd", ArgmaxDrafter()))
    # the warm-up, then 2 repetitions of 2 prompts: (forward s, drafter s, calls, draft steps)
    twin.records = [(9, 9, 9, 9), (1.0, 0.2, 10, 8), (1.0, 0.2, 10, 8),
                    (2.0, 0.4, 10, 8), (2.0, 0.4, 10, 8)]
    drafting, forward, rest = twin.medians([3.0, 6.0], 2)
    # per repetition: drafting 0.4 / 16 and 0.8 / 16 s, forward 2 / 20 and 4 / 20 s, rest
    # (3 - 2 - 0.4) / 20 and (6 - 4 - 0.8) / 20 s; the median of two is their mean
    assert drafting == pytest.approx(1e3 * 0.6 / 16)
    assert forward == pytest.approx(1e3 * 3 / 20)
    assert rest == pytest.approx(1e3 * (0.6 + 1.2) / 2 / 20)


# ----------------------------------------------------------------------------- costs

@torch.no_grad()
def test_call_ms_grows_with_tokens():
    with torch.random.fork_rng():
        model = GPT(GPTConfig(64, 128, 2, 4, 256, 4)).eval()
    ms = lambda fn: scale_timing.timed_all({0: fn}, reps=3)[0]
    one = ms(scale_timing.row_pass(model, 1, 32))
    many = ms(scale_timing.row_pass(model, 64, 32))
    assert many > 2 * one > 0
    drafts = [[5] + [t] * 3 for t in range(8)]                  # 8 drafts, a tree of 24 nodes
    assert ms(scale_timing.tree_pass(model, drafts, 32)) > \
        ms(scale_timing.tree_pass(model, drafts[:1], 32))
    with pytest.raises(ValueError, match="tokens"):
        scale_timing.row_pass(model, 100, 32)
    with pytest.raises(ValueError, match="tree_pass"):
        scale_timing.tree_pass(model, [[5] + [1] * 4], 32)     # 4 drafted: more than h - 1 = 3


# ----------------------------------------------------------------------------- run, end to end

@pytest.fixture
def tiny_run(tiny_ckpt, monkeypatch):
    """run() on the tiny checkpoint (1 layer, width 32), with two larger sizes."""
    sizes = [GPTConfig(2, 2, 1, 2, 32, 2), GPTConfig(2, 2, 2, 2, 48, 2), GPTConfig(2, 2, 2, 2, 64, 2)]
    monkeypatch.setattr(scale, "SIZES", sizes)   # vocabulary, window and heads: the model's
    monkeypatch.setattr(scale_timing, "REPS", 2)
    monkeypatch.setattr(scale_timing, "BATCH_S", 0.002)
    model, ck = load_checkpoint(tiny_ckpt)
    res, chosen = Resources(model, ck), decoders.settings(overrides={"k": 2, "p": 2})
    prompts = make_prompts(split_text(ck, "test"), ck["vocab"], 2, 24)
    return scale.scale_map(Run(res, chosen, prompts, 20), log=lambda s: None), model


def test_run_on_tiny_checkpoint(tiny_run, capsys, tmp_path):
    r, model = tiny_run
    names = ["greedy"] + [k for k, d in decoders.DECODERS.items() if not d.peeks]
    assert [row["n_embd"] for row in r["scale"]] == [32, 48, 64]          # own size, then larger
    assert [row["params"] for row in r["scale"]] == sorted({row["params"] for row in r["scale"]})
    assert r["scale"][0]["params"] == sum(p.numel() for p in model.parameters())
    for row in r["scale"]:
        assert row["call_ms"] and all(v > 0 for v in row["call_ms"].values())
        assert set(row["tree_ms"]) == {"pbest0", "pbest", "lookup", "lookup_pbest"}   # P > 1
        assert row["window_ms"] > 0
        assert list(row["projected_tokens_per_s"]) == names
        assert all(0 < v < math.inf for v in row["projected_tokens_per_s"].values())
    assert set(r["validation"]) == set(names) and set(r["drafting_ms"]) == set(names)
    for v in r["validation"].values():
        assert v["measured"] > 0 and v["projected"] > 0
        assert v["error"] == pytest.approx(v["projected"] / v["measured"] - 1)
    params = {row["params"] for row in r["scale"]}
    assert set(r["crossover_params"]) == set(decoders.refined())
    assert all(v is None or v in params for v in r["crossover_params"].values())
    assert r["drafting_ms"]["greedy"] == 0 and r["profiles"]["bpd"]["steps"] > 0
    assert set(r["identical_to_greedy"]) == set(names[1:]) and r["identical_to_greedy"]["bpd"]
    assert r["device"] == "cpu" and r["threads"] == torch.get_num_threads() and r["seconds"] > 0
    json.dumps(r)                                                             # JSON-ready
    figures_scale.print_scale(r)
    out = capsys.readouterr().out
    assert "beats plain BPD from" in out and max(map(len, out.splitlines())) <= 80
    pytest.importorskip("matplotlib")
    assert (tmp_path / figures_scale.plot_scale(r, str(tmp_path))).stat().st_size > 0


def test_run_refuses_bad_input_before_any_call(tiny_ckpt, monkeypatch):
    model, ck = load_checkpoint(tiny_ckpt)
    res, chosen = Resources(model, ck), decoders.settings()
    prompts = make_prompts(split_text(ck, "test"), ck["vocab"], 1, 24)
    monkeypatch.setattr(GPT, "forward", lambda *a, **k: pytest.fail("a model call came first"))
    for kw, message in (({"device": "tpu"}, "device must be"), ({"n": 0}, "n >= 1"),
                        ({"prompts": []}, "at least one prompt")):
        args = {"prompts": prompts, "n": 10, **kw}
        with pytest.raises(ValueError, match=message):
            scale.scale_map(Run(res, chosen, args.pop("prompts"), args.pop("n")), **args)
    for kw in ({"temperature": 1.0}, {"verify": "tree"}):     # what the projection assumes
        with pytest.raises(ValueError, match="temperature 0 and verify 'auto'"):
            scale.scale_map(Run(res, chosen, prompts, 10, **kw))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            scale.scale_map(Run(res, chosen, prompts, 10), device="cuda")


def test_scale_command(tiny_ckpt, capsys, monkeypatch):
    """`minibpd.py --scale --json`: one JSON object with the scale map's keys; --temperature is
    refused before any work."""
    from lab import cli
    monkeypatch.setattr(scale, "SIZES", scale.SIZES[:2])
    code = cli.main(["--scale", "--json", "--checkpoint", tiny_ckpt, "--prompts", "2",
                     "--new-tokens", "8"])
    r = json.loads(capsys.readouterr().out)
    assert code == 0 and {"scale", "drafting_ms", "validation", "crossover_params"} <= set(r)
    assert len(r["scale"]) >= 2 and all(r["identical_to_greedy"].values())
    assert cli.main(["--scale", "--temperature", "1", "--checkpoint", tiny_ckpt]) == 2
    assert "drop --temperature" in capsys.readouterr().err
