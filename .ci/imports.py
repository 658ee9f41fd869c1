"""Print the import graph of the top-level modules (every import, lazy ones included), their
layers, and any circle. `python .ci/imports.py` exits 1 if a module imports one at or above it,
except the allowed hand-off in minibpd.py's `if __name__ == "__main__":` block."""
import ast
import os
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main_block(node):
    """True for the `if __name__ == "__main__":` statement."""
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def imports(path, modules):
    """-> {module: 'top' | 'lazy' | 'main'}: the project modules `path` imports, and where."""
    tree, found = ast.parse(open(path, encoding="utf-8").read()), {}

    def visit(node, where):
        for child in ast.iter_child_nodes(node):
            here = "main" if main_block(child) else where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                here = "lazy" if here == "top" else here
            if isinstance(child, ast.Import):
                names = [a.name.split(".")[0] for a in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                names = [child.module.split(".")[0]]
            else:
                names = []
            for name in names:
                if name in modules and name != os.path.basename(path)[:-3]:
                    found.setdefault(name, here)
            visit(child, here)
    visit(tree, "top")
    return found


def cycles(graph):
    """Every module that lies on a circle of the graph."""
    on = set()
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, {}):
                if nxt == start:
                    on.update(path)
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    return on


def main():
    files = sorted(f for f in os.listdir(HERE) if f.endswith(".py") and not f.startswith("test_")
                   and f not in ("conftest.py", "setup.py"))
    modules = {f[:-3] for f in files}
    graph = {m: imports(os.path.join(HERE, m + ".py"), modules) for m in sorted(modules)}
    plain = {m: {d: w for d, w in deps.items() if w != "main"} for m, deps in graph.items()}
    bad = cycles(plain)
    depth = {}

    def level(m, trail=()):
        if m in trail:
            return 0
        if m not in depth:
            depth[m] = 1 + max((level(d, trail + (m,)) for d in plain[m]), default=-1)
        return depth[m]
    for m in modules:
        level(m)
    for m in sorted(modules, key=lambda m: (depth[m], m)):
        deps = ", ".join(f"{d}{'' if w == 'top' else f' ({w})'}" for d, w in sorted(graph[m].items()))
        print(f"  layer {depth[m]}  {m:12s} <- {deps or '(no project imports)'}")
    lines = sum(len(open(os.path.join(HERE, f), encoding="utf-8").read().splitlines()) for f in files)
    print(f"{len(modules)} modules, {lines:,} lines; "
          + (f"CIRCLE through: {', '.join(sorted(bad))}" if bad else "no import circles"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
