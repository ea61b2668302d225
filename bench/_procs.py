"""Shared by the benchmarks: their worker processes. Standard library only (DeepFaceLab's workers import
this under another Python).

- `run_limited`: one process at most `limit` seconds, killed whole past it (bench/gpu.py's parts,
  bench/throughput_all.py's cells, bench/gpu_check.py's steps); `result_row`: the row such a process
  wrote, or how it ended.
- `run_in_turns`, `wait_for_turn`: processes that do their untimed work at once and are timed one at a
  time (bench/gpu.py's compile parts).
- `ForkServer`: processes started as forks of one Python that has done their imports (torch, bigbatch:
  seconds of start-up a process), for the CPU dry runs of bench/gpu.py and bench/gpu_check.py, where
  that start-up was most of what each process did; `run_limited` and `run_in_turns` start them through
  its `popen`. Not for a GPU run: each of its processes sets up CUDA for itself.
- `serve` and `Rows`: side-by-side runs against a peer's own code (bench/vs_dfl.py, bench/vs_biggan.py).
  Each row is a worker process that runs one side's iteration when asked. The rows are built at once
  (not timed); then they take one timed iteration each in turn, round after round, the order reversed
  every other round, so that machine load falls on all alike. The figure is the worker's CPU time
  around the iteration.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import select
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

PROTO = sys.stdout  # a worker's replies


def run_limited(
    cmd: list[str],
    limit: float,
    watch: Callable[[subprocess.Popen], None] | None = None,
    popen: Callable[..., Any] = subprocess.Popen,
    **options: Any,
) -> tuple[int | None, float]:
    """Run `cmd` for at most `limit` seconds, in a process group of its own (killed whole past the limit,
    a compiler's workers too): (its exit status, or None if it timed out; seconds). `watch(proc)` is
    called every 50 ms while it runs (bench/gpu_check.py signals a training run from there). `popen`:
    what starts it (subprocess.Popen, or a ForkServer's popen), given `options`."""
    t = time.perf_counter()
    proc = popen(cmd, start_new_session=True, **options)
    try:
        if watch is None:
            proc.wait(timeout=limit)
        while watch is not None and proc.poll() is None:
            if time.perf_counter() - t > limit:
                raise subprocess.TimeoutExpired(cmd, limit)
            watch(proc)
            time.sleep(0.05)
    except BaseException as e:  # the time limit, or Ctrl-C (which reaches this process only)
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if not isinstance(e, subprocess.TimeoutExpired):
            raise
        return None, time.perf_counter() - t
    return proc.returncode, time.perf_counter() - t


def result_row(result: Path, progress: Path, status: int | None, seconds: float, limit: float) -> dict:
    """The row (JSON) a benchmark's part wrote to `result`, with its `seconds`; or an error saying how its
    process ended: cut at `limit` (status None; with how far it had got, if it wrote `progress`), or
    without a result."""
    if status is None:
        error = f"timed out after {limit:.0f} s"
        if progress.exists():  # how far a part had got (throughput_all.CompileLog, gpu.cuda_tests)
            try:
                p = json.loads(progress.read_text())
                error += f"; at {p['at']:.0f} s: {p['what']}"
            except (ValueError, KeyError, TypeError):  # (a writer of another kind: said, not raised)
                error += "; its progress file unreadable"
        return {"error": error, "seconds": seconds}
    if not result.exists():
        return {"error": f"its process ended with exit status {status}, no result", "seconds": seconds}
    return {**json.loads(result.read_text()), "seconds": seconds}


def run_in_turns(
    cmds: dict[str, list[str]],
    limit: float,
    turns: Path,
    turn_s: float,
    popen: Callable[..., Any] = subprocess.Popen,
) -> dict[str, tuple[int | None, float]]:
    """Run processes at once, each doing its untimed work beside the others, then its timed work alone:
    {name: (exit status, or None if cut at the limit; seconds from the common start)}.

    Ready to time, a process (wait_for_turn) writes TURNS/NAME.warm and waits for TURNS/NAME.go. Once
    every process still running is warm, they are let go one at a time, in `cmds`' order, each when the
    one before has ended: none is timed while another works. Only when the time left is less than
    `turn_s` for each warm one is a warm one let go while others still work (its go file says "beside"),
    rather than lose its figure with theirs. All within `limit` seconds: past it, those still running
    are killed (process groups, their workers too). `popen`: as run_limited's."""
    start, procs, ended = time.perf_counter(), {}, {}
    try:
        for name, cmd in cmds.items():
            procs[name] = popen(cmd, start_new_session=True)
        timing = None
        while len(ended) < len(procs) and time.perf_counter() - start < limit:
            for name, proc in procs.items():
                if name not in ended and proc.poll() is not None:
                    ended[name] = (proc.returncode, time.perf_counter() - start)
            running = [n for n in procs if n not in ended]
            timing = None if timing in ended else timing
            warm = [n for n in running if (turns / f"{n}.warm").exists()]
            late = limit - (time.perf_counter() - start) < turn_s * len(warm)
            if timing is None and warm and (len(warm) == len(running) or late):
                timing = warm[0]
                go = turns / f"{timing}.go"
                go.with_suffix(".tmp").write_text("alone" if len(warm) == len(running) else "beside")
                go.with_suffix(".tmp").rename(go)
            time.sleep(0.05)
    finally:  # (all killed, then waited for: each CUDA context's teardown beside the others')
        for name, proc in procs.items():
            if name not in ended:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for name, proc in procs.items():
            if name not in ended:
                proc.wait()
    seconds = time.perf_counter() - start
    return {name: ended.get(name, (None, seconds)) for name in cmds}


def wait_for_turn(turns: Path, name: str) -> bool:
    """In a process run by run_in_turns: say that it is warm, then wait until it may time. Whether no
    other process works meanwhile."""
    (turns / f"{name}.warm").touch()
    go = turns / f"{name}.go"
    while not go.exists():
        time.sleep(0.05)
    return go.read_text() == "alone"


class ForkServer:
    """Starts `python ARGS...` processes (`popen([sys.executable, *ARGS], ...)`, as subprocess.Popen takes
    them) as forks of one Python that has imported `preload`: each runs ARGS (a script, `-m MODULE` or `-c
    CODE`) as a new Python would, in the same environment, folder, session and files, but without paying
    the imports again. For CPU runs only: a fork can't have a CUDA context of its own. A context manager;
    on exit the server ends once its processes have.

    The server is a child of this process, single-threaded, that forks on request; each request carries
    the process's stdout and stderr and a pipe (file descriptors over a Unix socket) on which the server
    writes the new process's pid, then its exit status once it has reaped it."""

    def __init__(self, preload: list[str], env: dict[str, str] | None = None):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cmd = [sys.executable, __file__, "--serve-forks", str(theirs.fileno()), *preload]
        self.server = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL)
        theirs.close()
        self.socket, self.lock = ours, threading.Lock()
        if ours.recv(16) != b"ready":  # (its imports failed: it printed why)
            self.server.wait()
            raise RuntimeError(f"the fork server ended with exit status {self.server.returncode} before it was ready")

    def popen(
        self,
        cmd: list[str],
        start_new_session: bool = False,
        stdout: Any = None,
        stderr: Any = None,
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike | None = None,
    ) -> Forked:
        """As subprocess.Popen(cmd, ...) with these keywords (stdout, stderr: None, a file, a descriptor,
        subprocess.DEVNULL; stderr also subprocess.STDOUT)."""
        if cmd[0] != sys.executable:
            raise ValueError(f"a fork server runs this Python ({sys.executable}), not {cmd[0]}")
        if subprocess.PIPE in (stdout, stderr):
            raise ValueError("a fork server's process writes to files, not pipes to this process")
        stderr = stdout if stderr == subprocess.STDOUT else stderr
        fds = [1 if stdout is None else stdout, 2 if stderr is None else stderr]  # (None: this process's, as Popen)
        fds = [os.open(os.devnull, os.O_WRONLY) if fd == subprocess.DEVNULL else fd for fd in fds]
        fds = [fd if isinstance(fd, int) else fd.fileno() for fd in fds]
        for f in (sys.stdout, sys.stderr, stdout, stderr):
            if f is not None and not isinstance(f, int):
                f.flush()
        request = {"argv": cmd[1:], "env": dict(os.environ if env is None else env), "cwd": str(cwd or os.getcwd())}
        request["session"] = start_new_session
        read, write = os.pipe()
        try:
            with self.lock:
                socket.send_fds(self.socket, [json.dumps(request).encode()], [*fds, write])
        finally:
            os.close(write)
            for fd, given in zip(fds, (stdout, stderr)):
                if given == subprocess.DEVNULL:
                    os.close(fd)
        return Forked(cmd, read)

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.socket.close()  # the server ends once its processes have
        self.server.wait()


class Forked:
    """A ForkServer's process, as much of subprocess.Popen as run_limited and run_in_turns use: pid, poll,
    wait, returncode."""

    def __init__(self, args: list[str], status: int):
        self.args, self.returncode, self._status, self._said = args, None, status, b""
        while self._said.count(b"\n") < 1:
            self._read(None)
        self.pid = int(self._said.split(b"\n")[0])

    def _read(self, timeout: float | None) -> None:
        if self._status is not None and select.select([self._status], [], [], timeout)[0]:
            more = os.read(self._status, 64)
            self._said += more
            if not more:  # the server is gone without saying how it ended
                os.close(self._status)
                self._status = None
                if self._said.count(b"\n") < 2:
                    self._said += b"\n" * (1 - self._said.count(b"\n")) + b"255\n"

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(0)
            if self._said.count(b"\n") >= 2:
                self.returncode = int(self._said.split(b"\n")[1])
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._read(left)
        return self.returncode


def serve_forks(fd: int, preload: list[str]) -> None:
    """The fork server's loop (ForkServer): import `preload`, then fork a process per request on socket `fd`
    and report how each ended; once the socket is closed, wait for the processes left and end."""
    before = dict(os.environ)
    for name in preload:
        importlib.import_module(name)
    # What the imports set in the environment (bigbatch sets PYTORCH_CUDA_ALLOC_CONF): set where not given.
    imported = {k: v for k, v in os.environ.items() if before.get(k) != v}
    server = socket.socket(fileno=fd)
    server.send(b"ready")
    children, open_ = {}, True
    while open_ or children:
        if open_ and select.select([server], [], [], 0.05)[0]:
            message, fds, _, _ = socket.recv_fds(server, 1 << 20, 3)
            if not message:
                open_ = False
            else:
                request, (out, err, status) = json.loads(message), fds
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        server.close()
                        for fd_ in [*children.values(), status]:
                            os.close(fd_)
                        code = _forked(request, out, err, imported)
                    except BaseException:  # noqa: BLE001 -- (it could not become the process asked for)
                        traceback.print_exc()
                    finally:
                        os._exit(code)
                os.close(out)
                os.close(err)
                os.write(status, f"{pid}\n".encode())
                children[pid] = status
        elif not open_:
            time.sleep(0.05)
        while children:
            pid, how = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            os.write(children[pid], f"{os.waitstatus_to_exitcode(how)}\n".encode())
            os.close(children.pop(pid))


def _forked(request: dict, out: int, err: int, imported: dict[str, str]) -> int:
    """In a forked process: become `python ARGV...` in the request's session, files, environment and folder,
    run it, and return its exit status as Python would."""
    import atexit

    if request["session"]:
        os.setsid()
    for number in signal.valid_signals():  # a new Python's handlers (the server's own imports may set some)
        handler = signal.getsignal(number)
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(number, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDONLY)
    for fd, to in ((devnull, 0), (out, 1), (err, 2)):
        os.dup2(fd, to)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update({**imported, **request["env"]})
    if "numpy" in sys.modules:  # (a new Python seeds it afresh; forks would all draw the same numbers)
        sys.modules["numpy"].random.seed()
    argv, status = request["argv"], 0
    try:
        if argv[0] == "-m":
            sys.argv, sys.path[0] = argv[1:], os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv, sys.path[0] = ["-c", *argv[2:]], ""
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv, sys.path[0] = argv, os.path.dirname(os.path.realpath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            status = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            status = 1
    except BaseException:  # noqa: BLE001 -- as Python does at the top: the traceback, exit status 1
        traceback.print_exc()
        status = 1
    atexit._run_exitfuncs()
    for f in (sys.stdout, sys.stderr):
        with suppress(Exception):
            f.flush()
    return status & 0xFF


BEFORE_HELP = (
    "a checkout of bigbatch from before a change (e.g. `git worktree add /tmp/before HEAD~1`): its bigbatch "
    "rows too, alternating with the others, for before/after ratios measured in the same sitting"
)


def before_command(checkout: str, script: str, args: list[str]) -> list[str]:
    """The command of a worker run from another checkout of bigbatch (its own script, importing its own
    bigbatch): `script` is the benchmark's path inside the repository, e.g. "bench/vs_dfl.py"."""
    root = Path(checkout).resolve()
    return ["env", f"PYTHONPATH={root}", sys.executable, str(root / script), *args]


def become_worker() -> None:
    """In a worker, first: its replies go to the original stdout, everything else printed to stderr (its log)."""
    global PROTO
    PROTO = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)


def serve(step: Callable[[], Any], warmup: int, ready: dict | None = None, commands: dict | None = None) -> None:
    """Worker loop: `warmup` untimed iterations, then "ready" (with `ready`'s items); per stdin line "step"
    one timed iteration ({"cpu", "wall"} seconds), per "NAME ARG..." of `commands` its reply
    (`commands[NAME](*ARGS)`, a dict); anything else ends it."""
    for _ in range(warmup):
        step()
    PROTO.write(json.dumps({"ready": True, **(ready or {})}) + "\n")
    for line in sys.stdin:
        cmd, *args = line.split() or [""]
        if cmd == "step":
            c, t = time.process_time(), time.perf_counter()
            step()
            PROTO.write(json.dumps({"cpu": time.process_time() - c, "wall": time.perf_counter() - t}) + "\n")
        elif commands and cmd in commands:
            PROTO.write(json.dumps(commands[cmd](*args)) + "\n")
        else:
            break


class Rows:
    """The workers of a side-by-side run: `commands` maps each row's key to (command line, log file)."""

    def __init__(self, commands: dict[Any, tuple[list[str], Path]], env: dict[str, str]):
        self.logs = {key: log for key, (_, log) in commands.items()}
        self.workers = {}
        for key, (cmd, log) in commands.items():  # built at once (not timed); timed one at a time
            with open(log, "w") as out:
                self.workers[key] = subprocess.Popen(
                    cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=out, text=True, env=env
                )
        self.times: dict[Any, list[dict]] = {key: [] for key in commands}

    def __enter__(self) -> Rows:
        return self

    def __exit__(self, *exc: Any) -> None:
        for w in self.workers.values():
            if w.poll() is None:
                w.kill()

    def ask(self, key: Any, line: str = "") -> dict:
        """Send `line` (if any) to row `key`'s worker; its reply."""
        if line:
            self.workers[key].stdin.write(line + "\n")
            self.workers[key].stdin.flush()
        reply = self.workers[key].stdout.readline()
        if not reply:
            raise SystemExit(f"worker {key} ended; see its log {self.logs[key]}")
        return json.loads(reply)

    def rounds(self, steps: int) -> None:
        """`steps` timed iterations of every row, alternating; progress to stderr."""
        keys = list(self.workers)
        for i in range(steps):
            for key in keys if i % 2 == 0 else keys[::-1]:
                self.times[key].append(self.ask(key, "step"))
                print(f"  round {i + 1} {key}: {self.times[key][-1]['cpu']:.3f} CPU s", file=sys.stderr, flush=True)

    def close(self) -> None:
        for w in self.workers.values():
            w.stdin.close()
            w.wait()

    def stats(self, key: Any) -> tuple[float, float, float]:
        """Row `key`'s (min, median) CPU seconds an iteration, and its CPU/wall ratio."""
        cpu = [t["cpu"] for t in self.times[key]]
        return min(cpu), statistics.median(cpu), sum(cpu) / sum(t["wall"] for t in self.times[key])


if __name__ == "__main__" and sys.argv[1:2] == ["--serve-forks"]:
    serve_forks(int(sys.argv[2]), sys.argv[3:])
