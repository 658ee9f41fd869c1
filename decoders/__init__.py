"""decoders: the one table of decoders, their settings, and the methods every command runs.

Each entry names a drafter factory, its settings with their defaults, and the grid `--tune`
searches. The demo, `--prompt`, the bench, `--tune`, the cost table, the sweeps and the tests all
iterate DECODERS, so a new decoder is one drafter class plus one `register(...)` call:

    import decoders
    decoders.register("mine", lambda res, s, answer: MyDrafter(s["k"]), defaults={"k": 4},
                      grid={"k": [2, 4, 8]}, about="my drafter")

A factory gets `res` (a Resources: the base model, the small rescorer LM, n-gram LMs, and
`res.reference`: build the readable version), the settings `s` (the defaults, updated by the
tuned file and the command line) and `answer` (prompt + greedy continuation; only the oracle,
which peeks at it, reads it).

Its modules and the fast twins of lattice.py's drafters: docs/layout.md, "The folders". This file
is the package's API: the names below, each imported from the module that defines it.
"""
from decoders.registry import (BASELINES, DECODERS, PLAIN, SPEED_SETTINGS, active, baseline_name,
                               check, label_width, make, names, parse_selection, refined,
                               register, select)
from decoders.tuned import check_tuned, load_tuned, settings, tuned_be_by_heads, tuned_path
from decoders.fastest import fastest_view, speed_heads
from decoders.method import Method, method
from decoders.resources import Resources, split_text
from decoders.sampled import HeadSampler

__all__ = ["BASELINES", "DECODERS", "PLAIN", "SPEED_SETTINGS", "active", "baseline_name", "check",
           "label_width", "make", "names", "parse_selection", "refined", "register", "select",
           "check_tuned", "load_tuned", "settings", "tuned_be_by_heads", "tuned_path",
           "fastest_view", "speed_heads", "Method", "method", "Resources", "split_text",
           "HeadSampler"]
