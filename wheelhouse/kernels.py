"""FlashInfer's just-in-time compiled kernels, carried from one node to the next as the
`flashinfer-jit-cache` wheel FlashInfer itself looks for. Standard library only (runs on the node).

On a fresh node FlashInfer compiles each attention kernel it needs the first time an engine asks
for it (two to three minutes for SGLang's FlashInfer backend on an H100 or H200), into
`~/.cache/flashinfer/<version>/<arch>/cached_ops/<name>/<name>.so`. FlashInfer loads a kernel
without compiling where its AOT folder holds `<name>/<name>.so`, and that folder is the one the
installed `flashinfer_jit_cache` package names (`get_jit_cache_dir()`, its `__version__`
starting with FlashInfer's; `flashinfer/jit/env.py` and `JitSpec.build_and_load` in FlashInfer
0.6). `pack` writes such a package of the kernels a node compiled: carried back, it joins the
next wheelhouse (`build --find-links`), and a node of the same architecture with the same
FlashInfer starts without compiling them. On a GPU of another architecture the package names an
empty folder and FlashInfer compiles as before.

A node that started with such a package compiles only what it lacked, so its cache alone holds
only those; `pack` joins the kernels of earlier wheels (`packed_kernels`) with the cache's, so the
next wheel carries both.
"""

from __future__ import annotations

import os
import re
import sysconfig
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from wheelhouse.batches import WheelhouseError
from wheelhouse.wheel_file import write_wheel

DISTRIBUTION = "flashinfer-jit-cache"
PACKAGE = "flashinfer_jit_cache"

_INIT = '''"""FlashInfer {version}'s kernels as a node compiled them for {arch}; FlashInfer
loads them from here instead of compiling (written by `python -m wheelhouse kernels`)."""

from __future__ import annotations

from pathlib import Path

__version__ = "{version}+{local}"
ARCHS = {archs!r}


def jit_cache_dir_for(capability: tuple[int, int] | None) -> str:
    """The kernels' folder, or an empty one on a GPU of another architecture."""
    here = Path(__file__).parent
    if capability is not None and f"{{capability[0]}}{{capability[1]}}" not in ARCHS:
        return str(here / "other_architecture")
    return str(here / "jit_cache")


def device_capability() -> tuple[int, int] | None:
    """The first GPU's, read through NVML (FlashInfer's dependency), which unlike torch does
    not initialize CUDA in a process that may fork; None where NVML cannot tell."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver
        return None
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    except pynvml.NVMLError:  # no GPU
        return None
    finally:
        pynvml.nvmlShutdown()
    return major, minor


def get_jit_cache_dir() -> str:
    return jit_cache_dir_for(device_capability())
'''


@dataclass(frozen=True)
class CompiledKernels:
    """The kernels one FlashInfer version compiled for one set of architectures."""

    version: str
    arch: str  # FlashInfer's workspace name, e.g. "90a" or "80_90a"
    libraries: dict[str, bytes]  # kernel name -> its shared library

    @property
    def archs(self) -> tuple[str, ...]:
        """Compute capabilities, major and minor joined as NVML reports them ("90" for "90a")."""
        return tuple(re.sub(r"[a-z]+$", "", a) for a in self.arch.split("_"))

    @property
    def local(self) -> str:
        """The wheel's local version label: "sm90a", "sm80.sm90a"."""
        return "sm" + self.arch.replace("_", ".sm")


def flashinfer_cache() -> Path:
    """FlashInfer's cache folder on this node (`FLASHINFER_WORKSPACE_BASE`, else the home)."""
    base = os.environ.get("FLASHINFER_WORKSPACE_BASE") or str(Path.home())
    return Path(base) / ".cache" / "flashinfer"


def compiled_kernels(cache: Path) -> list[CompiledKernels]:
    """Every `<version>/<arch>/cached_ops/<name>/<name>.so` under `cache`, by version and arch."""
    found = []
    for ops in sorted(cache.glob("*/*/cached_ops")):
        libraries = {
            folder.name: (folder / f"{folder.name}.so").read_bytes()
            for folder in sorted(ops.iterdir())
            if (folder / f"{folder.name}.so").is_file()
        }
        if libraries:
            found.append(CompiledKernels(ops.parent.parent.name, ops.parent.name, libraries))
    return found


def packed_kernels(wheel: Path) -> CompiledKernels:
    """The kernels of a wheel `pack` wrote, by the version its metadata names (its file may have
    been renamed on the way: a transfer may refuse the `+` of its name)."""
    libraries: dict[str, bytes] = {}
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
            metadata = next((n for n in names if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)), "")
            version = re.search(r"^Version: (\S+)$", archive.read(metadata).decode(), re.M)
            library = re.compile(rf"{PACKAGE}/jit_cache/([^/]+)/\1\.so")
            libraries = {
                match[1]: archive.read(name) for name in names if (match := library.fullmatch(name))
            }
    except (OSError, zipfile.BadZipFile, KeyError):
        version = None
    release, _, local = version[1].partition("+") if version else ("", "", "")
    if not re.fullmatch(r"sm\w+(\.sm\w+)*", local):
        raise WheelhouseError(
            f"{wheel} is not a readable wheel of `python -m wheelhouse kernels` (a {DISTRIBUTION} "
            "wheel whose version ends in +sm<arch>): pass a wheel that command packed"
        )
    return CompiledKernels(release, local.removeprefix("sm").replace(".sm", "_"), libraries)


def joined(kernel_sets: Iterable[CompiledKernels]) -> list[CompiledKernels]:
    """One set per FlashInfer version and architecture, a later set's library replacing an
    earlier one of the same name."""
    by_build: dict[tuple[str, str], dict[str, bytes]] = {}
    for kernels in kernel_sets:
        by_build.setdefault((kernels.version, kernels.arch), {}).update(kernels.libraries)
    return [CompiledKernels(v, a, libraries) for (v, a), libraries in by_build.items()]


def pack(cache: Path, out: Path, earlier: Sequence[Path] = ()) -> list[str]:
    """One `flashinfer-jit-cache` wheel per FlashInfer version and architecture: the kernels of
    the `earlier` wheels (`packed_kernels`) and those in `cache`, the cache's where both have
    one."""
    found = joined([*(packed_kernels(wheel) for wheel in earlier), *compiled_kernels(cache)])
    if not found:
        raise WheelhouseError(
            f"no compiled FlashInfer kernels under {cache}: run the job (or one engine) on this "
            "node first, or point --cache at FlashInfer's cache folder"
        )
    lines = []
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    for kernels in found:
        init = _INIT.format(
            version=kernels.version, arch=kernels.arch, local=kernels.local, archs=kernels.archs
        )
        files = {f"{PACKAGE}/__init__.py": init.encode()}
        for name, library in kernels.libraries.items():
            files[f"{PACKAGE}/jit_cache/{name}/{name}.so"] = library
        wheel = write_wheel(
            out,
            DISTRIBUTION,
            f"{kernels.version}+{kernels.local}",
            files,
            tag=f"py3-none-{platform}",
            summary=f"FlashInfer {kernels.version}'s kernels compiled for {kernels.arch}",
        )
        mib = wheel.stat().st_size / 2**20
        lines.append(
            f"packed {len(kernels.libraries)} kernels of FlashInfer {kernels.version} for "
            f"{kernels.arch} ({mib:.1f} MiB): {wheel}"
        )
    return lines
