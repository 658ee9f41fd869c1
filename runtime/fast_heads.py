"""fast_heads: the fast twin of minibpd.GPT's heads, the model every command runs by default.

minibpd.GPT.head_logits calls each of the h - 1 BPDHeads in turn (Stern §6, readable). On a CPU
those 2(h - 1) small matmuls cost about as much as the trunk, so FastGPT runs them as one wide
matmul (every head's W1 stacked) and one batched matmul (every W2), on weights stacked once and
cached. The forward pass equals GPT's to rounding, not bit for bit: the wide matmul and the small
ones are different kernels (AVX2, AVX-512, AMX) that sum in different orders; the tests bound the
difference to a few ulp (tests/runtime/test_fast_heads.py). Gradients sum in another order too.
`reference = True` (the `--reference` switch) runs GPT's own.
models/llama.py stacks its Stern-form heads the same way (head_states).
"""
import copy
import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F

from minibpd import GPT, is_int


def head_states(heads, x, act=F.gelu):
    """x [N, C] -> [N, h, C]: x, then every head's x + W2 act(W1 x), as one wide matmul and one
    batched matmul over the heads' stacked weights. Computes in the weights' dtype, returns x's."""
    w1, b1, w2, b2 = stacked_weights(heads)  # [(h-1)C, C], [(h-1)C], [h-1, C, C], [h-1, 1, C]
    N, C, H = x.shape[0], x.shape[1], len(heads)
    hidden = act(F.linear(x.to(w1.dtype), w1, b1).to(x.dtype))                 # [N, (h-1)C]
    hidden = hidden.view(N, H, C).transpose(0, 1).to(w2.dtype)                # [h-1, N, C]
    y = x + torch.baddbmm(b2, hidden, w2).to(x.dtype)                         # [h-1, N, C]
    return torch.cat([x[None], y]).transpose(0, 1)                            # [N, h, C]


def stacked_weights(heads):
    """The heads' weights stacked (a ModuleList of BPDHeads); cached on that list at inference,
    stacked afresh when any weight changes (in place: its _version; its data: its data_ptr), and
    never cached under autograd. The parameters are read afresh every call, so a replaced one
    (load_state_dict(assign=True)) is seen; through the modules' dicts, as nn.Module's attribute
    lookup costs more than the heads' arithmetic. A heads_view has its own list, hence cache."""
    memo, training = heads.__dict__, heads.training or torch.is_grad_enabled()
    ps = [hd._modules[layer]._parameters[name] for hd in heads for layer in ("fc", "proj")
          for name in ("weight", "bias")]             # per head: fc.weight, fc.bias, proj.weight, ...
    key, kept = tuple((p.data_ptr(), p._version) for p in ps), memo.get("_stacked")
    if training or kept is None or kept[0] != key:     # (key, stack): one entry, read once, so
        stacked = (torch.cat(ps[0::4]), torch.cat(ps[1::4]),          # threads never mix them
                   torch.stack([p.t() for p in ps[2::4]]),             # proj: [h-1, C_in, C_out]
                   torch.stack([p[None] for p in ps[3::4]]))           # [h-1, 1, C]
        if training:                                                    # keep autograd intact
            return stacked
        kept = memo["_stacked"] = (key, stacked)
    return kept[1]


class FastGPT(GPT):
    """minibpd.GPT with its heads stacked (head_states); everything else is GPT's."""
    reference = False       # True: GPT.head_logits, each head one by one (--reference)

    def head_logits(self, z, last=None):
        if self.reference or not self.heads:
            return super().head_logits(z)
        zs = head_states(self.heads, z.reshape(-1, z.shape[-1]))                # [N, h, C]
        return self.lm_head(zs.view(*z.shape[:-1], *zs.shape[1:]))

    def flop_params(self):
        """Parameters a token's forward pass multiplies by: all but the position table."""
        return sum(p.numel() for p in self.parameters()) - self.pos_emb.weight.numel()

    def first_heads(self, n):
        return heads_view(self, n)


def heads_view(model, n):
    """The model using only heads 1..n, weights shared: plain BPD with n heads (n = 1: greedy);
    every model family's first_heads. Its own module table and head list (hence its own stacked
    heads), the config saying n heads."""
    if not is_int(n) or not 1 <= n <= model.config.n_bpd_heads:
        raise ValueError(f"heads must be an integer from 1 to {model.config.n_bpd_heads}, got {n!r}")
    view = copy.copy(model)                       # shares parameters; own module table
    view._modules = dict(model._modules)
    view.heads = nn.ModuleList(list(model.heads)[:n - 1])
    view.config = dataclasses.replace(model.config, n_bpd_heads=n)
    return view
