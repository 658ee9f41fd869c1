"""A Method is what the bench times and checks: the baseline (sample_decode, one token per call:
'greedy' at temperature 0, 'sample' above) or a decoder's drafter in bpd_decode."""
from decoders.registry import DECODERS, baseline_name, make
from minibpd import sample_decode
from runtime.loop import lab_decode


class Method:
    """The baseline (drafter None) or a decoder's drafter, with its acceptance rule (`accept`:
    "exact", or an APPROXIMATE one of runtime/approximate.py). decode() -> (tokens, stats)."""

    def __init__(self, name, drafter=None, refines=False, accept="exact"):
        if drafter is None and accept != "exact":
            raise ValueError(f"{name} drafts nothing: the acceptance rule {accept!r} needs a "
                             "decoder's drafter")
        self.name, self.drafter, self.accept = name, drafter, accept
        self.reps = 3 if refines else 5       # timing repetitions: the slow refined ones get fewer

    def decode(self, model, prompt, n, temperature=0.0, generator=None, verify="auto"):
        if self.drafter is None:
            return sample_decode(model, prompt, n, temperature, generator), \
                {"calls": n, "block_efficiency": 1.0, "steps": [], "new_tokens": n}
        return lab_decode(model, prompt, n, self.drafter, temperature, generator, verify, self.accept)


def method(name, res, s, answer=None, temperature=0.0, accept="exact"):
    """The Method called `name` ('greedy' or 'sample': the baseline) with settings s."""
    if name == baseline_name(temperature):
        return Method(name, accept=accept)
    return Method(name, make(name, res, s, answer), DECODERS[name].refines, accept)
