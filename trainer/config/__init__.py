"""The typed training config of ``train.py``: `TrainConfig` and its groups, one module each."""

from trainer.config.algorithm import AlgorithmConfig
from trainer.config.batch import BatchConfig
from trainer.config.checkpoint import CheckpointConfig
from trainer.config.data import DataConfig, RewardConfig
from trainer.config.evaluation import EvalConfig
from trainer.config.lora import LoraConfig
from trainer.config.megatron import MegatronConfig
from trainer.config.misc import MiscConfig
from trainer.config.optimizer import OptimizerConfig
from trainer.config.placement import PlacementConfig
from trainer.config.preflight import PreflightConfig
from trainer.config.rollout import RolloutConfig
from trainer.config.sglang import SGLangConfig
from trainer.config.torch_trainer import TorchConfig
from trainer.config.train import TrainConfig
from trainer.config.wandb import WandbConfig

__all__ = [
    "AlgorithmConfig", "BatchConfig", "CheckpointConfig", "DataConfig", "EvalConfig",
    "LoraConfig", "MegatronConfig", "MiscConfig", "OptimizerConfig", "PlacementConfig",
    "PreflightConfig", "RewardConfig", "RolloutConfig", "SGLangConfig", "TorchConfig",
    "TrainConfig", "WandbConfig",
]  # fmt: skip
