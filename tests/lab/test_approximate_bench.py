"""The command line and the bench of the APPROXIMATE acceptance rules (lab/approximate.py): the
bench reports them in their own section (JSON key `approximate`) and never in
identical_to_greedy, without --approximate its keys are unchanged, `--prompt --accept` says its
output is not greedy's, and every flag that would do nothing (or sample) is one-line error before
any model call. Uses the tiny checkpoint of tests/helpers.py (tiny_ckpt)."""
import json
import math

import pytest

import decoders
from lab import analysis
from lab import approximate
from lab import cli
from conftest import random_prompt, tiny_model
from minibpd import GPT
from tests.helpers import tiny_ckpt  # noqa: F401 (a fixture)

pytestmark = pytest.mark.assignment8   # docs/coursework.md


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code, err, message):
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err and "Traceback" not in err, err


@pytest.fixture
def no_model_calls(monkeypatch):
    monkeypatch.setattr(GPT, "forward", lambda *a, **kw: pytest.fail("the model was called"))


def test_bench_keeps_the_approximate_rules_apart(tiny_ckpt, capsys):
    size = ("--prompts", "2", "--new-tokens", "12", "--checkpoint", tiny_ckpt)
    code, out, err = run_cli(capsys, "--bench", "--json", "--approximate", *size)
    res = json.loads(out)
    assert code == 0 and set(res["approximate"]) == set(approximate.RULES)
    assert set(res["identical_to_greedy"]) == {"greedy", *decoders.DECODERS}
    assert set(res["block_efficiency"]) == {"greedy", *decoders.DECODERS}
    for rule, v in res["approximate"].items():
        assert set(v) == {"block_efficiency", "tokens_per_s", "speedup_vs_bpd",
                          "differs_from_greedy", "first_difference", "quality"}
        assert 1.0 <= v["block_efficiency"] <= 8 and 0.0 <= v["differs_from_greedy"] <= 1.0
        q = v["quality"]
        assert q["perplexity"] >= 1.0 and q["greedy_perplexity"] >= 1.0
        assert 0.0 <= q["phrase_repeat"] <= 1.0
    for b in (2, 3):                              # a step keeps at least b tokens of a draft
        assert res["approximate"][f"min{b}"]["block_efficiency"] >= min(
            b, res["block_efficiency"]["bpd"])
    code, out, _ = run_cli(capsys, "--bench", "--json", *size)
    plain = json.loads(out)
    assert code == 0 and "approximate" not in plain and set(plain) == set(res) - {"approximate"}
    for key in ("block_efficiency", "identical_to_greedy", "settings", "repetition"):
        assert plain[key] == res[key]
    code, out, _ = run_cli(capsys, "--bench", "--approximate", "--no-color", *size)
    assert code == 0 and "APPROXIMATE acceptance" in out and "top5" in out


def test_prompt_with_an_approximate_rule_says_so(tiny_ckpt, capsys):
    argv = ("--prompt", "The if", "--max-new-tokens", "40", "--checkpoint", tiny_ckpt)
    code, out, err = run_cli(capsys, *argv, "--accept", "min3")
    assert code == 0 and "APPROXIMATE" in err and "not greedy decoding's" in err
    assert "NOT greedy's output" in err and "identical to greedy" not in err
    code, _, err = run_cli(capsys, *argv, "--accept", "exact")
    assert code == 0 and "identical to greedy: yes" in err and "APPROXIMATE" not in err


@pytest.mark.parametrize("argv, message", [
    (["--prompt", "The", "--accept", "top2", "--temperature", "0.7"], "drop --temperature"),
    (["--prompt", "The", "--accept", "top2", "--decoder", "greedy"], "drafts nothing"),
    (["--prompt", "The", "--accept", "top0"], "--accept top0: the acceptance rule must be"),
    (["--bench", "--accept", "top2"], "--prompt only"),
    (["--demo", "--accept", "min2"], "--prompt only"),
    (["--tune", "--accept", "min2"], "--prompt only"),
    (["--prompt", "The", "--approximate"], "(it applies to --bench)"),
    (["--demo", "--approximate"], "(it applies to --bench)"),
    (["--bench", "--approximate", "--temperature", "1"], "drop --temperature"),
])
def test_approximate_flags_refused_where_they_would_do_nothing(tiny_ckpt, capsys, no_model_calls,
                                                              argv, message):
    code, out, err = run_cli(capsys, *argv, "--checkpoint", tiny_ckpt)
    one_line_error(code, err, message)


def test_help_documents_the_flags(capsys):
    with pytest.raises(SystemExit):
        run_cli(capsys, "--help")
    out = capsys.readouterr().out
    assert "--approximate" in out and "--accept RULE" in out and "APPROXIMATE" in out


def test_perplexity_reads_the_decode_loops_windows():
    """logprobs_along scores each token in the window the decode loop gives it: head 1 of
    analysis.heads_along, past the window too."""
    model = tiny_model(4, 13, 1, 3, 8)
    seq = random_prompt(5, 13, 30)
    heads = analysis.heads_along(model, seq, 5)
    want = [float(heads[t][0, seq[t]]) for t in range(5, 30)]
    assert approximate.logprobs_along(model, seq, 5) == pytest.approx(want, rel=1e-9)
    ppl = approximate.outputs_perplexity(model, [seq[:5]], [seq[5:]])
    assert ppl == pytest.approx(math.exp(-sum(want) / len(want)), rel=1e-9)
    assert approximate.differing([[1, 2, 3], [4]], [[1, 0, 3], [5]]) == 0.5
    assert approximate.first_difference([[1, 2, 3], [4, 5]], [[1, 0, 3], [4, 5]]) == 1.5
