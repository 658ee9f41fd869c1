"""plugins: `--plugin MODULE`, a student's module imported before the flags are parsed, so that
its decoders.register(...) calls add decoders to every command, --help and --decoder included.
A module name that is taken, or nowhere, is one clear error.
"""
import argparse
import importlib
import importlib.util
import os
import sys

PLUGINS = set()       # the module names import_plugin imported (a plug-in may be imported again)


def import_plugin(spec):
    """Import a student's module by name (looked up in the current directory first, then as any
    importable module) or by file path (`my_drafter.py`, `path/to/mine.py`).
    A name taken by a module imported before (the project's `ngram`, `lattice`, Python's
    `json`, ...) is refused, naming it: importing would hand back that module, not run yours."""
    path = spec.endswith(".py") or os.sep in spec
    name = os.path.splitext(os.path.basename(spec))[0] if path else spec
    if not path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())             # a student's module next to where they run
    taken = sys.modules.get(name)
    if taken is not None and name not in PLUGINS:
        yours = os.path.abspath(spec) if path else own_file(spec)
        theirs = getattr(taken, "__file__", None)
        raise ImportError(f"the module name {name!r} is taken: {theirs or 'a built-in module'} "
                          f"is already imported, so {yours or 'your module'} would not run; "
                          f"rename yours (e.g. my_{name.split('.')[-1]}.py)")
    if not path:
        try:
            importlib.import_module(spec)
        except ModuleNotFoundError as e:     # a module that is nowhere: where we looked, and paths
            if e.name != spec.split(".")[0] and e.name != spec:
                raise                                # the plug-in itself imports something missing
            raise ImportError(f"no module {spec!r} in the current directory ({os.getcwd()}) nor "
                              f"on Python's path; put {spec.split('.')[0]}.py in the folder you "
                              "run from, or give its path, e.g. "
                              f"path/to/{spec.split('.')[-1]}.py") from None
        PLUGINS.add(name)
        return
    where = importlib.util.spec_from_file_location(name, os.path.abspath(spec))
    if where is None or not os.path.isfile(spec):
        raise ImportError(f"no such file: {spec}")
    module = importlib.util.module_from_spec(where)
    sys.modules[name] = module
    PLUGINS.add(name)
    where.loader.exec_module(module)


def own_file(spec):
    """The file `import spec` finds in the current directory (a module or a package), or None."""
    base = os.path.join(os.getcwd(), *spec.split("."))
    return next((f for f in (base + ".py", os.path.join(base, "__init__.py")) if os.path.isfile(f)),
                None)


def load_plugins(argv):
    """Import each `--plugin MODULE` first: its decoders.register(...) calls then add decoders
    to every command, --help and --decoder included. Any failure: one line naming the module."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)   # --p is not --plugin
    pre.add_argument("--plugin", action="append", default=[])
    for spec in pre.parse_known_args(argv)[0].plugin:
        try:
            import_plugin(spec)
        except (Exception, SystemExit) as e:  # ImportError, SyntaxError, register(), sys.exit()
            print(f"error: --plugin {spec}: {type(e).__name__}: {' '.join(str(e).split())}",
                  file=sys.stderr)
            raise SystemExit(2) from None
