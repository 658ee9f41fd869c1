"""Offline evaluation and the paper's analyses (Kim et al. 2024, §6 and §7), at small scale.

Heads are causal, so one forward pass over a prompt plus its greedy continuation gives every
head's distribution at every position; replaying the decode steps against the known greedy
tokens then gives each drafter's exact accepted lengths without a single verification call
(`replay`, tested equal to `bpd_decode` in tests/decoders/test_refine.py). That makes sweeps over k, p and alpha
cheap, and it is what the repetition, head-confidence, oracle and win/tie/loss analyses use.
The analyses take a lab.run.Run, whose `items` (prepare's) are computed once for all of them.
"""
import itertools

import torch
import torch.nn.functional as F

import decoders
from minibpd import ArgmaxDrafter, accept_longest, draft_budget, greedy_decode, window_start
from runtime.contract import max_draft_tokens
from runtime.kvcache import device_of, prefill_length
from runtime.tree import draft_tree


# ----------------------------------------------------------------------------- offline replay

@torch.no_grad()
def states_along(model, seq, first):
    """The final hidden states that predict every position t >= first of seq, each in the context
    the decode loop gives it (seq[window_start(t):t]): one forward pass per window position,
    since the model is causal. Yields (t, z [L, C]): z[i] predicts position t + i."""
    B, dev, t = model.config.block_size, device_of(model), first
    while t < len(seq):
        s = window_start(t, B)
        end = min(s + B, len(seq) - 1)                  # the last t that shares this window
        ids = torch.tensor([seq[s:end]], device=dev)    # greedy's prefill first, as it ran
        kw = {"prefix": prefill_length(s, t - s, B)} if hasattr(model, "prefilled") else {}
        z = model(ids, **kw)[0]          # [end - s, C]; a prefill apart (llama) as greedy's
        yield t, z[t - 1 - s:]                                          # [end - t + 1, C]
        t = end + 1


@torch.no_grad()
def heads_along(model, seq, first):
    """Log-probs of all heads at every position t >= first of seq, as the decode loop computes
    them: {t: [h, V]} (Kim §6 analyses; makes sweeps cheap)."""
    out = {}
    for t, z in states_along(model, seq, first):
        logp = F.log_softmax(model.head_logits(z), dim=-1)              # [L, h, V]
        out.update({t + i: row for i, row in enumerate(logp)})
    return out


def replay(drafter, heads, answer, plen, n, h, B):
    """Replays bpd_decode's steps against the known greedy continuation answer = prompt + greedy:
    the same drafts and accepted lengths, with no verification calls (the decode loop's own
    draft_budget and accept_longest). heads: {position t: the heads' outputs there} (heads_along's
    log-probs; anything the drafter reads). -> stats like bpd_decode (steps also record
    'pending', the position of each draft's first, certain token)."""
    known, stats = plen + 1, {"calls": 1, "accepted": [1], "steps": []}
    reach = max_draft_tokens(drafter, h)
    while known - plen < n:
        m, pending, gained = draft_budget(known, plen + n, reach, B), known - 1, 1
        if m > 0:
            drafts = [d[:m + 1] for d in drafter(heads[pending][:m + 1], answer[:known])]
            row, drafted = accept_longest(drafts, [answer[pending + 1:pending + 2 + m]] * len(drafts))
            gained = drafted + 1
            stats["steps"].append({"context": known, "pending": pending, "drafts": drafts,
                                   "winner": row, "accepted": gained})
        known += gained
        stats["calls"] += 1
        stats["accepted"].append(gained)
    stats["block_efficiency"], stats["new_tokens"] = n / stats["calls"], n
    return stats


def gain(draft, answer, pending):
    """Tokens one verification call gains with this draft: its first token (certain) and then
    every token equal to greedy up to the first miss, whose place the base model's token takes."""
    return 1 + accept_longest([draft], [answer[pending + 1:pending + len(draft)]])[1]


def marks(draft, answer, pending):
    """•: the certain greedy token; ✓ accepted (equals greedy); ✗ first miss; · never checked."""
    ok = gain(draft, answer, pending)
    return "•" + "".join("✓" if j < ok else "✗" if j == ok else "·" for j in range(1, len(draft))), ok


# ----------------------------------------------------------------------------- the paper's analyses

def prepare(model, prompts, n, greedy=None):
    """Greedy continuation and heads' log-probs of each prompt, computed once for every analysis:
    [(prompt length, answer = prompt + greedy, heads {position: [h, V]})]."""
    greedy = greedy or [greedy_decode(model, p, n) for p in prompts]
    return [(len(p), p + g, heads_along(model, p + g, len(p))) for p, g in zip(prompts, greedy)]


def replay_all(run, make, h=None):
    """Replay a drafter over every prompt of a lab.run.Run (its items: each for its own greedy
    continuation's length) with heads 1..h (default all); make(answer) -> a fresh drafter."""
    h, B = h or run.model.config.n_bpd_heads, run.model.config.block_size
    return [replay(make(answer), heads, answer, plen, len(answer) - plen, h, B)
            for plen, answer, heads in run.items]


def block_eff(runs):
    """Block efficiency of several runs together: new tokens / serial calls."""
    return sum(r["new_tokens"] for r in runs) / sum(r["calls"] for r in runs)


def longest_run(tokens):
    return max((len(list(run)) for _, run in itertools.groupby(tokens)), default=1)


def repetition(drafts):
    """Kim §6.1: the share of adjacent positions holding the same token, and the mean length of
    the longest run of one repeated token, over a list of drafts (token lists)."""
    pairs = sum(len(d) - 1 for d in drafts)
    same = sum(a == b for d in drafts for a, b in zip(d, d[1:]))
    return {"adjacent_repeat": same / max(1, pairs),
            "longest_run": sum(map(longest_run, drafts)) / max(1, len(drafts))}


def repetition_table(runs_by_name, items):
    """Each drafter's own drafts (p-best: its best-scoring path), and the greedy text itself over
    the same windows as BPD's drafts, so natural repetition ('ll', '  ') is not blamed on heads;
    for the greedy text also phrase_repeat, the share of it inside a repeated 12-token phrase."""
    out = {name: repetition([s["drafts"][0] for r in runs for s in r["steps"]])
           for name, runs in runs_by_name.items()}
    windows = [answer[s["context"] - 1:s["context"] - 1 + len(s["drafts"][0])]
               for (_, answer, _), r in zip(items, runs_by_name["bpd"]) for s in r["steps"]]
    out["greedy_text"] = {**repetition(windows),      # and loops, which adjacent repeats miss:
                          "phrase_repeat": phrase_repetition_all([a[p:] for p, a, _ in items])}
    return out


def entropy_of(lp):
    """Entropy (nats) of each distribution of log-probs lp [..., V] -> [...]."""
    return -(lp.exp() * lp).sum(-1)


def entropy_quantiles(items, qs=(0.05, 0.25, 0.5, 0.75, 0.95)):
    """Kim §6.2, Fig. 3a: the distribution of each head's entropy (nats) over the positions of
    analysis.prepare's items, not only its mean (head_confidence): {quantiles: qs, by_head: [[the
    qs of head i's entropies]], mean: [h], positions: how many}. In float64, one item at a time:
    SmolLM2's [positions, h, V] log-probs of all items together take gigabytes."""
    e = torch.cat([entropy_of(torch.stack([heads[t] for t in sorted(heads)]).double().cpu())
                   for _, _, heads in items])                            # [N, h]
    q = torch.quantile(e, torch.tensor(qs, dtype=e.dtype), dim=0)        # [len(qs), h]
    return {"quantiles": list(qs), "by_head": q.T.tolist(), "mean": e.mean(0).tolist(),
            "positions": len(e)}


def head_confidence(items):
    """Kim §6.2: mean entropy (nats) of each head and h_max (the last head up to which the mean
    entropy rises monotonically, 1-based); plus, our addition (not in the paper), each head's
    top-1 accuracy against greedy."""
    lps, targets = [], []
    for _, answer, heads in items:
        ts = sorted(heads)
        lp = torch.stack([heads[t] for t in ts]).double().cpu()           # [T, h, V]
        pos = torch.tensor(ts)[:, None] + torch.arange(lp.shape[1])       # [T, h]: head i's target
        lps.append(lp)
        targets.append(torch.tensor(answer + [-1] * lp.shape[1])[pos])      # -1: past the end
    lp, target = torch.cat(lps), torch.cat(targets)
    entropy = entropy_of(lp).mean(0).tolist()                             # [h]
    valid = target >= 0
    accuracy = (((lp.argmax(-1) == target) & valid).sum(0) / valid.sum(0)).tolist()
    hmax = 1
    while hmax < len(entropy) and entropy[hmax] > entropy[hmax - 1]:
        hmax += 1
    return {"head_entropy": entropy, "hmax": hmax, "head_accuracy": accuracy}


def compared_steps(run, bpd_runs):
    """Kim §7.3's comparison, step by step on BPD's own contexts (bpd_runs: its runs, one per
    prompt of the lab.run.Run `run`): {refined drafter (run's settings): [(BPD's draft, the
    drafter's draft that verification keeps (the one gaining most, the first of ties), BPD's
    gain, the drafter's gain)]}. What win_tie_loss and loss_repeats count."""
    out = {}
    for name in decoders.refined():
        drafter, rows = decoders.make(name, run.res, run.chosen[name]), []
        for (plen, answer, heads), bpd in zip(run.items, bpd_runs):
            for s in bpd["steps"]:
                base, pending = s["drafts"][0], s["context"] - 1
                drafts = drafter(heads[pending][:len(base)], answer[:s["context"]])
                gains = [gain(d, answer, pending) for d in drafts]
                kept = gains.index(max(gains))
                rows.append((base, drafts[kept], s["accepted"], gains[kept]))
        out[name] = rows
    return out


def win_tie_loss(compared):
    """Kim §7.3, Table 5, from compared_steps' rows: how often each refined drafter gains more,
    the same, or fewer tokens than BPD's draft, and the share of its wins where BPD's first miss
    was a repeated token (d_j == d_{j-1}) that the refined draft replaced."""
    out = {}
    for name, rows in compared.items():
        w, t, l, fixes = 0, 0, 0, 0
        for base, _, j, new in rows:                                 # j: BPD's first miss
            w, t, l = w + (new > j), t + (new == j), l + (new < j)
            fixes += new > j and repeats_at(base, j)     # j = len(base): BPD missed nothing
        total = max(1, w + t + l)
        out[name] = {"win": w / total, "tie": t / total, "loss": l / total,
                     "wins_replacing_repeat": fixes / max(1, w),
                     "counts": {"steps": w + t + l, "win": w, "tie": t, "loss": l,
                                "wins_replacing_repeat": fixes}}
    return out


def repeats_at(draft, i):
    """Whether draft[i] repeats the token before it; False past the draft's end (a copy that
    outruns BPD's draft, as prompt lookup's, or a draft shorter than BPD's)."""
    return i < len(draft) and draft[i] == draft[i - 1]


def introduces_repeat(base, draft):
    """Kim §6.1's consecutive repetition, pair by pair: True when the draft holds a token equal
    to the one before it at a position where BPD's draft `base` does not."""
    return any(draft[i] == draft[i - 1] and base[i] != base[i - 1]
               for i in range(1, min(len(base), len(draft))))


def loss_repeats(compared):
    """Kim §7.3, Table 5's losing side (docs/results/paper-extras.md; the position-by-position
    rule and the first-miss count are ours): of the steps each refined drafter lost to BPD
    (compared_steps' rows whose gain is below BPD's), the share where its draft introduced a
    consecutive repetition BPD's draft did not have (introduces_repeat, anywhere in the draft),
    and the share where that repeat is its first miss m (d_m == d_{m-1}: it cost the step; BPD's
    token there is greedy's, so BPD's draft cannot hold it)."""
    out = {}
    for name, rows in compared.items():
        lost = [(base, d, new) for base, d, j, new in rows if new < j]
        anywhere = sum(introduces_repeat(base, d) for base, d, _ in lost)
        at_miss = sum(repeats_at(d, m) and not repeats_at(base, m) for base, d, m in lost)
        out[name] = {"introduced_repeat": anywhere / max(1, len(lost)),
                     "lost_on_repeat": at_miss / max(1, len(lost)),
                     "counts": {"steps": len(rows), "loss": len(lost),
                                "introduced_repeat": anywhere, "lost_on_repeat": at_miss}}
    return out


def verify_tokens(runs):
    """Draft tokens the base model runs on per call, verifying as P rows ('batch': P x m) or as
    one token tree ('tree': each distinct prefix once), from the drafts the runs recorded."""
    calls = sum(r["calls"] for r in runs)
    steps = [[d[1:] for d in s["drafts"]] for r in runs for s in r["steps"]]
    return {"batch": sum(len(e) * len(e[0]) for e in steps) / calls,
            "tree": sum(len(draft_tree(e)[0]) for e in steps) / calls}


def be_of(run, name, s, res=None):
    """Block efficiency of one decoder with settings s on a lab.run.Run's prompts, by offline
    replay; its drafters built from `res` (an in-domain control), default run.res."""
    res = res or run.res
    return block_eff(replay_all(run, lambda answer: decoders.make(name, res, s, answer)))


def be_by_heads(run):
    """Kim Table 1: plain BPD's block efficiency on a lab.run.Run's prompts with heads 1..j only
    (Stern's block size k = j), by offline replay, for every j = 1..h -> {"1": ..., "h": ...}."""
    return {str(j): block_eff(replay_all(run, lambda answer: ArgmaxDrafter(), j))
            for j in range(1, run.model.config.n_bpd_heads + 1)}


def oracle_by_k(run, ks=(1, 2, 4, 8, 16)):
    """Kim §6.3: oracle block efficiency of the top-k lattice for each k (k = 1 is plain BPD)."""
    return {str(k): be_of(run, "oracle", {"k": k}) for k in ks}


def relative_gain(be, oracle_at):
    """Each refined drafter's block efficiency relative to BPD (percent; the form of Kim Table 4,
    which reports block efficiency only), and the share of the BPD-to-oracle gap it closes
    (oracle at the drafter's own k; None where that oracle is no better than BPD: no k, lookup)."""
    out = {}
    for name in decoders.refined():
        if name in be:
            gap = oracle_at[name] - be["bpd"]
            out[name] = {"percent": 100 * (be[name] / be["bpd"] - 1),
                         "gap_closed": (be[name] - be["bpd"]) / gap if gap > 1e-9 else None}
    return out


def greedy_processed(plen, n, B):
    """Tokens greedy decoding runs the model on: the prompt (its window), one token per step,
    and the whole window again each time the window moves (window_start jumps)."""
    total, prev = 0, None
    for t in range(plen, plen + n):
        s = window_start(t, B)
        total += t - s if s != prev else 1
        prev = s
    return total


def cost(run, online, work, tps):
    """Per generated token of a lab.run.Run (online: {name: its runs}, decoded for real): base
    calls, tokens the base model ran on, and the drafters' own work as they counted it (`work`:
    {name: summed drafter counts}: small-LM calls, n-gram lookups); FLOPs estimated as 2 x
    parameters x tokens run (base model and small LM), as a ratio to greedy, next to the measured
    wall-clock ratio (tps: tokens/s; time per token / greedy's). Our table: Kim et al. analyse
    cost in their Fig. 2 and an appendix table (KV-cache I/O, parameter I/O, FLOPs)."""
    N, B, n, res = run.model.flop_params(), run.model.config.block_size, run.n, run.res
    tokens, base = len(run.prompts) * n, decoders.baseline_name(0)
    greedy_flops = N * sum(greedy_processed(len(p), n, B) for p in run.prompts)
    out = {}
    for name, runs in online.items():
        w = work.get(name, {})
        small = w.get("small_lm_tokens", 0)
        flops = N * sum(r["processed"] for r in runs) + (res.small_lm().flop_params() * small if small else 0)
        out[name] = {"base_calls": sum(r["calls"] for r in runs) / tokens,
                     "base_tokens": sum(r["processed"] for r in runs) / tokens,
                     "small_lm_calls": w.get("small_lm_calls", 0) / tokens,
                     "ngram_lookups": w.get("ngram_lookups", 0) / tokens,
                     "flop_ratio": flops / greedy_flops,
                     "wall_clock_ratio": tps[base] / tps[name] if name in tps else None}
    return out


SWEEP = {"k": (1, 2, 4, 8), "p": (1, 2, 4, 8, 16, 32), "alpha": (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)}


def sweep(run):
    """Block efficiency on a lab.run.Run's prompts (the tune split's; run.n new tokens each) as a
    function of the number of heads used (plain BPD) and of each setting in SWEEP, the others at
    run's, for every refined decoder that has it."""
    chosen = run.chosen
    out = {"heads": be_by_heads(run)}
    for key, values in SWEEP.items():
        out[key] = {name: {str(v): be_of(run, name, {**chosen[name], key: v})
                           for v in values} for name in decoders.refined() if key in chosen[name]}
    return out


OBJECTIVES = ("block_efficiency", "tokens_per_s")


def tune(run, log=print, objective="block_efficiency", speed=None):
    """Grid search on a lab.run.Run's prompts, of the tune split (never the test split): for
    each decoder with a grid, the setting with the highest objective (ties: the first in grid
    order). block_efficiency comes from the offline replay; tokens_per_s from speed(name,
    settings), a timed decode (decoders that peek at the answer are never timed: they keep block
    efficiency). Settings that only buy speed (decoders.SPEED_SETTINGS) keep their defaults under
    block_efficiency."""
    chosen, scores, w = {}, {}, decoders.label_width(decoders.DECODERS) - 1
    for name, dec in decoders.DECODERS.items():
        timed = objective == "tokens_per_s" and not dec.peeks
        grid = {k: v for k, v in dec.grid.items() if timed or k not in decoders.SPEED_SETTINGS}
        if not grid:
            continue
        keys, best = list(grid), None
        for values in itertools.product(*grid.values()):
            s = {**dec.defaults, **dict(zip(keys, values))}
            be = be_of(run, name, s)
            score = speed(name, s) if timed else be
            key = f"{name} " + " ".join(f"{k}={v}" for k, v in zip(keys, values))
            scores[key] = {"block_efficiency": be, "tokens_per_s": score} if timed else be
            log(f"  {name:{w}s} {dict(zip(keys, values))}: block efficiency {be:.3f}"
                + (f", {score:.0f} tok/s" if timed else ""))
            if best is None or score > best[0]:
                best = (score, dict(zip(keys, values)))
        chosen[name] = best[1]
    return chosen, scores


# ----------------------------------------------------------------------------- phrase loops

def repeated_positions(tokens, span=12):
    """Which tokens of one output lie inside a repeated phrase: [len(tokens)] bools, True at i
    when some span-long window containing i equals a window that starts earlier in the same
    `tokens` (the earlier one may overlap it, so a run 'aaaa...' or a short cycle counts from its
    second period on; the first occurrence never counts). Pass the generated tokens only: a
    phrase copied once from the prompt is ordinary text (a name, a keyword), a loop repeats
    within the model's own output."""
    if isinstance(span, bool) or not isinstance(span, int) or span < 1:
        raise ValueError(f"span must be an int >= 1, got {span!r}")
    seen, out = set(), [False] * len(tokens)
    for s in range(len(tokens) - span + 1):
        key = tuple(tokens[s:s + span])
        if key in seen:                      # seen holds only windows that start before s
            out[s:s + span] = [True] * span
        seen.add(key)
    return out


def phrase_repetition_all(outputs, span=12):
    """Our guard for loops (not in Kim et al.: §6.1's adjacent repetition sees 'll' and runs of
    one token, not a repeated phrase like '"__del__()", "__del__()", '): the share of the
    generated tokens of several outputs (lists of generated tokens) that lie inside a span-long
    phrase repeated in their own output (repeated_positions). Every generated token counts once,
    as in the adjacent measure; 0.0 for no tokens."""
    marked = [m for out in outputs for m in repeated_positions(out, span)]
    return sum(marked) / max(1, len(marked))


# ----------------------------------------------------------------------------- quality of the output
# The tasks' metrics (tasks.QUALITY names one per task): exact match for extractive QA, a
# character-level ROUGE-L F1 for the rest, so a reader sees the model is not degenerate.

def exact_match(pred, ref):
    """1.0 if the two are equal after stripping surrounding whitespace, else 0.0 (SQuAD's EM)."""
    return float(pred.strip() == ref.strip())


def lcs(a, b):
    """Length of the longest common subsequence of two strings: O(len(a) * len(b)) DP, one row."""
    row = [0] * (len(b) + 1)
    for x in a:
        prev_diag, row[0] = 0, 0
        for j, y in enumerate(b, 1):
            prev_diag, row[j] = row[j], (prev_diag + 1 if x == y else max(row[j], row[j - 1]))
    return row[-1]


def rouge_l(pred, ref):
    """Character-level ROUGE-L F1 (Lin 2004 with beta = 1): 2PR / (P + R), P = LCS / len(pred),
    R = LCS / len(ref), on the stripped strings; 1.0 for two empty strings."""
    pred, ref = pred.strip(), ref.strip()
    if not pred or not ref:
        return float(pred == ref)
    n = lcs(pred, ref)
    return 2 * n / (len(pred) + len(ref))       # = 2PR / (P + R)


METRICS = {"exact_match": exact_match, "rouge_l": rouge_l}   # by name (tasks.QUALITY names one)
