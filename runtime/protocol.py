"""protocol: what a model must offer to run in minibpd's decode loop, its drafters and the lab.
minibpd.GPT (the paper's character model) and models/llama.py's Llama both do; a new model
family is one module offering this, plus `from_checkpoint(ck, device, dtype) -> (model, vocab)`
and one line in runtime.checkpoint.MODEL_FAMILIES (optionally `rescorer(model, ck)`, the small LM of
'neural', and `demo_prompts(vocab)`, the demo's prompts).

It is documentation that a type checker can read (typing.Protocol); nothing subclasses it.
"""
from typing import Protocol

import torch

from runtime.kvcache import KVSpec


class BPDModel(Protocol):
    config: object          # vocab_size, block_size (the decode loop's window), n_bpd_heads (h)
    lm_head: torch.nn.Module  # z [..., C] -> logits [..., V]: head 1, the base model's own
    reference: bool         # True: head_logits runs each head one by one (the readable version)

    def forward(self, idx, cache=None, tree=None, prefix=0):
        """idx [P, L] token ids -> final hidden states z [P, L, C]. With a cache (KVCache) the L
        tokens sit at window slots cache.length.. and their keys and values are written there
        (cache.write, per layer), not advanced; tree: (positions [L], mask [L, length + L]) of
        one row holding a token tree (kvcache.tree_layout). prefix: the first `prefix` tokens,
        the same in every row, are a prompt's or a new window's prefill (the decode loop's
        calls pass the uncached tail but its last token); a model may compute them by other
        kernels than the rest (llama.Llama.prefilled), the same way for the same tokens."""

    def head_logits(self, z, last=None):
        """z [..., C] -> the logits of all h heads [..., h, V]; head i predicts i - 1 tokens past
        head 1 (Stern §3): the drafter's input. last: the token just chosen at z (an int or ids
        [...]; None: head 1's argmax), for heads that read it (llama.ChainedHead)."""

    def kv_spec(self) -> KVSpec:
        """The shape of a KVCache for this model: layers, kv heads, head dim, dtype, device."""

    def first_heads(self, n):
        """This model using only heads 1..n, weights shared (plain BPD with n heads)."""

    def flop_params(self) -> int:
        """Parameters a token's forward pass multiplies by: the cost table's FLOPs per token."""
