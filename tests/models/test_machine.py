"""The real model's precision and blocks chosen per CPU (models/machine.py): the probe
of row-invariant kernels, the products that run on their own rows, the cached choice, and BPD
equal to greedy in that mode. The kernels differ by CPU: tests that need a row-invariant kernel
skip where there is none, and test_capped_cpu_runs_them reruns this file with the kernels capped
at AVX2 (where oneDNN's packed float32 products were row-invariant for every SmolLM2 shape)."""
import dataclasses
import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch
from hypothesis import given, strategies as st

from conftest import ROOT, examples, random_prompt
from tests.helpers import SMOLLM_HEADS
from minibpd import greedy_decode
from models import blocks, machine, machine_cache
from test_smollm import TopTwoDrafter, tiny_llama
from models.smollm import heads_be
from runtime.loop import lab_decode

CAPPED = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
          "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
SMOLLM2 = [(960, 576), (576, 576), (3072, 576), (576, 1536), (4096, 576)]   # (lm head: fewer rows)


@pytest.fixture(autouse=True)
def fresh_free():
    """blocks.FREE is the process's: every test starts and ends without entries."""
    saved = dict(blocks.FREE)
    blocks.FREE.clear()
    yield blocks.FREE
    blocks.FREE.clear()
    blocks.FREE.update(saved)


@pytest.fixture(autouse=True)
def user_cache(tmp_path, monkeypatch):
    """The user's cache of machine choices, in the test's own folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    return tmp_path / "user-cache"


MEASURED_SHARE = machine.others_share       # the real one, for the test of a busy machine


@pytest.fixture(autouse=True)
def quiet(monkeypatch):
    """The cache's rules are tested as on a quiet machine (another test's process may be busy
    beside this one); test_a_choice_measured_beside_busy_processes_is_not_cached makes it busy."""
    monkeypatch.setattr(machine, "others_share", lambda fn: (fn(), 0.0))


def free_or_skip(layer):
    """Mark the layer's kernel row-invariant when the probe says so here; skip otherwise."""
    n = blocks.row_invariance(layer, machine.MOST_FREE)
    if n < machine.MOST_FREE:
        pytest.skip(f"{tuple(layer.weight.shape)} {layer.weight.dtype}: not row-invariant on this "
                    f"CPU ({torch.backends.cpu.get_cpu_capability()}); see test_capped_cpu_runs_them")
    blocks.FREE[blocks.kernel_key(layer)] = n


def test_the_probe_sees_a_kernel_that_rounds_by_row_count(monkeypatch):
    """A guard that could not fail would be no guard: a kernel whose rows change with the row
    count (here by one ulp-sized step) is found out at two rows; one that computes every row
    alone passes."""
    layer = machine.Weight(16, 8, torch.float32)
    alone = lambda lay, x: torch.stack([lay.weight @ r for r in x])      # every row by itself
    monkeypatch.setattr(blocks, "linear", lambda lay, x: alone(lay, x) + 1e-6 * len(x))
    assert blocks.row_invariance(layer, 8) == 0
    monkeypatch.setattr(blocks, "linear", lambda lay, x: alone(lay, x) + 1e-6 * (len(x) > 5))
    assert blocks.row_invariance(layer, 8) == 5                  # kernels split off remainders
    monkeypatch.setattr(blocks, "linear", alone)
    assert blocks.row_invariance(layer, 8) == 8


@pytest.mark.parametrize("shape", SMOLLM2)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, "int4"])
def test_own_rows_are_one_row_products(shape, dtype):
    """Where the probe finds the kernel row-invariant, linear_rows runs a call's own rows (no
    padding to a block) and every row of any count gets the bits of a one-row call (int4: the
    4-bit kernel, blocks.int4_linear)."""
    if dtype == "int4" and not blocks.int4_ready():
        pytest.skip("this torch has no CPU int4 kernel")
    layer = machine.Weight(*shape, torch.float32, 4) if dtype == "int4" else \
        machine.Weight(*shape, dtype)
    free_or_skip(layer)
    x = torch.randn(13, shape[1], generator=torch.Generator().manual_seed(1))
    alone = torch.cat([blocks.linear_rows(layer, x[i:i + 1], 1) for i in range(13)])
    for m in (1, 2, 5, 8, 9, 13):
        assert torch.equal(blocks.linear_rows(layer, x[:m], 1), alone[:m]), m


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@examples(0.3)
@given(seed=st.integers(0, 10**6), h=st.integers(2, 5), plen=st.integers(1, 20),
       n=st.integers(1, 24))
def test_bpd_equals_greedy_on_own_rows(dtype, seed, h, plen, n):
    """The exactness of the mode: a batch-invariant tiny Llama whose every product runs on its
    own rows (the probe, run first, skips where a kernel is not row-invariant), one block row
    for the rest; BPD with one and with several drafts, batch and tree, equals greedy."""
    model = tiny_llama(seed, 40, 2, h, 16, 1, 2, 32, hidden=64, dtype=dtype,
                       batch_invariant=True, std=0.3)
    for layer in [m for m in model.modules() if isinstance(m, torch.nn.Linear)]:
        free_or_skip(layer)
    prompt = random_prompt(seed, 40, plen)
    greedy = greedy_decode(model, prompt, n)
    assert lab_decode(model, prompt, n)[0] == greedy
    for verify in ("batch", "tree"):
        assert lab_decode(model, prompt, n, TopTwoDrafter(), verify=verify)[0] == greedy


def fake_config():
    return dataclasses.make_dataclass("Cfg", [("n_head", int, 3), ("n_kv_head", int, 1),
                                              ("head_dim", int, 8), ("n_embd", int, 24),
                                              ("n_hidden", int, 32), ("n_layer", int, 2),
                                              ("vocab_size", int, 40)])()


def test_the_choice_is_cached_per_machine(tmp_path, monkeypatch):
    """choice_for measures once and caches beside the checkpoint, one choice per machine; a
    choice made on another machine (another key), of another format or unreadable is measured
    again, never trusted, and another machine's stays in the cache."""
    path, said = str(tmp_path / "heads.pt"), []
    data = machine.choice_for(path, fake_config(), 3, log=said.append)
    assert len(said) == 1 and "measured this CPU" in said[0]
    assert machine.choice_for(path, fake_config(), 3, log=said.append) == data and len(said) == 1
    assert data["best"] in data["dtypes"] and data["key"] == machine_cache.machine_key()
    for entry in data["dtypes"].values():
        assert entry["pick"] in entry["ms"] and entry["row_block"] >= 1
    other = {**data, "key": {"cpu_flags": "another"}}
    for cache in ({"format": machine_cache.FORMAT, "machines": [other]}, {"format": 0, "machines": [data]},
                  {**data}):
        with open(path + machine_cache.CHOICE_SUFFIX, "w") as f:
            json.dump(cache, f)
        assert machine_cache.load_choice(path) is None
    with open(path + machine_cache.CHOICE_SUFFIX, "w") as f:
        json.dump({"format": machine_cache.FORMAT, "machines": [other]}, f)
    again = machine.choice_for(path, fake_config(), 3, log=said.append)  # another's is kept
    assert len(said) == 2 and machine_cache.read_cache(path + machine_cache.CHOICE_SUFFIX) == [other, again]
    assert machine_cache.load_choice(path) == again and again["key"] == machine_cache.machine_key()
    with open(path + machine_cache.CHOICE_SUFFIX, "w") as f:
        f.write("{not json")
    assert machine_cache.load_choice(path) is None


def read_only(monkeypatch, *folders):
    """Make the folders read-only; as root, whom file modes do not stop, also make machine's
    writes under them fail as they would for anyone else."""
    for folder in folders:
        folder.chmod(0o555)
    try:
        (folders[0] / "probe").write_text("")
    except OSError:
        return
    (folders[0] / "probe").unlink()
    inside = tuple(str(folder) + os.sep for folder in folders)

    def guarded(file, mode="r", *args, **kw):
        if "w" in mode and os.path.abspath(file).startswith(inside):
            raise PermissionError(13, "Permission denied", file)
        return open(file, mode, *args, **kw)
    monkeypatch.setattr(machine_cache, "open", guarded, raising=False)


def test_a_read_only_checkpoint_folder_caches_in_the_users_cache(tmp_path, monkeypatch, user_cache):
    """Beside a checkpoint in a read-only folder nothing can be written: the choice goes to the
    user's cache, is found there the next time (measured once), and the log says where."""
    folder = tmp_path / "ro"
    folder.mkdir()
    path, said = str(folder / "heads.pt"), []
    read_only(monkeypatch, folder)
    data = machine.choice_for(path, fake_config(), 3, log=said.append)
    assert os.listdir(folder) == [] and len(said) == 1
    assert f"cached in {user_cache}" in said[0], said
    assert machine.choice_for(path, fake_config(), 3, log=said.append) == data and len(said) == 1


def test_a_choice_that_cannot_be_written_anywhere_says_so(tmp_path, monkeypatch, user_cache):
    folder = tmp_path / "ro"
    folder.mkdir()
    user_cache.mkdir()
    read_only(monkeypatch, folder, user_cache)
    said = []
    machine.choice_for(str(folder / "heads.pt"), fake_config(), 3, log=said.append)
    assert len(said) == 1 and "not cached" in said[0] and "cached in" not in said[0]


def test_the_log_goes_to_stderr(tmp_path, capsys):
    """A command's --json is its stdout: the machine's log lines must not land there."""
    machine.choice_for(str(tmp_path / "heads.pt"), fake_config(), 3)
    out, err = capsys.readouterr()
    assert out == "" and "measured this CPU" in err


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="others' CPU time is read from /proc/stat")
def test_a_choice_measured_beside_busy_processes_is_not_cached(tmp_path, monkeypatch):
    """With a busy process on every core the timings are not the quiet machine's (they picked
    another precision on one Xeon): the choice runs but is not cached, the log says why, and the
    next, quiet load measures again and caches. Beside no busy process the share is below BUSY
    only on an idle machine, so that side is the quiet fixture's."""
    monkeypatch.setattr(machine, "others_share", MEASURED_SHARE)
    path, said = str(tmp_path / "heads.pt"), []
    busy = busy_processes()
    try:
        _, share = machine.others_share(lambda: time.sleep(0.5))
        data = machine.choice_for(path, fake_config(), 3, log=said.append)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert share > machine_cache.BUSY, share
    assert len(said) == 1 and "not cached: other processes used" in said[0], said
    assert data["best"] in data["dtypes"] and os.listdir(tmp_path) == []
    monkeypatch.setattr(machine, "others_share", lambda fn: (fn(), 0.0))
    machine.choice_for(path, fake_config(), 3, log=said.append)
    assert len(said) == 2 and "cached in" in said[1] and machine_cache.load_choice(path) is not None


def smollm2_config():
    """SmolLM2-135M's shapes: what choose() times needs no GGUF, only the shapes."""
    return dataclasses.make_dataclass("Cfg", [("n_head", int, 9), ("n_kv_head", int, 3),
                                              ("head_dim", int, 64), ("n_embd", int, 576),
                                              ("n_hidden", int, 1536), ("n_layer", int, 30),
                                              ("vocab_size", int, 49152)])()


def busy_processes():
    """One process spinning on every core, running before this returns."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 1)]
    time.sleep(0.3)
    return busy


def test_a_busy_first_load_picks_what_a_quiet_one_does():
    """Two fresh first loads' choices for SmolLM2's shapes and shipped heads (1 thread), one
    beside a busy process on every core: the same precision. Measured by wall-clock and ranked by
    verification alone they differed on a 2-core AMD EPYC (float32 busy, int4 quiet): the two
    verifications are within 20% there, while a BPD token is 1.5x dearer in float32."""
    be = heads_be(torch.load(SMOLLM_HEADS, map_location="cpu", weights_only=True))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        quiet = machine.choose(smollm2_config(), 5, be=be)
        busy = busy_processes()
        try:
            loaded = machine.choose(smollm2_config(), 5, be=be)
        finally:
            for p in busy:
                p.kill()
                p.wait()
    finally:
        torch.set_num_threads(threads)
    assert loaded["best"] == quiet["best"], (quiet, loaded)


def test_the_precision_is_ranked_by_what_a_bpd_token_costs():
    """decode_ms: a k-row call's ms over k heads' block efficiency, at the best k. Numbers of the
    shape a Xeon with AMX showed: bf16 in blocks of 8 costs its 5-row verification's 45.1 ms for
    any rows, int4 51.8 for 5 rows and (as on the CPUs measured) about half that for 1 to 4:
    bf16 has the faster verification, int4 the cheaper BPD token (on 4 heads); int4 decoded
    1.7x faster there."""
    be = {1: 1.0, 2: 1.57, 3: 1.82, 4: 1.95, 5: 2.03}
    bf16, int4 = [45.1] * 5, [26.0] * 4 + [51.8]
    assert machine.decode_ms(bf16, be) == (45.1 / 2.03, 5)
    assert machine.decode_ms(int4, be) == (26.0 / 1.95, 4)
    assert machine.decode_ms(int4, {1: 1.0, 5: 2.03}) == (51.8 / 2.03, 5)    # heads 2-4 unknown
    assert machine.decode_ms(int4, {1: 1.0, 2: float("nan"), 3: float("inf")}) == (26.0, 1)


def test_choose_with_block_efficiency_times_every_row_count():
    """With the checkpoint's block efficiency, each precision's entry holds its calls of 1 to h
    rows and the cost of a BPD token; "best" is the cheapest token, and a cache of it is well
    formed."""
    be = {1: 1.0, 2: 1.5, 3: 1.8}
    data = machine.choose(fake_config(), 3, be=be)
    for e in data["dtypes"].values():
        assert len(e["rows_ms"]) == 3 and e["rows_ms"][0] == e["ms"][e["pick"]][0]
        assert e["token_ms"] == round(machine.decode_ms(e["rows_ms"], be)[0], 3)
    assert data["best"] == min(data["dtypes"], key=lambda d: data["dtypes"][d]["token_ms"])
    assert machine_cache.choice_problem(data) is None


MALFORMED = {
    "dtypes a list": lambda c: {**c, "dtypes": [1, 2]},
    "no best": lambda c: {k: v for k, v in c.items() if k != "best"},
    "unknown precision": lambda c: {**c, "dtypes": {**c["dtypes"], "float8": c["dtypes"][c["best"]]}},
    "row_block a string": lambda c: {**c, "dtypes": {
        k: {**e, "row_block": "8"} for k, e in c["dtypes"].items()}},
    "negative ms": lambda c: {**c, "dtypes": {
        k: {**e, "ms": {p: [-1.0, 2.0] for p in e["ms"]}} for k, e in c["dtypes"].items()}},
    "rows_ms negative": lambda c: {**c, "dtypes": {
        k: {**e, "rows_ms": [-1.0]} for k, e in c["dtypes"].items()}},
    "free not a kernel key": lambda c: {**c, "dtypes": {
        k: {**e, "free": {"[[1": 8}} for k, e in c["dtypes"].items()}},
}


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    return machine.choose(fake_config(), 3)


@pytest.mark.parametrize("damage", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_cached_choice_is_measured_again(tmp_path, measured, damage):
    """A cached choice of this machine that is valid JSON of the wrong shape (hand-edited,
    damaged) is ignored with one line that says so, measured again and replaced; it never
    reaches apply (where it raised deep inside the SmolLM2 loader)."""
    path, said = str(tmp_path / "heads.pt"), []
    with open(path + machine_cache.CHOICE_SUFFIX, "w") as f:
        json.dump({"format": machine_cache.FORMAT, "machines": [damage(measured)]}, f)
    assert machine_cache.load_choice(path, said.append) is None
    assert len(said) == 1 and "malformed" in said[0]
    data = machine.choice_for(path, fake_config(), 3, log=said.append)
    assert machine_cache.choice_problem(data) is None and machine_cache.load_choice(path) == data
    machine.apply(data, torch.float32)


def test_apply_sets_the_free_kernels_and_says_why():
    key = blocks.kernel_key(machine.Weight(16, 8, torch.float32))
    data = {"h": 4, "dtypes": {"float32": {
        "row_block": 1, "pick": "own rows", "free": {machine_cache.key_text(key): 8},
        "ms": {"own rows": [1.0, 2.0], "blocks of 8": [1.5, 2.5]}}}}
    rows, why = machine.apply(data, torch.float32)
    assert rows == 1 and blocks.FREE == {key: 8}
    assert why == "float32, own rows (products of a greedy step 1.0 ms, of a verification of 4 rows 2.0 ms here)"
    assert machine.apply(data, torch.bfloat16)[0] is None


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() == "AVX2" or
                    os.environ.get("ATEN_CPU_CAPABILITY"), reason="already at AVX2 (or capped)")
def test_capped_cpu_runs_them():
    """This file again with the kernels capped at AVX2, so that the row-invariant mode is tested
    on a CPU with AVX-512 too: it must run its own-rows tests there (SmolLM2's shapes),
    not skip them all."""
    env = {**os.environ, **CAPPED, "HYPOTHESIS_PROFILE": "quick"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                        os.path.join(ROOT, "tests", "models", "test_machine.py"), "-k",
                        "own_rows"], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    passed = re.search(r"(\d+) passed", r.stdout)
    assert passed and int(passed[1]) >= len(SMOLLM2), r.stdout[-3000:]   # run, not skipped


def test_fastest_takes_the_cheapest_step_among_verifications_within_ten_per_cent():
    """The choice's rule: the fastest verification wins, unless another is within 10% of it and
    has the cheaper one-token step (float32 own rows against blocks of 8 on an AVX2 CPU)."""
    assert machine.fastest({"blocks of 8": (39.9, 38.8), "own rows": (24.0, 41.0)}) == "own rows"
    assert machine.fastest({"blocks of 8": (39.9, 38.8), "own rows": (24.0, 50.2)}) == "blocks of 8"
    assert machine.fastest({"blocks of 1": (17.0, 70.0), "blocks of 8": (20.0, 21.0)}) == "blocks of 8"
