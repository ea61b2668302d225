"""Ranks on a Ray cluster: one `bigbatch train` process per Ray actor. `launch_ray` is `bigbatch
launch ray`; `run(cfg, run_dir)` starts a run from Python (on the Ray instance `ray.init` connected
to) and returns a RunHandle."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

from bigbatch.errors import BigbatchError
from bigbatch.launch import (
    APART,
    GRACE_SECONDS,
    LOST,
    RankResult,
    _command,
    _free_port,
    _results,
    _run_rank,
    _show,
    _sigterm_interrupts,
    _visible_gpus,
    _wait,
    rank_environments,
    train_command,
)
from bigbatch.launch.handle import RunHandle, Sink


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise BigbatchError("the Ray launcher needs Ray: pip install ray (bigbatch's extra [ray])") from None
    return ray


def ray_ranks(resources: dict[str, float], nprocs: int | None, gpus_per_rank: float | None) -> tuple[int, float]:
    """(ranks, GPUs per rank) for a Ray cluster with `resources`: by default one rank per GPU, or CPU
    ranks where there is none (then --nprocs is needed); checked against what the cluster holds."""
    gpus, cpus = resources.get("GPU", 0.0), resources.get("CPU", 0.0)
    per_rank = (1.0 if gpus else 0.0) if gpus_per_rank is None else gpus_per_rank
    if per_rank not in (0, 1):  # (two ranks on one GPU: NCCL refuses them, and both would see it as device 0)
        raise BigbatchError(
            f"--gpus-per-rank must be 1 (a rank trains on a GPU of its own) or 0 (CPU ranks), got {per_rank:g}"
        )
    if nprocs is not None and (isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1):
        raise BigbatchError(f"--nprocs must be a number of ranks, 1 or more, got {nprocs!r}")
    n = nprocs if nprocs is not None else (int(gpus // per_rank) if per_rank else 0)
    if n < 1:
        raise BigbatchError(
            f"the Ray cluster has no GPUs ({resources}): give the number of CPU ranks (--nprocs N, in Python nprocs=N)"
        )
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
    ray = _ray()
    if local < 0 or (address is not None and local):
        what = f"--local {local} is not a number of ranks" if local < 0 else "both were given"
        raise BigbatchError(f"give the Ray cluster's address (--address auto or ray://HEAD:10001) or --local N: {what}")
    if address is None and local < 1:
        raise BigbatchError("give the Ray cluster's address (--address auto or ray://HEAD:10001) or --local N (N >= 1)")
    args = _command(args)
    if address not in (None, "auto", "local"):
        _reachable(address)
    with _sigterm_interrupts():  # (a SIGTERM while Ray starts too: _init)
        try:
            if local:
                _init(ray, num_cpus=local, num_gpus=0 if not gpus_per_rank else None, include_dashboard=False)
            else:
                _init(ray, address=address)
            ranks = nprocs if nprocs is not None else (local or None)
            n, per_rank = ray_ranks(ray.cluster_resources(), ranks, gpus_per_rank)
            return session(n, per_rank, args, grace, _show)
        finally:
            ray.shutdown()
            if local and os.environ.get(APART):
                _end_strays()


def _init(ray: Any, **options: Any) -> None:
    """ray.init, a SIGTERM meanwhile a KeyboardInterrupt as at any other time of the launch (found from outside:
    ray.init puts in a handler of its own, which exited with status 15, a local instance's processes left running);
    the handler of SIGTERM the launch had, back after it."""
    ours = signal.getsignal(signal.SIGTERM)
    try:
        ray.init(logging_level=logging.ERROR, **options)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise BigbatchError(f"cannot reach the Ray cluster at {options.get('address')}: {e}") from None
    except SystemExit as e:  # (Ray's handler, on SIGTERM while it starts)
        if e.code != signal.SIGTERM:
            raise
        raise KeyboardInterrupt from None
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, ours)


def _end_strays() -> None:
    """A local Ray instance's processes left after its shutdown, ended: a launcher started by `apart` leads its own
    process group, which they share (found from outside: shut down while it started, Ray left its dashboard and
    runtime-env agents running, deaf to SIGTERM)."""
    group, me = os.getpgid(0), os.getpid()
    if group != me or not os.path.isdir("/proc"):
        return

    def strays() -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            with contextlib.suppress(OSError, ValueError):
                if entry.isdigit() and int(entry) != me and os.getpgid(int(entry)) == group:
                    found.append(int(entry))
        return found

    if strays():
        time.sleep(1)  # (its own shutdown ends them when it can)
    for pid in strays():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def run(
    cfg: Any,
    run_dir: str | os.PathLike,
    *,
    nprocs: int | None = None,
    gpus_per_rank: float | None = None,
    restarts: int = 0,
    grace: float = GRACE_SECONDS,
    echo: bool = False,
) -> RunHandle:
    """Train `cfg` (a bigbatch.Config) into `run_dir` on the Ray cluster this process is connected to
    (`ray.init(...)` first; else Ray's default, a local instance), `nprocs` ranks of `gpus_per_rank`
    GPUs (defaults as `bigbatch launch ray`), resuming the run if `run_dir` holds one. Returns at once
    with a RunHandle (see bigbatch.launch.dask.run)."""
    path, args, text = train_command(cfg, run_dir)
    ray = _ray()
    if not ray.is_initialized():
        ray.init(logging_level=logging.ERROR)
    n, per_rank = ray_ranks(ray.cluster_resources(), nprocs, gpus_per_rank)
    return RunHandle(
        path,
        lambda sink, stop: session(n, per_rank, args, grace, sink, stop, config=text, watch=path),
        restarts,
        echo,
    )


def session(
    n: int,
    per_rank: float,
    args: list[str],
    grace: float,
    sink: Sink,
    stop: threading.Event | None = None,
    config: str | None = None,
    watch: str | None = None,
) -> list[RankResult]:
    """One launch of `n` ranks on the connected Ray cluster; rank 0's output (and, with `watch`, the
    run's rows and sheets) goes to `sink` as it comes. Returns once every rank has ended."""
    ray = _ray()
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bundle = {"CPU": 1.0, **({"GPU": per_rank} if per_rank else {})}
    group = placement_group([bundle] * n, strategy="PACK")
    try:
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
        names = [f"ray://{where[i][0]}:{k}" for k, i in enumerate(order)]  # (one worker a rank, by its host)
        port = ray.get(actors[0].free_port.remote())
        envs = rank_environments(names, port, [where[i][1] for i in order])
        refs = [
            a.run.remote(args, env, flag, grace, rank == 0, config, watch if rank == 0 else None)
            for rank, (a, env) in enumerate(zip(actors, envs))
        ]

        def poll() -> list[tuple | None]:
            with contextlib.suppress(Exception):
                sink(ray.get(flag.take.remote()))  # rank 0's output, as it comes
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

        results = _wait(poll, lambda: ray.get(flag.set.remote()), grace, stop)
        with contextlib.suppress(Exception):
            sink(ray.get(flag.take.remote()))
        for actor in [*actors, flag]:
            with contextlib.suppress(Exception):
                ray.kill(actor)
        # (said as the Ray node: found from outside, ray://HOST:RANK read as the address of Ray's client port)
        return _results([f"Ray node {where[i][0]}" for i in order], envs, results)
    finally:
        with contextlib.suppress(Exception):
            remove_placement_group(group)


def _reachable(address: str) -> None:
    """Fail in seconds, not minutes, on a Ray address nothing listens at."""
    target = urlparse(address if "://" in address else f"tcp://{address}")
    host, port = target.hostname, target.port
    if host is None or port is None:
        raise BigbatchError(f"cannot read the Ray address {address!r}: give auto, HOST:PORT or ray://HOST:PORT")
    try:
        s = socket.create_connection((host, port), timeout=5)
    except OSError as e:
        raise BigbatchError(f"cannot reach the Ray cluster at {address}: {e}") from None
    answer = HTTP2_PREFACE[24:]  # (a TLS cluster's handshake comes first; a proxy's: not probed)
    with s, contextlib.suppress(OSError):
        if os.environ.get("RAY_USE_TLS", "0") in ("0", "") and not _PROXIED.intersection(os.environ):
            s.sendall(HTTP2_PREFACE)
            answer = b""
            while len(answer) < 9 and (part := s.recv(9 - len(answer))):
                answer += part
    if len(answer) < 9 or answer[3] != 4:  # Ray's GCS and its client server speak gRPC: a SETTINGS frame first
        raise BigbatchError(
            f"no Ray cluster answered at {address}: something else listens there (Ray's head prints its address as "
            "it starts, e.g. HOST:6379, or ray://HOST:10001 for Ray Client)"
        )


# What an HTTP/2 client sends first: the connection preface, then its (empty) SETTINGS frame; a gRPC server answers
# with a SETTINGS frame (its 4th byte: type 4). Found from outside: ray.init waited on a web server's port for ever.
_PROXIED = {"grpc_proxy", "https_proxy", "http_proxy", "GRPC_PROXY", "HTTPS_PROXY", "HTTP_PROXY"}
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


class _Flag:
    """A Ray actor: the abort flag every rank polls, and the mailbox of what rank 0 publishes."""

    def __init__(self) -> None:
        self.raised, self.items = False, []

    def set(self) -> None:
        self.raised = True

    def is_set(self) -> bool:
        return self.raised

    def push(self, kind: str, payload: Any) -> None:
        """Rank 0's output lines, rows and sheets, one at a time, until the launcher `take`s them."""
        self.items.append((kind, payload))

    def take(self) -> list[tuple[str, Any]]:
        items, self.items = self.items, []
        return items


class _RayRank:
    """A Ray actor that runs one rank as a child process (like a Dask worker's task)."""

    def where(self) -> tuple[str, str]:
        import ray

        return ray.util.get_node_ip_address(), _visible_gpus()

    def free_port(self) -> int:
        return _free_port()

    def run(
        self,
        args: list[str],
        env: dict[str, str],
        flag: Any,
        grace: float,
        publish: bool = False,
        config: str | None = None,
        watch: str | None = None,
    ) -> tuple:
        import ray

        aborted, abort = lambda: ray.get(flag.is_set.remote()), lambda: flag.set.remote()
        sent: list[Any] = []

        def push(kind: str, payload: Any) -> None:
            sent.append(flag.push.remote(kind, payload))
            if len(sent) > 100:  # (now and then: have the mailbox keep up)
                ray.wait(sent, num_returns=len(sent), timeout=10)
                del sent[:]

        ended = _run_rank(args, env, aborted, abort, grace, push if publish else None, config, watch)
        # Delivered before the launcher's last take: the run's last rows and sheets are in these.
        ray.get(sent, timeout=60)
        return ended
