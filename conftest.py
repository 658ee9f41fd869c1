"""Shared test fixtures: random tiny float64 models and prompts, the hypothesis strategies and
profiles, the devices, a tiny trained checkpoint, and the --drafter option.

    HYPOTHESIS_PROFILE=thorough python -m pytest -q     # 10x the examples of the default profile
    python -m pytest test_minibpd.py --drafter my_module:MyDrafter   # your drafter, checked

Every test file takes its hypothesis settings from here (`examples(scale)`), so the profile
scales them all.
"""
import inspect
import math
import itertools
import os

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from lab import cli
import train_heads
from minibpd import GPT, GPTConfig
from runtime.kvcache import window_start
from runtime.sampling import target_probs
from runtime.threads import set_threads

ROOT = os.path.dirname(os.path.abspath(__file__))   # the repository
set_threads()  # one thread, as every command (docs/threads.md)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA not available"))]
# Every example is bounded to seconds (sizes, the readable DP's cells), so that a failure is
# reported in minutes: hypothesis shrinks for at most 5 minutes of its own accord, a deadline of
# 60 s fails an example that runs away instead of letting it stall the suite, and in CI (where
# CI is set) nothing is shrunk: the first failing example is reported as found.
for _name, _n in (("quick", 5), ("default", 25), ("ci", 25), ("thorough", 250)):
    settings.register_profile(_name, max_examples=_n, deadline=60_000, print_blob=True,
                              phases=[p for p in Phase if p not in (Phase.shrink, Phase.explain)]
                              if _name in ("quick", "ci") else list(Phase),
                              suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                     HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default"))


def examples(scale=1.0):
    """Hypothesis settings with `scale` times the profile's examples (cheap tests run more)."""
    return settings(max_examples=max(1, round(scale * settings().max_examples)))


# ----------------------------------------------------------------------------- random models

def tiny_model(seed, vocab, n_layer, h, block, device="cpu", n_head=2, head_dim=4, std=0.5):
    """Random float64 GPT. A large init std makes logits spread out, so argmaxes are not ties."""
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab, block, n_layer, n_head, n_head * head_dim, h)
    model = GPT(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, std)
    return model.to(device).eval()


def random_prompt(seed, vocab, length):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(vocab, (length,), generator=g).tolist()


# (seed, vocabulary 2-64, layers 1-2, heads h 1-8, context window 1-16)
models = st.tuples(st.integers(0, 10**6), st.integers(2, 64), st.integers(1, 2), st.integers(1, 8),
                   st.integers(1, 16))


def on_random_models(**more):
    """Decorator: each device x hypothesis-drawn tiny model m, prompt length plen (often longer
    than the window), new tokens n (often running past it), and any `more` strategies."""
    def wrap(test):
        drawn = given(m=models, plen=st.integers(1, 30), n=st.integers(1, 30), **more)(test)
        return pytest.mark.parametrize("device", DEVICES)(examples()(drawn))
    return wrap


def model_and_prompt(m, plen, device):
    return tiny_model(*m, device=device), random_prompt(m[0], m[1], plen)


# ----------------------------------------------------------------------------- distributions
# A sampler is checked against the exact distribution of its continuations: the L1 distance of N
# draws stays under bound(K, N) with probability at least 1 - DELTA for a correct sampler of K
# outcomes (Weissman et al. 2003; tests/runtime/test_sampling.py shows the check's power).

DELTA = 1e-6


def bound(K, N, delta=DELTA):
    return math.sqrt(2 / N * math.log((2 ** K - 2) / delta))


@torch.no_grad()
def exact(model, prompt, n, T):
    """{continuation: its probability} under sampling the base model at T, by enumeration (no
    cache: every prefix recomputed from its window, the definition both decoders must meet)."""
    V, B, dev = model.config.vocab_size, model.config.block_size, model.lm_head.weight.device
    out = {}
    for cont in itertools.product(range(V), repeat=n):
        seq, prob = list(prompt), 1.0
        for tok in cont:
            t = len(seq)
            z = model(torch.tensor([seq[window_start(t, B):t]], device=dev))[0, -1]
            prob *= float(target_probs(model.lm_head(z).double(), T)[tok])
            seq.append(tok)
        out[cont] = prob
    return out


def l1(counts, probs, N):
    return sum(abs(counts.get(c, 0) / N - p) for c, p in probs.items())


# ----------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ck") / "tiny.pt")
    train_heads.main(["--steps", "40", "--rescorer-steps", "20", "--n-layer", "1", "--n-embd",
                      "32", "--n-head", "2", "--block-size", "32", "--batch-size", "8",
                      "--rescorer-embd", "16", "--rescorer-layers", "1", "--out", path])
    return path


def pytest_addoption(parser):
    parser.addoption("--drafter", metavar="MODULE:FACTORY", default=None,
                     help="run test_minibpd.py's drafter properties on your drafter: MODULE is a "
                          "module name (the current directory is searched first) or a .py file; "
                          "FACTORY(model) if it takes a `model` parameter or a required "
                          "positional one, else FACTORY() (default minibpd:ArgmaxDrafter)")


def pytest_configure(config):
    """Resolve --drafter once, before any test: a missing module or factory fails the whole run
    with the reason, not as a few errors among passes."""
    spec = config.getoption("--drafter") or "minibpd:ArgmaxDrafter"
    module, _, name = spec.rpartition(":")
    if not module or not name:
        raise pytest.UsageError(f"--drafter takes MODULE:FACTORY, e.g. my_drafter:MyDrafter; got {spec!r}")
    try:
        factory = getattr(cli.import_plugin(module), name)
    except Exception as e:
        raise pytest.UsageError(f"--drafter {spec}: {type(e).__name__}: {e}") from None
    if not callable(factory):
        raise pytest.UsageError(f"--drafter {spec}: {name} is not callable")
    config.drafter_factory = (lambda model: factory(model)) if takes_model(factory) else \
        (lambda model: factory())


def takes_model(factory):
    """Whether FACTORY wants the model: a parameter named `model`, or a required positional one."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "model" or (p.default is p.empty and p.kind in (p.POSITIONAL_ONLY,
               p.POSITIONAL_OR_KEYWORD)) for p in params)


@pytest.fixture(scope="session")
def drafter_factory(request):
    """model -> a fresh drafter, from --drafter MODULE:FACTORY (default minibpd:ArgmaxDrafter)."""
    return request.config.drafter_factory


# ----------------------------------------------------------------------------- the real model

SMOLLM_HEADS = os.path.join(ROOT, "checkpoints", "smollm2-heads.pt")


def real_model_or_skip():
    """The GGUF's path, or a clean skip naming the install command (SmolLM2 is optional)."""
    from models import smollm
    try:
        smollm.optional_packages()
        return smollm.find_gguf()
    except ImportError:
        pytest.skip(f"SmolLM2 not installed: {smollm.INSTALL}")


def heads_or_skip():
    """The shipped SmolLM2 heads checkpoint's path, or a clean skip."""
    real_model_or_skip()
    if not os.path.isfile(SMOLLM_HEADS):
        pytest.skip(f"{SMOLLM_HEADS} missing: train it with `python train_heads.py --smollm`")
    return SMOLLM_HEADS
