"""lookup: prompt lookup decoding, a drafter in neither paper (Saxena 2023, "Prompt Lookup
Decoding"; Hugging Face transformers' `prompt_lookup_num_tokens`): copy what followed the last
time the context's tail was seen, verified beside BPD's own draft (decoders `lookup`,
`lookup_pbest`; docs/lookup.md). Its copy may run past the heads (max_draft_tokens).
"""
from decoders.budgets import check_settings, within_budget
from minibpd import ArgmaxDrafter, is_int

MAX_LOOKUP_NGRAM = 16   # ours: longer n-grams cost index entries and hardly ever match anew


def check_ngram(ngram):
    if not is_int(ngram) or not 1 <= ngram <= MAX_LOOKUP_NGRAM:
        raise ValueError(f"ngram must be an integer from 1 to {MAX_LOOKUP_NGRAM}, got {ngram!r}")


MAX_COPY = 1024        # ours: a draft never runs past the context window (SmolLM2's: 512)


def check_copy(copy):
    if not is_int(copy) or not 0 <= copy <= MAX_COPY:
        raise ValueError(f"copy must be an integer >= 0 (0: h - 1 tokens) and at most "
                         f"{MAX_COPY:,} (no draft runs past the context window), got {copy!r}")


def copy_source(context, ngram):
    """Where prompt lookup copies from, the readable reverse scan: for n = ngram down to 1, the
    latest earlier occurrence of the context's last n tokens (one that ends before the last
    token: never the trailing occurrence itself, though it may overlap it) -> (n, end), the
    occurrence being context[end - n + 1:end + 1]; None when no n matches."""
    for n in range(min(ngram, len(context) - 1), 0, -1):
        tail = context[-n:]
        for end in range(len(context) - 2, n - 2, -1):      # the occurrence ends at `end`
            if context[end - n + 1:end + 1] == tail:
                return n, end
    return None


def copied_continuation(context, ngram, length):
    """Prompt lookup's copy rule: the at most `length` tokens that followed copy_source's
    occurrence; [] when no n matches."""
    source = copy_source(context, ngram)
    return [] if source is None else context[source[1] + 1:source[1] + 1 + length]


class PromptLookupDrafter:
    """Prompt lookup decoding (the module's docstring) riding on BPD's heads; docs/lookup.md
    gives its rule (copied_continuation; ours: the latest earlier occurrence) and each setting.
    The drafts: the base drafter's (default ArgmaxDrafter), then the copy padded with the heads'
    argmax, unless no n matched or it is among them: max_drafts = base.max_drafts + 1; `counts`
    is the base's. copy > 0 declares max_draft_tokens = copy; nodes > 0 keeps the copy only
    within_budget. reference=True: the reverse scan in place of the index (indexed_continuation),
    the same drafts. One drafter object serves one sequence at a time (the drafter contract)."""

    def __init__(self, ngram=3, base=None, name="lookup", reference=False, copy=0, nodes=0):
        check_ngram(ngram)
        check_copy(copy)
        check_settings(nodes=nodes)
        self.base = ArgmaxDrafter() if base is None else base
        self.ngram, self.name, self.reference, self.copy = ngram, name, reference, int(copy)
        self.nodes = nodes
        if copy:
            self.max_draft_tokens = int(copy)
        self.max_drafts = getattr(self.base, "max_drafts", 1) + 1
        self.counts = getattr(self.base, "counts", {})
        self.seen, self.last = [], {}       # the context indexed; n-gram tuple -> its last end

    record = False      # lab/trace.py turns it on: each call then keeps what explain() reads

    def __call__(self, logprobs, context):
        drafts = self.base(logprobs, context)
        most = self.copy or len(logprobs) - 1
        copy = (copied_continuation(context, self.ngram, most) if self.reference
                else self.indexed_continuation(context, most))
        if self.record:
            self.last_call = (list(context), copy)
        if not copy:
            return drafts
        heads = logprobs[1 + len(copy):].argmax(-1).tolist()   # the positions the copy misses
        draft = [context[-1]] + copy + heads
        drafts = drafts if draft in drafts else drafts + [draft]
        return within_budget(drafts, self.nodes) if self.nodes else drafts

    def explain(self):
        """The last call (record on), for lab/trace.py: the copy and where in the context it came
        from (copy_source, the readable scan: the index finds the same occurrence), and the base
        drafter's explain() where it has one (lookup_pbest: pbest's lattice)."""
        context, copy = self.last_call
        source = copy_source(context, self.ngram) if copy else None
        n, end = source or (0, None)
        said = {"kind": "lookup", "ngram": self.ngram, "copy": copy, "matched": n,
                "match_start": None if end is None else end - n + 1,
                "copy_start": None if end is None else end + 1}
        if callable(getattr(self.base, "explain", None)) and getattr(self.base, "record", False):
            said["base"] = self.base.explain()
        return said

    def indexed_continuation(self, context, length):
        """copied_continuation by the index: O(len(context)) to check that the context extends
        the one indexed, then O(new tokens x ngram) to index them (all of it when rebuilt)."""
        if context[:len(self.seen)] != self.seen:            # another sequence: start afresh
            self.seen, self.last = [], {}
        for end in range(max(0, len(self.seen) - 1), len(context) - 1):   # never the last token
            for n in range(1, min(self.ngram, end + 1) + 1):
                self.last[tuple(context[end - n + 1:end + 1])] = end   # later ends overwrite
        self.seen = list(context)
        for n in range(min(self.ngram, len(context) - 1), 0, -1):
            end = self.last.get(tuple(context[-n:]))
            if end is not None:
                return context[end + 1:end + 1 + length]
        return []
