"""task_heads: SmolLM2's heads fine-tuned on a set of tasks' train prompts (Kim et al.
fine-tune per task). From the shipped heads (checkpoints/smollm2-heads.pt) as the common start,
heads 2..h and the early-exit adapter of 'neural' train further, self-distilled as
smollm_heads.smollm_heads trains them (generate.py's data, its smollm_trainee, smollm_loss, fit),
on greedy continuations of whole task prompts as the model reads them (lab.task_runs.as_prompt: the
chat template for instruction tasks, raw text for lm and code). The trunk and head 1 stay frozen,
so greedy output is unchanged; only the heads and the exit adapter move (ours: Kim fine-tunes
the whole model, heads included, per task).

Prompts of different lengths: sorted by token length and cut into batches of TASK_GEN_ROWS,
each prompt of a batch cut to the batch's shortest by dropping its start (the end, where the
continuation begins, is kept whole); at most MAX_PROMPT tokens (GEN_WINDOW - TASK_GEN_TOKENS).
tools/task_heads.py (removed; in commit c2dce35) was the measurement; docs/tasks.md "Per-task heads on SmolLM2" the result.
"""
import time

import torch

from lab import tasks
from lab.task_runs import as_prompt
from models import llama_layers
from training.smollm_heads import agreement, held_out, smollm_loss, smollm_trainee
from training.generate import GEN_WINDOW, generate, length_batches, with_targets
from train_heads import fit
from training.shared import RunConfig

TASK_GEN_TOKENS = 32                 # greedy tokens generated after each prompt
TASK_GEN_ROWS = 16                   # prompts per generation batch (sorted by length)
MAX_PROMPT = GEN_WINDOW - TASK_GEN_TOKENS
LR, BATCH = 5e-4, 160                # a gentler peak than smollm_heads' 1e-3: a fine-tune


def task_prompts(vocab, names, n, seed, split="train"):
    """n prompts of `split` drawn evenly from the tasks `names` (n // len(names) each, one more
    for the first n % len(names)), each task's by a seeded permutation, as the model reads
    them (task_runs.as_prompt). -> [(task, text)]"""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, name in enumerate(names):
        pairs = tasks.build(name, split)
        want = n // len(names) + (i < n % len(names))
        if want > len(pairs):
            raise ValueError(f"task {name} has {len(pairs)} {split} prompts, fewer than {want}")
        order = torch.randperm(len(pairs), generator=gen)[:want].tolist()
        out += [(name, as_prompt(name, pairs[j][0], vocab)) for j in order]
    return out


def exit_adapter(model, ck):
    """The checkpoint's early-exit adapter (ck["rescorer"]) as a trainable fp32 head
    (llama_layers.exit_head)."""
    head = llama_layers.exit_head(model.config)
    head.load_state_dict({k: v.float() for k, v in ck["rescorer"].items()})
    return head.float()


def finetune_on(model, vocab, prompts, steps, seed, log=print, exit_head=None):
    """Fine-tune model.heads (heads 2..h), in place, and exit_head (exit_adapter's; None: only
    the heads train) on greedy continuations of `prompts` (texts as the model reads them),
    self-distilled (smollm_heads.smollm_loss); the heads return to their dtype. -> the record: sizes,
    seconds, each head's agreement with greedy on the training continuations."""
    t0 = time.time()
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    batches, cut = length_batches([vocab.encode(p) for p in prompts], TASK_GEN_ROWS, MAX_PROMPT)
    data = with_targets(generate(model, batches, TASK_GEN_TOKENS, log), model)
    gen_s, dtype = time.time() - t0, next(model.heads.parameters()).dtype
    trained_exit = exit_head is not None
    exit_head = exit_head if trained_exit else llama_layers.exit_head(model.config).float()
    trainee, weight = smollm_trainee(model, exit_head, trained_exit)
    cfg = RunConfig(steps=steps, lr=LR, warmup=max(1, steps // 10), batch_size=BATCH,
                      seed=seed, log_every=max(1, steps // 4))
    secs = fit(trainee, cfg, smollm_loss(trainee, weight, data, cfg, gen), "task heads", None, log)
    preds, _ = held_out(trainee, weight, data)
    for p in trainee.parameters():
        p.requires_grad_(False)
    model.heads.to(dtype)
    return {"prompts": len(prompts), "gen_tokens": TASK_GEN_TOKENS, "prompt_tokens_cut": cut,
            "steps": steps, "lr": LR, "batch_size": BATCH, "seed": seed,
            "exit_trained": trained_exit, "train_agreement": agreement(preds, data["targets"]),
            "seconds_generating": round(gen_s), "seconds_training": round(secs)}
