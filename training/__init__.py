"""training: the library behind train_heads.py: the corpus, losses and the one fit loop (fit),
and training a trained model further: self-distillation, the tasks model, SmolLM2's heads
(finetune)."""
