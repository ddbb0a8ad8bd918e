"""The Megatron-Bridge policy trainer (``--train-backend megatron``): the trainer, its provider
and optimizer settings, its token-budget batching and the LoRA names between Megatron and PEFT."""
