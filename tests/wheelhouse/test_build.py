"""`build` against a local index of synthetic wheels (`--no-index --find-links`): pip's real
resolver and downloader, offline."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.wheel_factory import make_wheel, write_sdist
from wheelhouse.__main__ import main
from wheelhouse.resolve import keep_constraints, split_pins
from wheelhouse.target import Target

NODE = {
    "format": 1,
    "python": {"version": "3.12.3", "implementation": "cpython", "abi": "cp312"},
    "platform": "linux-x86_64",
    "glibc": "2.28",
    "platform_tags": ["manylinux_2_28_x86_64", "manylinux2014_x86_64", "linux_x86_64"],
    "distributions": [
        {"name": "torch", "version": "2.11.0+cu130", "requires": []},
        {"name": "nvidia-fake-cu13", "version": "13.0.0", "requires": []},
        {"name": "filelock", "version": "3.0.0", "requires": []},
        {"name": "small-thing", "version": "1.0", "requires": []},
    ],
}


@pytest.fixture
def index(tmp_path: Path, pip_offline: None) -> Path:
    """A local index; pip's own configuration (mirrors, global constraints) switched off."""
    idx = tmp_path / "index"
    make_wheel(idx, "torch", "2.11.0", requires=["nvidia-fake-cu13==13.0.1", "filelock"])
    # a newer torch the resolver would prefer, with a filelock cap that shows it was taken
    make_wheel(idx, "torch", "2.12.0", requires=["filelock<3.10"])
    make_wheel(idx, "nvidia-fake-cu13", "13.0.1")
    # Stand-ins under another import name: on a build's path they must not shadow filelock.
    for version in ("3.20.0", "3.5.0"):
        make_wheel(idx, "filelock", version, {"filelock_standin.py": b""})
    make_wheel(idx, "Small_Thing", "1.0")
    make_wheel(idx, "helper", "1.0", requires=["nvidia-fake-cu13"])
    make_wheel(
        idx,
        "app",
        "1.0",
        requires=["torch>=2.10", "filelock>=3.1", "small-thing", 'helper; extra == "fast"'],
        extras=["fast"],
    )
    make_wheel(idx, "app2", "1.0", requires=["native-src", "filelock>=3.1"])
    write_sdist(idx, "native_src", "1.0")
    return idx


def build(tmp_path: Path, index: Path, *argv: str, inventory: dict = NODE) -> dict:
    node = tmp_path / "node.json"
    node.write_text(json.dumps(inventory))
    out = tmp_path / "wh"
    common = ["--inventory", str(node), "--no-index", "--find-links", str(index), "-o", str(out)]
    assert main(["build", *argv, *common]) == 0
    return json.loads((out / "manifest.json").read_text())


def test_resolve_keeps_the_node_torch_and_what_only_torch_needs(tmp_path, index, capsys):
    manifest = build(tmp_path, index, "app")
    assert sorted(manifest["wheels"]) == [
        "app-1.0-py3-none-any.whl",
        "filelock-3.20.0-py3-none-any.whl",
    ]
    assert manifest["wheels"]["filelock-3.20.0-py3-none-any.whl"]["replaces"] == "filelock 3.0.0"
    out = capsys.readouterr().out
    assert "replaces node's filelock 3.0.0" in out
    assert "node has small-thing==1.0" in out
    assert out.strip().splitlines()[-1].startswith("batch-1: 2 wheels, ")
    node_python_here = sys.version_info[:2] == (3, 12)
    assert ("pip evaluates environment markers for this Python" in out) != node_python_here


def test_resolve_follows_extras_past_torch(tmp_path, index):
    manifest = build(tmp_path, index, "app[fast]")
    names = sorted(w.split("-")[0] for w in manifest["wheels"])
    assert names == ["app", "filelock", "helper", "nvidia_fake_cu13"]


def test_no_deps_takes_exactly_the_pins_minus_what_the_node_has(tmp_path, index, capsys):
    manifest = build(tmp_path, index, "--no-deps", "small-thing==1.0", "filelock==3.20.0")
    assert list(manifest["wheels"]) == ["filelock-3.20.0-py3-none-any.whl"]
    assert "node has small-thing==1.0" in capsys.readouterr().out


def test_nothing_to_build_is_one_line(tmp_path, index, capsys):
    node = tmp_path / "node.json"
    node.write_text(json.dumps(NODE))
    argv = ["build", "--no-deps", "Small.Thing==1.0", "--inventory", str(node), "-o", "wh"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == "wheelhouse: error: the node already has everything requested: nothing to build\n"


def test_keep_constraints_pin_public_versions_only():
    target = Target(
        "3.12",
        ("manylinux_2_28_x86_64",),
        have={"torch": "2.11.0+cu130", "nvidia-nccl-cu13": "2.28.9", "triton": "3.6.0"},
    )
    assert keep_constraints(target, ["torch", "Flash_Attn"]) == ["torch==2.11.0"]


def test_node_has_compares_normalised_names_and_public_versions():
    target = Target("3.12", ("linux_x86_64",), have={"flash-attn": "2.8.0+cu130"})
    assert target.has("Flash_Attn", "2.8.0") and target.has("flash.attn", "2.8.0.0")
    assert not target.has("flash-attn", "2.8.1") and not target.has("flash-attn-4", "2.8.0")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["app"], "say which node"),
        (
            ["app", "--python-version", "3.12", "--platform", "x", "--slim", "nope"],
            "unknown --slim",
        ),
        (["--python-version", "3.12", "--platform", "x"], "no requirements given"),
        (["--python-version", "3.12", "--platform", "x", "app>>1"], "bad requirement"),
        (["app", "--inventory", "missing.json"], "cannot read inventory"),
        (["app", "--python-version", "3.12", "--platform", "x", "--batch-mib", "0"], "positive"),
    ],
)
def test_build_input_errors_are_one_line(argv, message, capsys):
    assert main(["build", *argv, "-o", "wh"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_sdists_are_resolved_carried_and_built_on_the_node(tmp_path, index, capsys):
    manifest = build(tmp_path, index, "app2", "--sdist", "native-src==1.0")
    assert sorted(manifest["wheels"]) == [
        "app2-1.0-py3-none-any.whl",
        "filelock-3.20.0-py3-none-any.whl",
        "native_src-1.0.tar.gz",
    ]
    assert manifest["wheels"]["native_src-1.0.tar.gz"]["sdist"] is True
    assert "batch-1: 2 wheels + 1 sdist, " in capsys.readouterr().out
    site = tmp_path / "site"
    assert main(["install", str(tmp_path / "wh" / "batch-1"), "--target", str(site)]) == 0
    assert (site / "native_src.py").read_text() == "BUILT_ON_THE_NODE = True\n"


def test_no_deps_sdist_pin_and_bad_sdist_argument(tmp_path, index, capsys):
    manifest = build(tmp_path, index, "--no-deps", "native-src==1.0", "--sdist", "native_src==1.0")
    assert list(manifest["wheels"]) == ["native_src-1.0.tar.gz"]
    argv = ["build", "--no-deps", "x==1", "--python-version", "3.12", "--platform", "x"]
    assert main([*argv, "--sdist", "native-src", "-o", "wh"]) == 2
    assert "--sdist 'native-src': expected NAME==VERSION" in capsys.readouterr().err


def test_resolve_prefers_the_versions_the_node_has(tmp_path, index, capsys):
    """pip takes the newest filelock (3.20.0), but the node's 3.5.0 satisfies `app`: a second
    resolve keeps it, so nothing of the node is replaced."""
    others = [d for d in NODE["distributions"] if d["name"] != "filelock"]
    node = {**NODE, "distributions": [*others, {"name": "filelock", "version": "3.5.0"}]}
    manifest = build(tmp_path, index, "app", inventory=node)
    assert list(manifest["wheels"]) == ["app-1.0-py3-none-any.whl"]
    out = capsys.readouterr().out
    assert "node has filelock==3.5.0" in out and "replaces" not in out


def test_a_node_version_the_requirements_exclude_is_replaced(tmp_path, index, capsys):
    manifest = build(tmp_path, index, "app")  # the node's filelock 3.0.0 is below app's >=3.1
    assert "filelock-3.20.0-py3-none-any.whl" in manifest["wheels"]
    out = capsys.readouterr().out
    assert "the requirements need other versions than the node's of: filelock\n" in out


def test_only_the_node_versions_that_conflict_are_replaced_and_named(tmp_path, index, capsys):
    """`tool` needs delta >= 2; the node has delta 1.0 and alpha, beta, gamma 1.0, which `tool`
    takes in any version. pip prefers 2.0 of all four, pinning all four node versions fails:
    only delta is replaced and named, the node keeps the other three."""
    for name in ("alpha", "beta", "gamma", "delta"):
        make_wheel(index, name, "1.0")
        make_wheel(index, name, "2.0")
    make_wheel(index, "tool", "1.0", requires=["alpha", "beta", "gamma", "delta>=2"])
    node = {
        **NODE,
        "distributions": [
            *NODE["distributions"],
            *({"name": n, "version": "1.0"} for n in ("alpha", "beta", "gamma", "delta")),
        ],
    }
    manifest = build(tmp_path, index, "tool", inventory=node)
    assert sorted(manifest["wheels"]) == ["delta-2.0-py3-none-any.whl", "tool-1.0-py3-none-any.whl"]
    assert manifest["wheels"]["delta-2.0-py3-none-any.whl"]["replaces"] == "delta 1.0"
    out = capsys.readouterr().out
    assert (
        "the requirements need other versions than the node's of: delta "
        "(the node's versions of the others are kept)\n"
    ) in out
    assert all(f"node has {name}==1.0" in out for name in ("alpha", "beta", "gamma"))
    assert [line for line in out.splitlines() if "replaces node's" in line] == [
        "delta-2.0-py3-none-any.whl replaces node's delta 1.0"
    ]


@pytest.mark.parametrize("conflicts", [set(), {"c=1"}, {"a=1", "h=1"}, {"b=1", "c=1", "f=1"}])
def test_split_pins_names_exactly_the_pins_that_conflict(conflicts):
    """A resolver that fails whenever a conflicting pin is among those given; k conflicts
    among 8 pins take at most 1 + 2 k log2(8) resolves."""
    candidates = [f"{name}=1" for name in "abcdefgh"]
    calls: list[list[str]] = []

    def resolves(pins: list[str]) -> dict | None:
        calls.append(pins)
        return None if conflicts & set(pins) else {"pins": pins}

    report, taken, conflicting = split_pins(resolves, ["kept=1"], candidates)
    assert sorted(conflicting) == sorted(conflicts)
    assert sorted(taken) == sorted(set(candidates) - conflicts)
    assert report == {"pins": ["kept=1", *taken]}
    assert all(pins[0] == "kept=1" for pins in calls)
    assert len(calls) <= 1 + 2 * len(conflicts) * 3


def test_split_pins_takes_the_first_of_two_pins_that_conflict_with_each_other():
    def resolves(pins: list[str]) -> dict | None:
        return None if {"b=1", "d=1"} <= set(pins) else {}

    assert split_pins(resolves, [], ["a=1", "b=1", "c=1", "d=1"]) == (
        {},
        ["a=1", "b=1", "c=1"],
        ["d=1"],
    )
