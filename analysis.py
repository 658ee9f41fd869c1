"""The demo, the command-line generator and the benchmark behind `python minibpd.py`.

Block efficiency (tokens per serial model call) is exact and machine-independent; wall-clock is
measured as ratios inside one run, after a warm-up, as the median of several repetitions.
"""
import json
import random
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import lattice
from minibpd import (ArgmaxDrafter, bpd_decode, build_model, decode, encode, greedy_decode,
                     load_checkpoint, resolve_device, window_start)
from ngram import NgramLM

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def load(args):
    """(model, checkpoint) on the requested device and dtype."""
    device = resolve_device(args.device)
    return load_checkpoint(args.checkpoint, device, DTYPES[args.dtype])


def split_text(ck, name):
    """A split's text from the checkpoint (saved at training time, so it never depends on which
    Python's pydoc_data is installed here)."""
    return ck.get("splits", {}).get(name) or ""


def make_prompts(text, vocab, n, length=64):
    """n prompts of `length` characters, evenly spaced over `text`, each starting at a line."""
    if n < 1:
        raise ValueError(f"--prompts must be >= 1, got {n}")
    if len(text) < 2 * length:
        raise ValueError(f"the prompt text has {len(text)} characters; need at least {2 * length}")
    prompts = []
    for i in range(n):
        pos = (len(text) - 2 * length) * i // max(1, n - 1) if n > 1 else 0
        nl = text.find("\n", pos, pos + length)
        pos = nl + 1 if nl >= 0 else pos
        prompts.append(encode(text[pos:pos + length], vocab))
    return prompts


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
        self.model, self.ck, self.lms, self._small = model, ck, {}, None

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
        """(NgramLM, its numpy lookup table) of this order, fitted on the train split."""
        if order not in self.lms:
            train = encode(split_text(self.ck, "train"), self.ck["vocab"])
            lm = NgramLM(order, self.model.config.vocab_size).fit(train)
            self.lms[order] = (lm, lattice.NgramTable(lm))
        return self.lms[order]


def make_drafter(name, res, s, full=None):
    """A fresh drafter for one decoder name with settings s; `full` (prompt + greedy) for oracle."""
    if name == "bpd":
        return ArgmaxDrafter()
    if name == "neural":
        return lattice.NeuralDrafter(res.small_lm(), s["k"], s["alpha"])
    if name in ("ngram", "pbest"):
        p = 1 if name == "ngram" else s["p"]
        return lattice.PBestDrafter(s["k"], p, s["alpha"], *res.ngram(s["order"]), name=name)
    if name == "pbest0":
        return lattice.PBestDrafter(s["k"], s["p"], 0.0, None, name=name)
    if name == "oracle":
        return lattice.OracleDrafter(full, s["k"])
    raise ValueError(f"unknown decoder {name!r}; choose from greedy, bpd, {', '.join(DEFAULTS)}")


def run_decoder(model, name, drafter, prompt, n):
    """-> (tokens, calls). 'greedy' is greedy_decode; every other name is bpd_decode + drafter."""
    if name == "greedy":
        return greedy_decode(model, prompt, n), n
    out, stats = bpd_decode(model, prompt, n, drafter)
    return out, stats["calls"]


def median_time(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def timings(model, named, prompts, n, reps=5):
    """Tokens/s of each decoder over all prompts: one warm-up, then the median of `reps`
    repetitions, the decoders interleaved so that machine noise hits them alike."""
    for name, d in named.items():
        run_decoder(model, name, d, prompts[0], min(n, 16))
    times = {name: [] for name in named}
    for _ in range(reps):
        for name, d in named.items():
            times[name].append(median_time(lambda: [run_decoder(model, name, d, p, n)
                                                    for p in prompts], 1))
    return {name: len(prompts) * n / statistics.median(t) for name, t in times.items()}


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
            hits = [next((j for j in range(1, m + 1) if d[j] != full[pending + j]), m + 1) - 1
                    for d in drafts]
            row = hits.index(max(hits))
            gained = hits[row] + 1
            stats["steps"].append({"context": known, "pending": pending, "drafts": drafts,
                                   "winner": row, "accepted": gained})
        known += gained
        stats["calls"] += 1
        stats["accepted"].append(gained)
    stats["block_efficiency"] = n / stats["calls"]
    return stats


# ----------------------------------------------------------------------------- --prompt

def generate(args):
    model, ck = load(args)
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if not args.prompt:
        raise ValueError("the prompt is empty: pass some text, e.g. --prompt 'The import statement'")
    prompt, n = encode(args.prompt, ck["vocab"]), args.max_new_tokens
    greedy = greedy_decode(model, prompt, n)
    drafter = None
    if args.decoder != "greedy":
        cfg = settings_for(ck, args).get(args.decoder, {})
        drafter = make_drafter(args.decoder, Resources(model, ck), cfg, prompt + greedy)
    out, calls = run_decoder(model, args.decoder, drafter, prompt, n)
    print(args.prompt + decode(out, ck["vocab"]))
    print(f"[{args.decoder}: {len(out)} tokens in {calls} calls, block efficiency "
          f"{len(out) / calls:.2f}, identical to greedy: {'yes' if out == greedy else 'NO'}]",
          file=sys.stderr)
    return 0 if out == greedy else 1


# ----------------------------------------------------------------------------- --demo

def show(tokens, vocab):
    return decode(tokens, vocab).replace("\n", "⏎")


def marks(draft, full, pending):
    """•: the certain greedy token; ✓ accepted (equals greedy); ✗ first miss; · never checked."""
    ok = next((j for j in range(1, len(draft)) if draft[j] != full[pending + j]), len(draft))
    return "•" + "".join("✓" if j < ok else "✗" if j == ok else "·" for j in range(1, len(draft))), ok


def draw_steps(model, res, cfg, stats, full, plen, vocab, limit=5):
    """The first BPD calls: the heads guess (predict), the base model checks (verify), the prefix
    equal to greedy is kept (accept; Stern §3); under each, the refined drafts from the same
    context and head log-probs (Kim §7), with the tokens each would have gained."""
    heads = heads_along(model, full, plen)
    drafters = {name: make_drafter(name, res, cfg.get(name)) for name in ["bpd"] + REFINED}
    print("\n  how the drafts are checked (• = head 1, the base model's own token; ✓ = equals "
          "greedy, kept; ✗ = first miss, the base model's token replaces it):")
    for step in stats["steps"][:limit]:
        known = step["context"]
        pending, m = known - 1, len(step["drafts"][0]) - 1
        print(f"    after '…{show(full[max(plen, known - 24):known - 1], vocab)}':")
        for name, drafter in drafters.items():
            d = drafter(heads[pending][:m + 1], full[:known])
            best = max(d, key=lambda x: marks(x, full, pending)[1])
            tick, ok = marks(best, full, pending)
            more = f" (best of {len(d)})" if len(d) > 1 else ""
            print(f"      {name:7s} '{show(best, vocab)}'  {tick}  +{ok}{more}")


def demo(args):
    model, ck = load(args)
    vocab, n = ck["vocab"], min(args.max_new_tokens, 160)
    prompt = random.Random(args.seed).choice(make_prompts(split_text(ck, "test"), vocab, 8, 80))
    res, cfg = Resources(model, ck), settings_for(ck, args)
    print(f"minibpd demo: {ck['config']['n_bpd_heads']} BPD heads on a "
          f"{sum(p.numel() for p in model.parameters()):,}-parameter character GPT "
          f"({ck['corpus']['name']}), {next(model.parameters()).device}\n")
    print(f"prompt (test split): '{show(prompt, vocab)}'")
    greedy = greedy_decode(model, prompt, n)
    print(f"greedy, {n} calls: '{show(greedy, vocab)}'\n")
    all_same = True
    for name in ["bpd"] + REFINED + ["oracle"]:
        out, stats = bpd_decode(model, prompt, n, make_drafter(name, res, cfg.get(name), prompt + greedy))
        all_same &= out == greedy
        if name == "bpd":
            bpd_stats = stats
        sets = ", ".join(f"{a}={b}" for a, b in (cfg.get(name) or {}).items())
        print(f"  {name:7s} {stats['calls']:3d} calls, block efficiency {stats['block_efficiency']:.2f}"
              f"  {'identical to greedy ✓' if out == greedy else 'DIFFERENT from greedy ✗'}  {sets}")
    draw_steps(model, res, cfg, bpd_stats, prompt + greedy, len(prompt), vocab)
    timed = {"greedy": None, "bpd": ArgmaxDrafter()}
    tps = timings(model, timed, [prompt], n, reps=3)
    print(f"\nwall-clock on this machine (median of 3): greedy {tps['greedy']:.0f} tok/s, "
          f"BPD {tps['bpd']:.0f} tok/s: {tps['bpd'] / tps['greedy']:.2f}x "
          "(`--bench` times every decoder)")
    return 0 if all_same else 1


# ----------------------------------------------------------------------------- --bench

def bench_prompts(ck, args):
    if args.text:
        try:
            with open(args.text, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"cannot read --text {args.text} as UTF-8: {e}") from None
    else:
        text = split_text(ck, "test")
    return make_prompts(text, ck["vocab"], args.prompts)


def ngram_perplexities(res, ck, orders=(1, 2, 3, 4, 5)):
    """Held-out (test split) perplexity of the n-gram LM of each order, fitted on train."""
    test = encode(split_text(ck, "test"), ck["vocab"])
    return {str(o): res.ngram(o)[0].perplexity(test) for o in orders}


def exactness(model, res, cfg, prompts, greedy, n, names):
    """Block efficiency (tokens / calls over all prompts) and identical-to-greedy per decoder."""
    be, same = {"greedy": 1.0}, {"greedy": True}
    for name in names:
        calls, ok = 0, True
        for p, g in zip(prompts, greedy):
            out, stats = bpd_decode(model, p, n, make_drafter(name, res, cfg.get(name), p + g))
            calls, ok = calls + stats["calls"], ok and out == g
        be[name], same[name] = len(prompts) * n / calls, ok
    return be, same


def bench(args):
    model, ck = load(args)
    if args.new_tokens < 1:
        raise ValueError(f"--new-tokens must be >= 1, got {args.new_tokens}")
    prompts, n = bench_prompts(ck, args), args.new_tokens
    res, cfg = Resources(model, ck), settings_for(ck, args)
    greedy = [greedy_decode(model, p, n) for p in prompts]
    be, same = exactness(model, res, cfg, prompts, greedy, n, ["bpd"] + REFINED + ["oracle"])
    timed = {"greedy": None, **{k: make_drafter(k, res, cfg.get(k)) for k in ["bpd"] + REFINED}}
    tps = timings(model, timed, prompts, n)
    result = {"block_efficiency": be, "identical_to_greedy": same, "tokens_per_s": tps,
              "speedup_vs_greedy": {k: v / tps["greedy"] for k, v in tps.items()},
              "prompts": len(prompts), "new_tokens": n, "checkpoint": args.checkpoint,
              "settings": cfg, "ngram_perplexity": ngram_perplexities(res, ck)}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_bench(result, model)
    return 0 if all(same.values()) else 1


def print_bench(r, model):
    print(f"{r['prompts']} prompts x {r['new_tokens']} new tokens, {r['checkpoint']}, "
          f"{next(model.parameters()).device}\n")
    print(f"  {'decoder':8s} {'block eff.':>10s} {'vs bpd':>8s} {'= greedy':>9s} {'tok/s':>8s} "
          f"{'speedup':>8s}  settings")
    be, tps = r["block_efficiency"], r["tokens_per_s"]
    for k in be:
        t = f"{tps[k]:8.0f} {tps[k] / tps['greedy']:7.2f}x" if k in tps else f"{'-':>8s} {'-':>8s}"
        rel = f"{100 * (be[k] / be['bpd'] - 1):+7.1f}%" if k not in ("greedy", "bpd") else ""
        sets = ", ".join(f"{a}={b}" for a, b in r["settings"].get(k, {}).items())
        print(f"  {k:8s} {be[k]:10.3f} {rel:>8s} {'yes' if r['identical_to_greedy'][k] else 'NO':>9s}"
              f" {t}  {sets}")
    print("\n  n-gram held-out perplexity by order: " + ", ".join(
        f"{o}: {v:.2f}" for o, v in r["ngram_perplexity"].items()))
