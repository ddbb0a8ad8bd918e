"""The error type for bad launcher input (one line, exit status 2), and the stop by a signal."""

from __future__ import annotations

import signal


class LaunchError(ValueError):
    """Bad input to a launcher (an option, the host, or the train.py argv it would submit).

    The message is one line, written for the user; nothing has run or been recorded when it is
    raised.
    """


class Terminated(KeyboardInterrupt):
    """SIGTERM (``timeout``, ``scancel``, ``kill``) or SIGHUP (the terminal went away): handled
    like Ctrl-C, exit status 128 + the signal's number (143, 129)."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signum)
        self.signum = signum
