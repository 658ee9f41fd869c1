"""stdlib: the running Python's standard library as material for the tasks (tasks.py) and for
SmolLM2's training text (training/smollm_heads.py): every module-level function and method that
parses, with its source, sorted by a stable key (module.qualname)."""
import ast
import collections
import functools
import os
import sysconfig
import textwrap

SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "lib-dynload",
             "idlelib", "tkinter", "turtledemo", "lib2to3",    # applications, demos, 2to3
             "encodings",                                      # generated codec tables
             "pydoc_data"}                                     # data: used by `lm` only


def stdlib_files():
    """Sorted (module, path) of the running Python's stdlib .py files, test suites and the
    directories above skipped."""
    root, found = sysconfig.get_paths()["stdlib"], []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("config-"))
        for f in sorted(files):
            if f.endswith(".py") and not f.startswith(("test_", "_sysconfigdata")):
                rel = os.path.relpath(os.path.join(folder, f), root)[:-3].split(os.sep)
                module = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
                found.append((module, os.path.join(folder, f)))
    return sorted(found)


Func = collections.namedtuple("Func", "key module qualname node lines")


@functools.lru_cache(maxsize=1)
def functions():
    """Every module-level function and method (nested functions are part of their parent's text,
    not examples) of every stdlib file that parses: Func tuples sorted by key (module.qualname).
    Only the first of a repeated qualified name (property setters, platform variants) and of a
    repeated source text (3% of them, e.g. 15 identical `__iter__`s) is kept, so that one text
    cannot be in two splits."""
    found = {}
    for module, path in stdlib_files():
        try:
            # readlines splits at "\n" only, as ast numbers lines; str.splitlines also at \f
            with open(path, encoding="utf-8") as f:
                lines = f.readlines()
            tree = ast.parse("".join(lines))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue                                # a file that does not parse is skipped
        for qualname, node in walk_defs(tree.body, ""):
            found.setdefault(f"{module}.{qualname}", Func(f"{module}.{qualname}", module,
                                                          qualname, node, lines))
    kept = {}                                       # {dedented source: its first Func}
    for key in sorted(found):
        kept.setdefault(textwrap.dedent("".join(source_lines(found[key]))), found[key])
    return list(kept.values())


def walk_defs(body, prefix):
    """(qualified name, node) of the functions in `body` and in its classes, in source order."""
    for node in body:
        if isinstance(node, ast.ClassDef):
            yield from walk_defs(node.body, f"{prefix}{node.name}.")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node


def first_line(fn):
    """Line number of the function's first decorator, or of its def line."""
    return min([fn.node.lineno] + [d.lineno for d in fn.node.decorator_list])


def source_lines(fn):
    """The function's source lines, from its first decorator to its last line (keepends)."""
    return fn.lines[first_line(fn) - 1:fn.node.end_lineno]


def signature(fn, limit=48):
    """`qualname(args)`; arguments longer than `limit` characters are shown as `...`."""
    args = ast.unparse(fn.node.args)
    return f"{fn.qualname}({args if len(args) <= limit else '...'})"
