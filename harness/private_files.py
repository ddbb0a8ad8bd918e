"""Files of a run that only its user may touch: private dirs and secret files, made and checked.

A run's files live at predictable paths (``/tmp/grpo-<slot>-<run>``, the output dir), where
another local user may have been first. So a private dir is made by this user with an
exclusive ``mkdir`` (a leftover of the user's own is removed first), mode 0700, below parents
nobody else can write to; anything else at that path is refused in one line. Secret files are
created exclusively with mode 0600 inside such a dir.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat

from common.owned_files import NotPrivate, check_parents


def make_private_dir(path: str) -> None:
    """Create `path` afresh as this user's directory with mode 0700 (a run's private dir).

    A directory of this user's own already there (a dead run's leftover) is removed first;
    anything else there (another user's directory, a symlink, a file) is refused, as is a
    parent that another user may write to (they could swap the directory afterwards).
    """
    check_parents(os.path.dirname(path))
    if own_dir_mode(path) is not None:
        shutil.rmtree(path)  # this user's own: symlinks inside are removed, never followed
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        raise NotPrivate(f"{path} was created by someone else meanwhile; try again") from None
    os.chmod(path, 0o700)  # whatever the umask


def private_dir(path: str) -> None:
    """`path` as this user's directory with mode 0700, made (with its parents) when missing;
    see `check_private_dir` for what is refused."""
    check_private_dir(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        check_private_dir(path)  # there before, or made meanwhile: checked again
    else:
        os.chmod(path, 0o700)


def check_private_dir(path: str) -> None:
    """Refuse `path` unless it is missing or this user's directory with mode 0700, below
    parents that no other user may write to."""
    existing = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    check_parents(existing)
    mode = own_dir_mode(path)
    if mode is not None and mode != 0o700:
        raise NotPrivate(
            f"{path} has mode {mode:o}: others may have read or replaced what it holds; make "
            f"it private (chmod 700 {path}) or remove it"
        )


def own_dir_mode(path: str) -> int | None:
    """The permission bits of `path`, a directory of this user's; None when nothing is there;
    raises `NotPrivate` when something else is there."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise NotPrivate(
            f"{path} exists and is not a directory of this user's (owner uid {info.st_uid}): "
            "another user may have made it to take the run over; remove it (as its owner or "
            "root) or choose another --run-id"
        )
    return stat.S_IMODE(info.st_mode)


def check_private_file(path: str) -> None:
    """`path` is a regular file of this user's that no one else may read, in a directory of
    this user's with mode 0700 (as `make_private_dir` makes it and `write_secret` writes)."""
    folder = os.path.dirname(path) or "."
    for where, kind, mask in ((folder, stat.S_ISDIR, 0o077), (path, stat.S_ISREG, 0o077)):
        info = os.lstat(where)
        if not kind(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & mask:
            raise NotPrivate(
                f"{where} is not private to this user (owner uid {info.st_uid}, mode "
                f"{stat.S_IMODE(info.st_mode):o}): another user may have made or read it"
            )
    check_parents(os.path.dirname(os.path.abspath(folder)))


def write_secret(path: str, content: str) -> None:
    """Write `content` to a new file `path` (an old one is replaced), mode 0600 from its
    creation on: never readable by others, not even for a moment."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(content)
