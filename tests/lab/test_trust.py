"""Every promise holds whatever a plug-in, a checkpoint or a flag hands us: bad checkpoints,
registry entries, factories, plugins, limits and drafters are refused with one clear line, before
any model call where the problem can be seen before (the refusals of test_cli.py, extended)."""
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import types

import pytest
import torch

from lab import bench, cli
import decoders
import minibpd
import train_heads
from training import cli as training_cli
from conftest import ROOT
from conftest import tiny_model
from minibpd import ArgmaxDrafter, greedy_decode
from runtime.contract import DrafterError
from test_cli import no_model_calls, one_line_error, run_cli, unknown_character  # noqa: F401 (a fixture)
from runtime import kvcache
from runtime import checkpoint
from runtime.loop import lab_decode
from tests.helpers import tiny_ckpt  # noqa: F401 (a fixture)

HERE = ROOT  # the repository


@pytest.fixture
def registry(request):
    """Restore the decoder table after a test that registers into it."""
    saved = dict(decoders.DECODERS)
    request.addfinalizer(lambda: (decoders.DECODERS.clear(), decoders.DECODERS.update(saved)))


# ----------------------------------------------------------------------------- checkpoints

def damaged(tiny_ckpt, tmp_path, name, change):
    ck = torch.load(tiny_ckpt, weights_only=True)
    change(ck)
    path = tmp_path / name
    torch.save(ck, path)
    return str(path)


def nan_weights(ck):
    ck["model"]["blocks.0.mlp.0.weight"] = torch.full_like(ck["model"]["blocks.0.mlp.0.weight"],
                                                           float("nan"))


def fewer_heads(ck):
    ck["config"] = dict(ck["config"], n_bpd_heads=4)


@pytest.mark.parametrize("name, change, message", [
    ("nan.pt", nan_weights, "tensor blocks.0.mlp.0.weight holds NaN or inf"),
    ("intvocab.pt", lambda ck: ck.update(vocab=96), "its vocab must be a string"),
    ("dupvocab.pt", lambda ck: ck.update(vocab="a" * len(ck["vocab"])), "distinct characters"),
    ("heads.pt", fewer_heads, "unexpected heads.3.fc.bias, heads.3.fc.weight"),
])
def test_checkpoints_that_would_decode_garbage(tiny_ckpt, tmp_path, capsys, name, change, message):
    path = damaged(tiny_ckpt, tmp_path, name, change)
    code, out, err = run_cli(capsys, "--prompt", "The", "--checkpoint", path)
    one_line_error(code, err, message)
    code, out, err = run_cli(capsys, "--demo", "--checkpoint", path)
    one_line_error(code, err, message)


def test_distilling_a_nan_base_is_refused(tiny_ckpt, tmp_path, capsys):
    path = damaged(tiny_ckpt, tmp_path, "nan.pt", nan_weights)
    with pytest.raises(SystemExit):
        training_cli.train_main(["--distill", "joint", "--base", path, "--out", str(tmp_path / "d.pt"),
                          "--steps", "2", "--threads", "1"])
    assert "holds NaN or inf" in capsys.readouterr().err and not (tmp_path / "d.pt").exists()


def test_a_shape_mismatch_names_the_shapes():
    model = minibpd.GPT(minibpd.GPTConfig(20, 8, 1, 2, 8, 3))
    state = dict(model.state_dict(), **{"tok_emb.weight": torch.zeros(21, 8)})
    with pytest.raises(checkpoint.CheckpointError, match=r"tok_emb.weight: \(21, 8\) for \(20, 8\)"):
        checkpoint.build_model({"vocab_size": 20, "block_size": 8, "n_layer": 1, "n_head": 2,
                             "n_embd": 8, "n_bpd_heads": 3}, state)


# ----------------------------------------------------------------------------- the registry

make_bpd = lambda res, s, answer: ArgmaxDrafter()


@pytest.mark.parametrize("kwargs, message", [
    ({"name": 3}, "one word"), ({"name": ""}, "one word"), ({"name": "two words"}, "one word"),
    ({"name": "greedy"}, "baseline's name"), ({"name": "sample"}, "baseline's name"),
    ({"make": None}, "factory"),
    ({"make": lambda res, s: ArgmaxDrafter()}, "must take three arguments"),   # a student's slip
    ({"defaults": [1, 2]}, "defaults must be"), ({"defaults": "k=3"}, "defaults must be"),
    ({"defaults": {"k": "3"}}, "defaults must be"), ({"defaults": {"k": [3]}}, "defaults must be"),
    ({"defaults": {"k": 3}, "grid": {"k": 4}}, "grid must be"),
    ({"defaults": {"k": 3}, "grid": {"k": []}}, "grid must be"),
    ({"defaults": {"k": 3}, "grid": {"p": [1, 2]}}, "grid settings ['p'] have no default"),
    ({"defaults": {"k": 3}, "grid": {"k": [2, 0]}}, "k must be an integer >= 1"),
    ({"defaults": {"alpha": 0.5}, "grid": {"alpha": [0.5, 7]}}, "alpha must be a number in [0, 1]"),
    ({"defaults": {"k": 0}}, "k must be an integer >= 1"),
    ({"about": 5}, "about must be"),
])
def test_register_checks_everything(registry, kwargs, message):
    args = {"name": "mine", "make": make_bpd, **kwargs}
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        decoders.register(args.pop("name"), args.pop("make"), **args)
    assert "mine" not in decoders.DECODERS and "greedy" not in decoders.DECODERS


def plugin(tmp_path, name, body):
    (tmp_path / f"{name}.py").write_text(body)
    return str(tmp_path / f"{name}.py")


@pytest.mark.parametrize("body, message", [
    ("import decoders\ndecoders.register('greedy', lambda res, s, a: None)\n", "baseline's name"),
    ("raise RuntimeError('boom at import')\n", "RuntimeError: boom at import"),
    ("def broken(:\n", "SyntaxError"),
    ("import decoders\ndecoders.register(7, lambda res, s, a: None)\n", "one word"),
])
def test_plugin_errors_are_one_line(tiny_ckpt, tmp_path, capsys, registry, body, message):
    path = plugin(tmp_path, "bad_plugin", body)
    with pytest.raises(SystemExit) as e:
        cli.main(["--plugin", path, "--prompt", "The", "--checkpoint", tiny_ckpt])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and message in err, err
    assert err.startswith(f"error: --plugin {path}")


@pytest.mark.parametrize("factory, message", [
    ("lambda res, s, a: None", "its factory returned None, not a drafter"),
    ("lambda res, s, a: 42", "its factory returned 42, not a drafter"),
    ("lambda res, s, a: {}['missing']", "its factory failed (KeyError"),
])
def test_bad_factories_are_refused_before_any_model_call(tiny_ckpt, tmp_path, capsys, registry,
                                                         no_model_calls, factory, message):
    path = plugin(tmp_path, "odd_factory", f"import decoders\ndecoders.register('odd', {factory})\n")
    for argv in (["--bench"], ["--demo"], ["--prompt", "The", "--decoder", "odd"]):
        code, out, err = run_cli(capsys, "--plugin", path, *argv, "--checkpoint", tiny_ckpt)
        one_line_error(code, err, f"decoder odd: {message}")  # noqa


def test_plugin_by_path_and_from_the_current_directory(tiny_ckpt, tmp_path, capsys, registry,
                                                       monkeypatch):
    body = ("import decoders\nfrom minibpd import ArgmaxDrafter\n"
            "decoders.register('{0}', lambda res, s, a: ArgmaxDrafter(), about='x')\n")
    elsewhere = tmp_path / "far" / "away"
    elsewhere.mkdir(parents=True)
    path = plugin(elsewhere, "by_path", body.format("bypath"))
    code, out, err = run_cli(capsys, "--plugin", path, "--prompt", "The", "--decoder", "bypath",
                             "--max-new-tokens", "8", "--checkpoint", tiny_ckpt)
    assert code == 0 and "identical to greedy: yes" in err
    plugin(tmp_path, "in_cwd", body.format("incwd"))
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "--plugin", "in_cwd", "--prompt", "The", "--decoder", "incwd",
                             "--max-new-tokens", "8", "--checkpoint", tiny_ckpt)
    assert code == 0 and "identical to greedy: yes" in err


def test_no_abbreviated_flags(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--plug", "nothing", "--demo"])
    assert e.value.code == 2 and "unrecognized arguments: --plug" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        training_cli.parse_train_args(["--dist", "joint"])
    assert __import__("lattice").demo_args(["--demo", "--max", "5"]) is None    # the lab's to refuse


class Failing:
    name, max_drafts = "failing", 1

    def __call__(self, logprobs, context):
        raise ValueError("my own bug")


def test_a_drafter_that_raises_is_reported_as_its_failure(tiny_ckpt, tmp_path, capsys, registry):
    with pytest.raises(DrafterError, match=r"drafter failing failed: ValueError: my own bug"):
        lab_decode(tiny_model(0, 7, 1, 3, 8), [1, 2], 6, Failing())
    path = plugin(tmp_path, "failing_plugin", "import decoders, test_trust\n"
                  "decoders.register('failing', lambda res, s, a: test_trust.Failing())\n")
    code, out, err = run_cli(capsys, "--plugin", path, "--prompt", "The", "--decoder", "failing",
                             "--checkpoint", tiny_ckpt)
    assert code == 1 and err == "error: drafter failing failed: ValueError: my own bug\n"


class Quitter:
    """A drafter that calls sys.exit(0) (or raises GeneratorExit) from inside the decode loop."""
    name, max_drafts = "quitter", 1

    def __init__(self, error=SystemExit(0)):
        self.error = error

    def __call__(self, logprobs, context):
        raise self.error


def test_sys_exit_in_a_plugin_is_its_failure_not_a_silent_success(tiny_ckpt, tmp_path, capsys,
                                                                   registry):
    """SystemExit(0) raised by a drafter, a factory or a plugin module gave exit 0 and
    no output; it is now reported as theirs, one line (KeyboardInterrupt still interrupts)."""
    for error in (SystemExit(0), GeneratorExit()):
        with pytest.raises(DrafterError, match=f"drafter quitter failed: {type(error).__name__}"):
            lab_decode(tiny_model(0, 7, 1, 3, 8), [1, 2], 6, Quitter(error))
    path = plugin(tmp_path, "quitting_drafter", "import decoders, test_trust\n"
                  "decoders.register('quitter', lambda res, s, a: test_trust.Quitter())\n")
    code, out, err = run_cli(capsys, "--plugin", path, "--prompt", "The", "--decoder", "quitter",
                             "--checkpoint", tiny_ckpt)
    assert code == 1 and out == "" and err == "error: drafter quitter failed: SystemExit: 0\n"
    path = plugin(tmp_path, "quitting_factory", "import decoders, sys\n"
                  "decoders.register('quits', lambda res, s, a: sys.exit(0))\n")
    code, out, err = run_cli(capsys, "--plugin", path, "--prompt", "The", "--decoder", "quits",
                             "--checkpoint", tiny_ckpt)
    one_line_error(code, err, "decoder quits: its factory failed (SystemExit: 0)")
    path = plugin(tmp_path, "quitting_module", "raise SystemExit(0)\n")
    with pytest.raises(SystemExit) as e:
        cli.main(["--plugin", path, "--prompt", "The", "--checkpoint", tiny_ckpt])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == f"error: --plugin {path}: SystemExit: 0\n"


# ----------------------------------------------------------------------------- --drafter

def student_run(tmp_path, source, spec):
    (tmp_path / "student_factory.py").write_text(source)
    env = dict(os.environ, HYPOTHESIS_PROFILE="quick", PYTHONPATH=HERE)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           os.path.join(HERE, "test_minibpd.py"), "-k", "your_drafter and cpu",
                           "--drafter", spec], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=300)


@pytest.mark.parametrize("signature", ["self, n=3", "self, *, n=3", "self, model", "self, model, n=1"])
def test_drafter_option_calls_factories_as_they_ask(tmp_path, signature):
    source = ("from minibpd import ArgmaxDrafter\n"
              f"class Mine(ArgmaxDrafter):\n    def __init__({signature}):\n"
              "        assert 'model' not in locals() or hasattr(model, 'config')\n")
    r = student_run(tmp_path, source, "student_factory:Mine")
    assert r.returncode == 0 and "2 passed" in r.stdout, r.stdout[-1500:] + r.stderr[-1500:]


def test_drafter_option_with_a_missing_module_fails_the_run(tmp_path):
    r = student_run(tmp_path, "x = 1\n", "no_such_module:Mine")
    assert r.returncode != 0 and "passed" not in r.stdout
    said = " ".join((r.stderr + r.stdout).split())
    assert "--drafter no_such_module:Mine: ImportError: no module 'no_such_module'" in said
    assert str(tmp_path) in said and "path/to/no_such_module.py" in said   # where; what works


def test_a_plugin_that_is_nowhere_says_where_it_looked(tmp_path, monkeypatch, capsys):
    """`--plugin my_drafter` run from elsewhere gave a bare ModuleNotFoundError,
    without where it looked or that a path to the .py file works."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        cli.main(["--plugin", "my_drafter_nowhere", "--prompt", "The"])
    err = " ".join(capsys.readouterr().err.split())
    assert "no module 'my_drafter_nowhere' in the current directory" in err
    assert str(tmp_path) in err and "path/to/my_drafter_nowhere.py" in err


def test_a_plugin_missing_its_own_import_names_that_import(tmp_path, monkeypatch, capsys):
    """Only the plug-in's own absence is reworded: a module it imports that is missing is named."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_needy.py").write_text("import no_such_dependency\n")
    with pytest.raises(SystemExit):
        cli.main(["--plugin", "my_needy", "--prompt", "The"])
    assert "No module named 'no_such_dependency'" in capsys.readouterr().err


# ----------------------------------------------------------------------------- limits

@pytest.mark.parametrize("argv, message", [
    (["--prompt", "The", "--threads", "100000"], "--threads must be an integer from 1 to"),
    (["--bench", "--prompts", "1000000000"], "holds at most"),
    (["--tune", "--prompts", "1000000", "--tuned", "x.json"], "holds at most"),
    (["--demo", "--max-new-tokens", "200"], "--demo shows at most 160 new tokens"),
    (["--tune", "--heads", "1"], "add --tuned FILE"),
    (["--prompt", "The", "--tuned", "/nonexistent/tuned.json"], "tuned file /nonexistent/tuned.json not found"),
])
def test_limits_are_refused(tiny_ckpt, capsys, no_model_calls, argv, message):
    code, out, err = run_cli(capsys, *argv, "--checkpoint", tiny_ckpt)
    one_line_error(code, err, message)


def test_out_that_cannot_be_written_fails_before_training(capsys, monkeypatch):
    monkeypatch.setattr(train_heads, "train", lambda *a, **k: pytest.fail("training started"))
    with pytest.raises(SystemExit):
        training_cli.train_main(["--out", "/proc/minibpd_cannot_write_here.pt", "--steps", "1"])
    assert "not writable" in capsys.readouterr().err


@pytest.mark.assignment3
def test_a_file_tuned_with_other_heads_is_not_applied(tiny_ckpt, tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"settings": {"pbest": {"k": 3}}, "heads": 1,
                                "checkpoint_sha256": checkpoint.file_sha256(tiny_ckpt)}))
    code, out, err = run_cli(capsys, "--prompt", "The", "--decoder", "pbest", "--max-new-tokens",
                             "6", "--tuned", str(path), "--checkpoint", tiny_ckpt)
    assert code == 0 and "tuned with 1 heads, this run uses 8" in err
    code, out, err = run_cli(capsys, "--prompt", "The", "--decoder", "pbest", "--max-new-tokens",
                             "6", "--tuned", str(path), "--heads", "1", "--checkpoint", tiny_ckpt)
    assert code == 0 and "warning" not in err


@pytest.mark.assignment3
def test_tune_records_its_heads(tiny_ckpt, tmp_path, capsys, monkeypatch):
    for d in decoders.DECODERS.values():
        monkeypatch.setattr(d, "grid", {k: v[:1] for k, v in d.grid.items()})
    out = tmp_path / "h2.json"
    code, _, _ = run_cli(capsys, "--tune", "--heads", "2", "--prompts", "2", "--new-tokens", "8",
                         "--tuned", str(out), "--checkpoint", tiny_ckpt)
    assert code == 0 and json.loads(out.read_text())["heads"] == 2


def test_small_refusals():
    model = tiny_model(0, 7, 1, 3, 8)
    for prompt in ([True, 2], [1, False]):
        with pytest.raises(ValueError, match="integer token ids"):
            lab_decode(model, prompt, 3)

    class BoolDraft(ArgmaxDrafter):
        def __call__(self, logprobs, context):
            return [[context[-1]] + [True] * (len(logprobs) - 1)]
    with pytest.raises(ValueError, match=r"broke the drafter contract \(lists of ints\)"):
        lab_decode(model, [1, 2], 5, BoolDraft())
    big = types.SimpleNamespace(config=minibpd.GPTConfig(7, 2 ** 22, 1, 2, 128, 3),  # not built:
                                kv_spec=lambda: kvcache.KVSpec(1, 2, 64, torch.float64, "cpu"))
    with pytest.raises(ValueError, match=r"a KV cache of 1 row\(s\) of this model would pass 1 GiB"):   # 4 GiB a row
        greedy_decode(big, [1, 2], 3)
    with pytest.raises(ValueError, match="neural: k must be an integer >= 1"):
        decoders.check("neural", {"k": 0, "alpha": 0.5})


def test_unknown_character_comes_from_the_checkpoint_vocab(tiny_ckpt, capsys, no_model_calls):
    """Which characters a corpus holds depends on the Python that ships it: build the unknown one
    from the checkpoint's own vocabulary, never assume it (3.13's pydoc has '$')."""
    unknown = unknown_character(torch.load(tiny_ckpt, weights_only=True)["vocab"])
    code, out, err = run_cli(capsys, "--prompt", f"cost {unknown}5", "--checkpoint", tiny_ckpt)
    one_line_error(code, err, "never saw")
    assert "it knows a-z, A-Z, 0-9" in err


# ----------------------------------------------------------------------------- the advice

SMOLLM = os.path.join(checkpoint.CHECKPOINTS, "smollm2-heads.pt")
needs_smollm = pytest.mark.skipif(not os.path.isfile(SMOLLM), reason=f"{SMOLLM} missing")


@pytest.fixture
def no_model_load(monkeypatch):
    """Building SmolLM2 (its GGUF: 5-70 s) or any GPT fails the test: the refusal comes first."""
    from models import smollm

    def load(*a, **k):
        raise AssertionError("a model was loaded before the refusal")
    monkeypatch.setattr(smollm, "load_gguf", load)
    monkeypatch.setattr(checkpoint, "build_model", load)


def suggested(err):
    """The train_heads.py command an error advises, parsed as train_heads.py would (--help level)."""
    command = shlex.split(err.split("`")[1])
    assert command[:2] == ["python", "train_heads.py"], err
    return training_cli.parse_train_args(command[2:])


def smollm_copy(tmp_path, name, change=None, keep=None):
    """A copy of the shipped SmolLM2 heads checkpoint: changed (a dict edit) or cut to `keep` bytes."""
    path = tmp_path / name
    if keep is not None:
        path.write_bytes(open(SMOLLM, "rb").read()[:keep])
    else:
        ck = torch.load(SMOLLM, map_location="cpu", weights_only=True)
        change(ck)
        torch.save(ck, path)
    return str(path)


@needs_smollm
@pytest.mark.parametrize("name, change, keep, message", [
    ("dtype.pt", lambda ck: ck.update(dtype="int8"), None, "has dtype 'int8'"),
    ("format.pt", lambda ck: ck.update(format_version=0), None, "has format 0"),
    ("trunc.pt", None, 200_000, "is corrupt"),
])
def test_advice_for_a_smollm_checkpoint_names_its_file_and_mode(tmp_path, capsys, no_model_load,
                                                                name, change, keep, message):
    """The errors advised `train_heads.py --force` (retraining the shipped character
    checkpoint) or `--out trunc.pt --force` (training a character GPT) for SmolLM2's heads."""
    path = smollm_copy(tmp_path, name, change, keep)
    code, out, err = run_cli(capsys, "--prompt", "The", "--checkpoint", path)
    one_line_error(code, err, message)
    args = suggested(err)
    assert args.smollm and args.force and os.path.abspath(args.out) == os.path.abspath(path), err


def with_nan(tag):
    def change(ck):
        nan_weights(ck)
        ck.update(tag)
    return change


@pytest.mark.parametrize("tag, mode", [({}, None), ({"finetune": {}}, "tasks"),
                                       ({"distill": {"variant": "frozen"}}, "frozen")])
def test_advice_for_a_character_checkpoint_names_its_file_and_mode(tiny_ckpt, tmp_path, capsys,
                                                                   tag, mode):
    path = damaged(tiny_ckpt, tmp_path, "nan.pt", with_nan(tag))
    code, out, err = run_cli(capsys, "--prompt", "The", "--checkpoint", path)
    one_line_error(code, err, "holds NaN or inf")
    args = suggested(err)
    assert os.path.abspath(args.out) == os.path.abspath(path) and args.force and not args.smollm
    assert args.tasks == (mode == "tasks") and args.distill == (None if mode == "tasks" else mode)
    truncated = tmp_path / "trunc.pt"
    truncated.write_bytes(open(tiny_ckpt, "rb").read()[:1000])
    code, out, err = run_cli(capsys, "--demo", "--checkpoint", str(truncated))
    one_line_error(code, err, "is corrupt")
    assert os.path.abspath(suggested(err).out) == str(truncated) and not suggested(err).smollm
    assert "--force" not in checkpoint.retrain(None)   # no file known: a new one


@pytest.mark.parametrize("dtype", ["int8", ["float32"], 32])
def test_a_dtype_that_is_no_torch_dtype_is_a_checkpoint_error(tiny_ckpt, tmp_path, capsys, dtype):
    with pytest.raises(checkpoint.CheckpointError, match="has dtype"):
        checkpoint.dtype_of({"dtype": dtype}, "x.pt")
    path = damaged(tiny_ckpt, tmp_path, "dtype.pt", lambda ck: ck.update(dtype=dtype))
    code, out, err = run_cli(capsys, "--prompt", "The", "--checkpoint", path)
    one_line_error(code, err, f"has dtype {dtype!r}")
    assert os.path.abspath(suggested(err).out) == os.path.abspath(path)


@needs_smollm
@pytest.mark.parametrize("mode", [["--tasks"], ["--distill", "frozen"]])
def test_a_smollm_base_is_refused_before_any_work(tmp_path, capsys, monkeypatch, mode):
    """train_heads.py --tasks / --distill fine-tune a character GPT: SmolLM2's heads checkpoint as
    --base is refused from its header, before loading anything (it raised a TypeError after)."""
    monkeypatch.setattr(training_cli, "run", lambda args: pytest.fail("the run started"))
    with pytest.raises(SystemExit) as e:
        training_cli.train_main([*mode, "--base", SMOLLM, "--out", str(tmp_path / "o.pt")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: --base {SMOLLM} is a 'smollm2-heads' checkpoint") and "--smollm" in err


# ----------------------------------------------------------------------------- before the load

TASKS_CKPT = os.path.join(checkpoint.CHECKPOINTS, "minibpd-tasks.pt")


def smollm_tuned(tmp_path, settings):
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"settings": settings, "checkpoint_sha256": checkpoint.file_sha256(SMOLLM)}))
    return str(path)


@needs_smollm
@pytest.mark.parametrize("argv, message", [
    (["--prompt", "The", "--heads", "0"], "heads must be an integer from 1 to 5"),
    (["--prompt", "The", "--heads", "9"], "heads must be an integer from 1 to 5"),
    (["--prompt", "The", "--tuned", "/nonexistent.json"], "tuned file /nonexistent.json not found"),
    (["--bench", "--prompts", "100000"], "holds at most 942: lower --prompts"),
    (["--tasks", "--prompts", "100000"], "fewer than --prompts 100000"),   # its tasks built here
    (["--scale"], "--scale projects the character GPT family"),
    (["--prompt", "a\udcffb"], "the text holds a lone surrogate, '\\udcff' at character 1"),
    (["--prompt", "The", "--decoder", "pbest", "--p", "5000"], "pbest: a KV cache of 5000 rows"),
    (["--prompt", "The", "--decoder", "lookup", "--copy", "100000000"], "--copy: copy must be"),
    (["--prompt", "The", "--decoder", "lookup_pbest", "--copy", "1024", "--dtype", "float64"],
     "lookup_pbest: copy 1024: a token tree of 17 drafts of up to 1024 tokens"),
    (["--demo", "--max-new-tokens", "100"], "demo shows at most 32 new tokens a prompt"),
    (["--prompt", "The", "--decoder", "bpd", "--k", "4"], "--k does nothing for decoder bpd"),
    (["--tasks", "--decoders", "bpd", "--prompts", "1"], "--decoders bpd names none"),
    (["--tasks", "--decoders", "sampled", "--prompts", "1"], "--decoders sampled names none"),
    (["--tasks", "--decoders", "oracle", "--prompts", "1"], "--decoders oracle names none"),
    (["--prompt", "The", "--tuned", {"neural": {"reach": 5}}], "settings.neural: reach must be"),
    (["--prompt", "The", "--tuned", {"neural": {"reach": float("nan")}}], "reach must be a number"),
    (["--prompt", "The", "--tuned", {"lookup": {"copy": 10 ** 8}}], "settings.lookup: copy must be"),
])
def test_smollm_refusals_come_before_its_load(capsys, tmp_path, no_model_load, argv, message):
    """Each was refused (or warned about, or failed: --scale with a TypeError, --tasks with `max()
    arg is an empty sequence`) only after SmolLM2's 30-70 s load; now from the checkpoint's
    header (check_against_checkpoint), before any load (no_model_load)."""
    argv = [smollm_tuned(tmp_path, a) if isinstance(a, dict) else a for a in argv]
    code, out, err = run_cli(capsys, *argv, "--checkpoint", SMOLLM)
    one_line_error(code, err, message)


@pytest.mark.skipif(not os.path.isfile(TASKS_CKPT), reason=f"{TASKS_CKPT} missing")
def test_tasks_examples_are_counted_before_the_load(capsys, no_model_load):
    code, out, err = run_cli(capsys, "--tasks", "--prompts", "100000", "--checkpoint", TASKS_CKPT)
    one_line_error(code, err, "asked for 100,000 examples per task, but the smallest task holds")


def test_bfloat16_is_refused_for_the_character_gpt(tiny_ckpt, capsys, no_model_load):
    """In bf16 its batched verification and one-token decoding round differently, and
    BPD differed from greedy ("identical to greedy: NO", exit 1)."""
    code, out, err = run_cli(capsys, "--prompt", "The", "--dtype", "bfloat16", "--checkpoint", tiny_ckpt)
    one_line_error(code, err, "bfloat16 is refused for")
    assert "not batch-invariant" in err
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "The character GPT takes float32 or float64" in " ".join(capsys.readouterr().out.split())


def test_text_is_read_up_to_a_limit(tiny_ckpt, capsys, no_model_load, monkeypatch):
    """--text /dev/zero read without bound (MemoryError); at most MAX_TEXT_BYTES now (64 MiB,
    made small here to keep the test light)."""
    from lab import checks
    assert checks.MAX_TEXT_BYTES == 64 * 2 ** 20
    monkeypatch.setattr(checks, "MAX_TEXT_BYTES", 4096)
    code, out, err = run_cli(capsys, "--bench", "--text", "/dev/zero", "--checkpoint", tiny_ckpt)
    one_line_error(code, err, "--text /dev/zero holds more than 4,096 bytes")


# ----------------------------------------------------------------------------- --tune's file

def shrink_grids(monkeypatch):
    for d in decoders.DECODERS.values():
        monkeypatch.setattr(d, "grid", {k: v[:1] for k, v in d.grid.items()})


@pytest.mark.assignment3
def test_tune_writes_no_file_it_should_not(tiny_ckpt, tmp_path, capsys, no_model_calls, monkeypatch):
    """--tune --tuned PATH overwrote whatever PATH held (a checkpoint) with JSON, and
    the shipped default too. Refused now, before the run: a file that is not a tuned file of
    this checkpoint, a shipped file without --force, a place that cannot be written."""
    monkeypatch.setattr(bench, "tune_timed", lambda *a, **k: pytest.fail("the tune ran"))
    a_checkpoint = tmp_path / "copy.pt"
    a_checkpoint.write_bytes(open(tiny_ckpt, "rb").read())
    run = ["--tune", "--prompts", "2", "--new-tokens", "8", "--checkpoint", tiny_ckpt]
    code, out, err = run_cli(capsys, *run, "--tuned", str(a_checkpoint))
    one_line_error(code, err, f"--tuned {a_checkpoint} exists and holds no JSON")
    code, out, err = run_cli(capsys, *run, "--tuned", str(a_checkpoint), "--force")
    one_line_error(code, err, "holds no JSON")                # --force: never for a non-tuned file
    assert a_checkpoint.read_bytes() == open(tiny_ckpt, "rb").read()
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"settings": {}, "checkpoint_sha256": "0" * 64}))
    code, out, err = run_cli(capsys, *run, "--tuned", str(other))
    one_line_error(code, err, "tuned for another checkpoint")
    code, out, err = run_cli(capsys, *run, "--tuned", "/proc/nope.json")
    one_line_error(code, err, "--tuned /proc/nope.json: not writable")
    code, out, err = run_cli(capsys, "--prompt", "The", "--force", "--checkpoint", tiny_ckpt)
    one_line_error(code, err, "--force does nothing with --prompt")


@pytest.mark.parametrize("argv", [["--tuned", "checkpoints/minibpd.pt.tuned.json", "--heads", "1"], []])
@pytest.mark.assignment3
def test_tune_never_writes_a_shipped_file_without_force(capsys, no_model_load, monkeypatch, argv):
    monkeypatch.chdir(ROOT)
    shipped = os.path.join(checkpoint.CHECKPOINTS, "minibpd.pt.tuned.json")
    before = checkpoint.file_sha256(shipped)
    code, out, err = run_cli(capsys, "--tune", *argv)
    one_line_error(code, err, "shipped in")
    assert "--tuned my.tuned.json" in err and checkpoint.file_sha256(shipped) == before
    assert "--force" not in err          # no advice to overwrite a shipped file


@pytest.mark.assignment3
def test_tune_force_replaces_a_stale_tuned_file(tiny_ckpt, tmp_path, capsys, monkeypatch):
    shrink_grids(monkeypatch)
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps({"settings": {}, "checkpoint_sha256": "0" * 64}))
    code, out, err = run_cli(capsys, "--tune", "--prompts", "2", "--new-tokens", "8", "--tuned",
                             str(stale), "--force", "--checkpoint", tiny_ckpt)
    assert code == 0 and json.loads(stale.read_text())["checkpoint_sha256"] == \
        checkpoint.file_sha256(tiny_ckpt)


# ----------------------------------------------------------------------------- ignored flags

@pytest.mark.parametrize("argv, message", [
    (["--scale", "--verify", "tree"], "--scale times every decoder with its own verification"),
    (["--scale", "--verify", "batch"], "drop --verify batch"),
    (["--bench", "--decoder", "pbest"], "--decoder does nothing with --bench"),
    (["--demo", "--decoder", "pbest"], "--decoder does nothing with --demo"),
    (["--bench", "--max-new-tokens", "5"], "--bench takes --new-tokens"),
    (["--prompt", "The", "--json"], "--json does nothing with --prompt"),
    (["--tasks", "--new-tokens", "5"], "--new-tokens does nothing with --tasks"),
    (["--tune", "--text", "x.txt"], "--text does nothing with --tune"),
    (["--bench", "--objective", "tokens_per_s"], "--objective does nothing with --bench"),
    (["--scale", "--sweep"], "--sweep does nothing with --scale"),
    (["--prompt", "The", "--prompts", "3"], "--prompts does nothing with --prompt"),
    (["--bench", "--temperature", "1", "--sweep"], "--sweep draws on the greedy bench"),
])
def test_flags_a_mode_ignores_are_refused(tiny_ckpt, capsys, no_model_load, argv, message):
    code, out, err = run_cli(capsys, *argv, "--checkpoint", tiny_ckpt)
    one_line_error(code, err, message)


def test_plain_bpd_cannot_be_replaced(tiny_ckpt, tmp_path, capsys, registry):
    """`bpd` is the reference of every "vs BPD" figure: a plugin may not register over it."""
    with pytest.raises(ValueError, match="'bpd' is plain BPD"):
        decoders.register("bpd", make_bpd)
    path = plugin(tmp_path, "over_bpd", "import decoders, minibpd\n"
                  "decoders.register('bpd', lambda res, s, a: minibpd.ArgmaxDrafter())\n")
    with pytest.raises(SystemExit) as e:
        cli.main(["--plugin", path, "--bench", "--checkpoint", tiny_ckpt])
    assert e.value.code == 2 and "'bpd' is plain BPD" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the library

def test_library_refusals_name_what_they_refuse():
    """tasks.build(['qa'], ...) raised TypeError (unhashable); a drafter with
    max_drafts 10**7 got a cache-size error that did not name it; a q on the meta device raised
    NotImplementedError, not the contract's ValueError."""
    from lab import tasks
    with pytest.raises(ValueError, match=r"unknown task \['qa'\]"):
        tasks.build(["qa"], "test")
    with pytest.raises(ValueError, match=r"unknown split \['test'\]"):
        tasks.build("qa", ["test"])

    class Huge(ArgmaxDrafter):
        name, max_drafts = "huge", 10 ** 7
    model = tiny_model(0, 7, 1, 3, 8)
    for verify in ("batch", "tree"):
        with pytest.raises(ValueError, match="drafter huge: max_drafts 10000000: .*KV cache"):
            lab_decode(model, [1, 2], 6, Huge(), verify=verify)

    class MetaQ(decoders.HeadSampler):
        name = "metaq"

        def sample(self, logprobs, context, temperature, generator=None):
            drafts, q = super().sample(logprobs, context, temperature, generator)
            return drafts, q.to("meta")
    with pytest.raises(ValueError, match=r"drafter metaq broke the drafter contract \(declared q\)"):
        lab_decode(model, [1, 2], 6, MetaQ(), 1.0, torch.Generator().manual_seed(0))


# ----------------------------------------------------------------------------- regressions

@pytest.mark.parametrize("name", ["docs/limits.md", "checkpoints/minibpd.pt.tuned.json", "README.md",
                                  "a torch dict"])
def test_advice_never_forces_a_file_that_is_no_checkpoint(capsys, no_model_load, tmp_path, name):
    """`--checkpoint docs/limits.md` was told `train_heads.py --out docs/limits.md
    --force` (README.md, which names SmolLM2's kind: `--smollm --out README.md --force`). A
    file that is no train_heads.py checkpoint, or a shipped one, gets a new file instead."""
    path = os.path.join(ROOT, name)
    if name == "a torch dict":
        path = str(tmp_path / "state.pt")
        torch.save({"weight": torch.zeros(2)}, path)
    code, out, err = run_cli(capsys, "--prompt", "The", "--checkpoint", path)
    one_line_error(code, err, f"checkpoint {path}")
    args = suggested(err)
    assert "--force" not in err and not args.force and args.out == "my-model.pt", err


def test_advice_for_a_shipped_checkpoint_is_a_new_file(tmp_path):
    link = tmp_path / "link.pt"
    os.symlink(checkpoint.CHECKPOINT, link)
    for path, kind, mode in ((checkpoint.CHECKPOINT, None, ""), (SMOLLM, "smollm2-heads", " --smollm"),
                             (str(link), "tasks", " --tasks")):
        advice = checkpoint.retrain(path, kind)
        assert "--force" not in advice, advice
        assert f"`python train_heads.py{mode} --out my-" in advice
    assert "--force" in checkpoint.retrain(str(tmp_path / "mine.pt"), "tasks")
    assert "--force" not in checkpoint.retrain(None)


@needs_smollm
def test_a_smollm_checkpoint_elsewhere_is_told_its_own_file(tmp_path, capsys, no_model_load):
    """A copy with a NaN head was told `train_heads.py --smollm --force`, which
    writes the shipped checkpoints/smollm2-heads.pt."""
    def nan_head(ck):
        ck["heads"]["0.fc.weight"].view(-1)[3] = float("nan")
    path = smollm_copy(tmp_path, "nan.pt", nan_head)
    code, out, err = run_cli(capsys, "--prompt", "The", "--checkpoint", path)
    one_line_error(code, err, "holds NaN or inf")
    args = suggested(err)
    assert args.smollm and args.force and os.path.abspath(args.out) == path, err


def built_only_on_meta(monkeypatch):
    """Building a GPT anywhere but on the meta device fails the test."""
    real = checkpoint.FastGPT

    def guarded(cfg):
        if torch.empty(0).device.type != "meta":
            raise AssertionError("a model was built before its config was checked")
        return real(cfg)
    monkeypatch.setattr(checkpoint, "FastGPT", guarded)


@pytest.mark.parametrize("key, value, message", [
    ("n_embd", 65536, "shapes tok_emb.weight: ({V}, 32) for ({V}, 65536)"),
    ("n_bpd_heads", 2_000_000, "its config says n_bpd_heads=2000000, its weights hold 8"),
    ("n_layer", 10 ** 7, "its config says n_layer=10000000, its weights hold 1"),
    ("vocab_size", 10 ** 10, "tok_emb.weight: ({V}, 32) for (10000000000, 32)"),
])
def test_a_config_larger_than_its_weights_is_never_built(tiny_ckpt, tmp_path, capsys, monkeypatch,
                                                         key, value, message):
    """build_model allocated the config's model before comparing it with the
    weights (gigabytes, then an allocator's traceback). The config is checked against the weights'
    shapes first, on the meta device (no memory). V: the tiny model's characters, the running
    Python's corpus's (103 in 3.11, 104 in 3.13)."""
    path = damaged(tiny_ckpt, tmp_path, "big.pt", lambda ck: ck["config"].update({key: value}))
    built_only_on_meta(monkeypatch)
    code, out, err = run_cli(capsys, "--prompt", "The", "--checkpoint", path)
    V = torch.load(tiny_ckpt, weights_only=True)["config"]["vocab_size"]
    one_line_error(code, err, message.format(V=V))


@pytest.mark.skipif(not os.path.isfile(TASKS_CKPT), reason=f"{TASKS_CKPT} missing")
def test_tasks_without_a_refinement_is_refused_up_front(capsys, no_model_load):
    """`--tasks --decoders bpd` ran every task, then `max() arg is an empty sequence`."""
    code, out, err = run_cli(capsys, "--tasks", "--decoders", "bpd,oracle", "--checkpoint", TASKS_CKPT)
    one_line_error(code, err, "--tasks compares decoders that refine BPD's drafts with bpd")


def test_a_plugin_replacing_pbest_does_not_blame_the_tuned_file(tiny_ckpt, tmp_path, capsys,
                                                                registry):
    """A plug-in re-registering pbest with other settings made every command fail
    with an error blaming the shipped tuned file ("... fix it, delete it"). The file's settings
    for the replaced decoder are skipped, with a warning that names the plug-in's doing."""
    path = plugin(tmp_path, "new_pbest", "import decoders, minibpd\ndecoders.register('pbest', "
                  "lambda res, s, a: minibpd.ArgmaxDrafter(), defaults={'k': 2})\n")
    for argv in (["--checkpoint", checkpoint.CHECKPOINT],          # the shipped tuned file
                 ["--checkpoint", tiny_ckpt, "--tuned", str(tmp_path / "t.json")]):
        (tmp_path / "t.json").write_text(json.dumps({"settings": {"pbest": {"k": 8, "p": 16}}}))
        code, out, err = run_cli(capsys, "--plugin", path, "--prompt", "The", "--decoder",
                                 "pbest", "--max-new-tokens", "6", *argv)
        assert code == 0 and "identical to greedy: yes" in err, err
        assert "a plug-in re-registered as 'pbest'" in err and "delete it" not in err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"settings": {"neural": {"q": 1}}}))      # its own: still an error
    code, out, err = run_cli(capsys, "--plugin", path, "--prompt", "The", "--tuned", str(bad),
                             "--checkpoint", tiny_ckpt)
    one_line_error(code, err, "settings.neural must be an object with keys from")


@pytest.mark.parametrize("name", ["ngram", "lattice", "decoders", "json"])
def test_a_plugin_name_that_is_taken_is_refused(tiny_ckpt, tmp_path, capsys, registry,
                                                monkeypatch, name):
    """`--plugin ngram` (a student's ./ngram.py) silently imported the project's
    ngram, then `unknown decoder 'mine'`; the same for any module already imported."""
    plugin(tmp_path, name, "import decoders, minibpd\n"
           "decoders.register('mine', lambda res, s, a: minibpd.ArgmaxDrafter())\n")
    monkeypatch.chdir(tmp_path)
    for spec in (name, f"{name}.py"):
        with pytest.raises(SystemExit) as e:
            cli.main(["--plugin", spec, "--prompt", "The", "--decoder", "mine", "--checkpoint",
                      tiny_ckpt])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1, err
        assert err.startswith(f"error: --plugin {spec}: ImportError: the module name '{name}' is "
                              "taken") and f"rename yours (e.g. my_{name}.py)" in err, err
    assert "mine" not in decoders.DECODERS


@pytest.mark.parametrize("body, message", [
    ({"settings": {"mine": {}}, "plugins": 5}, "'plugins' must be a list of module names"),
    ("[" * 100_000 + "]" * 100_000, "is not valid JSON (RecursionError"),
])
def test_malformed_tuned_files_are_one_line(tiny_ckpt, tmp_path, capsys, no_model_load, body,
                                            message):
    """`"plugins": 5` raised TypeError, JSON nested 100k deep RecursionError."""
    path = tmp_path / "t.json"
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    code, out, err = run_cli(capsys, "--prompt", "The", "--tuned", str(path), "--checkpoint", tiny_ckpt)
    one_line_error(code, err, message)
    code, out, err = run_cli(capsys, "--tune", "--tuned", str(path), "--checkpoint", tiny_ckpt)
    one_line_error(code, err, "exists and holds no")


def sparse_weight(ck):
    ck["model"]["tok_emb.weight"] = ck["model"]["tok_emb.weight"].float().to_sparse()


def complex_weight(ck):
    ck["model"]["tok_emb.weight"] = ck["model"]["tok_emb.weight"].to(torch.complex64)


@pytest.mark.parametrize("change, argv, message", [
    (lambda ck: ck.update(kind=["x"]), ["--prompt", "The"], "is of kind ['x'], which this minibpd"),
    (lambda ck: ck.update(splits=["a", "b"]), ["--bench"], "'splits' must be {split: text}, got list"),
    (lambda ck: ck.update(splits=None), ["--bench"], "'splits' must be {split: text}, got NoneType"),
    (lambda ck: ck["splits"].update(test=7), ["--bench"], "got a int for 'test'"),
    (sparse_weight, ["--prompt", "The"], "tensor tok_emb.weight is not a dense float tensor"),
    (complex_weight, ["--prompt", "The"],
     "is not a dense float tensor (torch.strided, torch.complex64)"),
])
def test_malformed_checkpoints_are_one_line(tiny_ckpt, tmp_path, capsys, change, argv, message):
    """`kind: ["x"]` (unhashable), splits a list or None (AttributeError under
    --bench) and a sparse weight (NotImplementedError) raised tracebacks; a complex weight
    loaded its real part with only a torch warning."""
    path = damaged(tiny_ckpt, tmp_path, "odd.pt", change)
    code, out, err = run_cli(capsys, *argv, "--checkpoint", path)
    one_line_error(code, err, message)


def test_keyboard_interrupt_is_one_line(tiny_ckpt, tmp_path, capsys, registry):
    """A KeyboardInterrupt in a plug-in's import or in a drafter gave a traceback;
    now "interrupted" and exit status 130, the shell's for Ctrl-C."""
    path = plugin(tmp_path, "interrupts", "raise KeyboardInterrupt\n")
    assert cli.main(["--plugin", path, "--prompt", "The", "--checkpoint", tiny_ckpt]) == 130
    assert capsys.readouterr().err == "interrupted\n"
    path = plugin(tmp_path, "interrupting_drafter", "import decoders, test_trust\n"
                  "decoders.register('stop', lambda res, s, a: test_trust.Quitter(KeyboardInterrupt()))\n")
    code, out, err = run_cli(capsys, "--plugin", path, "--prompt", "The", "--decoder", "stop",
                             "--checkpoint", tiny_ckpt)
    assert code == 130 and err == "interrupted\n"
    r = subprocess.run([sys.executable, "minibpd.py", "--plugin", str(tmp_path / "interrupts.py"),
                        "--prompt", "The", "--checkpoint", tiny_ckpt], capture_output=True,
                       text=True, cwd=HERE)
    assert r.returncode == 130 and r.stderr == "interrupted\n", r.stderr


def test_top1_is_not_labelled_approximate(tiny_ckpt, capsys):
    """`--accept top1` (the exact rule: a drafted token passes when it is the
    argmax) was labelled APPROXIMATE; min1 too. top2 still is."""
    for spec in ("top1", "min1"):
        code, out, err = run_cli(capsys, "--prompt", "The", "--accept", spec, "--max-new-tokens",
                                 "12", "--checkpoint", tiny_ckpt)
        assert code == 0 and "APPROXIMATE" not in err and "identical to greedy: yes" in err, err
    code, out, err = run_cli(capsys, "--prompt", "The", "--accept", "top2", "--max-new-tokens",
                             "12", "--checkpoint", tiny_ckpt)
    assert code == 0 and "APPROXIMATE" in err


def test_a_refused_run_creates_no_plot_folder(tiny_ckpt, tmp_path, capsys, no_model_load):
    """--plot DIR was created by the checks even when a later one refused the run."""
    figs = tmp_path / "figs" / "deeper"
    code, out, err = run_cli(capsys, "--bench", "--plot", str(figs), "--prompts", "100000000",
                             "--checkpoint", tiny_ckpt)
    # Without matplotlib (CI installs none) the run is refused earlier, for that: no folder either.
    has_mpl = importlib.util.find_spec("matplotlib") is not None
    one_line_error(code, err, "holds at most" if has_mpl else "needs matplotlib")
    assert not (tmp_path / "figs").exists()
    if not has_mpl:
        return
    (tmp_path / "file").write_text("x")
    code, out, err = run_cli(capsys, "--bench", "--plot", str(tmp_path / "file" / "f"),
                             "--checkpoint", tiny_ckpt)
    one_line_error(code, err, "cannot create that folder")
