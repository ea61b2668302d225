"""The one exception type for mistakes a user can cause (bad key, missing file, corrupt checkpoint)."""


class BigbatchError(Exception):
    """A problem the user can fix. The CLI prints its message on one line and exits with status 2."""


def warn(message: str) -> None:
    """Tell the user about something that did not stop the command (on stderr, one line)."""
    import sys

    print(f"bigbatch: warning: {message}", file=sys.stderr, flush=True)
