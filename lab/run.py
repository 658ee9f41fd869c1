"""run: what one measurement of the lab decodes, built once (lab/modes.py) and handed down to the
bench, the tuner, the analyses, the tasks, the approximate section and the scale map: every
section of a report reuses its greedy continuations and replay items.
"""
import dataclasses
from dataclasses import dataclass, field

import torch

import decoders
from lab import analysis
from minibpd import greedy_decode


@dataclass
class Run:
    """One measurement's inputs. model and ck are res's (one place of truth); greedy, answers and
    items are decoded once, on first use (greedy may also be given, when decoded elsewhere)."""
    res: decoders.Resources       # the drafters' resources; res.model is the model every call runs
    chosen: dict                  # {decoder: its settings}
    prompts: list = ()            # token ids of each prompt (--tasks: each task's, on())
    n: object = None              # new tokens: one number, or a list of one per prompt
    temperature: float = 0.0      # 0: greedy; T > 0: every decoder samples the base model at T
    seed: int = 0                 # seeds `generator` (and the bench's distribution check)
    verify: str = "auto"          # bpd_decode's verify: auto, batch or tree
    greedy: list = None           # greedy's continuation of each prompt: given, or decoded once
    generator: torch.Generator = None     # what sampling draws from, in turn: seeded by `seed`
    _items: list = field(default=None, init=False, repr=False)

    def __post_init__(self):
        if self.generator is None:
            self.generator = torch.Generator().manual_seed(self.seed)

    @property
    def model(self):
        return self.res.model

    @property
    def ck(self):
        return self.res.ck

    @property
    def lengths(self):
        """New tokens per prompt: [n] * prompts, or n itself when it is a list."""
        return list(self.n) if isinstance(self.n, (list, tuple)) else [self.n] * len(self.prompts)

    def continuations(self):
        """-> greedy: greedy_decode's continuation of each prompt (lengths), decoded on the first
        call only."""
        if self.greedy is None:
            self.greedy = [greedy_decode(self.model, p, k)
                           for p, k in zip(self.prompts, self.lengths)]
        return self.greedy

    @property
    def answers(self):
        """prompt + greedy continuation, per prompt: exactness's reference, the oracle's answer
        key and what the offline replays run along."""
        return [p + g for p, g in zip(self.prompts, self.continuations())]

    def answer_keys(self):
        """What each prompt's drafter is built with (decoders.make's answer): the answers where
        greedy is decoded anyway (temperature 0) or an active decoder peeks (the oracle), else
        None per prompt (sampling: no greedy decode for nothing)."""
        peeks = any(d.peeks for d in decoders.active().values())
        return self.answers if self.temperature == 0 or peeks else [None] * len(self.prompts)

    @property
    def items(self):
        """analysis.prepare's [(prompt length, answer, heads' log-probs {position: [h, V]})], for
        the offline replays of every analysis; computed once."""
        if self._items is None:
            self._items = analysis.prepare(self.model, self.prompts, None, self.continuations())
        return self._items

    def on(self, prompts, n, greedy=None):
        """The same resources, settings and options on other prompts (greedy decoded anew,
        unless given)."""
        return dataclasses.replace(self, prompts=prompts, n=n, greedy=greedy)
