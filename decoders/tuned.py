"""Each decoder's settings: its defaults, updated by the tuned file `--tune` writes (read and
checked here like command-line input) and then by the command line."""
import json
import math
import sys

from decoders.registry import DECODERS, check
from runtime.checkpoint import file_sha256


def settings(tuned=None, overrides=None):
    """{name: settings}: each decoder's defaults, updated by the tuned file's settings (`tuned`,
    from load_tuned) and then by `overrides` ({'k': 3, ...}; a decoder takes only the keys it has)."""
    out = {}
    for name in DECODERS:
        s = dict(DECODERS[name].defaults)
        s.update((tuned or {}).get(name, {}))
        s.update({k: v for k, v in (overrides or {}).items() if k in s and v is not None})
        out[name] = s
    return out


def tuned_path(checkpoint):
    return checkpoint + ".tuned.json"


def load_tuned(path, checkpoint, heads=None, all_heads=None, required=False):
    """The settings in a tuned file, validated like command-line input. A missing file means
    none (an error when `required`: a file the user named); a file tuned for another checkpoint
    (its checkpoint_sha256) or with other heads than this run's (its `heads`; without one: the
    checkpoint's `all_heads`) is ignored, with a warning."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        if required:
            raise ValueError(f"tuned file {path} not found (run `python minibpd.py --tune --tuned "
                             f"{path}` to write it)") from None
        return {}
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:   # nested too deep
        raise ValueError(f"tuned file {path} is not valid JSON ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:200]}); fix it, delete it, or run "
                         "`python minibpd.py --tune`") from None
    settings = check_tuned(path, data)
    ignore = lambda why: print(f"warning: ignoring {path}: {why}; using the defaults", file=sys.stderr)
    if data.get("checkpoint_sha256") != file_sha256(checkpoint):
        return ignore("it was tuned for another checkpoint (checkpoint_sha256 differs)") or {}
    tuned_heads = data.get("heads", all_heads)
    if heads is not None and tuned_heads is not None and tuned_heads != heads:
        return ignore(f"it was tuned with {tuned_heads} heads, this run uses {heads} (settings for "
                      f"{heads}: `python minibpd.py --tune --heads {heads} --tuned FILE`, then "
                      "--tuned FILE)") or {}
    return settings


def tuned_be_by_heads(path, checkpoint):
    """The tuned file's plain-BPD block efficiency by heads used, {k: be} for k = 1..h (`--tune`
    writes it: lab.analysis.be_by_heads on the tune split, machine-independent), or {} where the
    file is missing, of another checkpoint, or holds no such entry."""
    try:                            # unreadable, not JSON, not an object, or no {heads: be}: none
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if data.get("checkpoint_sha256") != file_sha256(checkpoint):
            return {}
        out = {int(k): float(v) for k, v in data.get("block_efficiency_by_heads").items()}
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, AttributeError, TypeError):
        return {}
    return out if all(v > 0 and math.isfinite(v) for v in out.values()) else {}


def check_tuned(path, data):
    """A tuned file's structure and settings, checked like command-line input. -> the settings of
    this run's decoders (another's, a plug-in's tuned with --plugin, are skipped with a warning
    naming the plug-ins the file records; so are those of a decoder a plug-in re-registered
    that do not fit it: the file was tuned for the one it replaced, and is not at fault)."""
    bad = lambda what: ValueError(f"tuned file {path}: {what}; fix it, delete it, or run "
                                  "`python minibpd.py --tune`")
    if not isinstance(data, dict) or not isinstance(data.get("settings"), dict):
        raise bad("'settings' must be an object {decoder: {setting: value}}")
    if "heads" in data and (not isinstance(data["heads"], int) or isinstance(data["heads"], bool)):
        raise bad("'heads' must be an integer")
    plugins = data.get("plugins", [])
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        raise bad("'plugins' must be a list of module names")
    warn = lambda what: print(f"warning: tuned file {path}: {what}; its settings are skipped",
                              file=sys.stderr)
    kept = {}
    for name, s in data["settings"].items():
        if name not in DECODERS:        # a plug-in's decoder, tuned with --plugin: skipped
            shown = " ".join(f"--plugin {p}" for p in plugins) or "--plugin"
            warn(f"settings.{name} is not a decoder of this run (was it tuned with {shown}?)")
            continue
        problem = tuned_problem(name, s)
        if problem and DECODERS[name].replaced:
            warn(f"{problem}, but they were tuned for the decoder a plug-in re-registered as "
                 f"{name!r}")
            continue
        if problem:
            raise bad(problem)
        kept[name] = s
    return kept


def tuned_problem(name, s):
    """'' if a tuned file's settings `s` fit decoder `name`, else why not."""
    keys = sorted(DECODERS[name].defaults)
    if not isinstance(s, dict) or not set(s) <= set(keys):
        return f"settings.{name} must be an object with keys from {keys or 'none'}"
    try:
        check(name, {**DECODERS[name].defaults, **s})
    except ValueError as e:
        return f"settings.{name}: {str(e).split(': ', 1)[-1]}"
    return ""
