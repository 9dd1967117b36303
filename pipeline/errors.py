"""One exception type for every user-facing failure.

The CLI prints `draftgym: error: <message>` on one line and exits with status 2 for any
`DraftGymError`; anything else is a bug and keeps its traceback.
"""


class DraftGymError(Exception):
    """A problem with the user's input (path, model, head, file, prompt) that we can name in one line."""


class HeadMismatchError(DraftGymError):
    """An EAGLE-3 head whose shapes or vocabulary do not fit its target."""


class DataError(DraftGymError):
    """A missing, truncated, corrupt or schema-mismatched data file."""
