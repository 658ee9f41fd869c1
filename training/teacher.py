"""teacher: the targets SmolLM2's heads train on (training/smollm_heads.py): head i's target at
each state (head_targets), teacher forcing on offline text (teacher_forced, forced_targets,
chain_inputs), and the draft vocabulary heads 2..h train on and draft among (draft_vocabulary,
in_vocab; models.llama.Llama.draft_vocab).
"""
import time

import torch

TEACHER_WINDOW, TEACHER_ROWS = 256, 8         # teacher forcing: tokens a window, windows a forward


def head_targets(tokens, h):
    """tokens [N, T] -> targets [N, T, h]: head i (1-based) at state s is scored on token
    s + i - 1; -1 past the continuation's end (no target)."""
    N, T = tokens.shape
    padded = torch.cat([tokens, tokens.new_full((N, h), -1)], dim=1)
    return torch.stack([padded[:, i:i + T] for i in range(h)], dim=-1)


@torch.no_grad()
def teacher_forced(model, ids, n, log, exact=True):
    """ids [N] (teacher_text's tokens) -> {"tokens": the base's argmax [W, T], "z" [W, T, C] fp32,
    "targets" [W, T, h], "inputs" [W, T, h - 1] (chain_inputs)}: the first n tokens as W
    windows of T = TEACHER_WINDOW, TEACHER_ROWS windows a forward, the plain kernels (as
    generate.generate); exact=False: every argmax a target (head_targets), not only greedy's
    (forced_targets). No exit states: the exit adapter trains on the generated ones only."""
    T, h = TEACHER_WINDOW, model.config.n_bpd_heads
    windows = ids[:n // T * T].view(-1, T)
    if len(windows) == 0:
        raise ValueError(f"--teacher-tokens {n}: the teacher text has {len(ids):,} tokens; "
                         f"give at least one window of {T}")
    zs, tokens, t0 = [], [], time.time()
    model.batch_invariant = False
    try:
        for b in range(0, len(windows), TEACHER_ROWS):
            zs.append(model(windows[b:b + TEACHER_ROWS]))                      # [B, T, C]
            tokens.append(model.lm_head(zs[-1]).argmax(-1))                    # [B, T]
            done = b + len(zs[-1])
            if done % (8 * TEACHER_ROWS) == 0 or done == len(windows):
                log(f"[teacher forcing] {done * T:,}/{len(windows) * T:,} tokens, "
                    f"{done * T / (time.time() - t0):.0f} tok/s")
    finally:
        model.batch_invariant = True
    tokens = torch.cat(tokens)
    targets = forced_targets(windows, tokens, h) if exact else head_targets(tokens, h)
    return {"tokens": tokens, "z": torch.cat(zs).float(), "targets": targets,
            "inputs": chain_inputs(windows, h)}


def chain_inputs(windows, h):
    """windows [W, T] (the text) -> [W, T, h - 1]: the tokens chained heads read at each state,
    the text's next h - 1 tokens (-1 past the window). Head i's target, the argmax at s + i - 1,
    is the base's choice after exactly those tokens, so every argmax is a fair target for a
    chained head (llama_layers.ChainedHead), whether or not the text was greedy's."""
    after = torch.cat([windows[:, 1:], windows.new_full((len(windows), 1), -1)], dim=1)
    return head_targets(after, h - 1)


def forced_targets(windows, tokens, h):
    """windows [W, T] (the text), tokens [W, T] (the base's argmax after each of its tokens) ->
    targets [W, T, h] as head_targets(tokens), but -1 where the text left greedy in between:
    head i's target at s, the argmax at s + i - 1, is greedy's token only if the text's tokens
    s + 1 .. s + i - 1 were the argmaxes before them (head 1's, the argmax at s, always is)."""
    targets, T = head_targets(tokens, h), tokens.shape[1]
    agree = torch.zeros_like(tokens, dtype=torch.bool)        # agree[s]: text token s + 1 == argmax at s
    agree[:, :-1] = windows[:, 1:] == tokens[:, :-1]
    ok = torch.ones_like(agree)
    for i in range(1, h):                                     # head i + 1 needs agree[s .. s + i - 1]
        n = max(0, T - i + 1)
        ok[:, :n] &= agree[:, i - 1:i - 1 + n]
        ok[:, n:] = False
        targets[..., i] = torch.where(ok, targets[..., i], -1)
    return targets


def draft_vocabulary(tokens, S, V):
    """The S token ids most frequent in `tokens` (the base's own choices), ties to the smaller
    id, sorted: what heads 2..h draft among (Llama.draft_vocab). S = 0: None (all V)."""
    if S == 0:
        return None
    if not 2 <= S <= V:
        raise ValueError(f"a draft vocabulary needs 2 to {V:,} tokens, got {S:,}")
    counts = torch.bincount(tokens.flatten(), minlength=V)
    return torch.argsort(-counts, stable=True)[:S].sort().values


def in_vocab(targets, ids, V):
    """targets (token ids, -1: none) -> their index in ids, -1 where none or outside."""
    if ids is None:
        return targets
    where = torch.full((V,), -1, dtype=torch.long)
    where[ids] = torch.arange(len(ids))
    return torch.where(targets >= 0, where[targets.clamp_min(0)], -1)
