"""ids: the integer checks every request goes through (runtime/loop.py, contract.py and the
decoders' settings): an int that is not a bool (is_int), and a sequence of token ids as a list of
ints, refusing bools of every kind (token_ids). Only the standard library."""
import numbers
from operator import index


def is_int(x):
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


BOOLS = ("torch.bool", "bool")      # the dtypes of torch's and numpy's bools, by name


def token_ids(items):
    """A sequence of integer token ids as a new list of ints; TypeError otherwise (bools too:
    True is not a token, nor is a torch or numpy bool, which index() reads as 1)."""
    if isinstance(items, (str, bytes)) or str(getattr(items, "dtype", "")) in BOOLS:
        raise TypeError("not token ids")
    items = list(items)
    if any(type(t) is not int and (isinstance(t, bool) or str(getattr(t, "dtype", "")) in BOOLS)
           for t in items):
        raise TypeError("a bool is not a token id")
    return [index(t) for t in items]
