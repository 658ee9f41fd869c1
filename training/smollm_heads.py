"""smollm_heads: BPD heads for a frozen pretrained LM, SmolLM2-135M (--smollm; models/smollm.py):
Medusa-1 on the frozen base, heads 2..h (--head-form: chained, llama_layers.ChainedHead, or
Stern §6's) learning its own greedy future (self-distillation: the base, hence greedy output,
never changes), in the stages docs/training.md describes: the corpus (smollm_corpus); greedy
continuations and their states (training/generate.py); teacher forcing (training/teacher.py);
the heads and the early-exit adapter trained on them, over the --draft-vocab tokens
(teacher.draft_vocabulary); the run's record. training/cli.py is the command line.
"""
import dataclasses
import hashlib
import os
import sys
import textwrap
import time

import torch
import torch.nn.functional as F

from lab import stdlib, task_lm, task_text, tasks
from lab.analysis import replay
from models import llama_layers
from runtime.checkpoint import CHECKPOINT
from train_heads import fit, git_revision, split_corpus
from training.generate import EXIT_LAYERS, GEN_TOKENS, smollm_data
from training.teacher import TEACHER_WINDOW, draft_vocabulary, in_vocab, teacher_forced

SMOLLM_OUT = os.path.join(os.path.dirname(CHECKPOINT), "smollm2-heads.pt")
SMOLLM_DEFAULTS = {"steps": 6000, "lr": 1e-3, "warmup": 50, "batch_size": 160, "heads": 5,
                   "teacher_tokens": 1_000_000, "teacher_steps": 4000, "draft_vocab": 8192,
                   "head_form": "chained", "continuations": 4608, "chat_continuations": 1536,
                   "out": SMOLLM_OUT}
SMOLLM_TEXT = {"topics": None, "functions": (400_000, 20_000), "task prompts": (400_000, 20_000)}
TEACHER_BATCH = 256                           # positions a step of the teacher-forced phase


def capped(pieces, budget):
    """The pieces in order of a stable hash of their text, as long as they fit `budget` chars."""
    out, total = [], 0
    for piece in sorted(pieces, key=task_text.digest):
        if total + len(piece) <= budget:
            out.append(piece)
            total += len(piece)
    return out


def smollm_corpus():
    """-> ({split: text}, description). pydoc_data.topics split as the character model's corpus
    (train_heads.split_corpus); stdlib functions and the tasks' prompts split by their key's hash
    (task_text.split_of, the tasks' own split), so no function's text is in two splits. Each source
    is capped (SMOLLM_TEXT: train, tune/test characters), pieces joined by blank lines."""
    topics = split_corpus(task_lm.topics_text()[0])
    funcs = split_functions()
    prompts = {s: [p for name in tasks.CHAR_TASKS if name != "lm" for p, _ in tasks.build(name, s)]
               for s in task_text.SPLITS}
    texts, sizes = {}, {}
    for split in task_text.SPLITS:
        parts = [topics[split]]
        for source, pool in (("functions", funcs), ("task prompts", prompts)):
            budget = SMOLLM_TEXT[source][0 if split == "train" else 1]
            parts.append("\n\n".join(capped(pool[split], budget)))
        texts[split] = "\n\n".join(parts)
        sizes[split] = [len(p) for p in parts]
    return texts, {"name": "pydoc_data.topics + stdlib function sources + task prompts",
                   "python": sys.version.split()[0], "chars": sizes,
                   "sha256": {s: hashlib.sha256(t.encode()).hexdigest() for s, t in texts.items()}}


def split_functions():
    """{split: [the dedented source of every stdlib function of that split]} (task_text.split_of)."""
    funcs = {s: [] for s in task_text.SPLITS}
    for fn in stdlib.functions():
        funcs[task_text.split_of(fn.key)].append(textwrap.dedent("".join(stdlib.source_lines(fn))))
    return funcs


def teacher_text(train):
    """The teacher-forced phase's text: the train split `train`, then every train-split stdlib
    function it left out (its cap, SMOLLM_TEXT), in stable-hash order: no tune or test text."""
    funcs = split_functions()["train"]
    kept = set(capped(funcs, SMOLLM_TEXT["functions"][0]))
    return "\n\n".join([train] + [f for f in sorted(funcs, key=task_text.digest) if f not in kept])


def projected_loss(states, targets, weight):
    """Cross entropy of states [B, H, C] under the tied output projection (weight [V, C], frozen,
    bf16: one matmul for all heads), targets [B, H] (-1: none). -> (mean loss, per head [H])"""
    logits = F.linear(states.to(weight.dtype), weight).float()              # [B, H, V]
    ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1,
                         reduction="none").view(targets.shape)
    valid = (targets >= 0).float()
    per_head = (ce * valid).sum(0) / valid.sum(0).clamp_min(1)
    return per_head.mean(), per_head


class SmolHeads(torch.nn.Module):
    """What trains: heads 2..h (model.heads) and the early-exit adapter (llama_layers.SternHead,
    BPDHead form, on the base's final norm of the residual stream after EXIT_LAYERS blocks).
    Chained heads (llama_layers.ChainedHead) read the tokens before theirs: teacher forcing, where
    a drafted token only matters when every one before it was greedy's (ChainedHead)."""

    def __init__(self, model, exit_head):
        super().__init__()
        self.heads, self.exit, self.norm = model.heads, exit_head, model.norm
        self.chained = model.config.head_form == "chained"
        self.embedding = model.tok_emb.weight.detach()                  # [V, C], frozen

    def forward(self, z, exit_states=None, tokens=None):
        """z [B, C], exit_states [B, C], tokens [B, h - 1] (greedy's tokens 1..h - 1 after z's
        state, the first the one z chose; -1: none; chained heads only) -> heads 2..h's states
        [B, h - 1, C], exit's [B, 1, C] (None without exit_states)."""
        ex = None if exit_states is None else self.exit_state(exit_states)
        if not self.chained:
            return torch.stack([head(z) for head in self.heads], dim=1), ex
        f, ys = z, []
        for i, head in enumerate(self.heads):
            f = self.step(head, f, tokens[:, i].clamp_min(0))
            ys.append(f)
        return torch.stack(ys, dim=1), ex

    def step(self, head, f, t):
        """One chained head: the state before it f [B, C] and the token drafted before it t [B]
        -> its state [B, C] (llama_layers.ChainedHead on [f; e(t)])."""
        return head(torch.cat([f, self.embedding[t].to(f.dtype)], dim=-1))

    def exit_state(self, exit_states):
        """The exit adapter's state [B, 1, C] on the residual stream exit_states [B, C]."""
        return self.exit(self.norm(exit_states.float()))[:, None]

    @torch.no_grad()
    def draft(self, z, weight, ids=None):
        """Heads 2..h's drafts at states z [B, C] as decoding makes them (greedy's first token
        is head 1's argmax; each chained head reads the token the one before it drafted) ->
        [B, h - 1] token ids, over the draft vocabulary `ids` (None: all of weight [V, C])."""
        sub = weight if ids is None else weight[ids]

        def argmax(states):                                       # [B, k, C] -> token ids [B, k]
            t = F.linear(states.to(weight.dtype), sub).argmax(-1)
            return t if ids is None else ids[t]
        if not self.chained:
            return argmax(self(z)[0])
        t, f, out = F.linear(z.to(weight.dtype), weight).argmax(-1), z, []   # t: head 1's token
        for head in self.heads:
            f = self.step(head, f, t)
            t = argmax(f[:, None])[:, 0]
            out.append(t)
        return torch.stack(out, dim=1)


def smollm_loss(trainee, weight, data, cfg, gen, ids=None, exit=True):
    """-> loss_at(step) for fit: a random batch of positions, heads 2..h on their future tokens
    (over the draft vocabulary `ids`, None: all) and, with `exit`, the exit adapter on the next
    token (every token), the two losses added. Chained heads read data["inputs"] (teacher
    forcing: the text's tokens) or, on greedy continuations, greedy's own tokens."""
    z, targets = data["z"].flatten(0, 1), data["targets"].flatten(0, 1)
    inputs = data["inputs"].flatten(0, 1) if "inputs" in data else targets[:, :-1]   # greedy's
    exits = data["exit"].flatten(0, 1) if exit else None
    future = in_vocab(targets[:, 1:], ids, len(weight))           # heads 2..h's, in the vocabulary
    keep = torch.nonzero(targets[:, 1] >= 0).flatten()       # positions with a head-2 target
    sub = weight if ids is None else weight[ids]            # [S, C]: the heads' projection

    def loss_at(step):
        pick = keep[torch.randint(len(keep), (cfg.batch_size,), generator=gen)]
        ys, ex = trainee(z[pick], None if exits is None else exits[pick], inputs[pick])
        heads, per_head = projected_loss(ys, future[pick], sub)
        exit_loss = projected_loss(ex, targets[pick, :1], weight)[0] if exit else torch.zeros(())
        return heads + exit_loss, lambda: ("heads 2..h " + " ".join(f"{x:.2f}" for x in per_head.tolist())
                                           + (f" | exit {exit_loss.item():.2f}" if exit else ""))
    return loss_at


@torch.no_grad()
def held_out(trainee, weight, data, ids=None, chunk=256):
    """On held-out continuations: each state's drafts of heads 1..h as decoding makes them
    (SmolHeads.draft: heads 2..h over the draft vocabulary `ids`) and the exit adapter's argmax
    -> (preds [N, T, h], exit preds [N, T]); each scored against targets [N, T, h] (head 1 and
    the exit: the next token)."""
    z, exits, (N, T, h) = data["z"].flatten(0, 1), data["exit"].flatten(0, 1), data["targets"].shape
    preds = []
    for i in range(0, len(z), chunk):
        ex = trainee.exit_state(exits[i:i + chunk])                           # [b, 1, C]
        first = torch.cat([z[i:i + chunk, None], ex], dim=1)                 # [b, 2, C]
        full = F.linear(first.to(weight.dtype), weight).argmax(-1)           # [b, 2]
        drafts = trainee.draft(z[i:i + chunk], weight, ids)                  # [b, h - 1]
        preds.append(torch.cat([full[:, :1], drafts, full[:, 1:]], dim=1))   # [b, h + 1]
    preds = torch.cat(preds).view(N, T, h + 1)
    return preds[..., :h], preds[..., h]


def agreement(preds, targets):
    """Share of positions where preds [N, T, (h)] equal targets of the same shape (-1: none)."""
    valid = targets >= 0
    dims = (0, 1) if targets.dim() == 3 else None
    hits = ((preds == targets) & valid).float()
    return (hits.sum(dims) / valid.float().sum(dims)).tolist()


def replay_heads(preds, tokens, heads):
    """Block efficiency of plain BPD with heads 1..`heads` on greedy continuations, replayed from
    the heads' argmaxes (preds [N, T, h]) by the decode loop's own replay (lab.analysis.replay,
    no window: the continuations are short): with k tokens known, the draft is state k - 1's
    argmaxes (head 1 gave token k - 1), draft j guessing token k - 1 + j."""
    calls, (N, T) = 0, tokens.shape
    for row, truth in zip(preds.tolist(), tokens.tolist()):
        states = {s: ids[:heads] for s, ids in enumerate(row)}
        calls += replay(lambda ids, context: [ids], states, truth, 0, T, heads, T + heads)["calls"]
    return N * T / calls


def load_average():                                # for the record: is the machine idle?
    return [round(x, 2) for x in os.getloadavg()]


def smollm_heads(cfg, log=print):
    """Train SmolLM2's heads (see above). -> (model with trained heads, the checkpoint's extra
    keys for smollm.save_heads)."""
    from models import smollm
    t0, cpu0, load0 = time.time(), time.process_time(), load_average()
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    model, vocab = smollm.load_gguf(dtype=torch.bfloat16, n_bpd_heads=cfg.heads,
                                    head_form=cfg.head_form)
    exit_head = llama_layers.SternHead(model.config.n_embd)     # BPDHead's form, as EarlyExit's
    texts, corpus = smollm_corpus()
    log(f"corpus: {corpus['name']}, characters train/tune/test " +
        " / ".join(f"{sum(corpus['chars'][s]):,}" for s in task_text.SPLITS))
    data = smollm_data(model, vocab, texts, gen, log, cfg.continuations, cfg.chat_continuations)
    gen_s = time.time() - t0
    teacher, teacher_record = teacher_data(model, vocab, texts["train"], cfg, log)
    trainee, weight = smollm_trainee(model, exit_head)
    ids = draft_vocabulary(data["train"]["tokens"] if teacher is None else teacher["tokens"],
                           cfg.draft_vocab, len(weight))
    if teacher is not None:
        phase = dataclasses.replace(cfg, steps=cfg.teacher_steps, batch_size=TEACHER_BATCH)
        teacher_record["seconds_training"] = round(fit(
            trainee, phase, smollm_loss(trainee, weight, teacher, phase, gen, ids, exit=False),
            "smollm heads, teacher-forced", None, log))
        teacher_record["tune_greedy_agreement"] = agreement(
            held_out(trainee, weight, data["tune"], ids)[0], data["tune"]["targets"])
        log("after teacher forcing, tune agreement with greedy, heads 1..h: "
            + " ".join(f"{a:.0%}" for a in teacher_record["tune_greedy_agreement"]))
        del teacher                                # GBs of states: free them before the next phase
    secs = fit(trainee, cfg, smollm_loss(trainee, weight, data["train"], cfg, gen, ids),
               "smollm heads", None, log)
    record = smollm_record(trainee, weight, data["tune"], cfg, log, ids)
    if "tune chat" in data:
        record["tune_chat"] = smollm_record(trainee, weight, data["tune chat"], cfg, log, ids,
                                            " (chat)")
    record.update(seconds=round(time.time() - t0), cpu_seconds=round(time.process_time() - cpu0),
                  seconds_generating=round(gen_s), seconds_training=round(secs),
                  load_average_before=load0, load_average_after=load_average(),
                  tokens_generated={s: d["tokens"].numel() for s, d in data.items()},
                  continuations={s: len(d["tokens"]) for s, d in data.items()},
                  chat_continuations={s: d["chat"] for s, d in data.items()},
                  chat_prompt_tokens_cut={s: d["cut"] for s, d in data.items()},
                  teacher=teacher_record, draft_vocab=0 if ids is None else len(ids))
    extra = {"dtype": "bfloat16", "splits": texts, "corpus": corpus, "seed": cfg.seed,
             "rescorer_config": {"kind": "early-exit", "layers": EXIT_LAYERS},
             "rescorer": {k: v.half() for k, v in exit_head.state_dict().items()},
             "train": record, "git_revision": git_revision(),
             **({} if ids is None else {"draft_vocab": ids})}
    model.draft_vocab = ids
    return model.eval(), extra


def smollm_trainee(model, exit_head):
    """-> (SmolHeads: heads 2..h and the exit adapter in fp32, the only parameters that train;
    the tied embedding [V, C] bf16, frozen)."""
    model.heads.float()                            # fp32 heads train on the bf16 trunk's states
    trainee = SmolHeads(model, exit_head)
    model.requires_grad_(False)
    trainee.heads.requires_grad_(True)
    trainee.exit.requires_grad_(True)
    return trainee, model.lm_head.weight.detach()


def teacher_data(model, vocab, train, cfg, log):
    """The teacher-forced phase's data (teacher_forced on teacher_text) and its record; (None, None)
    with --teacher-tokens 0."""
    if cfg.teacher_tokens == 0:
        return None, None
    t0, text = time.time(), teacher_text(train)
    ids = torch.tensor(vocab.encode(text))
    log(f"teacher text: {len(text):,} characters, {len(ids):,} tokens; forcing "
        f"{min(cfg.teacher_tokens, len(ids)):,} of them")
    data = teacher_forced(model, ids, cfg.teacher_tokens, log, cfg.teacher_targets == "exact")
    kept = [(data["targets"][..., i] >= 0).float().mean().item() for i in range(cfg.heads)]
    log("teacher-forced positions with a target, heads 1..h: " + " ".join(f"{k:.0%}" for k in kept))
    return data, {"tokens": data["tokens"].numel(), "text_chars": len(text), "text_tokens": len(ids),
                  "targets": cfg.teacher_targets, "with_target": kept,
                  "text_sha256": hashlib.sha256(text.encode()).hexdigest(),
                  "window": TEACHER_WINDOW, "steps": cfg.teacher_steps, "batch_size": TEACHER_BATCH,
                  "seconds_forcing": round(time.time() - t0)}


def smollm_record(trainee, weight, tune, cfg, log, ids=None, label=""):
    """The training record: held-out agreement with greedy per head and plain BPD's replayed
    block efficiency with 1..h heads (on the tune continuations `tune`)."""
    preds, exit_preds = held_out(trainee, weight, tune, ids)
    agree = agreement(preds, tune["targets"])
    exit_agree = agreement(exit_preds, tune["targets"][..., 0])
    h = tune["targets"].shape[-1]
    be = {n: replay_heads(preds, tune["tokens"], n) for n in range(1, h + 1)}
    log(f"tune{label} agreement with greedy, heads 1..h: " + " ".join(f"{a:.0%}" for a in agree)
        + f"; early exit after {EXIT_LAYERS} blocks: {exit_agree:.0%}")
    log(f"tune{label} block efficiency (replayed BPD) with 1..h heads: "
        + " ".join(f"{b:.2f}" for b in be.values()))
    keep = ("steps", "lr", "warmup", "batch_size", "heads", "seed", "head_form")
    return {**{k: getattr(cfg, k) for k in keep}, "gen_tokens": GEN_TOKENS,
            "exit_layers": EXIT_LAYERS, "tune_greedy_agreement": agree,
            "tune_exit_agreement": exit_agree, "torch": str(torch.__version__),
            "tune_block_efficiency_by_heads": {str(n): b for n, b in be.items()}}
