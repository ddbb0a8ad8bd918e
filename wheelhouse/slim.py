"""Repack a wheel without the members a recipe never uses, with a correct RECORD (PEP 376/427:
`path,sha256=<urlsafe base64, no padding>,size`; RECORD itself unhashed, signatures dropped)."""

from __future__ import annotations

import csv
import fnmatch
import io
import re
import shutil
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from wheelhouse.batches import WheelhouseError
from wheelhouse.profiles import Rule
from wheelhouse.wheel_file import record_hash

_SM = re.compile(r"(?<![a-z0-9])sm_?(\d{2,3})[a-z]?(?![0-9])", re.IGNORECASE)
_ARCH = re.compile(r"sm_?(\d{2,3})a?", re.IGNORECASE)
# Only compiled device code is dropped by architecture: sources and headers (CUTLASS's
# `cute/arch/copy_sm100.hpp` is included whatever the GPU) are what a JIT compile on the node
# reads, and Python modules may be imported whatever the GPU.
_BINARY = re.compile(r"\.(so|cubin|fatbin|ptx|a|o|bin)(\.\d+)*$")


def parse_arch(text: str) -> int:
    """`sm90`, `sm_90` or `sm90a` -> 90."""
    match = _ARCH.fullmatch(text.strip())
    if not match:
        raise WheelhouseError(f"--cuda-arch {text!r}: expected e.g. sm90 (Hopper) or sm100")
    return int(match.group(1))


def newer_arch_only(member: str, arch: int) -> bool:
    """True when the member is compiled code naming GPU architectures that are all newer than
    `arch` (it cannot run there). Sources, headers and Python modules are never dropped this
    way (see `_BINARY`)."""
    if not _BINARY.search(member) or ".dist-info/" in member:
        return False
    found = [int(m) for m in _SM.findall(member)]
    return bool(found) and all(n > arch for n in found)


def matches(member: str, patterns: tuple[str, ...]) -> bool:
    return any(
        member.startswith(p) if p.endswith("/") else fnmatch.fnmatchcase(member, p)
        for p in patterns
    )


def strip_library(data: bytes, name: str) -> bytes:
    tool = shutil.which("strip")
    if tool is None:
        raise WheelhouseError("`strip` not found (install binutils) but the profile strips .so")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "lib.so"
        path.write_bytes(data)
        done = subprocess.run(
            [tool, "--strip-unneeded", str(path)], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise WheelhouseError(f"strip failed on {name}: {done.stderr.strip()[:200]}")
        return path.read_bytes()


@dataclass(frozen=True)
class Slimmed:
    before: int
    after: int
    dropped: int

    def line(self, wheel: str) -> str:
        mib = 2**20
        return (
            f"slimmed {wheel}: {self.before / mib:.1f} -> {self.after / mib:.1f} MiB "
            f"({self.dropped} members dropped)"
        )


def plan_drops(names: list[str], rule: Rule, arch: int | None) -> set[str]:
    """The members of a wheel that slimming removes."""
    return {
        n
        for n in names
        if ".dist-info/" not in n
        and (matches(n, rule.drop) or (arch is not None and newer_arch_only(n, arch)))
    }


def slim_wheel(src: Path, dst: Path, rule: Rule, arch: int | None = None) -> Slimmed | None:
    """Write the slimmed wheel to `dst`; None (nothing written) when nothing would change."""
    with zipfile.ZipFile(src) as zin:
        infos = zin.infolist()
        drops = plan_drops([i.filename for i in infos], rule, arch)
        if not drops and not rule.strip:
            return None
        records = [i.filename for i in infos if i.filename.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            raise WheelhouseError(f"{src.name}: expected one .dist-info/RECORD")
        record = records[0]
        signatures = {record + ".jws", record + ".p7s"}
        rows: list[list[str]] = []
        with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
            for info in infos:
                name = info.filename
                if name in drops or name == record or name in signatures:
                    continue
                data = zin.read(info)
                if rule.strip and name.endswith(".so") and not info.is_dir():
                    data = strip_library(data, name)
                out = zipfile.ZipInfo(name, date_time=info.date_time)
                out.external_attr = info.external_attr
                out.compress_type = zipfile.ZIP_STORED if info.is_dir() else zipfile.ZIP_DEFLATED
                zout.writestr(out, data)
                if not info.is_dir():
                    rows.append([name, record_hash(data), str(len(data))])
            rows.append([record, "", ""])
            text = io.StringIO()
            csv.writer(text, lineterminator="\n").writerows(rows)
            zout.writestr(record, text.getvalue())
    return Slimmed(src.stat().st_size, dst.stat().st_size, len(drops))
