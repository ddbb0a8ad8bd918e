"""Exclusive locks a live launcher holds for its whole run (``flock`` on a file of its own).

A lock taken by a process is released by the kernel when that process ends, however it
ends: a killed launcher never leaves a stale lock. The lock file sits at a predictable path,
so it is opened without following a symlink and refused when it is not this user's own
regular file (another user made it first). It names its holder, for the refusal of the next.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Iterator

from common.owned_files import NotPrivate


class Locked(Exception):
    """Another process holds the lock; the message names it (as it wrote itself)."""


@contextlib.contextmanager
def exclusive_lock(path: str, holder: str) -> Iterator[None]:
    """Hold the lock `path` within, naming the holder `holder` (with this process's pid);
    `Locked` when another process holds it, `NotPrivate` when `path` is not this user's."""
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:  # ELOOP: a symlink planted there
        raise NotPrivate(f"{path}: cannot open it as a lock ({err.strerror or err})") from None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            raise NotPrivate(
                f"{path} is not a file of this user's (owner uid {info.st_uid}): another user "
                "made it; remove it (as its owner or root)"
            )
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            named = os.pread(descriptor, 4096, 0).decode("utf-8", "replace").strip()
            raise Locked(named or f"another process holding {path}") from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{holder} (launcher pid {os.getpid()})\n".encode(), 0)
        yield
    finally:
        os.close(descriptor)
