"""The one exception type for mistakes a user can cause (bad key, missing file, corrupt checkpoint)."""


class BigbatchError(Exception):
    """A problem the user can fix. The CLI prints its message on one line and exits with status 2."""


_WARNED: set[str] = set()


def warn(message: str, once: bool = False) -> None:
    """Tell the user about something that did not stop the command (on stderr, one line). `once`: not
    again in this process (a fact that several readers of the same file come upon)."""
    import sys

    if once:
        if message in _WARNED:
            return
        _WARNED.add(message)
    print(f"bigbatch: warning: {message}", file=sys.stderr, flush=True)
