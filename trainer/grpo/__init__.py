"""GRPO as its papers state it: the loss, the advantage estimators, the rewards and the math
grading behind them, per-token log-probabilities and the dynamic-sampling filter. Functions of
tensors and samples: no Ray, no backend."""
