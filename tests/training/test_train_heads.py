"""Tests for train_heads.py and its command line (training/cli.py): every flag checked before any
work, --out never overwritten by accident, the rescorer's defaults scale, --data kept as it is,
threads, the model class the base run trains. Tiny sizes throughout."""
from conftest import ROOT
import json
import os
import re
import subprocess
import sys

import pytest
import torch

import minibpd
import train_heads
from runtime import threads
from runtime.fast_heads import FastGPT
from training import cli
from runtime import checkpoint
from tests.helpers import tiny_ckpt  # noqa: F401 (a fixture)

HERE = ROOT  # the repository
TINY_AUTO = ["--steps", "3", "--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--block-size",
             "16", "--batch-size", "4", "--log-every", "1000"]
TINY = TINY_AUTO + ["--threads", "1"]
# ~3,700 characters of indented Python: what cleaning would flatten
CODE = "".join(f"def f{i}(x):\n    if x > {i}:\n        return x * {i}\n    return None\n\n"
               for i in range(50))


@pytest.fixture
def paths(tmp_path):
    """-> (data file, --out path that does not exist yet)."""
    data = tmp_path / "code.py"
    data.write_text(CODE, encoding="utf-8")
    (tmp_path / "short.txt").write_text("too short", encoding="utf-8")
    (tmp_path / "latin1.txt").write_bytes("café au lait. ".encode("latin-1") * 300)
    return str(data), str(tmp_path / "out.pt")


@pytest.fixture
def no_training(monkeypatch):
    def train(*args, **kwargs):
        raise AssertionError("training started before the error was found")
    monkeypatch.setattr(train_heads, "train", train)


def files_under(folder):
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs)


def fails(argv, capsys):
    """Run main(argv), expect exit status 2; -> the one stderr line."""
    with pytest.raises(SystemExit) as excinfo:
        cli.train_main(argv)
    assert excinfo.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.endswith("\n") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("bad, named", [
    (["--heads", "0"], "--heads"),
    (["--n-layer", "0"], "--n-layer"),
    (["--n-head", "0"], "--n-head"),
    (["--n-embd", "0"], "--n-embd"),
    (["--n-embd", "18", "--n-head", "4"], "--n-embd 18 must be divisible by --n-head 4"),
    (["--block-size", "0"], "--block-size"),
    (["--steps", "0"], "--steps"),
    (["--batch-size", "-1"], "--batch-size"),
    (["--log-every", "0"], "--log-every"),
    (["--warmup", "-1"], "--warmup"),
    (["--lr", "0"], "--lr"),
    (["--lr", "nan"], "--lr"),
    (["--lr", "inf"], "--lr"),
    (["--dropout", "1"], "--dropout"),
    (["--dropout", "-0.1"], "--dropout"),
    (["--head-weight", "-1"], "--head-weight"),
    (["--head-weight", "inf"], "--head-weight"),
    (["--seed", "-1"], "--seed"),
    (["--seed", str(2**63)], "--seed"),
    (["--rescorer-steps", "0"], "--rescorer-steps"),
    (["--rescorer-layers", "0"], "--rescorer-layers"),
    (["--rescorer-embd", "0"], "--rescorer-embd"),
    (["--rescorer-embd", "7"], "--rescorer-embd 7"),
    (["--threads", "0"], "--threads"),
    (["--out", "{tmp}/missing/x.pt"], "--out"),
    (["--out", "{tmp}"], "--out"),
    (["--data", "{tmp}/none.txt"], "--data"),
    (["--data", "{tmp}/latin1.txt"], "--data"),
    (["--data", "{tmp}/short.txt"], "--data"),
    (["--block-size", "200"], "--block-size 200"),        # the 3,700-character text is too small
])
@pytest.mark.assignment4
def test_bad_input_is_one_line_exit_2_before_training(bad, named, paths, tmp_path, no_training,
                                                       capsys):
    data, out = paths
    before = files_under(tmp_path)
    err = fails(TINY + ["--data", data, "--out", out] + [a.format(tmp=tmp_path) for a in bad],
                capsys)
    assert named in err
    assert files_under(tmp_path) == before                   # nothing written, --out or other


@pytest.mark.assignment4
def test_out_is_only_overwritten_with_force(paths, monkeypatch, capsys):
    data, out = paths
    with open(out, "w") as f:
        f.write("precious")
    with monkeypatch.context() as m:
        m.setattr(train_heads, "load_corpus", lambda *a: pytest.fail("read the corpus first"))
        err = fails(TINY + ["--data", data, "--out", out], capsys)
    assert out in err and "--force" not in err and "--out my-model.pt" in err   # not ours
    assert open(out).read() == "precious"
    cli.train_main(TINY + ["--data", data, "--out", out, "--force"])              # asked for: done
    model, ck = minibpd.load_checkpoint(out)
    assert model.config.n_layer == 1 and ck["train"]["steps"] == 3


def test_a_diverging_run_stops_and_saves_nothing(paths, capsys):
    """A learning rate that blows the loss up ends in one line naming --lr, before a NaN
    checkpoint is saved (load_checkpoint would refuse it, advising the same run again)."""
    data, out = paths
    err = fails(TINY + ["--data", data, "--out", out, "--lr", "1e30"], capsys)
    assert "the loss is" in err and "lower --lr" in err and not os.path.exists(out)


@pytest.mark.parametrize("steps, n_layer, n_embd, expected", [
    (5000, 6, 128, (2500, 2, 64)),        # the defaults: the shipped rescorer
    (300, 4, 48, (150, 1, 24)),
    (3, 1, 18, (1, 1, 8)),                # 18 // 2 = 9, rounded down to even: 2 attention heads
    (1, 1, 2, (1, 1, 2)),
])
def test_rescorer_defaults_scale_with_the_base(steps, n_layer, n_embd, expected):
    args = cli.parse_train_args(["--steps", str(steps), "--n-layer", str(n_layer),
                           "--n-embd", str(n_embd), "--n-head", "1"])
    train_heads.scale_rescorer(args)
    assert (args.rescorer_steps, args.rescorer_layers, args.rescorer_embd) == expected


def test_default_flags_are_the_shipped_run():
    args = cli.parse_train_args([])
    train_heads.scale_rescorer(args)
    assert (args.steps, args.seed, args.n_layer, args.n_head, args.n_embd, args.block_size,
            args.heads, args.rescorer_steps, args.rescorer_layers, args.rescorer_embd) == \
        (5000, 1337, 6, 4, 128, 128, 8, 2500, 2, 64)
    assert args.out == checkpoint.CHECKPOINT and args.data is None and not args.clean


@pytest.mark.parametrize("extra, expected", [
    ([], (3, 1, 10)),                                          # steps 6 // 2, 3 // 3, 20 // 2
    (["--rescorer-steps", "2", "--rescorer-layers", "2", "--rescorer-embd", "4"], (2, 2, 4)),
])
@pytest.mark.assignment4
def test_rescorer_trained_as_configured(extra, expected, paths, monkeypatch):
    data, out = paths
    calls, real_train = [], train_heads.train

    def spy(model, data, args, gen, label, held_out=None):
        calls.append((label, args.steps))
        return real_train(model, data, args, gen, label, held_out)
    monkeypatch.setattr(train_heads, "train", spy)
    cli.train_main(TINY + ["--data", data, "--out", out, "--steps", "6", "--n-layer", "3",
                     "--n-embd", "20"] + extra)
    _, ck = minibpd.load_checkpoint(out)
    steps, layers, embd = expected
    assert calls == [("heads", 6), ("rescorer", steps)]
    assert ck["train"]["steps"] == 6 and ck["train"]["rescorer_steps"] == steps
    rc = ck["rescorer_config"]
    assert (rc["n_layer"], rc["n_embd"], rc["n_head"], rc["n_bpd_heads"]) == (layers, embd, 2, 1)


@pytest.mark.assignment4
def test_data_kept_as_is_unless_clean(tmp_path, monkeypatch, capsys):
    """The docstring's example: the standard library's json package, indentation kept."""
    src = tmp_path / "json_src.py"
    folder = os.path.dirname(json.__file__)
    src.write_text("".join(open(os.path.join(folder, f), encoding="utf-8").read()
                           for f in sorted(os.listdir(folder)) if f.endswith(".py")),
                   encoding="utf-8")
    monkeypatch.setattr(train_heads, "training_threads", lambda n=None: (1, "stubbed"))
    threads = torch.get_num_threads()
    argv = TINY_AUTO + ["--data", str(src)]
    cli.train_main(argv + ["--out", str(tmp_path / "kept.pt")])
    assert "threads: 1 (stubbed; --threads overrides)" in capsys.readouterr().out
    assert torch.get_num_threads() == threads                  # main() gives the threads back
    _, ck = minibpd.load_checkpoint(str(tmp_path / "kept.pt"))
    assert ck["corpus"]["cleaned"] is False and ck["train"]["threads"] == 1
    text = src.read_text(encoding="utf-8")
    assert sum(map(len, ck["splits"].values())) == len(text) and "\n        " in text
    assert text.startswith(ck["splits"]["train"][:1000])      # chunk 0, byte for byte
    cli.train_main(argv + ["--out", str(tmp_path / "clean.pt"), "--clean"])
    _, ck = minibpd.load_checkpoint(str(tmp_path / "clean.pt"))
    assert ck["corpus"]["cleaned"] is True and "\n " not in ck["splits"]["train"]


def test_help_shows_every_default(capsys):
    with pytest.raises(SystemExit) as excinfo:
        cli.train_main(["--help"])
    assert excinfo.value.code == 0
    out = capsys.readouterr().out
    assert "--max-steps" not in out and "python train_heads.py --force" in out
    # every flag after -h/--help; argparse heads them "optional arguments:" before Python 3.10
    options = re.split(r"\n(?:options|optional arguments):", out)[1].split("\n  -")[2:]
    assert len(options) >= 20 and all("(default:" in o for o in options), options


def test_auto_threads(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.03, 0.9, 0.5))
    n, reason = threads.choose_threads(training=True)
    assert n == 1 and "1.03" in reason
    monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.2, 0.3))
    assert threads.choose_threads(training=True) == (4, "machine idle")


def test_script_exits_2_without_traceback(tmp_path):
    r = subprocess.run([sys.executable, "train_heads.py", "--heads", "0", "--out",
                        str(tmp_path / "x.pt")], capture_output=True, text=True, cwd=HERE)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "--heads" in r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert not os.path.exists(tmp_path / "x.pt")


def test_script_help_lists_every_mode():
    """`python train_heads.py --help`: the command line of training/cli.py, under the script's
    own name, its docstring's examples, and the other modes' flags."""
    r = subprocess.run([sys.executable, "train_heads.py", "--help"], capture_output=True,
                       text=True, cwd=HERE)
    assert r.returncode == 0 and r.stderr == "" and r.stdout.startswith("usage: train_heads.py ")
    assert "python train_heads.py --force" in r.stdout
    assert all(flag in r.stdout for flag in ("--smollm", "--distill", "--tasks", "--head-weight"))


@pytest.mark.assignment4
def test_base_run_trains_the_fast_twin(paths, monkeypatch):
    """The command line hands runtime.fast_heads.FastGPT to train_heads.train_both (what the shipped
    checkpoint was trained with), and both the model and its rescorer are built with it."""
    data, out = paths
    built, real_train = [], train_heads.train

    def spy(model, *args, **kwargs):
        built.append(type(model))
        return real_train(model, *args, **kwargs)
    monkeypatch.setattr(train_heads, "train", spy)
    cli.train_main(TINY + ["--data", data, "--out", out])
    assert built == [FastGPT, FastGPT]
    assert set(torch.load(out, weights_only=True)) == {
        "format_version", "config", "model", "rescorer_config", "rescorer", "vocab", "seed",
        "git_revision", "train", "corpus", "splits"}


# ----------------------------------------------------------------------------- regressions

def test_out_advice_names_force_only_for_a_checkpoint_of_its_kind(paths, tiny_ckpt, tmp_path,
                                                                 no_training, capsys):
    """`--out F already exists; pass --force` was said of any file: README.md, a
    shipped checkpoint (the default --out), a checkpoint another mode writes."""
    data, _ = paths
    shipped = checkpoint.CHECKPOINT
    err = fails(TINY + ["--data", data, "--out", shipped], capsys)
    assert "shipped" in err and "--force" not in err and "--out my-model.pt" in err
    ours = tmp_path / "ours.pt"
    ours.write_bytes(open(tiny_ckpt, "rb").read())
    assert "pass --force to overwrite it" in fails(TINY + ["--data", data, "--out", str(ours)], capsys)
    err = fails(["--tasks", "--steps", "1", "--threads", "1", "--out", str(ours)], capsys)
    assert "--force" not in err and "no checkpoint of the kind this run writes" in err
    readme = tmp_path / "README.md"
    readme.write_text(open(os.path.join(HERE, "README.md")).read())
    err = fails(TINY + ["--data", data, "--out", str(readme)], capsys)
    assert "--force" not in err


def test_out_through_a_dangling_link_writes_its_target(paths, tmp_path, capsys, monkeypatch):
    """The check that --out can be written opened the link's target (creating it),
    then removed the link: an empty file was left at the target and the checkpoint written where
    the link was. The link is written through now, and stays a link."""
    data, _ = paths
    link, target = tmp_path / "link.pt", tmp_path / "target.pt"
    os.symlink(target, link)
    args = cli.parse_train_args(TINY + ["--data", data, "--out", str(link)])
    cli.check_train_args(args)
    assert os.path.islink(link) and not os.path.exists(target)      # the probe left nothing
    cli.train_main(TINY + ["--data", data, "--out", str(link)])
    assert os.path.islink(link) and os.path.realpath(link) == str(target)
    assert minibpd.load_checkpoint(str(target))[1]["train"]["steps"] == 3
    os.remove(target)
    os.symlink(tmp_path / "no" / "where.pt", tmp_path / "lost.pt")
    assert "does not exist" in fails(TINY + ["--data", data, "--out", str(tmp_path / "lost.pt")], capsys)


def test_data_has_a_size_cap(paths, tmp_path, no_training, capsys, monkeypatch):
    """--data had no cap (training holds the text as tensors). At most 16 MiB, said in
    --help and checked before the file is read (the cap is made small here)."""
    assert train_heads.MAX_DATA_BYTES == 16 * 2 ** 20
    with pytest.raises(SystemExit):
        cli.train_main(["--help"])
    assert "at most 16 MiB" in " ".join(capsys.readouterr().out.split())
    data, out = paths
    monkeypatch.setattr(train_heads, "MAX_DATA_BYTES", 1000)
    monkeypatch.setattr(train_heads, "load_corpus", lambda *a: pytest.fail("read the corpus first"))
    err = fails(TINY + ["--data", data, "--out", out], capsys)
    assert f"--data {data} holds {len(CODE):,} bytes, more than the 1,000" in err
