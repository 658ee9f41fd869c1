"""Resources: what the drafter factories need (the base model, the small rescorer LM, n-gram LMs
and their tables), built once on first use and shared between threads under one lock."""
import copy
import threading

from decoders.fastlattice import NgramTable
from decoders.viterbi import NgramAutomaton
from ngram import NgramLM
from runtime.checkpoint import build_model, family_module, retrain, train_kind
from runtime.corpus import encode


def split_text(ck, name):
    """A split's text from the checkpoint (saved at training time, so it never depends on which
    Python's pydoc_data is installed here); "" where it has none, a clear error where its
    splits are not {split: text}."""
    splits = ck.get("splits", {})
    if not isinstance(splits, dict) or not isinstance(splits.get(name, ""), str):
        shown = type(splits).__name__ if not isinstance(splits, dict) else \
            f"a {type(splits[name]).__name__} for {name!r}"
        raise ValueError(f"the checkpoint's 'splits' must be {{split: text}}, got {shown}; "
                         f"{retrain(ck.get('path'), train_kind(ck))}")
    return splits.get(name) or ""


class Resources:
    """What the drafter factories need (the module's docstring); tests pass `small` and `lms`.
    The n-gram LMs are fitted on the train split only. reference=True (`--reference`, the one
    switch of the readable path): self.model is a view of the model whose head_logits runs each
    head one by one, and the factories build the readable drafters (best_paths, the plain
    neural loop)."""

    def __init__(self, model, ck=None, small=None, lms=None, reference=False, text=None):
        if reference:      # the one switch: the model's heads one by one, every drafter readable
            model = copy.copy(model)
            model.reference = True
        self.model, self.ck, self._small, self.reference = model, ck or {}, small, reference
        self.lms, self.tables, self.text = dict(lms or {}), {}, text
        self._train_ids = None            # train_text() as token ids, once
        self.lock = threading.RLock()      # re-entrant: automaton() builds ngram() inside

    def train_text(self):
        """What the n-gram LMs are fitted on: `text` (an in-domain control) or the checkpoint's
        train split (its pretraining corpus: task-independent, as Kim's C4 n-grams)."""
        return self.text if self.text is not None else split_text(self.ck, "train")

    def small_lm(self):
        """The rescorer of 'neural' (Kim §7.1): the checkpoint's small GPT, or what its model
        family builds (SmolLM2: an early exit of the base model itself, smollm.EarlyExit)."""
        with self.lock:
            if self._small is None:
                if "rescorer" not in self.ck:
                    raise ValueError("this checkpoint has no rescorer LM for 'neural'; "
                                     f"{retrain(self.ck.get('path'), train_kind(self.ck))}")
                family = family_module(self.ck)
                if family is not None:
                    self._small = family.rescorer(self.model, self.ck).eval()
                else:
                    w, path = self.model.lm_head.weight, self.ck.get("path")
                    self._small = build_model(self.ck["rescorer_config"], self.ck["rescorer"],
                                              w.device, w.dtype, "the checkpoint's rescorer",
                                              path, train_kind(self.ck))
            return self._small

    def ngram(self, order):
        """The NgramLM of this order, fitted on train_text() (tokenized once: SmolLM2's BPE
        takes a second for its train split)."""
        with self.lock:
            if order not in self.lms:
                if self._train_ids is None:
                    self._train_ids = encode(self.train_text(), self.ck["vocab"])
                self.lms[order] = NgramLM(order, self.model.config.vocab_size).fit(self._train_ids)
            return self.lms[order]

    def table(self, order):
        """Its numpy lookup table, for p-best's DP in the decode loop."""
        with self.lock:
            if order not in self.tables:
                self.tables[order] = NgramTable(self.ngram(order))
            return self.tables[order]

    def automaton(self, order):
        """Its back-off automaton, for the p = 1 Viterbi; every row built up front when they fit
        viterbi.EAGER_BYTES (else on first use: the rows then persist across drafters)."""
        with self.lock:
            if ("automaton", order) not in self.tables:
                self.tables["automaton", order] = NgramAutomaton(self.ngram(order), eager=None)
            return self.tables["automaton", order]
