"""The paper stands alone: importing its files, or collecting its tests, loads no folder module,
and a copy holding only the top-level files and checkpoints/ runs the demo, its tests and
training (.ci/run runs the same copy end to end; this is the fast half)."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ("decoders", "lab", "models", "runtime", "training", "tools", "tests")
PAPER = ["minibpd.py", "lattice.py", "ngram.py", "train_heads.py", "test_minibpd.py", "conftest.py"]
LOADED = f"import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in {FOLDERS!r}))"


def run(code, cwd=ROOT):
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_importing_the_paper_loads_no_folder_module():
    r = run("import minibpd, lattice, ngram, train_heads; " + LOADED)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_collecting_the_papers_tests_loads_no_folder_module():
    r = run("import pytest; pytest.main(['-q', '--collect-only', '-p', 'no:cacheprovider', "
            "'test_minibpd.py']); " + LOADED)
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout[-2000:]


@pytest.fixture
def alone(tmp_path):
    """The top-level .py files and checkpoints/ alone, in a folder of their own."""
    for f in os.listdir(ROOT):
        if f.endswith(".py"):
            shutil.copy(os.path.join(ROOT, f), tmp_path)
    shutil.copytree(os.path.join(ROOT, "checkpoints"), tmp_path / "checkpoints")
    return tmp_path


def script(alone, *argv):
    """Run a paper file in `alone` as `python FILE ARGV...`. An editable install puts the
    repository on sys.path (a .pth file): that entry is dropped, so no folder can be found."""
    code = (f"import sys; sys.path[:] = [p for p in sys.path if os.path.realpath(p or '.') != "
            f"{os.path.realpath(ROOT)!r}]; sys.argv = {list(argv)!r}; import runpy; "
            f"runpy.run_path({argv[0]!r}, run_name='__main__')")
    return subprocess.run([sys.executable, "-c", "import os; " + code], cwd=alone,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": ""})


def test_the_paper_files_alone_train_and_hand_off_clearly(alone):
    r = script(alone, "train_heads.py", "--steps", "2", "--n-layer", "1", "--n-embd", "8",
               "--n-head", "2", "--heads", "2", "--block-size", "8", "--out", "t.pt",
               "--threads", "1")
    assert r.returncode == 0 and "saved t.pt" in r.stdout, r.stderr[-2000:]
    r = script(alone, "train_heads.py", "--smollm")
    assert r.returncode == 1 and "the lab's" in r.stderr and "Traceback" not in r.stderr
    r = script(alone, "minibpd.py", "--bench")
    assert r.returncode == 1 and "the lab's" in r.stderr and "Traceback" not in r.stderr
    r = script(alone, "minibpd.py", "--help")          # what the paper files alone run: exit 0
    assert r.returncode == 0 and "usage: python minibpd.py --demo" in r.stdout, r.stderr[-2000:]


def test_the_paper_files_alone_run_the_demo(alone):
    r = script(alone, "minibpd.py", "--demo", "--max-new-tokens", "24")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "identical" in r.stdout and "block efficiency" in r.stdout.lower()
