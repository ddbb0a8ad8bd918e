"""A run's lease: what a launcher started ends with the launcher, however the launcher ends.

A launcher stops its job and its Ray itself when it fails, is interrupted or is terminated;
SIGKILL (the OOM killer, ``kill -9``, a lost node session) gives it no chance. So once the
claim has made the run's private dir, live mode starts this watcher in a session of its own,
reading a pipe whose other end only the launcher holds. The kernel closes that end when the
launcher dies; a launcher that ends on purpose first writes `END`. End of file without `END`:
the launcher is gone, and the watcher releases the run (`harness.ownership.release`: its job
and its Ray are stopped, its private dir with the token and the job's secrets removed).

    python -m harness.lease --tag TAG    (its standard input: the launcher's pipe)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence

END = b"end"


class Lease:
    """The launcher's end of a run's lease, whose watcher starts with it; `end` before the
    launcher ends on purpose, `close` in every case."""

    def __init__(self, tag: str, checkout: str, env: Mapping[str, str]) -> None:
        read, self._write = os.pipe()
        try:
            self.watcher = subprocess.Popen(
                [sys.executable, "-m", "harness.lease", "--tag", tag],
                stdin=read,
                stdout=subprocess.DEVNULL,
                cwd=checkout,
                env=dict(env),
                start_new_session=True,  # out of reach of the terminal's Ctrl-C and hang-up
            )
        finally:
            os.close(read)

    def end(self) -> None:
        """The launcher ends on purpose: what it leaves running stays (a Ray kept after its
        job); the watcher exits."""
        os.write(self._write, END)
        self.close()

    def close(self) -> None:
        if self._write >= 0:
            os.close(self._write)
            self._write = -1


def main(argv: Sequence[str] | None = None) -> int:
    from harness import ownership
    from harness.run_tag import RunTag

    parser = argparse.ArgumentParser(prog="python -m harness.lease", description=__doc__)
    parser.add_argument("--tag", type=RunTag.parse, required=True)
    options = parser.parse_args(argv)
    if sys.stdin.buffer.read() != END:
        ownership.release(options.tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
