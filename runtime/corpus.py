"""corpus: a checkpoint's text side (runtime/checkpoint.py reads the file and builds the model):
text checked to be Unicode, characters <-> token ids (or a tokenizer's own encode), and text
mapped into a vocabulary's characters. The corpus itself (cleaning, the split) is
train_heads.py's. Only the standard library."""
import string
import unicodedata


def check_unicode(text):
    """A str that is Unicode text, or a ValueError: not bytes, and no lone surrogate such as the
    '\\udcff' Python makes of a command-line argument's bytes that are not UTF-8 (a tokenizer
    would raise a bare TypeError)."""
    if not isinstance(text, str):
        hint = ": decode the bytes first, e.g. data.decode('utf-8')" \
            if isinstance(text, (bytes, bytearray)) else ""
        raise ValueError(f"encode takes a str, got a {type(text).__name__}{hint}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"the text holds a lone surrogate, {text[e.start]!r} at character "
                         f"{e.start}, which is not Unicode text (Python makes these of bytes "
                         "that are not UTF-8, e.g. in a command-line argument): pass UTF-8 "
                         "text") from None


def encode(text, vocab):
    """Characters -> token ids, with a clear error for characters the model never saw. A vocab
    with its own encode (smollm_gguf.Vocab: byte-level BPE, nothing unknown) encodes itself."""
    if not isinstance(vocab, (str, list, tuple)):   # a tokenizer (smollm_gguf.Vocab)
        return vocab.encode(text)
    stoi = {c: i for i, c in enumerate(vocab)}
    unknown = sorted({c for c in text if c not in stoi})
    if unknown:
        shown = ", ".join(repr(c) for c in unknown[:10])
        raise ValueError(f"the text contains characters the model never saw in training: {shown}; "
                         f"it knows {known_characters(vocab)}")
    return [stoi[c] for c in text]


def decode(tokens, vocab):
    if not isinstance(vocab, (str, list, tuple)):
        return vocab.decode(tokens)
    return "".join(vocab[t] for t in tokens)


def known_characters(vocab):
    """A short description of a vocabulary, e.g. "a-z, A-Z, 0-9 and ' !#(),.:' (68 in all)"."""
    runs = [r for r in (string.ascii_lowercase, string.ascii_uppercase, string.digits)
            if set(r) <= set(vocab)]
    rest = "".join(c for c in vocab if not any(c in r for r in runs))
    return ", ".join(f"{r[0]}-{r[-1]}" for r in runs) + (" and " if runs and rest else "") + \
        (repr(rest) if rest else "") + f" ({len(vocab)} in all)"


# Characters outside a vocabulary become ONE known character (a tab a space, a backquote a quote,
# an accented letter its base letter, typographic quotes and dashes ASCII ones) or are dropped.
# One character to at most one: lengths only shrink, a span of a text stays a span.
ASCII_LOOKALIKES = {"\t": " ", "\u00a0": " ", "`": "'", "\u2018": "'", "\u2019": "'",
                    "\u2032": "'", "\u201c": '"', "\u201d": '"', "\u00ab": '"', "\u00bb": '"',
                    "\u2013": "-", "\u2014": "-", "\u2010": "-", "\u2011": "-", "\u2212": "-",
                    "\u00d7": "x", "\u2026": "."}


def char_map(c, known):
    """The character standing in for c ('' to drop it), given the set of known characters."""
    if c in known:
        return c
    if ASCII_LOOKALIKES.get(c) in known:
        return ASCII_LOOKALIKES[c]
    base = [b for b in unicodedata.normalize("NFKD", c) if not unicodedata.combining(b)]
    return base[0] if len(base) == 1 and base[0] in known else ""


def to_vocab(text, vocab, counts=None):
    """`text` with every character outside `vocab` mapped (char_map) or dropped; counts (a dict,
    optional) tallies {"mapped" | "dropped": {char: n}}."""
    if not isinstance(vocab, (str, list, tuple)):   # a tokenizer: every text encodes
        return text
    known = set(vocab)
    unknown = sorted(set(text) - known)
    for c in unknown if counts is not None else ():
        tally = counts.setdefault("mapped" if char_map(c, known) else "dropped", {})
        tally[c] = tally.get(c, 0) + text.count(c)
    table = {c: char_map(c, known) for c in unknown}
    return "".join(table.get(c, c) for c in text) if unknown else text
