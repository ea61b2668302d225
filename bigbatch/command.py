"""The `bigbatch` command's entry (and `python -m bigbatch`'s): bigbatch.cli's `main`, imported here so that a Ctrl-C
while Python imports it (torch, 1-5 s of a start) ends the command with one line and status 130, as one later in its
start-up does, not with a traceback out of the import (found from outside)."""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from bigbatch.cli import main as command
    except KeyboardInterrupt:
        print("bigbatch: interrupted as it started: nothing was done", file=sys.stderr)
        return 130
    return command()  # (which says its own Ctrl-C from here on)
