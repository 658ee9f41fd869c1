"""tools/peer_bench.py's argument checks, run before transformers or the GGUF load (neither is
needed here): every bad input is one line and exit status 2, never a traceback."""
import importlib.util
import os

import pytest
import torch

from conftest import ROOT

SPEC = importlib.util.spec_from_file_location("peer_bench", os.path.join(ROOT, "tools", "peer_bench.py"))
peer_bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(peer_bench)
HEADS = os.path.join(ROOT, "checkpoints", "smollm2-heads.pt")


def refused(capsys, *argv):
    with pytest.raises(SystemExit) as e:
        peer_bench.parse(["--checkpoint", HEADS, *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    return err.strip().splitlines()[-1]


def test_the_shipped_heads_pass_the_checks():
    args = peer_bench.parse(["--checkpoint", HEADS, "--decoders", "bpd,ngram"])
    assert args.decoders == ["bpd", "ngram"] and args.threads == 1


def test_a_decoder_given_twice_is_refused(capsys):
    """Each round times each method once: bpd twice would record 2 timings a round."""
    assert "--decoders: bpd given more than once" in refused(capsys, "--decoders", "bpd,ngram,bpd")


def test_zero_threads_is_refused(capsys):
    assert "--threads must be at least 1" in refused(capsys, "--threads", "0")


def test_a_missing_checkpoint_is_refused(capsys, tmp_path):
    line = refused(capsys, "--checkpoint", str(tmp_path / "nope.pt"))
    assert "--checkpoint:" in line and "not found" in line


def test_a_character_checkpoint_is_refused(capsys):
    line = refused(capsys, "--checkpoint", os.path.join(ROOT, "checkpoints", "minibpd.pt"))
    assert "not a SmolLM2 heads checkpoint" in line


def test_a_file_torch_cannot_read_is_refused(capsys, tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a zip")
    assert "not a checkpoint torch can read" in refused(capsys, "--checkpoint", str(bad))
    torch.save([1, 2], bad)
    assert "not a SmolLM2 heads checkpoint" in refused(capsys, "--checkpoint", str(bad))


def test_a_missing_tuned_file_is_refused(capsys, tmp_path):
    line = refused(capsys, "--tuned", str(tmp_path / "none.json"))
    assert "--tuned:" in line and "not found" in line
