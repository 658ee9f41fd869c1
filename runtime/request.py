"""request: a decode request checked before any model call: minibpd.check_request (the prompt,
the number of new tokens, the temperature, the generator), then what the lab adds: the KV cache's
budget and the generator the loop draws from."""
import minibpd
from runtime.kvcache import check_cache_budget
from runtime.sampling import own_generator


def check_request(model, prompt, max_new_tokens, temperature=0.0, generator=None):
    """Clear errors for a bad request, before any model call. -> (the prompt as a new list, the
    generator the decode loop draws from: sampling.own_generator)."""
    seq = minibpd.check_request(model, prompt, max_new_tokens, temperature, generator)
    check_cache_budget(model, 1)                # before a cache is allocated
    return seq, own_generator(generator, temperature)
