"""blocks: fixed-shape matrix products for models/llama.py's batch-invariant mode (its module
docstring says why): a function applied by blocks of exactly `rows` rows, each a fresh, aligned
tensor, and a plain product widened from bf16 to float32 for a prefill. Only torch.
"""
import torch
import torch.nn.functional as F


def by_rows(fn, x, rows):
    """fn applied to x [..., K] as rows [N, K] -> [..., K']. rows=None: one call on all N rows.
    rows=R: calls on blocks of exactly R rows, the last one zero-padded, each block a fresh
    tensor: every operation inside fn sees one shape and one memory alignment (BLAS kernels
    branch on both), whatever N is (batch invariance, module docstring)."""
    flat = x.reshape(-1, x.shape[-1])
    out = blocks(fn, padded_rows(flat, rows), rows)[:len(flat)]
    return out.view(*x.shape[:-1], out.shape[-1])


def padded_rows(flat, rows):
    """flat [N, K] -> a fresh [M, K], M = N rounded up to a multiple of rows (zero rows below);
    rows=None: flat itself, contiguous."""
    return flat.contiguous() if rows is None else padded_copy(flat, rows, 1)


def linear_rows(layer, x, rows, wide=False):
    """layer(x) for a Linear on activations x [M, K] -> [M, K'], by blocks of exactly `rows`
    rows in batch-invariant mode: the rows padded and cast to the weight's dtype in one copy,
    and only the M real rows of the product cast back. The matmul is what needs the fixed
    shape; the operations between matmuls run on the call's own rows (module docstring).
    rows=None: one plain product (widened, when `wide`, for bf16 weights)."""
    if rows is None:
        return widened(layer, x) if wide and layer.weight.dtype == torch.bfloat16 else layer(x)
    padded = padded_copy(x, rows, 1, dtype=layer.weight.dtype)         # [ceil(M/R) R, K]
    out = blocks(lambda b: F.linear(b, layer.weight, layer.bias), padded, rows)
    return out[:len(x)].to(x.dtype)


def widened(layer, x):
    """A bf16 Linear's product computed in float32 on the same bf16 values: the inputs rounded to
    bf16, each product of two bf16 numbers exact in float32 (8-bit significands), the sums in
    float32 as a bf16 kernel's are (in another order, as any two kernels' are), the result
    rounded to bf16. Ours: on a CPU without bf16 dot products a bf16 product's cost grows with
    its rows and a float32 one's far less (docs/real-model.md, "Prefill"), so a prefill of many
    rows runs this way (LlamaConfig.wide_prefill). x [M, K] -> [M, K']."""
    bias = None if layer.bias is None else layer.bias.float()
    out = F.linear(x.to(torch.bfloat16).float(), layer.weight.float(), bias)
    return out.to(torch.bfloat16).to(x.dtype)


def blocks(fn, x, rows):
    """fn on x [M, K] (M a multiple of rows, or rows=None: all at once) by blocks of `rows` rows,
    each a fresh tensor (one block, every greedy step: x itself, which must be one) -> [M, K']."""
    if rows is None or len(x) == rows:
        return fn(x)
    return torch.cat([fn(x[i:i + rows].clone()) for i in range(0, len(x), rows)])


def padded_copy(t, row_multiple, col_multiple, fill=0.0, dtype=None):
    """A fresh contiguous copy of t [..., n, m] (cast to `dtype` if given), zero-padded (or
    `fill`) to multiples of the given sizes in its last two dims."""
    n, m = t.shape[-2:]
    out = t.new_full((*t.shape[:-2], n + -n % row_multiple, m + -m % col_multiple), fill,
                     dtype=dtype)
    out[..., :n, :m] = t
    return out
