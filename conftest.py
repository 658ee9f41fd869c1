"""Shared test fixtures."""
import pytest

import train_heads


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ck") / "tiny.pt")
    train_heads.main(["--steps", "40", "--rescorer-steps", "20", "--n-layer", "1", "--n-embd",
                      "32", "--n-head", "2", "--block-size", "32", "--batch-size", "8",
                      "--rescorer-embd", "16", "--rescorer-layers", "1", "--out", path])
    return path
