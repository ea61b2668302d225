"""Scale out on a Dask cluster: one `bigbatch train` process per Dask worker, with the environment
torchrun would give it (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

Dask only places the processes: training itself is the same torch.distributed program as under
torchrun (NCCL on GPUs, gloo on CPUs), so it trains the same weights. Each rank runs in a child
process of its worker, so a crash cannot take the worker down and the worker's own threads and
heartbeats are untouched. When one rank fails, or the launcher is interrupted, every other rank
is stopped (SIGTERM first: all ranks then save a checkpoint together and exit; SIGKILL after a grace
period), so no rank is left waiting in a collective.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from urllib.parse import urlparse

from bigbatch.errors import BigbatchError

GRACE_SECONDS = 60.0  # after SIGTERM, how long a rank may take to save its checkpoint


@dataclass(frozen=True)
class RankResult:
    rank: int
    worker: str
    returncode: int
    stderr_tail: str


def rank_environments(workers: Sequence[str], master_port: int, pinned_gpu: Sequence[bool]) -> list[dict[str, str]]:
    """The torch.distributed environment of each worker's process, rank = position in `workers`.

    LOCAL_RANK counts the workers on the same host (it picks the GPU), except on a worker whose GPU
    is already pinned by CUDA_VISIBLE_DEVICES (dask-cuda's workers): there it is 0, its first device."""
    hosts = [urlparse(w).hostname or w for w in workers]
    envs = []
    for rank, host in enumerate(hosts):
        local = hosts[:rank].count(host)
        envs.append(
            {
                "RANK": str(rank),
                "WORLD_SIZE": str(len(workers)),
                "LOCAL_RANK": "0" if pinned_gpu[rank] else str(local),
                "LOCAL_WORLD_SIZE": str(hosts.count(host)),
                "MASTER_ADDR": hosts[0],
                "MASTER_PORT": str(master_port),
            }
        )
    return envs


def launch_dask(
    args: Sequence[str],
    scheduler: str | None = None,
    local: int = 0,
    nprocs: int | None = None,
) -> list[RankResult]:
    """Run `bigbatch ARGS` (e.g. ["train", "--preset", "digits"]) on the workers of the Dask cluster at
    `scheduler` (or of a LocalCluster of `local` worker processes), one rank per worker (the first
    `nprocs` workers, sorted by address). Returns each rank's result once all have finished."""
    try:
        from distributed import Client, Event, LocalCluster
    except ImportError:
        raise BigbatchError("the Dask launcher needs dask.distributed: pip install 'bigbatch[dask]'") from None
    if (scheduler is None) == (local < 1):
        raise BigbatchError("give the Dask scheduler's address (--scheduler tcp://HOST:8786) or --local N, not both")
    if not args:
        raise BigbatchError("nothing to launch: add the bigbatch command after '--', e.g. -- train --preset digits")
    cluster = None
    try:
        if local:
            cluster = LocalCluster(n_workers=local, threads_per_worker=1, processes=True, dashboard_address=None)
        try:
            client = Client(cluster if cluster is not None else scheduler, timeout="20s")
        except (OSError, TimeoutError) as e:
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
            pinned = client.run(_gpu_pinned, workers=workers)
            envs = rank_environments(workers, port, [pinned[w] for w in workers])
            abort = Event(f"bigbatch-abort-{uuid.uuid4().hex}", client=client)
            futures = [
                client.submit(
                    _run_rank, list(args), env, abort.name, workers=[w], allow_other_workers=False, pure=False
                )
                for w, env in zip(workers, envs)
            ]
            try:
                with _sigterm_interrupts():
                    results = client.gather(futures)
            except KeyboardInterrupt:
                abort.set()  # every rank gets SIGTERM: they save a checkpoint together
                print("bigbatch launch: stopping every rank (a second Ctrl-C stops waiting for them)", file=sys.stderr)
                results = client.gather(futures)
            return [RankResult(int(env["RANK"]), w, rc, tail) for w, env, (rc, tail) in zip(workers, envs, results)]
    finally:
        if cluster is not None:
            cluster.close()


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


def _gpu_pinned() -> bool:
    return bool(os.environ.get("CUDA_VISIBLE_DEVICES", "").strip())


def _run_rank(args: list[str], env: dict[str, str], abort_name: str) -> tuple[int, str]:
    """On a Dask worker: run one rank as a child process; stop it when another rank has failed."""
    from distributed import Event

    abort = Event(abort_name)
    full_env = {**os.environ, **env}
    if _gpu_pinned():  # dask-cuda: the worker's own GPU is the first visible one
        full_env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"].split(",")[0]
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "bigbatch.cli", *args], env=full_env, stderr=err)
        stopped_at = None
        while proc.poll() is None:
            if stopped_at is None and abort.is_set():
                proc.send_signal(signal.SIGTERM)
                stopped_at = time.monotonic()
            elif stopped_at is not None and time.monotonic() - stopped_at > GRACE_SECONDS:
                proc.kill()
            time.sleep(0.5)
        if proc.returncode != 0:
            abort.set()  # the other ranks would wait for this one in their next collective
        err.seek(0)
        lines = err.read().splitlines()
    return proc.returncode, "\n".join(lines[-20:])


def report(results: Sequence[RankResult]) -> int:
    """The launcher's exit status (0 if every rank succeeded), and one line per failed rank on stderr:
    the first failure's own message, then the ranks stopped because of it."""
    failed = [r for r in results if r.returncode != 0]
    if not failed:
        return 0
    first = min(failed, key=lambda r: (r.returncode in (-signal.SIGTERM, -signal.SIGKILL), r.rank))
    message = next(
        (line for line in reversed(first.stderr_tail.splitlines()) if line.startswith("bigbatch: error: ")),
        first.stderr_tail.splitlines()[-1] if first.stderr_tail else f"exit status {first.returncode}",
    )
    others = len(failed) - 1
    also = f" ({others} other rank{'s' if others != 1 else ''} failed or stopped too)" if others else ""
    print(
        f"bigbatch: error: rank {first.rank} on {first.worker}: {message.removeprefix('bigbatch: error: ')}{also}",
        file=sys.stderr,
    )
    return 2 if first.returncode == 2 else 1
