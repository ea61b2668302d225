"""Ranks on a Dask cluster: one `bigbatch train` process per Dask worker. `launch_dask` is `bigbatch
launch dask`; `run(client, cfg, run_dir)` starts a run from Python and returns a RunHandle."""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from bigbatch.errors import BigbatchError, first_line
from bigbatch.launch import (
    GRACE_SECONDS,
    LOST,
    RankResult,
    _command,
    _free_port,
    _results,
    _run_rank,
    _show,
    _visible_gpus,
    _wait,
    rank_environments,
    train_command,
)
from bigbatch.launch.handle import RunHandle, Sink

LAUNCHER_GONE = 120.0  # seconds without the launcher's heartbeat after which a rank stops
MISSING_FOR = 10.0  # seconds a worker must be missing from the scheduler's list (or it unanswering) to count as lost


def _distributed() -> Any:
    try:
        import distributed
    except ImportError:
        raise BigbatchError(
            "the Dask launcher needs dask.distributed: pip install distributed (bigbatch's extra [dask])"
        ) from None
    return distributed


def launch_dask(
    args: Sequence[str],
    scheduler: str | None = None,
    local: int = 0,
    nprocs: int | None = None,
    grace: float = GRACE_SECONDS,
) -> list[RankResult]:
    """Run `bigbatch ARGS` (e.g. ["train", "--preset", "digits"]) on the workers of the Dask cluster at
    `scheduler` (or of a LocalCluster of `local` worker processes), one rank per worker (the first
    `nprocs` workers, sorted by address), printing rank 0's output as it comes. Returns each rank's
    result once all have finished."""
    distributed = _distributed()
    if local < 0 or (scheduler is not None and local):
        what = f"--local {local} is not a number of workers" if local < 0 else "both were given"
        raise BigbatchError(f"give the Dask scheduler's address (--scheduler tcp://HOST:8786) or --local N: {what}")
    if scheduler is None and local < 1:
        raise BigbatchError(
            "give the Dask scheduler's address (--scheduler tcp://HOST:8786) or --local N (N >= 1 worker processes)"
        )
    args = _command(args)
    cluster = None
    try:
        if local:
            # (`bigbatch launch` runs a local cluster's launcher apart from the terminal's signals: launch.apart)
            cluster = local_cluster(local, dashboard_address=":0")  # (8787 may be taken)
        client = distributed.Client(cluster, timeout="20s") if cluster is not None else _connect(distributed, scheduler)
        with client:
            return session(client, pick_workers(client, nprocs), args, grace, _show)
    finally:
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.close(timeout=30)


def local_cluster(n_workers: int, attempts: int = 3, **options: Any) -> Any:
    """A Dask LocalCluster of `n_workers` single-threaded worker processes. Dask gives the thread of its
    event loop 10 s to start and then fails with a bare AssertionError; on a loaded machine that
    happens now and then (seen once in CI), so a cluster that did not start is tried again, and after
    `attempts` tries reported in one line."""
    distributed = _distributed()
    attempt = 1
    while True:
        # A Client left to the garbage collector (one whose handshake failed, say) closes itself in __del__,
        # taking the lock of Dask's loop runner; collected while a new cluster's loop starts under that
        # same lock, it waits on itself forever (a test process hung so). Collect it first, here.
        gc.collect()
        before = set(distributed.SpecCluster._instances)
        try:
            return distributed.LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, **options)
        except KeyboardInterrupt:  # (found from outside: Ctrl-C as it started gave Dask's atexit traceback, its close
            for half in set(distributed.SpecCluster._instances) - before:  # asserting on a cluster still starting;
                half.shutdown_on_close = False  # its worker processes end with this one, as they did)
            raise
        except (AssertionError, TimeoutError, RuntimeError) as e:
            if attempt >= attempts:
                why = "its event loop did not start in 10 s" if isinstance(e, AssertionError) else first_line(e)
                raise BigbatchError(
                    f"the local Dask cluster did not start ({attempts} tries): {why}; is the machine overloaded?"
                ) from None
            attempt += 1
            time.sleep(1.0)


def _connect(distributed: Any, scheduler: str | None, patience: float = 40.0) -> Any:
    """A Client of the scheduler at `scheduler`, or one line saying why not. Dask's own timeout covers
    the connection, not its handshake: a live port of another service (a web server) would hold it
    forever, or answer bytes Dask reads as a frame length (an allocation of exabytes)."""
    found: dict[str, Any] = {}

    def attempt() -> None:
        try:
            gc.collect()  # as in local_cluster: no stray Client closing itself while this one's loop starts
            found["client"] = distributed.Client(scheduler, timeout="20s")
        except Exception as e:  # noqa: BLE001 - whatever the other end made of the handshake
            found["error"] = e

    thread = threading.Thread(target=attempt, daemon=True, name="bigbatch-dask-connect")
    thread.start()
    thread.join(patience)
    if thread.is_alive():
        raise BigbatchError(
            f"no Dask scheduler answered at {scheduler} within {patience:g} s: is it a scheduler's address "
            "(tcp://HOST:8786)? Something else listens there"
        )
    if "error" in found:
        why = first_line(found["error"])[:200]
        if isinstance(found["error"], MemoryError):  # (Dask read the first bytes another service sent as a frame's
            why = "it answered what Dask cannot read: is it a scheduler's address (tcp://HOST:8786)?"  # length)
        raise BigbatchError(f"cannot reach the Dask scheduler at {scheduler}: {why}") from None
    return found["client"]


def check_client(client: Any, what: str = "a Dask run") -> None:
    """Refuse what is not an open dask.distributed Client, in one line naming the fix (found from outside: a
    LocalCluster, its address, None or a closed Client gave TypeError, AttributeError or KeyError)."""
    from distributed import Client

    if not isinstance(client, Client):
        if hasattr(client, "scheduler_address"):  # (a LocalCluster, a dask-jobqueue or Kubernetes cluster)
            fix = "give distributed.Client(cluster), the client of that cluster"
        elif isinstance(client, str):
            fix = f"give distributed.Client({client!r}) (on the command line: bigbatch launch dask --scheduler ADDR)"
        else:
            fix = "give a distributed.Client (distributed.Client(LocalCluster()) on this machine)"
        raise BigbatchError(f"{what} takes a dask.distributed Client, got {type(client).__name__}: {fix}")
    if client.status != "running":
        raise BigbatchError(f"{what}: the Dask Client is {client.status}: give an open one (a new distributed.Client)")


def workers_of(client: Any) -> list[str]:
    """The addresses of the cluster's workers, sorted."""
    return sorted(client.scheduler_info(n_workers=-1)["workers"])


def pick_workers(client: Any, nprocs: int | None, wait: bool = False) -> list[str]:
    """The first `nprocs` workers (default: all), sorted by address; with `wait`, after waiting up to
    two minutes for that many (a lost worker's replacement starting)."""
    if wait and nprocs:
        with contextlib.suppress(Exception):
            client.wait_for_workers(nprocs, timeout=120)
    workers = workers_of(client)
    if nprocs is not None:
        if nprocs < 1 or nprocs > len(workers):
            raise BigbatchError(f"nprocs {nprocs}: the Dask cluster has {len(workers)} workers")
        workers = workers[:nprocs]
    if not workers:
        raise BigbatchError(f"the Dask cluster at {client.scheduler.address} has no workers")
    return workers


def run(
    client: Any,
    cfg: Any,
    run_dir: str | os.PathLike,
    *,
    nprocs: int | None = None,
    workers: Sequence[str] | None = None,
    restarts: int = 0,
    grace: float = GRACE_SECONDS,
    echo: bool = False,
) -> RunHandle:
    """Train `cfg` (a bigbatch.Config) into `run_dir` on the Dask cluster of `client`, one rank per
    worker (`workers`, or the first `nprocs`, default all), resuming the run if `run_dir` holds one.
    Returns at once with a RunHandle that streams metrics rows and sample sheets while it trains
    (`run_dir` is on the workers' file system; rank 0 sends what it writes). After a failure other than
    a usage error the ranks start again, up to `restarts` times, and resume. `echo` prints rank 0's
    output here too."""
    check_client(client)
    path, args, text = train_command(cfg, run_dir)
    if workers is not None:
        known = set(workers_of(client))
        if not workers or not set(workers) <= known:
            strange = sorted(set(workers) - known) or list(workers)
            raise BigbatchError(f"workers {strange} are not the Dask cluster's: {sorted(known)}")
    else:  # checked now, picked again for each launch (a lost worker's replacement has a new address)
        pick_workers(client, nprocs)

    def launch(sink: Sink, stop: threading.Event) -> list[RankResult]:
        chosen = list(workers) if workers is not None else pick_workers(client, nprocs, wait=True)
        return session(client, chosen, args, grace, sink, stop, config=text, watch=path)

    return RunHandle(path, launch, restarts, echo)


def session(
    client: Any,
    workers: list[str],
    args: list[str],
    grace: float,
    sink: Sink,
    stop: threading.Event | None = None,
    config: str | None = None,
    watch: str | None = None,
) -> list[RankResult]:
    """One launch of every rank on `workers`; rank 0's output (and, with `watch`, the run's rows and
    sheets) goes to `sink` as it comes. Returns once every rank has ended."""
    Event, Queue, Variable = _distributed().Event, _distributed().Queue, _distributed().Variable
    try:
        port = client.submit(_free_port, workers=[workers[0]], pure=False).result(timeout=120)
        visible = client.run(_visible_gpus, workers=workers)
        cluster = workers_of(client)
    except Exception as e:  # noqa: BLE001 - a worker died before its rank started: as lost (restartable)
        why = f"its Dask worker could not start it ({type(e).__name__}: {e})"
        return [RankResult(rank, w, LOST, why, time.time()) for rank, w in enumerate(workers)]
    envs = rank_environments(workers, port, [visible[w] for w in workers], cluster)
    key = uuid.uuid4().hex
    abort = Event(f"bigbatch-abort-{key}", client=client)
    lines = Queue(f"bigbatch-lines-{key}", client=client)  # rank 0's output, as it comes
    beat, beats = Variable(f"bigbatch-beat-{key}", client=client), itertools.count()  # the launcher lives
    beat.set(next(beats))
    futures = [
        client.submit(
            _dask_rank,
            args,
            env,
            abort.name,
            beat.name,
            grace,
            lines.name if rank == 0 else None,
            config,
            watch if rank == 0 else None,
            workers=[w],
            allow_other_workers=False,
            pure=False,
        )
        for rank, (w, env) in enumerate(zip(workers, envs))
    ]

    missing: dict[str, float] = {}  # worker -> since when the scheduler has not listed it

    def poll() -> list[tuple | None]:
        with contextlib.suppress(Exception):
            beat.set(next(beats))
        with contextlib.suppress(Exception):
            sink(lines.get(batch=True))
        try:
            alive = set(client.scheduler_info(n_workers=-1)["workers"])
        except Exception:  # noqa: BLE001 - no answer: the scheduler is gone, or too busy to answer in time
            alive = set()
        now = time.monotonic()
        for w in workers:
            missing[w] = missing.get(w, now) if w not in alive else now
        out: list[tuple | None] = []
        for f, w in zip(futures, workers):
            if f.status == "finished":
                out.append(f.result())
            elif f.status in ("error", "lost", "cancelled") or now - missing[w] > MISSING_FOR:
                how = {"error": "failed", "cancelled": "was cancelled"}.get(f.status, "was lost")  # (not "(pending)")
                out.append((LOST, f"its Dask worker {w} {how}", time.time(), False))
            else:
                out.append(None)
        return out

    results = None
    try:
        results = _wait(poll, abort.set, grace, stop)
        with contextlib.suppress(Exception):
            sink(lines.get(batch=True))  # the last lines, sent as rank 0 ended
    finally:
        if results is None:  # this launcher is going away (an error here, or a second Ctrl-C)
            with contextlib.suppress(Exception):
                abort.set()
        for done_with in (lambda: client.cancel(futures), lines.close, beat.delete):
            with contextlib.suppress(Exception):
                done_with()
    return _results(workers, envs, results)


def _dask_rank(
    args: list[str],
    env: dict[str, str],
    abort_name: str,
    beat_name: str,
    grace: float,
    lines: str | None,
    config: str | None = None,
    watch: str | None = None,
) -> tuple:
    """On a Dask worker: one rank (see bigbatch.launch._run_rank). It stops (with a checkpoint) when
    asked, or when the launcher's heartbeat has not moved for LAUNCHER_GONE seconds: a launcher that
    died (a notebook kernel restarted) leaves no rank training on, holding the run."""
    from distributed import Event, Queue, Variable

    abort, beat = Event(abort_name), Variable(beat_name)
    heard = [None, time.monotonic()]  # the last heartbeat, and when it changed

    def aborted() -> bool:
        if abort.is_set():
            return True
        with contextlib.suppress(Exception):  # no answer: counts as no beat
            value = beat.get(timeout=10)
            if value != heard[0]:
                heard[:] = [value, time.monotonic()]
        return time.monotonic() - heard[1] > LAUNCHER_GONE

    queue = Queue(lines) if lines else None
    publish = (lambda kind, payload: queue.put((kind, payload))) if queue is not None else None
    return _run_rank(args, env, aborted, abort.set, grace, publish, config, watch)
