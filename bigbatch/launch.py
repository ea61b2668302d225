"""Scale out on a Dask or Ray cluster: one `bigbatch train` process per Dask worker (or Ray actor),
with the environment torchrun would give it (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT).

Dask and Ray only place the processes: training itself is the same torch.distributed program as under
torchrun (NCCL on GPUs, gloo on CPUs), so it trains the same weights. Each rank runs in a child
process of its worker, in a session of its own (a Ctrl-C in the launcher's terminal reaches it only
through the launcher) and bound to its worker (it gets SIGTERM if the worker dies). When one rank
fails, a worker is lost, or the launcher gets Ctrl-C or SIGTERM, every other rank gets SIGTERM and,
after `grace` seconds, SIGKILL, so no rank is left waiting in a collective. Stopped by the launcher,
the ranks save a checkpoint together; after a rank has failed the others usually cannot (their
collectives with it break), and the run resumes from its last periodic checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from bigbatch.errors import BigbatchError

GRACE_SECONDS = 60.0  # after SIGTERM, how long a rank may take to save its checkpoint
LOST = 1  # the exit status reported for a rank whose worker (or actor) was lost: it never told its own


@dataclass(frozen=True)
class RankResult:
    rank: int
    worker: str
    returncode: int
    stderr_tail: str
    ended: float = 0.0
    """time.time() when the rank's process ended (or was found lost)."""
    stopped: bool = False
    """Whether the launcher stopped it (another rank failed, or the launcher was interrupted)."""


def rank_environments(workers: Sequence[str], master_port: int, visible_gpus: Sequence[str]) -> list[dict[str, str]]:
    """The torch.distributed environment of each worker's process, rank = position in `workers`
    (addresses like tcp://HOST:PORT); `visible_gpus` is each worker's CUDA_VISIBLE_DEVICES ("" if unset).

    LOCAL_RANK counts the workers on the same host and picks the GPU, unless the workers of a host
    have each been given a GPU of their own (dask-cuda rotates CUDA_VISIBLE_DEVICES so that each
    worker's own GPU comes first; Ray sets it per actor): then each rank sees only that GPU, as device 0."""
    hosts = [urlparse(w).hostname or w for w in workers]
    firsts = [v.split(",")[0].strip() for v in visible_gpus]
    envs = []
    for rank, host in enumerate(hosts):
        same = [firsts[i] for i, h in enumerate(hosts) if h == host]
        pinned = all(same) and len(set(same)) == len(same)
        env = {
            "RANK": str(rank),
            "WORLD_SIZE": str(len(workers)),
            "LOCAL_RANK": "0" if pinned else str(hosts[:rank].count(host)),
            "LOCAL_WORLD_SIZE": str(len(same)),
            "MASTER_ADDR": hosts[0],
            "MASTER_PORT": str(master_port),
        }
        if pinned:
            env["CUDA_VISIBLE_DEVICES"] = firsts[rank]
        envs.append(env)
    return envs


def _command(args: Sequence[str]) -> list[str]:
    if not args:
        raise BigbatchError("nothing to launch: add the bigbatch command after '--', e.g. -- train --preset digits")
    return list(args)


def launch_dask(
    args: Sequence[str],
    scheduler: str | None = None,
    local: int = 0,
    nprocs: int | None = None,
    grace: float = GRACE_SECONDS,
) -> list[RankResult]:
    """Run `bigbatch ARGS` (e.g. ["train", "--preset", "digits"]) on the workers of the Dask cluster at
    `scheduler` (or of a LocalCluster of `local` worker processes), one rank per worker (the first
    `nprocs` workers, sorted by address). Returns each rank's result once all have finished."""
    try:
        from distributed import Client, Event, LocalCluster, Queue
    except ImportError:
        raise BigbatchError("the Dask launcher needs dask.distributed: pip install 'bigbatch[dask]'") from None
    if (scheduler is None) == (local < 1):
        raise BigbatchError("give the Dask scheduler's address (--scheduler tcp://HOST:8786) or --local N, not both")
    args = _command(args)
    cluster = None
    try:
        if local:
            cluster = LocalCluster(n_workers=local, threads_per_worker=1, processes=True, dashboard_address=None)
        try:
            client = Client(cluster if cluster is not None else scheduler, timeout="20s")
        except (OSError, TimeoutError, ValueError) as e:
            raise BigbatchError(f"cannot reach the Dask scheduler at {scheduler}: {e}") from None
        with client:
            workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
            if nprocs is not None:
                if nprocs < 1 or nprocs > len(workers):
                    raise BigbatchError(f"--nprocs {nprocs}: the cluster has {len(workers)} workers")
                workers = workers[:nprocs]
            if not workers:
                raise BigbatchError(f"the Dask cluster at {scheduler} has no workers")
            port = client.submit(_free_port, workers=[workers[0]], pure=False).result()
            visible = client.run(_visible_gpus, workers=workers)
            envs = rank_environments(workers, port, [visible[w] for w in workers])
            abort = Event(f"bigbatch-abort-{uuid.uuid4().hex}", client=client)
            lines = Queue(f"bigbatch-lines-{uuid.uuid4().hex}", client=client)  # rank 0's output, as it comes
            futures = [
                client.submit(
                    _dask_rank,
                    args,
                    env,
                    abort.name,
                    grace,
                    lines.name if rank == 0 else None,
                    workers=[w],
                    allow_other_workers=False,
                    pure=False,
                )
                for rank, (w, env) in enumerate(zip(workers, envs))
            ]

            def poll() -> list[tuple | None]:
                with contextlib.suppress(Exception):
                    _show(lines.get(batch=True))
                try:
                    alive = set(client.scheduler_info(n_workers=-1)["workers"])
                except Exception:  # noqa: BLE001 - the scheduler is gone: so is every rank's worker
                    alive = set()
                out: list[tuple | None] = []
                for f, w in zip(futures, workers):
                    if f.status == "finished":
                        out.append(f.result())
                    elif f.status in ("error", "lost", "cancelled") or w not in alive:
                        out.append((LOST, f"its Dask worker {w} was lost ({f.status})", time.time(), False))
                    else:
                        out.append(None)
                return out

            results = _wait(poll, abort.set, grace)
            with contextlib.suppress(Exception):
                _show(lines.get(batch=True))  # the last lines, sent as rank 0 ended
            return _results(workers, envs, results)
    finally:
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.close(timeout=30)


def ray_ranks(resources: dict[str, float], nprocs: int | None, gpus_per_rank: float | None) -> tuple[int, float]:
    """(ranks, GPUs per rank) for a Ray cluster with `resources`: by default one rank per GPU, or CPU
    ranks where there is none (then --nprocs is needed); checked against what the cluster holds."""
    gpus, cpus = resources.get("GPU", 0.0), resources.get("CPU", 0.0)
    per_rank = (1.0 if gpus else 0.0) if gpus_per_rank is None else gpus_per_rank
    if not 0 <= per_rank <= 1:
        raise BigbatchError(f"--gpus-per-rank must be in [0, 1] (a rank trains on one GPU), got {per_rank:g}")
    n = nprocs if nprocs is not None else (int(gpus // per_rank) if per_rank else 0)
    if n < 1:
        raise BigbatchError(f"the Ray cluster has no GPUs ({resources}): give the number of CPU ranks with --nprocs N")
    if n > cpus or n * per_rank > gpus:
        raise BigbatchError(
            f"{n} ranks of 1 CPU and {per_rank:g} GPU do not fit the Ray cluster's {cpus:g} CPUs and {gpus:g} GPUs; "
            "lower --nprocs or --gpus-per-rank"
        )
    return n, per_rank


def launch_ray(
    args: Sequence[str],
    address: str | None = None,
    local: int = 0,
    nprocs: int | None = None,
    gpus_per_rank: float | None = None,
    grace: float = GRACE_SECONDS,
) -> list[RankResult]:
    """Run `bigbatch ARGS` as ranks on a Ray cluster (`address`, e.g. "auto" or "ray://HEAD:10001"),
    or on a local Ray instance with `local` CPU ranks (GPUs only with `gpus_per_rank`). Each rank is an
    actor holding one CPU and `gpus_per_rank` of a GPU (default: 1 when the cluster has GPUs; by
    default one rank per GPU), placed by a PACK placement group; ranks are ordered by node."""
    try:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    except ImportError:
        raise BigbatchError("the Ray launcher needs Ray: pip install 'bigbatch[ray]'") from None
    if (address is None) == (local < 1):
        raise BigbatchError(
            "give the Ray cluster's address (--address auto or ray://HEAD:10001) or --local N, not both"
        )
    args = _command(args)
    if address not in (None, "auto", "local"):
        _reachable(address)
    try:
        if local:
            ray.init(
                num_cpus=local,
                num_gpus=0 if not gpus_per_rank else None,
                include_dashboard=False,
                logging_level=logging.ERROR,
            )
        else:
            ray.init(address=address, logging_level=logging.ERROR)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise BigbatchError(f"cannot reach the Ray cluster at {address}: {e}") from None
    group = None
    try:
        n, per_rank = ray_ranks(ray.cluster_resources(), nprocs or (local or None), gpus_per_rank)
        bundle = {"CPU": 1.0, **({"GPU": per_rank} if per_rank else {})}
        group = placement_group([bundle] * n, strategy="PACK")
        if not ray.wait([group.ready()], timeout=120)[0]:
            raise BigbatchError(f"the Ray cluster could not place {n} ranks of {bundle} within 120 s (busy?)")
        rank_actor = ray.remote(_RayRank)
        flag = ray.remote(_Flag).remote()
        actors = [
            rank_actor.options(
                num_cpus=1,
                num_gpus=per_rank,
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i),
            ).remote()
            for i in range(n)
        ]
        where = ray.get([a.where.remote() for a in actors])  # (node IP, CUDA_VISIBLE_DEVICES)
        order = sorted(range(n), key=lambda i: (where[i][0], i))
        actors = [actors[i] for i in order]
        names = [f"ray://{where[i][0]}:{k}" for k, i in enumerate(order)]
        port = ray.get(actors[0].free_port.remote())
        envs = rank_environments(names, port, [where[i][1] for i in order])
        refs = [a.run.remote(args, env, flag, grace, rank == 0) for rank, (a, env) in enumerate(zip(actors, envs))]

        def poll() -> list[tuple | None]:
            with contextlib.suppress(Exception):
                _show(ray.get(flag.take.remote()))  # rank 0's output, as it comes
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            out: list[tuple | None] = []
            for ref in refs:
                if ref not in done:
                    out.append(None)
                    continue
                try:
                    out.append(ray.get(ref))
                except ray.exceptions.RayError as e:  # the actor or its node died
                    out.append((LOST, f"its Ray actor died ({type(e).__name__})", time.time(), False))
            return out

        results = _wait(poll, lambda: ray.get(flag.set.remote()), grace)
        with contextlib.suppress(Exception):
            _show(ray.get(flag.take.remote()))
        return _results(names, envs, results)
    finally:
        if group is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(group)
        ray.shutdown()


def _reachable(address: str) -> None:
    """Fail in seconds, not minutes, on a Ray address nothing listens at."""
    target = urlparse(address if "://" in address else f"tcp://{address}")
    host, port = target.hostname, target.port
    if host is None or port is None:
        raise BigbatchError(f"cannot read the Ray address {address!r}: give auto, HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as e:
        raise BigbatchError(f"cannot reach the Ray cluster at {address}: {e}") from None


def _results(names: Sequence[str], envs: Sequence[dict], results: Sequence[tuple]) -> list[RankResult]:
    return [RankResult(int(env["RANK"]), w, *r) for w, env, r in zip(names, envs, results)]


class _Flag:
    """A Ray actor: the abort flag every rank polls."""

    def __init__(self) -> None:
        self.raised, self.lines = False, []

    def set(self) -> None:
        self.raised = True

    def is_set(self) -> bool:
        return self.raised

    def push(self, kind: str, line: str) -> None:
        """Rank 0's output, one line at a time, until the launcher `take`s it."""
        self.lines.append((kind, line))

    def take(self) -> list[tuple[str, str]]:
        lines, self.lines = self.lines, []
        return lines


class _RayRank:
    """A Ray actor that runs one rank as a child process (like a Dask worker's task)."""

    def where(self) -> tuple[str, str]:
        import ray

        return ray.util.get_node_ip_address(), _visible_gpus()

    def free_port(self) -> int:
        return _free_port()

    def run(self, args: list[str], env: dict[str, str], flag: Any, grace: float, publish: bool = False) -> tuple:
        import ray

        aborted, abort = lambda: ray.get(flag.is_set.remote()), lambda: flag.set.remote()
        return _run_rank(args, env, aborted, abort, grace, flag.push.remote if publish else None)


def _wait(poll: Callable[[], list[tuple | None]], abort: Callable[[], object], grace: float) -> list[tuple]:
    """Poll until every rank has a result. When one fails (or is lost), or on Ctrl-C or SIGTERM, ask
    every rank to stop; ranks that still have no result `grace` + 30 s later are reported as lost."""
    aborted_at = None
    interrupted = False

    def settled(results: list) -> list[tuple]:
        # After Ctrl-C every rank that did not end cleanly was stopped by the launcher, lost workers included.
        return [(*r[:3], True) if interrupted and r[0] != 0 else r for r in results]

    with _sigterm_interrupts():  # for the whole wait: a SIGTERM between two polls must not kill the launcher
        while True:
            try:
                results = poll()
                if all(r is not None for r in results):
                    return settled(results)
                if aborted_at is None and any(r is not None and r[0] != 0 for r in results):
                    with contextlib.suppress(Exception):
                        abort()  # (a failed rank asks too; a lost worker cannot)
                    aborted_at = time.monotonic()
                if aborted_at is not None and time.monotonic() - aborted_at > grace + 30:
                    now = time.time()
                    return settled([r or (LOST, "no answer after it was asked to stop", now, True) for r in results])
                time.sleep(0.5)
            except KeyboardInterrupt:
                if interrupted:
                    raise  # a second Ctrl-C: stop waiting
                interrupted = True
                print("bigbatch launch: stopping every rank (a second Ctrl-C stops waiting for them)", file=sys.stderr)
                with contextlib.suppress(Exception):
                    abort()
                aborted_at = time.monotonic()


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM to the launcher (a batch system ending the job) stops the ranks as Ctrl-C does."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _visible_gpus() -> str:
    return os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()


def _dask_rank(args: list[str], env: dict[str, str], abort_name: str, grace: float, lines: str | None) -> tuple:
    from distributed import Event, Queue

    abort = Event(abort_name)
    queue = Queue(lines) if lines else None
    publish = (lambda kind, line: queue.put((kind, line))) if queue is not None else None
    return _run_rank(args, env, abort.is_set, abort.set, grace, publish)


# A rank's process binds itself to the worker thread that started it (Linux's PR_SET_PDEATHSIG: SIGTERM
# when that thread dies; it survives exec), gives up if the worker died before the binding took hold,
# then becomes `python -m bigbatch ARGS`. Code given to -c, not a bigbatch function: importing bigbatch
# to run it would load torch twice per rank. Binding in Popen's preexec_fn instead is unsafe in a
# threaded process such as a Dask worker.
BOUND_RANK = """
import ctypes, os, signal, sys
try:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
except Exception:
    pass
if os.getppid() != int(os.environ.get("BIGBATCH_LAUNCH_PARENT", os.getppid())):
    sys.exit(1)
os.execv(sys.executable, [sys.executable, "-m", "bigbatch", *sys.argv[1:]])
"""


def rank_command(args: Sequence[str]) -> list[str]:
    """The command line of a rank's process: `python -m bigbatch ARGS`, bound to its worker on Linux."""
    if sys.platform == "linux":
        return [sys.executable, "-c", BOUND_RANK, *args]
    return [sys.executable, "-m", "bigbatch", *args]


def _run_rank(
    args: list[str],
    env: dict[str, str],
    aborted: Callable[[], bool],
    abort: Callable[[], object],
    grace: float = GRACE_SECONDS,
    publish: Callable[[str, str], object] | None = None,
) -> tuple[int, str, float, bool]:
    """On a worker: run one rank as a child process; stop it when another rank has failed (or the
    launcher asks), and ask the others to stop when it fails. With `publish` (rank 0), each line the
    rank prints goes to publish("out" or "err", line) as it comes, for the launcher to show. Returns
    (exit status, last lines of its stderr, when it ended, whether it was stopped from here)."""
    stopped_at = None
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            rank_command(args),
            env={**os.environ, **env, "BIGBATCH_LAUNCH_PARENT": str(os.getpid()), "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE if publish else None,
            stderr=subprocess.PIPE if publish else err,
            text=True,
            start_new_session=True,  # a Ctrl-C in the launcher's terminal reaches it only through the launcher
        )
        readers = []
        if publish is not None:
            for stream, kind, copy in ((proc.stdout, "out", None), (proc.stderr, "err", err)):
                readers.append(threading.Thread(target=_forward, args=(stream, kind, copy, publish), daemon=True))
                readers[-1].start()
        try:
            while proc.poll() is None:
                try:
                    asked = aborted()
                except Exception:  # noqa: BLE001 - the scheduler or flag is gone: so is the launcher
                    asked = True
                if stopped_at is None and asked:
                    proc.send_signal(signal.SIGTERM)
                    stopped_at = time.monotonic()
                elif stopped_at is not None and time.monotonic() - stopped_at > grace:
                    proc.kill()
                time.sleep(0.5)
        finally:
            if proc.poll() is None:  # this function is being torn down: never leave the rank behind
                proc.kill()
                proc.wait()
            for reader in readers:
                reader.join(timeout=10)
        ended = time.time()
        if proc.returncode != 0 and stopped_at is None:
            with contextlib.suppress(Exception):
                abort()  # the other ranks would wait for this one in their next collective
        err.seek(0)
        lines = err.read().splitlines()
    return proc.returncode, "\n".join(lines[-20:]), ended, stopped_at is not None


def _forward(stream: Any, kind: str, copy: Any, publish: Callable[[str, str], object]) -> None:
    """Send a rank's output stream line by line to the launcher (`publish`), and to `copy` if given."""
    for line in stream:
        if copy is not None:
            copy.write(line)
            copy.flush()
        with contextlib.suppress(Exception):  # the launcher is gone: the rank still runs to its end
            publish(kind, line)


def _show(lines: Sequence[tuple[str, str]]) -> None:
    """On the launcher: print rank 0's lines as they arrive (stdout's to stdout, stderr's to stderr)."""
    for kind, line in lines:
        if kind == "err" and line.startswith("bigbatch: error: "):
            continue  # `report` prints it, naming the rank, as the launcher's one line
        stream = sys.stdout if kind == "out" else sys.stderr
        stream.write(line)
        stream.flush()


def report(results: Sequence[RankResult]) -> int:
    """The launcher's exit status (0 if every rank succeeded), and one line on stderr naming the rank
    that failed first of its own accord (not stopped by the launcher), with its own error message."""
    failed = [r for r in results if r.returncode != 0]
    if not failed:
        return 0
    own = [r for r in failed if not r.stopped]
    rank0 = next((r for r in results if r.rank == 0), None)
    if not own and rank0 is not None and rank0.returncode == 0 and all(r.returncode == -signal.SIGTERM for r in failed):
        # Stopped by the launcher: rank 0 saved the checkpoint and exited cleanly; the others took their
        # SIGTERM after their training loop had already ended (the ranks agree to stop on the first signal).
        return 0
    if not own:  # the launcher was interrupted and stopped them all
        how = ", ".join(f"rank {r.rank}: {(r.stderr_tail.splitlines() or [r.returncode])[-1]}" for r in failed)
        print(f"bigbatch: error: interrupted, and not every rank ended cleanly ({how})", file=sys.stderr)
        return 130

    def message(r: RankResult) -> str:
        lines = r.stderr_tail.splitlines()
        mine = [line for line in lines if line.startswith("bigbatch: error: ")]
        if mine:
            return mine[-1].removeprefix("bigbatch: error: ")
        if r.returncode < 0:
            return f"killed by signal {-r.returncode}" + (f" ({lines[-1]})" if lines else "")
        return lines[-1] if lines else f"exit status {r.returncode}"

    # Its own bigbatch error first (the others' are usually broken collectives it caused), then the earliest.
    first = min(
        own,
        key=lambda r: (
            not any(line.startswith("bigbatch: error: ") for line in r.stderr_tail.splitlines()),
            r.ended,
            r.rank,
        ),
    )
    others = len(failed) - 1
    also = f" ({others} other rank{'s' if others != 1 else ''} failed or stopped too)" if others else ""
    print(f"bigbatch: error: rank {first.rank} on {first.worker}: {message(first)}{also}", file=sys.stderr)
    return 2 if first.returncode == 2 else 1
