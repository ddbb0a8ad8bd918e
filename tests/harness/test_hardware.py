"""Hardware registry, device-name matching, and `auto` / GPU-count resolution."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

import pytest

from harness import LaunchContext, Launcher, LauncherArgs, LaunchError, RayStop
from harness.hardware import REGISTRY, get_hardware, match_hardware
from harness.host import HostView, _flatten_json, record_host


def test_registry_declares_every_required_accelerator():
    expected = {
        "MI300X": ("amd", "gfx942", 8, 192),
        "MI325X": ("amd", "gfx942", 8, 256),
        "MI350X": ("amd", "gfx950", 8, 288),
        "MI355X": ("amd", "gfx950", 8, 288),
        "H100": ("nvidia", "sm_90", 8, 80),
        "H200": ("nvidia", "sm_90", 8, 141),
        "B200": ("nvidia", "sm_100", 8, 180),
        "CPU": ("cpu", "cpu", 0, 0),
    }
    actual = {
        name: (hw.vendor, hw.arch, hw.gpus_per_node, hw.memory_gib) for name, hw in REGISTRY.items()
    }
    assert actual == expected
    assert get_hardware("MI355X").platform == "rocm"
    assert get_hardware("H200").platform == "cuda"


def test_unknown_hardware_is_a_launch_error():
    with pytest.raises(LaunchError, match="unknown hardware 'MI999X'"):
        get_hardware("MI999X")


@pytest.mark.parametrize(
    ("description", "name"),
    [
        ("AMD Instinct MI355X", "MI355X"),
        ("AMD Instinct MI300X OAM", "MI300X"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H200\nNVIDIA H200", "H200"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA GB200", None),  # not B200: Grace Blackwell is another node
        ("AMD Radeon Graphics", None),
        ("AMD Instinct MI300X\nAMD Instinct MI325X", None),  # mixed node: declare it
        ("", None),
    ],
)
def test_match_hardware(description, name):
    found = match_hardware(description)
    assert (found.name if found else None) == name


def test_tool_json_is_flattened_for_matching():
    amd_smi = json.dumps(
        [
            {"gpu": i, "asic": {"market_name": "AMD Instinct MI355X", "target": "gfx950"}}
            for i in (0, 1)
        ]
    )
    assert match_hardware(_flatten_json(amd_smi)) == get_hardware("MI355X")
    assert _flatten_json("NVIDIA H100 80GB HBM3\n") == "NVIDIA H100 80GB HBM3"


@dataclass(frozen=True)
class AmdArgs(LauncherArgs):
    hardware: Literal["auto", "MI350X", "MI355X"] = "auto"


def emit_stop(ctx: LaunchContext, args: AmdArgs) -> None:
    ctx.emit(RayStop("launchers.x@cpu/r", "/c"))


LAUNCHER = Launcher(__name__, args=AmdArgs, entrypoints=(emit_stop,), recorded_hardware="MI355X")


def host(detected: str | None = None, probe: bool = True, **env: str) -> HostView:
    return HostView(
        env=env,
        home="/h",
        checkout="/c",
        cwd="/c",
        run_id="r",
        detect=(lambda: detected) if probe else None,
    )


def test_launcher_supports_its_literal_choices():
    assert LAUNCHER.supported_hardware == ("MI350X", "MI355X")
    assert LAUNCHER.module == __name__
    with pytest.raises(TypeError, match="not among the supported"):
        Launcher(__name__, args=AmdArgs, entrypoints=(emit_stop,), recorded_hardware="H200")


def test_auto_on_the_record_host_is_the_recorded_hardware_without_probing():
    ctx = LaunchContext(LAUNCHER, record_host())
    assert ctx.resolve_hardware("auto").name == "MI355X"
    assert ctx.notes == []


def test_auto_uses_the_detected_gpu():
    ctx = LaunchContext(LAUNCHER, host("AMD Instinct MI350X"))
    assert ctx.resolve_hardware("auto").name == "MI350X"


def test_explicit_hardware_skips_detection():
    def fail() -> str:
        raise AssertionError("probed")

    ctx = LaunchContext(LAUNCHER, HostView({}, "/h", "/c", "/c", "r", detect=fail))
    assert ctx.resolve_hardware("MI350X").name == "MI350X"


def test_auto_without_gpu_fails_live_and_falls_back_with_one_note_in_dry_run():
    with pytest.raises(LaunchError, match="found no GPU"):
        LaunchContext(LAUNCHER, host(None)).resolve_hardware("auto")
    with pytest.raises(LaunchError, match="cannot tell which GPU 'AMD Radeon Graphics' is"):
        LaunchContext(LAUNCHER, host("AMD Radeon Graphics")).resolve_hardware("auto")
    ctx = LaunchContext(LAUNCHER, host(None), dry_run=True)
    assert ctx.resolve_hardware("auto").name == "MI355X"
    assert len(ctx.notes) == 1 and "MI355X" in ctx.notes[0]


def test_unsupported_hardware_fails_clearly():
    with pytest.raises(LaunchError, match="supports MI350X, MI355X, not MI300X"):
        LaunchContext(LAUNCHER, host("AMD Instinct MI300X")).resolve_hardware("auto")
    with pytest.raises(LaunchError, match="not H100"):
        LaunchContext(LAUNCHER, host(None), dry_run=True).resolve_hardware("H100")


@pytest.mark.parametrize(
    ("env", "override", "expected"),
    [
        ({}, None, 8),
        ({}, 4, 4),
        ({"HIP_VISIBLE_DEVICES": "0,1,2"}, None, 3),
        ({"CUDA_VISIBLE_DEVICES": "4,5"}, None, 2),
        ({"ROCR_VISIBLE_DEVICES": "0"}, None, 1),
        ({"HIP_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "0"}, None, 2),
        ({"HIP_VISIBLE_DEVICES": "0,1,2"}, 2, 2),
    ],
)
def test_gpus_per_node(env, override, expected):
    ctx = LaunchContext(LAUNCHER, host(**env))
    assert ctx.gpus_per_node(get_hardware("MI355X"), override) == expected


def test_gpus_per_node_errors():
    mi355x = get_hardware("MI355X")
    with pytest.raises(LaunchError, match="HIP_VISIBLE_DEVICES is set but names no device"):
        LaunchContext(LAUNCHER, host(HIP_VISIBLE_DEVICES="")).gpus_per_node(mi355x, None)
    with pytest.raises(LaunchError, match="asks for 16 GPUs; a MI355X node has 8"):
        LaunchContext(LAUNCHER, host()).gpus_per_node(mi355x, 16)
    with pytest.raises(LaunchError, match="CPU has no GPU"):
        LaunchContext(LAUNCHER, host()).gpus_per_node(get_hardware("CPU"), 1)
    assert LaunchContext(LAUNCHER, host()).gpus_per_node(get_hardware("CPU"), None) == 0


def test_record_host_ignores_visible_devices_of_this_machine(monkeypatch):
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "0")
    ctx = LaunchContext(LAUNCHER, record_host())
    assert ctx.gpus_per_node(get_hardware("MI355X"), None) == 8


def test_host_paths():
    h = host()
    assert h.path("~/models") == "/h/models"
    assert h.path("~") == "/h"
    assert h.path("runs/x") == "/c/runs/x"
    assert h.path("/abs/../p") == "/p"
