"""The colocate state machine: release/resume order between rollout and training."""

from __future__ import annotations

import sys

import pytest

from trainer.backends.colocate import ColocateOrderError, Colocation, Phase


class Holder:
    """Records calls into a shared log and fails if asked to release twice or resume twice."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log
        self.resident = True

    def release_memory(self) -> None:
        assert self.resident, f"{self.name} released twice"
        self.resident = False
        self.log.append(f"{self.name}.release_memory")

    def resume_memory(self) -> None:
        assert not self.resident, f"{self.name} resumed while resident"
        self.resident = True
        self.log.append(f"{self.name}.resume_memory")


class EngineHolder(Holder):
    """An engine: its weights come back first (`resume_weights`), then the rest."""

    def __init__(self, name: str, log: list[str]) -> None:
        super().__init__(name, log)
        self.weights = True

    def release_memory(self) -> None:
        super().release_memory()
        self.weights = False

    def resume_weights(self) -> None:
        assert not self.resident and not self.weights, f"{self.name}'s weights resumed twice"
        self.weights = True
        self.log.append(f"{self.name}.resume_weights")

    def resume_memory(self) -> None:
        assert self.weights, f"{self.name} resumed before its weights"
        super().resume_memory()


def _colocation(colocate: bool = True) -> tuple[Colocation, Holder, EngineHolder, list[str]]:
    log: list[str] = []
    trainer, engine = Holder("trainer", log), EngineHolder("engine", log)
    return Colocation(trainer, engine, colocate=colocate), trainer, engine, log


def test_two_steps_alternate_the_gpus_between_engine_and_trainer() -> None:
    colo, trainer, engine, log = _colocation()
    colo.start()
    for _ in range(2):
        with colo.rollout():
            assert engine.resident and not trainer.resident
            colo.require(Phase.ROLLOUT, "generate")
        assert trainer.resident and not engine.resident
        colo.require(Phase.TRAIN, "train_step")
    assert log == [
        "engine.release_memory",
        "trainer.release_memory", "engine.resume_weights", "engine.resume_memory",
        "engine.release_memory", "trainer.resume_memory",
        "trainer.release_memory", "engine.resume_weights", "engine.resume_memory",
        "engine.release_memory", "trainer.resume_memory",
    ]  # fmt: skip
    assert colo.calls == log


@pytest.mark.parametrize("colocate", [True, False])
def test_the_weight_update_runs_between_the_engines_weights_and_its_kv_cache(
    colocate: bool,
) -> None:
    """miles' order (onload weights, update, onload the KV cache): an update's buffers (merged
    weights, 6.8 GiB at Qwen3-4B) fit while the KV cache is released; beside a KV cache of most
    of the GPU they ran out of memory (H100, 8,192-token responses, 2026-12-06)."""
    colo, trainer, engine, log = _colocation(colocate)
    colo.start()
    seen = []

    def update() -> None:
        log.append("update")
        seen.append((colo.phase, engine.weights, engine.resident, trainer.resident))

    with colo.rollout(update=update):
        log.append("generate")
    if colocate:
        assert seen == [(Phase.ROLLOUT, True, False, False)]
        assert log == [
            "engine.release_memory", "trainer.release_memory", "engine.resume_weights",
            "update", "engine.resume_memory", "generate",
            "engine.release_memory", "trainer.resume_memory",
        ]  # fmt: skip
    else:
        assert seen == [(Phase.ROLLOUT, True, True, True)]
        assert log == ["update", "generate"]


def test_a_failed_update_leaves_the_colocation_failed() -> None:
    colo, _, _, log = _colocation()
    colo.start()

    def update() -> None:
        raise RuntimeError("SGLang could not take the merged weights")

    with pytest.raises(RuntimeError, match="merged weights"), colo.rollout(update=update):
        log.append("generate")
    assert colo.phase is Phase.FAILED
    assert log[-1] == "engine.resume_weights"


@pytest.mark.parametrize("colocate", [True, False])
def test_engines_start_and_release_before_the_trainers_are_built(colocate: bool) -> None:
    """SGLang sizes its KV cache from the memory free after its weights load: a trainer
    building its model on the same GPU meanwhile makes it fail, so engines come first."""
    log: list[str] = []

    def start_engines() -> EngineHolder:
        log.append("engines built")
        return EngineHolder("engine", log)

    def start_trainers() -> Holder:
        log.append("trainers built")
        return Holder("trainer", log)

    colo = Colocation.start_engines_first(start_engines, start_trainers, colocate=colocate)
    released = ["engine.release_memory"] if colocate else []
    assert log == ["engines built", *released, "trainers built"]
    assert colo.phase is Phase.TRAIN and colo.calls == released
    with colo.rollout():
        assert colo.engine.resident
    assert colo.trainer.resident


def test_without_colocate_phases_are_tracked_but_nothing_is_released() -> None:
    colo, _, _, log = _colocation(colocate=False)
    colo.start()
    with colo.rollout():
        assert colo.phase is Phase.ROLLOUT
    assert colo.phase is Phase.TRAIN
    assert log == [] and colo.calls == []


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        (["rollout"], "rollout needs the train phase, but the GPUs are in the setup phase"),
        (["start", "start"], "start needs the setup phase"),
        (["start", "nested"], "rollout needs the train phase, but the GPUs are in the rollout"),
    ],
)
def test_out_of_order_transitions_raise(steps: list[str], message: str) -> None:
    colo, *_ = _colocation()
    with pytest.raises(ColocateOrderError, match=message):
        for step in steps:
            if step == "start":
                colo.start()
            elif step == "rollout":
                with colo.rollout():
                    pass
            else:
                with colo.rollout(), colo.rollout():
                    pass


def test_backend_call_in_the_wrong_phase_raises() -> None:
    colo, *_ = _colocation()
    colo.start()
    with pytest.raises(ColocateOrderError, match="generate needs the rollout phase"):
        colo.require(Phase.ROLLOUT, "generate")
    with colo.rollout(), pytest.raises(ColocateOrderError, match="train_step needs the train"):
        colo.require(Phase.TRAIN, "train_step")


def test_an_error_during_rollout_leaves_the_colocation_failed() -> None:
    colo, _, _, log = _colocation()
    colo.start()
    with pytest.raises(RuntimeError, match="engine died"), colo.rollout():
        raise RuntimeError("engine died")
    assert colo.phase is Phase.FAILED
    assert log[-1] == "engine.resume_memory"
    with pytest.raises(ColocateOrderError, match="failed phase"):
        colo.require(Phase.TRAIN, "save")


def test_heavy_packages_not_imported() -> None:
    assert not any(m == "sglang" or m.startswith(("sglang.", "megatron")) for m in sys.modules)


@pytest.mark.parametrize("colocate", [True, False])
def test_swap_calls_are_timed_into_the_step_times(colocate: bool) -> None:
    from trainer.loop import Timer

    colo, *_ = _colocation(colocate)
    colo.start()
    timer = Timer()
    for _ in range(2):
        with colo.rollout(timer):
            pass
    expected = {
        "time/trainer_release_memory", "time/engine_resume_weights", "time/engine_resume_memory",
        "time/engine_release_memory", "time/trainer_resume_memory",
    }  # fmt: skip
    assert set(timer.times) == (expected if colocate else set())
    assert all(value >= 0 for value in timer.times.values())
