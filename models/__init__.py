"""models: model families beside minibpd.py's character GPT: a batch-invariant Llama with BPD
heads (llama, its layers in llama_layers) and SmolLM2-135M-Instruct loaded into it from its GGUF
(smollm, the module runtime.checkpoint.MODEL_FAMILIES names; the file read by smollm_gguf)."""
