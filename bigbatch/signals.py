"""Stop signals: SIGINT and SIGTERM ask the training loop to save a checkpoint and stop (bigbatch.Stopped)."""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bigbatch.errors import silence


class Terminated(BaseException):
    """SIGTERM to a command outside training (which saves a checkpoint on it instead)."""


class Stopped(KeyboardInterrupt):
    """`bigbatch.train` stopped by Ctrl-C or SIGTERM, once it saved where it was (its last line says so): `run` is the
    run directory, which bigbatch.train(cfg, run_dir=run, resume=True) continues. A KeyboardInterrupt, so that what
    follows it in a script or a notebook's cell does not run on an unfinished run (found from outside: it returned
    as a finished run does); `bigbatch train` exits 0 on it, its checkpoint saved."""

    def __init__(self, run: Any, how: str = ""):
        how = how or f"continue with bigbatch.train(cfg, run_dir={str(run)!r}, resume=True)"
        super().__init__(f"stopped by a signal; {how}")
        self.run = run


STOPPING = (
    "bigbatch: stopping: a checkpoint is saved at the run's next safe point, as the step under way ends ({} stops at "
    "once, losing what trained since the last checkpoint)\n"
)


class StopRequest:
    requested = False
    """A stop was asked for: the loop saves a checkpoint and stops (bigbatch.Stopped)."""
    armed = False
    """The loop runs (a first SIGINT asks it to stop); before, during start-up, SIGINT stops at once."""


class EvaluationStopped(Exception):
    """A stop was asked for while one process evaluated during training: the loop saves at once and the
    resumed run evaluates (several processes finish the evaluation first: their collectives must meet)."""


class StartupStopped(EvaluationStopped):
    """A stop was asked for while `bigbatch train` started (one process), in the reference statistics: the run ends
    there, before its first step, their sums kept (metrics.features.moments_sharded) for its next start."""


_LOCAL = threading.local()  # .stops: the stop requests of the training loops under way in this thread


def check_stop(starting: bool = True) -> None:
    """Raise EvaluationStopped if the training loop under way was asked to stop (between batches of a
    long evaluation, where waiting for its end could outlast a scheduler's grace period), StartupStopped if before
    its first step (not with `starting` False: work that would be lost, not kept). In one process only: several
    finish the evaluation, their collectives must meet."""
    stops = getattr(_LOCAL, "stops", None)
    if stops and stops[-1].requested and (starting or stops[-1].armed):  # (starting: in its reference statistics)
        from bigbatch.engine import dist

        if not dist.active():
            raise EvaluationStopped if stops[-1].armed else StartupStopped


def request_stop() -> None:
    """Ask the training loop under way in this thread to save where it is and stop, as SIGTERM does."""
    for stop in getattr(_LOCAL, "stops", [])[-1:]:
        stop.requested = True


_PENDING: list[int] = []  # SIGTERMs kept during `bigbatch train`'s start-up, for its loop


def starts_a_run(argv: list[str]) -> bool:
    """Whether `bigbatch ARGV` starts a training run of one process (not a rank of several, not a dry run), whose
    start-up keeps a SIGTERM for its loop (keep_sigterm_for_the_loop), from its first moment."""
    alone = os.environ.get("WORLD_SIZE", "1") == "1" and not os.environ.get("BIGBATCH_LAUNCH_PARENT")
    return alone and argv[:1] == ["train"] and "--dry-run" not in argv


def take_sigterm(argv: list[str], terminate: Callable[[int, object], None]) -> Any:
    """SIGTERM's handler through `bigbatch ARGV`: a run's start-up keeps it for the loop (starts_a_run); any other
    command stops on it (`terminate`). Returns the handler before."""
    old = signal.getsignal(signal.SIGTERM)
    if starts_a_run(argv):
        keep_sigterm_for_the_loop()
    else:
        signal.signal(signal.SIGTERM, terminate)
    return old


def hear_sigint() -> Any:
    """SIGINT heard in the main thread where it was ignored (a script's background job starts so: found from
    outside, `kill -INT` of a background prepare was ignored, and one in the seconds torch took to import too); the
    handler before, or None outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return None
    old = signal.getsignal(signal.SIGINT)
    if old is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return old


def keep_sigterm_for_the_loop() -> None:
    """`bigbatch train`'s start-up (imports, data, models) until its loop takes the signals: a SIGTERM is kept
    rather than ending the process with status 143, and the loop, once it starts, saves (at step 0) and
    returns, exit status 0, as for a SIGTERM a moment later. A forked process ends on it as usual."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, _in_this_process(_PENDING.append))


def _in_this_process(act: Callable[[int], None]) -> Callable[[int, object], None]:
    """A signal handler that does `act(signum)` in this process; in a process forked from it, which inherited the
    handler, the signal's default (it ends there as usual)."""
    pid = os.getpid()

    def handler(signum: int, frame: object) -> None:
        if os.getpid() != pid:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        act(signum)

    return handler


def _raise_terminated(signum: int) -> None:
    raise Terminated


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Where SIGTERM would end the process without a word (Python's default: a script, not the CLI, which raises
    Terminated itself), raise Terminated on it instead, so that what stops can say so and keep its work (a sweep's
    table: found from outside, SIGTERM to `python search.py` wrote none). A forked process ends on it as usual."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _in_this_process(_raise_terminated))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def interrupt_at_once() -> Iterator[None]:
    """While the command's heavy modules import (torch, scipy): Ctrl-C ends the process at once, status
    130, having written nothing. A KeyboardInterrupt raised inside an import leaves modules half made
    (NumPy then recursed to a RecursionError), or inside C++ code that called Python, aborts the process."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pid = os.getpid()

    def now(signum: int, frame: object) -> None:
        if os.getpid() != pid:  # a forked process that inherited this handler
            raise KeyboardInterrupt
        os.write(2, b"bigbatch: interrupted\n")
        os._exit(128 + signal.SIGINT)

    before = signal.signal(signal.SIGINT, now)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@contextmanager
def stop_signals() -> Iterator[StopRequest]:
    """SIGTERM sets `requested` (the loop checkpoints and returns); so does SIGINT once `armed`. A SIGINT
    before that, or a second one, raises KeyboardInterrupt (stop at once).
    Outside the main thread, where Python cannot take signals, nothing is installed."""
    stop = StopRequest()
    if _PENDING:  # a SIGTERM during start-up
        stop.requested = True
        _PENDING.clear()
    stops = _LOCAL.__dict__.setdefault("stops", [])
    stops.append(stop)
    try:
        if threading.current_thread() is not threading.main_thread():
            yield stop
            return
        with _handled(stop):
            yield stop
    finally:
        stops.remove(stop)


@contextmanager
def _handled(stop: StopRequest) -> Iterator[None]:
    """SIGINT and SIGTERM handled for `stop` (in the main thread), as they were afterwards; SIGHUP as SIGTERM, unless
    ignored (nohup: the run goes on), found from outside: a closed ssh session's run ended with nothing saved."""

    def handler(signum, frame):
        if os.getpid() != pid:  # (a data worker forked with it: its parent stops it; found from outside, the line
            return  # said once a worker, of one Ctrl-C to the terminal's process group)
        if signum == signal.SIGINT and (stop.requested or not stop.armed):
            raise KeyboardInterrupt
        said = stop.requested or not stop.armed or os.environ.get("RANK", "0") != "0"
        stop.requested = True  # (first: a line that cannot be written must not keep the stop from being asked)
        if signum in hangup:  # (its terminal gone: what is printed there from here would fail; found by review; a
            silence(*terminals)  # file or pipe still takes it: found from outside)
        elif not said:  # (found from outside: a step of 512 micro-batches took minutes to end, without a word)
            try:
                again = "a second Ctrl-C" if signum == signal.SIGINT else "a Ctrl-C"  # (found from outside: said to
                os.write(2, STOPPING.format(again).encode())  # a SIGTERM too)
            except OSError:  # (its reader gone: `2>&1 | tee` closed by the same Ctrl-C, found by review)
                silence(2)

    hangup = [signal.SIGHUP] if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) != signal.SIG_IGN else []
    pid = os.getpid()
    terminals = [fd for fd in (1, 2) if os.isatty(fd)]  # (now: a hung-up terminal is no tty by the time of its SIGHUP)
    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM, *hangup)}
    try:
        yield
    finally:
        # The process exits next (the command line's run), saved: a SIGTERM from here on cannot stop anything, and
        # must not make its status 143 (found from outside: a scheduler's second SIGTERM while a stopped run exited,
        # and a SIGTERM in the second a finished run took to exit after "Done:").
        if EXITING_AFTER[0]:
            old[signal.SIGTERM] = signal.SIG_IGN
        for s, h in old.items():
            signal.signal(s, h)
        ignore_late_sigterm()


EXITING_AFTER = [False]  # set by the command line: the process ends when its training does


def restore_sigterm(old: Any, exits: bool) -> None:
    """The handler of SIGTERM from before a command put back as it ends; but where the process `exits` next after
    a run, SIGTERM stays ignored (_handled)."""
    ended = signal.getsignal(signal.SIGTERM) == signal.SIG_IGN and EXITING_AFTER[0]
    if not (ended and exits):
        signal.signal(signal.SIGTERM, old)
    EXITING_AFTER[0] = False


def ignore_late_sigterm() -> None:
    """In a rank a bigbatch launcher started, once its training has ended: SIGTERM ignored from here
    to its exit. The launcher signals every rank when it stops a run, but the ranks agree to stop on
    the first signal any of them gets, so another rank's signal can arrive while this one writes its
    last lines or exits; it must not turn a clean, saved stop into an exit by signal. (A rank that
    hangs on its way out is still killed after the launcher's grace period.)"""
    if os.environ.get("BIGBATCH_LAUNCH_PARENT") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def die_with_parent(parent: int, sig: int = signal.SIGKILL) -> None:
    """In a helper process (a pool's worker): get `sig` (default SIGKILL) when the thread that started it
    ends, its parent killed with SIGKILL included (Linux's PR_SET_PDEATHSIG; elsewhere nothing), rather
    than live on orphaned; exit at once if `parent` (its PID) has already gone before this took hold."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(sig))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not glibc
        return
    if os.getppid() != parent:
        os._exit(1)


class _Forks:
    """The forking() blocks under way in this process, and whether the outermost froze (none of the caller's was)."""

    lock = threading.Lock()
    depth = 0
    froze = False


@contextmanager
def forking() -> Iterator[None]:
    """Around the start of worker processes forked from this one (a DataLoader's, prepare's pool): the objects
    the garbage collector tracks frozen, then thawed. A fork inherits what this process left for the collector,
    and a collection in the fork frees it there: a CUDA tensor freed in a fork aborts the fork, where CUDA cannot
    run ("CUDA error: initialization error"; found on a GPU: a loader's worker killed by SIGABRT as a second
    loader started, the first's batches on the device waiting for the collector). Frozen, the forks' collectors
    never look at them; this process's does again once the workers have started (nested and concurrent uses thaw
    at the last one's end). Where the caller has frozen objects of its own (for copy-on-write) nothing is done: a
    freeze here would keep all made since from the collector for good, and a thaw would undo the caller's.
    What a fork frees by reference count is not covered: the values other threads hold in threading.local()s
    and the exceptions they are handling go in the fork (so no device tensor is kept in either)."""
    entered = False
    try:
        with _Forks.lock:
            if _Forks.depth == 0:
                _Forks.froze = gc.get_freeze_count() == 0
                if _Forks.froze:
                    gc.freeze()
            _Forks.depth += 1
            entered = True
        yield
    finally:
        with _Forks.lock:
            _Forks.depth -= entered
            if entered and _Forks.depth == 0 and _Forks.froze:
                gc.unfreeze()
