"""generate: the self-distillation data of SmolLM2's heads (smollm_heads.smollm_heads, stage 1;
docs/training.md): the frozen base's greedy continuations of prompts, with the states that
predicted each token. The prompts: train-split lines of the offline corpus (prompt_batches) and,
with --chat-continuations, train-split questions in the model's chat template (chat_batches).
Generation runs without the fixed-shape blocks (the plain, faster kernels); the rare argmax it
flips at a near-tie changes a training target, not the model.
"""
import dataclasses
import math
import time

import torch

from lab import questions
from runtime.loop import decode_rows
from training.teacher import head_targets

CONTINUATIONS = {"train": 2304, "tune": 64}   # text, per split, unless --continuations sets train's
CHAT_TUNE = 64                                # chat continuations of the tune split (the record's)
GEN_TOKENS, GEN_ROWS, GEN_WINDOW = 128, 64, 256   # tokens each, rows per batch, cache window
PROMPT_TOKENS = (12, 48)                      # a text batch's prompt length, drawn in this range
EXIT_LAYERS = 6                               # the early-exit rescorer: the base's first blocks


def prompt_batches(text, vocab, n, gen):
    """n prompts from `text` in batches of GEN_ROWS: each starts at a random line and is cut to
    one token length per batch (drawn from PROMPT_TOKENS). -> [tensor [rows, L]]"""
    starts = [i + 1 for i, c in enumerate(text) if c == "\n" and i + 800 < len(text)]
    out = []
    for b in range(0, n, GEN_ROWS):
        L = int(torch.randint(PROMPT_TOKENS[0], PROMPT_TOKENS[1] + 1, (1,), generator=gen))
        rows = []
        while len(rows) < min(GEN_ROWS, n - b):
            at = starts[int(torch.randint(len(starts), (1,), generator=gen))]
            ids = vocab.encode(text[at:at + 800])
            if len(ids) >= L:                  # (800 characters of spaces could be fewer)
                rows.append(ids[:L])
        out.append(torch.tensor(rows))
    return out


def length_batches(ids, rows, longest):
    """Token-id prompts sorted by length, in batches of `rows`, each prompt cut to the batch's
    shortest (and to `longest`) by dropping its start. -> ([tensor [rows, L]], tokens cut)"""
    ids = sorted(ids, key=len)
    out, cut = [], 0
    for b in range(0, len(ids), rows):
        group = ids[b:b + rows]
        L = min(longest, min(len(p) for p in group))
        out.append(torch.tensor([p[len(p) - L:] for p in group]))
        cut += sum(len(p) - L for p in group)
    return out, cut


def chat_batches(vocab, split, n, gen):
    """n of the split's questions (a seeded draw of those whose chat prompt fits GEN_WINDOW with
    GEN_TOKENS to come) as chat prompts, in length_batches of GEN_ROWS. -> ([tensor], cut)"""
    longest = GEN_WINDOW - GEN_TOKENS
    fits = [ids for ids in (vocab.encode(vocab.chat(q)) for q in questions.questions(split))
            if len(ids) <= longest]
    if n > len(fits):
        raise ValueError(f"{n:,} chat continuations of the {split} split asked; its questions "
                         f"give {len(fits):,} prompts of at most {longest} tokens")
    order = torch.randperm(len(fits), generator=gen)[:n].tolist()
    return length_batches([fits[i] for i in order], GEN_ROWS, longest)


@torch.no_grad()
def greedy_states(model, rows, n):
    """rows [P, L] -> (tokens [P, n], z [P, n, C] fp32, exit [P, n, C] bf16): P greedy
    continuations of n tokens (runtime.loop.decode_rows), and the states that predicted them:
    z[:, s] is the final hidden state whose head 1 gave tokens[:, s], exit[:, s] the residual
    stream after EXIT_LAYERS blocks at the same position."""
    zs, exits = [], []
    grab = model.blocks[EXIT_LAYERS - 1].register_forward_hook(
        lambda module, inputs, out: exits.append(out[:math.prod(inputs[1])].view(
            *inputs[1], -1)[:, -1].to(torch.bfloat16)))   # inputs[1]: (P, L); out [M, C]
    try:
        out = decode_rows(model, rows, n, states=zs)
    finally:
        grab.remove()
    return out[:, rows.shape[1]:], torch.stack(zs, 1).float(), torch.stack(exits, 1)


def generate(model, batches, n, log, label=""):
    """greedy_states over each batch of prompts, fast: the fixed-shape blocks off and a
    GEN_WINDOW-slot cache (prompt + continuation fit). -> the dict the losses read: {"tokens"
    [N, n], "z" [N, n, C], "exit" [N, n, C], "targets" [N, n, h] (head_targets)}"""
    model.batch_invariant = False
    fast = model.first_heads(1)
    fast.config = dataclasses.replace(fast.config, block_size=GEN_WINDOW)
    out, t0 = [], time.time()
    try:
        for rows in batches:
            out.append(greedy_states(fast, rows, n))
            done = sum(len(o[0]) for o in out)
            log(f"[generate{label}] {done}/{sum(len(b) for b in batches)} continuations, "
                f"{done * n / (time.time() - t0):.0f} tok/s")
    finally:
        model.batch_invariant = True
    tokens, z, exits = (torch.cat(parts) for parts in zip(*out))
    return {"tokens": tokens, "z": z, "exit": exits,
            "targets": head_targets(tokens, model.config.n_bpd_heads)}


def smollm_data(model, vocab, texts, gen, log, train=0, chat=0):
    """Greedy continuations with their states and head targets: {split: text ones (`train`
    train-split ones, 0: CONTINUATIONS'), then `chat` chat ones in train ("chat", "cut": how
    many), "tune chat": CHAT_TUNE of the tune split's (none with chat=0)}."""
    counts = {**CONTINUATIONS, "train": train or CONTINUATIONS["train"]}
    data, n = {}, GEN_TOKENS
    for split, k in counts.items():
        batches = prompt_batches(texts[split], vocab, k, gen)
        cut = 0
        if split == "train" and chat:
            more, cut = chat_batches(vocab, "train", chat, gen)
            batches += more
        data[split] = generate(model, batches, n, log, f" {split}")
        data[split].update(chat=chat if split == "train" else 0, cut=cut)
    if chat:
        batches, cut = chat_batches(vocab, "tune", CHAT_TUNE, gen)
        data["tune chat"] = generate(model, batches, n, log, " tune chat")
        data["tune chat"].update(chat=CHAT_TUNE, cut=cut)
    return data
