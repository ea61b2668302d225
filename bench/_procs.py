"""Shared by the benchmarks: their worker processes. Standard library only (DeepFaceLab's workers import
this under another Python).

- `run_limited`: one process at most `limit` seconds, killed whole past it (bench/gpu.py's parts,
  bench/throughput_all.py's cells, bench/gpu_check.py's steps); `result_row`: the row such a process
  wrote, or how it ended.
- `run_in_turns`, `wait_for_turn`: processes that do their untimed work at once and are timed one at a
  time (bench/gpu.py's compile parts).
- `serve` and `Rows`: side-by-side runs against a peer's own code (bench/vs_dfl.py, bench/vs_biggan.py).
  Each row is a worker process that runs one side's iteration when asked. The rows are built at once
  (not timed); then they take one timed iteration each in turn, round after round, the order reversed
  every other round, so that machine load falls on all alike. The figure is the worker's CPU time
  around the iteration.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

PROTO = sys.stdout  # a worker's replies


def run_limited(
    cmd: list[str], limit: float, watch: Callable[[subprocess.Popen], None] | None = None, **popen: Any
) -> tuple[int | None, float]:
    """Run `cmd` for at most `limit` seconds, in a process group of its own (killed whole past the limit,
    a compiler's workers too): (its exit status, or None if it timed out; seconds). `watch(proc)` is
    called every 50 ms while it runs (bench/gpu_check.py signals a training run from there)."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, start_new_session=True, **popen)
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
        if progress.exists():  # how far a compiling part had got (throughput_all.CompileLog)
            p = json.loads(progress.read_text())
            error += f"; at {p['at']:.0f} s: {p['what']}"
        return {"error": error, "seconds": seconds}
    if not result.exists():
        return {"error": f"its process ended with exit status {status}, no result", "seconds": seconds}
    return {**json.loads(result.read_text()), "seconds": seconds}


def run_in_turns(
    cmds: dict[str, list[str]], limit: float, turns: Path, turn_s: float
) -> dict[str, tuple[int | None, float]]:
    """Run processes at once, each doing its untimed work beside the others, then its timed work alone:
    {name: (exit status, or None if cut at the limit; seconds from the common start)}.

    Ready to time, a process (wait_for_turn) writes TURNS/NAME.warm and waits for TURNS/NAME.go. Once
    every process still running is warm, they are let go one at a time, in `cmds`' order, each when the
    one before has ended: none is timed while another works. Only when the time left is less than
    `turn_s` for each warm one is a warm one let go while others still work (its go file says "beside"),
    rather than lose its figure with theirs. All within `limit` seconds: past it, those still running
    are killed (process groups, their workers too)."""
    start, procs, ended = time.perf_counter(), {}, {}
    try:
        for name, cmd in cmds.items():
            procs[name] = subprocess.Popen(cmd, start_new_session=True)
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
    finally:
        for name, proc in procs.items():
            if name not in ended:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
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
