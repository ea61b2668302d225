"""Atomic file writes: a reader (or a crash) sees the old file or the new one, never half of one; and
the temporary files of killed processes, found and removed."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write a file through a temporary sibling and a rename, so readers see the old or the new file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")  # (remove_stale takes what a killed process left)
    try:
        write_file(tmp, data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except OSError as e:  # named after the file being written, not its temporary sibling
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(path)) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def save_figure(fig: Any, path: str | Path) -> Path:
    """Write a matplotlib figure as a PNG atomically (100 dpi), and close it."""
    import io

    from matplotlib import pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, buffer.getvalue())
    return path


def write_file(path: Path, data: bytes | memoryview) -> None:
    """Write and fsync a file (OSError, with the path, if the disk is full)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID runs on this machine (a zombie, ended but not reaped by its parent,
    does not: in a container whose first process reaps nothing, a killed process stays one)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):  # no /proc (not Linux), or it ended meanwhile
        return not sys.platform.startswith("linux")
    return state not in ("Z", "X")


def remove_stale(paths: Iterable[Path]) -> None:
    """Delete temporary files or folders named ...-PID whose process is gone (killed while writing)."""
    for path in paths:
        pid = path.name.rpartition("-")[2]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def metrics_row(line: str | bytes) -> dict | None:
    """One line of a metrics.jsonl as a row, or None if it is not one: a line cut short by a crash,
    or anything but an object with a finite number as its kimg."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    kimg = row.get("kimg") if isinstance(row, dict) else None
    if isinstance(kimg, int | float) and not isinstance(kimg, bool) and math.isfinite(kimg):
        return row
    return None
