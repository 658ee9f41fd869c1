"""The pytest plugin of the folders' tests (conftest.py loads it): the --drafter option that
runs test_minibpd.py's drafter properties on a student's drafter, a tiny trained checkpoint, and
the real model's skips. One thread, as every command (docs/threads.md).
"""
import inspect
import os

import pytest

from lab import cli
from runtime.contract import CheckedDrafter
from runtime.threads import set_threads

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository
SMOLLM_HEADS = os.path.join(ROOT, "checkpoints", "smollm2-heads.pt")
set_threads()


def pytest_addoption(parser):
    parser.addoption("--drafter", metavar="MODULE:FACTORY", default=None,
                     help="run test_minibpd.py's drafter properties on your drafter: MODULE is a "
                          "module name (the current directory is searched first) or a .py file; "
                          "FACTORY(model) if it takes a `model` parameter or a required "
                          "positional one, else FACTORY() (default minibpd:ArgmaxDrafter)")


def pytest_configure(config):
    """Resolve --drafter once, before any test: a missing module or factory fails the whole run
    with the reason, not as a few errors among passes."""
    spec = config.getoption("--drafter") or "minibpd:ArgmaxDrafter"
    module, _, name = spec.rpartition(":")
    if not module or not name:
        raise pytest.UsageError(f"--drafter takes MODULE:FACTORY, e.g. my_drafter:MyDrafter; got {spec!r}")
    try:
        factory = getattr(cli.import_plugin(module, taken_ok=True), name)
    except Exception as e:
        raise pytest.UsageError(f"--drafter {spec}: {type(e).__name__}: {e}") from None
    if not callable(factory):
        raise pytest.UsageError(f"--drafter {spec}: {name} is not callable")
    config.drafter_factory = (lambda model: factory(model)) if takes_model(factory) else \
        (lambda model: factory())


def takes_model(factory):
    """Whether FACTORY wants the model: a parameter named `model`, or a required positional one."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "model" or (p.default is p.empty and p.kind in (p.POSITIONAL_ONLY,
               p.POSITIONAL_OR_KEYWORD)) for p in params)


@pytest.fixture(scope="session")
def drafter_factory(request):
    """model -> a fresh drafter, from --drafter MODULE:FACTORY (default minibpd:ArgmaxDrafter)."""
    return request.config.drafter_factory


@pytest.fixture(scope="session")
def checked():
    """(drafter, model) -> the drafter as bpd_decode calls it: every answer checked against the
    contract (runtime.contract.CheckedDrafter names the rule it breaks)."""
    return CheckedDrafter


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    from training.cli import main
    path = str(tmp_path_factory.mktemp("ck") / "tiny.pt")
    main(["--steps", "40", "--rescorer-steps", "20", "--n-layer", "1", "--n-embd", "32",
          "--n-head", "2", "--block-size", "32", "--batch-size", "8", "--rescorer-embd", "16",
          "--rescorer-layers", "1", "--out", path])
    return path


# ----------------------------------------------------------------------------- the real model

def real_model_or_skip():
    """The GGUF's path, or a clean skip naming the install command (SmolLM2 is optional)."""
    from models import smollm
    try:
        smollm.optional_packages()
        return smollm.find_gguf()
    except ImportError:
        pytest.skip(f"SmolLM2 not installed: {smollm.INSTALL}")


def heads_or_skip():
    """The shipped SmolLM2 heads checkpoint's path, or a clean skip."""
    real_model_or_skip()
    if not os.path.isfile(SMOLLM_HEADS):
        pytest.skip(f"{SMOLLM_HEADS} missing: train it with `python train_heads.py --smollm`")
    return SMOLLM_HEADS
