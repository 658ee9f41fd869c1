"""The layout check: the import graph of the project's modules (every import, lazy ones
included), their layers, and what a reader's limits forbid. `python .ci/imports.py` prints the
graph and exits 1 on any of:
  - an import circle (the one exception: minibpd.py's `if __name__ == "__main__":` hand-off);
  - a module over 600 lines, or a function over 50 (docstring included);
  - a re-exported name: a module that imports a project name it neither uses nor defines (so that
    callers would import it from there: one name, one address);
  - a top level holding anything but the paper's files, packaging/CI files and the folders.
Tests and the measuring scripts in tools/ are not modules of the library: they are left out.
"""
import ast
import os
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("runtime", "decoders", "models", "lab", "training")
TOP = {"minibpd.py", "lattice.py", "ngram.py", "train_heads.py", "test_minibpd.py", "README.md",
       "conftest.py", "pyproject.toml", "requirements.txt", ".gitignore", ".ci", ".git",
       "checkpoints", "docs", "tests", "tools", *PACKAGES}
MAX_LINES, MAX_FUNCTION = 600, 50


def modules():
    """{dotted module name: path} of the library: the top-level modules and the packages."""
    found = {f[:-3]: os.path.join(HERE, f) for f in os.listdir(HERE)
             if f.endswith(".py") and not f.startswith("test_") and f != "conftest.py"}
    for pkg in PACKAGES:
        for f in os.listdir(os.path.join(HERE, pkg)):
            if f.endswith(".py"):
                name = pkg if f == "__init__.py" else f"{pkg}.{f[:-3]}"
                found[name] = os.path.join(HERE, pkg, f)
    return found


def main_block(node):
    """True for the `if __name__ == "__main__":` statement."""
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def imports(tree, this, names):
    """-> {module: 'top' | 'lazy' | 'main'}: the project modules a module imports, and where."""
    found = {}

    def add(name, where):
        while name and name not in names:
            name = name.rpartition(".")[0]
        if name and name != this:
            found.setdefault(name, where)

    def visit(node, where):
        for child in ast.iter_child_nodes(node):
            here = "main" if main_block(child) else where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                here = "lazy" if here == "top" else here
            if isinstance(child, ast.Import):
                for a in child.names:
                    add(a.name, here)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                for a in child.names:
                    add(f"{child.module}.{a.name}" if f"{child.module}.{a.name}" in names
                        else child.module, here)
            visit(child, here)
    visit(tree, "top")
    return found


def reexports(tree, names):
    """Project names imported at the top of a module and never used in it: re-exports."""
    imported = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] in {n.split(".")[0] for n in names}:
            for a in node.names:
                imported[a.asname or a.name] = f"{node.module}.{a.name}"
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    used |= {n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute)
             and isinstance(n.value, ast.Name)}
    return sorted(full for alias, full in imported.items() if alias not in used)


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


def layers(graph):
    depth = {}

    def level(m, trail=()):
        if m in trail:
            return 0
        if m not in depth:
            depth[m] = 1 + max((level(d, trail + (m,)) for d in graph[m]), default=-1)
        return depth[m]
    for m in graph:
        level(m)
    return depth


def main():
    names = modules()
    trees = {m: ast.parse(open(p, encoding="utf-8").read()) for m, p in names.items()}
    graph = {m: imports(t, m, names) for m, t in trees.items()}
    plain = {m: {d: w for d, w in deps.items() if w != "main"} for m, deps in graph.items()}
    problems = [f"import circle through {', '.join(sorted(cycles(plain)))}"] if cycles(plain) else []
    depth = layers(plain)
    for m in sorted(names, key=lambda m: (depth[m], m)):
        deps = ", ".join(f"{d}{'' if w == 'top' else f' ({w})'}" for d, w in sorted(graph[m].items()))
        print(f"  layer {depth[m]}  {m:22s} <- {deps or '(no project imports)'}")
    for m, path in sorted(names.items()):
        rel = os.path.relpath(path, HERE)
        n = len(open(path, encoding="utf-8").read().splitlines())
        problems += [f"{rel}: {n} lines (at most {MAX_LINES})"] * (n > MAX_LINES)
        problems += [f"{rel}:{f.lineno} {f.name}() is {f.end_lineno - f.lineno + 1} lines (at most "
                     f"{MAX_FUNCTION})" for f in ast.walk(trees[m])
                     if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and f.end_lineno - f.lineno + 1 > MAX_FUNCTION]
        problems += [f"{rel}: re-exports {r}" for r in reexports(trees[m], names)]
    extra = sorted(set(os.listdir(HERE)) - TOP - {".venv-ci", ".hypothesis", ".pytest_cache"}
                   - {f for f in os.listdir(HERE) if f.endswith(".egg-info") or f.startswith(".venv")
                      or f == "__pycache__"})
    problems += [f"top level: {', '.join(extra)} is neither the paper, packaging nor a folder"] * bool(extra)
    lines = sum(len(open(p, encoding="utf-8").read().splitlines()) for p in names.values())
    print(f"{len(names)} modules, {lines:,} lines; " + ("; ".join(problems) if problems else
          "no import circles, no module over 600 lines, no function over 50, no re-exports"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
