"""request: a decode request checked before any model call (the prompt, the number of new
tokens, the temperature), the one check sample_decode and bpd_decode share."""
from runtime.ids import is_int, token_ids
from runtime.kvcache import check_cache_budget
from runtime.sampling import own_generator


def check_request(model, prompt, max_new_tokens, temperature=0.0, generator=None):
    """Clear errors for a bad request, before any model call. -> (the prompt as a new list, the
    generator the decode loop draws from: sampling.own_generator)."""
    try:
        seq = token_ids(prompt)
    except TypeError:
        raise ValueError("the prompt must be a sequence of integer token ids (not bools)") from None
    if not seq:
        raise ValueError("the prompt is empty: give at least one token")
    V = model.config.vocab_size
    if min(seq) < 0 or max(seq) >= V:
        raise ValueError(f"prompt token ids must lie in [0, {V})")
    if not is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    check_cache_budget(model, 1)                # before a cache is allocated
    return seq, own_generator(generator, temperature)
