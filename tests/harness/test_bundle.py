"""Bundles (harness/bundle.py, bundle_manifest.py, bundle_launch.py): the manifest of what
`prepare` makes, its check on the node, and a launch from a bundle.

The Hub cannot be reached here: the Hub path is checked with huggingface_hub's two calls
(``HfApi.repo_info``, ``snapshot_download``) replaced by stand-ins that write files into the
download's folder, huggingface_hub's own resume state included. The CPU recipe's bundle, made
for real (its `prepare` builds the tiny model), and a run from it offline are the end-to-end
test (tests/launchers/test_train_e2e.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from harness.bundle import main, make
from harness.bundle_manifest import (
    MANIFEST,
    BundleError,
    Item,
    bundle_dirs,
    items_of,
    verify,
    write_manifest,
)
from harness.cli import run
from harness.context import build_plan
from harness.host import local_host
from harness.ray_job import OFFLINE_ENV
from harness.steps import HubDownload, RayJobSubmit, Shell, VerifyBundle
from launchers import run_qwen3_4b_lora as cuda
from launchers.cpu import run_tiny_qwen3_lora as cpu

REVISION = "0123456789abcdef0123456789abcdef01234567"
CPU_FILES = {
    "models/tiny-qwen3/config.json": b'{"model_type": "qwen3"}',
    "models/tiny-qwen3/model.safetensors": bytes(range(256)) * 64,
    "datasets/tiny-task/train.jsonl": b'{"prompt": "say red", "label": "red"}\n',
    "datasets/tiny-task/eval.jsonl": b'{"prompt": "say blue", "label": "blue"}\n',
}


def cpu_bundle(root: Path, *settings: str) -> Path:
    """A bundle of the CPU recipe's inputs with stand-in files (what its prepare would build
    is not needed to check the bundle)."""
    for name, content in CPU_FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
    args = cpu.LAUNCHER.args(**bundle_dirs(str(root)), set=settings)
    plan = build_plan(cpu.LAUNCHER, "prepare", args, local_host())
    write_manifest(root, cpu.LAUNCHER.module, items_of(plan.steps, str(root)))
    return root


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def launch(capsys, *argv: str) -> tuple[int, list[str], list[str]]:
    status = run(cpu.LAUNCHER, list(argv))
    out, err = capsys.readouterr()
    return status, out.splitlines(), err.splitlines()


def test_the_manifest_names_each_input_its_folders_and_every_file(tmp_path):
    root = cpu_bundle(tmp_path / "b")
    manifest = json.loads((root / MANIFEST).read_text())
    (item,) = manifest["items"]
    assert manifest["format"] == 1 and manifest["launcher"] == "launchers.cpu.run_tiny_qwen3_lora"
    assert item["source"] == {
        "kind": "built",
        "command": [
            "python3", "-m", "trainer.tiny", "--model-dir", "<bundle>/models/tiny-qwen3",
            "--data-dir", "<bundle>/datasets/tiny-task", "--seed", "0",
        ],
    }  # fmt: skip
    assert item["dirs"] == ["models/tiny-qwen3", "datasets/tiny-task"]
    files = {entry["path"]: entry for entry in item["files"]}
    assert set(files) == set(CPU_FILES)
    safetensors = files["models/tiny-qwen3/model.safetensors"]
    assert safetensors["size"] == 256 * 64
    content = CPU_FILES["models/tiny-qwen3/model.safetensors"]
    assert safetensors["sha256"] == hashlib.sha256(content).hexdigest()
    assert verify(root)["launcher"] == cpu.LAUNCHER.module


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda r: flip_a_byte(r / "models/tiny-qwen3/model.safetensors"),
         "models/tiny-qwen3/model.safetensors is damaged (its sha256 is not the manifest's)"),
        (lambda r: (r / "datasets/tiny-task/eval.jsonl").unlink(),
         "datasets/tiny-task/eval.jsonl is missing"),
        (lambda r: (r / "models/tiny-qwen3/config.json").write_bytes(b"{}"),
         "models/tiny-qwen3/config.json is damaged (2 bytes, the manifest says 23)"),
        (lambda r: (r / "models/tiny-qwen3/extra.py").write_text("import os"),
         "models/tiny-qwen3/extra.py is not in its manifest; remove it"),
        (lambda r: (r / "models/tiny-qwen3/link").symlink_to("/etc/passwd"),
         "models/tiny-qwen3/link is a link, not a file"),
        (lambda r: (r / MANIFEST).unlink(), "has no manifest.json: not a bundle, or one whose"),
    ],
)  # fmt: skip
def test_a_damaged_bundle_is_one_line_naming_the_first_problem(tmp_path, damage, says):
    root = cpu_bundle(tmp_path / "b")
    damage(root)
    with pytest.raises(BundleError) as err:
        verify(root)
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "malform",
    [
        lambda m: m.pop("launcher"),
        lambda m: m.update(items={}),
        lambda m: m["items"].append("models"),
        lambda m: m["items"][0]["files"][0].update(size="23"),
        lambda m: m["items"][0]["files"][0].pop("sha256"),
        lambda m: m.update(format=2),
    ],
)
def test_a_malformed_manifest_is_one_line(tmp_path, malform):
    root = cpu_bundle(tmp_path / "b")
    manifest = json.loads((root / MANIFEST).read_text())
    malform(manifest)
    (root / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=r"is not a bundle manifest of format 1$"):
        verify(root)


def test_a_manifest_cannot_name_a_path_outside_its_bundle(tmp_path):
    root = cpu_bundle(tmp_path / "b")
    manifest = json.loads((root / MANIFEST).read_text())
    manifest["items"][0]["files"][0]["path"] = "models/../../secret"
    (root / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="a path outside the bundle"):
        verify(root)


def test_verify_on_the_command_line_is_one_line_and_exit_2(tmp_path, capsys):
    root = cpu_bundle(tmp_path / "b")
    assert main(["verify", str(root)]) == 0
    assert capsys.readouterr().out.startswith(f"bundle {root}: 4 files as its manifest says")
    flip_a_byte(root / "datasets/tiny-task/train.jsonl")
    assert main(["verify", str(root)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("python -m harness.bundle: error: bundle ")


def test_make_for_a_module_without_a_launcher_is_one_line_and_exit_2(tmp_path, capsys):
    for module, says in (
        ("launchers.run_nothing", "no launcher module launchers.run_nothing"),
        ("harness.bundle", "harness.bundle declares no LAUNCHER"),
    ):
        assert main(["make", module, str(tmp_path / "b")]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(f"python -m harness.bundle: error: {says}"), line
    assert not (tmp_path / "b").exists()


def test_prepare_from_a_bundle_checks_it_and_fetches_nothing(tmp_path, capsys):
    root = cpu_bundle(tmp_path / "b")
    status, _, err = launch(capsys, "prepare", "--from-bundle", str(root))
    assert status == 0, err
    step, done = err  # the step's line is cut at 120 characters
    assert step.startswith(f"==> step 1/1: cd {local_host().checkout} && python3 -m harness.bundle")
    assert done == f"==> bundle {root}: 4 files as its manifest says"


def test_a_damaged_file_stops_the_launch_in_one_line_before_anything_starts(tmp_path, capsys):
    root = cpu_bundle(tmp_path / "b")
    flip_a_byte(root / "models/tiny-qwen3/model.safetensors")  # its size unchanged
    outputs = tmp_path / "outputs"
    argv = ["full-train", "--from-bundle", str(root), "--output-dir", str(outputs)]
    status, out, err = launch(capsys, *argv)
    assert status == 2 and not out
    assert err == [
        f"python -m launchers.cpu.run_tiny_qwen3_lora: error: --from-bundle: bundle {root}: "
        "models/tiny-qwen3/model.safetensors is damaged (its sha256 is not the manifest's); "
        "carry it again, or make the bundle again (python -m harness.bundle make "
        f"launchers.cpu.run_tiny_qwen3_lora {root})"
    ]  # no step ran: no claim, no Ray
    assert not outputs.exists()  # nothing written


def test_a_dry_run_from_a_bundle_hashes_nothing_but_sees_a_missing_file(tmp_path, capsys):
    root = cpu_bundle(tmp_path / "b")
    flip_a_byte(root / "models/tiny-qwen3/model.safetensors")
    status, out, _ = launch(capsys, "full-train", "--from-bundle", str(root), "--dry-run")
    assert status == 0 and f"python3 -m harness.bundle verify {root}" in "\n".join(out)
    (root / "models/tiny-qwen3/config.json").unlink()
    status, _, err = launch(capsys, "full-train", "--from-bundle", str(root), "--dry-run")
    (line,) = err
    assert status == 2 and "models/tiny-qwen3/config.json is missing" in line


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--set", "seed=7"], "the bundle holds no output of `python3 -m trainer.tiny --model-dir "
         "<bundle>/models/tiny-qwen3 --data-dir <bundle>/datasets/tiny-task --seed 7`"),
        (["--model-dir", "/elsewhere"], "reads the models and data sets in"),
    ],
)  # fmt: skip
def test_a_bundle_for_other_settings_or_a_contradicting_dir_is_refused(
    tmp_path, capsys, argv, says
):
    root = cpu_bundle(tmp_path / "b")
    (root / "models/tiny-qwen3/config.json").unlink()  # refused before the files are looked at
    status, out, err = launch(capsys, "full-train", "--from-bundle", str(root), *argv)
    assert status == 2 and not out
    (line,) = err
    assert line.startswith("python -m launchers.cpu.run_tiny_qwen3_lora: error: --from-bundle")
    assert says in line


def test_a_missing_file_is_refused_before_any_step(tmp_path, capsys):
    root = cpu_bundle(tmp_path / "b")
    (root / "datasets/tiny-task/eval.jsonl").unlink()
    status, _, err = launch(capsys, "full-train", "--from-bundle", str(root))
    (line,) = err
    assert status == 2 and "datasets/tiny-task/eval.jsonl is missing" in line


def test_the_job_reads_the_bundle_with_the_hub_offline(tmp_path):
    bundle = str(tmp_path / "b")
    args = cpu.LAUNCHER.args(from_bundle=bundle)
    steps = build_plan(cpu.LAUNCHER, "train", args).steps
    (job,) = [step for step in steps if isinstance(step, RayJobSubmit)]
    assert OFFLINE_ENV.items() <= job.env_vars.items()
    argv = job.entrypoint
    assert argv[argv.index("--hf-checkpoint") + 1] == f"{bundle}/models/tiny-qwen3"
    assert argv[argv.index("--prompt-data") + 1] == f"{bundle}/datasets/tiny-task/train.jsonl"
    without = build_plan(cpu.LAUNCHER, "train").steps
    assert not any(
        name in step.env_vars for step in without if isinstance(step, RayJobSubmit)
        for name in OFFLINE_ENV
    )  # fmt: skip


class StandInHub:
    """huggingface_hub's two calls of a download: the repo's commit, then its files."""

    def __init__(self) -> None:
        self.downloads: list[dict] = []

    def repo_info(self, repo_id: str, repo_type: str):
        return type("RepoInfo", (), {"sha": REVISION})()

    def snapshot_download(self, **kwargs) -> str:
        self.downloads.append(kwargs)
        folder = Path(kwargs["local_dir"])
        state = folder / ".cache" / "huggingface" / "download"
        state.mkdir(parents=True)
        (state / "config.json.metadata").write_text(f"{REVISION}\netag\n0\n")
        (folder / "config.json").write_text(json.dumps({"repo": kwargs["repo_id"]}))
        return str(folder)


@pytest.fixture
def hub(monkeypatch) -> StandInHub:
    import huggingface_hub

    stand_in = StandInHub()
    monkeypatch.setattr(
        huggingface_hub.HfApi, "repo_info", lambda self, *a, **k: stand_in.repo_info(*a, **k)
    )
    monkeypatch.setattr(huggingface_hub, "snapshot_download", stand_in.snapshot_download)
    return stand_in


def test_a_hub_bundle_pins_each_repos_commit_and_leaves_the_hubs_state_out(tmp_path, hub, capsys):
    root = tmp_path / "b"
    make(cuda.LAUNCHER, str(root), ["eval-interval=", "eval-prompt-data="])
    assert [d["repo_id"] for d in hub.downloads] == ["Qwen/Qwen3-4B", "zhuzilin/dapo-math-17k"]
    assert {d["revision"] for d in hub.downloads} == {REVISION}  # what repo_info said, pinned
    manifest = verify(root)
    model, data = manifest["items"]
    assert model["source"] == {
        "kind": "hub", "repo_id": "Qwen/Qwen3-4B", "repo_type": "model", "revision": REVISION,
        "patterns": [],
    }  # fmt: skip
    assert model["dirs"] == ["models/Qwen3-4B"] and data["dirs"] == ["datasets/dapo-math-17k"]
    assert [f["path"] for f in model["files"]] == ["models/Qwen3-4B/config.json"]

    with pytest.raises(BundleError, match="already holds a bundle"):
        make(cuda.LAUNCHER, str(root), ["eval-interval=", "eval-prompt-data="])
    plan = build_plan(
        cuda.LAUNCHER,
        "full_train",
        cuda.LAUNCHER.args(
            from_bundle=str(root), set=("eval-interval=", "eval-prompt-data="), hardware="H200"
        ),
        local_host(),
        dry_run=True,
    )
    assert isinstance(plan.steps[0], VerifyBundle)
    assert not any(isinstance(step, HubDownload) for step in plan.steps)
    eval_on = cuda.LAUNCHER.args(from_bundle=str(root), hardware="H200")
    with pytest.raises(Exception, match="the bundle holds no dataset zhuzilin/aime-2024"):
        build_plan(cuda.LAUNCHER, "prepare", eval_on, local_host(), dry_run=True)


def test_items_are_the_downloads_and_builds_of_prepare_inside_the_bundle():
    steps = [
        HubDownload("org/model", "/b/models/model"),
        Shell(("python3", "build.py", "--out", "/b/datasets/x", "--seed", "1"), cwd="/c"),
    ]
    assert items_of(steps, "/b") == [
        Item({"kind": "hub", "repo_id": "org/model", "repo_type": "model", "patterns": []},
             ("models/model",)),
        Item({"kind": "built", "command": ["python3", "build.py", "--out", "<bundle>/datasets/x",
                                           "--seed", "1"]}, ("datasets/x",)),
    ]  # fmt: skip
    with pytest.raises(BundleError, match="outside /b"):
        items_of([HubDownload("org/model", "/elsewhere/model")], "/b")


def test_the_slurm_script_passes_the_bundle_on_and_its_launches_accept_it(tmp_path):
    from harness.context import resolve_args
    from harness.steps import WriteFile

    root = str(cpu_bundle(tmp_path / "b"))
    args = cpu.LAUNCHER.args(from_bundle=root, num_nodes=2)
    (write,) = build_plan(cpu.LAUNCHER, "sbatch", args, local_host()).steps
    assert isinstance(write, WriteFile)
    train = write.content.splitlines()[-1]
    assert f"--model-dir {root}/models --data-dir {root}/datasets --from-bundle {root}" in train
    passed_on = cpu.LAUNCHER.args(model_dir=f"{root}/models", from_bundle=root)
    assert resolve_args(passed_on, local_host()).model_dir == f"{root}/models"


def test_a_rayjob_from_a_bundle_on_a_claim_reads_it_with_the_hub_offline():
    import yaml

    from harness.steps import WriteFile

    args = cpu.LAUNCHER.args(
        from_bundle="/mnt/b", output_dir="/mnt/out", image="registry.example.com/g:1", pvc="d:/mnt"
    )
    (write,) = build_plan(cpu.LAUNCHER, "rayjob", args).steps
    assert isinstance(write, WriteFile)
    spec = yaml.safe_load(write.content)["spec"]
    assert OFFLINE_ENV.items() <= yaml.safe_load(spec["runtimeEnvYAML"])["env_vars"].items()
    assert "--hf-checkpoint /mnt/b/models/tiny-qwen3" in spec["entrypoint"]
