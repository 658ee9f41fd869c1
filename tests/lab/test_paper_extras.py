"""The paper extras (docs/results/paper-extras.md): on hand-built inputs, Kim Table 5's
losses (lab.analysis.loss_repeats), the wins and ties from the same rows (win_tie_loss) and Kim
Fig. 3a's entropy quantiles (entropy_quantiles); on a tiny trained model, Stern §7.3 through
the bench (--by-heads) and Kim Table 1's replay (be_by_heads) against real decoding."""
import json
import math

import pytest
import torch

import decoders
from lab import analysis, cli
from lab.run import Run
from runtime.checkpoint import load as load_fast
from runtime.corpus import encode
from runtime.loop import lab_decode
from tests.helpers import tiny_ckpt  # noqa: F401 (a fixture)

# compared_steps' rows: (BPD's draft, the refined draft kept, BPD's gain, the refined gain).
# A gain g means draft[1..g-1] were accepted and draft[g] is the first miss.
ROWS = [
    ([5, 1, 2, 3], [5, 1, 1, 9], 4, 2),   # loss: its first miss repeats the token before it
    ([5, 1, 2, 3], [5, 7, 4, 4], 3, 1),   # loss: a repeat BPD lacks, after its first miss
    ([5, 1, 2, 3], [5, 1, 8, 9], 3, 2),   # loss: no repeat
    ([5, 1, 1, 3], [5, 2, 2, 7], 4, 1),   # loss: a repeat, but BPD's draft has it there too
    ([5, 1, 1, 3], [5, 1, 4, 4], 2, 3),   # win (BPD missed on its repeat): not a loss
    ([5, 6, 6, 3], [5, 6, 6, 3], 2, 2),   # tie with repeats: not a loss
]


def test_loss_repeats_counts_only_losses_and_only_repeats_bpd_lacks():
    out = analysis.loss_repeats({"neural": ROWS})["neural"]
    assert out["counts"] == {"steps": 6, "loss": 4, "introduced_repeat": 2, "lost_on_repeat": 1}
    assert out["introduced_repeat"] == 0.5 and out["lost_on_repeat"] == 0.25


def test_loss_repeats_without_losses_is_zero_not_an_error():
    out = analysis.loss_repeats({"ngram": ROWS[4:]})["ngram"]
    assert out["counts"]["loss"] == 0 and out["introduced_repeat"] == 0.0


def test_introduces_repeat_is_pairwise_against_bpd():
    assert analysis.introduces_repeat([1, 2, 3], [1, 2, 2])
    assert not analysis.introduces_repeat([1, 2, 2], [1, 2, 2])       # BPD's draft has it
    assert not analysis.introduces_repeat([1, 2, 3], [1, 3, 2])


def test_win_tie_loss_from_the_same_rows():
    out = analysis.win_tie_loss({"neural": ROWS})["neural"]
    assert out["counts"] == {"steps": 6, "win": 1, "tie": 1, "loss": 4, "wins_replacing_repeat": 1}


@pytest.mark.assignment3
def test_drafts_longer_or_shorter_than_bpds_are_counted_not_an_index_error():
    """Prompt lookup's copy (copy=10) runs past BPD's draft and can gain more tokens than BPD's
    draft has (BPD missed nothing: no repeat replaced); a drafter's shorter draft can lose
    with its first miss past its own end (no repeat there)."""
    rows = [([5, 1, 2], [5, 1, 2, 3, 4, 6], 3, 5),       # win past BPD's end
            ([5, 1, 1, 3], [5, 1], 4, 2)]                 # loss past the draft's end
    wtl = analysis.win_tie_loss({"lookup": rows})["lookup"]
    assert wtl["counts"] == {"steps": 2, "win": 1, "tie": 0, "loss": 1, "wins_replacing_repeat": 0}
    losses = analysis.loss_repeats({"lookup": rows})["lookup"]
    assert losses["counts"] == {"steps": 2, "loss": 1, "introduced_repeat": 0, "lost_on_repeat": 0}


def test_entropy_quantiles_of_known_distributions():
    """Head 1 uniform over 4 tokens (log 4 nats) everywhere; head 2 certain at half the
    positions and uniform at the other half: its median lies between, its 5% at 0."""
    V, uniform = 4, torch.full((4,), -math.log(4))
    certain = torch.tensor([0.0, -1e4, -1e4, -1e4])
    heads = {t: torch.stack([uniform, certain if t % 2 else uniform]) for t in range(10)}
    q = analysis.entropy_quantiles([(0, [], heads)])
    assert q["positions"] == 10 and q["quantiles"] == [0.05, 0.25, 0.5, 0.75, 0.95]
    assert all(abs(x - math.log(V)) < 1e-6 for x in q["by_head"][0])
    lo, *_, hi = q["by_head"][1]
    assert abs(lo) < 1e-6 and abs(hi - math.log(V)) < 1e-6
    assert abs(q["mean"][1] - math.log(V) / 2) < 1e-6


def test_bench_by_heads_and_the_new_keys(tiny_ckpt, capsys):
    """--bench --by-heads --json: Stern §7.3's rows (greedy, then k = 1..h), each identical to
    greedy; Kim Fig. 3a's quantiles beside the mean head_entropy; the losses counted on the
    same steps as win_tie_loss's."""
    code = cli.main(["--bench", "--json", "--by-heads", "--checkpoint", tiny_ckpt, "--prompts",
                     "2", "--new-tokens", "12"])
    res = json.loads(capsys.readouterr().out)
    h = res["heads"]
    rows = res["speedup_by_heads"]["methods"]
    assert code == 0 and list(rows) == ["greedy"] + [str(k) for k in range(1, h + 1)]
    assert all(r["identical_to_greedy"] and r["tokens_per_s"] > 0 for r in rows.values())
    assert rows["1"]["block_efficiency"] == 1.0                     # one head: one token a call
    assert abs(rows[str(h)]["block_efficiency"] - res["block_efficiency"]["bpd"]) < 1e-9
    q = res["head_entropy_quantiles"]
    assert len(q["by_head"]) == h and all(a <= b for row in q["by_head"] for a, b in zip(row, row[1:]))
    assert all(abs(a - b) < 1e-9 for a, b in zip(q["mean"], res["head_entropy"]))
    for name, v in res["loss_repeats"].items():
        c, w = v["counts"], res["win_tie_loss"][name]["counts"]
        assert c["loss"] == w["loss"] and c["lost_on_repeat"] <= c["introduced_repeat"] <= c["loss"]


def test_by_heads_is_refused_when_sampling(tiny_ckpt, capsys):
    code = cli.main(["--bench", "--by-heads", "--temperature", "0.8", "--checkpoint", tiny_ckpt])
    assert code == 2 and "--by-heads draws on the greedy bench" in capsys.readouterr().err


def test_be_by_heads_equals_decoding_with_the_first_heads(tiny_ckpt):
    """Kim Table 1 by replay (analysis.be_by_heads) is what bpd_decode gives on first_heads(j)."""
    model, ck = load_fast(tiny_ckpt)
    prompts = [encode(t, ck["vocab"]) for t in ("The ", "It is a")]
    run = Run(decoders.Resources(model, ck), decoders.settings(), prompts, 10)
    by_heads = analysis.be_by_heads(run)
    assert list(by_heads) == [str(j) for j in range(1, model.config.n_bpd_heads + 1)]
    for j, be in by_heads.items():
        decoded = [lab_decode(model.first_heads(int(j)), p, 10)[1] for p in prompts]
        assert abs(be - analysis.block_eff(decoded)) < 1e-12, j


def test_stern_fig4_panel_plots_speedup_against_block_efficiency():
    """Stern Fig. 4's axis is the mean accepted block size, not k: heads_speed's left panel puts
    each k's block efficiency on x and its speedup on y; the right panel (Table 4's view) is by k."""
    pytest.importorskip("matplotlib")
    from lab import figures
    plt = figures.pyplot()
    s = {"threads": 1, "methods": {"greedy": {"block_efficiency": 1.0, "speedup": 1.0},
                                   "1": {"block_efficiency": 1.0, "speedup": 0.98},
                                   "2": {"block_efficiency": 1.6, "speedup": 1.2}}}
    fig = figures.heads_speed(plt, s, "m.pt")
    left, right = fig.axes
    assert list(left.lines[0].get_xdata()) == [1.0, 1.6]
    assert list(left.lines[0].get_ydata()) == [0.98, 1.2]
    assert list(right.lines[0].get_xdata()) == [1, 2] and "Table 4" in right.get_title()
    plt.close(fig)
