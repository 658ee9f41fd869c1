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

The modules, each importing only those below it:
  registry.py   DECODERS, register, check, make, active/select: the table and the built-ins
  tuned.py      settings(): defaults, the tuned file (read and checked), the command line
  fastest.py    fastest_view: the heads whose BPD is fastest on this machine
  method.py     Method: the baseline or a decoder's drafter, what the bench times and checks
  resources.py  Resources: the model, the small LM, the n-gram LMs, shared under one lock
  sampled.py    HeadSampler, the drafter of 'sampled'
The drafters come from lattice.py (readable, `--reference`) and their fast twins: fastlattice.py
(p-best), viterbi.py (p = 1), neural.py (the cached small LM), and lookup.py (prompt lookup, in
neither paper); budgets.py checks settings and budgets.

This file is the package's API: the names below, each imported from the module that defines it.
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
