"""minibpd against an independent implementation: SmolLM2 loaded by Hugging Face transformers
from the same GGUF (its own reader, LlamaForCausalLM). minibpd's float32 greedy_decode gives
transformers' float32 greedy tokens (`generate`, do_sample=False) on 3 prompts x 24 tokens: the
demo's two chat-template prompts and a test-split bench prompt. Skipped, naming the pip command,
without transformers/accelerate or the real model's packages. The speed comparison is
tools/peer_bench.py (docs/real-model.md, "Against transformers"), never a timed test.

    python -m pytest -q tests/models/test_peer.py
"""

import pytest
import torch

import minibpd
from runtime import checkpoint
from tests.helpers import heads_or_skip
from lab import bench
from models import peer, smollm

N = 24


@pytest.fixture(scope="module")
def peers():
    pytest.importorskip("transformers", reason=f"transformers not installed: {peer.PEER_INSTALL}")
    pytest.importorskip("accelerate", reason=f"accelerate not installed: {peer.PEER_INSTALL}")
    heads = heads_or_skip()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ours, ck = checkpoint.load(heads, "cpu", torch.float32)
        yield ours, peer.transformers_model(torch.float32), ck
    finally:
        torch.set_num_threads(threads)


def test_float32_greedy_equals_transformers_greedy(peers):
    ours, hf, ck = peers
    assert hf.dtype == torch.float32 and ours.tok_emb.weight.dtype == torch.float32
    vocab = ck["vocab"]
    prompts = [ids for _, ids in smollm.demo_prompts(vocab)]
    prompts.append(bench.make_prompts(ck["splits"]["test"], vocab, 16)[4])
    for prompt in prompts:
        mine = minibpd.greedy_decode(ours, prompt, N)
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=N, do_sample=False)
        theirs = out[0, len(prompt):].tolist()
        assert len(theirs) == N                     # no end token stops transformers early
        assert mine == theirs, (vocab.decode(mine), vocab.decode(theirs))
