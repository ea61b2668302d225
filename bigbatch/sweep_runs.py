"""A sweep's runs: one run of the sweep (Job), trained in this process or started on a cluster's workers, as many
side by side as the cluster has room for (bigbatch.sweeps)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bigbatch.config import Config
from bigbatch.errors import BigbatchError
from bigbatch.signals import Stopped as RunStopped
from bigbatch.sweep_table import status


def say(line: str) -> None:
    """The sweep's progress, a line a run, on stdout whatever `quiet` keeps of the runs' own (found from outside: a
    search said nothing for minutes)."""
    print(line, flush=True)


def complain(line: str) -> None:
    """A run that failed or stopped the sweep: on stderr, always."""
    print(line, file=sys.stderr, flush=True)


@dataclass
class Job:
    """One run of a sweep."""

    run: Path
    values: dict[str, Any]
    cfg: Config
    failed: str = ""
    pruned: bool = False
    trial: Any = None
    reported: set[int] = field(default_factory=set)
    began: bool = False  # started by this call
    running: bool = False  # side by side, started and not ended: the table says so (found by review: "new")
    told: bool = False  # its trial told how it ended


def train_here(job: Job, quiet: bool) -> None:
    """Train one run in this process. A run that fails is marked so (the sweep goes on); one stopped
    by Ctrl-C or SIGTERM (it saved a checkpoint) stops the sweep, which resumes it when run again."""
    from bigbatch.loop import train

    job.began = True
    try:
        train(job.cfg, run_dir=job.run, resume="auto", quiet=quiet)
    except RunStopped:  # (saved; the status below says it did not finish)
        pass
    except Exception as e:  # noqa: BLE001 - any failure of one run (out of memory too) is that run's
        mark_failed(job, e)
        return
    if status(job.run, job.cfg) != "finished":
        complain(f"bigbatch sweep: stopped at {job.run.name}; run the sweep again to resume it")
        raise Stopped


class Stopped(KeyboardInterrupt):
    """A sweep stopped by a signal to one of its runs, which said so in its line (the CLI adds none)."""


def mark_failed(job: Job, error: BaseException) -> None:
    job.failed = str(error) if isinstance(error, BigbatchError) else f"{type(error).__name__}: {error}"
    complain(f"bigbatch sweep: {job.run.name} failed: {job.failed}")


Starter = tuple[int, Callable[[Job, int], Any]]
"""(how many runs at a time, start(job, slot) -> RunHandle)."""


def make_starter(launcher: Any, nprocs: int) -> Starter:
    """How a cluster launcher starts one run, and how many it runs at a time."""
    if nprocs < 1:
        raise BigbatchError(f"sweep nprocs must be >= 1 (ranks per run), got {nprocs}")
    if launcher == "local":
        from bigbatch.launch import local

        return 1, lambda job, slot: local.run(job.cfg, job.run)
    if launcher == "ray":
        from bigbatch.launch import ray as ray_launch

        ray = ray_launch._ray()
        if not ray.is_initialized():
            ray.init(logging_level="ERROR")
        resources = ray.cluster_resources()
        _, per_rank = ray_launch.ray_ranks(resources, nprocs, None)
        slots = int(resources.get("CPU", 0) // nprocs)
        if per_rank:
            slots = min(slots, int(resources.get("GPU", 0) // (per_rank * nprocs)))
        return max(slots, 1), lambda job, slot: ray_launch.run(job.cfg, job.run, nprocs=nprocs)
    if type(launcher).__module__.startswith("distributed"):  # (a Client; a LocalCluster refused with the fix)
        from bigbatch.launch import dask

        dask.check_client(launcher, "sweep's launcher")
        workers = dask.workers_of(launcher)
        if len(workers) < nprocs:
            raise BigbatchError(f"sweep nprocs {nprocs}: the Dask cluster has {len(workers)} workers")
        busy: dict[int, list[str]] = {}  # slot -> the workers its run holds

        def start(job: Job, slot: int) -> Any:
            # Workers alive now (a lost one's replacement has a new address), not held by another run.
            taken = {w for s, held in busy.items() if s != slot for w in held}
            free = [w for w in dask.workers_of(launcher) if w not in taken]
            if len(free) < nprocs:
                raise BigbatchError(f"only {len(free)} Dask workers are free for a run of {nprocs} ranks")
            busy[slot] = free[:nprocs]
            return dask.run(launcher, job.cfg, job.run, workers=busy[slot])

        return len(workers) // nprocs, start
    raise BigbatchError(f"sweep launcher {launcher!r}: give 'local', 'ray' or a dask.distributed Client")


def side_by_side(
    jobs: Iterator[Job],
    starter: Starter,
    watch: Callable[[Job, Any], None] | None = None,
    ended: Callable[[Job], None] | None = None,
) -> None:
    """Run the jobs, as many at a time as `starter` has slots; `watch(job, handle)` is called as they
    train (a search reports and prunes there), `ended(job)` as each ends, before the next job is taken (a
    search tells its study there, whose next trial learns from it). Ctrl-C stops every running run with a
    checkpoint."""
    slots, start = starter
    running: dict[int, tuple[Job, Any]] = {}
    free = list(range(slots))
    try:
        while True:
            while free:
                job = next(jobs, None)
                if job is None:
                    break
                say(f"bigbatch sweep: starting {job.run.name}")
                try:
                    running[free[0]] = (job, start(job, free[0]))
                except Exception as e:  # noqa: BLE001 - this run could not start: the others go on
                    mark_failed(job, e)
                    if ended is not None:
                        ended(job)
                    continue
                job.began = job.running = True
                free.pop(0)
            if not running:
                return
            time.sleep(0.5)
            for slot, (job, handle) in list(running.items()):
                if watch is not None:
                    watch(job, handle)
                if not handle.done():
                    continue
                del running[slot]
                job.running = False
                free.append(slot)
                try:
                    handle.result()
                except Exception as e:  # noqa: BLE001 - that run's failure, whatever it was
                    if not job.pruned:  # (a pruned run may take its stop as its loop ends, and die of it)
                        mark_failed(job, e)
                if job.pruned and not job.failed and status(job.run, job.cfg) == "finished":
                    job.pruned = False  # (its end reached before the stop took: complete; found from outside, "pruned")
                if not job.failed:
                    if watch is not None:
                        watch(job, handle)  # the rows that came last
                    say(f"bigbatch sweep: {job.run.name} {'pruned' if job.pruned else 'ended'}")
                if ended is not None:
                    ended(job)
    except BaseException:
        for _, handle in running.values():
            handle.stop(wait=False)
        for job, handle in running.values():
            try:
                handle.result()
            except BaseException:  # noqa: BLE001 - stopping: its own error is not the one to show
                pass
            job.running = False
        raise
