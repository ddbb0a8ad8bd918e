"""The error type for bad launcher input (one line, exit status 2), and the stop by SIGTERM."""

from __future__ import annotations


class LaunchError(ValueError):
    """Bad input to a launcher (an option, the host, or the train.py argv it would submit).

    The message is one line, written for the user; nothing has run or been recorded when it is
    raised.
    """


class Terminated(KeyboardInterrupt):
    """SIGTERM (``timeout``, ``scancel``, ``kill``): handled like Ctrl-C, exit status 143."""
