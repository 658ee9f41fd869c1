"""flags: the command line's parser, `python minibpd.py --help`: the modes (one of --demo,
--prompt, --bench, --tune, --scale, --tasks), which model, decoder and settings, and how much to
run and what to print. Every value is checked later, before any load (lab/checks.py).
"""
import argparse

from lab import analysis
from lab import approximate
from lab.checks import (DEFAULT_PROMPT_TOKENS, MAX_DEMO_TOKENS, MAX_NEW_TOKENS, MAX_TEXT_BYTES,
                        TASK_EXAMPLES, SUBWORD_TASK_DECODERS, SUBWORD_TASK_EXAMPLES)
from lab import trace
from lab.plugins import load_plugins
import decoders
from decoders.budgets import MAX_DP_CELLS, MAX_ORDER
from runtime.checkpoint import DTYPES
from runtime.loop import VERIFY_MODES


def epilog():
    w = decoders.label_width(decoders.DECODERS)
    listed = "\n".join(f"  {n:{w}s} {d.about}" for n, d in decoders.DECODERS.items())
    return (f"decoders (--decoder; the bench runs them all):\n  {'greedy':{w}s} one token per "
            f"call: the reference (sample at --temperature > 0)\n{listed}\n\nlimits: --max-new-tokens <= "
            f"{MAX_NEW_TOKENS:,}; p-best's DP holds at most min(k, V)^order x p <= "
            f"{MAX_DP_CELLS:,} scores; order <= {MAX_ORDER}; the KV cache (p rows) "
            f"at most 1 GiB; --text at most {MAX_TEXT_BYTES // 2 ** 20} MiB.")


def parse_args(argv=None):
    load_plugins(argv)
    p = argparse.ArgumentParser(description="Exact blockwise parallel decoding with a tiny GPT.",
                                allow_abbrev=False, epilog=epilog(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_modes(p)
    add_model_flags(p)
    add_run_flags(p)
    return p.parse_args(argv)


def add_modes(p):
    """What to do: one of these (none: --demo)."""
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--demo", action="store_true", help="show greedy vs BPD vs refined drafts")
    mode.add_argument("--prompt", help="generate a continuation of this text")
    mode.add_argument("--bench", action="store_true", help="benchmark every decoder")
    mode.add_argument("--tune", action="store_true", help="choose k, p, alpha, order (tune split)")
    mode.add_argument("--scale", action="store_true", help="the scale map: projected tokens/s of "
                      "every decoder for GPTs up to ~150x the shipped size, validated at its size")
    mode.add_argument("--tasks", action="store_true", help="per-task block efficiency and the paper's "
                      "analyses: the character model's five tasks (stored in its checkpoint, default "
                      "checkpoints/minibpd-tasks.pt), or SmolLM2's seven (--checkpoint "
                      "checkpoints/smollm2-heads.pt; built here, tasks.py); --prompts: examples per task")


def add_model_flags(p):
    """Which model, decoder and settings."""
    p.add_argument("--max-new-tokens", type=int, default=None, help=f"--prompt (default "
                   f"{DEFAULT_PROMPT_TOKENS}), --demo (default and at most {MAX_DEMO_TOKENS})")
    p.add_argument("--decoder", default=None, help="decoder for --prompt (default bpd): greedy, "
                   + ", ".join(decoders.DECODERS) + f"; with --demo --trace: the decoder traced "
                   f"(default {trace.DEMO_DECODER})")
    p.add_argument("--plugin", metavar="MODULE", action="append", default=[],
                   help="import MODULE first: its decoders.register(...) calls add decoders")
    p.add_argument("--checkpoint", default=None, help="default: checkpoints/minibpd.pt "
                   "(--tasks: checkpoints/minibpd-tasks.pt)")
    p.add_argument("--tuned", metavar="FILE", help="tuned settings to read (--tune: to write); "
                   "default CHECKPOINT.tuned.json")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default=None, choices=list(DTYPES), help="default: the "
                   "checkpoint's (float32 for the character models); SmolLM2's is chosen for this "
                   "CPU at first load, by measurement (models/machine.py; int4, its 4-bit trunk "
                   "weights, where this torch has the kernel). The "
                   "character GPT takes float32 or float64 (bfloat16 is refused: it is not batch-"
                   "invariant, so BPD would not equal greedy); SmolLM2 (batch-invariant) takes all four")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default 1: fastest "
                   "for this model size, see docs/threads.md)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; T > 0: "
                   "sample at T, every decoder exactly as sample_decode (--demo, --prompt, --bench)")
    p.add_argument("--seed", type=int, default=0, help="picks the demo prompt; seeds torch and "
                   "the sampling generator")
    p.add_argument("--heads", type=int, default=None, help="use only heads 1..N (default: all; "
                   "SmolLM2's --demo and --prompt: the heads fastest on this CPU)")
    p.add_argument("--verify", default="auto", choices=VERIFY_MODES, help="verify several "
                   "drafts as P rows (batch) or one token tree (tree); auto: tree when a decoder "
                   "drafts several")
    p.add_argument("--reference", action="store_true", help="run the readable implementations "
                   "(each head through BPDHead.forward, lattice.best_paths, the plain neural "
                   "rescoring loop): the same tokens and steps, slower")
    p.add_argument("--k", type=int, default=None, help="lattice width (default: tuned)")
    p.add_argument("--p", type=int, default=None, help="drafts verified per call by p-best")
    p.add_argument("--alpha", type=float, default=None, help="LM interpolation weight in [0, 1]")
    p.add_argument("--copy", type=int, default=None, help="lookup, lookup_pbest: the most tokens "
                   "one copy drafts, past the heads' h - 1 (0: h - 1; transformers drafts 10)")
    p.add_argument("--nodes", type=int, default=None, help="pbest0, pbest, lookup, lookup_pbest: "
                   "the most drafted tokens in the token tree one call verifies (0: no budget)")
    p.add_argument("--accept", default="exact", metavar="RULE", help="--prompt: the acceptance "
                   "rule: exact (default) or an APPROXIMATE one of Stern §5 at temperature 0, topK "
                   "(a drafted token passes when among the base model's top K) or minB (every "
                   "step keeps at least B tokens): its output is NOT greedy decoding's")


def add_run_flags(p):
    """How much to run and what to print."""
    p.add_argument("--json", action="store_true", help="--bench, --tasks, --scale: print one JSON "
                   "object only")
    p.add_argument("--decoders", metavar="A,B", help="--bench, --tasks, --scale: run only these "
                   "decoders (and bpd, the comparison), e.g. --decoders lookup,pbest; default: "
                   f"all (--tasks on SmolLM2: {SUBWORD_TASK_DECODERS})")
    p.add_argument("--text", help="--bench: take prompts from this UTF-8 file, not the test split")
    p.add_argument("--prompts", type=int, default=None, help="--bench, --tune: number of prompts "
                   f"(default 16); --tasks: test examples per task (default {TASK_EXAMPLES}; SmolLM2: "
                   f"{SUBWORD_TASK_EXAMPLES})")
    p.add_argument("--new-tokens", type=int, default=None, help="--bench, --tune, --scale: tokens "
                   "per prompt (default 128)")
    p.add_argument("--objective", default=None, choices=analysis.OBJECTIVES,
                   help="--tune: what to maximise (default block_efficiency); tokens_per_s times "
                   "every setting (machine-specific: needs --tuned FILE)")
    p.add_argument("--force", action="store_true", help="--tune: overwrite a tuned file shipped "
                   "in checkpoints/, or one tuned for another checkpoint; --trace: overwrite a "
                   "file that is not a trace")
    p.add_argument("--trace", metavar="FILE.html", help="--prompt, --demo: write every step of "
                   "the run (drafts, lattice, verification, acceptance) as one self-contained page "
                   "to open in a browser; FILE.json: the same data as JSON (docs/trace.md)")
    p.add_argument("--sweep", action="store_true", help="--bench: sweep k, p, alpha, heads (tune split)")
    p.add_argument("--by-heads", action="store_true", help="--bench: time plain BPD on heads 1..k, "
                   "k = 1..h, beside greedy in one run (Stern §7.3, Fig. 4, Table 4; JSON: speedup_by_heads)")
    p.add_argument("--approximate", action="store_true", help="--bench: also run the APPROXIMATE "
                   f"acceptance rules {', '.join(approximate.RULES)} (Stern §5) on plain BPD's "
                   "drafts, in their own section (JSON: approximate) and never in "
                   "identical_to_greedy: their output is not greedy decoding's")
    p.add_argument("--plot", metavar="DIR", help="--bench, --tasks, --scale: also write PNG "
                   "figures (needs matplotlib)")
    p.add_argument("--no-color", action="store_true")
