"""The install a student makes (README, Quickstart): `pip install -e .` then `import minibpd` from
any folder, next to a clone named minibpd/ too, and the README's own code runs as printed."""
import importlib.metadata
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def installed_or_skip():
    try:
        importlib.metadata.distribution("minibpd")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("minibpd is not installed: pip install -e . (README, Quickstart)")


def run(code, cwd, timeout=300):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}   # the install alone
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_a_folder_named_minibpd_does_not_shadow_the_module(tmp_path):
    """With the repository cloned under its default name, a script in the
    folder above found the folder minibpd/ as a namespace package before the editable install's
    import hook ran ("cannot import name 'bpd_decode' from 'minibpd' (unknown location)"). The
    install is now a path entry (hatchling's dev-mode-dirs), which a regular module wins over."""
    installed_or_skip()
    (tmp_path / "minibpd").mkdir()                  # a clone under its default name
    (tmp_path / "minibpd" / "README.md").write_text("a clone\n")
    r = run("from minibpd import bpd_decode, load_checkpoint; import lattice, decoders\n"
            "model, ck = load_checkpoint(); print(bpd_decode.__module__)", tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "minibpd", r.stderr[-2000:]


def readme_code():
    """The README's Python code block that decodes (the one a student copies first)."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    return next(b for b in blocks if "bpd_decode(" in b)


def test_the_readme_code_runs_as_printed(tmp_path):
    """The README's "In your own code" block, run from another folder as a student would."""
    installed_or_skip()
    r = run(readme_code(), tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
