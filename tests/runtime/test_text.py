"""The corpus's cleaning and its fixed split (train_heads.py: clean_text, split_corpus)."""
import pytest

import train_heads


@pytest.mark.assignment3
@pytest.mark.assignment4
def test_clean_and_split():
    text = "Title\n*****\n\n\n+----+----+\n| a  |   b |\nSome    words   here.\n"
    assert train_heads.clean_text(text) == "Title\n\n| a | b |\nSome words here.\n"
    parts = train_heads.split_corpus("x" * 100_000)
    assert sum(len(v) for v in parts.values()) == 100_000
    assert len(parts["test"]) == len(parts["tune"]) == 4000      # chunks 18, 38 and 19, 39 of 50
