"""The trainer's user-facing error: bad input, reported as one line with exit status 2."""


class UsageError(Exception):
    """Bad user input (argv or the data it names): reported as one line, exit status 2."""
