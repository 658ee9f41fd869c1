"""training: what train_heads.py (the joint loss and the one fit loop) hands over to: its command
line and every mode's settings (cli), and training a trained model further:
self-distillation and the tasks model (finetune), SmolLM2's heads (smollm_heads)."""
