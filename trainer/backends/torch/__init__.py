"""The portable backends (PyTorch + PEFT trainer, transformers rollout engine), which run on a
CPU too: the trainer, the engine, the LoRA targets against a checkpoint, and the merged policy
of ``--lora-serving merged``."""
