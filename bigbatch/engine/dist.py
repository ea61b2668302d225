"""Process and device from the torchrun environment (RANK, LOCAL_RANK, WORLD_SIZE), or one process, and
the few collectives the engine needs beyond DDP (metric means, agreement, broadcast)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from bigbatch.errors import LOST_PEER, BigbatchError, say


@dataclass(frozen=True)
class Context:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, str(default))
    try:
        return int(raw)
    except ValueError:
        raise BigbatchError(f"environment variable {name}={raw!r} must be an integer") from None


def context(device: str | torch.device = "auto") -> Context:
    """Read rank and world size from the environment and pick the device ("auto", "cpu" or "cuda"; or such a
    torch.device, a GPU's of this rank's index, LOCAL_RANK)."""
    rank, local_rank, world = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0), _env_int("WORLD_SIZE", 1)
    if world < 1 or not 0 <= rank < world or local_rank < 0:
        raise BigbatchError(
            f"RANK={rank}, LOCAL_RANK={local_rank}, WORLD_SIZE={world} are inconsistent; need 0 <= RANK < WORLD_SIZE"
        )
    if isinstance(device, torch.device) and device.index in (None, local_rank if device.type == "cuda" else None):
        device = device.type  # (found from outside: torch.device("cpu") refused, which accelerate takes)
    if device not in ("auto", "cpu", "cuda"):
        gpu = isinstance(device, torch.device) and device.type == "cuda"  # (another GPU than this rank's)
        other = f" (GPU {device.index}: CUDA_VISIBLE_DEVICES={device.index} makes it this rank's)" if gpu else ""
        raise BigbatchError(
            f"device (train.device) must be 'auto', 'cpu' or 'cuda' (each rank takes GPU LOCAL_RANK, here "
            f"{local_rank}), got {device!r}{other}"
        )
    if device == "cuda" and not torch.cuda.is_available():
        raise BigbatchError("device (train.device) is 'cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    return Context(rank, local_rank, world, dev)


_USERS = [0]  # the holders of the process group bigbatch created (each close() lets go; the last destroys it)


def init(ctx: Context) -> bool:
    """Join the process group torchrun describes (NCCL on CUDA, gloo on CPU); True if this call created it, or
    holds it with the others that use bigbatch's (found from outside: closing one of two Replicators destroyed
    the group under the other); False for one of the user's own, or in one process."""
    import torch.distributed as td

    if ctx.device.type == "cuda":
        torch.cuda.set_device(ctx.device)  # collectives on NCCL use the current device
    if ctx.world_size == 1 or (td.is_initialized() and not _USERS[0]):
        return False
    if td.is_initialized():
        _USERS[0] += 1
        return True
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:
            raise BigbatchError(f"WORLD_SIZE={ctx.world_size} but {name} is not set; start the processes with torchrun")
    _check_master(os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"])
    with _stoppable(), _said_while_waiting(ctx):
        _join(ctx, "nccl" if ctx.device.type == "cuda" else "gloo")
    _USERS[0] = 1
    return True


def _check_master(address: str, port: str) -> None:
    """MASTER_PORT a port and MASTER_ADDR a name that resolves: what can never meet is one line, at once (found from
    outside: a port of letters was torch's traceback; a name that resolves nowhere was waited on for 30 minutes)."""
    import socket

    if not (port.isascii() and port.isdecimal() and 0 < int(port) < 65536):
        raise BigbatchError(f"MASTER_PORT={port!r} is not a port: give a number from 1 to 65535, as torchrun's")
    try:
        socket.getaddrinfo(address, int(port), type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:  # (socket.gaierror: no such name; a name too long for IDNA)
        raise BigbatchError(
            f"MASTER_ADDR={address!r} does not resolve ({getattr(e, 'strerror', None) or e}): give rank 0's host "
            "name or address, as every rank reaches it"
        ) from None


WAIT_SAID_AFTER_S = 30.0  # a group not met by then is said to be waited for (under torchrun, by a machine's first rank)


@contextlib.contextmanager
def _said_while_waiting(ctx: Context) -> Iterator[None]:
    """One line on stderr should the group take WAIT_SAID_AFTER_S to meet: whom this process waits for, and where
    that comes from (found from outside: RANK, WORLD_SIZE and MASTER_* left in a shell by another job made `bigbatch
    train` wait silently, for torch's 30 minutes)."""
    import threading

    where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    line = f"bigbatch: rank {ctx.rank} of {ctx.world_size} waits for the other ranks at {where} "
    if torchrun := "TORCHELASTIC_RUN_ID" in os.environ:  # (a node slow to start, or one that failed; of one node,
        node = "this machine" if os.environ.get("GROUP_WORLD_SIZE") == "1" else "another node"  # a rank of its own:
        line += f"(started by torchrun: a rank of {node} has not started yet, or it failed)"  # found from outside)
    else:  # (every rank says it: a LOCAL_RANK left too is no machine's first)
        line += (
            "(RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT as the environment has them, without torchrun: left by "
            "another job, unset them)"
        )
    timer = threading.Timer(WAIT_SAID_AFTER_S, say, (line,))
    timer.daemon = True
    if ctx.local_rank == 0 or not torchrun:
        timer.start()
    try:
        yield
    finally:
        timer.cancel()


@contextlib.contextmanager
def _stoppable() -> Iterator[None]:
    """SIGTERM and Ctrl-C end the process at once while it waits to meet the others: in that wait (C++, up to
    torch's 30 minutes when the address answers but no peer does) a Python handler would not run until it ends."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_DFL) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


_JOINED = [0]  # the process groups this process has joined on torchrun's store: each meets at keys of its own


def _join(ctx: Context, backend: str) -> None:
    import torch.distributed as td

    env = os.environ.get
    shared = env("TORCHELASTIC_USE_AGENT_STORE") == "True" and env("TORCHELASTIC_RESTART_COUNT") is not None
    if not shared:
        td.init_process_group(backend)
        return
    # Under torchrun the agent's store outlives a restart of the group (--max-restarts), and a restarted
    # rank can read the address a dead rank published there (gloo: "Connection refused" to its port).
    # With one agent (one node) its restart count numbers the groups: each meets at keys of its own.
    # Agents on several nodes do not count alike (a healthy node restarts its workers uncounted), so
    # there the agents must be started with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (a new store each time).
    prefix = f"bigbatch/attempt-{env('TORCHELASTIC_RESTART_COUNT')}"
    if env("GROUP_WORLD_SIZE", "1") != "1":
        prefix = "bigbatch"
        if ctx.rank == 0 and env("TORCHELASTIC_MAX_RESTARTS", "0") != "0":
            from bigbatch.errors import warn

            warn(
                "torchrun on several nodes with --max-restarts shares its store between restarts: start the "
                "agents with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, or a restarted group may not connect"
            )
    # And each group a process joins (a script's Replicators one after another) meets at keys of its own: every rank
    # joins its groups in the same order. (Found from outside: a rank that closed the first group and joined the
    # second met keys the first had left, while the other rank was still in the first: it hung.)
    store, rank, world = next(td.rendezvous("env://"))
    store = td.PrefixStore(f"{prefix}/group-{_JOINED[0]}", store)
    td.init_process_group(backend, store=store, rank=rank, world_size=world)
    _JOINED[0] += 1  # (once joined: a join that failed leaves the count as every rank has it)


def active() -> bool:
    import torch.distributed as td

    return td.is_available() and td.is_initialized() and td.get_world_size() > 1


def first() -> bool:
    """Whether this process is rank 0 of the group it is in, or alone (the one to say what every rank meets)."""
    import torch.distributed as td

    return not active() or td.get_rank() == 0


def mean(t: torch.Tensor) -> torch.Tensor:
    """The mean of `t` over ranks (t itself in one process)."""
    import torch.distributed as td

    if not active():
        return t
    t = t.clone()
    td.all_reduce(t)
    return t / td.get_world_size()


def sum(t: torch.Tensor) -> torch.Tensor:  # noqa: A001 - dist.sum, as dist.mean
    """The sum of `t` over ranks (t itself in one process)."""
    import torch.distributed as td

    if not active():
        return t
    t = t.clone()
    td.all_reduce(t)
    return t


def in_rank_order(t: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's `t` (the same shape on each), rank 0's first ([t] in one process)."""
    import torch.distributed as td

    if not active():
        return [t]
    parts = [torch.empty_like(t) for _ in range(td.get_world_size())]
    td.all_gather(parts, t.contiguous())
    return parts


def add_in_order(parts: list[torch.Tensor]) -> torch.Tensor:
    """((parts[0] + parts[1]) + parts[2]) + ..., into parts[0]: the order one process adds its micro-batches'
    values in, so that ranks' values added so equal one process's bit for bit."""
    total = parts[0]
    for part in parts[1:]:
        total.add_(part)
    return total


def sum_in_rank_order(t: torch.Tensor) -> torch.Tensor:
    """The sum of `t` over ranks, added in rank order (add_in_order; t itself in one process)."""
    return add_in_order(in_rank_order(t)) if active() else t


def agree(flag: bool) -> bool:
    """True only if `flag` is True on every rank."""
    import torch.distributed as td

    if not active():
        return flag
    t = torch.tensor([0 if flag else 1], dtype=torch.int32)
    if td.get_backend() == "nccl":
        t = t.cuda()
    td.all_reduce(t)
    return int(t.item()) == 0


class StopVote:
    """Whether some rank asked to stop, or to save a checkpoint, for a loop that asks once an iteration: a call
    takes this rank's two flags and answers (stop, save), each true where some rank's was. Each call starts
    the all-reduce of this iteration's flags in the background and answers with the last call's, so that no
    rank waits for the vote: every rank stops (or saves) at the same iteration, the one after a rank first
    asked. The first call answers its own flags (a stop asked before the loop comes before its first step),
    as one process does every call.

    Under NCCL the flag is reduced on the GPU, and copied there and back without the host waiting for the
    device's queue (a pinned host tensor, copies that do not block): the answer is read the next iteration,
    once the GPU has run the step queued before the vote (so the host runs at most a step ahead). A plain
    copy and read back there would each wait for every step queued before them, twice an iteration, the GPU
    idle while the host makes the next step.
    Under gloo the flags are host tensors, reduced by gloo's threads."""

    def __init__(self) -> None:
        self._started = False
        self._under_way: tuple[Callable[[], Any], torch.Tensor] | None = None  # (what to wait for, the answer)

    def __call__(self, stop: bool, save: bool = False) -> tuple[bool, bool]:
        if not active():
            return stop, save
        first, self._started = not self._started, True
        answer = self._answer() if self._under_way is not None else (False, False)
        self._under_way = self._start(stop, save)
        return self._answer() if first else answer

    @staticmethod
    def _start(stop: bool, save: bool) -> tuple[Callable[[], Any], torch.Tensor]:
        import torch.distributed as td

        vote = torch.tensor([int(stop), int(save)], dtype=torch.int32, device="cpu")
        if td.get_backend() != "nccl":
            return td.all_reduce(vote, op=td.ReduceOp.MAX, async_op=True).wait, vote
        on_device = vote.pin_memory().to(torch.device("cuda", torch.cuda.current_device()), non_blocking=True)
        td.all_reduce(on_device, op=td.ReduceOp.MAX, async_op=True).wait()  # (the stream waits for it, not the host)
        answer = torch.empty(2, dtype=torch.int32, pin_memory=True).copy_(on_device, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return done.synchronize, answer

    def _answer(self) -> tuple[bool, bool]:
        wait, answer = self._under_way
        self._under_way = None
        wait()
        stop, save = answer.tolist()
        return bool(stop), bool(save)

    def close(self) -> None:
        """Wait for the reduce under way: every rank makes it, so none leaves one to a destroyed group."""
        if self._under_way is not None:
            self._answer()


def broadcast(obj):
    """Rank 0's `obj` on every rank (our own processes only: it goes through pickle)."""
    import torch.distributed as td

    if not active():
        return obj
    box = [obj]
    td.broadcast_object_list(
        box, src=0, device=torch.device("cuda", torch.cuda.current_device()) if td.get_backend() == "nccl" else None
    )
    return box[0]


def gather(obj):
    """[rank 0's obj, rank 1's, ...] on every rank ([obj] in one process; through pickle: our own data only)."""
    import torch.distributed as td

    if not active():
        return [obj]
    out = [None] * td.get_world_size()
    td.all_gather_object(out, obj)
    return out


def ranks_differing(nets: dict[str, torch.nn.Module]) -> list[int]:
    """The ranks whose parameters of `nets` differ from rank 0's: one hash a rank, gathered ([] in one process)."""
    import xxhash

    if not active():
        return []
    h = xxhash.xxh3_64()
    for key, net in sorted(nets.items()):
        for name, p in net.named_parameters():
            h.update(f"{key}.{name}".encode())
            h.update(p.detach().reshape(-1).contiguous().view(torch.uint8).cpu().numpy())
    hashes = gather(h.hexdigest())
    return [rank for rank, value in enumerate(hashes) if value != hashes[0]]


def close(created: bool) -> None:
    """Let go of the process group `init` created or held (`created`); the last holder destroys it."""
    import torch.distributed as td

    if not created:
        return
    _USERS[0] = max(0, _USERS[0] - 1)
    if not _USERS[0] and td.is_initialized():
        td.destroy_process_group()


def lost_peer(e: BaseException) -> bool:
    """Whether a collective failed because another process of the group went away (gloo or NCCL)."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) < 2:
        return False
    signs = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "NCCL communicator was aborted")
    return any(sign in str(e) for sign in signs) or type(e).__name__ in ("DistNetworkError", "DistBackendError")


@contextlib.contextmanager
def peers_said(api: bool) -> Iterator[None]:
    """Under the Python API (`api`), a collective another rank's end broke said in one line (found from outside: a
    rank whose input ended a step early exited 0, and the other raised gloo's traceback); the command line says it
    its own way (cli_errors), with the exit status a launcher reads."""
    try:
        yield
    except RuntimeError as e:
        if not (api and lost_peer(e)):
            raise
        raise BigbatchError(
            f"{lost_peer_said(e)}: another rank ended or failed; every rank's input must give as many steps (the "
            "other's own error says why, if it failed)"
        ) from None


def lost_peer_said(e: BaseException) -> str:
    """ "lost contact with another rank (the collective's first line, cut at a word past 200 characters)"."""
    text = str(e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    if len(first) > 200:  # cut at a word, and say so
        first = first[:200].rsplit(" ", 1)[0] + " ..."
    return f"{LOST_PEER} ({first})"
