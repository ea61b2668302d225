"""Shared by the benchmarks: their worker processes. Standard library only (DeepFaceLab's workers import
this under another Python).

- `run_limited`: one process at most `limit` seconds, killed whole past it (bench/gpu.py's parts,
  bench/throughput_all.py's cells).
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


def run_limited(cmd: list[str], limit: float, **popen: Any) -> tuple[int | None, float]:
    """Run `cmd` for at most `limit` seconds, in a process group of its own (killed whole past the limit,
    a compiler's workers too): (its exit status, or None if it timed out; seconds)."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, start_new_session=True, **popen)
    try:
        proc.wait(timeout=limit)
    except BaseException as e:  # the time limit, or Ctrl-C (which reaches this process only)
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if not isinstance(e, subprocess.TimeoutExpired):
            raise
        return None, time.perf_counter() - t
    return proc.returncode, time.perf_counter() - t


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
