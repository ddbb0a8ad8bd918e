"""The AMD and CUDA Qwen3-4B LoRA launchers share one recipe: they differ only in platform choices.

Allowed differences: the recorded hardware, SGLang's attention and LoRA backends, where the
packages come from (the constraints files and the torch build the preflight requires), the
platform environment of harness.platform (on ray start and in the job) and the wandb project,
which names the platform so that each platform's runs stay comparable with each other.
"""

from __future__ import annotations

import dataclasses
import json
from types import ModuleType

import pytest

from harness.diff import Change, diff_recordings
from harness.host import RECORD_CHECKOUT, RECORD_RUN_ID
from harness.platform import ROCM_DEFAULTS
from harness.record import record
from harness.run_tag import RunTag
from launchers import run_qwen3_4b_lora as cuda
from launchers.amd import run_qwen3_4b_lora as amd
from launchers.recipes.qwen3_4b import SGLANG_NEEDS

JOB = "ray_job_submit python3 train.py"
PLATFORM_FIELDS = {"hardware", "wandb_project"}


def _recordings(module: ModuleType) -> list[dict]:
    launcher = module.LAUNCHER
    recordings = [record(launcher, name).to_dict() for name in launcher.recordings]
    for recording in recordings:
        recording["launcher"] = "qwen3_4b_lora"
    return json.loads(json.dumps(recordings))


def _tags(role: str = "") -> tuple[RunTag, RunTag]:
    """The run tags of the twins: they name each launcher's own file (identity, not platform)."""
    return tuple(  # type: ignore[return-value]
        RunTag(f"{RECORD_CHECKOUT}/{mod.LAUNCHER.path}.py{role}", "all", RECORD_RUN_ID)
        for mod in (amd, cuda)
    )


def _tag_changes(steps: tuple[str, ...], role: str = "") -> set[Change]:
    old, new = _tags(role)
    return {Change("setting", "changed", "tag", str(old), str(new), step) for step in steps}


def _rocm_removed(*steps: str) -> set[Change]:
    return {
        Change("env", "removed", *item, step=step)
        for step in steps
        for item in ROCM_DEFAULTS.items()
    }


def _expected_train_changes(nodes: int = 1) -> set[Change]:
    flags = {
        "--wandb-project": tuple(
            mod.LAUNCHER.config(mod.LAUNCHER.args(run_id="r")).wandb.wandb_project
            for mod in (amd, cuda)
        ),
        "--sglang-lora-backend": (amd.SGLANG.lora, cuda.SGLANG.lora),
        "--sglang-attention-backend": (amd.SGLANG.attention, cuda.SGLANG.attention),
        "--constraints": tuple(" ".join(mod.PACKAGES.constraints) for mod in (amd, cuda)),
        "--require-capability": tuple(
            " ".join((*SGLANG_NEEDS, mod.PACKAGES.torch_build)) for mod in (amd, cuda)
        ),
    }
    changes = {HARDWARE}
    changes |= {Change("flag", "changed", name, *values, JOB) for name, values in flags.items()}
    changes |= _rocm_removed("ray_start head", JOB)
    changes |= _tag_changes(("claim_run", "ray_start head", "verify_ray", JOB))
    if nodes == 1:  # the token and the job's secrets live in the run's dir, named from the tag
        old, new = (tag.token_path for tag in _tags())
        changes.add(Change("setting", "changed", "auth_token_path", old, new, JOB))
        old_env, new_env = (path.replace("auth_token", "job_env") for path in (old, new))
        changes.add(Change("env", "changed", "GRPO_JOB_ENV_FILE", old_env, new_env, JOB))
        changes |= {
            Change("setting", "changed", "token_path", old, new, step)
            for step in ("claim_run", "ray_start head")
        }
    return changes


HARDWARE = Change("hardware", "changed", "hardware", "MI355X", "H200")


@pytest.fixture(scope="module")
def differences() -> dict[str, set[Change]]:
    (diff,) = diff_recordings(_recordings(amd), _recordings(cuda))
    return {entrypoint: set(changes) for entrypoint, changes in diff.changes.items()}


def test_recordings_differ_only_in_platform_choices(differences: dict[str, set[Change]]) -> None:
    train = _expected_train_changes()
    sbatch = differences.pop("sbatch_2_nodes")
    rayjobs = [differences.pop(name) for name in ("rayjob", "rayjob_2_nodes")]
    assert differences == {
        "prepare": {HARDWARE},
        "train": train,
        "full_train": train,
        "train_2_nodes": _expected_train_changes(nodes=2),
        "worker_2_nodes": {HARDWARE}
        | _rocm_removed("ray_start worker")
        | _tag_changes(("claim_run", "ray_start worker"), role=":worker"),
    }
    (content,) = sbatch - {HARDWARE}  # the script names its launcher module, nothing else
    assert content.name == "content"
    assert content.old.replace("launchers.amd.", "launchers.") == content.new
    assert rayjobs == [_expected_rayjob_changes(nodes) for nodes in (1, 2)]


def _expected_rayjob_changes(nodes: int) -> set[Change]:
    """The manifest's: the job's flags and ROCm environment as in `train`, the launcher file it
    names, and in each pod the ROCm environment and the GPUs' resource name."""
    train = _expected_train_changes(nodes)
    changes = {HARDWARE}
    changes |= {
        dataclasses.replace(c, step=RAYJOB) for c in train if c.what == "flag" and c.step == JOB
    }
    changes |= {dataclasses.replace(c, step=RAYJOB) for c in _rocm_removed(JOB)}
    changes.add(Change("setting", "changed", LAUNCHER_ANNOTATION, *_launcher_files(), RAYJOB))
    pods = [f"{SPEC}.headGroupSpec.template.spec.containers[ray-head]"]
    if nodes > 1:
        pods.append(f"{SPEC}.workerGroupSpecs[workers].template.spec.containers[ray-worker]")
    for pod in pods:
        for name, value in ROCM_DEFAULTS.items():
            for key, old in (("name", name), ("value", value)):
                changes.add(
                    Change("setting", "removed", f"{pod}.env[{name}].{key}", old, None, RAYJOB)
                )
        for kind in ("limits", "requests"):
            gpus = f"{pod}.resources.{kind}"
            changes.add(Change("setting", "removed", f"{gpus}.amd.com/gpu", "8", None, RAYJOB))
            changes.add(Change("setting", "added", f"{gpus}.nvidia.com/gpu", None, "8", RAYJOB))
    return changes


RAYJOB = "rayjob python3 train.py"
SPEC = "spec.rayClusterSpec"
LAUNCHER_ANNOTATION = "metadata.annotations.grpo-lora/launcher"


def _launcher_files() -> tuple[str, str]:
    return tuple(f"{mod.LAUNCHER.path}.py" for mod in (amd, cuda))  # type: ignore[return-value]


def test_the_platforms_pick_different_sglang_backends() -> None:
    assert (amd.SGLANG.attention, amd.SGLANG.lora) == ("triton", "triton")
    assert (cuda.SGLANG.attention, cuda.SGLANG.lora) == ("flashinfer", "csgmv")


def test_the_platforms_need_their_own_torch_build() -> None:
    assert (amd.PACKAGES.torch_build, cuda.PACKAGES.torch_build) == (
        "torch.version.hip",
        "torch.version.cuda",
    )


def test_the_recipe_options_are_the_same() -> None:
    def recipe_options(args_type: type) -> dict[str, object]:
        return {
            f.name: (f.default, f.metadata.get("help"))
            for f in dataclasses.fields(args_type)
            if f.name not in PLATFORM_FIELDS
        }

    assert recipe_options(amd.LAUNCHER.args) == recipe_options(cuda.LAUNCHER.args)
    assert amd.LAUNCHER.entrypoint_names == cuda.LAUNCHER.entrypoint_names
    assert (amd.LAUNCHER.recorded_hardware, cuda.LAUNCHER.recorded_hardware) == ("MI355X", "H200")
    assert cuda.LAUNCHER.supported_hardware == ("H100", "H200", "B200")
