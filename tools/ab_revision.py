"""minibpd's Llama as it was at another git revision against the working tree's, on SmolLM2, in
one process: did a change to models/llama.py make decoding faster? Run-to-run noise on a shared
machine (ratios to transformers moved by 10% between two runs of the peer bench here) hides a
change of that size; two versions timed side by side in one process do not suffer from it.

    python tools/ab_revision.py [--rev b7b1c39] [--prompts 4] [--new-tokens 48] [--rounds 4]
                                [--dtype bfloat16] [--checkpoint checkpoints/smollm2-heads.pt]
    python tools/ab_revision.py --unpacked     # the working tree, packed weights or F.linear

models/llama.py at --rev (`git show`) is loaded as a module of its own and its Llama is given the
working tree model's tensors (the same GGUF weights and shipped heads, shared, not copied); the
rest of the code (the decode loop, the KV cache) is the working tree's for both. Greedy and plain
BPD are timed with both, one warm-up each, then --rounds rounds over the bench's test prompts with
the order alternating per round. Prints ms a token, the ratio new / old time (median of the
rounds' own ratios: below 1 is faster), and whether both gave the same tokens. --unpacked
compares the working tree's model with itself, its products on packed weights against F.linear
(models/blocks.PACKED), instead of a revision.
"""
import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import time
import types

import torch

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)
import minibpd  # noqa: E402
from lab import bench  # noqa: E402
from models import blocks  # noqa: E402
from runtime import threads  # noqa: E402


def llama_at(rev):
    """models/llama.py at git revision `rev`, as a module named llama_at_<rev>."""
    try:
        src = subprocess.run(["git", "show", f"{rev}:models/llama.py"], cwd=HERE, check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"error: cannot read models/llama.py at {rev!r}: "
                         f"{getattr(e, 'stderr', '') or e}".strip())
    module = types.ModuleType(f"llama_at_{rev}")
    exec(compile(src, f"{rev}:models/llama.py", "exec"), module.__dict__)
    return module


def twin(model, module):
    """module's Llama holding model's tensors (shared), in the same dtype and mode."""
    cfg = module.LlamaConfig(**dataclasses.asdict(model.config))
    with torch.device("meta"):
        old = module.Llama(cfg)
    old.load_state_dict(model.state_dict(), assign=True)
    old.lm_head.weight = old.tok_emb.weight                # tied, as the loader ties it
    old.gguf_path, old.draft_vocab = model.gguf_path, model.draft_vocab
    return old.eval()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--rev", default="b7b1c39", help="the revision to compare with")
    p.add_argument("--checkpoint", default=os.path.join(HERE, "checkpoints", "smollm2-heads.pt"))
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--unpacked", action="store_true",
                   help="the working tree's products on packed weights against F.linear")
    args = p.parse_args()
    if min(args.prompts, args.new_tokens, args.rounds) < 1:
        p.error("--prompts, --new-tokens and --rounds must be at least 1")
    threads.set_threads(1)
    load = lambda: " ".join(f"{x:.2f}" for x in os.getloadavg())
    other = "F.linear" if args.unpacked else args.rev
    print(f"load average {load()}, 1 thread, {args.dtype}, working tree against {other}")
    model, ck = minibpd.load_checkpoint(args.checkpoint, "cpu", getattr(torch, args.dtype))
    models = {"working tree": model,
              other: model if args.unpacked else twin(model, llama_at(args.rev))}
    use = lambda name: setattr(blocks, "PACKED", name != "F.linear")
    every = bench.make_prompts(ck["splits"]["test"], ck["vocab"], max(16, args.prompts))
    prompts, n = every[::len(every) // args.prompts][:args.prompts], args.new_tokens
    methods = {"greedy": minibpd.greedy_decode, "bpd": lambda m, q, k: minibpd.bpd_decode(m, q, k)[0]}
    times = {(meth, name): [] for meth in methods for name in models}
    tokens = {}
    with torch.no_grad():
        for meth, fn in methods.items():
            for name, m in models.items():
                use(name)
                fn(m, prompts[0], min(n, 16))                         # warm-up
            for r in range(args.rounds):
                for name in (list(models) if r % 2 == 0 else list(models)[::-1]):
                    use(name)
                    t0 = time.perf_counter()
                    tokens[meth, name] = [fn(models[name], q, n) for q in prompts]
                    times[meth, name].append(time.perf_counter() - t0)
    new, old = list(models)
    print(f"{len(prompts)} prompts x {n} tokens, {args.rounds} rounds, load average after {load()}\n")
    print(f"| method | {new}, ms a token | {old}, ms a token | new / old time | same tokens |")
    print("| --- | ---: | ---: | ---: | :---: |")
    for meth in methods:
        per = lambda name: 1e3 * statistics.median(times[meth, name]) / (len(prompts) * n)
        ratio = statistics.median(a / b for a, b in zip(times[meth, new], times[meth, old]))
        same = "yes" if tokens[meth, new] == tokens[meth, old] else "**NO**"
        print(f"| {meth} | {per(new):.1f} | {per(old):.1f} | {ratio:.3f} | {same} |")


if __name__ == "__main__":
    main()
