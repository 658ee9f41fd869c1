"""HeadSampler: the drafter of decoder 'sampled', BPD's drafts drawn from the heads at T > 0."""
import torch
import torch.nn.functional as F

from minibpd import ArgmaxDrafter


class HeadSampler(ArgmaxDrafter):
    """Samples each draft token from its head's own distribution q_i = softmax(head_i / T) and
    declares q, so verification uses the textbook rule min(1, p/q) with residual max(0, p - q)
    (sampling.py). Beside the deterministic drafters (q = one-hot) it shows both halves of the
    rule. At temperature 0 it drafts each head's argmax: plain BPD."""
    name = "sampled"

    def sample(self, logprobs, context, temperature, generator=None):
        """-> ([draft], q [m, V]): q[i] is the distribution draft token i was drawn from."""
        q = F.softmax(logprobs.double().cpu() / temperature, dim=-1)       # [m, V]
        drawn = torch.multinomial(q[1:], 1, generator=generator).view(-1).tolist() if len(q) > 1 else []
        return [[context[-1]] + drawn], q
