"""Refined drafters (Kim §7) keep BPD exact, and the offline replay (analysis.py) reproduces the
real decode loop. Every decoder in the registry (decoders.DECODERS), on float64 random tiny
models, as in test_minibpd.py; CPU and, if present, CUDA."""
import copy
import json

import pytest
import torch
from hypothesis import example, strategies as st

from lab import analysis
from lab import cli
from lab.figures import won_tied_lost
import decoders
import lattice
from runtime import contract
from conftest import on_random_models, random_prompt, tiny_model
from decoders import budgets
from decoders.fastlattice import FastPBestDrafter
from decoders.lookup import PromptLookupDrafter
from decoders.neural import CachedNeuralDrafter
from minibpd import GPT, ArgmaxDrafter, greedy_decode
from runtime.fast_heads import FastGPT
from ngram import NgramLM
from runtime import tree
from runtime.loop import lab_decode
from tests.helpers import tiny_ckpt  # noqa: F401 (a fixture)

pytestmark = pytest.mark.assignment5   # docs/coursework.md

NAMES = list(decoders.DECODERS)
DP = ("ngram", "pbest", "lookup_pbest")   # an n-gram DP: refused over its budget


def make(name, res, full, k, p, alpha, order):
    """A registry decoder on a random model, with settings drawn by hypothesis (each decoder
    takes the ones it has)."""
    s = decoders.settings(overrides={"k": k, "p": p, "alpha": alpha, "order": order})[name]
    return decoders.make(name, res, s, full)


settings_st = st.tuples(st.integers(1, 70), st.integers(1, 20), st.sampled_from([0.0, 0.3, 0.7, 1.0]),
                        st.integers(1, 4))


def setup(m, device, order, plen, n, cls=GPT):
    """A random model (cls: GPT or its fast twin), its Resources (a random small LM, an n-gram
    LM fitted on random text), a prompt and its greedy continuation."""
    model = tiny_model(*m, device=device, cls=cls)
    seed, V, _, _, B = m
    small = tiny_model(seed + 1, V, 1, 1, B, device=device)
    lm = NgramLM(order, V).fit(random_prompt(seed + 2, V, 300))
    prompt = random_prompt(seed, V, plen)
    full = prompt + greedy_decode(model, prompt, n)
    return model, decoders.Resources(model, small=small, lms={order: lm}), prompt, full


@on_random_models(s=settings_st)
def test_every_drafter_is_exact(device, m, s, plen, n):
    """k may exceed the vocabulary (clamped); p may exceed the number of lattice paths."""
    k, p, alpha, order = s
    model, res, prompt, full = setup(m, device, order, plen, n)
    for name in NAMES:
        if k ** order * p > budgets.MAX_DP_CELLS and name in DP:
            continue                                   # refused up front (test_cli.py)
        drafter = make(name, res, full, k, p, alpha, order)
        out, stats = lab_decode(model, prompt, n, drafter)
        assert out == full[plen:], name
        assert 1.0 <= stats["block_efficiency"] <= model.config.n_bpd_heads
        for step in stats["steps"]:
            assert 1 <= len(step["drafts"]) <= contract.max_drafts(drafter)


@on_random_models(s=settings_st)
def test_offline_replay_equals_decode(device, m, s, plen, n):
    """One forward pass + replay gives exactly the calls and accepted lengths of bpd_decode, and
    from every context the oracle accepts at least as much as any drafter at the same k."""
    k, p, alpha, order = s
    model, res, prompt, full = setup(m, device, order, plen, n)
    heads = analysis.heads_along(model, full, plen)
    h, B = model.config.n_bpd_heads, model.config.block_size
    oracle = lattice.OracleDrafter(full, k)
    for name in NAMES:
        if k ** order * p > budgets.MAX_DP_CELLS and name in DP:
            continue
        _, online = lab_decode(model, prompt, n, make(name, res, full, k, p, alpha, order))
        drafter = make(name, res, full, k, p, alpha, order)
        offline = analysis.replay(drafter, heads, full, plen, n, h, B)
        assert (offline["calls"], offline["accepted"]) == (online["calls"], online["accepted"]), name
        if isinstance(drafter, PromptLookupDrafter):
            continue          # a copy from the context need not be a path of the top-k lattice
        for step in offline["steps"]:
            pend, m_ = step["pending"], len(step["drafts"][0]) - 1
            best = oracle(heads[pend][:m_ + 1], full[:step["context"]])[0]
            assert analysis.marks(best, full, pend)[1] >= step["accepted"], name


def test_neural_drafter_alpha_zero_is_bpd():
    model = tiny_model(3, 20, 1, 6, 16)
    small = tiny_model(4, 20, 1, 1, 16)
    prompt = random_prompt(5, 20, 10)
    _, a = lab_decode(model, prompt, 40, ArgmaxDrafter())
    _, b = lab_decode(model, prompt, 40, CachedNeuralDrafter(small, 8, 0.0))
    assert a["accepted"] == b["accepted"]


def test_neural_drafter_cache_survives_reuse():
    """One drafter reused over several prompts (the bench does this) gives the same drafts as a
    fresh one: a new sequence resets its small-LM cache."""
    model = tiny_model(3, 20, 2, 6, 12)
    small = tiny_model(4, 20, 1, 1, 12)
    reused = CachedNeuralDrafter(small, 4, 0.6)
    for seed in range(4):
        prompt = random_prompt(seed, 20, 9)
        _, a = lab_decode(model, prompt, 30, reused)
        _, b = lab_decode(model, prompt, 30, CachedNeuralDrafter(small, 4, 0.6))
        assert a["steps"] == b["steps"]


@pytest.mark.parametrize("kwargs, message", [
    ({"k": 0}, "k must be"), ({"p": 0}, "p must be"), ({"alpha": 1.5}, "alpha must be"),
    ({"alpha": -0.1}, "alpha must be"), ({"order": 0}, "order must be"), ({"k": 2.5}, "k must be")])
def test_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        budgets.check_settings(**kwargs)


def test_missing_rescorer(tiny_ckpt, tmp_path, capsys):
    ck = torch.load(tiny_ckpt, weights_only=True)
    del ck["rescorer"]
    path = str(tmp_path / "norescorer.pt")
    torch.save(ck, path)
    code = cli.main(["--prompt", "The", "--decoder", "neural", "--checkpoint", path])
    err = capsys.readouterr().err
    assert code == 2 and "no rescorer" in err


def test_bench_json_has_every_decoder(tiny_ckpt, capsys):
    code = cli.main(["--bench", "--json", "--checkpoint", tiny_ckpt, "--prompts", "2",
                         "--new-tokens", "10", "--k", "3", "--p", "4", "--alpha", "0.4"])
    res = json.loads(capsys.readouterr().out)
    assert code == 0
    for name in NAMES:
        assert res["identical_to_greedy"][name] is True
        assert 1.0 <= res["block_efficiency"][name] <= 8
    for name in NAMES[:-1]:
        assert res["tokens_per_s"][name] > 0 and res["speedup_vs_greedy"][name] > 0
    assert res["settings"]["pbest"] == {"k": 3, "p": 4, "alpha": 0.4, "order": 4, "nodes": 0}
    ppl = res["ngram_perplexity"]
    assert all(v > 1 for v in ppl.values())
    check_paper_keys(res, h=8)


def share(x):
    return 0.0 <= x <= 1.0


def check_paper_keys(res, h):
    """The analysis sections of --bench --json (Kim §6-7): keys present, values in range."""
    for name, v in res["repetition"].items():
        assert share(v["adjacent_repeat"]) and 1.0 <= v["longest_run"] <= h, name
    assert "greedy_text" in res["repetition"] and "bpd" in res["repetition"]
    assert len(res["head_entropy"]) == h and all(e >= 0 for e in res["head_entropy"])
    assert 1 <= res["hmax"] <= h and all(map(share, res["head_accuracy"]))
    assert list(res["oracle_by_k"]) == ["1", "2", "4", "8", "16"]
    assert all(1.0 <= v <= h for v in res["oracle_by_k"].values())
    assert abs(res["oracle_by_k"]["1"] - res["block_efficiency"]["bpd"]) < 1e-9   # k = 1 is BPD
    assert set(res["relative_gain"]) == set(decoders.refined()) == \
        {"neural", "ngram", "pbest0", "pbest", "lookup", "lookup_pbest"}
    assert res["relative_gain"]["lookup"]["gap_closed"] is None       # no k: its oracle is BPD's
    for name, w in res["win_tie_loss"].items():
        assert abs(w["win"] + w["tie"] + w["loss"] - 1) < 1e-9 and share(w["wins_replacing_repeat"])
        c = w["counts"]
        assert c["win"] + c["tie"] + c["loss"] == c["steps"] and c["wins_replacing_repeat"] <= c["win"]
    for name, c in res["cost"].items():
        assert c["base_calls"] <= 1 and c["base_tokens"] > 0 and c["flop_ratio"] > 0, name
        assert (c["small_lm_calls"] > 0) == (name == "neural"), name      # counted by the drafters
        assert (c["ngram_lookups"] > 0) == (name in ("ngram", "pbest", "lookup_pbest")), name


def test_won_tied_lost_prints_counts_not_rounded_shares():
    """1 win in 998 steps printed "0/100/0%, 100% of wins fixed a repeat"."""
    line = won_tied_lost({"steps": 998, "win": 1, "tie": 996, "loss": 1, "wins_replacing_repeat": 1})
    assert line == "steps won/tied/lost 1/996/1 of 998, 1 of 1 wins fixed a repeat"


@pytest.mark.assignment2
def test_bench_sweep(tiny_ckpt, capsys):
    code = cli.main(["--bench", "--checkpoint", tiny_ckpt, "--prompts", "2", "--new-tokens",
                         "8", "--sweep", "--no-color"])
    out = capsys.readouterr().out
    assert code == 0 and "oracle block efficiency by k" in out
    for name, d in decoders.DECODERS.items():
        for key in ("k", "p", "alpha"):
            if key in d.defaults and not d.peeks:
                assert f"sweep: {name} block efficiency by {key}" in out
    assert "\033[" not in out                                        # no colour when asked


def test_plugin_decoder_runs_everywhere(tiny_ckpt, tmp_path, capsys, monkeypatch, request):
    """One class and one register(...) call: the new decoder is in --help, --prompt and the
    bench (block efficiency, exactness, timing, cost, win/tie/loss)."""
    (tmp_path / "plug_two.py").write_text(
        "import decoders\n"
        "class Two:\n"
        "    name, max_drafts = 'two', 2\n"
        "    def __call__(self, logprobs, context):\n"
        "        top = logprobs.topk(2, dim=-1).indices.tolist()\n"
        "        return [[t[0] for t in top], [top[0][0]] + [t[1] for t in top[1:]]]\n"
        "decoders.register('two', lambda res, s, full: Two(), about='argmax and runner-up')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    request.addfinalizer(lambda: decoders.DECODERS.pop("two", None))   # the others see the built-ins
    code = cli.main(["--plugin", "plug_two", "--bench", "--json", "--checkpoint", tiny_ckpt,
                         "--prompts", "2", "--new-tokens", "10"])
    res = json.loads(capsys.readouterr().out)
    assert code == 0 and res["identical_to_greedy"]["two"] is True
    for key in ("block_efficiency", "tokens_per_s", "cost", "win_tie_loss", "relative_gain"):
        assert "two" in res[key], key
    code = cli.main(["--plugin", "plug_two", "--prompt", "The", "--decoder", "two",
                         "--max-new-tokens", "12", "--checkpoint", tiny_ckpt])
    assert code == 0 and "identical to greedy: yes" in capsys.readouterr().err


# ----------------------------------------------------------------------------- tree verification

class Bushy:
    """Drafts that share only the first token, duplicates, and drafts sharing longer prefixes."""
    name, max_drafts = "bushy", 5

    def __call__(self, logprobs, context):
        top = logprobs.topk(min(3, logprobs.shape[-1]), dim=-1).indices.tolist()
        a = [context[-1]] + [t[0] for t in top[1:]]
        b = [context[-1]] + [t[-1] for t in top[1:]]
        return [b, a, list(a), a[:2] + b[2:], list(b)]


@on_random_models(s=settings_st)
def test_tree_verification_equals_batch(device, m, s, plen, n):
    """One row with a tree attention mask gives exactly the batched verification's tokens and
    steps (accepted length and winner per call), for every decoder, across the window."""
    k, p, alpha, order = s
    model, res, prompt, full = setup(m, device, order, plen, n)
    makers = {name: (lambda name=name: make(name, res, full, k, p, alpha, order)) for name in NAMES}
    makers["bushy"] = Bushy
    for name, maker in makers.items():
        if k ** order * p > budgets.MAX_DP_CELLS and name in DP:
            continue
        out_b, batch = lab_decode(model, prompt, n, maker(), verify="batch")
        out_t, tree = lab_decode(model, prompt, n, maker(), verify="tree")
        assert out_t == out_b == full[plen:], name
        assert [(x["accepted"], x["winner"]) for x in tree["steps"]] == \
               [(x["accepted"], x["winner"]) for x in batch["steps"]], name
        assert tree["verified"] <= batch["verified"], name
        if name in ("bpd", "pbest0", "bushy"):    # sampling walks the same tree: the same draws
            g1, g2 = torch.Generator().manual_seed(m[0]), torch.Generator().manual_seed(m[0])
            assert lab_decode(model, prompt, n, maker(), 0.8, g1, "tree")[0] == \
                lab_decode(model, prompt, n, maker(), 0.8, g2, "batch")[0], name


def test_draft_tree_and_layout():
    tokens, parents, paths = tree.draft_tree([[5, 6, 7], [5, 6, 8], [9, 6], [5, 6, 7]])
    assert tokens == [5, 6, 7, 8, 9, 6] and parents == [-1, 0, 1, 1, -1, 4]
    assert paths == [[0, 1, 2], [0, 1, 3], [4, 5], [0, 1, 2]]
    pos, mask = tree.tree_layout(2, parents, 3, "cpu")
    assert pos.tolist() == [3, 4, 5, 6, 7, 7, 5, 6]                 # tail, then 4 + depth
    assert mask.shape == (8, 11) and mask[:, :3].all()              # everything sees the cache
    assert mask[0, 3:].tolist() == [True] + [False] * 7              # the tail is causal
    assert mask[2 + 3, 3:].tolist() == [True, True, True, True, False, True, False, False]
    assert mask[2 + 5, 3:].tolist() == [True, True, False, False, False, False, True, True]


def test_kv_cache_compact():
    model = tiny_model(1, 11, 1, 3, 16)
    cache = tree.TreeCache(model, 1, spare=4)
    k = torch.arange(1 * 2 * 6 * 4, dtype=torch.float64).view(1, 2, 6, 4)
    cache.write(0, k, k)
    cache.compact(2, [1, 3])                           # tail of 2, then nodes 1 and 3 of 4
    assert cache.length == 4
    torch.testing.assert_close(cache.kv[0][0][0, :, :4], k[0][:, [0, 1, 3, 5]])


# ----------------------------------------------------------------------------- --reference

READABLE_CELLS = 2 ** 15   # drawn examples keep the readable DP under 1 s a step


@example(m=(107, 31, 1, 7, 14), s=(31, 3, 0.7, 4), plen=23, n=7, budget=budgets.MAX_DP_CELLS)
@on_random_models(s=settings_st.filter(lambda s: s[2] < 1.0), budget=st.just(READABLE_CELLS))
def test_reference_implementations_give_the_same_steps(device, m, s, plen, n, budget):
    """--reference runs the readable code (each head through BPDHead.forward, best_paths, the plain
    rescoring loop without a cache): the same tokens and the same steps as the fast twins. Not at
    alpha = 1: the heads then drop out of the scores, paths tie on n-gram scores alone, and math.log
    (best_paths) and np.log (the twin) may order exact ties differently (the tokens stay exact).

    The readable DP costs about 15 us a cell, so drawn examples run it only while its cells stay
    under READABLE_CELLS (each example then takes seconds, and a failure shrinks in minutes). The
    explicit example is the case a fresh clone found: k = 31 over V = 31 at order 4, whose
    DP holds 29,791 states of one candidate, where numpy 2's unravel_index misread the fast twin's
    back-pointers (fastlattice.unravel); n = 7 keeps its first step (where the two disagreed) at
    full size, about 30 s, instead of n = 30's 372 s."""
    k, p, alpha, order = s
    model, res, prompt, answer = setup(m, device, order, plen, n, FastGPT)
    slow = copy.copy(model)
    slow.reference = True
    ref = decoders.Resources(slow, small=res.small_lm(), lms=res.lms, reference=True)
    for name in NAMES:
        if name in DP and budgets.dp_cells(k, 1 if name == "ngram" else p, order, m[1]) > budget:
            continue
        out, fast = lab_decode(model, prompt, n, make(name, res, answer, k, p, alpha, order))
        out_r, readable = lab_decode(slow, prompt, n, make(name, ref, answer, k, p, alpha, order))
        assert out_r == out and readable["steps"] == fast["steps"], name


def test_bench_reference_flag(tiny_ckpt, capsys):
    argv = ["--bench", "--json", "--checkpoint", tiny_ckpt, "--prompts", "2", "--new-tokens", "12",
            "--dtype", "float64", "--k", "3", "--p", "4"]
    assert cli.main(argv) == 0
    fast = json.loads(capsys.readouterr().out)
    assert cli.main(argv + ["--reference"]) == 0
    slow = json.loads(capsys.readouterr().out)
    assert slow["block_efficiency"] == fast["block_efficiency"]
    assert slow["identical_to_greedy"] == fast["identical_to_greedy"]
    assert all(slow["identical_to_greedy"].values())


@on_random_models(s=settings_st, nodes=st.integers(1, 40))
def test_node_budget_keeps_drafts_exact_and_within_budget(device, m, s, plen, n, nodes):
    """p-best with a node budget: still identical to greedy, and the drafts' token tree within
    max(nodes, m) drafted tokens (test_within_budget: which drafts are kept)."""
    k, p, alpha, order = s
    model, res, prompt, answer = setup(m, device, order, plen, n)
    if k ** order * p > budgets.MAX_DP_CELLS:
        return
    budget = FastPBestDrafter(k, p, alpha, res.ngram(order), nodes=nodes, reference=True)
    out, stats = lab_decode(model, prompt, n, budget)
    assert out == answer[plen:]
    for step in stats["steps"]:
        drafts, m_ = step["drafts"], len(step["drafts"][0]) - 1
        assert len(tree.draft_tree([d[1:] for d in drafts])[0]) <= max(nodes, m_)


def test_within_budget():
    drafts = [[9, 1, 2, 3], [9, 1, 2, 4], [9, 5, 6, 7], [9, 1, 8, 8]]
    assert budgets.within_budget(drafts, 3) == drafts[:1]
    assert budgets.within_budget(drafts, 4) == drafts[:2]             # one new node: 3 -> 4
    assert budgets.within_budget(drafts, 6) == drafts[:2] + drafts[3:]   # 7 would need 3 more
    assert budgets.within_budget(drafts, 9) == drafts
    assert budgets.within_budget(drafts, 1) == drafts[:1]             # the best always


# ----------------------------------------------------------------------------- threads

def test_one_resources_is_safe_across_threads(monkeypatch):
    """Two threads making `ngram` drafters from one Resources both fitted the n-gram
    LM; one thread's drafter got the other's automaton ("the automaton was built for another
    LM"). Resources builds under its lock: one LM, and the automaton built for it. (The first
    fit is slowed so that the second thread arrives while it runs.)"""
    import threading
    import time
    fits = []

    class SlowFirst(NgramLM):
        def fit(self, ids):
            fits.append(self)
            time.sleep(0.3 if len(fits) == 1 else 0.0)
            return super().fit(ids)
    monkeypatch.setattr(decoders.resources, "NgramLM", SlowFirst)
    vocab = "abcdefghijklmnopqrst"
    text = "".join(vocab[(i * 7 + i // 3) % 20] for i in range(3000))
    model = tiny_model(0, 20, 1, 4, 16)
    res = decoders.Resources(model, {"vocab": vocab}, text=text)
    made = {}

    def make(i):
        made[i] = decoders.make("ngram", res, {"k": 4, "alpha": 0.5, "order": 3})
    threads = [threading.Thread(target=make, args=(i,)) for i in range(2)]
    threads[0].start()
    time.sleep(0.05)
    threads[1].start()
    for t in threads:
        t.join()
    assert len(fits) == 1 and made[0].lm is made[1].lm is res.ngram(3)
    assert all(d.automaton.lm is d.lm for d in made.values())
    prompt = random_prompt(1, 20, 12)
    for d in made.values():
        assert lab_decode(model, prompt, 20, d)[0] == greedy_decode(model, prompt, 20)


@pytest.mark.parametrize("as_", [tuple, torch.tensor, __import__("numpy").array])
def test_the_oracle_takes_its_answer_as_any_sequence(as_):
    """A tuple, tensor or array answer is the list's: its slice once compared unequal to the
    context, and the oracle fell back to the heads' top path without a word."""
    model = tiny_model(1, 17, 1, 4, 64)
    prompt = random_prompt(2, 17, 5)
    full = prompt + greedy_decode(model, prompt, 24)
    calls = {name: lab_decode(model, prompt, 24, drafter)[1]["calls"] for name, drafter in
             (("bpd", ArgmaxDrafter()), ("oracle", lattice.OracleDrafter(full, 4)),
              ("given", lattice.OracleDrafter(as_(full), 4)))}
    assert calls["given"] == calls["oracle"] < calls["bpd"]      # the fallback would show
