"""Errors a user can act on. The CLI prints their message (no traceback) and exits non-zero."""


class UsageError(ValueError):
    """A flag or combination of flags is wrong; the message says which and what to pass instead."""


class InputDataError(ValueError):
    """The raw input is unusable; the message names the file, the line or column, and the fix."""
