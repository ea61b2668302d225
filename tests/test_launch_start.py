"""A launched rank's start: a SIGTERM before its bigbatch runs is kept for it, which stops as one as it starts."""

import os
import signal
import subprocess

from bigbatch.errors import STOPPED
from bigbatch.launch import start_rank


def test_a_sigterm_to_a_rank_before_its_bigbatch_runs_stops_it_as_one_as_it_starts():
    # Found from outside: one that came before bigbatch took it was dropped (its worker ignored SIGTERM, and so
    # did the rank until it reset it) or ended the rank unsaid, which the launcher then restarted.
    env = {**os.environ, "BIGBATCH_LAUNCH_PARENT": str(os.getpid())}  # this process stands for the worker
    ignored = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # (as a worker that ignores it)
    try:
        rank = start_rank(["presets"], env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGTERM, ignored)
    rank.send_signal(signal.SIGTERM)  # at once: before its Python has started
    out, err = rank.communicate(timeout=120)
    assert rank.returncode == 143 and err.rstrip().endswith(STOPPED) and not out, (rank.returncode, err)
