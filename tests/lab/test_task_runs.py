"""The tasks end to end on a tiny model: `train_heads.py --tasks` fine-tunes a checkpoint (window
widened, the examples stored, an in-domain rescorer), and `minibpd.py --tasks --json` reports every
decoder identical to greedy on task prompts, with every key of Kim's per-task analyses."""
import json

import pytest
import torch

from lab import cli
from lab import task_runs
import minibpd
from lab import tasks
from training import finetune
import train_heads
from training import cli as training_cli
from runtime import corpus
from runtime.loop import lab_decode
from tests.helpers import tiny_ckpt  # noqa: F401 (a fixture)

pytestmark = pytest.mark.assignment7   # docs/coursework.md

SMALL = 6          # examples per task and split: the recipe runs, the test stays short


@pytest.fixture(scope="module")
def tasks_ckpt(tiny_ckpt, tmp_path_factory):
    real = tasks.build_all
    small = lambda vocab=None: trim(real(vocab))
    path = str(tmp_path_factory.mktemp("tasks") / "tasks.pt")
    mp = pytest.MonkeyPatch()
    mp.setattr(tasks, "build_all", small)
    try:
        training_cli.train_main(["--tasks", "--base", tiny_ckpt, "--steps", "3", "--rescorer-steps", "2",
                          "--batch-size", "2", "--block-size", "48", "--out", path, "--threads", "1",
                          "--log-every", "1000"])
    finally:
        mp.undo()
    return path


def trim(data):
    data["tasks"] = {t: {s: pairs[:SMALL] for s, pairs in splits.items()}
                     for t, splits in data["tasks"].items()}
    return data


def test_finetune_stores_what_the_command_needs(tasks_ckpt, tiny_ckpt):
    model, ck = minibpd.load_checkpoint(tasks_ckpt)
    base = torch.load(tiny_ckpt, weights_only=True)
    assert model.config.block_size == 48 and base["config"]["block_size"] == 32
    assert ck["vocab"] == base["vocab"] and ck["splits"] == base["splits"]     # rescorers: the base's
    assert set(ck["tasks"]["tasks"]) == set(tasks.CHAR_TASKS) and "rescorer_tasks" in ck
    assert set(ck["tasks"]["tasks"]["qa"]) == {"tune", "test"}          # train: counted, not stored
    assert ck["tasks"]["train_counts"]["qa"] == SMALL
    assert ck["finetune"]["steps"] == 3 and ck["finetune"]["block_size"] == 48
    prompt = corpus.encode(ck["tasks"]["tasks"]["qa"]["test"][0][0], ck["vocab"])   # > the window
    assert len(prompt) > 48
    assert lab_decode(model, prompt, 40)[0] == minibpd.greedy_decode(model, prompt, 40)


def test_widen_keeps_the_learned_positions():
    model = minibpd.GPT(minibpd.GPTConfig(11, 8, 1, 2, 8, 3))
    wide = finetune.widen(model, 20)
    old, new = model.pos_emb.weight, wide.pos_emb.weight
    assert torch.equal(new[:8], old) and torch.equal(new[8:], old[-1:].expand(12, -1))
    assert torch.equal(wide.tok_emb.weight, model.tok_emb.weight)


def test_tasks_command_json(tasks_ckpt, capsys):
    code = cli.main(["--tasks", "--json", "--checkpoint", tasks_ckpt, "--prompts", "2"])
    out = capsys.readouterr().out
    r = json.loads(out)
    assert code == 0 and set(r["tasks"]) == set(tasks.CHAR_TASKS)
    keys = {"block_efficiency", "identical_to_greedy", "relative_gain", "oracle_by_k",
            "head_entropy", "hmax", "head_accuracy", "repetition", "repetition_2gram", "quality",
            "examples"}
    for name, t in r["tasks"].items():
        assert keys <= set(t), name
        assert all(t["identical_to_greedy"].values()) and t["examples"] == 2
        assert t["block_efficiency"]["greedy"] == 1.0 and 1 <= t["block_efficiency"]["bpd"] <= 8
        assert list(t["quality"])[0] == tasks.QUALITY[name]
        assert set(t["quality"]) == {"exact_match", "rouge_l", "phrase_repeat"}
        assert all(0 <= v <= 1 for v in t["quality"].values())
    assert {"hmax_vs_bpd_be", "entropy_vs_bpd_be", "gain_vs_bpd_be", "headroom_vs_bpd_be"} <= set(r["correlation"])
    assert_statistics(r)
    assert {"checkpoint", "settings", "seconds"} <= set(r)


def assert_statistics(r):
    """Every correlation says n, its coefficient, exact p and leave-one-out range;
    every task a 95% bootstrap interval of each decoder's block efficiency."""
    c = r["correlation"]
    entries = [("r", c["hmax_vs_bpd_be"]), ("r", c["entropy_vs_bpd_be"]),
               ("rho", c["headroom_vs_bpd_be"])] + [("rho", v) for v in c["gain_vs_bpd_be"].values()]
    kept = [t for name, t in r["tasks"].items() if name not in r["excluded"]]
    assert r["excluded"] == sorted(name for name, t in r["tasks"].items() if t["degenerate"])
    assert all(t["degenerate"] == (t["quality"]["rouge_l"] < task_runs.DEGENERATE_ROUGE)
               for t in r["tasks"].values())
    assert set(c["gain_vs_bpd_be"]) == (set(kept[0]["relative_gain"]) if kept else set())
    for key, e in entries:
        assert set(e) == {key, "n", "p", "loo"} and e["n"] == len(kept)
        if e[key] is None:
            assert e["p"] is None and e["loo"] is None
        else:
            assert 0 < e["p"] <= 1 and len(e["loo"]) == 2 and e["loo"][0] <= e["loo"][1]
    for name, t in r["tasks"].items():
        ci = t["block_efficiency_interval"]
        assert set(ci) == set(t["block_efficiency"]) - {"greedy"}, name
        for decoder, (lo, hi) in ci.items():
            assert lo <= t["block_efficiency"][decoder] + 1e-9 and hi >= t["block_efficiency"][decoder] - 1e-9


def test_tasks_command_text(tasks_ckpt, capsys):
    """The terminal report shows BPD's interval and each correlation's p and leave-one-out range,
    in rows of at most 80 columns."""
    assert cli.main(["--tasks", "--checkpoint", tasks_ckpt, "--prompts", "2", "--no-color"]) == 0
    out = capsys.readouterr().out.splitlines()
    start = out.index(next(line for line in out if "exact permutation" in line))
    rows = [line for line in out if line.startswith("  bpd 95%")] + out[start:start + 11]
    assert rows[0].startswith("  bpd 95%") and "one task left out" in out[start + 1]
    assert all(len(line) <= 80 for line in rows), [len(line) for line in rows]


def test_tasks_command_refuses_a_checkpoint_without_tasks(tiny_ckpt, capsys):
    assert cli.main(["--tasks", "--checkpoint", tiny_ckpt]) == 2
    assert "holds no tasks" in capsys.readouterr().err
    with pytest.raises(ValueError, match="smallest task holds"):
        task_runs.task_examples({"tasks": {"tasks": {"qa": {"test": [["a", "b"]]}}}}, 5)


def test_pearson_and_spearman():
    from lab import stats
    assert stats.pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert stats.pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert stats.pearson([1, 1, 1], [1, 2, 3]) is None
    assert stats.ranks([10, 30, 20, 20]) == [0, 3, 1.5, 1.5]
