"""Pack wheels into batches of at most N MiB (a larger wheel split into numbered parts) and
write the manifest that `install` checks them against. Standard library only."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from common.digests import file_sha256

MIB = 2**20
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1


class WheelhouseError(Exception):
    """A problem worth one line to the user (exit status 2)."""


def part_name(wheel: str, index: int) -> str:
    """File name of a wheel's part `index` (1-based): `x.whl.part01`."""
    return f"{wheel}.part{index:02d}"


@dataclass(frozen=True)
class Piece:
    """One file in one batch: a whole wheel, or part `part` (1-based) of a split one."""

    wheel: str
    offset: int
    size: int
    part: int = 0

    @property
    def filename(self) -> str:
        return part_name(self.wheel, self.part) if self.part else self.wheel


def plan(sizes: dict[str, int], limit: int) -> list[list[Piece]]:
    """Batches of pieces, none over `limit` bytes: wheels larger than `limit` are split into
    parts of `limit` bytes (the last one smaller); pieces are placed first-fit, largest first."""
    pieces: list[Piece] = []
    for wheel, size in sizes.items():
        if size <= limit:
            pieces.append(Piece(wheel, 0, size))
            continue
        count = -(-size // limit)
        for i in range(count):
            offset = i * limit
            pieces.append(Piece(wheel, offset, min(limit, size - offset), i + 1))
    pieces.sort(key=lambda p: (-p.size, p.filename))
    batches: list[list[Piece]] = []
    room: list[int] = []
    for piece in pieces:
        for i, free in enumerate(room):
            if piece.size <= free:
                batches[i].append(piece)
                room[i] -= piece.size
                break
        else:
            batches.append([piece])
            room.append(limit - piece.size)
    return batches


def write_batches(
    wheels: list[Path], out: Path, batch_mib: float, notes: dict[str, dict] | None = None
) -> dict:
    """Write `out/batch-N/` folders (each with a copy of the manifest) and `out/manifest.json`.

    `notes` adds per-wheel fields to the manifest (e.g. what it replaces, how it was slimmed).
    """
    limit = int(batch_mib * MIB)
    by_name = {w.name: w for w in wheels}
    batches = plan({name: path.stat().st_size for name, path in by_name.items()}, limit)
    entries: dict[str, dict] = {
        name: {"sha256": file_sha256(path), "size": path.stat().st_size, "batch": None, "parts": []}
        | (notes or {}).get(name, {})
        for name, path in sorted(by_name.items())
    }
    for old in out.glob("batch-*"):
        shutil.rmtree(old)
    for number, pieces in enumerate(batches, start=1):
        folder = out / f"batch-{number}"
        folder.mkdir(parents=True)
        for piece in pieces:
            entry = entries[piece.wheel]
            if not piece.part:
                shutil.copyfile(by_name[piece.wheel], folder / piece.wheel)
                entry["batch"] = number
                continue
            with by_name[piece.wheel].open("rb") as src:
                src.seek(piece.offset)
                (folder / piece.filename).write_bytes(src.read(piece.size))
            entry["parts"].append({"file": piece.filename, "batch": number, "size": piece.size})
    for entry in entries.values():
        entry["parts"].sort(key=lambda p: p["file"])
    manifest = {
        "format": MANIFEST_FORMAT,
        "batch_mib": batch_mib,
        "batches": len(batches),
        "wheels": entries,
    }
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    (out / MANIFEST).write_text(text)
    for number in range(1, len(batches) + 1):
        (out / f"batch-{number}" / MANIFEST).write_text(text)
    return manifest


def batch_summary(manifest: dict) -> list[str]:
    """One line per batch: `batch-1: 12 wheels, 57.3 MiB` (sdists and parts counted apart)."""
    lines = []
    for number in range(1, manifest["batches"] + 1):
        whole = [n for n, e in manifest["wheels"].items() if e["batch"] == number]
        wheels = sum(1 for n in whole if n.endswith(".whl"))
        sources = len(whole) - wheels
        parts = [p for e in manifest["wheels"].values() for p in e["parts"] if p["batch"] == number]
        size = sum(e["size"] for e in manifest["wheels"].values() if e["batch"] == number)
        size += sum(p["size"] for p in parts)
        extra = f" + {sources} sdist{'s' * (sources != 1)}" if sources else ""
        extra += f" + {len(parts)} part{'s' * (len(parts) != 1)}" if parts else ""
        lines.append(f"batch-{number}: {wheels} wheels{extra}, {size / MIB:.1f} MiB")
    return lines
