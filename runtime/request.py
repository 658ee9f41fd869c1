"""request: a decode request checked before any model call (the prompt, the number of new
tokens), the one check sample_decode and bpd_decode share."""
from runtime.kvcache import is_int, token_ids


def check_request(model, prompt, max_new_tokens):
    """Clear errors for a bad request, before any model call. -> the prompt as a new list."""
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
    return seq
