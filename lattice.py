"""lattice: the top-k lattice of BPD's heads, its exact p-best rescoring, and the drafters that
refine BPD's drafts (T. Kim, A. T. Suresh, K. Papineni, M. Riley, S. Kumar, A. Benton,
"Exploring and Improving Drafts in Blockwise Parallel Decoding", arXiv 2404.09221v2; section
numbers are v2's).

Kim §6.3 keeps each head's k most likely tokens: the top-k lattice ("sausage") of the h heads,
and its oracle path. §7.1 rescores a draft locally with a small neural LM; §7.2 rescores every
path of the lattice with an n-gram LM and verifies the p best in one call.

Position i (0 .. h-1) holds head i's candidates for the token i ahead. Ours: position 0 is the
token verification has just chosen (Stern's merged step), certain, so it holds one candidate and
a lattice has k^(h-1) paths, where Kim §6.3 takes one of k tokens from each of the h heads
(k^h). A path scores
    sum_i interpolate(head_logprob_i, lm.logprob(token_i, history + path[:i]), alpha)
(alpha = 0 or no LM: heads only, Kim's "0-gram" row as we read it, which isolates the LM). An
order-n LM sees only the last n - 1 tokens, so a dynamic program over (position, last n - 1
tokens) finds the p best paths exactly
(Kim et al. compose finite-state machines with OpenFST; the DP is exact for this score). Ties
break by the rank tuple (each token's index in its position's list), smaller first: the heads'
own order wins.

Every function here is the readable one. The decode loop runs fast twins by default, built on
these and checked against them (tests/test_lattice.py, tests/decoders/): decoders/fastlattice.py
(this DP in whole-array numpy) and decoders/viterbi.py (p = 1), decoders/neural.py (the small
LM with its own KV cache); `--reference` runs these instead.
"""
import argparse
import importlib.util
import math
import random
import sys
import statistics
import time
from operator import index

import numpy as np
import torch
import torch.nn.functional as F

from minibpd import (CHECKPOINT, ArgmaxDrafter, bpd_decode, build_gpt, greedy_decode,
                     load_checkpoint, matched, read_checkpoint, window_start)
from ngram import NgramLM
from train_heads import training_threads


def interpolate(head_logprob, lm_logprob, alpha):
    """The score of one token: the heads' log-prob interpolated with an LM's. Kim §7.1's
    equation interpolates the heads' and the rescorer's logits; ours interpolates log-probs,
    which differ from logits per position by a constant (the log-normaliser), so at one position
    the two rank the k candidates alike. Floats, numpy arrays and tensors alike: every rescorer,
    path_score and the fast twins use it, so this is the one line to change."""
    return (1 - alpha) * head_logprob + alpha * lm_logprob


class Lattice:
    """tokens[i]: distinct candidate ids of position i, best first; logprobs[i]: their head
    log-probs (finite, non-increasing). Position 0 holds exactly one token."""

    def __init__(self, tokens, logprobs):
        if len(tokens) == 0 or len(tokens) != len(logprobs):
            raise ValueError(f"need h >= 1 positions, got {len(tokens)} and {len(logprobs)}")
        self.tokens = [[index(t) for t in row] for row in tokens]
        self.logprobs = [[float(x) for x in row] for row in logprobs]
        for i, (toks, lps) in enumerate(zip(self.tokens, self.logprobs)):
            if not (0 < len(toks) == len(lps) == len(set(toks)) and min(toks) >= 0
                    and all(map(math.isfinite, lps)) and lps == sorted(lps, reverse=True)):
                raise ValueError(f"position {i}: need distinct ids >= 0 with finite logprobs, "
                                 f"best first; got {toks}, {lps}")
        if len(self.tokens[0]) != 1:
            raise ValueError("position 0 (the certain greedy token) needs exactly one candidate")

    @classmethod
    def from_logprobs(cls, head_logprobs, k, first=None, top=None):
        """Top-k lattice of head log-probs [h, V] (numpy; float32 widens exactly): candidates by
        log-prob, then id (a stable sort); k is clamped to V; position 0 keeps only `first` (in
        BPD the token verification chose) or else its argmax. top: the candidate ids [h, k] when
        already known (decoders/fastlattice.py finds them without sorting whole rows)."""
        k, lp = index(k), np.asarray(head_logprobs, dtype=np.float64)
        if k < 1 or lp.ndim != 2 or 0 in lp.shape or np.isnan(lp).any():
            raise ValueError(f"need k >= 1 and NaN-free head_logprobs [h, V]; got k = {k}, "
                             f"shape {lp.shape}")
        if first is not None and not 0 <= index(first) < lp.shape[1]:
            raise ValueError(f"first must be a token id in [0, {lp.shape[1]}), got {first}")
        top = (np.argsort(-lp, axis=1, kind="stable")[:, :k] if top is None else top).tolist()
        top[0] = [index(first)] if first is not None else top[0][:1]
        return cls(top, [lp[i, toks].tolist() for i, toks in enumerate(top)])

    h = property(lambda self: len(self.tokens))
    k = property(lambda self: max(map(len, self.tokens)), doc="most candidates at a position")


def path_score(lattice, lm, history, tokens, alpha):
    """The reference score of one path (a token per position), summed left to right."""
    history, path = [index(t) for t in history], [index(t) for t in tokens]
    if len(path) != lattice.h:
        raise ValueError(f"path has {len(path)} tokens, lattice has {lattice.h} positions")
    s = 0.0
    for i, tok in enumerate(path):
        if tok not in lattice.tokens[i]:
            raise ValueError(f"token {tok} is not a candidate of position {i}")
        lp = lattice.logprobs[i][lattice.tokens[i].index(tok)]
        if lm is None or alpha == 0.0:  # 0-gram control: never call the LM
            s = s + lp
        else:
            s = s + interpolate(lp, lm.logprob(tok, history + path[:i]), alpha)
    return s


def _prune(cands, p):
    """The p best (score, ranks, tokens) of one DP state. Float addition is monotone, so a
    partial path worse now stays no better after any common extension: keeping p is exact. But
    scores a few ulps apart can round to equal totals later, where ranks decide, so we also keep
    one within 1e-9 of a kept one with larger ranks (rare; assumes |score| << 1e5)."""
    cands.sort(key=lambda c: (-c[0], c[1]))
    keep = cands[:p]
    for c in cands[p:]:
        tol = 1e-9 * max(1.0, abs(c[0]))
        if cands[p - 1][0] > c[0] + tol:
            break  # this one and all worse ones are beaten by all p kept ones
        if any(y[0] <= c[0] + tol and y[1] > c[1] for y in cands[:p]):
            keep.append(c)
    return keep


def best_paths(lattice, lm, history, p, alpha):
    """Kim §7.2: the p best paths [(score, tokens)], best first (fewer if the lattice has fewer).
    A DP over positions; the state, the last n-1 tokens of history + path (one state with no
    LM), is all the LM sees, so paths sharing it extend alike. Scores use path_score's float
    operations in the same order, so they are bitwise equal to it. Ties: smaller ranks first."""
    if p < 1 or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"need p >= 1 and alpha in [0, 1], got p = {p}, alpha = {alpha}")
    use_lm = lm is not None and alpha != 0.0
    n = lm.order - 1 if use_lm else 0  # tokens of context the LM sees
    history = [index(t) for t in history]
    start = tuple(history[max(0, len(history) - n):]) if n else ()
    beams = {start: [(0.0, (), ())]}  # state -> [(score, rank tuple, token tuple)]
    for i in range(lattice.h):
        grown = {}
        for state, partials in beams.items():
            for r, (tok, lp) in enumerate(zip(lattice.tokens[i], lattice.logprobs[i])):
                term = interpolate(lp, lm.logprob(tok, list(state)), alpha) if use_lm else lp
                new_state = (state + (tok,))[-n:] if n else ()
                bucket = grown.setdefault(new_state, [])
                for s, ranks, toks in partials:
                    bucket.append((s + term, ranks + (r,), toks + (tok,)))
        beams = {state: _prune(cands, p) for state, cands in grown.items()}
    finals = sorted((c for cands in beams.values() for c in cands), key=lambda c: (-c[0], c[1]))
    return [(s, list(toks)) for s, _, toks in finals[:p]]


def oracle_path(lattice, greedy):
    """Kim §6.3 oracle: the path BPD verification accepts furthest, given the true greedy
    continuation greedy[0:h] (greedy[0] is position 0's token): follow greedy while it is a
    candidate, then take each position's top candidate. Verification accepts the longest prefix
    that matches greedy, and a path matching greedy on positions 0..L-1 needs greedy[i] among
    position i's candidates, so from one context no path of the lattice accepts more tokens."""
    greedy = [index(t) for t in greedy]
    if len(greedy) < lattice.h or greedy[0] != lattice.tokens[0][0]:
        raise ValueError(f"greedy needs >= {lattice.h} tokens, the first being the position 0 "
                         f"token {lattice.tokens[0][0]}; got {greedy[:lattice.h]}")
    path, hit = [], True
    for cands, g in zip(lattice.tokens, greedy):
        hit = hit and g in cands  # after the first miss nothing more is accepted
        path.append(g if hit else cands[0])
    return path


# ------------------------------------------------------------------------ drafters (Kim §6.3, §7)
# Each is called by minibpd.bpd_decode as drafter(logprobs [r, V], context) and returns drafts of
# r tokens, the first being the verified token context[-1] (the contract: minibpd.ArgmaxDrafter).

def head_lattice(logprobs, context, k):
    """Top-k lattice of the heads' log-probs [r, V]; position 0: the verified token context[-1]."""
    return Lattice.from_logprobs(logprobs.detach().double().cpu().numpy(), k, first=context[-1])


class PBestDrafter:
    """Global rescoring (Kim §7.2): the p best lattice paths under interpolate(head log-prob,
    n-gram log-prob, alpha), all verified in one call (max_drafts = p). p = 1 is the `ngram`
    decoder; lm=None is `pbest0`, Kim's "0-gram" row as we read it: the p best by head scores."""

    def __init__(self, k, p, alpha=0.0, lm=None, name="pbest"):
        self.k, self.p, self.alpha, self.lm, self.name, self.max_drafts = k, p, alpha, lm, name, p

    def search(self, lat, history):
        """The p best paths [(score, tokens)] of the lattice after `history`."""
        return best_paths(lat, self.lm, history, self.p, self.alpha)

    def __call__(self, logprobs, context):
        lat = head_lattice(logprobs, context, self.k)
        return [tokens for _, tokens in self.search(lat, context[:-1])]


def rescore_locally(logprobs, context, k, alpha, lm_logprobs):
    """Kim §7.1, local neural rescoring: walk the heads left to right; at head i pick, among its
    top-k tokens, the one maximising interpolate(head log-prob, small-LM log-prob, alpha), the
    small LM seeing the context and the tokens picked so far. logprobs [r, V]; lm_logprobs(seq)
    -> the small LM's next-token log-probs [V] after seq. Position 0 is the verified token
    context[-1]. -> the draft."""
    top = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)             # values, indices: [r, k]
    draft = [context[-1]]
    for i in range(1, len(logprobs)):
        lm = lm_logprobs(context + draft[1:]).to(top.values.dtype)        # [V]
        score = interpolate(top.values[i], lm[top.indices[i]], alpha)     # [k]
        draft.append(int(top.indices[i, score.argmax()]))
    return draft


class NeuralDrafter:
    """rescore_locally with a small LM (Kim §7.1; train_heads.py trains one beside the model),
    run over its window afresh for each position: r - 1 small-LM calls a draft.
    decoders/neural.py keeps the small LM's KV cache across steps instead: the same drafts."""
    name, max_drafts = "neural", 1

    def __init__(self, small_lm, k, alpha):
        self.lm, self.k, self.alpha = small_lm, k, alpha

    @torch.no_grad()
    def __call__(self, logprobs, context):
        return [rescore_locally(logprobs, context, self.k, self.alpha, self.logprobs_after)]

    def logprobs_after(self, seq):
        """The small LM's next-token log-probs after seq [V]: one pass over its window."""
        window = seq[window_start(len(seq), self.lm.config.block_size):]
        z = self.lm(torch.tensor([window], device=self.lm.lm_head.weight.device))[0, -1]
        return F.log_softmax(self.lm.lm_head(z), dim=-1)


class OracleDrafter:
    """Kim §6.3, for analysis only: it peeks at the greedy continuation (`answer` = prompt + greedy
    tokens) and proposes the lattice path that accepts the most (oracle_path). From any one
    context no drafter at the same k accepts more; over a whole generation a drafter can still
    end ahead now and then, because its steps start at different positions."""
    name, max_drafts = "oracle", 1

    def __init__(self, answer, k):      # answer: token ids in a list, tuple, tensor or array
        self.answer, self.k = answer.tolist() if hasattr(answer, "tolist") else list(answer or []), k

    def __call__(self, logprobs, context):
        lat = head_lattice(logprobs, context, self.k)
        n = len(context)
        if self.answer[:n] != context:  # a sampled sequence left the greedy answer: heads' top path
            return [[context[-1]] + [cands[0] for cands in lat.tokens[1:]]]
        return [oracle_path(lat, self.answer[n - 1:n - 1 + lat.h])]


# ----------------------------------------------------------------------------- the demo
# `python minibpd.py --demo`: greedy, plain BPD and the drafters above on the shipped character
# model, each checked equal to greedy, and the first steps drawn. Only the code of these files
# runs (GPT.head_logits, best_paths, the batch Verifier); `--bench` runs the lab's fast twins.

# The demo's settings (ours): an order-3 LM keeps the readable DP near a second a run; the lab's
# `python minibpd.py --tune` chooses k, p, alpha and order on the tune split instead.
K, P, ALPHA, ORDER, NEURAL_K = 8, 16, 0.5, 3, 16


def chars_to_ids(text, vocab):
    """The character model's tokens: one a character of `vocab`; a clear error for the others."""
    unknown = sorted(set(text) - set(vocab))
    if unknown:
        raise ValueError(f"the text holds characters the model never saw: {''.join(unknown[:20])!r}")
    return [vocab.index(c) for c in text]


def demo_parts(ck):
    """What the demo reads of a checkpoint beyond the base model, all written by train_heads.py:
    -> (the small rescorer LM of Kim §7.1, the train split's ids, the test split's text)."""
    splits, corpus = ck.get("splits"), ck.get("corpus")
    if not isinstance(splits, dict) or not isinstance(corpus, dict) or not all(
            isinstance(splits.get(s), str) and splits[s] for s in ("train", "test")):
        raise ValueError(f"checkpoint {ck['path']} lacks its corpus and train and test texts "
                         "(the demo's prompt and n-gram LM): train_heads.py writes them")
    small = build_gpt(ck.get("rescorer_config"), ck.get("rescorer"), "the checkpoint's rescorer")
    if small.config.vocab_size != len(ck["vocab"]):
        raise ValueError(f"checkpoint {ck['path']}: its rescorer and its model have other vocabularies")
    return small, chars_to_ids(splits["train"], ck["vocab"]), splits["test"]


def demo_drafters(small, train_ids, answer):
    """{name: (drafter, its settings)}: plain BPD and the refined drafters, with the checkpoint's
    small rescorer LM (Kim §7.1) and an n-gram LM fitted on its train split (Kim's are fitted on
    C4, apart from the tasks too). `answer` (prompt + greedy) is for the oracle, which peeks."""
    lm = NgramLM(ORDER, small.config.vocab_size).fit(train_ids)
    lm_set = f"k={K}, alpha={ALPHA}, order={ORDER}"
    return {"bpd": (ArgmaxDrafter(), ""),
            "neural": (NeuralDrafter(small, NEURAL_K, ALPHA), f"k={NEURAL_K}, alpha={ALPHA}"),
            "ngram": (PBestDrafter(K, 1, ALPHA, lm, "ngram"), lm_set),
            "pbest0": (PBestDrafter(K, P, name="pbest0"), f"k={K}, p={P}"),
            "pbest": (PBestDrafter(K, P, ALPHA, lm), f"p={P}, {lm_set}"),
            "oracle": (OracleDrafter(answer, K), f"k={K}, peeks at greedy's answer")}


def demo_prompt(text, seed, n=8, length=80):
    """One of n prompts of `length` characters spread evenly over `text`, each from a line start
    (the lab's bench takes the same n), chosen by `seed`."""
    starts = [(len(text) - 2 * length) * i // (n - 1) for i in range(n)]
    starts = [s if text.find("\n", s, s + length) < 0 else text.find("\n", s, s + length) + 1
              for s in starts]
    return text[random.Random(seed).choice(starts):][:length]


def demo_args(argv):
    """The demo's flags, or None when argv asks for more (the lab's command line serves it)."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)    # as every parser here
    p.add_argument("--demo", action="store_true")
    p.add_argument("--checkpoint", default=CHECKPOINT)
    p.add_argument("--max-new-tokens", type=int, default=160)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)   # one decode's small products: 1 is fastest
    args, rest = p.parse_known_args(argv)
    return args if (args.demo or not argv) and not rest else None   # no flags: the demo


def the_labs(argv):
    """None where the lab's folders are here to serve argv (minibpd.py hands it over); else the
    paper files' usage for --help (exit 0) or one line naming what they run (exit 1)."""
    if importlib.util.find_spec("lab") is not None:
        return None
    usage = "python minibpd.py --demo [--checkpoint F] [--max-new-tokens N] [--seed N] [--threads N]"
    if argv in (["--help"], ["-h"]):
        print(f"usage: {usage}\nThe paper files alone run this demo; the lab's folders add the rest.")
        return 0
    print(f"error: {' '.join(argv)} is the lab's (its folders are not here); the paper files alone "
          f"run {usage}", file=sys.stderr)
    return 1


def demo(argv):
    """-> the exit code (0: every decoder's output is greedy's), or None when argv is not this
    demo: a lab flag, or a checkpoint of another model family (SmolLM2's: the lab's demo)."""
    args, t0 = demo_args(argv), time.perf_counter()
    try:
        ck = None if args is None else read_checkpoint(args.checkpoint)     # read once
        if ck is None or ck.get("kind") is not None:
            return the_labs(argv)
        if not 1 <= args.max_new_tokens <= 160:
            raise ValueError("--max-new-tokens takes 1 to 160 (the demo fits a terminal; the "
                             "lab's --prompt takes more)")
        training_threads(args.threads)    # 1 to the machine's cores, as for training
        model, ck = load_checkpoint(ck)
        small, train_ids, test_text = demo_parts(ck)
        prompt = chars_to_ids(demo_prompt(test_text, args.seed), ck["vocab"])
    except ValueError as e:               # CheckpointError too: one line, exit status 2
        print(f"error: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    vocab, n = ck["vocab"], args.max_new_tokens
    greedy = greedy_decode(model, prompt, n)
    drafters = demo_drafters(small, train_ids, prompt + greedy)
    params = sum(p.numel() for p in model.parameters())
    print(f"minibpd demo: {model.config.n_bpd_heads} BPD heads on a {params:,}-parameter "
          f"character GPT ({ck['corpus'].get('name', 'its corpus')}), "
          f"{torch.get_num_threads()} thread(s); loaded in {time.perf_counter() - t0:.1f} s\n")
    print(f"prompt (test split): '{show(prompt, vocab)}'\ngreedy, {n} calls: "
          f"'{show(greedy, vocab)}'\n")
    same, plain = True, None
    for name, (drafter, settings) in drafters.items():
        out, stats = bpd_decode(model, prompt, n, drafter)
        same, plain = same and out == greedy, plain or stats
        check = "identical to greedy ✓" if out == greedy else "DIFFERENT from greedy ✗"
        print(f"  {name:8s} {stats['calls']:3d} calls, block efficiency "
              f"{stats['block_efficiency']:.2f}  {check}  {settings}")
    draw_steps(model, drafters, plain, prompt + greedy, vocab)
    speed = {name: median_tokens_per_s(lambda: decode(model, prompt, n), n)
             for name, decode in (("greedy", greedy_decode), ("BPD", bpd_decode))}
    print(f"\nwall-clock here (median of 3): greedy {speed['greedy']:.0f} tok/s, BPD "
          f"{speed['BPD']:.0f} tok/s: {speed['BPD'] / speed['greedy']:.2f}x; {time.perf_counter() - t0:.1f} "
          "s in all\nmore: `--bench` times every decoder (the lab's fast twins), `--trace FILE.html` "
          "draws every step, `--help` lists every command" + ("" if importlib.util.find_spec("lab")
                                                             else " (with the lab's folders)"))
    return 0 if same else 1


def draw_steps(model, drafters, stats, answer, vocab, limit=5, show_tokens=None, heads=None):
    """The first BPD calls: the heads guess (predict), the base model checks (verify), the prefix
    equal to greedy is kept (accept; Stern §3); under each, every drafter's drafts from the same
    context and head log-probs (Kim §7), with the tokens each would have gained. The lab passes
    its own `show_tokens` (a tokenizer's vocabulary) and `heads` (log-probs it has computed)."""
    show_tokens, heads, w = show_tokens or show, heads or heads_after, max(8, *map(len, drafters))
    print("\n  how the drafts are checked (• = head 1, the base model's own token; ✓ = equals "
          "greedy, kept; ✗ = first miss, the base model's token replaces it):")
    repeat = next((s for s in stats["steps"][limit:] if repaired(s)), None)
    for step in stats["steps"][:limit] + ([repeat] if repeat else []):
        known, m = step["context"], len(step["drafts"][0]) - 1
        if step is repeat:
            print("    ... later, a repeated token in BPD's draft, replaced by the refined drafts:")
        print(f"    after '…{show_tokens(answer[max(0, known - 24):known - 1], vocab)}':")
        logprobs = heads(model, answer[:known])[:m + 1]                       # [m + 1, V]
        for name, (drafter, _) in drafters.items():
            drafts = drafter(logprobs, answer[:known])
            ok = [matched(d[1:], answer[known:]) for d in drafts]
            best, j = drafts[ok.index(max(ok))], max(ok)    # a copy may run past the heads' m
            marks = "•" + "✓" * j + ("✗" + "·" * (len(best) - j - 2) if j < len(best) - 1 else "")
            more = f" (best of {len(drafts)})" if len(drafts) > 1 else ""
            print(f"      {name:{w}s} '{show_tokens(best, vocab)}'  {marks}  +{j + 1}{more}")


def heads_after(model, seq):
    """The heads' log-probs [h, V] where the loop drafts after seq: at the final state that chose
    seq[-1], computed over greedy's window (one call)."""
    t, B = len(seq) - 1, model.config.block_size
    z = model(torch.tensor([seq[window_start(t, B):t]], device=model.lm_head.weight.device))[0, -1]
    return F.log_softmax(model.head_logits(z, seq[-1]), dim=-1)


def repaired(step):
    """BPD's first miss repeats the token before it (Kim §6.1, §7.3; this criterion is ours)."""
    d, j = step["drafts"][0], step["accepted"]
    return j < len(d) and d[j] == d[j - 1]


def show(tokens, vocab):
    return "".join(vocab[t] for t in tokens).replace("\n", "⏎")


def median_tokens_per_s(decode, n, reps=3):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        decode()
        times.append(time.perf_counter() - t)
    return n / statistics.median(times)
