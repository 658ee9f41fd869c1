"""The measuring scripts in tools/ are not run by the suite (each takes minutes and prints
timings), so a change in the library can break one unseen. These checks are cheap: every script
compiles, every name it imports from the project (at any level, inside functions too) exists, and
the fastest one runs to the end."""
import ast
import importlib
import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = sorted(f for f in os.listdir(os.path.join(ROOT, "tools")) if f.endswith(".py"))
PROJECT = ("minibpd", "lattice", "ngram", "train_heads", "lab", "runtime", "decoders", "models",
           "training")


def project_imports(path):
    """(module, name) of every `from M import name` of a project module in the file at path."""
    tree = ast.parse(open(path).read(), path)
    return [(node.module, alias.name) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
            and node.module.split(".")[0] in PROJECT for alias in node.names]


@pytest.mark.parametrize("tool", TOOLS)
def test_every_tool_compiles_and_its_project_imports_exist(tool):
    path = os.path.join(ROOT, "tools", tool)
    compile(open(path).read(), path, "exec")
    for module, name in project_imports(path):
        m = importlib.import_module(module)
        assert hasattr(m, name) or importlib.util.find_spec(f"{module}.{name}"), \
            f"tools/{tool} imports {name} from {module}, which has no such name"


def test_the_worked_step_runs():
    """The fastest script (seconds): one refinement step of the shipped model, worked by hand."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "worked_step.py")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "path score" in r.stdout
