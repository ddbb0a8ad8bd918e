"""The trainer's user-facing error: bad input, reported as one line with exit status 2."""


class UsageError(Exception):
    """Bad user input (argv or the data it names): reported as one line, exit status 2."""


def first_line(err: BaseException) -> str:
    """A library's error, shortened to fit a one-line report (its type where it says nothing)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
