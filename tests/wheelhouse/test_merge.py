"""Several wheelhouses into one `--target`: namespace packages and packages that other wheels
add files to merge file by file; a real conflict is one line and changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.wheel_factory import make_wheel, write_sdist
from wheelhouse.__main__ import main
from wheelhouse.batches import write_batches
from wheelhouse.merge import installed

REAL_WHEELS = Path(__file__).parents[1] / "data" / "wheels"


def install(wheels: list[Path], out: Path, site: Path) -> int:
    write_batches(wheels, out, batch_mib=1)
    return main(["install", *map(str, sorted(out.glob("batch-*"))), "--target", str(site)])


def missing_recorded_files(site: Path) -> list[str]:
    """Files some distribution's RECORD lists that are not in `site`."""
    return sorted(
        f"{dist.project}: {rel}"
        for dist in installed(site).values()
        for rel in dist.files
        if not (site / rel).exists()
    )


def test_a_namespace_package_keeps_every_distributions_files(tmp_path):
    """Ray's closure (opentelemetry-sdk, -exporter-prometheus), then SGLang's (opentelemetry-api),
    real wheels: the second used to replace the whole `opentelemetry/` folder."""
    site = tmp_path / "site"
    first = sorted(REAL_WHEELS.glob("opentelemetry_[se]*.whl"))
    assert install(first, tmp_path / "ray-wh", site) == 0
    assert install(sorted(REAL_WHEELS.glob("opentelemetry_api-*.whl")), tmp_path / "sg", site) == 0

    assert (site / "opentelemetry" / "sdk" / "trace" / "__init__.py").is_file()
    assert (site / "opentelemetry" / "exporter" / "prometheus" / "__init__.py").is_file()
    assert (site / "opentelemetry" / "trace" / "__init__.py").is_file()
    assert sorted(installed(site)) == [
        "opentelemetry-api",
        "opentelemetry-exporter-prometheus",
        "opentelemetry-sdk",
    ]
    assert missing_recorded_files(site) == []


def test_a_wheel_that_adds_files_to_another_wheels_package(tmp_path):
    """Transformer Engine's PyTorch extension installs under the core wheel's package folder."""
    site = tmp_path / "site"
    core = make_wheel(
        tmp_path / "a", "te-core", "2.0", {"te/__init__.py": b"CORE = 1\n", "te/libcore.so": b"x"}
    )
    extension = make_wheel(tmp_path / "b", "te-torch", "2.0", {"te/wheel_lib/ext.so": b"y"})
    assert install([core], tmp_path / "wh1", site) == 0
    assert install([extension], tmp_path / "wh2", site) == 0
    assert (site / "te" / "libcore.so").read_bytes() == b"x"
    assert (site / "te" / "wheel_lib" / "ext.so").read_bytes() == b"y"
    assert missing_recorded_files(site) == []


def test_an_upgrade_removes_the_old_versions_files_only(tmp_path):
    site = tmp_path / "site"
    old = make_wheel(tmp_path / "a", "pkgx", "1.0", {"ns/pkgx/a.py": b"1", "ns/pkgx/gone.py": b""})
    neighbour = make_wheel(tmp_path / "b", "pkgy", "1.0", {"ns/pkgy/b.py": b"2"})
    new = make_wheel(tmp_path / "c", "pkgx", "2.0", {"ns/pkgx/a.py": b"2"})
    assert install([old, neighbour], tmp_path / "wh1", site) == 0
    assert install([new], tmp_path / "wh2", site) == 0
    assert not (site / "ns" / "pkgx" / "gone.py").exists()
    assert (site / "ns" / "pkgx" / "a.py").read_bytes() == b"2"
    assert (site / "ns" / "pkgy" / "b.py").read_bytes() == b"2"
    assert sorted(p.name for p in site.glob("*.dist-info")) == [
        "pkgx-2.0.dist-info",
        "pkgy-1.0.dist-info",
    ]


def test_two_distributions_owning_one_file_is_a_one_line_error(tmp_path, capsys):
    site = tmp_path / "site"
    mine = make_wheel(tmp_path / "a", "mine", "1.0", {"shared/util.py": b"A = 1\n"})
    theirs = make_wheel(tmp_path / "b", "theirs", "3.0", {"shared/util.py": b"A = 2\n"})
    same = make_wheel(tmp_path / "c", "twin", "1.0", {"shared/util.py": b"A = 1\n"})
    assert install([mine], tmp_path / "wh1", site) == 0
    assert install([same], tmp_path / "wh2", site) == 0  # identical bytes: no conflict
    before = sorted(p.relative_to(site) for p in site.rglob("*"))

    assert install([theirs], tmp_path / "wh3", site) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "already has shared/util.py (" in err and " 1.0 vs theirs 3.0)" in err
    assert sorted(p.relative_to(site) for p in site.rglob("*")) == before
    assert (site / "shared" / "util.py").read_bytes() == b"A = 1\n"


def test_source_distributions_build_against_the_wheels_installed_with_them(tmp_path):
    site = tmp_path / "site"
    core = make_wheel(tmp_path / "a", "corelib", "1.0", {"corelib.py": b"HEADERS = True\n"})
    extension = write_sdist(tmp_path / "a", "corelib_ext", "1.0", build_imports=("corelib",))
    assert install([core, extension], tmp_path / "wh", site) == 0
    assert (site / "corelib_ext.py").is_file() and (site / "corelib.py").is_file()
    code = "import corelib, corelib_ext; print(corelib_ext.BUILT_ON_THE_NODE)"
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.stdout.strip() == "True", done.stderr


def test_wheels_built_from_source_are_kept_to_carry_back(tmp_path, capsys):
    """A node-built extension (Transformer Engine's: 86 s to compile) is kept, and the next
    wheelhouse carries that wheel instead of the sdist: nothing builds the second time."""
    core = make_wheel(tmp_path / "a", "corelib", "1.0", {"corelib.py": b"HEADERS = True\n"})
    extension = write_sdist(tmp_path / "a", "corelib_ext", "1.0", build_imports=("corelib",))
    write_batches([core, extension], tmp_path / "wh", batch_mib=1)
    kept = tmp_path / "kept"
    batches = map(str, sorted((tmp_path / "wh").glob("batch-*")))
    site = tmp_path / "site"
    assert main(["install", *batches, "--target", str(site), "--keep-built", str(kept)]) == 0
    [built] = kept.glob("*.whl")
    assert built.name.startswith("corelib_ext-1.0-")
    assert f"kept in {kept}" in capsys.readouterr().out

    again = tmp_path / "site2"
    assert install([core, built], tmp_path / "wh2", again) == 0
    code = "import corelib_ext; print(corelib_ext.BUILT_ON_THE_NODE)"
    env = {**os.environ, "PYTHONPATH": str(again)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.stdout.strip() == "True", done.stderr
