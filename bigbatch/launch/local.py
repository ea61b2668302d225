"""One `bigbatch train` process on this machine, started from Python: `run(cfg, run_dir)` returns
the same RunHandle as the Dask and Ray launchers (a sweep's search uses it to prune runs), and the
run lives in a process of its own, so its memory is given back when it ends."""

from __future__ import annotations

import os
import threading
from typing import Any

from bigbatch.launch import GRACE_SECONDS, RankResult, _run_rank, train_command
from bigbatch.launch.handle import RunHandle, Sink


def run(
    cfg: Any,
    run_dir: str | os.PathLike,
    *,
    restarts: int = 0,
    grace: float = GRACE_SECONDS,
    echo: bool = False,
    env: dict[str, str] | None = None,
) -> RunHandle:
    """Train `cfg` (a bigbatch.Config) into `run_dir` in a child process, resuming the run if
    `run_dir` holds one; returns at once with a RunHandle. `env`: variables to add to its environment
    (e.g. {"OMP_NUM_THREADS": "1"})."""
    path, args, text = train_command(cfg, run_dir)
    return RunHandle(path, lambda sink, stop: session(args, grace, sink, stop, text, path, env or {}), restarts, echo)


def session(
    args: list[str],
    grace: float,
    sink: Sink,
    stop: threading.Event,
    config: str | None = None,
    watch: str | None = None,
    env: dict[str, str] | None = None,
) -> list[RankResult]:
    """The process, from start to end; what it prints (and, with `watch`, the run's rows and sheets)
    goes to `sink` as it comes, and setting `stop` asks it to save a checkpoint and exit."""
    # One process, whatever this one is (a sweep inside a torchrun job must not pass its rank on).
    alone = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    ended = _run_rank(
        args,
        {**alone, **(env or {})},
        stop.is_set,
        lambda: None,
        grace,
        lambda kind, payload: sink([(kind, payload)]),
        config,
        watch,
    )
    return [RankResult(0, "local", *ended)]
