"""models: model families beside minibpd.py's character GPT, each one module that
runtime.checkpoint.MODEL_FAMILIES names by checkpoint kind: llama (a batch-invariant Llama with BPD heads)
and smollm (SmolLM2-135M-Instruct's GGUF, tokenizer and heads checkpoint)."""
