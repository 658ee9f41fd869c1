"""The longest functions of the top-level modules (lines, docstring included), longest first.

    python .ci/longest.py [N]       # default 12
"""
import ast
import os
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def functions(path):
    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.end_lineno - node.lineno + 1, node.name, node.lineno


def main(n=12):
    rows = []
    for f in sorted(os.listdir(HERE)):
        if f.endswith(".py") and not f.startswith(("test_", "conftest")):
            rows += [(size, f"{f}:{line}", name) for size, name, line in functions(os.path.join(HERE, f))]
    for size, where, name in sorted(rows, reverse=True)[:n]:
        print(f"  {size:4d}  {name:28s} {where}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 12)
