"""How the project's argparse commands end: an expected failure is one line and an exit status.

`python -m harness.cluster`, `python -m harness.ownership` and `python -m wheelhouse` each run
one action and know the exception that means "this did not work, and here is why" (a cluster
not ready, a claim refused, a wheelhouse error). That exception becomes ``PROG: LABEL: reason``
on stderr and a non-zero status, never a traceback; anything else is a bug and raises.

Standard library only: the wheelhouse's node side imports this on bare offline nodes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


def run_command(
    prog: str,
    action: Callable[[], object],
    failure: type[Exception],
    *,
    status: int,
    label: str = "error",
) -> int:
    """Run `action`; 0 when it returns, `status` with one line on stderr when it raises
    `failure`."""
    try:
        action()
    except failure as err:
        print(f"{prog}: {label}: {err}", file=sys.stderr)
        return status
    return 0
