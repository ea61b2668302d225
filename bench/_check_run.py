"""bench/gpu_check.py's machinery: a step (one command, its time limit, the steps it needs, what its row
checks), running steps under bench/_peak.py with limits and a budget, the checks (losses finite,
checkpoints equal to the bit), and the dated section for bench/RESULTS.md."""

from __future__ import annotations

import datetime
import json
import math
import re
import shlex
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _gpu_report import provenance
from _procs import run_limited

from bigbatch.engine.memory import format_bytes

BENCH = Path(__file__).resolve().parent
PEAK = BENCH / "_peak.py"


class CheckFailed(Exception):
    """The command ran, but what its row checks does not hold."""


@dataclass
class Step:
    name: str
    argv: list[str]
    """What runs under bench/_peak.py: ["-m", "bigbatch", "train", ...] or [SCRIPT, ...]."""
    limit: float
    """Seconds it may take (killed past it, with its children)."""
    needs: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    """Steps it waits for, whatever their result (it reads what each made, and says what is missing)."""
    run: Path | None = None
    """A run directory whose metrics.jsonl must hold losses, every one finite."""
    check: Callable[[str], str] | None = None
    """Given the command's output: the row's note, or CheckFailed."""
    watch: Callable[[Any], None] | None = None
    """Called every 50 ms while it runs, with its process (e.g. to signal it)."""
    call: Callable[[], str] | None = None
    """Instead of a command, a function of this process (making the data): its note."""
    note: str = ""
    cwd: Path | None = None
    shown: str = ""
    """The command as the table shows it (default: argv, `-m bigbatch` as `bigbatch`)."""
    status: int | None = field(default=None, repr=False)


def shown(step: Step, work: Path) -> str:
    if step.shown:
        return step.shown
    argv = ["bigbatch", *step.argv[2:]] if step.argv[:2] == ["-m", "bigbatch"] else ["python", *step.argv]
    return shlex.join(argv).replace(f"{work}/", "").replace(str(BENCH.parent) + "/", "")


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def finite_losses(run: Path) -> str:
    """Every loss the run logged (keys with "loss" in them, but fp16's loss scales) is finite: a summary."""
    rows = metrics(run)
    losses = [(r["kimg"], k, v) for r in rows for k, v in r.items() if "loss" in k and not k.startswith("loss_scale")]
    if not losses:
        raise CheckFailed(f"no losses logged in {run.name}/metrics.jsonl ({len(rows)} rows)")
    bad = [
        f"{k} {v} at kimg {kimg:g}" for kimg, k, v in losses if not (isinstance(v, float | int) and math.isfinite(v))
    ]
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise CheckFailed(f"non-finite losses: {', '.join(bad[:3])}{more}")
    last = {k: v for _, k, v in losses}
    return f"{len(losses)} finite in {len(rows)} rows; last " + ", ".join(f"{k} {v:.3g}" for k, v in last.items())


def final_checkpoint(run: Path) -> Path:
    return run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()


def same_checkpoints(a: Path, b: Path) -> str:
    """The final checkpoints of runs `a` and `b` hold the same safetensors files, byte for byte."""
    ca, cb = final_checkpoint(a), final_checkpoint(b)
    if ca.name != cb.name:
        raise CheckFailed(f"the runs ended at other checkpoints: {ca.name} and {cb.name}")
    names = sorted(p.name for p in ca.glob("*.safetensors"))
    if not names or names != sorted(p.name for p in cb.glob("*.safetensors")):
        raise CheckFailed(f"other files: {names} and {sorted(p.name for p in cb.glob('*.safetensors'))}")
    differ = [n for n in names if (ca / n).read_bytes() != (cb / n).read_bytes()]
    if differ:
        from safetensors.torch import load_file

        worst = []
        for n in differ:
            x, y = load_file(ca / n), load_file(cb / n)
            gap = max(((x[k].double() - y[k].double()).abs().max().item() for k in x if k in y), default=math.nan)
            worst.append(f"{n} (max |difference| {gap:.2g})")
        raise CheckFailed(f"checkpoint {ca.name}: {', '.join(worst)} differ from the uninterrupted run's")
    size = sum((ca / n).stat().st_size for n in names)
    return f"checkpoint {ca.name}: {', '.join(names)} ({format_bytes(size)}) identical to the bit"


def why_it_failed(output: str) -> str:
    """The line of a failed command's output that says why: its last that names an error or failure (a
    traceback's last line, pytest's summary, bench/_exported.py's FAILED line), else its last."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    named = [line for line in lines if re.search(r"error|fail", line, re.I) and not line.startswith("File ")]
    return (named or lines or ["no output"])[-1]


def run_step(
    step: Step,
    work: Path,
    env: dict[str, str],
    limit: float,
    popen: Callable[..., Any] = subprocess.Popen,
    stop: threading.Event | None = None,
) -> dict:
    """Run one step; its row: command, seconds, peak memory, losses, passed, note (or why it failed).
    `popen`: what starts its process (subprocess.Popen, or a _procs.ForkServer's popen); `stop`, once set, ends
    it (its process group killed)."""

    def watch(proc: Any) -> None:
        if stop is not None and stop.is_set():
            raise CheckFailed("stopped by a signal")
        if step.watch is not None:
            step.watch(proc)

    row: dict[str, Any] = {"command": shown(step, work), "passed": False}
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    log, peak_file = logs / f"{step.name}.log", logs / f"{step.name}.peak.json"
    t = time.perf_counter()
    try:
        if step.call is not None:
            row["note"] = step.call()
            row["seconds"] = time.perf_counter() - t
        else:
            cmd = [sys.executable, str(PEAK), str(peak_file), *step.argv]
            with open(log, "w") as out:
                status, row["seconds"] = run_limited(
                    cmd, limit, watch, popen, stdout=out, stderr=out, env=env, cwd=step.cwd or work
                )
            if peak_file.exists():
                peak = json.loads(peak_file.read_text())
                row["peak"], row["gpu"] = peak.get("cuda_allocated", peak["rss"]), "cuda_allocated" in peak
                row["device"] = peak.get("device")
            output = log.read_text(errors="replace")
            if status is None:
                raise CheckFailed(f"timed out after {limit:.0f} s; log: {log}")
            if status != 0:
                raise CheckFailed(f"exit status {status}: {why_it_failed(output)[:300]}; log: {log}")
            if step.run is not None:
                row["losses"] = finite_losses(step.run)
            row["note"] = " ".join(n for n in (step.check(output) if step.check else "", step.note) if n)
        row["passed"] = True
    except Exception as e:  # noqa: BLE001 -- any failure is the step's result, reported in its row
        if not isinstance(e, CheckFailed):
            traceback.print_exc()
        row["error"] = first_line(e)
        row.setdefault("seconds", time.perf_counter() - t)
        if step.run is not None and "losses" not in row and (step.run / "metrics.jsonl").exists():
            try:
                row["losses"] = finite_losses(step.run)
            except CheckFailed as bad:
                row["losses"] = f"**{bad}**"
    return row


def run_steps(
    steps: list[Step],
    work: Path,
    env: dict[str, str],
    budget: float,
    jobs: int,
    popen: Callable[..., Any] = subprocess.Popen,
    stop: threading.Event | None = None,
    min_left: float = 10,
) -> dict[str, dict]:
    """Every step in order, at most `jobs` at once, each once the steps it needs have passed, within `budget`
    seconds in all (none started with less than `min_left` left); their rows by name. Progress lines go to stderr
    as each step starts and ends. `popen`: run_step's; `stop`, once set, ends the steps under way and starts no
    more (their rows say so)."""
    start, rows, done = time.perf_counter(), {}, {s.name: threading.Event() for s in steps}
    lock = threading.Lock()

    def say(text: str) -> None:
        with lock:
            print(f"[gpu_check {time.perf_counter() - start:5.0f} s] {text}", file=sys.stderr, flush=True)

    def one(step: Step) -> None:
        try:
            for need in (*step.needs, *step.after):
                done[need].wait()
            failed = [n for n in step.needs if not rows[n]["passed"]]
            left = budget - (time.perf_counter() - start)
            if failed or left < min_left or stop is not None and stop.is_set():
                why = f"needs {', '.join(failed)}, which failed" if failed else f"the {budget:.0f} s budget was spent"
                why = "stopped by a signal" if stop is not None and stop.is_set() else why
                rows[step.name] = {"command": shown(step, work), "passed": False, "error": f"not run: {why}"}
                say(f"{step.name}: not run: {why}")
                return
            limit = min(step.limit, left)
            say(f"{step.name}: start (at most {limit:.0f} s): {shown(step, work)}")
            rows[step.name] = row = run_step(step, work, env, limit, popen, stop)
            verdict = "pass" if row["passed"] else f"FAIL: {row['error']}"
            say(f"{step.name}: {verdict} ({row['seconds']:.1f} s)")
        finally:
            done[step.name].set()

    # Submitted in order, each waiting only on steps submitted before it: a worker never waits on a step
    # that no worker has taken.
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for f in [pool.submit(one, s) for s in steps]:
            f.result()
    return {s.name: rows[s.name] for s in steps}


def table(rows: dict[str, dict]) -> str:
    lines = ["| step | command | s | peak memory | losses | result |", "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        peak = "-" if r.get("peak") is None else format_bytes(r["peak"]) + ("" if r.get("gpu") else " RSS")
        result = "pass" + (f": {r['note']}" if r.get("note") else "") if r["passed"] else f"**FAIL: {r['error']}**"
        seconds = "-" if r.get("seconds") is None else f"{r['seconds']:.1f}"
        cells = [name, f"`{r['command']}`", seconds, peak, r.get("losses", "-"), result]
        lines.append("| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in cells) + " |")
    return "\n".join(lines)


def section(rows: dict[str, dict], device: str, dry_run: bool, seconds: float, command: str, notes: list[str]) -> str:
    """The dated section appended to bench/RESULTS.md: heading, provenance, the table, what it measured."""
    title = f"## GPU check, {datetime.date.today().isoformat()}, {device}"
    if dry_run:
        title += " (dry run: toy sizes on CPU, not a measurement)"
    passed = sum(r["passed"] for r in rows.values())
    made = " (`make gpu-check`)" if command == "python bench/gpu_check.py" else ""
    head = (
        f"`{command}`{made} at {provenance()}; {seconds / 60:.1f} minutes in all; {passed} of {len(rows)} steps passed."
    )
    return f"{title}\n\n{head}\n\n{table(rows)}\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
