"""The one error type for bad launcher input: reported as one line, exit status 2."""

from __future__ import annotations


class LaunchError(ValueError):
    """Bad input to a launcher (an option, the host, or the train.py argv it would submit).

    The message is one line, written for the user; nothing has run or been recorded when it is
    raised.
    """
