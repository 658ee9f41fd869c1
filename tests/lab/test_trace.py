"""--trace FILE (lab/trace.py): the page's data are the run's own (calls, tokens accepted per call,
drafts, winners; its tokens decode to the output), tracing never changes what is decoded (every
decoder, T = 0 and T > 0, a plug-in without explain()), bad input is refused in one line before
any model loads, and in a real headless Chromium the page loads from a file with no console error
and no network request, shows one step per call after the prompt's, moves with its buttons and
arrow keys, and draws a lattice of k x positions cells with the winning path marked. The browser
tests skip, naming the install command, without Chromium or Selenium.
"""
import json
import os
import shutil
import tempfile
import types

import pytest
import torch

import decoders
from conftest import ROOT
from decoders.resources import Resources
from lab import cli, loading, trace
from minibpd import ArgmaxDrafter, greedy_decode, load_checkpoint
from runtime.corpus import decode, encode
from tests.helpers import heads_or_skip

SHIPPED = os.path.join(ROOT, "checkpoints", "minibpd.pt")
PROMPT = "The import statement"


def read(path):
    """A trace's data, from its .json or its page."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if not path.lower().endswith(".json"):
        start = text.index('<script id="trace-data" type="application/json">')
        text = text[text.index(">", start) + 1:text.index("</script>", start)]
    return json.loads(text)


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def shipped():
    """The shipped character model, its tuned settings and resources (LMs built once)."""
    model, ck = load_checkpoint(SHIPPED)
    chosen = decoders.settings(decoders.load_tuned(decoders.tuned_path(SHIPPED), SHIPPED))
    return model, ck, chosen, Resources(model, ck)


def decode_with(shipped, name, n, T, traced):
    """One run of decoder `name` on PROMPT, its drafter wrapped in a Recorder when traced.
    -> (tokens, stats, recorder or None)"""
    model, ck, chosen, res = shipped
    prompt = encode(PROMPT, ck["vocab"])
    answer = prompt + greedy_decode(model, prompt, n) if decoders.DECODERS[name].peeks else None
    m = decoders.method(name, res, chosen[name], answer, T)
    if traced:
        m.drafter = trace.Recorder(m.drafter)
    out, stats = m.decode(model, prompt, n, T, torch.Generator().manual_seed(0), "auto")
    return out, stats, m.drafter if traced else None


def same_run(data, out, stats):
    """The trace's data against an untraced run's tokens and stats."""
    assert data["tokens"] == out and data["calls"] == stats["calls"]
    assert data["accepted"] == stats["accepted"] and data["steps_total"] == stats["calls"] - 1
    drafted = [s for s in data["steps"] if not s.get("edge")]
    assert [s["drafts"] for s in drafted] == [[list(d) for d in s["drafts"]] for s in stats["steps"]]
    assert [s["winner"] for s in drafted] == [s["winner"] for s in stats["steps"]]
    assert [s["accepted"] for s in data["steps"]] == stats["accepted"][1:]


# ----------------------------------------------------------------------------- the data

@pytest.mark.parametrize("T", [0.0, 0.8])
@pytest.mark.parametrize("name", list(decoders.DECODERS))
def test_a_trace_changes_nothing(shipped, name, T):
    """Every decoder, traced and not: the same tokens, calls and steps; the data are the run's."""
    n = 32
    out, stats, _ = decode_with(shipped, name, n, T, traced=False)
    out2, stats2, recorder = decode_with(shipped, name, n, T, traced=True)
    assert out2 == out and stats2["accepted"] == stats["accepted"]
    assert [s["drafts"] for s in stats2["steps"]] == [s["drafts"] for s in stats["steps"]]
    model, ck, chosen, _ = shipped
    prompt = encode(PROMPT, ck["vocab"])
    data = trace.trace_data({"decoder": name}, ck["vocab"], prompt, out2, stats2, recorder.explained,
                       trace.check_of(out2, out2, T, "exact", 0))
    same_run(json.loads(json.dumps(data)), out, stats)
    assert decode(data["tokens"], ck["vocab"]) == data["output"]
    kinds = {(s["explain"] or {}).get("kind") for s in data["steps"] if not s.get("edge")}
    expected = {"pbest": "lattice", "pbest0": "lattice", "ngram": "lattice", "oracle": "lattice",
                "neural": "neural", "lookup": "lookup", "lookup_pbest": "lookup"}.get(name)
    assert kinds == {expected}, kinds
    if name == "lookup_pbest":
        assert all(s["explain"]["base"]["kind"] == "lattice" for s in data["steps"] if not s.get("edge"))


def test_lattice_cells_and_paths(shipped):
    """pbest's explanation: k candidates at each position but the first, each score the
    interpolation of its head and LM log-probs, the p best paths best first, the drafts those."""
    out, stats, recorder = decode_with(shipped, "pbest", 24, 0.0, traced=True)
    s = shipped[2]["pbest"]
    for step, said in zip(stats["steps"], recorder.explained):
        assert said["k"] == s["k"] and said["positions"] == len(step["drafts"][0])
        assert [len(c) for c in said["cells"]] == [1] + [s["k"]] * (said["positions"] - 1)
        for cell in sum(said["cells"], []):
            assert cell[3] == pytest.approx((1 - s["alpha"]) * cell[1] + s["alpha"] * cell[2])
        scores = [p["score"] for p in said["paths"]]
        assert scores == sorted(scores, reverse=True)
        assert [p["tokens"] for p in said["paths"]] == step["drafts"]


def test_the_cli_page_is_the_run(shipped, tmp_path, capsys):
    """docs/trace.md's first command (pbest, 48 new tokens): the page's data equal an untraced
    run's; stdout is the same with and without --trace; the .json holds the same data."""
    args = ["--prompt", PROMPT, "--decoder", "pbest", "--max-new-tokens", "48"]
    code, plain, _ = run_cli(capsys, *args)
    page, data_file = str(tmp_path / "t.html"), str(tmp_path / "t.json")
    code2, traced, err = run_cli(capsys, *args, "--trace", page)
    assert code == code2 == 0 and traced == plain
    assert f"trace: wrote {page}, all " in err
    data = read(page)
    out, stats, _ = decode_with(shipped, "pbest", 48, 0.0, traced=False)
    same_run(data, out, stats)
    assert plain == PROMPT + data["output"] + "\n" and data["check"]["ok"] is True
    assert run_cli(capsys, *args, "--trace", data_file)[0] == 0
    assert read(data_file) == data
    assert trace.is_trace(page) and trace.is_trace(data_file)


def test_a_plugin_without_explain(tmp_path, capsys):
    """A student's drafter (no explain(), no name): its drafts only, the run unchanged."""
    path = tmp_path / "student_trace.py"
    path.write_text("import decoders\nclass Mine:\n    max_drafts = 2\n"
                    "    def __call__(self, logprobs, context):\n"
                    "        top = logprobs.topk(2, dim=-1).indices.tolist()\n"
                    "        return [[context[-1]] + [a for a, b in top[1:]], "
                    "[context[-1]] + [b for a, b in top[1:]]]\n"
                    "decoders.register('student_trace', lambda res, s, answer: Mine())\n")
    args = ["--plugin", str(path), "--prompt", PROMPT, "--decoder", "student_trace",
            "--max-new-tokens", "24"]
    try:
        code, plain, _ = run_cli(capsys, *args)
        code2, traced, _ = run_cli(capsys, *args, "--trace", str(tmp_path / "s.html"))
    finally:
        decoders.DECODERS.pop("student_trace", None)
    assert code == code2 == 0 and traced == plain
    data = read(str(tmp_path / "s.html"))
    assert all(s["explain"] is None and len(s["drafts"]) == 2 for s in data["steps"])


class Explains:
    """A drafter whose explain() says `said` (or raises it)."""
    max_drafts = 1

    def __init__(self, said):
        self.said = said

    def __call__(self, logprobs, context):
        return [[context[-1]] + logprobs[1:].argmax(-1).tolist()]

    def explain(self):
        if isinstance(self.said, Exception):
            raise self.said
        return self.said


def test_what_explain_says_is_checked():
    """explain() failing, not JSON-able or too big: an error note, the drafts unchanged; the
    Recorder hands the drafter's attributes through (a drafter without a name: its class's)."""
    for said, note in [(ValueError("no"), "ValueError: no"), ({"x": object()}, "TypeError"),
                       ({"x": "a" * 200_000}, "bytes of JSON")]:
        recorder = trace.Recorder(Explains(said))
        assert recorder(torch.zeros(3, 5), [4]) == [[4, 0, 0]]
        assert recorder.explained[0]["kind"] == "error" and note in recorder.explained[0]["error"]
    recorder = trace.Recorder(Explains({"kind": "mine", "n": 1}))
    recorder(torch.zeros(3, 5), [4])
    assert recorder.explained == [{"kind": "mine", "n": 1}]
    assert recorder.name == "Explains" and recorder.max_drafts == 1
    assert not hasattr(recorder, "sample") and not hasattr(recorder, "max_draft_tokens")


@pytest.mark.parametrize("accept", ["top1", "min1"])
def test_exact_rules_by_another_name_say_identical(tmp_path, capsys, accept):
    """--accept top1 and min1 are the exact rule: the page agrees with the command's verdict."""
    page = str(tmp_path / "t.html")
    code, _, err = run_cli(capsys, "--prompt", PROMPT, "--max-new-tokens", "16", "--accept",
                           accept, "--trace", page)
    assert code == 0 and "identical to greedy: yes" in err, err
    check = read(page)["check"]
    assert check["kind"] == "greedy" and check["ok"] is True
    assert trace.check_of([1], [1], 0.0, "top2", 0)["kind"] == "approximate"


LATTICE = {"kind": "lattice", "k": 2, "positions": 2, "alpha": 0.0, "order": None,
           "cells": [[[4, 0.0, None, 0.0]], [[1, -0.1, None, -0.1], [2, -2.0, None, -2.0]]],
           "paths": [{"score": -0.1, "tokens": [4, 1]}]}


@pytest.mark.parametrize("bad, field", [
    ({"cells": "x"}, "cells"), ({"cells": [[[4, 0.0, None, 0.0]]]}, "cells"),
    ({"cells": [[["a", 0, 0, 0]], []]}, "cells"), ({"k": 10 ** 9}, "k"), ({"k": "2"}, "k"),
    ({"positions": None}, "positions"), ({"paths": None}, "paths"),
    ({"paths": [{"score": 0.0}]}, "paths.tokens"), ({"paths": [{"tokens": [4, 1, 1]}]}, "paths.tokens"),
    ({"order": "3"}, "order"), ({"alpha": "x"}, "alpha"),
    ({"kind": "neural", "k": 2, "alpha": 0.5, "positions": [{"chosen": 1}]}, "positions.candidates"),
    ({"kind": "lookup", "ngram": 2, "matched": 0, "copy": None}, "copy"),
    ({"kind": "lookup", "ngram": 2, "matched": 1, "copy": [3], "match_start": 0, "copy_start": 1,
      "base": {"kind": "lattice"}}, "base.positions"),
    ({"kind": "error", "error": ["no"]}, "error")])
def test_an_explanation_the_page_cannot_draw_is_refused(bad, field):
    """explain() of a kind the page draws, with a field it cannot draw (which stopped the page's
    script: a blank page): an error note naming the field, the drafts unchanged."""
    recorder = trace.Recorder(Explains({**LATTICE, **bad}))
    assert recorder(torch.zeros(2, 5), [4]) == [[4, 0]]
    note = recorder.explained[0]
    assert note["kind"] == "error" and "the page cannot draw" in note["error"], note
    assert f"field {field!r} must be" in note["error"], note
    good = trace.Recorder(Explains(LATTICE))
    good(torch.zeros(2, 5), [4])
    assert good.explained == [LATTICE]


def test_a_plugin_whose_lattice_the_page_cannot_draw(tmp_path, capsys):
    """From the command line: the run and the page go on, each step shows the error note, and
    the command warns, naming the field."""
    path = tmp_path / "bad_lattice.py"
    path.write_text("import decoders\nfrom minibpd import ArgmaxDrafter\n"
                    "class Bad(ArgmaxDrafter):\n    name = 'bad_lattice'\n"
                    "    def explain(self):\n        return {'kind': 'lattice', 'cells': 'x'}\n"
                    "decoders.register('bad_lattice', lambda res, s, answer: Bad())\n")
    page = str(tmp_path / "t.html")
    try:
        code, _, err = run_cli(capsys, "--plugin", str(path), "--prompt", PROMPT, "--decoder",
                               "bad_lattice", "--max-new-tokens", "12", "--trace", page)
    finally:
        decoders.DECODERS.pop("bad_lattice", None)
    assert code == 0 and "warning: " in err and "field 'positions' must be" in err, err
    steps = [s for s in read(page)["steps"] if not s.get("edge")]
    assert steps and all(s["explain"]["kind"] == "error" for s in steps)


class FakeInt4:
    """What the page reads of SmolLM2 in int4: 4-bit trunk products (qkv.bits) on float32 tensors."""
    config = types.SimpleNamespace(n_bpd_heads=5)
    blocks = [types.SimpleNamespace(qkv=types.SimpleNamespace(bits=4))]
    tok_emb = types.SimpleNamespace(weight=torch.zeros(2, 2))

    def parameters(self):
        return iter([self.tok_emb.weight])


def test_the_page_names_the_precision_that_ran(shipped):
    """int4 (4-bit trunk weights in float32 tensors) is said as int4, not float32; the
    character GPT's dtype as it is."""
    args = types.SimpleNamespace(temperature=0.0, seed=0, verify="auto", accept="exact")
    run = trace.describe(FakeInt4(), {"kind": "smollm2-heads"}, SHIPPED, "bpd", {}, args)
    assert run["dtype"] == "int4"
    model, ck, _, _ = shipped
    assert trace.describe(model, ck, SHIPPED, "bpd", {}, args)["dtype"] == "float32"


def test_an_int4_run_says_int4(tmp_path, capsys):
    """SmolLM2 on --dtype int4, from the command line: the page says int4."""
    page = str(tmp_path / "t.html")
    code, _, err = run_cli(capsys, "--checkpoint", heads_or_skip(), "--dtype", "int4", "--prompt",
                           "What is Python?", "--max-new-tokens", "6", "--trace", page)
    assert code == 0, err
    assert read(page)["dtype"] == "int4"


def test_a_run_too_long_is_cut(tmp_path, capsys, monkeypatch):
    """Past MAX_STEPS steps the page shows the first ones and says so; warned before the run."""
    monkeypatch.setattr(trace, "MAX_STEPS", 3)
    page = str(tmp_path / "t.html")
    code, _, err = run_cli(capsys, "--prompt", PROMPT, "--max-new-tokens", "40", "--trace", page)
    assert code == 0 and "warning: --trace shows the first 3 steps" in err
    data = read(page)
    assert len(data["steps"]) == 3 < data["steps_total"] == data["calls"] - 1
    assert f"the first 3 of {data['steps_total']} steps" in err


def test_the_demo_names_its_trace(tmp_path, capsys):
    page = str(tmp_path / "demo.html")
    code, out, _ = run_cli(capsys, "--demo", "--max-new-tokens", "30", "--decoder", "lookup",
                           "--trace", page)
    assert code == 0 and out.rstrip().endswith("lookup's run on the demo's first prompt (open it in a browser)")
    assert read(page)["decoder"] == "lookup"
    code, out, _ = run_cli(capsys, "--demo", "--max-new-tokens", "20")
    assert code == 0 and "add --trace FILE.html" in out.rstrip().splitlines()[-1]


# ----------------------------------------------------------------------------- refusals

@pytest.fixture
def no_model_load(monkeypatch):
    def load(*a, **kw):
        raise AssertionError("a model was loaded before the error")
    monkeypatch.setattr(loading, "load_fast", load)


@pytest.mark.parametrize("argv, message", [
    (["--trace", "t.txt"], "name a .html file"),
    (["--trace", "/no/such/folder/t.html"], "there is no folder /no/such/folder"),
    (["--trace", "/proc/t.html"], "not writable"),
    (["--decoder", "greedy", "--trace", "t.html"], "drafts nothing"),
])
def test_refusals(argv, message, capsys, no_model_load):
    code, _, err = run_cli(capsys, "--prompt", PROMPT, *argv)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err, err


def test_refusals_of_modes_and_files(tmp_path, capsys, no_model_load):
    folder, other = tmp_path / "d.html", tmp_path / "notes.html"
    folder.mkdir()
    other.write_text("<html>my notes</html>")
    for argv, message in [(["--bench", "--trace", "t.html"], "--trace does nothing with --bench"),
                          (["--demo", "--decoder", "lookup"], "--decoder does nothing with --demo"),
                          (["--prompt", PROMPT, "--trace", str(folder)], "is a folder"),
                          (["--prompt", PROMPT, "--trace", str(other)], "not a trace minibpd wrote")]:
        code, _, err = run_cli(capsys, *argv)
        assert code == 2 and err.count("\n") == 1 and message in err, err
    assert other.read_text() == "<html>my notes</html>"


def test_the_template_is_never_a_trace(tmp_path, capsys, no_model_load):
    """lab/trace.html (the page every trace is written from) and copies of it are no traces: not
    overwritten, and the template not even with --force."""
    copy = tmp_path / "copy.html"
    with open(trace.TEMPLATE, encoding="utf-8") as f:
        template = f.read()
    copy.write_text(template)
    os.symlink(trace.TEMPLATE, tmp_path / "link.html")
    for argv, message in [([trace.TEMPLATE], "the page template"),
                          ([trace.TEMPLATE, "--force"], "the page template"),
                          ([str(tmp_path / "link.html"), "--force"], "the page template"),
                          ([str(copy)], "not a trace minibpd wrote")]:
        code, _, err = run_cli(capsys, "--prompt", PROMPT, "--trace", *argv)
        assert code == 2 and err.count("\n") == 1 and message in err, err
    with open(trace.TEMPLATE, encoding="utf-8") as f:
        assert f.read() == template


def test_a_template_without_its_slot_is_refused(tmp_path, monkeypatch):
    """A template that lost its data slot (overwritten) would write an old run's page: refused."""
    old = tmp_path / "old.html"
    old.write_text("<html><meta content=minibpd-trace></html>")
    monkeypatch.setattr(trace, "TEMPLATE", str(old))
    with pytest.raises(ValueError, match="no data slot"):
        trace.write(str(tmp_path / "t.html"), {"format": trace.TRACE_FORMAT})
    assert not (tmp_path / "t.html").exists()


@pytest.mark.parametrize("force", [False, True])
def test_a_fifo_is_refused(tmp_path, capsys, no_model_load, force):
    """A FIFO (or any file that is not a regular one) is refused at once: opening it to read or
    write would wait forever for the other end."""
    fifo = tmp_path / "t.html"
    os.mkfifo(fifo)
    code, _, err = run_cli(capsys, "--prompt", PROMPT, "--trace", str(fifo), *["--force"] * force)
    assert code == 2 and err.count("\n") == 1 and "not a regular file" in err, err


def test_force_and_our_own_file(tmp_path, capsys):
    """An old trace of ours is overwritten; another file only with --force."""
    page, other = str(tmp_path / "t.html"), tmp_path / "other.json"
    other.write_text("{}")
    args = ["--prompt", PROMPT, "--max-new-tokens", "8", "--trace"]
    assert run_cli(capsys, *args, page)[0] == 0
    assert run_cli(capsys, *args, page)[0] == 0          # ours: no --force needed
    assert run_cli(capsys, *args, str(other), "--force")[0] == 0
    assert read(str(other))["tokens"] == read(page)["tokens"]


# ----------------------------------------------------------------------------- in a browser

INSTALL = "apt-get install -y chromium chromium-driver && pip install selenium"
# As root (CI) Chromium needs --no-sandbox; the rest keep it from calling home or updating.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars")


def browser_paths():
    """(Chromium, chromedriver) -> paths, or a FileNotFoundError naming INSTALL."""
    binary = next((p for p in ("/usr/lib/chromium/chromium", *map(shutil.which, (
        "chromium", "chromium-browser", "google-chrome"))) if p and os.path.isfile(p)), None)
    driver = shutil.which("chromedriver")
    if binary is None or driver is None:
        raise FileNotFoundError(f"Chromium or chromedriver not found: {INSTALL}")
    return binary, driver


def chrome(profile, width=1320, height=1000):
    """A headless Chromium driven by Selenium, a fresh profile in the folder `profile`, its
    console and network events logged (driver.get_log("browser"), get_log("performance")).
    ImportError or FileNotFoundError when Selenium or Chromium is missing."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    binary, driver = browser_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in FLAGS + (f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(options=options, service=Service(driver))


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium (Selenium), or a skip naming the install command."""
    try:
        import selenium  # noqa: F401
        browser_paths()
    except (ImportError, FileNotFoundError):
        pytest.skip(f"Chromium or Selenium missing: {INSTALL}")
    with tempfile.TemporaryDirectory() as profile:
        driver = chrome(profile)
        yield driver
        driver.quit()


def opened(browser, page):
    """Load the page from its file; -> (console errors, URLs requested)."""
    browser.get_log("browser"), browser.get_log("performance")      # earlier pages' entries
    url = "file://" + os.path.abspath(page)
    browser.get(url)
    errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    events = [json.loads(e["message"])["message"] for e in browser.get_log("performance")]
    urls = [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"]
    inside = ("data:", "chrome://", "chrome-extension://")    # the browser's own pages, not ours
    return errors, [u for u in urls if u != url and not u.startswith(inside)]


def where(browser):
    from selenium.webdriver.common.by import By
    return browser.find_element(By.ID, "where").text, browser.find_element(By.ID, "step").get_attribute("data-step")


def check_navigation(browser, steps):
    """Buttons and arrow keys move between the steps, and stop at the ends."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    assert where(browser) == (f"step 1 of {steps} · call 2", "0")
    click = lambda name: browser.find_element(By.ID, name).click()
    click("next")
    assert where(browser)[1] == "1" and where(browser)[0].startswith(f"step 2 of {steps}")
    click("prev")
    assert where(browser)[1] == "0"
    body = browser.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.ARROW_RIGHT)
    body.send_keys(Keys.ARROW_RIGHT)
    assert where(browser)[1] == "2"
    body.send_keys(Keys.ARROW_LEFT)
    assert where(browser)[1] == "1"
    body.send_keys(Keys.END)
    assert where(browser)[1] == str(steps - 1)
    body.send_keys(Keys.ARROW_RIGHT)                  # the last step stays the last
    assert where(browser)[1] == str(steps - 1) and not browser.find_element(By.ID, "next").is_enabled()
    body.send_keys(Keys.HOME)
    assert where(browser)[1] == "0"


def test_in_a_browser(browser, tmp_path, capsys):
    """The page of docs/trace.md's first command, in Chromium: no console error, no request but
    the page, one step per call after the prompt's, navigation, and each lattice step's
    k x positions cells with the winning path marked."""
    from selenium.webdriver.common.by import By
    page = str(tmp_path / "t.html")
    assert run_cli(capsys, "--prompt", PROMPT, "--decoder", "pbest", "--max-new-tokens", "48",
                   "--trace", page)[0] == 0
    data = read(page)
    errors, requests = opened(browser, page)
    assert errors == [] and requests == []
    steps = data["calls"] - 1
    assert len(browser.find_elements(By.CSS_SELECTOR, "#chart .bar")) == steps
    check_navigation(browser, steps)
    for i, step in enumerate(data["steps"]):
        x = step["explain"]
        svg = browser.find_element(By.CSS_SELECTOR, "#step svg.lattice")
        assert len(svg.find_elements(By.CSS_SELECTOR, "g.cell")) == x["k"] * x["positions"]
        winners = svg.find_elements(By.CSS_SELECTOR, "g.cell.winner")
        ranks = [[c[0] for c in cells].index(t) for cells, t in zip(x["cells"], step["drafts"][step["winner"]])]
        assert sorted((int(w.get_attribute("data-pos")), int(w.get_attribute("data-rank"))) for w in winners) \
            == list(enumerate(ranks))
        assert len(svg.find_elements(By.CSS_SELECTOR, "polyline.path")) == len(x["paths"])
        assert len(svg.find_elements(By.CSS_SELECTOR, "polyline.path.winner")) == 1
        browser.find_element(By.ID, "next").click()
    assert [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


@pytest.mark.parametrize("name, T, n", [("bpd", 0.0, 200), ("neural", 0.8, 40),
                                        ("lookup_pbest", 0.0, 40)])
def test_every_step_renders(browser, tmp_path, capsys, name, T, n):
    """Past the window (a one-token call at its edge), sampling (each try and its probability),
    a copy beside a lattice: every step renders with no console error."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    page = str(tmp_path / "t.html")
    assert run_cli(capsys, "--prompt", PROMPT, "--decoder", name, "--max-new-tokens", str(n),
                   "--temperature", str(T), "--trace", page)[0] == 0
    data = read(page)
    assert len(data["steps"]) == data["calls"] - 1
    assert opened(browser, page) == ([], [])
    body = browser.find_element(By.TAG_NAME, "body")
    for i, step in enumerate(data["steps"]):
        assert where(browser)[1] == str(i)
        tries = browser.find_elements(By.CSS_SELECTOR, "#step table.tries tr")
        assert len(tries) == (len(step["tries"]) + 1 if "tries" in step else 0)
        added = browser.find_elements(By.CSS_SELECTOR, "#step table.drafts .tok.added")
        assert len(added) == (step["added"] is not None)
        body.send_keys(Keys.ARROW_RIGHT)
    assert [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    if name == "bpd":
        assert any(s.get("edge") for s in data["steps"])


def test_smollm2_lookup_in_a_browser(browser, tmp_path, capsys):
    """docs/trace.md's SmolLM2 command (lookup, 48 new tokens): the page is the run's (its check
    says identical to greedy), loads with no console error nor request, shows every step and
    where each copy came from."""
    from selenium.webdriver.common.by import By
    heads = heads_or_skip()
    page = str(tmp_path / "s.html")
    code, out, _ = run_cli(capsys, "--prompt", PROMPT, "--checkpoint", heads, "--decoder", "lookup",
                           "--max-new-tokens", "48", "--trace", page)
    data = read(page)
    assert code == 0 and data["check"]["ok"] is True and out == PROMPT + data["output"] + "\n"
    assert [s["accepted"] for s in data["steps"]] == data["accepted"][1:]
    assert len(data["steps"]) == data["calls"] - 1 and sum(data["accepted"]) >= 48
    errors, requests = opened(browser, page)
    assert errors == [] and requests == []
    check_navigation(browser, len(data["steps"]))
    copied = [i for i, s in enumerate(data["steps"]) if s["explain"] and s["explain"]["copy"]]
    assert copied, "no step copied from the context"
    for _ in range(copied[0]):
        browser.find_element(By.ID, "next").click()
    assert browser.find_elements(By.CSS_SELECTOR, "#step .tok.match")
    assert browser.find_elements(By.CSS_SELECTOR, "#step .tok.copied")


class Falsy:
    """A drafter whose truth value is false (a sized object with no items) that drafts unlike
    ArgmaxDrafter: `drafter or ArgmaxDrafter()` would run plain BPD in its place."""
    name = "falsy"

    def __len__(self):
        return 0

    def __call__(self, logprobs, context):
        r, V = logprobs.shape
        return [[context[-1]] + [(context[-1] + 1) % V] * (r - 1)]


@pytest.mark.parametrize("traced", [False, True])
def test_a_falsy_drafter_is_the_one_run(shipped, traced):
    """Traced or not, a falsy drafter's drafts are verified, not plain BPD's: its block
    efficiency is its own, and the same in both paths."""
    model, ck, _, _ = shipped
    prompt, n = encode(PROMPT, ck["vocab"]), 24
    plain = decoders.Method("bpd", ArgmaxDrafter()).decode(model, prompt, n)[1]
    m = decoders.Method("falsy", Falsy())
    if traced:
        m.drafter = trace.Recorder(m.drafter)
    out, stats = m.decode(model, prompt, n)
    assert out == greedy_decode(model, prompt, n)
    assert stats["block_efficiency"] < plain["block_efficiency"]
    V = model.config.vocab_size
    assert all(set(s["drafts"][0][1:]) == {(s["drafts"][0][0] + 1) % V} for s in stats["steps"])
