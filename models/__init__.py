"""models: model families beside minibpd.py's character GPT, each one module that
runtime.checkpoint.MODEL_FAMILIES names by checkpoint kind: llama (a batch-invariant Llama with BPD heads,
built from llama_layers) and smollm (SmolLM2-135M-Instruct's heads checkpoint, loaded from the
GGUF and tokenizer that smollm_gguf reads)."""
