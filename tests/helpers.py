"""What the folders' tests share beyond the paper's fixtures (../conftest.py): a tiny trained
checkpoint (a fixture: a test file imports it), and the real model's skips (SmolLM2 and its heads
are optional, so their tests skip cleanly without them, naming what to install)."""
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository
SMOLLM_HEADS = os.path.join(ROOT, "checkpoints", "smollm2-heads.pt")


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """A checkpoint of a tiny character GPT, trained in seconds by train_heads.py's command line."""
    from training.cli import train_main
    path = str(tmp_path_factory.mktemp("ck") / "tiny.pt")
    train_main(["--steps", "40", "--rescorer-steps", "20", "--n-layer", "1", "--n-embd", "32",
          "--n-head", "2", "--block-size", "32", "--batch-size", "8", "--rescorer-embd", "16",
          "--rescorer-layers", "1", "--out", path])
    return path


def real_model_or_skip():
    """The GGUF's path, or a clean skip naming the install command (SmolLM2 is optional)."""
    from models import smollm_gguf
    try:
        smollm_gguf.optional_packages()
        return smollm_gguf.find_gguf()
    except ImportError:
        pytest.skip(f"SmolLM2 not installed: {smollm_gguf.INSTALL}")


def heads_or_skip():
    """The shipped SmolLM2 heads checkpoint's path, or a clean skip."""
    real_model_or_skip()
    if not os.path.isfile(SMOLLM_HEADS):
        pytest.skip(f"{SMOLLM_HEADS} missing: train it with `python train_heads.py --smollm`")
    return SMOLLM_HEADS
