"""A pytest run started from inside the suite, as a user would start it in a shell.

It does not inherit the variables pytest sets for the running test: under ``pytest -n``,
``PYTEST_XDIST_WORKER`` would make the inner run's plugins (syrupy's snapshot report among them)
act as a worker of a controller that is not there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

OUTER_TEST_VARIABLES = ("PYTEST_CURRENT_TEST", "PYTEST_XDIST_")


def run_pytest(
    *args: str, cwd: Path, env: Mapping[str, str] | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m pytest -q -p no:cacheprovider ARGS`` in `cwd`, with `env` over this
    environment; the output captured, the exit status left to the caller."""
    inherited = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(OUTER_TEST_VARIABLES)
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env={**inherited, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
