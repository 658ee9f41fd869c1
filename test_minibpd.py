"""Property-based tests: every decoding path returns exactly the greedy tokens of the base model.

All exactness tests run in float64 on random tiny models: the verification pass and the one-token
pass round differently, and only float64 makes those differences (~1e-16) far too small to flip an
argmax (see the minibpd module docstring). Each test runs on the CPU and, when present, on CUDA.
"""
import json
import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import minibpd
import train_heads
from minibpd import (GPT, GPTConfig, KVCache, bpd_decode, greedy_decode,
                     model_call, window_start)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA not available"))]
# HYPOTHESIS_PROFILE=thorough runs 10x more examples than the default profile used by CI.
settings.register_profile("default", max_examples=25, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture])
settings.register_profile("thorough", max_examples=250, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
SETTINGS = settings()


def tiny_model(seed, vocab, n_layer, h, block, device="cpu", n_head=2, head_dim=4, std=0.5):
    """Random float64 GPT. A large init std makes logits spread out, so argmaxes are not ties."""
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab, block, n_layer, n_head, n_head * head_dim, h)
    model = GPT(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, std)
    return model.to(device).eval()


models = st.builds(lambda seed, v, l, h, b: (seed, v, l, h, b), st.integers(0, 10**6),
                   st.integers(2, 64), st.integers(1, 2), st.integers(1, 8), st.integers(1, 16))


def on_random_models(**more):
    """Decorator: each device x hypothesis-drawn tiny model m, prompt length, new tokens n."""
    def wrap(test):
        drawn = given(m=models, plen=st.integers(1, 30), n=st.integers(1, 30), **more)(test)
        return pytest.mark.parametrize("device", DEVICES)(SETTINGS(drawn))
    return wrap


def model_and_prompt(m, plen, device):
    return tiny_model(*m, device=device), random_prompt(m[0], m[1], plen)


def random_prompt(seed, vocab, length):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(vocab, (length,), generator=g).tolist()


@torch.no_grad()
def naive_greedy(model, prompt, n):
    """Reference without a cache: recompute the window seq[window_start(t):t] for every token."""
    seq = list(prompt)
    for _ in range(n):
        t = len(seq)
        ctx = torch.tensor([seq[window_start(t, model.config.block_size):t]],
                           device=model.lm_head.weight.device)
        seq.append(int(model.lm_head(model(ctx)[0, -1]).argmax()))
    return seq[len(prompt):]


class OracleDrafter:
    """Proposes the true greedy continuation: every draft token is accepted."""
    max_drafts = 1

    def __init__(self, full, wrong=False):
        self.full, self.wrong = full, wrong

    def __call__(self, logprobs, context):
        n, V = len(context), logprobs.shape[-1]
        draft = self.full[n - 1:n - 1 + len(logprobs)]
        if self.wrong:  # every token after the first is not the greedy one
            draft = draft[:1] + [(t + 1) % V for t in draft[1:]]
        return [draft]


# ----------------------------------------------------------------------------- exactness

@on_random_models()
def test_bpd_equals_greedy(device, m, plen, n):
    model, prompt = model_and_prompt(m, plen, device)
    greedy = greedy_decode(model, prompt, n)
    assert greedy == naive_greedy(model, prompt, n)        # the cache does not change the maths
    out, stats = bpd_decode(model, prompt, n)
    assert out == greedy
    assert sum(stats["accepted"]) >= n and len(stats["accepted"]) == stats["calls"]
    assert 1.0 <= stats["block_efficiency"] <= model.config.n_bpd_heads
    assert stats["block_efficiency"] == n / stats["calls"]


@on_random_models()
def test_extremes_all_and_none_accepted(device, m, plen, n):
    model, prompt = model_and_prompt(m, plen, device)
    full = prompt + greedy_decode(model, prompt, n + 8)
    out, stats = bpd_decode(model, prompt, n, OracleDrafter(full))
    assert out == full[plen:plen + n]
    for step in stats["steps"]:                             # every draft fully accepted
        assert step["accepted"] == len(step["drafts"][0])
    out, stats = bpd_decode(model, prompt, n, OracleDrafter(full, wrong=True))
    assert out == full[plen:plen + n]
    assert stats["calls"] == n and stats["block_efficiency"] == 1.0


@pytest.mark.parametrize("h", [1, 2, 5, 8])
def test_all_accepted_reaches_h(h):
    """Steady state with perfect drafts: h tokens per call (window never full here)."""
    model = tiny_model(1, 17, 1, h, 256)
    prompt, n = random_prompt(2, 17, 5), 100
    full = prompt + greedy_decode(model, prompt, n)
    out, stats = bpd_decode(model, prompt, n, OracleDrafter(full))
    assert out == full[5:]
    assert stats["calls"] == 1 + math.ceil((n - 1) / h)
    assert all(a == h for a in stats["accepted"][1:-1])


def test_window_start_definition():
    for B in range(1, 20):
        starts = [window_start(t, B) for t in range(200)]
        for t, s in enumerate(starts):
            assert 0 <= t - s <= B and (t > B or s == 0)
            assert s % max(1, B // 2) == 0
        assert starts == sorted(starts)


@pytest.mark.parametrize("device", DEVICES)
@SETTINGS
@given(m=models, plen=st.integers(1, 30), chunks=st.lists(st.integers(1, 5), min_size=1, max_size=6))
def test_cache_equals_recompute(device, m, plen, chunks):
    """Prefill + one-token steps + multi-token steps with rejections == a full forward pass."""
    model = tiny_model(*m, device=device)
    B = model.config.block_size
    seq = random_prompt(m[0], m[1], plen)
    cache = KVCache(model, rows=2)
    for size in chunks:
        draft = random_prompt(m[0] + size, m[1], size)
        draft = draft[:max(0, window_start(len(seq), B) + B - len(seq))]
        with torch.no_grad():
            z, fed = model_call(model, cache, seq, [draft, draft])
            t = len(seq) + len(draft)
            s = window_start(t, B)
            ref = model(torch.tensor([(seq + draft)[s:t]], device=device))
        torch.testing.assert_close(z[0], ref[0, -z.shape[1]:], rtol=1e-10, atol=1e-10)
        keep = len(draft) // 2                          # reject the rest: rewind by not advancing
        cache.advance(1, fed + keep)
        seq = seq + draft[:keep] + [int(model.lm_head(z[1, keep]).argmax())]


# ----------------------------------------------------------------------------- the model

def test_parameter_count_no_shared_heads():
    cfg = GPTConfig(vocab_size=30, block_size=16, n_layer=2, n_head=2, n_embd=16, n_bpd_heads=5)
    model = GPT(cfg)
    C, V, T, L, h = 16, 30, 16, 2, 5
    per_block = 4 * C + (3 * C * C + 3 * C) + (C * C + C) + (4 * C * C + 4 * C) + (4 * C * C + C)
    expected = V * C + T * C + L * per_block + 2 * C + (h - 1) * 2 * (C * C + C)
    assert sum(p.numel() for p in model.parameters()) == expected
    ptrs = {hd.fc.weight.data_ptr() for hd in model.heads}
    assert len(ptrs) == h - 1
    assert model.lm_head.weight is model.tok_emb.weight


def test_batched_heads_equal_modules():
    model = tiny_model(0, 11, 1, 6, 8)
    z = torch.randn(3, 4, 8, dtype=torch.float64)
    ref = model.lm_head(torch.stack([z] + [hd(z) for hd in model.heads], dim=-2))
    for mode in (True, False):
        model.train(mode)
        torch.testing.assert_close(model.head_logits(z), ref)
    with torch.no_grad():
        model.heads[2].proj.bias.add_(1.0)                  # the inference cache must notice
    ref = model.lm_head(torch.stack([z] + [hd(z) for hd in model.heads], dim=-2))
    torch.testing.assert_close(model.head_logits(z), ref)


def test_config_validation():
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(vocab_size=10, n_embd=10, n_head=3)
    with pytest.raises(ValueError, match="n_bpd_heads"):
        GPTConfig(n_bpd_heads=0)
    model = tiny_model(0, 5, 1, 2, 8)
    for bad in ([], [5], [-1]):
        with pytest.raises(ValueError):
            greedy_decode(model, bad, 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        bpd_decode(model, [1], 0)


def test_clean_and_split():
    text = "Title\n*****\n\n\n+----+----+\n| a  |   b |\nSome    words   here.\n"
    assert train_heads.clean_text(text) == "Title\n\n| a | b |\nSome words here.\n"
    parts = train_heads.split_corpus("x" * 100_000)
    assert sum(len(v) for v in parts.values()) == 100_000
    assert len(parts["test"]) == len(parts["tune"]) == 4000      # chunks 18, 38 and 19, 39 of 50


# ----------------------------------------------------------------------------- checkpoint + CLI

def test_checkpoint_round_trip(tiny_ckpt):
    ck = torch.load(tiny_ckpt, weights_only=True)
    model, ck2 = minibpd.load_checkpoint(tiny_ckpt)
    assert ck2["vocab"] == ck["vocab"] and ck["seed"] == 1337 and "git_revision" in ck
    for k, v in model.state_dict().items():
        assert torch.equal(v, ck["model"][k].float())
    prompt = minibpd.encode("The if statement", ck["vocab"])
    assert bpd_decode(model, prompt, 30)[0] == greedy_decode(model, prompt, 30)


def run_cli(capsys, *argv):
    code = minibpd.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_demo_and_prompt_smoke(tiny_ckpt, capsys):
    code, out, err = run_cli(capsys, "--demo", "--checkpoint", tiny_ckpt, "--max-new-tokens", "40")
    assert code == 0 and "identical to greedy ✓" in out and "block efficiency" in out
    code, out, err = run_cli(capsys, "--prompt", "The if", "--max-new-tokens", "20",
                             "--checkpoint", tiny_ckpt)
    assert code == 0 and out.startswith("The if") and "identical to greedy: yes" in err


def test_bench_json_smoke(tiny_ckpt, capsys):
    code, out, err = run_cli(capsys, "--bench", "--json", "--checkpoint", tiny_ckpt,
                             "--prompts", "3", "--new-tokens", "12")
    res = json.loads(out)
    assert code == 0
    for key in ("block_efficiency", "identical_to_greedy", "tokens_per_s", "speedup_vs_greedy"):
        assert "bpd" in res[key]
    assert res["identical_to_greedy"]["bpd"] is True
    assert res["prompts"] == 3 and res["new_tokens"] == 12 and res["checkpoint"] == tiny_ckpt
    assert 1.0 <= res["block_efficiency"]["bpd"] <= 8


@pytest.mark.parametrize("argv, message", [
    (["--prompt", "héllo ☃"], "never saw"),
    (["--prompt", ""], "empty"),
    (["--prompt", "The", "--max-new-tokens", "0"], "max-new-tokens"),
    (["--prompt", "The", "--decoder", "nope"], "unknown decoder"),
    (["--bench", "--prompts", "0"], "--prompts"),
    (["--bench", "--new-tokens", "-3"], "--new-tokens"),
    (["--bench", "--text", "/nonexistent/file.txt"], "cannot read"),
])
def test_cli_errors(tiny_ckpt, capsys, argv, message):
    code, out, err = run_cli(capsys, *argv, "--checkpoint", tiny_ckpt)
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err


def test_cli_cuda_unavailable(tiny_ckpt, capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    code, _, err = run_cli(capsys, "--demo", "--device", "cuda", "--checkpoint", tiny_ckpt)
    assert code == 2 and "CUDA is not available" in err


def test_checkpoint_errors(tiny_ckpt, tmp_path, capsys):
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"this is not a checkpoint")
    ck = torch.load(tiny_ckpt, weights_only=True)
    old = dict(ck, format_version=0)
    torch.save(old, tmp_path / "old.pt")
    shape = dict(ck, config=dict(ck["config"], n_embd=64))
    torch.save(shape, tmp_path / "shape.pt")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(open(tiny_ckpt, "rb").read()[:1000])
    cases = [(tmp_path / "missing.pt", "not found"), (corrupt, "corrupt"),
             (truncated, "corrupt"), (tmp_path / "old.pt", "format"),
             (tmp_path / "shape.pt", "does not match")]
    for path, message in cases:
        code, out, err = run_cli(capsys, "--demo", "--checkpoint", str(path))
        assert code == 2 and message in err and "Traceback" not in err, (path, err)


def test_script_exits_cleanly(tmp_path):
    """Through the real entry point: a one-line error and exit status 2, no traceback."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "minibpd.py", "--demo", "--checkpoint",
                        str(tmp_path / "none.pt")], capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.abspath(__file__)))
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr


def test_train_on_own_text(tmp_path):
    data = tmp_path / "text.txt"
    data.write_text("The quick brown fox jumps over the lazy dog. " * 120, encoding="utf-8")
    out = str(tmp_path / "own.pt")
    train_heads.main(["--data", str(data), "--steps", "5", "--rescorer-steps", "2", "--n-layer", "1",
                      "--n-embd", "16", "--n-head", "2", "--block-size", "16", "--batch-size", "4",
                      "--rescorer-embd", "8", "--rescorer-layers", "1", "--heads", "3", "--out", out])
    model, ck = minibpd.load_checkpoint(out)
    assert ck["corpus"]["name"] == str(data) and model.config.n_bpd_heads == 3
    assert set(ck["splits"]) == {"train", "tune", "test"}
    short = tmp_path / "short.txt"
    short.write_text("too short", encoding="utf-8")
    with pytest.raises(SystemExit, match="only"):
        train_heads.main(["--data", str(short), "--out", str(tmp_path / "x.pt")])


def test_readme_snippet_runs_on_shipped_checkpoint(capsys):
    """The README's 'In your own code' example runs as written (and asserts exactness itself)."""
    here = os.path.dirname(os.path.abspath(__file__))
    text = open(os.path.join(here, "README.md"), encoding="utf-8").read()
    code = text.split("## In your own code", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    cwd = os.getcwd()
    try:
        os.chdir(here)
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    finally:
        os.chdir(cwd)
    assert capsys.readouterr().out.strip()                # it printed its text and numbers
