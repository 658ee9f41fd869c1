"""The layout check: the paper at the top, the lab in folders built on it. `python .ci/imports.py`
prints the import graph (every import, lazy ones included) and exits 1 on any of:
  - the paper layer: a top-level file (PAPER, and conftest.py) importing, at any level, anything
    but the standard library, torch, numpy, the test tools (pytest, hypothesis) and each other;
    the one exception is a command-line hand-off inside `if __name__ == "__main__":`; a paper
    file over its size (PAPER); more than MAX_NAMES names bound in minibpd.py before `bpd_decode`;
  - an import circle, imports inside functions counted (only the `__main__` hand-offs are not);
  - a module over MAX_LINES lines (but for OVER, each held to its size today until it is split),
    or a function over 50 (docstring included);
  - a re-exported name: a module that imports a project name it neither uses nor defines (so that
    callers would import it from there: one name, one address);
  - a top level holding anything but the paper's files, packaging/CI files and the folders.
Tests and the measuring scripts in tools/ are not modules of the library: they are left out, but
for the paper's test files.
"""
import ast
import os
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("runtime", "decoders", "models", "lab", "training")
# minibpd.py's budget is 450; it holds 473: the request, drafter, checkpoint, dtype and device
# checks that give bad input one clear error. To trim, never by dropping a check.
# test_minibpd.py is a test file (the 450 is for modules outside the tests): every property of
# the papers, the DP, the local rescoring and the heads' training targets included, in 509 lines.
PAPER = {"minibpd.py": 473, "lattice.py": 450, "ngram.py": 450, "train_heads.py": 450,
         "test_minibpd.py": 509}
# Modules allowed over MAX_LINES for now, each capped at its size (they may only shrink): none.
OVER = {}
TOP = {*PAPER, "README.md", "conftest.py", "pyproject.toml", "requirements.txt", ".gitignore",
       ".ci", ".git", "checkpoints", "docs", "tests", "tools", *PACKAGES}
MAX_LINES, MAX_FUNCTION, MAX_NAMES = 450, 50, 30
THIRD_PARTY = {"torch", "numpy", "pytest", "hypothesis"}
STDLIB = set(getattr(sys, "stdlib_module_names", ())) | {"__future__"}


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


def import_nodes(tree):
    """-> [(node, where)]: every import statement, where = 'top' | 'lazy' | 'main'."""
    found = []

    def visit(node, where):
        for child in ast.iter_child_nodes(node):
            here = "main" if main_block(child) else where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                here = "lazy" if here == "top" else here
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, here))
            visit(child, here)
    visit(tree, "top")
    return found


def imported(node):
    """The dotted names an import statement names (absolute imports only)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level or not node.module:
        return []
    return [node.module] + [f"{node.module}.{a.name}" for a in node.names]


def imports(tree, this, names):
    """-> {module: 'top' | 'lazy' | 'main'}: the project modules a module imports, and where."""
    found = {}
    for node, where in import_nodes(tree):
        for name in imported(node):
            while name and name not in names:
                name = name.rpartition(".")[0]
            if name and name != this:
                found.setdefault(name, where)
    return found


def declared_all(tree):
    """The names a module's top-level `__all__ = [...]` lists."""
    return {e.value for node in tree.body if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
            for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)}


def reexports(tree, names, package=False):
    """Project names imported at the top of a module and never used in it: re-exports. A
    package's __init__ may import the names its `__all__` lists: that is the package's API."""
    imported_names = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] in {n.split(".")[0] for n in names}:
            for a in node.names:
                imported_names[a.asname or a.name] = f"{node.module}.{a.name}"
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    used |= {n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute)
             and isinstance(n.value, ast.Name)}
    used |= declared_all(tree) if package else set()
    return sorted(full for alias, full in imported_names.items() if alias not in used)


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


# ----------------------------------------------------------------------------- the paper layer

def names_before(tree, function):
    """Names a module binds at its top level (imports, classes, functions, assignments) before
    `def function`."""
    bound = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == function:
            return bound
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound += [(a.asname or a.name).split(".")[0] for a in node.names]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound += [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    raise ValueError(f"no {function} at the top level")


def paper_problems():
    """The paper layer's rules (module docstring). -> (problems, hand-off lines)."""
    files = [*PAPER, "conftest.py"]
    paper = {f[:-3] for f in files}
    problems, handoffs = [], []
    for f in files:
        source = open(os.path.join(HERE, f), encoding="utf-8").read()
        tree = ast.parse(source)
        n = len(source.splitlines())
        if f in PAPER and n > PAPER[f]:
            problems.append(f"{f}: {n} lines (the paper layer allows {PAPER[f]})")
        for node, where in import_nodes(tree):
            for name in imported(node)[:1]:
                root = name.split(".")[0]
                if root in STDLIB or root in THIRD_PARTY or root in paper or where == "main":
                    continue
                if where == "top":
                    problems.append(f"{f}:{node.lineno} imports {name} at module level (the "
                                    "paper imports only the standard library, torch, numpy and "
                                    "each other)")
                else:
                    problems.append(f"{f}:{node.lineno} imports {name} in a function (the paper "
                                    "reaches the folders only in its `__main__` hand-off)")
            if where == "main" and imported(node)[:1] and imported(node)[0].split(".")[0] not in \
                    STDLIB | THIRD_PARTY | paper:
                handoffs.append(f"{f}:{node.lineno} {imported(node)[0]}")
    before = names_before(ast.parse(open(os.path.join(HERE, "minibpd.py")).read()), "bpd_decode")
    if len(before) > MAX_NAMES:
        problems.append(f"minibpd.py: {len(before)} names before bpd_decode (at most "
                        f"{MAX_NAMES}): {', '.join(before)}")
    return problems, handoffs, before


def main():
    names = modules()
    trees = {m: ast.parse(open(p, encoding="utf-8").read()) for m, p in names.items()}
    graph = {m: imports(t, m, names) for m, t in trees.items()}
    # the paper's `__main__` hand-offs to a command line are the one way back up
    plain = {m: {d: w for d, w in deps.items() if w != "main"} for m, deps in graph.items()}
    problems = [f"import circle through {', '.join(sorted(cycles(plain)))}"] if cycles(plain) else []
    depth = layers(plain)
    for m in sorted(names, key=lambda m: (depth[m], m)):
        deps = ", ".join(f"{d}{'' if w == 'top' else f' ({w})'}" for d, w in sorted(graph[m].items()))
        print(f"  layer {depth[m]}  {m:22s} <- {deps or '(no project imports)'}")
    for m, path in sorted(names.items()):
        rel = os.path.relpath(path, HERE)
        n = len(open(path, encoding="utf-8").read().splitlines())
        most = OVER.get(rel, PAPER.get(rel, MAX_LINES))
        problems += [f"{rel}: {n} lines (at most {most})"] * (n > most)
        problems += [f"{rel}:{f.lineno} {f.name}() is {f.end_lineno - f.lineno + 1} lines (at most "
                     f"{MAX_FUNCTION})" for f in ast.walk(trees[m])
                     if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and f.end_lineno - f.lineno + 1 > MAX_FUNCTION]
        problems += [f"{rel}: re-exports {r}" for r in reexports(trees[m], names, rel.endswith("__init__.py"))]
    extra = sorted(set(os.listdir(HERE)) - TOP - {".venv-ci", ".hypothesis", ".pytest_cache", ".benchmarks"}
                   - {f for f in os.listdir(HERE) if f.endswith(".egg-info") or f.startswith(".venv")
                      or f == "__pycache__"})
    problems += [f"top level: {', '.join(extra)} is neither the paper, packaging nor a folder"] * bool(extra)
    paper_bad, handoffs, before = paper_problems()
    problems += paper_bad
    lines = sum(len(open(p, encoding="utf-8").read().splitlines()) for p in names.values())
    print(f"the paper layer: {', '.join(f'{f} {len(open(os.path.join(HERE, f)).read().splitlines())}' for f in PAPER)} lines; "
          f"{len(before)} names before bpd_decode; hand-offs to the folders: {', '.join(handoffs)}")
    print(f"{len(names)} modules, {lines:,} lines; " + ("; ".join(problems) if problems else
          f"no import circles, no module over {MAX_LINES} lines, "
          "no function over 50, no re-exports, "
          "the paper layer within its rules"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
