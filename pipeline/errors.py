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


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type name if the message is empty), for a
    one-line `DraftGymError` that wraps a library's multi-line error."""
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__
