"""Wheelhouse batches: split, carry, join, verify and install; install's one-line errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.wheel_factory import make_wheel
from wheelhouse.__main__ import main
from wheelhouse.batches import MIB, plan, write_batches
from wheelhouse.install import assemble, read_manifest


@pytest.fixture
def wheels(tmp_path: Path) -> list[Path]:
    """Three wheels of incompressible data: 2.3 MiB, 0.6 MiB and 0.3 MiB."""
    src = tmp_path / "src"
    return [
        make_wheel(src, "big-kernels", "1.0", {"big_kernels/k.bin": os.urandom(int(2.3 * MIB))}),
        make_wheel(src, "mid", "2.0", {"mid/m.bin": os.urandom(int(0.6 * MIB))}),
        make_wheel(src, "small", "3.0", {"small/__init__.py": b"X = 3\n"}),
    ]


def batch_folders(out: Path) -> list[Path]:
    return sorted(out.glob("batch-*"))


def test_plan_splits_large_wheels_and_respects_the_limit():
    batches = plan({"a.whl": 25, "b.whl": 7, "c.whl": 4}, limit=10)
    sizes = [sum(p.size for p in batch) for batch in batches]
    assert max(sizes) <= 10
    parts = sorted(p.filename for batch in batches for p in batch if p.wheel == "a.whl")
    assert parts == ["a.whl.part01", "a.whl.part02", "a.whl.part03"]
    assert sum(sizes) == 36


def test_split_and_join_round_trip_with_checksums(tmp_path, wheels, capsys):
    out = tmp_path / "wh"
    manifest = write_batches(wheels, out, batch_mib=1)
    for folder in batch_folders(out):
        carried = sum(p.stat().st_size for p in folder.iterdir() if p.name != "manifest.json")
        assert carried <= MIB
    big = manifest["wheels"][wheels[0].name]
    assert big["batch"] is None and len(big["parts"]) == 3
    joined = assemble(read_manifest(batch_folders(out)), batch_folders(out), tmp_path / "join")
    assert sorted(p.read_bytes() for p in joined) == sorted(w.read_bytes() for w in wheels)
    assert json.loads((out / "manifest.json").read_text()) == manifest


def test_install_into_a_target_and_through_a_stash(tmp_path, wheels, capsys):
    out = tmp_path / "wh"
    write_batches(wheels, out, batch_mib=1)
    folders = batch_folders(out)
    assert main(["install", *map(str, folders), "--target", str(tmp_path / "site")]) == 0
    assert (tmp_path / "site" / "big_kernels" / "k.bin").stat().st_size == int(2.3 * MIB)
    assert (tmp_path / "site" / "small" / "__init__.py").read_text() == "X = 3\n"

    stash, site = tmp_path / "stash", tmp_path / "site2"
    for folder in folders[:-1]:
        assert main(["install", str(folder), "--stash", str(stash), "--target", str(site)]) == 0
        assert "waiting for" in capsys.readouterr().out
    assert not site.exists()
    assert main(["install", str(folders[-1]), "--stash", str(stash), "--target", str(site)]) == 0
    assert f"installed 3 wheels into {site}" in capsys.readouterr().out
    assert (site / "mid" / "m.bin").is_file()


def test_the_stash_never_follows_a_symlink(tmp_path, wheels, capsys):
    """A symlink in a batch (to /etc/shadow, say) is refused, not copied into the stash; one
    planted in the stash is replaced, its victim untouched."""
    out = tmp_path / "wh"
    write_batches(wheels, out, batch_mib=1)
    first = batch_folders(out)[0]
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    stash = tmp_path / "stash"
    stash.mkdir()
    (stash / "manifest.json").symlink_to(victim)
    assert main(["install", str(first), "--stash", str(stash)]) == 0
    capsys.readouterr()
    assert victim.read_text() == "precious\n" and not (stash / "manifest.json").is_symlink()

    secret = tmp_path / "secret"
    secret.write_text("root:hash\n")
    (first / "zz-shadow").symlink_to(secret)
    assert main(["install", str(first), "--stash", str(stash)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{first / 'zz-shadow'} is a symlink" in err
    assert not (stash / "zz-shadow").exists()


def test_a_second_wheelhouse_keeps_the_first_ones_scripts(tmp_path, capsys):
    """pip's `--upgrade --target` replaces the whole bin folder: a node that installed Ray's
    wheelhouse, then SGLang's, lost the `ray` command."""
    site = tmp_path / "site"
    for name in ("raylike", "engine"):
        wheel = make_wheel(
            tmp_path / f"{name}-wheels",
            name,
            "1.0",
            files={
                f"{name}/__init__.py": b"",
                f"{name}-1.0.data/scripts/{name}-cli": b"#!python\nprint(1)\n",
            },
        )
        write_batches([wheel], tmp_path / f"{name}-wh", batch_mib=1)
        folders = batch_folders(tmp_path / f"{name}-wh")
        assert main(["install", *map(str, folders), "--target", str(site)]) == 0
    assert sorted(p.name for p in (site / "bin").iterdir()) == ["engine-cli", "raylike-cli"]
    assert (site / "raylike" / "__init__.py").is_file() and (site / "engine").is_dir()


def test_an_upgrade_into_a_target_leaves_one_version(tmp_path):
    site = tmp_path / "site"
    for version in ("1.0", "2.0"):
        wheel = make_wheel(tmp_path / f"w{version}", "pkgx", version)
        write_batches([wheel], tmp_path / f"wh{version}", batch_mib=1)
        folders = batch_folders(tmp_path / f"wh{version}")
        assert main(["install", *map(str, folders), "--target", str(site)]) == 0
    assert sorted(p.name for p in site.glob("*.dist-info")) == ["pkgx-2.0.dist-info"]


def one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


def test_install_errors_are_one_line(tmp_path, wheels, capsys):
    out = tmp_path / "wh"
    write_batches(wheels, out, batch_mib=1)
    folders = batch_folders(out)
    target = ["--target", str(tmp_path / "site")]

    err = one_line_error(capsys, ["install", *map(str, folders[1:]), *target])
    assert f"missing batch-1 (of {len(folders)})" in err

    part = next(folders[0].glob("*.part*"))
    saved = part.read_bytes()
    part.write_bytes(saved[:-1] + bytes([saved[-1] ^ 1]))
    err = one_line_error(capsys, ["install", *map(str, folders), *target])
    assert "checksum mismatch: big_kernels-1.0-py3-none-any.whl" in err

    mid = next(f for f in folders if (f / wheels[1].name).exists())
    (mid / wheels[1].name).unlink()
    part.write_bytes(saved)
    extra = [f for f in folders if any(f.iterdir()) and f != mid]
    err = one_line_error(capsys, ["install", *map(str, [mid, *extra]), *target])
    assert f"missing {wheels[1].name} from batch-" in err

    err = one_line_error(capsys, ["install", str(tmp_path / "nowhere"), *target])
    assert "no such batch folder" in err
    assert not (tmp_path / "site").exists()


@pytest.mark.parametrize(
    "name", ["../../escaped.whl", "/tmp/abs.whl", "sub/dir.whl", "..", "a\\b.whl"]
)
def test_manifest_names_with_a_path_are_refused_before_anything_is_written(tmp_path, capsys, name):
    wheel = make_wheel(tmp_path / "w", "pkgz", "1.0")
    out = tmp_path / "wh"
    write_batches([wheel], out, batch_mib=1)
    manifest = out / "batch-1" / "manifest.json"
    manifest.write_text(manifest.read_text().replace(wheel.name, name.replace("\\", "\\\\")))
    site, stash = tmp_path / "site", tmp_path / "stash"
    assert main(["install", str(out / "batch-1"), "--stash", str(stash), "--target", str(site)])
    err = capsys.readouterr().err
    assert "is not a plain file name" in err and err.count("\n") == 1
    assert not site.exists() and not stash.exists()
    assert not (tmp_path / "escaped.whl").exists()


def test_a_damaged_manifest_is_named_in_one_line(tmp_path, capsys):
    wheels = [make_wheel(tmp_path / "w", n, "1.0", {f"{n}/d": os.urandom(600_000)}) for n in "ab"]
    out = tmp_path / "wh"
    write_batches(wheels, out, batch_mib=1)
    folders = sorted(out.glob("batch-*"))
    assert len(folders) == 2
    text = (folders[1] / "manifest.json").read_text()

    (folders[1] / "manifest.json").write_text(text[: len(text) // 2])  # truncated in transit
    assert main(["install", *map(str, folders)]) == 2
    err = capsys.readouterr().err
    assert f"damaged manifest {folders[1] / 'manifest.json'}" in err and err.count("\n") == 1

    (folders[1] / "manifest.json").write_text('{"format": 1, "batches": 2}')
    assert main(["install", *map(str, folders)]) == 2
    assert "no batch count or wheel list" in capsys.readouterr().err

    (folders[1] / "manifest.json").write_text("[1, 2]")
    assert main(["install", *map(str, folders)]) == 2
    assert "unknown manifest format None" in capsys.readouterr().err
