"""Ray placement: one placement group, the training ranks and the rollout engines as actors.

The group has one bundle per device: ``--actor-num-nodes x --actor-num-gpus-per-node`` for the
training ranks and, unless ``--colocate``, ``--rollout-num-gpus`` more for the engines. A bundle
is ``{"GPU": 1, "CPU": 1}`` on GPUs and ``{"CPU": 1}`` on the CPU. Colocated, a rank and an
engine share a bundle (half of it each) and take turns on the device. Engine ``i`` starts at
bundle ``i x --rollout-num-gpus-per-engine`` of its range and drives that many devices.

The training ranks form one torch.distributed group (NCCL on GPUs, gloo on the CPU) whose
rendezvous address is rank 0's node and a free port there. Every training call reaches every
rank (a backend's calls may be collective); data shards go by data-parallel rank.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trainer.arguments import PROG
from trainer.backends import shared_base
from trainer.backends.base import (
    ForwardOutput,
    Generation,
    LoraAdapter,
    LossFn,
    SamplingParams,
    StepResult,
    TrainBatch,
    adapter_digest,
)
from trainer.backends.colocate import Colocation
from trainer.config import PlacementConfig, TrainConfig
from trainer.job.memory_estimate import DeviceMemory

PLACEMENT_TIMEOUT_S = 120.0
COLOCATED_SHARE = 0.5


class PlacementError(RuntimeError):
    """The cluster cannot hold the placement group (one line)."""


@dataclass(frozen=True)
class Layout:
    device: str  # "cpu" or "cuda"
    train_bundles: tuple[int, ...]  # bundle of each training rank
    engine_bundles: tuple[int, ...]  # first bundle of each rollout engine
    num_bundles: int
    colocate: bool

    @property
    def bundle(self) -> dict[str, float]:
        return {"CPU": 1.0} if self.device == "cpu" else {"CPU": 1.0, "GPU": 1.0}

    @property
    def share(self) -> float:
        """Fraction of a bundle each actor takes."""
        return COLOCATED_SHARE if self.colocate else 1.0

    def needs(self) -> dict[str, float]:
        return {k: v * self.num_bundles for k, v in self.bundle.items()}


def plan_layout(placement: PlacementConfig, device: str) -> Layout:
    ranks = placement.actor_num_gpus
    per_engine = placement.rollout_num_gpus_per_engine
    engines = placement.rollout_num_gpus // per_engine
    first = 0 if placement.colocate else ranks
    return Layout(
        device=device,
        train_bundles=tuple(range(ranks)),
        engine_bundles=tuple(first + i * per_engine for i in range(engines)),
        num_bundles=ranks if placement.colocate else ranks + placement.rollout_num_gpus,
        colocate=placement.colocate,
    )


def resolve_device(placement: PlacementConfig, cluster: dict[str, float]) -> str:
    """``--device auto``: cuda when the cluster has a GPU per training rank, else cpu."""
    if placement.device != "auto":
        return placement.device
    return "cuda" if cluster.get("GPU", 0) >= placement.actor_num_gpus else "cpu"


def device_memory(python: str | None) -> DeviceMemory:
    """Free and total memory of one of the cluster's GPUs, measured by a Ray task on a GPU in
    the training ranks' interpreter (`python`, ``--train-python``), before the job reserves
    them."""
    import ray

    def free_and_total() -> tuple[int, int]:
        import torch

        free, total = torch.cuda.mem_get_info(0)
        return int(free), int(total)

    task = ray.remote(num_gpus=1, num_cpus=0)(free_and_total)
    try:
        free, total = ray.get(
            task.options(**runtime_env(python)).remote(), timeout=PLACEMENT_TIMEOUT_S
        )
    except ray.exceptions.GetTimeoutError:
        raise PlacementError(
            f"--colocate-memory auto: no GPU free within {PLACEMENT_TIMEOUT_S:.0f} s to measure "
            "its memory (is another job holding the devices?)"
        ) from None
    return DeviceMemory(free=free, total=total)


def check_resources(layout: Layout, cluster: dict[str, float]) -> None:
    short = {
        k: (v, cluster.get(k, 0.0)) for k, v in layout.needs().items() if cluster.get(k, 0) < v
    }
    if short:
        have = ", ".join(f"{k} {int(h)} of {int(v)} needed" for k, (v, h) in sorted(short.items()))
        raise PlacementError(
            f"the Ray cluster cannot hold {layout.num_bundles} bundle(s) of {layout.bundle} "
            f"({have}); start Ray with more resources (ray start --num-cpus/--num-gpus) or "
            "ask for fewer devices"
        )


def local_gpu_index(gpu_id: str, environ: dict[str, str] | None = None) -> int:
    """torch's index of the GPU Ray assigned: its position among the visible devices.

    Ray narrows ``CUDA_VISIBLE_DEVICES`` to the actor's GPU (index 0), unless the launcher set
    ``RAY_EXPERIMENTAL_NOSET_*_VISIBLE_DEVICES``, where all devices stay visible.
    """
    environ = dict(os.environ) if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES") or environ.get("HIP_VISIBLE_DEVICES")
    if visible:
        ids = [part.strip() for part in visible.split(",")]
        if gpu_id in ids:
            return ids.index(gpu_id)
    return int(gpu_id)


def actor_device(kind: str) -> str:
    if kind == "cpu":
        return "cpu"
    import ray

    gpu_ids = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
    return f"cuda:{local_gpu_index(str(gpu_ids[0]))}" if gpu_ids else "cuda:0"


def quiet_progress_bars() -> None:
    """No per-actor weight-loading progress bars interleaved with the metrics lines."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class TrainWorker:
    """One data-parallel training rank (a Ray actor) around a `PolicyTrainer`."""

    def __init__(
        self, config: TrainConfig, rank: int, world_size: int, kind: str, total_steps: int
    ) -> None:
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.kind = kind
        self.total_steps = total_steps
        self.trainer: Any = None

    def rendezvous(self) -> tuple[str, int]:
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def setup(self, master_addr: str, master_port: int) -> tuple[str, int]:
        """Join the process group, build the trainer; returns (device, data-parallel rank)."""
        import torch
        import torch.distributed as dist

        from trainer.backends import registry

        quiet_progress_bars()
        device = actor_device(self.kind)
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))
        dist.init_process_group(
            backend="gloo" if device == "cpu" else "nccl",
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=self.rank,
            world_size=self.world_size,
        )
        self.trainer = registry.create_trainer(self.config, device, total_steps=self.total_steps)
        return device, int(getattr(self.trainer, "data_parallel_rank", self.rank))

    def forward(self, batches: Sequence[TrainBatch], with_adapter: bool) -> list[ForwardOutput]:
        return [self.trainer.forward(b, with_adapter=with_adapter) for b in batches]

    def train_step(self, batches: Sequence[TrainBatch], loss_fn: LossFn) -> StepResult:
        return self.trainer.train_step(batches, loss_fn)

    def export_adapter(self) -> LoraAdapter:
        return self.trainer.export_adapter()

    def adapter_digest(self) -> str:
        return adapter_digest(self.trainer.export_adapter())

    def lend_base(self) -> bytes:
        """The trainer's frozen base of the adapted layers for an engine on this GPU
        (`shared_base`): IPC handles, the memory stays this actor's."""
        return shared_base.pack(self.trainer.merged_base())

    def save(self, path: str) -> None:
        self.trainer.save(Path(path))

    def load(self, path: str) -> None:
        self.trainer.load(Path(path))

    def release_memory(self) -> None:
        self.trainer.release_memory()

    def resume_memory(self) -> None:
        self.trainer.resume_memory()


class RolloutWorker:
    """Rollout engine `index` (a Ray actor) around a `RolloutEngine`."""

    def __init__(self, config: TrainConfig, kind: str, index: int) -> None:
        from trainer.backends import registry

        quiet_progress_bars()
        self.device = actor_device(kind)
        self.engine = registry.create_rollout(config, self.device, engine_index=index)

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Generation]:
        return self.engine.generate(prompts, params)

    def load_adapter(self, adapter: LoraAdapter) -> None:
        self.engine.load_adapter(adapter)

    def borrow_base(self, payload: bytes) -> None:
        self.engine.borrow_base(shared_base.unpack(payload))

    def score(self, token_ids: Sequence[int]) -> list[list[float]]:
        return self.engine.score(token_ids)

    def release_memory(self) -> None:
        self.engine.release_memory()

    def resume_weights(self) -> None:
        self.engine.resume_weights()

    def resume_memory(self) -> None:
        self.engine.resume_memory()


class RayTrainerGroup:
    """The `TrainerGroup` of `trainer.loop` over `TrainWorker` actors.

    Its `world_size` is the data-parallel size: workers of one data-parallel rank (Megatron's
    tensor/pipeline/context-parallel peers) get the same shard, and the first of them answers.
    Every call reaches every worker, since a backend's calls may be collective.
    """

    def __init__(self, workers: Sequence[Any], dp_ranks: Sequence[int]) -> None:
        self.workers = list(workers)
        self.dp_ranks = list(dp_ranks)
        self.world_size = max(self.dp_ranks) + 1
        self.leaders = [self.dp_ranks.index(d) for d in range(self.world_size)]

    def _scatter(self, method: str, shards: Sequence[Sequence[TrainBatch]], *extra: Any) -> list:
        import ray

        refs = [
            getattr(worker, method).remote(list(shards[d]), *extra)
            for worker, d in zip(self.workers, self.dp_ranks, strict=True)
        ]
        results = ray.get(refs)
        return [results[i] for i in self.leaders]

    def _all(self, method: str, *args: Any) -> None:
        import ray

        ray.get([getattr(w, method).remote(*args) for w in self.workers])

    def forward(
        self, shards: Sequence[Sequence[TrainBatch]], *, with_adapter: bool
    ) -> list[list[ForwardOutput]]:
        return self._scatter("forward", shards, with_adapter)

    def train_step(
        self, shards: Sequence[Sequence[TrainBatch]], loss_fn: LossFn
    ) -> list[StepResult]:
        return self._scatter("train_step", shards, loss_fn)

    def export_adapter(self) -> LoraAdapter:
        import ray

        refs = [w.export_adapter.remote() for w in self.workers]
        adapter = ray.get(refs[0])
        ray.wait(refs[1:], num_returns=len(refs) - 1, fetch_local=False)
        return adapter

    def adapter_digests(self) -> list[str]:
        import ray

        return ray.get([w.adapter_digest.remote() for w in self.workers])

    def lend_base(self) -> bytes:
        """The one training rank's `TrainWorker.lend_base`."""
        import ray

        [worker] = self.workers
        return ray.get(worker.lend_base.remote())

    def save(self, path: Path) -> None:
        self._all("save", str(path))

    def load(self, path: Path) -> None:
        self._all("load", str(path))

    def release_memory(self) -> None:
        self._all("release_memory")

    def resume_memory(self) -> None:
        self._all("resume_memory")


class RayEngineGroup:
    """All rollout engines as one `RolloutEngine`: prompts split evenly over `RolloutWorker`s."""

    def __init__(self, workers: Sequence[Any]) -> None:
        self.workers = list(workers)

    def _all(self, method: str, *args: Any) -> None:
        import ray

        ray.get([getattr(w, method).remote(*args) for w in self.workers])

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Generation]:
        import ray

        count = len(self.workers)
        size, extra = divmod(len(prompts), count)
        calls, start = [], 0
        for i, worker in enumerate(self.workers):
            end = start + size + (1 if i < extra else 0)
            chunk = replace(params, first_request=params.first_request + start)
            calls.append(worker.generate.remote(list(prompts[start:end]), chunk))
            start = end
        return [g for chunk in ray.get(calls) for g in chunk]

    def load_adapter(self, adapter: LoraAdapter) -> None:
        import ray

        ref = ray.put(adapter)
        self._all("load_adapter", ref)

    def borrow_base(self, payload: bytes) -> None:
        self._all("borrow_base", payload)

    def score(self, token_ids: Sequence[int]) -> list[list[float]]:
        import ray

        results = ray.get([w.score.remote(list(token_ids)) for w in self.workers])
        return [scores for result in results for scores in result]

    def release_memory(self) -> None:
        self._all("release_memory")

    def resume_weights(self) -> None:
        self._all("resume_weights")

    def resume_memory(self) -> None:
        self._all("resume_memory")


@dataclass
class Cluster:
    placement_group: Any
    colocation: Colocation[RayTrainerGroup, RayEngineGroup]

    @property
    def trainers(self) -> RayTrainerGroup:
        return self.colocation.trainer

    @property
    def engines(self) -> RayEngineGroup:
        return self.colocation.engine

    def shutdown(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for worker in [*self.trainers.workers, *self.engines.workers]:
            ray.kill(worker)
        remove_placement_group(self.placement_group)


def runtime_env(python: str | None) -> dict[str, Any]:
    """An actor's Ray runtime env: another interpreter (``--train-python``/``--rollout-python``)
    where the backend's packages live in an environment of their own."""
    return {"runtime_env": {"py_executable": python}} if python else {}


def launch(config: TrainConfig, layout: Layout, *, total_steps: int) -> Cluster:
    """Reserve the placement group and start the rollout engines, then the training ranks
    (`Colocation.start_engines_first` says why in that order)."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    check_resources(layout, ray.cluster_resources())
    group = placement_group([layout.bundle] * layout.num_bundles, strategy="PACK")
    try:
        ray.get(group.ready(), timeout=PLACEMENT_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        raise PlacementError(
            f"{layout.num_bundles} bundle(s) of {layout.bundle} were not placed within "
            f"{PLACEMENT_TIMEOUT_S:.0f} s (is another job holding the devices?)"
        ) from None

    def options(bundle: int, python: str | None) -> dict[str, Any]:
        return {
            "num_cpus": layout.share,
            "num_gpus": 0 if layout.device == "cpu" else layout.share,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=group, placement_group_bundle_index=bundle
            ),
            **runtime_env(python),
        }

    def start_engines() -> RayEngineGroup:
        rollout_cls = ray.remote(RolloutWorker)
        engines = [
            rollout_cls.options(**options(b, config.placement.rollout_python)).remote(
                config, layout.device, i
            )
            for i, b in enumerate(layout.engine_bundles)
        ]
        ray.get([e.__ray_ready__.remote() for e in engines])
        return RayEngineGroup(engines)

    def start_trainers() -> RayTrainerGroup:
        world = len(layout.train_bundles)
        train_cls = ray.remote(TrainWorker)
        trainers = [
            train_cls.options(**options(b, config.placement.train_python)).remote(
                config, rank, world, layout.device, total_steps
            )
            for rank, b in enumerate(layout.train_bundles)
        ]
        master_addr, master_port = ray.get(trainers[0].rendezvous.remote())
        ranks = ray.get([t.setup.remote(master_addr, master_port) for t in trainers])
        return RayTrainerGroup(trainers, [dp_rank for _, dp_rank in ranks])

    colocation = Colocation.start_engines_first(
        start_engines, start_trainers, colocate=config.placement.swaps_memory
    )
    if shared_base.lends_base(config, layout.device):
        colocation.engine.borrow_base(colocation.trainer.lend_base())
        print(f"{PROG}: {shared_base.LENT}", flush=True)
    return Cluster(group, colocation)
