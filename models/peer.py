"""peer: SmolLM2 as Hugging Face transformers loads it, the independent implementation that
tests/models/test_peer.py (exactness) and tools/peer_bench.py (speed) compare minibpd's with.
transformers and accelerate are an optional extra (pyproject's `peer`), imported inside the
function only; without them it raises one ImportError naming the pip command.
"""
import contextlib
import io
import os

import torch

from models import smollm_gguf

PEER_INSTALL = "pip install transformers==5.24.0 accelerate==1.15.0"


def transformers_model(dtype=torch.float32):
    """The same GGUF loaded by Hugging Face transformers (its own GGUF reader and LlamaForCausalLM:
    an independent implementation), offline, for the peer bench and the exactness test. Its
    generation config ends nothing (no eos): like minibpd it decodes exactly the tokens asked for.
    The optional packages are named in one ImportError when missing."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import accelerate  # noqa: F401  (transformers needs it to read a GGUF)
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging
    except ImportError as e:
        raise ImportError(f"the transformers peer needs optional packages ({e.name} is missing): "
                          f"{PEER_INSTALL}") from None
    smollm_gguf.optional_packages()
    path = smollm_gguf.find_gguf()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    with contextlib.redirect_stderr(io.StringIO()):        # its GGUF reader's progress bar
        model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), dtype=dtype,
                                                     gguf_file=os.path.basename(path)).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model
