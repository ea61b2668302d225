"""Stop signals: SIGINT and SIGTERM ask the training loop to save a checkpoint and return."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class StopRequest:
    requested = False


@contextmanager
def stop_signals() -> Iterator[StopRequest]:
    """SIGINT/SIGTERM set `requested` (the loop checkpoints and returns); a second SIGINT stops at once.
    Outside the main thread, where Python cannot take signals, nothing is installed."""
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum, frame):
        if stop.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.requested = True

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, h in old.items():
            signal.signal(s, h)
