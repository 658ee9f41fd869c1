"""Offline evaluation and the paper's analyses (Kim et al. 2024, §6 and §7), at small scale.

Heads are causal, so one forward pass over a prompt plus its greedy continuation gives every
head's distribution at every position; replaying the decode steps against the known greedy
tokens then gives each drafter's exact accepted lengths without a single verification call
(`replay`, proven equal to `bpd_decode` in test_refine.py). That makes sweeps over k, p and alpha
cheap, and it is what the repetition, head-confidence, oracle and win/tie/loss analyses use.
"""
import itertools
import json
import math

import torch
import torch.nn.functional as F

import lattice
from minibpd import ArgmaxDrafter, build_model, encode, greedy_decode, matched, window_start
from ngram import NgramLM


def split_text(ck, name):
    """A split's text from the checkpoint (saved at training time, so it never depends on which
    Python's pydoc_data is installed here)."""
    return ck.get("splits", {}).get(name) or ""


# ----------------------------------------------------------------------------- decoders

# Settings used when no tuned file exists; `python minibpd.py --tune` chooses them on the tune
# split and writes them next to the checkpoint (CHECKPOINT.tuned.json), where the bench reads them.
DEFAULTS = {"neural": {"k": 8, "alpha": 0.5}, "ngram": {"k": 8, "alpha": 0.5, "order": 4},
            "pbest0": {"k": 8, "p": 16}, "pbest": {"k": 8, "p": 16, "alpha": 0.5, "order": 4},
            "oracle": {"k": 8}}
REFINED = ["neural", "ngram", "pbest0", "pbest"]


def tuned_path(checkpoint):
    return checkpoint + ".tuned.json"


def settings_for(ck, args):
    """Per-method settings: tuned file (if any), then --k / --p / --alpha overrides."""
    cfg = {name: dict(v) for name, v in DEFAULTS.items()}
    try:
        with open(tuned_path(args.checkpoint)) as f:
            for name, v in json.load(f)["settings"].items():
                cfg.setdefault(name, {}).update(v)
    except (OSError, ValueError, KeyError):
        pass                                    # no (valid) tuned file: the defaults above
    for key in ("k", "p", "alpha"):
        value = getattr(args, key, None)
        for name in cfg:
            if value is not None and key in cfg[name]:
                cfg[name][key] = value
    for s in cfg.values():
        lattice.check_settings(s.get("k", 1), s.get("p", 1), s.get("alpha", 0.0), s.get("order", 1))
    return cfg


class Resources:
    """What the refined drafters need from a checkpoint, built once: the small rescorer LM and
    n-gram LMs of each order, fitted on the train split only."""

    def __init__(self, model, ck):
        self.model, self.ck, self.lms, self.tables, self._small = model, ck, {}, {}, None

    def small_lm(self):
        if self._small is None:
            if "rescorer" not in self.ck:
                raise ValueError("this checkpoint has no rescorer LM for 'neural'; "
                                 "retrain it with `python train_heads.py`")
            w = self.model.lm_head.weight
            self._small = build_model(self.ck["rescorer_config"], self.ck["rescorer"], w.device,
                                      w.dtype, "the checkpoint's rescorer")
        return self._small

    def ngram(self, order):
        """The NgramLM of this order, fitted on the train split."""
        if order not in self.lms:
            train = encode(split_text(self.ck, "train"), self.ck["vocab"])
            self.lms[order] = NgramLM(order, self.model.config.vocab_size).fit(train)
        return self.lms[order]

    def table(self, order):
        """Its numpy lookup table, for the DP in the decode loop."""
        if order not in self.tables:
            self.tables[order] = lattice.NgramTable(self.ngram(order))
        return self.tables[order]


def make_drafter(name, res, s, full=None):
    """A fresh drafter for one decoder name with settings s; `full` (prompt + greedy) for oracle."""
    if name == "bpd":
        return ArgmaxDrafter()
    if name == "neural":
        return lattice.NeuralDrafter(res.small_lm(), s["k"], s["alpha"])
    if name in ("ngram", "pbest"):
        p = 1 if name == "ngram" else s["p"]
        return lattice.PBestDrafter(s["k"], p, s["alpha"], res.ngram(s["order"]),
                                    res.table(s["order"]), name=name)
    if name == "pbest0":
        return lattice.PBestDrafter(s["k"], s["p"], 0.0, None, name=name)
    if name == "oracle":
        return lattice.OracleDrafter(full, s["k"])
    raise ValueError(f"unknown decoder {name!r}; choose from greedy, bpd, {', '.join(DEFAULTS)}")


# ----------------------------------------------------------------------------- offline replay

@torch.no_grad()
def heads_along(model, seq, first):
    """Log-probs of all heads at every position t >= first of seq, as the decode loop computes
    them (context seq[window_start(t):t]): {t: [h, V]}. Heads are causal, so one forward pass
    per window position gives them all (Kim §6 analyses; makes sweeps cheap)."""
    B, dev, out, t = model.config.block_size, model.lm_head.weight.device, {}, first
    while t < len(seq):
        s = window_start(t, B)
        end = min(s + B, len(seq) - 1)                  # the last t that shares this window
        z = model(torch.tensor([seq[s:end]], device=dev))[0]              # [end - s, C]
        logp = F.log_softmax(model.head_logits(z[t - 1 - s:]), dim=-1)    # [end - t + 1, h, V]
        out.update({t + i: row for i, row in enumerate(logp)})
        t = end + 1
    return out


def replay(drafter, heads, full, plen, n, h, B):
    """Replays bpd_decode's steps against the known greedy continuation full = prompt + greedy:
    the same drafts and accepted lengths, with no verification calls. -> stats like bpd_decode
    (steps also record 'pending', the position of each draft's first, certain token)."""
    known, stats = plen + 1, {"calls": 1, "accepted": [1], "steps": []}
    while known - plen < n:
        left, pending = n - (known - plen), known - 1
        m = min(h - 1, left, window_start(known, B) + B - known)
        gained = 1
        if m > 0:
            drafts = drafter(heads[pending][:m + 1], full[:known])
            gains = [gain(d, full, pending) for d in drafts]
            row = gains.index(max(gains))                       # the first of the longest
            gained = gains[row]
            stats["steps"].append({"context": known, "pending": pending, "drafts": drafts,
                                   "winner": row, "accepted": gained})
        known += gained
        stats["calls"] += 1
        stats["accepted"].append(gained)
    stats["block_efficiency"] = n / stats["calls"]
    return stats


def gain(draft, full, pending):
    """Tokens one verification call gains with this draft: its first token (certain) and then
    every token equal to greedy up to the first miss, whose place the base model's token takes."""
    return 1 + matched(draft[1:], full[pending + 1:pending + len(draft)])


def marks(draft, full, pending):
    """•: the certain greedy token; ✓ accepted (equals greedy); ✗ first miss; · never checked."""
    ok = gain(draft, full, pending)
    return "•" + "".join("✓" if j < ok else "✗" if j == ok else "·" for j in range(1, len(draft))), ok


# ----------------------------------------------------------------------------- the paper's analyses

def prepare(model, prompts, n, greedy=None):
    """Greedy continuation and heads' log-probs of each prompt, computed once for every analysis:
    [(prompt length, full = prompt + greedy, heads {position: [h, V]})]."""
    greedy = greedy or [greedy_decode(model, p, n) for p in prompts]
    return [(len(p), p + g, heads_along(model, p + g, len(p))) for p, g in zip(prompts, greedy)]


def replay_all(model, items, n, make):
    """Replay a drafter over every prepared prompt; make(full) -> a fresh drafter."""
    h, B = model.config.n_bpd_heads, model.config.block_size
    return [replay(make(full), heads, full, plen, n, h, B) for plen, full, heads in items]


def block_eff(runs, n):
    return len(runs) * n / sum(r["calls"] for r in runs)


def longest_run(tokens):
    best = cur = 1
    for a, b in zip(tokens, tokens[1:]):
        cur = cur + 1 if a == b else 1
        best = max(best, cur)
    return best


def repetition(drafts):
    """Kim §6.1: the share of adjacent positions holding the same token, and the mean length of
    the longest run of one repeated token, over a list of drafts (token lists)."""
    pairs = sum(len(d) - 1 for d in drafts)
    same = sum(a == b for d in drafts for a, b in zip(d, d[1:]))
    return {"adjacent_repeat": same / max(1, pairs),
            "longest_run": sum(map(longest_run, drafts)) / max(1, len(drafts))}


def repetition_table(runs_by_name, items):
    """Each drafter's own drafts (p-best: its best-scoring path), and the greedy text itself over
    the same windows as BPD's drafts, so natural repetition ('ll', '  ') is not blamed on heads."""
    out = {name: repetition([s["drafts"][0] for r in runs for s in r["steps"]])
           for name, runs in runs_by_name.items()}
    windows = [full[s["context"] - 1:s["context"] - 1 + len(s["drafts"][0])]
               for (_, full, _), r in zip(items, runs_by_name["bpd"]) for s in r["steps"]]
    out["greedy_text"] = repetition(windows)
    return out


def head_confidence(items):
    """Kim §6.2: mean entropy (nats) of each head, h_max (the last head up to which the mean
    entropy rises monotonically, 1-based) and each head's top-1 accuracy against greedy."""
    lps, targets = [], []
    for _, full, heads in items:
        ts = sorted(heads)
        lp = torch.stack([heads[t] for t in ts]).double().cpu()           # [T, h, V]
        pos = torch.tensor(ts)[:, None] + torch.arange(lp.shape[1])       # [T, h]: head i's target
        lps.append(lp)
        targets.append(torch.tensor(full + [-1] * lp.shape[1])[pos])      # -1: past the end
    lp, target = torch.cat(lps), torch.cat(targets)
    entropy = (-(lp.exp() * lp).sum(-1).mean(0)).tolist()                 # [h]
    valid = target >= 0
    accuracy = (((lp.argmax(-1) == target) & valid).sum(0) / valid.sum(0)).tolist()
    hmax = 1
    while hmax < len(entropy) and entropy[hmax] > entropy[hmax - 1]:
        hmax += 1
    return {"head_entropy": entropy, "hmax": hmax, "head_accuracy": accuracy}


def win_tie_loss(items, bpd_runs, res, cfg, names=("neural", "pbest")):
    """Kim §7.3, step by step on BPD's own contexts (its runs, one per prepared prompt): how
    often each refined drafter gains more, the same, or fewer tokens than BPD's draft, and the
    share of its wins where BPD's first miss was a repeated token (d_j == d_{j-1}) that the
    refined draft replaced."""
    out = {}
    for name in names:
        drafter, w, t, l, fixes = make_drafter(name, res, cfg.get(name)), 0, 0, 0, 0
        for (plen, full, heads), run in zip(items, bpd_runs):
            for s in run["steps"]:
                base, pending = s["drafts"][0], s["context"] - 1
                drafts = drafter(heads[pending][:len(base)], full[:s["context"]])
                new = max(gain(d, full, pending) for d in drafts)
                j = s["accepted"]                                    # BPD's first miss
                w, t, l = w + (new > j), t + (new == j), l + (new < j)
                fixes += new > j and base[j] == base[j - 1]
        total = max(1, w + t + l)
        out[name] = {"win": w / total, "tie": t / total, "loss": l / total,
                     "wins_replacing_repeat": fixes / max(1, w)}
    return out


def be_of(model, items, n, res, name, s):
    """Block efficiency of one decoder with settings s, by offline replay."""
    return block_eff(replay_all(model, items, n, lambda full: make_drafter(name, res, s, full)), n)


def oracle_by_k(model, items, n, res, ks=(1, 2, 4, 8, 16)):
    """Kim §6.3: oracle block efficiency of the top-k lattice for each k (k = 1 is plain BPD)."""
    return {str(k): be_of(model, items, n, res, "oracle", {"k": k}) for k in ks}


def relative_gain(be, oracle_at):
    """Kim Table 4 form: each refined drafter's block efficiency relative to BPD (percent), and
    the share of the BPD-to-oracle gap it closes (oracle at the drafter's own k)."""
    out = {}
    for name in REFINED:
        if name in be:
            gap = oracle_at[name] - be["bpd"]
            out[name] = {"percent": 100 * (be[name] / be["bpd"] - 1),
                         "gap_closed": (be[name] - be["bpd"]) / gap if gap > 0 else 0.0}
    return out


class FirstHeads:
    """Plain BPD that uses only the first j heads (the sweep over the number of heads)."""
    max_drafts = 1

    def __init__(self, j):
        self.j = j

    def __call__(self, logprobs, context):
        return [logprobs[:self.j].argmax(-1).tolist()]


def lattice_lookups(positions, k, V, order):
    """(context, token) n-gram evaluations the p-best DP makes on a lattice of `positions`
    positions (the first certain): at position i, one per state x candidate."""
    K = [1] + [min(k, V)] * (positions - 1)
    return sum(math.prod(K[max(0, i - order + 1):i + 1]) for i in range(positions))


def greedy_processed(plen, n, B):
    """Tokens greedy decoding runs the model on: the prompt (its window), one token per step,
    and the whole window again each time the window moves (window_start jumps)."""
    total, prev = 0, None
    for t in range(plen, plen + n):
        s = window_start(t, B)
        total += t - s if s != prev else 1
        prev = s
    return total


def cost(model, res, cfg, online, prompts, n, tps):
    """Per generated token: base calls, tokens the base model ran on, small-LM calls, n-gram
    lookups; FLOPs estimated as 2 x parameters x tokens run, as a ratio to greedy, next to the
    measured wall-clock ratio (time per token / greedy's)."""
    params = lambda m: sum(p.numel() for p in m.parameters()) - m.pos_emb.weight.numel()
    N, B, V = params(model), model.config.block_size, model.config.vocab_size
    tokens = len(prompts) * n
    greedy_flops = N * sum(greedy_processed(len(p), n, B) for p in prompts)
    out = {}
    for name, runs in online.items():
        steps = [s for r in runs for s in r["steps"]]
        s = cfg.get(name) or {}
        small = sum(len(st["drafts"][0]) - 1 for st in steps) if name == "neural" else 0
        lookups = sum(lattice_lookups(len(st["drafts"][0]), s["k"], V, s["order"]) for st in steps
                      ) if name in ("ngram", "pbest") else 0
        flops = N * sum(r["processed"] for r in runs) + (params(res.small_lm()) * small if small else 0)
        out[name] = {"base_calls": sum(r["calls"] for r in runs) / tokens,
                     "base_tokens": sum(r["processed"] for r in runs) / tokens,
                     "small_lm_calls": small / tokens, "ngram_lookups": lookups / tokens,
                     "flop_ratio": flops / greedy_flops,
                     "wall_clock_ratio": tps["greedy"] / tps[name] if name in tps else None}
    return out


def sweep(model, items, n, res, cfg):
    """Block efficiency as a function of k, p, alpha and the number of heads used (tune split)."""
    h = model.config.n_bpd_heads
    with_ = lambda name, **kw: {**(cfg.get(name) or {}), **kw}
    return {
        "k": {name: {str(k): be_of(model, items, n, res, name, with_(name, k=k))
                     for k in (1, 2, 4, 8)} for name in ("neural", "ngram", "pbest0", "pbest")},
        "p": {str(p): be_of(model, items, n, res, "pbest", with_("pbest", p=p))
              for p in (1, 2, 4, 8, 16, 32)},
        "alpha": {name: {str(a): be_of(model, items, n, res, name, with_(name, alpha=a))
                         for a in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)} for name in ("neural", "pbest")},
        "heads": {str(j): block_eff(replay_all(model, items, n, lambda full: FirstHeads(j)), n)
                  for j in range(1, h + 1)}}


TUNE_GRID = {"neural": {"k": [8, 16], "alpha": [0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]},
             "ngram": {"k": [8], "order": [3, 4, 5], "alpha": [0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]},
             "pbest": {"k": [8], "p": [16], "order": [3, 4, 5],
                       "alpha": [0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]},
             "pbest0": {"k": [8], "p": [16]}, "oracle": {"k": [8]}}


def tune(model, items, n, res, log=print):
    """Grid search on the tune split (never the test split): for each method, the setting with
    the highest block efficiency (ties: the first in grid order). k = 8 and p = 16 for the
    lattice methods: the exact DP at k = 16 costs ~35 ms a step here (see README)."""
    chosen, scores = {}, {}
    for name, grid in TUNE_GRID.items():
        keys, best = list(grid), None
        for values in itertools.product(*grid.values()):
            s = dict(zip(keys, values))
            be = be_of(model, items, n, res, name, s)
            scores[f"{name} " + " ".join(f"{k}={v}" for k, v in s.items())] = be
            log(f"  {name:7s} {s}: block efficiency {be:.3f}")
            if best is None or be > best[0]:
                best = (be, s)
        chosen[name] = best[1]
    return chosen, scores
