"""The KubeRay RayJob manifest of `rayjob`: valid against KubeRay's schema, strictly; the cluster
of the launch; secrets by reference only; the same train.py argv as `train`."""

from __future__ import annotations

import copy
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness import build_plan
from harness.discovery import discover_launchers
from harness.hardware import get_hardware
from harness.rayjob_schema import problems, strict, vendored
from harness.record import record
from harness.steps import WriteFile, train_py_argv
from launchers.cpu.run_tiny_qwen3_lora import LAUNCHER as CPU
from launchers.run_qwen3_4b_lora import LAUNCHER as CUDA
from tests.harness.test_cli import SpyRunner, cli
from trainer.arguments import parse_args

LAUNCHERS = discover_launchers()
RECORDED = [
    (launcher, name)
    for launcher in LAUNCHERS
    for name, (entrypoint, _) in launcher.recordings.items()
    if entrypoint == "rayjob"
]
IMAGE = "registry.example.com/grpo-lora:1"


def manifest_of(plan_or_recording: Any) -> dict[str, Any]:
    (step,) = plan_or_recording.steps
    assert isinstance(step, WriteFile) and step.path.endswith("/rayjob.yaml")
    return yaml.safe_load(step.content)


def pods(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The Ray containers of the manifest's cluster: the head's, then each worker group's."""
    cluster = manifest["spec"]["rayClusterSpec"]
    groups = [cluster["headGroupSpec"], *cluster.get("workerGroupSpecs", [])]
    return [container for g in groups for container in g["template"]["spec"]["containers"]]


@pytest.mark.parametrize(
    ("launcher", "name"), RECORDED, ids=[f"{lau.path}:{name}" for lau, name in RECORDED]
)
def test_every_recorded_manifest_is_valid_and_trains_as_train_does(launcher, name):
    assert {"rayjob", "rayjob_2_nodes"} <= set(launcher.recordings)
    manifest = manifest_of(record(launcher, name))
    assert problems(manifest) == []
    spec = manifest["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["rayClusterSpec"]["authOptions"] == {"mode": "token"}
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])  # KubeRay refuses invalid YAML
    assert runtime_env["working_dir"] == "/app"
    assert runtime_env["env_vars"]["PYTHONPATH"] == "/app"
    command, script, *argv = shlex.split(spec["entrypoint"])
    assert (command, script) == ("python3", "train.py")
    parse_args(argv)  # the argv contract
    train = record(launcher, "train_2_nodes" if name.endswith("_2_nodes") else "train")
    (train_argv,) = [a for step in train.steps if (a := train_py_argv(step)) is not None]
    assert tuple(argv) == train_argv


def test_a_wrong_field_or_value_fails_with_one_line_each():
    manifest = manifest_of(record(CPU, "rayjob_2_nodes"))
    wrong = copy.deepcopy(manifest)
    cluster = wrong["spec"]["rayClusterSpec"]
    cluster["headGroupSpec"]["replicaz"] = 1
    cluster["workerGroupSpecs"][0]["replicas"] = "one"
    cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["env"][0]["valuFrom"] = {}
    wrong["metadata"]["name"] = "Grpo_run"
    assert problems(wrong) == [
        "metadata.name: 'Grpo_run' is not a DNS-1035 label (KubeRay refuses it)",
        'unknown field "spec.rayClusterSpec.headGroupSpec.replicaz"',
        'unknown field "spec.rayClusterSpec.headGroupSpec.template.spec.containers[0].env[0]'
        '.valuFrom"',
        "spec.rayClusterSpec.workerGroupSpecs[0].replicas: 'one' is not of type 'integer'",
    ]
    del wrong["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    missing = "spec.rayClusterSpec.headGroupSpec: 'template' is a required property"
    assert missing in problems(wrong)


def test_the_check_follows_what_the_api_server_prunes():
    schema = strict(
        {
            "type": "object",
            "properties": {
                "metadata": {"type": "object"},
                "kept": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "map": {"type": "object", "additionalProperties": {"type": "string"}},
                "when": {"type": "string", "nullable": True},
            },
        }
    )
    assert schema["additionalProperties"] is False
    assert "additionalProperties" not in schema["properties"]["kept"]
    assert schema["properties"]["map"]["additionalProperties"] == {"type": "string"}
    assert schema["properties"]["metadata"] == {"type": "object"}  # the API server's own
    assert schema["properties"]["when"]["type"] == ["string", "null"]


def test_vendoring_keeps_the_v1_schema_without_descriptions():
    crd = {
        "spec": {
            "versions": [
                {"name": "v1alpha1", "schema": {"openAPIV3Schema": {"type": "string"}}},
                {
                    "name": "v1",
                    "schema": {
                        "openAPIV3Schema": {
                            "description": "RayJob",
                            "properties": {"description": {"type": "string", "description": "x"}},
                        }
                    },
                },
            ]
        }
    }
    assert vendored(crd) == {"properties": {"description": {"type": "string"}}}


@pytest.mark.parametrize("launcher", LAUNCHERS, ids=[lau.path for lau in LAUNCHERS])
def test_each_pod_asks_for_the_gpus_of_its_vendor(launcher):
    hardware = get_hardware(launcher.recorded_hardware)
    for container in pods(manifest_of(record(launcher, "rayjob_2_nodes"))):
        limits = container.get("resources", {}).get("limits", {})
        assert container["resources"]["requests"] == limits
        gpus = {name: count for name, count in limits.items() if name.endswith("/gpu")}
        if hardware.vendor == "cpu":
            assert gpus == {} and limits == {"cpu": "2"}
        else:
            want = {"amd": "amd.com/gpu", "nvidia": "nvidia.com/gpu"}[hardware.vendor]
            assert gpus == {want: str(hardware.gpus_per_node)}


def test_gpus_per_node_and_workers_follow_the_options():
    for nodes in (1, 4):
        args = CUDA.args(image=IMAGE, num_nodes=nodes, num_gpus_per_node=4, hardware="H100")
        manifest = manifest_of(build_plan(CUDA, "rayjob", args))
        assert problems(manifest) == []
        workers = manifest["spec"]["rayClusterSpec"].get("workerGroupSpecs", [])
        if nodes == 1:
            assert workers == []
        else:
            (group,) = workers
            assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == nodes - 1
        for container in pods(manifest):  # the head's, and the worker group's template
            assert container["resources"]["limits"] == {"nvidia.com/gpu": "4"}
        placement = parse_args(shlex.split(manifest["spec"]["entrypoint"])[2:]).placement
        assert (placement.actor_num_nodes, placement.num_gpus_per_node) == (nodes, 4)


def test_secrets_are_referenced_never_written(tmp_path, capsys):
    """A secret of the job (forwarded, --extra-env or --pass-env) is read in every Ray pod from
    the run's Secret; its value is nowhere: not in the manifest, its dry run or the notes."""
    values = {"HF_TOKEN": "hf-value-7fa3", "MY_SERVICE_TOKEN": "svc-value-91bd"}
    values["DB_PASSWORD"] = "db-value-22c1"
    argv = ["rayjob", "--image", IMAGE, "--num-nodes", "2", "--run-id", "r1"]
    argv += ["--output-dir", str(tmp_path), "--pass-env", "DB_PASSWORD"]
    argv += ["--extra-env", f"LOG_LEVEL=debug,MY_SERVICE_TOKEN={values['MY_SERVICE_TOKEN']}"]
    env = {"HF_TOKEN": values["HF_TOKEN"], "DB_PASSWORD": values["DB_PASSWORD"]}
    status, dry_out, dry_err = cli(CPU, [*argv, "--dry-run"], capsys, **env)
    assert status == 0
    status, out, err = cli(CPU, argv, capsys, live=_written, **env)
    assert status == 0
    text = (tmp_path / "r1" / "rayjob.yaml").read_text()
    for value in values.values():
        assert value not in text + dry_out + dry_err + out + err
    manifest = yaml.safe_load(text)
    for container in pods(manifest):
        refs = {e["name"]: e["valueFrom"] for e in container["env"] if "valueFrom" in e}
        assert refs == {
            name: {"secretKeyRef": {"name": "grpo-r1-secrets", "key": name}} for name in values
        }
        assert all(set(e) == {"name", "value"} for e in container["env"] if "valueFrom" not in e)
    job_env = yaml.safe_load(manifest["spec"]["runtimeEnvYAML"])["env_vars"]
    assert job_env["LOG_LEVEL"] == "debug" and not set(job_env) & set(values)
    create = next(line for line in err.splitlines() if line.startswith("create its Secret"))
    assert shlex.split(create.partition(": ")[2]) == [
        "kubectl", "create", "secret", "generic", "grpo-r1-secrets",
        *(f"--from-literal={name}=${name}" for name in sorted(values)),
    ]  # fmt: skip
    assert f"submit it with: kubectl apply -f {tmp_path}/r1/rayjob.yaml" in err
    assert problems(manifest) == []


def _written(plan) -> int:
    """The live runner's work for a plan of WriteFile steps (no locks or claims to exercise)."""
    for step in plan.steps:
        Path(step.path).parent.mkdir(parents=True, exist_ok=True)
        Path(step.path).write_text(step.content)
    return 0


def test_the_pods_get_neither_this_hosts_devices_nor_its_python_path(capsys):
    env = {"HIP_VISIBLE_DEVICES": "2,3", "PYTHONPATH": "/home/u/lib", "RAY_ADDRESS": "http://x"}
    argv = ["rayjob", "--image", IMAGE, "--hardware", "MI355X", "--run-id", "r1", "--dry-run"]
    from launchers.amd.run_qwen3_4b_lora import LAUNCHER as AMD

    status, out, _ = cli(AMD, argv, capsys, **env)
    assert status == 0
    manifest = yaml.safe_load(out.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0])
    (head,) = pods(manifest)
    assert head["resources"]["limits"] == {"amd.com/gpu": "8"}
    job_env = yaml.safe_load(manifest["spec"]["runtimeEnvYAML"])["env_vars"]
    assert job_env["PYTHONPATH"] == "/app" and "CUDA_VISIBLE_DEVICES" not in job_env
    assert "/home/u/lib" not in out and "http://x" not in out


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        ([], "rayjob needs --image: the container image of the Ray pods"),
        (["--image", "a b"], "rayjob needs --image"),
        (["--run-id", "Run_1"], "--run-id must be lowercase letters, digits and '-'"),
        (["--run-id", "r" * 43], "at most 42 characters"),
        (["--pvc", "data"], "--pvc items must be CLAIM:/ABSOLUTE/PATH (got 'data')"),
        (["--pvc", "data:rel/path"], "--pvc items must be CLAIM:/ABSOLUTE/PATH"),
        (["--pvc", "a:/x,b:/x"], "--pvc names 'b' or '/x' twice"),
        (["--image-checkout", "app"], "--image-checkout must be an absolute path ('app')"),
        (["--ray-address", "http://h:8265"], "rayjob makes a Ray cluster of its own"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_is_written(argv, reason, capsys):
    image = [] if argv == [] or "--image" in argv else ["--image", IMAGE]
    spy = SpyRunner()
    status, out, err = cli(CPU, ["rayjob", *image, *argv], capsys, live=spy)
    assert (status, out, spy.plans) == (2, "", [])
    assert err.count("\n") == 1 and reason in err


def test_the_schema_check_on_the_command_line(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(manifest_of(record(CPU, "rayjob"))))
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("shutdownAfterJobFinishes", "shutdownAfterJobFinish"))
    check = [sys.executable, "-m", "harness.rayjob_schema", "check"]
    done = subprocess.run([*check, str(good)], capture_output=True, text=True, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"{good}: valid against KubeRay v1.7.0's RayJob schema\n"
    done = subprocess.run([*check, str(bad)], capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert done.stderr == f'{bad}: unknown field "spec.shutdownAfterJobFinish"\n'
