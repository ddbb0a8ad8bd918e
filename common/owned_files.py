"""Writing where another local user may have prepared the path first.

A run writes at predictable paths (``<output-dir>/<run-id>/metrics.jsonl``, ``summary.json``,
``checkpoints/latest``, ``sbatch.sh``). Another user who can write to one of the directories
above such a file can plant a symlink there and have the run overwrite a file of their choice,
or replace what the run later reads. So a directory a run writes into is refused unless only
this user (and root) can change it and every directory above it (`check_parents`), and files
are never opened through a symlink: each is written to a fresh temporary file created
exclusively beside it and renamed over it (`write_atomic`), which replaces a symlink at the
path instead of following it, and leaves the old file or the new one, never half of one.
Standard library only: the launcher, the trainer and the wheelhouse on a bare node use it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile


class NotPrivate(Exception):
    """A path another local user could have made or could change (one line)."""


def check_parents(path: str | os.PathLike[str]) -> None:
    """`path` and every directory above it belong to this user or root, and no one else may
    write to them (unless the sticky bit keeps them from renaming what is not theirs)."""
    current = os.path.abspath(path)
    while True:
        info = os.stat(current)
        foreign = info.st_uid not in (os.geteuid(), 0)
        if foreign or (info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX):
            why = f"owner uid {info.st_uid}" if foreign else f"mode {stat.S_IMODE(info.st_mode):o}"
            raise NotPrivate(
                f"{current} may be changed by other users ({why}), so files a run writes "
                "below it are not safe; use a directory only you can write to"
            )
        if current == os.path.dirname(current):
            return
        current = os.path.dirname(current)


def owned_dir(path: str | os.PathLike[str]) -> None:
    """Make directory `path` (and missing parents, mode 0755 less the umask) and check that
    nobody but this user and root can change it or anything above it (`check_parents`).

    A directory that exists must be this user's: one of root's or another user's below a
    path of this user's is someone else's, even when they cannot write to it now. Raises
    `NotPrivate`, or `OSError` when it cannot be made.
    """
    existing = os.path.abspath(path)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    check_parents(existing)
    os.makedirs(path, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise NotPrivate(
            f"{os.path.abspath(path)} is not a directory of this user's (owner uid "
            f"{info.st_uid}); choose a directory of your own"
        )
    check_parents(path)


def write_atomic(path: str | os.PathLike[str], data: str | bytes, mode: int = 0o644) -> None:
    """Replace `path` with a file holding `data` and permission bits `mode`.

    The content goes to a new file of a random name created exclusively in the same
    directory (never a symlink another user planted), is flushed to disk, and then renamed
    over `path`: a symlink at `path` is replaced, not followed, and a crash or a full disk
    leaves the old file whole.
    """
    folder = os.path.dirname(os.path.abspath(path))
    descriptor, temporary = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.")
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data.encode("utf-8") if isinstance(data, str) else data)
            file.flush()
            os.fchmod(file.fileno(), mode)
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def append_line(path: str | os.PathLike[str], line: str) -> None:
    """Append `line` (its newline included) to `path` in one write, creating the file (mode
    0644 less the umask) if missing; a symlink at `path` is refused (``OSError`` ELOOP)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    descriptor = os.open(path, flags, 0o644)
    with os.fdopen(descriptor, "a", encoding="utf-8") as file:
        file.write(line)


def check_dir(path: str | os.PathLike[str]) -> None:
    """What `owned_dir` checks, without making anything: the deepest existing part of `path`
    and every directory above it private (`check_parents`), and `path`, if it exists, a
    directory of this user's. Raises `NotPrivate`."""
    existing = os.path.abspath(path)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    check_parents(existing)
    if existing == os.path.abspath(path):
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise NotPrivate(
                f"{existing} is not a directory of this user's (owner uid {info.st_uid}); "
                "choose a directory of your own"
            )


def fresh_dir(path: str | os.PathLike[str]) -> None:
    """Make directory `path` anew (mode 0755 less the umask) in a directory of this user's.

    What is at `path` already must be a directory of this user's (what a killed run of this
    user left there), and is removed first; a symlink, a file or another user's directory
    there is refused with `NotPrivate`. ``mkdir`` then fails if anything appeared meanwhile.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    if info is not None:
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            raise NotPrivate(
                f"{os.path.abspath(path)} is not a directory (someone else's link or file?); "
                "remove it"
            )
        if info.st_uid != os.geteuid():
            raise NotPrivate(
                f"{os.path.abspath(path)} belongs to uid {info.st_uid}, not to this user; remove it"
            )
        shutil.rmtree(path)
    os.mkdir(path, 0o755)


def read_text(path: str | os.PathLike[str]) -> str:
    """The UTF-8 text of file `path`; a symlink at `path` is refused (``OSError`` ELOOP)."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(descriptor, encoding="utf-8") as file:
        return file.read()
