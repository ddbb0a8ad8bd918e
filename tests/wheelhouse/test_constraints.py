"""The constraints files resolve with pip's resolver for CPython 3.12 on manylinux x86-64.

Needs PyPI (marker `network`, out of the default run: three resolutions take minutes).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from wheelhouse.inventory import expand_platform
from wheelhouse.names import normalize
from wheelhouse.sdists import write_stand_in

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "constraints"
PYPI = "https://pypi.org/simple/pip/"

# file, requirements, newest manylinux tag needed, stand-in image pins, headline versions
CASES = {
    "cuda-sglang.txt": (
        [".[ray,portable,sglang]"],
        "manylinux_2_34_x86_64",
        [],
        {
            "sglang": "0.5.17",
            "torch": "2.11.0",
            "transformers": "5.12.1",
            "ray": "2.60.0",
            "flashinfer-python": "0.6.15.post1",
            "peft": "0.21.2",
        },
    ),
    "cuda-megatron.txt": (
        [".[ray,portable,megatron]", "transformer-engine[core_cu13]"],
        "manylinux_2_39_x86_64",
        [],
        {
            "megatron-core": "0.19.2",
            "megatron-bridge": "0.6.2",
            "transformer-engine": "2.20.2",
            "transformer-engine-cu13": "2.20.2",
            "torch": "2.11.0",
            "ray": "2.60.0",
            "flashinfer-python": "0.6.8.post1",
        },
    ),
    "rocm.txt": (
        [".[ray,portable]"],
        "manylinux_2_28_x86_64",
        ["torch==2.11.0", "transformers==5.12.1"],
        {"ray": "2.60.0", "peft": "0.21.2"},
    ),
}


def pypi_reachable() -> bool:
    try:
        with urllib.request.urlopen(PYPI, timeout=10):
            return True
    except OSError:
        return False


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        match = re.match(r"([A-Za-z0-9._-]+)==(\S+)", line)
        if match:
            found[normalize(match[1])] = match[2]
    return found


def sdist_pins(path: Path) -> list[tuple[str, str]]:
    lines = path.read_text().splitlines()
    found = [re.match(r"([A-Za-z0-9._-]+)==(\S+)\s+# sdist", ln) for ln in lines]
    return [(m[1], m[2]) for m in found if m]


@pytest.mark.network
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", sorted(CASES))
def test_constraints_resolve_for_python_3_12_manylinux(name, tmp_path):
    if not pypi_reachable():
        pytest.skip(f"PyPI is not reachable ({PYPI})")
    requirements, newest, image, headline = CASES[name]
    path = CONSTRAINTS / name
    stand_ins = tmp_path / "stand-ins"
    for dist, version in sdist_pins(path):
        write_stand_in(stand_ins, dist, version)  # what `wheelhouse build --sdist` resolves with
    image_file = tmp_path / "image.txt"
    image_file.write_text("".join(f"{pin}\n" for pin in image))
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed"]
    command += ["--quiet", "--report", str(report), "--only-binary=:all:"]
    command += ["--python-version", "3.12", "--implementation", "cp"]
    for tag in expand_platform(newest):
        command += ["--platform", tag]
    command += ["--target", str(tmp_path / "site"), "--find-links", str(stand_ins)]
    command += ["-c", str(path), "-c", str(image_file), *requirements]
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    for key in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT"):
        env.pop(key, None)
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    resolved = {
        normalize(item["metadata"]["name"]): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert {k: resolved.get(k) for k in headline} == headline
    if not image:
        unpinned = sorted(set(resolved) - set(pins(path)) - {"grpo-lora-launchers"})
        assert unpinned == [], f"{name} misses pins for {unpinned}"
