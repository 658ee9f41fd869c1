"""tasks_more: the examples of the tasks added for the real model, doc2code and rename
(tasks.TASKS says what each is), one function at a time, and their pools (doc2code_pool,
rename_pool: keyed, deduplicated and cached, as task_pools.py's).
"""
import ast
import builtins
import functools
import io
import keyword
import textwrap
import tokenize

from lab.stdlib import first_line, functions, source_lines
from lab.task_text import PROMPT_MAX, TARGET_MAX, WINDOW, dedupe, rng

DOC2CODE_LINES = (2, 12)        # non-blank lines of the body after the docstring
RENAME_CUE = "# Rename the variable {old} to {new}:\n"
NEW_NAMES = ("value", "item", "result", "count", "total", "data", "node", "key", "text", "entry",
             "target", "source", "index", "size", "obj", "parts", "name", "buffer", "current")
KEEP = {"self", "cls"}          # never renamed: a convention, not a choice


def nested(node):
    """True when a function holds a def or class inside it (its text is then not one unit)."""
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
               for n in ast.walk(node) if n is not node)


def docstring_end(node):
    """The last line of a function's docstring when a statement follows it on a later line; else
    None (no docstring, nothing after it, or `\"\"\"doc\"\"\"; x = 1`)."""
    body = node.body
    if ast.get_docstring(node, clean=False) is None or len(body) < 2:
        return None
    return body[0].end_lineno if body[1].lineno > body[0].end_lineno else None


# ----------------------------------------------------------------------------- doc2code

def doc2code_example(fn):
    """(prompt, target): the dedented source up to its docstring's last line (decorators and the
    def line first; blank lines after the docstring too), and the rest of the function without
    its final newline; None for a function with nested definitions, with a body of other than
    DOC2CODE_LINES non-blank lines, or not fitting the limits (nothing is cut)."""
    end = docstring_end(fn.node)
    if end is None or nested(fn.node):
        return None
    lines = io.StringIO(textwrap.dedent("".join(source_lines(fn)))).readlines()   # at "\n" only
    k = end - first_line(fn) + 1
    while k < len(lines) and not lines[k].strip():
        k += 1                              # blank lines after the docstring: in the prompt
    prompt, target = "".join(lines[:k]), "".join(lines[k:]).rstrip("\n")
    body = [line for line in lines[k:] if line.strip()]
    lo, hi = DOC2CODE_LINES
    if not lo <= len(body) <= hi or len(target) > TARGET_MAX:
        return None
    return (prompt, target) if len(prompt) <= min(PROMPT_MAX, WINDOW - len(target)) else None


@functools.lru_cache(maxsize=1)
def doc2code_pool():
    pool = [(fn.key, *ex) for fn in functions() if (ex := doc2code_example(fn))]
    return dedupe(pool)


# ----------------------------------------------------------------------------- rename

def name_tokens(code):
    """[(row, col, name)] of the NAME tokens of `code` that are identifiers a rename may touch:
    not an attribute (after `.`) and not a keyword."""
    found, previous = [], None
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.type == tokenize.NAME and not keyword.iskeyword(tok.string) \
                and previous != ".":
            found.append((*tok.start, tok.string))
        if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
            previous = tok.string
    return found


def local_names(node):
    """The function's arguments and assigned names (ast.Name in a Store context), self and cls
    left out, each used (as an argument or a Name) at least twice: sorted."""
    args = node.args
    params = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs
              + [a for a in (args.vararg, args.kwarg) if a]]
    stored = [n.id for n in ast.walk(node) if isinstance(n, ast.Name)
              and isinstance(n.ctx, ast.Store)]
    uses = [n.id for n in ast.walk(node) if isinstance(n, ast.Name)] + params
    return sorted({x for x in params + stored if x not in KEEP and uses.count(x) >= 2})


def renamed_tree(code, old, new):
    """ast.dump of `code` with every Name and argument `old` named `new`: what a rename means."""
    tree = ast.parse(code)
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and n.id == old:
            n.id = new
        elif isinstance(n, ast.arg) and n.arg == old:
            n.arg = new
    return ast.dump(tree)


def rename(code, old, new):
    """`code` with each identifier token `old` (name_tokens: not attributes, strings or comments)
    replaced by `new`; None unless that is exactly renaming the Name and argument nodes (a keyword
    argument `f(old=...)`, a `global old`, a name in an f-string before Python 3.12 breaks it)."""
    lines = io.StringIO(code).readlines()     # at "\n" only, as tokenize numbers rows
    for row, col, name in reversed(name_tokens(code)):
        if name == old:
            line = lines[row - 1]
            lines[row - 1] = line[:col] + new + line[col + len(old):]
    out = "".join(lines)
    try:
        return out if ast.dump(ast.parse(out)) == renamed_tree(code, old, new) else None
    except SyntaxError:
        return None


def rename_example(fn, r):
    """(prompt, target) for a function of <= TARGET_MAX characters (dedented source): a seeded
    local name OLD and a seeded NEW from NEW_NAMES not already a name of the source; None when
    none fits or the rename does not check (rename)."""
    if nested(fn.node):
        return None
    code = textwrap.dedent("".join(source_lines(fn)))
    names = local_names(fn.node)
    taken = {name for _, _, name in name_tokens(code)} | set(dir(builtins))
    fresh = [n for n in NEW_NAMES if n not in taken]
    if len(code) > TARGET_MAX or not names or not fresh:
        return None
    old, new = r.choice(names), r.choice(fresh)
    target = rename(code, old, new)
    prompt = code + RENAME_CUE.format(old=old, new=new)
    if target is None or len(target) > TARGET_MAX or target == code:
        return None
    fits = len(prompt) <= min(PROMPT_MAX, WINDOW - len(target))
    return (prompt, target.rstrip("\n")) if fits else None


@functools.lru_cache(maxsize=1)
def rename_pool():
    pool = [(fn.key, *ex) for fn in functions() if (ex := rename_example(fn, rng(fn.key)))]
    return dedupe(pool)
