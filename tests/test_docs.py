"""The docs hold together: every relative markdown link in README.md and docs/ resolves,
to a file and, where the link names one, a heading of it (GitHub's anchors); README.md stays a
one-sitting read (<= 150 lines) and docs/real-model.md an explanation (<= 250 lines)."""
import os
import re
import unicodedata

import pytest

from conftest import ROOT

LIMITS = {"README.md": 150, os.path.join("docs", "real-model.md"): 250}
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def markdown_files():
    """README.md and every .md under docs/, as paths relative to the repository."""
    found = ["README.md"]
    for folder, _, files in os.walk(os.path.join(ROOT, "docs")):
        found += [os.path.relpath(os.path.join(folder, f), ROOT) for f in files if f.endswith(".md")]
    return sorted(found)


def prose_lines(text, blank_code=True):
    """The lines outside fenced code blocks, inline code spans blanked (a link there is code)."""
    inside = False
    for line in text.split("\n"):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield re.sub(r"`[^`]*`", "``", line) if blank_code else line


def slug(heading):
    """GitHub's anchor of a heading: lowercase, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)            # a link keeps its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(path):
    """Every anchor of a markdown file's headings, duplicates numbered as GitHub numbers them."""
    seen, out = {}, set()
    with open(path, encoding="utf-8") as f:
        for line in prose_lines(f.read(), blank_code=False):
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                s = slug(m.group(1))
                out.add(s if s not in seen else f"{s}-{seen[s]}")
                seen[s] = seen.get(s, 0) + 1
    return out


def links(path):
    """(line number, target) of every relative link in a markdown file."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        text = f.read()
    for i, line in enumerate(prose_lines(text), 1):
        for target in LINK.findall(line):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):          # http:, mailto:, ...
                yield i, target


def broken(path, target):
    """Why a link from `path` does not resolve, or None."""
    file, _, anchor = target.partition("#")
    where = os.path.join(ROOT, path) if not file else \
        os.path.normpath(os.path.join(ROOT, os.path.dirname(path), file))
    if not os.path.exists(where):
        return f"no file {os.path.relpath(where, ROOT)}"
    if anchor and not where.endswith(".md"):
        return f"an anchor into {os.path.relpath(where, ROOT)}, which is not markdown"
    if anchor and anchor not in anchors(where):
        return f"no heading #{anchor} in {os.path.relpath(where, ROOT)}"
    return None


@pytest.mark.parametrize("path", markdown_files())
def test_every_relative_link_resolves(path):
    bad = [f"{path}: ({target}): {why}" for _, target in links(path)
           if (why := broken(path, target))]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path, most", sorted(LIMITS.items()))
def test_pages_within_their_length(path, most):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        lines = f.read().rstrip("\n").count("\n") + 1
    assert lines <= most, f"{path} has {lines} lines; at most {most}"


def test_the_checker_sees_a_broken_link(tmp_path):
    """The check has power: a missing file and a missing heading are both found."""
    page = tmp_path / "page.md"
    page.write_text("# A `code` heading, here\n\n[ok](#a-code-heading-here) [bad](#nowhere) "
                    "[gone](missing.md) `[not a link](nowhere.md)`\n", encoding="utf-8")
    found = {t: broken(str(page), t) for _, t in links(str(page))}
    assert found["#a-code-heading-here"] is None and "no heading" in found["#nowhere"]
    assert "no file" in found["missing.md"] and "nowhere.md" not in found


def test_the_readme_drafter_shows_an_effect():
    """The README's example drafter must change block efficiency on the README's own prompt (one
    that scores exactly plain BPD teaches nothing), and the number quoted beside it is the one
    measured here."""
    import torch
    from minibpd import bpd_decode, load_checkpoint
    from runtime.corpus import encode
    code = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    code = next(b for b in re.findall(r"```python\n(.*?)```", code, re.S) if "bpd_decode(" in b)
    cls = re.search(r"^class (\w+):\n(?:(?:    .*)?\n)+", code, re.M)
    space = {}
    exec(cls[0], space)
    model, ck = load_checkpoint()
    prompt = encode(re.search(r'encode\("([^"]+)"', code)[1], ck["vocab"])
    with torch.no_grad():
        plain = bpd_decode(model, prompt, 100)[1]["block_efficiency"]
        mine = bpd_decode(model, prompt, 100, space[cls[1]]())[1]["block_efficiency"]
    assert abs(mine - plain) >= 0.05, (mine, plain)
    assert f"{mine:.2f}, plain BPD's {plain:.2f}" in code
