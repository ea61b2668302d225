"""`bigbatch stop RUN`: the process training a run asked to save a checkpoint and exit."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from bigbatch.checkpoint_find import SWEEP_LOCK, find_checkpoint, is_sweep_folder, published
from bigbatch.errors import BigbatchError
from bigbatch.rundir import LOCK, trainer


def stop_run(run: Path, wait: float = 300.0) -> int:
    """Ask the process training `run` to save a checkpoint and exit (SIGTERM: what the loop saves on;
    under torchrun every rank then stops with it), and wait up to `wait` seconds for it; its PID. `run` may be a
    sweep's folder: the sweep's process is asked, which stops its runs so and writes its table."""
    import signal
    import time

    if not Path(run).is_dir():  # (found from outside: "not a run directory" of a path that is nothing)
        raise BigbatchError(f"{run} {'is not a run directory' if Path(run).exists() else 'does not exist'}")
    folder = Path(run).resolve()  # One of its checkpoints (found from outside: "not being trained" while its run
    if (folder / "meta.json").is_file() and folder.parent.name == "checkpoints":  # trained; by review, not a run
        run = folder.parent.parent  # that lives in a folder named checkpoints)
    lock = SWEEP_LOCK if is_sweep_folder(Path(run)) else LOCK  # (found from outside: a sweep's folder was refused,
    found = trainer(run, lock)  # its process to be found by hand)
    if found is None and lock == SWEEP_LOCK:
        raise BigbatchError(  # (found by review: a sweep folder's advice for other commands)
            f"{run} is a sweep's folder, and no sweep runs in it now: nothing to stop (one of its runs trained on its "
            f"own: bigbatch stop {run}/<run>)"
        )
    if found is None and not (Path(run) / "config.toml").is_file():  # (a run holds its lock before writing it)
        raise BigbatchError(f"{run} is not a run directory (no config.toml): give the --run-dir a training writes to")
    if found is None:
        raise BigbatchError(f"{run} is not being trained: no process holds its lock")
    pid, host = found
    if host and host != socket.gethostname():
        raise BigbatchError(f"{run} is trained by process {pid} on {host}; run `bigbatch stop` there")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        raise BigbatchError(f"{run}: its trainer, process {pid}, has just ended") from None
    deadline = time.monotonic() + wait
    while wait and trainer(run, lock) is not None:
        if time.monotonic() > deadline:
            raise BigbatchError(  # (found from outside: "saving" said of a rank blocked on a stopped peer)
                f"process {pid} has not stopped after {wait:g} s: it finishes its step and saves, then stops on its "
                "own; under torchrun it waits for every rank (a rank that hangs holds it: see its log)"
            )
        time.sleep(0.2)
    return pid


def stopped_said(run: Path, pid: int) -> str:
    """What `bigbatch stop --wait` says of a run it stopped: the checkpoint it saved, or that it had none to save
    (stopped in its start-up, its reference statistics: found from outside, "does not exist", exit 2)."""
    if is_sweep_folder(run):
        return f"Stopped the sweep's process {pid}; its table: {run / 'results.md'} (the sweep run again goes on)"
    if not published(run):
        return f"Stopped process {pid} in its start-up, before it trained: the command that started it starts it again"
    return f"Stopped process {pid}; its checkpoint: {find_checkpoint(run)}"
