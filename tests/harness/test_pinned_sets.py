"""The pinned sets a recording names (harness/pinned_sets.py): each with its digest, so that a
changed pin is a snapshot diff."""

from __future__ import annotations

import hashlib
from pathlib import Path

from harness import pinned_sets
from harness.host import CHECKOUT
from harness.record import record
from launchers.amd.run_qwen3_4b_lora import LAUNCHER as AMD
from launchers.cpu.run_tiny_qwen3_lora import LAUNCHER as CPU
from launchers.run_qwen3_4b_lora import LAUNCHER as CUDA

ARGV = ("--lr", "1e-5", "--constraints", "a.txt", "b.txt", "--seed", "0")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[: pinned_sets.DIGEST_CHARS]


def test_the_paths_after_the_flag_up_to_the_next_option():
    assert pinned_sets.named(ARGV) == ("a.txt", "b.txt")
    assert pinned_sets.named(ARGV[:5]) == ("a.txt", "b.txt")
    assert pinned_sets.named(("--lr", "1e-5")) == ()


def test_a_changed_pin_changes_the_line_and_a_missing_file_is_named(tmp_path):
    (tmp_path / "a.txt").write_text("sglang==0.5.17\n")
    before = pinned_sets.described(ARGV, tmp_path)
    (tmp_path / "a.txt").write_text("sglang==0.5.18\n")
    after = pinned_sets.described(ARGV, tmp_path)
    assert before[0] != after[0] == f"a.txt (sha256 {digest(tmp_path / 'a.txt')})"
    assert before[1] == after[1] == "b.txt (not in the checkout)"


def test_the_recipes_recordings_name_their_pinned_sets_with_the_checkouts_digests():
    cuda = ["constraints/cuda-sglang.txt", "constraints/cuda-megatron.txt"]
    for launcher, files in ((CUDA, cuda), (AMD, ["constraints/rocm.txt"])):
        lines = [f"{f} (sha256 {digest(Path(CHECKOUT) / f)})" for f in files]
        header = record(launcher, "train").text.split("\n\n", 1)[0]
        assert header.splitlines()[3:] == [f"# constraints: {line}" for line in lines]
        manifest = record(launcher, "rayjob").text
        assert all(f"# Pinned set of its packages: {line}\n" in manifest for line in lines)
    assert "# constraints:" not in record(CPU, "train").text  # the CPU recipe names none
