"""blocks: the matrix products of models/llama.py: fixed-shape products for its batch-invariant
mode (its module docstring says why), a function applied by blocks of exactly `rows` rows, each a
fresh, aligned tensor; a plain product widened from bf16 to float32 for a prefill; and the
product itself, on a weight packed once where the CPU's oneDNN serves it. Only torch and
the standard library.
"""
import functools
import types

import torch
import torch.nn.functional as F

PACKED = True    # False: F.linear everywhere (tools/peer_bench.py --unpacked)
# Row-invariant products (ours; models/machine.py): {kernel_key: n} where this CPU's kernel gives
# every row of a product of up to n rows the bits of a one-row product, whatever the row count and
# the row's place (row_invariance probes it). Such a product needs no fixed block: a batch-
# invariant call runs it on its own rows, n at a time. Empty: every product in fixed blocks.
FREE = {}


class Derived(dict):
    """derived()'s tensors on one module, {name: (key, tensor)}: a copy of the module (deepcopy,
    pickle) starts with none, since it remakes what it needs and a packed weight is an opaque
    oneDNN tensor that cannot be copied."""

    def __deepcopy__(self, memo):
        return Derived()

    def __reduce__(self):
        return Derived, ()


def derived(module, name, key, make):
    """A tensor (or a small object of tensors) made from a module's weights, kept outside its
    state dict until `key` (the weight's address and version) changes: make() runs once, not in
    every call. Threads sharing the module read an entry once: never one thread's key with
    another's tensor."""
    kept = module.__dict__.setdefault("_derived", Derived())
    entry = kept.get(name)
    if entry is None or entry[0] != key:
        entry = kept[name] = (key, make())
    return entry[1]


@functools.cache
def packs(dtype):
    """Whether this torch's oneDNN computes a linear layer on a weight packed once (the ops
    inductor's CPU backend uses, torch.ops.mkldnn) for `dtype` here: probed once on a small
    product; absent, or refused (bf16 on a CPU without AVX-512), it is F.linear's."""
    try:
        w = torch.ones(8, 16, dtype=dtype)
        out = torch.ops.mkldnn._linear_pointwise(
            torch.ones(3, 16, dtype=dtype), torch.ops.mkldnn._reorder_linear_weight(w, None),
            None, "none", [], "")
        return torch.equal(out.float(), torch.full((3, 8), 16.0))
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


GROUP = 32       # weights per 4-bit group (int4_weight): the GGUF's Q4_1 block size
INT4_ROWS = 16   # int4_weight needs out_features a multiple of this (torch's packing)


@functools.cache
def int4_ready():
    """Whether this torch has the CPU 4-bit weight-only product (torch._weight_int4pack_mm_for_cpu,
    the op gpt-fast's int4 mode uses on a CPU) and it computes a small product as the dequantized
    weights do, here."""
    try:
        layer = types.SimpleNamespace(weight=torch.randn(INT4_ROWS, 2 * GROUP,
                                                         generator=torch.Generator().manual_seed(0)),
                                      bias=None, bits=4)
        x = torch.randn(3, 2 * GROUP, generator=torch.Generator().manual_seed(1))
        want = x.to(torch.bfloat16).float() @ int4_weight(layer.weight).dense.T
        return torch.allclose(int4_linear(layer, x).float(), want, atol=0.05, rtol=0.02)
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


def int4_problem(layer):
    """'' if a Linear (weight [N, K], no bias) can run on 4-bit groups here (int4_weight), else
    why not."""
    w = layer.weight
    if not int4_ready():
        return f"this torch ({torch.__version__}) has no CPU int4 product (int4_ready)"
    if layer.bias is not None:
        return "int4 products take weights without a bias"
    if w.device.type != "cpu":
        return f"int4 products run on the CPU only (this weight is on {w.device.type})"
    if w.shape[0] % INT4_ROWS or w.shape[1] % GROUP:
        return (f"int4 needs out_features a multiple of {INT4_ROWS} and in_features a multiple "
                f"of {GROUP}, got a weight of shape {tuple(w.shape)}")
    return ""


def int4_weight(w):
    """A float weight W [N, K] on 4 bits, GROUP weights along K sharing a scale s and zero z
    (asymmetric, gpt-fast's form: W ~ (q - 8) s + z, q in 0..15, s = (max - min) / 15, z = min +
    8 s, s and z rounded to bf16, the kernel's type). For the GGUF's Q4_1 blocks (32 weights,
    d q + m) this finds the same q where a block spans 0..15, with d and m rounded to bf16.
    -> namespace(packed: the kernel's layout, scales_zeros [K/GROUP, N, 2] bf16, dense: the
    values the kernel computes with, [N, K] float32)."""
    N, K = w.shape
    g = w.detach().float().reshape(N, K // GROUP, GROUP)
    low, high = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = ((high - low) / 15).clamp(min=1e-12)
    q = ((g - low) / scale).round().clamp(0, 15)                          # [N, K/G, G]
    s, z = scale.to(torch.bfloat16), (low + 8 * scale).to(torch.bfloat16)
    dense = ((q - 8) * s.float() + z.float()).reshape(N, K)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.reshape(N, K).int(), 1)
    scales_zeros = torch.cat([s, z], -1).transpose(0, 1).contiguous()    # [K/G, N, 2]
    return types.SimpleNamespace(packed=packed, scales_zeros=scales_zeros, dense=dense)


def int4_linear(layer, x):
    """x [..., K] @ W^T on W's 4-bit groups (int4_weight, made once while W is unchanged), the
    inputs rounded to bf16 (the kernel's), the sums in float32, the result rounded to bf16 and
    returned in x's dtype. Ours, for decoding only (no gradients): memory-bound one-token calls
    read an eighth of float32's bytes (docs/real-model.md, "int4")."""
    w = layer.weight
    if torch.is_grad_enabled() and (w.requires_grad or x.requires_grad):
        raise RuntimeError("int4 products are for decoding: they have no gradients")
    q = derived(layer, "_int4", (w.data_ptr(), w._version), lambda: int4_weight(w))
    flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, q.packed, GROUP, q.scales_zeros)
    return out.view(*x.shape[:-1], w.shape[0]).to(x.dtype)


def linear(layer, x):
    """x [..., K] @ W^T + b -> [..., N] for anything with `weight` W [N, K] and `bias` (a Linear),
    x in W's dtype: on W packed once for oneDNN where it serves W's dtype (packs; kept on `layer`
    while W is unchanged; docs/real-model.md, "Packed weights"), else F.linear. The two kernels
    round differently, so the choice is made here alone (PACKED, the device, the dtype), never by
    the caller's state: under autograd the packed product is the forward too (PackedLinear)."""
    if getattr(layer, "bits", None) == 4:          # 4-bit weights (smollm's int4 precision)
        return int4_linear(layer, x)
    w, bias = layer.weight, layer.bias
    if not PACKED or w.device.type != "cpu" or not packs(w.dtype):
        return F.linear(x, w, bias)
    p = derived(layer, "_packed", (w.data_ptr(), w._version, w.dtype),
                lambda: torch.ops.mkldnn._reorder_linear_weight(w.detach(), None))
    flat = x.reshape(-1, x.shape[-1])
    if torch.is_grad_enabled():        # the same kernel, with gradients (Function.apply costs)
        out = PackedLinear.apply(flat, w, p, bias)
    else:
        out = torch.ops.mkldnn._linear_pointwise(flat, p, bias, "none", [], "")
    return out.view(*x.shape[:-1], w.shape[0])


class PackedLinear(torch.autograd.Function):
    """oneDNN's product on the packed weight p (forward) with F.linear's gradients: x [M, K],
    w [N, K], bias [N] or None -> [M, N]. The weights' gradients flow to w, never to p."""

    @staticmethod
    def forward(ctx, x, w, p, bias):
        ctx.save_for_backward(x, w)
        ctx.has_bias = bias is not None
        return torch.ops.mkldnn._linear_pointwise(x, p, bias, "none", [], "")

    @staticmethod
    def backward(ctx, grad):                                              # grad [M, N]
        x, w = ctx.saved_tensors
        dx = grad @ w if ctx.needs_input_grad[0] else None                # [M, K]
        dw = grad.T @ x if ctx.needs_input_grad[1] else None              # [N, K]
        db = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[3] else None
        return dx, dw, None, db


def by_rows(fn, x, rows, dtype=None):
    """fn applied to x [..., K] as rows [N, K] -> [..., K']. rows=None: one call on all N rows.
    rows=R: calls on blocks of exactly R rows (cast to `dtype` if given), the last one
    zero-padded, each block a fresh tensor: every operation inside fn sees one shape and one
    memory alignment (BLAS kernels branch on both), whatever N is (batch invariance)."""
    flat = x.reshape(-1, x.shape[-1])
    padded = flat.contiguous() if rows is None else padded_copy(flat, rows, 1, dtype=dtype)
    if rows is None or len(padded) == rows:   # one block (every greedy step): the copy itself
        out = fn(padded)
    else:
        out = torch.cat([fn(padded[i:i + rows].clone()) for i in range(0, len(padded), rows)])
    return out[:len(flat)].view(*x.shape[:-1], out.shape[-1])


def linear_rows(layer, x, rows, wide=False):
    """layer(x) for a Linear on activations x [M, K] -> [M, K'], by blocks of exactly `rows`
    rows in batch-invariant mode: the rows padded and cast to the weight's dtype in one copy,
    and only the M real rows of the product cast back. The matmul is what needs the fixed
    shape; the operations between matmuls run on the call's own rows (module docstring). Where
    the kernel is row-invariant here (FREE), the call's own rows instead, n at a time.
    rows=None: one plain product (widened, when `wide`, for bf16 weights)."""
    if rows is None:
        return widened(layer, x) if wide and layer.weight.dtype == torch.bfloat16 else layer(x)
    free = FREE.get(kernel_key(layer))
    if free:                                  # fresh copies, as the probe's: aligned alike
        dtype = layer.weight.dtype
        return torch.cat([linear(layer, x[i:i + free].to(dtype, copy=True)).to(x.dtype)
                          for i in range(0, len(x), free)])
    return by_rows(lambda b: linear(layer, b), x, rows, layer.weight.dtype).to(x.dtype)


def kernel_key(layer):
    """What picks a product's kernel here: the weight's shape, dtype and device, whether it runs
    packed (linear), and its bits (4: int4_linear; None: its dtype's)."""
    w, bits = layer.weight, getattr(layer, "bits", None)
    return (tuple(w.shape), str(w.dtype), w.device.type, PACKED and packs(w.dtype), bits)


@torch.no_grad()
def row_invariance(layer, most):
    """The most rows n <= `most` for which linear(layer, x) of every m <= n rows gives each row
    the bits that row gets alone (0: not even two), on random rows in the weight's dtype. A
    kernel's order of sums depends on the shapes, not on the values, so rows that agree here
    agree for any values; each m is tried, since kernels split off remainder rows."""
    w = layer.weight
    x = torch.randn(most, w.shape[1], generator=torch.Generator().manual_seed(0)).to(w.dtype)
    alone = torch.cat([linear(layer, x[i:i + 1].clone()) for i in range(most)])
    for m in range(2, most + 1):
        if not torch.equal(linear(layer, x[:m].clone()), alone[:m]):
            return m - 1 if m > 2 else 0
    return most


def widened(layer, x):
    """A bf16 Linear's product computed in float32 on the same bf16 values: the inputs rounded to
    bf16, each product of two bf16 numbers exact in float32, the sums in float32, the result
    rounded to bf16. Ours, for a prefill where bf16 has no dot products (LlamaConfig.wide_prefill;
    docs/real-model.md, "Prefill"). x [M, K] -> [M, K']."""
    bias = None if layer.bias is None else layer.bias.float()
    out = F.linear(x.to(torch.bfloat16).float(), layer.weight.float(), bias)
    return out.to(torch.bfloat16).to(x.dtype)


def padded_copy(t, row_multiple, col_multiple, fill=0.0, dtype=None):
    """A fresh contiguous copy of t [..., n, m] (cast to `dtype` if given), zero-padded (or
    `fill`) to multiples of the given sizes in its last two dims."""
    n, m = t.shape[-2:]
    out = t.new_full((*t.shape[:-2], n + -n % row_multiple, m + -m % col_multiple), fill,
                     dtype=dtype)
    out[..., :n, :m] = t
    return out
