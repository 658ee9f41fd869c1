"""The paper tests' fixtures: random tiny float64 models and prompts, every path of a lattice, the
hypothesis strategies and profiles, the devices, the exact distribution a sampler must meet, and
the --drafter option.
tests/helpers.py holds what the folders' tests need (a tiny trained checkpoint, the real model).

    HYPOTHESIS_PROFILE=thorough python -m pytest -q     # 10x the examples of the default profile
    python -m pytest test_minibpd.py --drafter my_module:MyDrafter   # your drafter, checked

Every test file takes its hypothesis settings from here (`examples(scale)`), so the profile
scales them all.
"""
import importlib
import importlib.util
import inspect
import itertools
import math
import os
import sys

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

import lattice
import minibpd
from minibpd import GPT, GPTConfig, window_start

ROOT = os.path.dirname(os.path.abspath(__file__))   # the repository
torch.set_num_threads(1)  # one thread, as every command (docs/threads.md)

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

def tiny_model(seed, vocab, n_layer, h, block, device="cpu", n_head=2, head_dim=4, std=0.5,
               cls=GPT):
    """Random float64 GPT (cls: or its fast twin). A large init std spreads the logits out, so
    argmaxes are not ties."""
    torch.manual_seed(seed)
    model = cls(GPTConfig(vocab, block, n_layer, n_head, n_head * head_dim, h)).double()
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


def model_and_prompt(m, plen, device, cls=GPT):
    return tiny_model(*m, device=device, cls=cls), random_prompt(m[0], m[1], plen)


def all_paths(lat, lm, history, alpha):
    """Every path of a lattice scored by lattice.path_score, best first (ties: smaller ranks
    first, best_paths' order): [(score, ranks, tokens)]. Kim §7.2's DP must return its head."""
    paths = []
    for ranks in itertools.product(*(range(len(t)) for t in lat.tokens)):
        tokens = [lat.tokens[i][r] for i, r in enumerate(ranks)]
        paths.append((lattice.path_score(lat, lm, history, tokens, alpha), ranks, tokens))
    return sorted(paths, key=lambda c: (-c[0], c[1]))


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
            prob *= float(F.softmax(model.lm_head(z).double() / T, dim=-1)[tok])
            seq.append(tok)
        out[cont] = prob
    return out


def l1(counts, probs, N):
    return sum(abs(counts.get(c, 0) / N - p) for c, p in probs.items())


# ----------------------------------------------------------------------------- --drafter
# `python -m pytest test_minibpd.py --drafter my_drafter:MyDrafter` runs the drafter properties
# on a student's drafter (the folders' tests add its sampling check: tests/runtime).

def pytest_addoption(parser):
    parser.addoption("--drafter", metavar="MODULE:FACTORY", default=None,
                     help="run the drafter properties on your drafter: MODULE is a module name "
                          "(the current directory is searched first) or a .py file; FACTORY(model) "
                          "if it takes a `model` parameter or a required positional one, else "
                          "FACTORY() (default minibpd:ArgmaxDrafter)")


ASSIGNMENTS = ["write a drafter and check it exact", "how many heads",
               "tune on one split, report on another", "another corpus", "change the rescorer",
               "why refined drafts are slower on a CPU", "per-task findings",
               "approximate acceptance (Stern 5)", "copy or refine"]    # docs/coursework.md


def pytest_configure(config):
    """The coursework's marks (`pytest -m assignment1`); resolve --drafter once, before any
    test: a missing module or factory fails the whole run with the reason, not as a few errors
    among passes."""
    for n, what in enumerate(ASSIGNMENTS, 1):
        config.addinivalue_line("markers", f"assignment{n}: {what}")
    spec = config.getoption("--drafter") or "minibpd:ArgmaxDrafter"
    module, _, name = spec.rpartition(":")
    if not module or not name:
        raise pytest.UsageError(f"--drafter takes MODULE:FACTORY, e.g. my_drafter:MyDrafter; got {spec!r}")
    try:
        factory = getattr(student_module(module), name)
    except Exception as e:
        raise pytest.UsageError(f"--drafter {spec}: {type(e).__name__}: {e}") from None
    if not callable(factory):
        raise pytest.UsageError(f"--drafter {spec}: {name} is not callable")
    config.drafter_factory = (lambda model: factory(model)) if takes_model(factory) else \
        (lambda model: factory())


def student_module(spec):
    """A module by name (the current directory first) or by .py path. A name that an imported
    module already holds (the project's `lattice`, Python's `json`) is refused unless it is that
    very file: importing would hand back that module, not run yours."""
    path = spec.endswith(".py") or os.sep in spec
    name = os.path.splitext(os.path.basename(spec))[0] if path else spec
    sys.path.insert(0, os.getcwd())
    mine = os.path.abspath(spec) if path else os.path.abspath(name + ".py")
    taken = sys.modules.get(name)
    if taken is not None and os.path.isfile(mine) and \
            os.path.realpath(getattr(taken, "__file__", "") or "") != os.path.realpath(mine):
        raise ImportError(f"the module name {name!r} is taken by {taken.__file__}, so {mine} would "
                          f"not run; rename yours (e.g. my_{name}.py)")
    if not path and taken is None and importlib.util.find_spec(name) is None:
        raise ImportError(f"no module {name!r} in the current directory ({os.getcwd()}) or on the "
                          f"path; name its file instead: --drafter path/to/{name}.py:FACTORY")
    if not path or taken is not None:
        return taken or importlib.import_module(name)
    where = importlib.util.spec_from_file_location(name, mine)
    if where is None or not os.path.isfile(mine):
        raise ImportError(f"no such file: {spec}")
    sys.modules[name] = module = importlib.util.module_from_spec(where)
    where.loader.exec_module(module)
    return module


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


class Recorded:
    """A drafter that keeps what bpd_decode hands it and what it answers: (logprobs, context,
    drafts) a call, for properties exactness cannot see (which heads it saw, the order of drafts)."""

    def __init__(self, drafter):
        self.drafter, self.seen = drafter, []
        self.name, self.max_drafts = "recorded", getattr(drafter, "max_drafts", 1)

    def __call__(self, logprobs, context):
        drafts = self.drafter(logprobs, context)
        self.seen.append((logprobs, list(context), drafts))
        return drafts


class Checked:
    """A drafter as bpd_decode calls it: each answer checked by minibpd.check_drafts (the
    contract as code), which names the rule a broken answer breaks."""

    def __init__(self, drafter, model):
        self.drafter, self.V = drafter, model.config.vocab_size

    def __call__(self, logprobs, context):
        drafts = self.drafter(logprobs, list(context))
        return minibpd.check_drafts(drafts, self.drafter, len(logprobs), context[-1], self.V)
