"""training: what train_heads.py (the joint loss and the one fit loop) builds on and hands over to:
its command line (cli), the corpus and every mode's settings (fit), and training a trained model
further: self-distillation, the tasks model, SmolLM2's heads (finetune)."""
