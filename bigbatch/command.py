"""The `bigbatch` command's entry (and `python -m bigbatch`'s): bigbatch.cli's `main`, imported here so that a Ctrl-C
while Python imports it (torch, 1-5 s of a start) ends the command with one line and status 130, as one later in its
start-up does, not with a traceback out of the import (found from outside); and a SIGTERM then to `bigbatch train` is
kept for its loop, which saves at step 0 and exits 0, as one a moment later (found from outside: status 143)."""

from __future__ import annotations

import sys

from bigbatch import signals  # (the standard library's alone: before torch)
from bigbatch.errors import say


def main() -> int:
    if signals.starts_a_run(sys.argv[1:]):
        signals.keep_sigterm_for_the_loop()
    signals.hear_sigint()  # (from its first moment, as cli.main does once imported)
    try:
        from bigbatch.cli import main as command
    except KeyboardInterrupt:
        say("bigbatch: interrupted as it started: nothing was done")  # (one write: ranks share a terminal)
        return 130
    return command()  # (which says its own Ctrl-C from here on)
