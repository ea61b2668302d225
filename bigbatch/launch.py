"""Scale out on a Dask or Ray cluster: one `bigbatch train` process per Dask worker (or Ray actor),
with the environment torchrun would give it (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT).

Dask and Ray only place the processes: training itself is the same torch.distributed program as under
torchrun (NCCL on GPUs, gloo on CPUs), so it trains the same weights. Each rank runs in a child
process of its worker, so a crash cannot take the worker down and the worker's own threads and
heartbeats are untouched (a Ray actor holds one CPU and its GPUs for its rank). When one rank
fails, or the launcher is interrupted, every other rank is stopped (SIGTERM first: all ranks then
save a checkpoint together and exit; SIGKILL after a grace period), so no rank is left waiting in a
collective.
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
                    _dask_rank, list(args), env, abort.name, workers=[w], allow_other_workers=False, pure=False
                )
                for w, env in zip(workers, envs)
            ]
            results = _wait(lambda: client.gather(futures), abort.set)
            return [RankResult(int(env["RANK"]), w, rc, tail) for w, env, (rc, tail) in zip(workers, envs, results)]
    finally:
        if cluster is not None:
            cluster.close()


def launch_ray(
    args: Sequence[str],
    address: str | None = None,
    local: int = 0,
    nprocs: int | None = None,
    gpus_per_rank: float | None = None,
) -> list[RankResult]:
    """Run `bigbatch ARGS` as `nprocs` ranks on a Ray cluster (`address`, e.g. "auto" or
    "ray://HEAD:10001"), or on a local Ray instance with `local` ranks. Each rank is an actor holding
    one CPU and `gpus_per_rank` GPUs (default: 1 when the cluster has GPUs), placed by a PACK
    placement group so that ranks on one node are neighbours; ranks are ordered by node."""
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
    if not args:
        raise BigbatchError("nothing to launch: add the bigbatch command after '--', e.g. -- train --preset digits")
    try:
        if local:
            ray.init(num_cpus=local, include_dashboard=False, logging_level=logging.ERROR)
        else:
            ray.init(address=address, logging_level=logging.ERROR)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise BigbatchError(f"cannot reach the Ray cluster at {address}: {e}") from None
    group = None
    try:
        resources = ray.cluster_resources()
        gpus = resources.get("GPU", 0.0) if gpus_per_rank is None else gpus_per_rank
        per_rank = (1.0 if gpus else 0.0) if gpus_per_rank is None else gpus_per_rank
        n = nprocs or local or (int(gpus // per_rank) if per_rank else 0)
        if n < 1:
            raise BigbatchError("the Ray cluster has no GPUs: say how many CPU ranks to start with --nprocs N")
        bundle = {"CPU": 1.0, **({"GPU": per_rank} if per_rank else {})}
        group = placement_group([bundle] * n, strategy="PACK")
        if not ray.wait([group.ready()], timeout=120)[0]:
            raise BigbatchError(
                f"the Ray cluster cannot place {n} ranks of {bundle} (it has {dict(resources)}); lower --nprocs"
            )
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
        where = ray.get([a.where.remote() for a in actors])  # (node IP, GPU pinned)
        order = sorted(range(n), key=lambda i: (where[i][0], i))
        actors = [actors[i] for i in order]
        names = [f"ray://{where[i][0]}:{k}" for k, i in enumerate(order)]
        port = ray.get(actors[0].free_port.remote())
        envs = rank_environments(names, port, [where[i][1] for i in order])
        futures = [a.run.remote(list(args), env, flag) for a, env in zip(actors, envs)]
        results = _wait(lambda: ray.get(futures), lambda: ray.get(flag.set.remote()))
        return [RankResult(int(env["RANK"]), w, rc, tail) for w, env, (rc, tail) in zip(names, envs, results)]
    finally:
        if group is not None:
            remove_placement_group(group)
        ray.shutdown()


class _Flag:
    """A Ray actor: the abort flag every rank polls."""

    def __init__(self) -> None:
        self.raised = False

    def set(self) -> None:
        self.raised = True

    def is_set(self) -> bool:
        return self.raised


class _RayRank:
    """A Ray actor that runs one rank as a child process (like a Dask worker's task)."""

    def where(self) -> tuple[str, bool]:
        import ray

        return ray.util.get_node_ip_address(), bool(ray.get_gpu_ids())

    def free_port(self) -> int:
        return _free_port()

    def run(self, args: list[str], env: dict[str, str], flag: Any) -> tuple[int, str]:
        import ray

        return _run_rank(args, env, lambda: ray.get(flag.is_set.remote()), lambda: flag.set.remote())


def _wait(gather: Callable[[], list], abort: Callable[[], object]) -> list:
    """All ranks' results; on Ctrl-C or SIGTERM, ask every rank to stop (SIGTERM: they save a checkpoint
    together and exit) and wait for them."""
    try:
        with _sigterm_interrupts():
            return gather()
    except KeyboardInterrupt:
        abort()
        print("bigbatch launch: stopping every rank (a second Ctrl-C stops waiting for them)", file=sys.stderr)
        return gather()


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


def _dask_rank(args: list[str], env: dict[str, str], abort_name: str) -> tuple[int, str]:
    from distributed import Event

    abort = Event(abort_name)
    return _run_rank(args, env, abort.is_set, abort.set)


def _run_rank(
    args: list[str], env: dict[str, str], aborted: Callable[[], bool], abort: Callable[[], object]
) -> tuple[int, str]:
    """On a worker: run one rank as a child process; stop it when another rank has failed (or the
    launcher asks), and ask the others to stop when it fails."""
    full_env = {**os.environ, **env}
    if _gpu_pinned():  # dask-cuda: the worker's own GPU is the first visible one
        full_env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"].split(",")[0]
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "bigbatch.cli", *args], env=full_env, stderr=err)
        stopped_at = None
        while proc.poll() is None:
            if stopped_at is None and aborted():
                proc.send_signal(signal.SIGTERM)
                stopped_at = time.monotonic()
            elif stopped_at is not None and time.monotonic() - stopped_at > GRACE_SECONDS:
                proc.kill()
            time.sleep(0.5)
        if proc.returncode != 0:
            abort()  # the other ranks would wait for this one in their next collective
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
