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

The engines live in bigbatch.launch.dask and bigbatch.launch.ray (and bigbatch.launch.local, one
process on this machine): each has the `bigbatch launch` command's function and `run(...)`, which
starts a run from Python and returns a RunHandle (bigbatch.launch.handle) that streams the run's
metrics rows and sample sheets back while it trains.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from bigbatch import user_modules
from bigbatch.errors import LOST_PEER, STOPPED, BigbatchError, say
from bigbatch.files import metrics_row
from bigbatch.urls import local_folder, names_url

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


def rank_environments(
    workers: Sequence[str],
    master_port: int,
    visible_gpus: Sequence[str],
    cluster: Sequence[str] | None = None,
) -> list[dict[str, str]]:
    """The torch.distributed environment of each worker's process, rank = position in `workers`
    (addresses like tcp://HOST:PORT); `visible_gpus` is each worker's CUDA_VISIBLE_DEVICES ("" if unset).

    LOCAL_RANK picks the GPU: it counts the ranks on the same host, or, given the `cluster`'s workers,
    is the worker's position among those on its host (so that runs side by side take different GPUs);
    unless the workers of a host have each been given a GPU of their own (dask-cuda rotates
    CUDA_VISIBLE_DEVICES so that each worker's own GPU comes first; Ray sets it per actor): then each
    rank sees only that GPU, as device 0."""
    hosts = [urlparse(w).hostname or w for w in workers]
    everyone = sorted(set(cluster) | set(workers)) if cluster is not None else None
    firsts = [v.split(",")[0].strip() for v in visible_gpus]
    envs = []
    for rank, host in enumerate(hosts):
        same = [firsts[i] for i, h in enumerate(hosts) if h == host]
        pinned = all(same) and len(set(same)) == len(same)
        if everyone is None:
            local = hosts[:rank].count(host)
        else:
            local = [w for w in everyone if (urlparse(w).hostname or w) == host].index(workers[rank])
        env = {
            "RANK": str(rank),
            "WORLD_SIZE": str(len(workers)),
            "LOCAL_RANK": "0" if pinned else str(local),
            "LOCAL_WORLD_SIZE": str(len(same)),
            "MASTER_ADDR": hosts[0],
            "MASTER_PORT": str(master_port),
        }
        if pinned:
            env["CUDA_VISIBLE_DEVICES"] = firsts[rank]
        # (the modules of a user's own model families, and where to find them: each rank imports them)
        env.update({k: os.environ[k] for k in user_modules.CARRIED if os.environ.get(k)})
        envs.append(env)
    return envs


def train_command(cfg: Any, run_dir: str | os.PathLike) -> tuple[str, list[str], str]:
    """What a run() of any engine launches: (the run directory, absolute (a URL refused); the ranks'
    `bigbatch train` arguments, which start or resume it; the config file's text)."""
    from bigbatch.config import Config

    if not isinstance(cfg, Config):
        raise BigbatchError(f"run() takes a bigbatch.Config, got {type(cfg).__name__}: e.g. bigbatch.preset('digits')")
    path = os.path.abspath(local_folder(run_dir, "run_dir", "train"))  # (a URL: refused here, before a rank starts)
    from bigbatch.models.registry import builder, is_own

    if not is_own(cfg.model.name):  # (found from outside: every rank refused a user's family, once started)
        user_modules.carried_to_ranks(builder(cfg.model.name).__module__, cfg.model.name)
    return path, ["train", "--run-dir", path, "--resume=auto"], cfg.dumps()


def absolute_run_dir(command: Sequence[str]) -> list[str]:
    """A launched command's --run-dir made absolute, as run() makes its run_dir: each rank would resolve a relative
    one in its worker's folder (found from outside: the run was trained there, and named here as if in this one)."""
    out = list(command)
    for i, arg in enumerate(out):
        value = out[i + 1] if arg == "--run-dir" and i + 1 < len(out) else ""
        if value and not value.startswith("-") and not names_url(value):  # (a flag after it: argparse says so)
            out[i + 1] = os.path.abspath(value)
        elif arg.startswith("--run-dir=") and arg != "--run-dir=" and not names_url(arg.removeprefix("--run-dir=")):
            out[i] = "--run-dir=" + os.path.abspath(arg.removeprefix("--run-dir="))
    return out


def _command(args: Sequence[str]) -> list[str]:
    if not args:
        raise BigbatchError("nothing to launch: add the bigbatch command after '--', e.g. -- train --preset digits")
    return list(args)


def _results(names: Sequence[str], envs: Sequence[dict], results: Sequence[tuple]) -> list[RankResult]:
    return [RankResult(int(env["RANK"]), w, *r) for w, env, r in zip(names, envs, results)]


def _wait(
    poll: Callable[[], list[tuple | None]],
    abort: Callable[[], object],
    grace: float,
    stop: threading.Event | None = None,
) -> list[tuple]:
    """Poll until every rank has a result. When one fails (or is lost), on Ctrl-C or SIGTERM, or once
    `stop` is set (RunHandle.stop), ask every rank to stop; ranks that still have no result `grace` +
    30 s later are reported as lost."""
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
                if stop is not None and stop.is_set() and not interrupted:
                    interrupted = True  # as Ctrl-C: every rank saves a checkpoint and exits
                    with contextlib.suppress(Exception):
                        abort()
                    aborted_at = time.monotonic()
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


APART = "BIGBATCH_LAUNCH_APART"  # set (to this process's PID) in a launcher started by `apart`


def apart(argv: Sequence[str]) -> int:
    """`bigbatch ARGV` (a `launch ... --local N`) in a session of its own, this process forwarding SIGINT
    and SIGTERM to it; returns its exit status. Ctrl-C in a terminal, and `timeout` or a batch system
    ending the job, signal a whole process group: a local cluster's processes (Dask's workers, Ray's
    GCS and raylet) would die of it, losing the ranks while the launcher has them save a checkpoint.
    Apart, only the launcher hears it, and stops the ranks as on a real cluster."""
    env = {**os.environ, APART: str(os.getpid())}
    proc = subprocess.Popen([sys.executable, "-m", "bigbatch", *argv], env=env, start_new_session=True)

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        status = proc.wait()  # (a forwarded signal's handler returns; the wait goes on)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 128 - status if status < 0 else status


def bind_apart() -> None:
    """In a launcher started by `apart`: SIGTERM (a clean stop of the ranks) should the process that
    forwards its signals die; and SIGINT heard, as Ctrl-C, even when it started ignored (a job started in
    the background of a script inherits SIGINT ignored, and the forwarded Ctrl-C then stopped nothing)."""
    if os.environ.get(APART, "").isdigit():
        from bigbatch.signals import die_with_parent

        die_with_parent(int(os.environ[APART]), signal.SIGTERM)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.default_int_handler)


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


# A rank's process sets SIGINT and SIGTERM to their defaults (a worker may ignore them, and an ignored
# signal stays ignored through exec), binds itself to the worker thread that started it (Linux's
# PR_SET_PDEATHSIG: SIGTERM when that thread dies; it survives exec), gives up if the worker died before
# the binding took hold, then becomes `python -m bigbatch ARGS`. Code given to -c, not a bigbatch
# function: importing bigbatch to run it would load torch twice per rank. Binding in Popen's preexec_fn
# instead is unsafe in a threaded process such as a Dask worker.
BOUND_RANK = """
import ctypes, os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
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


def start_rank(args: Sequence[str], env: dict[str, str], **popen: Any) -> subprocess.Popen:
    """A rank's process (`rank_command(args)`), in a session of its own (a Ctrl-C in the launcher's terminal reaches
    it only through the launcher). SIGTERM is held (blocked, kept pending) from its fork until its bigbatch takes it
    (cli.main): found from outside, one before was dropped (by a worker that ignores it) or ended the rank unsaid,
    which was then restarted."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}) if sys.platform == "linux" else None
    try:
        return subprocess.Popen(rank_command(args), env=env, start_new_session=True, **popen)
    finally:
        if held is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _run_rank(
    args: list[str],
    env: dict[str, str],
    aborted: Callable[[], bool],
    abort: Callable[[], object],
    grace: float = GRACE_SECONDS,
    publish: Callable[[str, Any], object] | None = None,
    config: str | None = None,
    watch: str | None = None,
) -> tuple[int, str, float, bool]:
    """On a worker: run one rank as a child process; stop it when another rank has failed (or the
    launcher asks), and ask the others to stop when it fails. With `publish` (rank 0), each line the
    rank prints goes to publish("out" or "err", line) as it comes, for the launcher to show, and with
    `watch` (the run directory) so do its metrics rows and sample sheets (see `_Watcher`). `config`:
    the text of a config file, written here and given to the command as --config. Returns (exit
    status, last lines of its stderr, when it ended, whether it was stopped from here)."""
    stopped_at = None
    with contextlib.ExitStack() as stack:
        err = stack.enter_context(tempfile.TemporaryFile("w+"))
        if config is not None:
            file = stack.enter_context(tempfile.NamedTemporaryFile("w", suffix=".toml", prefix="bigbatch-"))
            file.write(config)
            file.flush()
            args = [*args, "--config", file.name]
        watcher = _Watcher(Path(watch), publish) if watch is not None and publish is not None else None
        # (not a torchrun agent's variables, should this worker run inside a torchrun job: not its group)
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
        proc = start_rank(
            args,
            {**inherited, **env, "BIGBATCH_LAUNCH_PARENT": str(os.getpid()), "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE if publish else None,
            stderr=subprocess.PIPE if publish else err,
            text=True,
        )
        readers = []
        if publish is not None:
            for stream, kind, copy in ((proc.stdout, "out", None), (proc.stderr, "err", err)):
                readers.append(threading.Thread(target=_forward, args=(stream, kind, copy, publish), daemon=True))
                readers[-1].start()
        if watcher is not None:
            watcher.start()
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
            if watcher is not None:
                watcher.finish()  # the rows and sheet the rank wrote last
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


class _Watcher(threading.Thread):
    """On rank 0's worker: while the rank trains, send the launcher each new row of RUN/metrics.jsonl
    ("row", dict) and the newest sample sheet of each kind in RUN/samples/ ("sheet", (file name, PNG bytes)), once a
    second. When the file is rewritten (a resume drops the rows past its checkpoint) it says
    ("reset", None) and sends every row again: the launcher's RunHandle keeps the rows it has."""

    def __init__(self, run: Path, publish: Callable[[str, Any], object], every: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.dir, self.publish, self.every = run, publish, every
        self.done = threading.Event()
        self.lock = threading.Lock()  # one check at a time (finish()'s, should the thread still be in one)
        self.file: tuple[int, int] | None = None  # metrics.jsonl's (device, inode)
        self.offset, self.partial = 0, b""
        self.sheets: dict[str, tuple[str, int]] = {}  # kind -> (name, mtime) sent

    def run(self) -> None:
        while not self.done.wait(self.every):
            self.check()

    def finish(self) -> None:
        self.done.set()
        self.join(timeout=30)
        self.check()

    def check(self) -> None:
        with self.lock:
            try:
                self.rows()
            except Exception:  # noqa: BLE001 - not sent (the launcher is busy or gone): all again next time
                self.file = None
            with contextlib.suppress(Exception):
                self.newest_sheets()

    def rows(self) -> None:
        path = self.dir / "metrics.jsonl"
        try:
            st = path.stat()
        except FileNotFoundError:
            return
        if (st.st_dev, st.st_ino) != self.file or st.st_size < self.offset:
            self.publish("reset", None)
            self.file, self.offset, self.partial = (st.st_dev, st.st_ino), 0, b""
        if st.st_size == self.offset:
            return
        with open(path, "rb") as f:
            f.seek(self.offset)
            data = self.partial + f.read(st.st_size - self.offset)
        *lines, partial = data.split(b"\n")
        for row in map(metrics_row, lines):
            if row is not None:
                self.publish("row", row)
        self.offset, self.partial = st.st_size, partial  # sent: the next check reads on from here

    def newest_sheets(self) -> None:
        """The newest sheet of each kind (RUN/samples/KIND-NNNNNN.NNN.png: grid, interp, ...)."""
        newest: dict[str, tuple[int, str, Path]] = {}
        for path in (self.dir / "samples").glob("*.png"):
            kind = path.name.rsplit("-", 1)[0]
            newest[kind] = max(newest.get(kind, (0, "", path)), (path.stat().st_mtime_ns, path.name, path))
        for kind, (mtime, name, path) in sorted(newest.items(), key=lambda item: item[1]):
            if self.sheets.get(kind) != (name, mtime):
                self.publish("sheet", (name, path.read_bytes()))
                self.sheets[kind] = (name, mtime)


def _show(lines: Sequence[tuple[str, Any]]) -> None:
    """On the launcher: print rank 0's lines as they arrive (stdout's to stdout, stderr's to stderr)."""
    for kind, line in lines:
        if kind not in ("out", "err"):
            continue  # rows and sample sheets are for a RunHandle
        if kind == "err" and line.startswith(("bigbatch: error: ", STOPPED)):
            continue  # `report` prints the first, naming the rank, as the launcher's one line; it sent the SIGTERM
        stream = sys.stdout if kind == "out" else sys.stderr
        stream.write(line)
        stream.flush()


def report(results: Sequence[RankResult]) -> int:
    """The launcher's exit status (0 if every rank succeeded), and one line on stderr naming the rank
    that failed first of its own accord (not stopped by the launcher), with its own error message."""
    status, message = failure(results)
    if message:
        say(f"bigbatch: error: {message}")
    return status


def _said_stopped(r: RankResult) -> bool:
    """Whether a rank ended on a SIGTERM outside its training loop, saying so (`bigbatch: stopped by SIGTERM`)."""
    return r.returncode == 128 + signal.SIGTERM and r.stderr_tail.rstrip().endswith(STOPPED)


def signalled(r: RankResult) -> bool:
    """Whether a rank was stopped by a SIGTERM from outside the launcher as it started (its training loop takes
    one as a stop of every rank, which then save and exit 0): a stop, not a failure to restart after."""
    return not r.stopped and _said_stopped(r)


def failure(results: Sequence[RankResult]) -> tuple[int, str]:
    """(exit status, "" or what failed): 0 when every rank succeeded or the launcher stopped them and
    rank 0 saved; 130 when an interrupted launch did not end cleanly; else the status of the rank that
    failed first of its own accord (128 + N for one killed by signal N, as a shell says), naming it with
    its own error message."""
    failed = [r for r in results if r.returncode != 0]
    if not failed:
        return 0, ""
    own = [r for r in failed if not r.stopped]
    asked = [r for r in own if signalled(r)]
    if asked:  # (found from outside: a rank's SIGTERM as it started was its failure, and --restarts trained on)
        first = min(asked, key=lambda r: (r.ended, r.rank))
        return first.returncode, (
            f"rank {first.rank} on {first.worker} was stopped by SIGTERM as it started, so every rank stopped "
            "(before the training loop began: nothing new was saved)"
        )
    rank0 = next((r for r in results if r.rank == 0), None)
    if not own and rank0 is not None and rank0.returncode == 0 and all(r.returncode == -signal.SIGTERM for r in failed):
        # Stopped by the launcher: rank 0 saved the checkpoint and exited cleanly; the others took their
        # SIGTERM after their training loop had already ended (the ranks agree to stop on the first signal).
        return 0, ""
    if not own and all(map(_said_stopped, failed)):  # stopped as they started (found
        # from outside: said as "not every rank ended cleanly")
        return 130, "interrupted as the ranks started: they stopped before the training loop began, saving nothing new"
    if not own:  # the launcher was interrupted and stopped them all
        how = ", ".join(f"rank {r.rank}: {(r.stderr_tail.splitlines() or [r.returncode])[-1]}" for r in failed)
        return 130, f"interrupted, and not every rank ended cleanly ({how})"

    def message(r: RankResult) -> str:
        lines = r.stderr_tail.splitlines()
        mine = [line for line in lines if line.startswith("bigbatch: error: ")]
        if mine:
            return mine[-1].removeprefix("bigbatch: error: ")
        if r.returncode < 0:
            return f"killed by signal {-r.returncode}" + (f" ({lines[-1]})" if lines else "")
        return lines[-1] if lines else f"exit status {r.returncode}"

    def blame(r: RankResult) -> int:
        """Its own bigbatch error first, then an end without one (killed, a crash), then a rank that only lost
        contact with another (found from outside: a survivor's was reported for a rank killed by SIGKILL)."""
        errors = [line for line in r.stderr_tail.splitlines() if line.startswith("bigbatch: error: ")]
        if not errors:
            return 1
        return 2 if errors[-1].startswith(f"bigbatch: error: {LOST_PEER}") else 0

    first = min(own, key=lambda r: (blame(r), r.ended, r.rank))
    others = len(failed) - 1
    also = f" ({others} other rank{'s' if others != 1 else ''} failed or stopped too)" if others else ""
    status = first.returncode if first.returncode > 0 else 128 - first.returncode  # (a shell's: 137 for SIGKILL)
    who = "" if len(results) == 1 and first.worker == "local" else f"rank {first.rank} on {first.worker}: "
    return status, f"{who}{message(first)}{also}"  # (one process here: no rank named, found from outside)


def with_restarts(
    session: Callable[[], list[RankResult]],
    restarts: int,
    say: Callable[[str], object],
    stopped: Callable[[], bool] = lambda: False,
) -> tuple[int, str, list[RankResult]]:
    """Run `session` (one launch of every rank) and, after a failure that is not a usage error (a lost
    worker, a crash), again, up to `restarts` more times: its command carries --resume=auto, so the run
    resumes from its latest checkpoint. `say` gets each failure and restart as a line. Returns the last
    launch's (exit status, failure message, ranks' results)."""
    if restarts < 0:
        raise BigbatchError(f"restarts must be a count >= 0, got {restarts}")
    for attempt in range(restarts + 1):
        results = session()
        status, message = failure(results)
        # A usage error (2) would fail again, and an interrupted launch (every rank stopped by the launcher)
        # was meant to stop; a lost worker or a crash (a rank's own failure, whatever its status) gets the
        # group started again.
        own = any(r.returncode != 0 and not r.stopped for r in results)
        if status in (0, 2) or not own or attempt == restarts or stopped() or any(map(signalled, results)):
            return status, message, results
        say(f"bigbatch: error: {message}")
        say(
            f"bigbatch launch: restarting every rank ({attempt + 1} of {restarts}); the run resumes from its "
            "latest checkpoint"
        )
    raise AssertionError("unreachable")


def __getattr__(name: str) -> Any:
    """bigbatch.launch.dask, .ray and .local, imported on first use (each imports its engine), and
    the names they define that this module held before it had them (launch_dask, launch_ray, ray_ranks)."""
    if name in ("dask", "ray", "local", "handle"):
        return importlib.import_module(f"bigbatch.launch.{name}")
    moved = {"launch_dask": "dask", "launch_ray": "ray", "ray_ranks": "ray"}
    if name in moved:
        return getattr(importlib.import_module(f"bigbatch.launch.{moved[name]}"), name)
    raise AttributeError(f"module 'bigbatch.launch' has no attribute '{name}'")
