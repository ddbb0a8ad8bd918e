"""Placement: the backends, the devices of the training ranks and of the rollout engines."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from trainer.config.flags import flag, option, positive


@dataclass(frozen=True)
class PlacementConfig:
    """The backend choices are the registry's names (`trainer.backends.registry`): the argv
    layer supplies them, since the config sits below the backends."""

    TITLE = "placement"

    train_backend: str = flag(
        "torch",
        help="the policy trainer: torch (PyTorch + PEFT, CPU or GPU) or megatron "
        "(Megatron-Bridge, GPUs only; miles' default)",
    )
    rollout_backend: str = flag(
        "hf",
        help="the rollout engines: hf (transformers generate, CPU or GPU) or sglang (SGLang, "
        "GPUs only; what miles runs)",
    )
    actor_num_nodes: int = flag(1, help="nodes of the training ranks")
    actor_num_gpus_per_node: int = flag(
        1,
        help="training ranks per node, one GPU each (one process each with --device cpu) "
        "(miles: 8)",
    )
    num_gpus_per_node: int | None = flag(
        None,
        help="GPUs of a node, only checked to hold --actor-num-gpus-per-node (Ray's resources "
        "decide placement); defaults to --actor-num-gpus-per-node (miles: 8)",
    )
    rollout_num_gpus: int | None = flag(
        None,
        help="GPUs of all rollout engines together; default: the training GPUs when colocated, "
        "else one engine's (--rollout-num-gpus-per-engine)",
    )
    rollout_num_gpus_per_engine: int = flag(
        1,
        help="GPUs per rollout engine (SGLang's tp_size); there are --rollout-num-gpus / N "
        "engines, each serving an equal share of the requests",
    )
    colocate: bool = flag(
        False,
        help="the rollout engines run on the training GPUs, taking turns with the trainer (see "
        "--colocate-memory); else they get --rollout-num-gpus GPUs of their own",
    )
    colocate_memory: str = flag(
        "release",
        choices=("auto", "release", "keep"),
        help="colocated, whether trainer and engine hand the GPU memory to each other between "
        "rollout and training (release) or both stay resident (keep: no swaps, where the "
        "engine's --sglang-mem-fraction-static leaves the trainer room); auto: keep where an "
        "estimate of both fits the GPU, decided at start",
    )
    train_python: str | None = flag(
        None,
        help="Python interpreter of the training actors (Ray runtime env py_executable), for a "
        "trainer whose packages cannot share the job's environment; default: the job's",
    )
    rollout_python: str | None = flag(
        None,
        help="Python interpreter of the rollout engines (as --train-python); default: the job's",
    )
    device: str = flag(
        "auto",
        choices=("auto", "cpu", "cuda"),
        help="device of the training ranks and engines; auto: cuda where a selected backend "
        "needs GPUs or GPUs are found, else cpu (which needs --train-backend torch and "
        "--rollout-backend hf)",
    )
    dtype: str = flag("auto", choices=("auto", "bf16", "fp32"), help="auto: bf16 GPU, fp32 CPU")

    @property
    def swaps_memory(self) -> bool:
        """Whether trainer and engine take turns on the GPUs' memory (``auto`` is decided at
        start, `trainer.job.colocate_memory`, before anything asks)."""
        if self.colocate and self.colocate_memory == "auto":
            raise ValueError("--colocate-memory auto is undecided until the job measures its GPU")
        return self.colocate and self.colocate_memory == "release"

    @property
    def actor_num_gpus(self) -> int:
        return self.actor_num_nodes * self.actor_num_gpus_per_node

    def resolved(self, *, needs_gpu: bool) -> PlacementConfig:
        """`needs_gpu`: a selected backend runs on GPUs only (``--device auto`` is then cuda)."""
        device = "cuda" if self.device == "auto" and needs_gpu else self.device
        return replace(
            self,
            num_gpus_per_node=self.actor_num_gpus_per_node
            if self.num_gpus_per_node is None
            else self.num_gpus_per_node,
            rollout_num_gpus=self.rollout_num_gpus
            if self.rollout_num_gpus is not None
            else self.actor_num_gpus
            if self.colocate
            else self.rollout_num_gpus_per_engine,
            device=device,
            dtype=self.dtype if device == "auto" else self.resolve_dtype(device),
        )

    def resolve_device(self) -> str:
        """``cpu`` or ``cuda`` for this process; ``auto`` probes torch (imported lazily)."""
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def resolve_dtype(self, device: str) -> str:
        """``bf16`` or ``fp32``; ``auto`` is bf16 on a GPU and fp32 on CPU."""
        if self.dtype != "auto":
            return self.dtype
        return "fp32" if device == "cpu" else "bf16"

    def problems(self) -> Iterator[str]:
        yield from positive(
            self, "actor_num_nodes", "actor_num_gpus_per_node", "num_gpus_per_node",
            "rollout_num_gpus", "rollout_num_gpus_per_engine",
        )  # fmt: skip
        for name in ("train_python", "rollout_python"):
            value = getattr(self, name)
            if value is not None and not value.startswith("/"):
                yield f"{option(name)} must be an absolute path (got {value})"
        if self.actor_num_gpus_per_node > self.num_gpus_per_node:
            yield (
                f"--actor-num-gpus-per-node {self.actor_num_gpus_per_node} exceeds "
                f"--num-gpus-per-node {self.num_gpus_per_node}"
            )
        per_engine = self.rollout_num_gpus_per_engine
        if self.actor_num_gpus % per_engine:
            yield (
                f"actor GPUs ({self.actor_num_nodes} node(s) x {self.actor_num_gpus_per_node} = "
                f"{self.actor_num_gpus}) must be divisible by --rollout-num-gpus-per-engine "
                f"{per_engine}"
            )
        if self.rollout_num_gpus % per_engine:
            yield (
                f"--rollout-num-gpus {self.rollout_num_gpus} must be divisible by "
                f"--rollout-num-gpus-per-engine {per_engine}"
            )
        if self.colocate_memory != "release" and not self.colocate:
            yield (
                f"--colocate-memory {self.colocate_memory} needs --colocate (apart, nothing is "
                "swapped anyway)"
            )
        if self.colocate and self.rollout_num_gpus != self.actor_num_gpus:
            yield (
                f"--colocate shares the actor's {self.actor_num_gpus} GPU(s); "
                f"--rollout-num-gpus {self.rollout_num_gpus} differs"
            )
