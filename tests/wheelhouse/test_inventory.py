"""`inventory` on this machine, and the node side's standard-library-only promise."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

from wheelhouse.__main__ import main
from wheelhouse.inventory import expand_platform, platform_tags


def test_inventory_describes_this_machine(tmp_path, capsys):
    out = tmp_path / "node.json"
    assert main(["inventory", "-o", str(out)]) == 0
    node = json.loads(out.read_text())
    assert node["python"]["version"].startswith(f"{sys.version_info[0]}.{sys.version_info[1]}.")
    assert node["python"]["abi"] == f"cp{sys.version_info[0]}{sys.version_info[1]}"
    names = {d["name"]: d for d in node["distributions"]}
    assert "pip" in names and names["pip"]["version"]
    plat = sysconfig.get_platform().replace("-", "_")
    assert node["platform_tags"][-1] == plat


def test_manylinux_tags_follow_glibc():
    tags = platform_tags("linux-x86_64", (2, 28))
    assert tags[0] == "manylinux_2_28_x86_64" and tags[-1] == "linux_x86_64"
    assert {"manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_5_x86_64"} <= set(tags)
    assert "manylinux_2_29_x86_64" not in tags
    arm = platform_tags("linux-aarch64", (2, 17))
    assert arm == ["manylinux_2_17_aarch64", "manylinux2014_aarch64", "linux_aarch64"]
    assert platform_tags("linux-x86_64", None) == ["linux_x86_64"]
    assert expand_platform("manylinux_2_34_x86_64")[:2] == [
        "manylinux_2_34_x86_64",
        "manylinux_2_33_x86_64",
    ]
    assert expand_platform("win_amd64") == ["win_amd64"]


def test_node_side_needs_only_the_standard_library():
    code = (
        "import sys, wheelhouse.__main__, wheelhouse.inventory, wheelhouse.install\n"
        "bad = {m.split('.')[0] for m in sys.modules}\n"
        "bad &= {'packaging', 'harness', 'trainer', 'typer'}\n"
        "sys.exit(f'imported {sorted(bad)}' if bad else 0)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
