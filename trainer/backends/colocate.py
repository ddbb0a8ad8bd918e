"""Who holds the shared GPUs: the policy trainer or the rollout engine.

With ``--colocate`` both live on the same devices and take turns::

    colocation = Colocation.start_engines_first(start_engines, start_trainers, colocate=True)
                                       # engines built, engine.release_memory(), trainers built
    # (or, with both already built: colocation.start()  # engine.release_memory())
    with colocation.rollout(update=lambda: engine.load_adapter(...)):
                                       # trainer.release_memory(); engine.resume_weights();
                                       # update(); engine.resume_memory()
        engine.generate(...)
    # on exit                          # engine.release_memory(); trainer.resume_memory()
    trainer.train_step(...)

Without ``--colocate``, or colocated with ``--colocate-memory keep`` (both stay resident where
the engine's memory fraction leaves the trainer room), the same phases are tracked and no memory
call is made, so the loop reads the same either way. Calls out of order raise
`ColocateOrderError`. `calls` records every release/resume made, in order. The holders are
anything with ``release_memory()`` and ``resume_memory()`` (a backend, or a group of Ray actors
behind such methods); the engine also with ``resume_weights()``.

The engine comes back in two parts, as miles onloads SGLang: its weights, then the weight
update (`update`), then the rest (KV cache, CUDA graphs). An update's own buffers (an adapter
merged into the base weights: 6.8 GiB at the Qwen3-4B shape) fit while the KV cache is still
released; beside a KV cache that takes most of the GPU (long responses) they would not.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Generic, Protocol, TypeVar


class MemoryHolder(Protocol):
    def release_memory(self) -> None: ...

    def resume_memory(self) -> None: ...


class EngineMemory(MemoryHolder, Protocol):
    def resume_weights(self) -> None:
        """The weights back on the device, the rest (KV cache, CUDA graphs) still released:
        ready for a weight update, not yet for generation. `resume_memory` resumes the rest."""
        ...


class Phase(enum.Enum):
    SETUP = "setup"  # both just built; nothing released yet
    TRAIN = "train"  # trainer resident, engine released (when colocated)
    ROLLOUT = "rollout"  # engine resident, trainer released (when colocated)
    FAILED = "failed"  # an error inside a rollout phase left memory in an unknown state


class ColocateOrderError(AssertionError):
    """A memory phase transition or a backend call made in the wrong phase."""


E = TypeVar("E", bound=EngineMemory)
Timed = Callable[[str], AbstractContextManager[None]]
T = TypeVar("T", bound=MemoryHolder)


class Colocation(Generic[T, E]):
    def __init__(self, trainer: T, engine: E, *, colocate: bool) -> None:
        self.trainer = trainer
        self.engine = engine
        self.colocate = colocate
        self.phase = Phase.SETUP
        self.calls: list[str] = []

    @classmethod
    def start_engines_first(
        cls, start_engines: Callable[[], E], start_trainers: Callable[[], T], *, colocate: bool
    ) -> Colocation[T, E]:
        """Start both in the order shared GPUs need, and leave setup with the trainer resident.

        The engines come first: SGLang sizes its KV cache from the memory free once its own
        weights are loaded, so a trainer building its model on the same GPU at that moment
        makes the engine fail ("Not enough memory"). Colocated, the engines then give their
        memory up before the trainers are built.
        """
        engine = start_engines()
        calls = []
        if colocate:
            engine.release_memory()
            calls.append("engine.release_memory")
        colocation = cls(start_trainers(), engine, colocate=colocate)
        colocation.calls = calls
        colocation.phase = Phase.TRAIN
        return colocation

    def require(self, phase: Phase, doing: str) -> None:
        if self.phase is not phase:
            raise ColocateOrderError(
                f"{doing} needs the {phase.value} phase, but the GPUs are in the "
                f"{self.phase.value} phase"
            )

    def start(self) -> None:
        """Leave setup with the trainer resident (colocated: the engine gives its memory up)."""
        self.require(Phase.SETUP, "start")
        self._call(self.engine, "engine", "release_memory")
        self.phase = Phase.TRAIN

    @contextmanager
    def rollout(
        self, timed: Timed | None = None, *, update: Callable[[], None] | None = None
    ) -> Iterator[None]:
        """The engine holds the GPUs inside the block, the trainer again after it. `update`
        (the engine's weight update) runs first, once the engine's weights are back and before
        its KV cache is. Each swap call runs inside ``timed("<holder>_<method>")`` (the loop's
        step timer)."""
        self.require(Phase.TRAIN, "rollout")
        self._call(self.trainer, "trainer", "release_memory", timed)
        self.phase = Phase.ROLLOUT
        try:
            self._call(self.engine, "engine", "resume_weights", timed)
            if update is not None:
                update()
            self._call(self.engine, "engine", "resume_memory", timed)
            yield
        except BaseException:
            self.phase = Phase.FAILED
            raise
        self._call(self.engine, "engine", "release_memory", timed)
        self._call(self.trainer, "trainer", "resume_memory", timed)
        self.phase = Phase.TRAIN

    def _call(
        self, holder: MemoryHolder, who: str, method: str, timed: Timed | None = None
    ) -> None:
        if self.colocate:
            with timed(f"{who}_{method}") if timed else nullcontext():
                getattr(holder, method)()
            self.calls.append(f"{who}.{method}")
