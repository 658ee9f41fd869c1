"""Stern et al.'s Table 1, at our small scale (docs/results/approximate.md): plain BPD's mean accepted
block size (block efficiency: new tokens / serial calls) with heads 1..N, N = 2, 4, 6, 8, for
each checkpoint named, with its quality: head 1's test loss from its training record and the
phrase repetition of its greedy text.

    python tools/heads_table.py checkpoints/minibpd.pt checkpoints/minibpd-distilled.pt
    python tools/heads_table.py --replay --checkpoint checkpoints/smollm2-heads.pt --prompts 8 --new-tokens 64
    python tools/heads_table.py --replay --chat --checkpoint checkpoints/smollm2-heads.pt --prompts 16 --new-tokens 128

The bench's prompts and sizes (16 test-split prompts x 128 new tokens): the block efficiency of
N heads is what `python minibpd.py --bench --heads N --checkpoint CK --json` reports as
block_efficiency.bpd, and the phrase repetition its repetition.greedy_text.phrase_repeat (greedy
decoding does not depend on the heads), computed here without the rest of the bench. Exact and
machine-independent: a few seconds a checkpoint.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lab import analysis, bench, questions  # noqa: E402
from decoders.resources import Resources, split_text  # noqa: E402
from lab.run import Run  # noqa: E402
from minibpd import ArgmaxDrafter, bpd_decode, greedy_decode  # noqa: E402
from runtime.checkpoint import load  # noqa: E402 (the lab's loader: FastGPT, SmolLM2)
from runtime.threads import set_threads  # noqa: E402


def replayed(model, ck, ps, n, heads):
    """The same block efficiencies by offline replay (lab.analysis.replay_all: one greedy decode and
    one forward pass a prompt, no decoding per head count): for the real model, whose decoding
    is slow. -> (block efficiency per head count, greedy's continuations)"""
    run = Run(Resources(model, ck), {}, ps, n)
    plain = [analysis.replay_all(run, lambda answer: ArgmaxDrafter(), h) for h in heads]
    return [analysis.block_eff(runs) for runs in plain], run.continuations()


def main(paths, heads=(2, 4, 6, 8), prompts=16, n=128):
    set_threads()
    if "--replay" in paths:        # e.g. SmolLM2: --replay --heads 2,3,4,5 --prompts 8 --new-tokens 64
        chat = "--chat" in paths   # chat-template prompts (SmolLM2; as peer_bench's --chat)
        rest = [a for a in paths if a not in ("--replay", "--chat")]
        args = dict(zip(rest[::2], rest[1::2]))
        heads = tuple(int(x) for x in args.get("--heads", "2,3,4,5").split(","))
        ps_n, n = int(args.get("--prompts", 8)), int(args.get("--new-tokens", 64))
        model, ck = load(args.get("--checkpoint", "checkpoints/smollm2-heads.pt"))
        if chat:
            from models import smollm
            try:
                ps = questions.chat_prompts(ck["vocab"], ps_n, first=smollm.DEMO_QUESTIONS)
            except ValueError as e:
                raise SystemExit(f"heads_table: --prompts: {e}")
        else:
            ps = bench.make_prompts(split_text(ck, "test"), ck["vocab"], ps_n)
        be, greedy = replayed(model, ck, ps, n, heads)
        print(" | ".join(f"{h} heads {b:.3f}" for h, b in zip(heads, be)) +
              f" | greedy phrase repeat {100 * analysis.phrase_repetition_all(greedy):.1f}%")
        return
    print("| checkpoint | " + " | ".join(f"{h} heads" for h in heads) +
          " | test loss, head 1 | greedy phrase repeat |")
    print("| --- " * (len(heads) + 3) + "|")
    for path in paths:
        model, ck = load(path)
        ps = bench.make_prompts(split_text(ck, "test"), ck["vocab"], prompts)
        greedy = [greedy_decode(model, p, n) for p in ps]
        be = [analysis.block_eff([bpd_decode(model.first_heads(h), p, n)[1] for p in ps])
              for h in heads]
        record = ck.get("distill") or ck.get("train") or {}     # the last training stage's
        loss = record.get("test_loss", [None])[0]                # head 1's test loss
        print(f"| {os.path.basename(path)} | " + " | ".join(f"{b:.3f}" for b in be) +
              f" | {'-' if loss is None else f'{loss:.3f}'} | "
              f"{100 * analysis.phrase_repetition_all(greedy):.1f}% |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["checkpoints/minibpd.pt"])
