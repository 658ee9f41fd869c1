"""Tests for train_heads.py --distill (self-distillation): the frozen variant leaves greedy output and the
trunk/head-1 weights bit-identical, the joint variant saves a loadable checkpoint whose BPD output
is its own greedy output, batched greedy generation matches greedy_decode, bad flags exit 2."""
import os

import pytest
import torch
from hypothesis import given, strategies as st


import minibpd
from training import cli
from conftest import examples, random_prompt, tiny_model
from test_train_heads import CODE, TINY, fails, files_under
from training import finetune, teacher
from runtime import checkpoint, corpus, loop
from runtime.loop import lab_decode

DISTIL = ["--steps", "4", "--batch-size", "4", "--log-every", "1000", "--threads", "1",
          "--gen-rows", "6", "--regen-every", "2"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny trained checkpoint (1 layer, width 16, block 16, 4 heads) to distil."""
    folder = tmp_path_factory.mktemp("base")
    data = folder / "code.py"
    data.write_text(CODE, encoding="utf-8")
    out = str(folder / "base.pt")
    cli.train_main(TINY + ["--heads", "4", "--steps", "20", "--data", str(data), "--out", out])
    return out


def prompts_of(ck, n=3, length=5):
    text = ck["splits"]["test"]
    return [corpus.encode(text[i * 40:i * 40 + length], ck["vocab"]) for i in range(n)]


def test_frozen_keeps_greedy_and_trunk_bit_identical(base, tmp_path):
    out = str(tmp_path / "frozen.pt")
    cli.train_main(DISTIL + ["--distill", "frozen", "--base", base, "--out", out])
    (m0, ck0), (m1, ck1) = minibpd.load_checkpoint(base), minibpd.load_checkpoint(out)
    heads = {k for k in ck0["model"] if k.startswith("heads.")}
    assert heads and any(not torch.equal(ck0["model"][k], ck1["model"][k]) for k in heads)
    for k in ck0["model"]:
        if k not in heads:                           # trunk, embedding = head 1's projection
            assert torch.equal(ck0["model"][k], ck1["model"][k]), k
    for p in prompts_of(ck0):
        assert minibpd.greedy_decode(m0, p, 40) == minibpd.greedy_decode(m1, p, 40)
    assert ck1["distill"]["variant"] == "frozen" and ck1["distill"]["steps"] == 4
    assert ck1["rescorer"].keys() == ck0["rescorer"].keys()
    assert ck1["splits"] == ck0["splits"] and ck1["vocab"] == ck0["vocab"]


@pytest.mark.parametrize("teacher", ["current", "base"])
def test_joint_saves_a_checkpoint_whose_bpd_is_its_greedy(teacher, base, tmp_path):
    out = str(tmp_path / "joint.pt")
    cli.train_main(DISTIL + ["--distill", "joint", "--base", base, "--out", out,
                       "--teacher", teacher])
    ck0, (m1, ck1) = minibpd.load_checkpoint(base)[1], minibpd.load_checkpoint(out)
    assert not torch.equal(ck0["model"]["blocks.0.mlp.0.weight"], ck1["model"]["blocks.0.mlp.0.weight"])
    d = ck1["distill"]
    assert d["variant"] == "joint" and d["teacher"] == teacher and 0 <= d["seconds_generating"] <= d["seconds"] + 1
    assert len(d["tune_greedy_agreement"]) == 3 and all(w.dtype == torch.float16
                                                        for w in ck1["model"].values())
    for p in prompts_of(ck1):
        greedy = minibpd.greedy_decode(m1, p, 40)    # 40 > block 16: the window moves too
        assert lab_decode(m1, p, 40)[0] == greedy


def test_batched_greedy_matches_greedy_decode(base):
    model, ck = minibpd.load_checkpoint(base)
    prompts = prompts_of(ck, n=4)
    rows = loop.decode_rows(model, torch.tensor(prompts), 30)    # window moves at 16, 24
    for p, row in zip(prompts, rows.tolist()):
        assert row[len(p):] == minibpd.greedy_decode(model, p, 30)


def test_batched_rows_stay_independent():
    """The trained fixture above writes one token over and over, whatever the prompt, and most
    random tiny models fall into one loop too; this one (its seed and std chosen for it)
    continues four prompts four ways, so a row fed another row's keys shows."""
    model = tiny_model(2, 17, 1, 3, 8, std=0.2)
    prompts = [random_prompt(seed, 17, 5) for seed in range(4)]
    rows = loop.decode_rows(model, torch.tensor(prompts), 12).tolist()   # 17 tokens: past the window
    greedy = [minibpd.greedy_decode(model, p, 12) for p in prompts]
    assert len({tuple(g) for g in greedy}) == 4          # so that a row fed another's keys shows
    assert [row[5:] for row in rows] == greedy


@pytest.mark.parametrize("bad, named", [
    (["--distill", "both"], "--distill must be one of frozen, joint"),
    (["--distill", "joint", "--base", "{tmp}/missing.pt"], "no such checkpoint"),
    (["--distill", "joint", "--out", "{base}"], "is --base"),
    (["--distill", "joint", "--regen-every", "0"], "--regen-every"),
    (["--distill", "joint", "--gen-rows", "0"], "--gen-rows"),
    (["--distill", "joint", "--n-layer", "2"], "--n-layer does not apply with --distill"),
    (["--distill", "frozen", "--data", "x.txt"], "--data does not apply"),
    (["--regen-every", "5"], "only applies with --distill"),
    (["--distill", "joint", "--steps", "0"], "--steps"),
    (["--distill", "joint", "--teacher", "old"], "--teacher must be one of current, base"),
    (["--teacher", "base"], "only applies with --distill"),
    (["--distill", "joint", "--base", "{tmp}/junk.pt"], "corrupt or not a minibpd checkpoint"),
])
def test_bad_distill_arguments_exit_2(bad, named, base, tmp_path, capsys):
    out = str(tmp_path / "out.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    argv = [a.format(tmp=tmp_path, base=base) for a in bad]
    argv += [] if "--base" in argv else ["--base", base]
    argv += [] if "--out" in argv else ["--out", out]
    before = files_under(tmp_path)
    err = fails(["--threads", "1"] + argv, capsys)
    assert named in err
    assert files_under(tmp_path) == before


@pytest.mark.parametrize("bad, named", [
    (["--teacher-tokens", "5"], "--teacher-tokens only applies with --smollm"),
    (["--draft-vocab", "5"], "--draft-vocab only applies with --smollm"),
    (["--smollm", "--teacher-tokens", "-1"], "--teacher-tokens must be >= 0, got -1"),
    (["--smollm", "--teacher-steps", "0"], "--teacher-tokens needs --teacher-steps >= 1"),
    (["--smollm", "--teacher-targets", "some"], "--teacher-targets must be 'exact' or 'all'"),
    (["--smollm", "--head-form", "medusa"], "--head-form must be 'stern' or 'chained'"),
    (["--head-form", "chained"], "--head-form only applies with --smollm"),
    (["--teacher-targets", "all"], "--teacher-targets only applies with --smollm"),
    (["--smollm", "--draft-vocab", "1"], "--draft-vocab must be 0 (all tokens) or 2..49152"),
    (["--smollm", "--draft-vocab", "49153"], "--draft-vocab must be 0 (all tokens) or 2..49152"),
    (["--continuations", "8"], "--continuations only applies with --smollm"),
    (["--smollm", "--continuations", "0"], "--continuations must be >= 1, got 0"),
    (["--chat-continuations", "8"], "--chat-continuations only applies with --smollm"),
    (["--smollm", "--chat-continuations", "-1"], "--chat-continuations must be >= 0, got -1"),
    (["--smollm", "--chat-continuations", "100000"], "train-split questions (lab/questions.py), got"),
])
def test_bad_smollm_arguments_exit_2(bad, named, tmp_path, capsys):
    """--smollm's own flags, refused before any model is read (no optional package needed)."""
    err = fails(["--threads", "1", "--out", str(tmp_path / "o.pt")] + bad, capsys)
    assert named in err and not os.path.exists(tmp_path / "o.pt")


def test_draft_vocabulary_and_targets_in_it():
    """teacher.draft_vocabulary: the S most frequent ids, ties to the smaller id, sorted;
    in_vocab: a target's index in it, -1 for none (-1) and for a token outside."""
    tokens = torch.tensor([[5, 5, 5, 2, 2, 9], [9, 7, 7, 0, 3, 3]])    # counts 5:3, then 2, 3, 7, 9: 2
    ids = teacher.draft_vocabulary(tokens, 3, 10)
    assert ids.tolist() == [2, 3, 5] and teacher.draft_vocabulary(tokens, 0, 10) is None
    with pytest.raises(ValueError, match="2 to 10 tokens"):
        teacher.draft_vocabulary(tokens, 11, 10)
    targets = torch.tensor([[5, -1, 9], [2, 3, 0]])
    assert teacher.in_vocab(targets, ids, 10).tolist() == [[2, -1, -1], [0, 1, -1]]
    assert teacher.in_vocab(targets, None, 10) is targets


@examples(0.4)
@given(seed=st.integers(0, 10**6), h=st.integers(2, 5), T=st.integers(1, 9))
def test_forced_targets_are_greedy_tokens_only(seed, h, T):
    """teacher.forced_targets by brute force: head i's target at s is the argmax at s + i - 1
    exactly where the text's tokens s + 1 .. s + i - 1 were the argmaxes before them, else -1."""
    g = torch.Generator().manual_seed(seed)
    windows, tokens = torch.randint(3, (2, T), generator=g), torch.randint(3, (2, T), generator=g)
    got = teacher.forced_targets(windows, tokens, h)
    for w in range(2):
        for s in range(T):
            for i in range(1, h + 1):
                kept = s + i - 1 < T and all(windows[w, s + j] == tokens[w, s + j - 1] for j in range(1, i))
                assert got[w, s, i - 1] == (tokens[w, s + i - 1] if kept else -1), (w, s, i)


@examples(0.4)
@given(seed=st.integers(0, 10**6), h=st.integers(2, 5), T=st.integers(1, 9))
def test_chain_inputs_are_the_texts_next_tokens(seed, h, T):
    """teacher.chain_inputs by brute force: at state s, chained head i + 2 reads the text's token
    s + 1 + i (-1 past the window), and its target, the argmax at s + i + 1, follows exactly the
    tokens it has read."""
    windows = torch.randint(3, (2, T), generator=torch.Generator().manual_seed(seed))
    got = teacher.chain_inputs(windows, h)
    assert got.shape == (2, T, h - 1)
    for w in range(2):
        for s in range(T):
            for i in range(h - 1):
                assert got[w, s, i] == (windows[w, s + 1 + i] if s + 1 + i < T else -1), (w, s, i)


def test_distill_defaults(tmp_path):
    args = cli.parse_train_args(["--distill", "joint", "--steps", "7"])
    cli.check_distill_args(args)
    assert (args.steps, args.lr, args.warmup, args.out) == \
        (7, finetune.DISTILL_DEFAULTS["lr"], finetune.DISTILL_DEFAULTS["warmup"], finetune.DISTILLED)
    assert args.base == checkpoint.CHECKPOINT
    plain = cli.parse_train_args([])
    cli.check_distill_args(plain)
    assert plain.steps == 5000 and plain.out == checkpoint.CHECKPOINT and plain.distill is None


# ----------------------------------------------------------------------------- --anchor

@examples(0.4)
@given(seed=st.integers(0, 10**6), plen=st.integers(1, 8))
def test_the_anchor_by_brute_force(seed, plen):
    """finetune.anchor_kl is KL(base || model) of head 1 averaged over the kept positions."""
    model, other = tiny_model(seed, 5, 1, 3, 8), tiny_model(seed + 1, 5, 1, 3, 8)   # h 3, T 8
    g = torch.Generator().manual_seed(seed)
    windows = torch.randint(5, (4, 11), generator=g)
    mask = (torch.arange(8) >= plen - 1).expand(4, 8)
    own = model.lm_head(model(windows[:, :8]))
    kl = finetune.anchor_kl(other, windows[:, :8], own, mask)
    assert finetune.anchor_kl(model, windows[:, :8], own, mask).abs() < 1e-12
    logp, ref = torch.log_softmax(own, -1), torch.log_softmax(other.lm_head(other(windows[:, :8])), -1)
    kept = [(b, t) for b in range(4) for t in range(8) if t >= plen - 1]
    want = sum((ref[b, t].exp() * (ref[b, t] - logp[b, t])).sum() for b, t in kept) / len(kept)
    assert kl.item() == pytest.approx(want.item(), rel=1e-9)


def test_joint_with_anchor_records_it(base, tmp_path):
    out = str(tmp_path / "anchored.pt")
    cli.train_main(DISTIL + ["--distill", "joint", "--base", base, "--out", out, "--teacher",
                       "base", "--anchor", "1.0"])
    model, ck = minibpd.load_checkpoint(out)
    assert ck["distill"]["anchor"] == 1.0
    for p in prompts_of(ck):
        assert lab_decode(model, p, 40)[0] == minibpd.greedy_decode(model, p, 40)


@pytest.mark.parametrize("bad, named", [
    (["--distill", "joint", "--anchor", "-1"], "--anchor must be a finite number >= 0, got -1.0"),
    (["--distill", "joint", "--anchor", "nan"], "--anchor must be a finite number >= 0, got nan"),
    (["--distill", "frozen", "--anchor", "1"], "--anchor does not apply with --distill frozen"),
    (["--anchor", "1"], "--anchor only applies with --distill"),
])
def test_bad_anchor(bad, named, base, tmp_path, capsys):
    with_base = ["--base", base] if "--distill" in bad else []
    err = fails(["--threads", "1", "--out", str(tmp_path / "o.pt")] + with_base + bad, capsys)
    assert named in err


def test_replay_heads_is_the_decode_loops_rule():
    """SmolLM2's training record replays BPD from the heads' argmaxes through lab.analysis.replay
    (the decode loop's draft_budget and accept); the same calls as the rule written out: with k
    tokens known, state k - 1's heads 2..n guess tokens k..; the matching prefix plus one."""
    from training.smollm_heads import replay_heads
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(5, (3, 17), generator=g)
    right = torch.stack([torch.cat([tokens, tokens.new_full((3, 4), -1)], 1)[:, i:i + 17]
                         for i in range(4)], -1)                           # [3, 17, 4]: all right
    preds = torch.where(torch.rand(right.shape, generator=g) < 0.7, right, right.new_full((), 9))
    for heads in (1, 2, 4):
        calls = 0
        for row, truth in zip(preds.tolist(), tokens.tolist()):
            k, calls = 1, calls + 1
            while k < 17:
                m = min(heads - 1, 17 - k)
                a = next((i for i in range(m) if row[k - 1][1 + i] != truth[k + i]), m)
                k, calls = k + a + 1, calls + 1
        assert replay_heads(preds, tokens, heads) == 3 * 17 / calls
