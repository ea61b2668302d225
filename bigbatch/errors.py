"""The one exception type for mistakes a user can cause (bad key, missing file, corrupt checkpoint)."""

import contextlib
from collections.abc import Iterator

STOPPED = "bigbatch: stopped by SIGTERM"  # a command's last line on SIGTERM outside training (the launchers read it)
STOPPED_BY_SIGNAL = "Stopped by signal"  # how a run stopped by a signal begins its last line (RunHandle reads it)
LOST_PEER = "lost contact with another rank"  # how a rank whose collective another's end broke says so (cli_errors)


class BigbatchError(Exception):
    """A problem the user can fix. The CLI prints its message on one line and exits with status 2."""


def whole_number(name: str, value: object, least: int = 0) -> int:
    """`value` as an int when it is a whole number >= `least` (an int, or a numpy or torch integer; not a
    bool), else a BigbatchError naming `name`."""
    import operator

    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None or number < least:
        raise BigbatchError(f"{name} must be a whole number, {least} or more, got {value!r}")
    return number


_WARNED: set[str] = set()
_SILENT = [0]  # warnings_off()'s depth


@contextlib.contextmanager
def warnings_off() -> Iterator[None]:
    """A context in which warn() says nothing and records nothing as said: for what is built only to be looked at
    (models on the meta device, to read their names), whose warnings are of settings no one gave."""
    _SILENT[0] += 1
    try:
        yield
    finally:
        _SILENT[0] -= 1


def first_line(e: BaseException) -> str:
    """An exception's message as one line (its first; its OS error text if it has one; else its type's name),
    for a one-line error about what a library raised."""
    return (str(getattr(e, "strerror", None) or e).strip().splitlines() or [type(e).__name__])[0]


def printable(text: str) -> str:
    """`text` with its control characters (a newline, a terminal's escape codes in a file's name) as Python
    writes them in a string: a message naming a file stays one line and cannot drive the terminal (found
    from outside)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def counted(n: int, noun: str) -> str:
    """ "1 frame", "3 frames", "2 processes": a count in a message (found from outside: "Merged 1 faces into 1
    frames")."""
    return f"{n} {noun}{('es' if noun.endswith(('s', 'x', 'z', 'ch', 'sh')) else 's') * (n != 1)}"


def counted_names(names: list[str], noun: str) -> str:
    """ "2 images (a.png, ...)": a count in a message, with the first of them named."""
    return f"{counted(len(names), noun)} ({names[0]}{', ...' if len(names) > 1 else ''})"


def named_few(names: list[str], most: int = 5) -> str:
    """ "a, b, c, ...": the first `most` of `names` for a message, and an ellipsis where there are more."""
    return ", ".join(names[:most]) + (", ..." if len(names) > most else "")


def warn(message: str, once: bool = False) -> None:
    """Tell the user about something that did not stop the command (on stderr, one line). `once`: not
    again in this process (a fact that several readers of the same file come upon)."""

    if _SILENT[0]:
        return
    if once:
        if message in _WARNED:
            return
        _WARNED.add(message)
    say(f"bigbatch: warning: {printable(message)}")


def say(line: str) -> None:
    """`line` on stderr in one write, flushed. print() writes its parts apart there (stderr is write-through), and
    the lines of ranks or processes sharing a terminal or a log ran into one another (found in CI, of two ranks'
    prints); a reader gone (`2>&1 | tee` closed, a terminal hung up) is silenced, not a traceback (found by review)."""
    import sys

    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except OSError:
        silence(2)


def silence(*fds: int) -> None:
    """Point file descriptors whose reader went away (a closed pipe, a hung-up terminal) at /dev/null, so that what
    is written to them later raises no error, nor Python's flush at exit."""
    import contextlib
    import os

    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_WRONLY)
        for fd in fds:
            os.dup2(null, fd)
        os.close(null)
