"""Experiments as code: `bigbatch.sweep(base, grid, runs_dir)` trains every combination of the grid's
values, one run directory each, skipping runs that finished and resuming runs that were interrupted,
and writes a table of results (RUNS_DIR/results.csv and results.md). `bigbatch sweep FILE.py` runs a
plain Python file that calls it, as `python FILE.py` does."""

from __future__ import annotations

import csv
import io
import itertools
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bigbatch import checkpoints
from bigbatch.config import Config
from bigbatch.errors import BigbatchError
from bigbatch.files import atomic_write
from bigbatch.rundir import read_metrics

# Scores where higher is better (the others, fid, kid, fcd, kcd, val_loss, lower).
HIGHER_IS_BETTER = {"is", "cs", "val_top1", "val_top5"}
SCORES = ("fid", "is", "kid", "fcd", "cs", "kcd", "val_top1", "val_top5", "val_loss")
LOSSES = ("loss_D", "loss_G", "loss", "train_top1")


def sweep(
    base: Config,
    grid: dict[str, Sequence[Any]],
    runs_dir: str | Path,
    launcher: str = "local",
    quiet: bool = True,
) -> list[dict[str, Any]]:
    """Train `base` with every combination of `grid` (dotted config keys -> values), one after another,
    each in RUNS_DIR/<key=value,...>; a run that finished is skipped, one that was interrupted resumes
    from its checkpoint (a run's config must still be the grid's: a changed base is refused by name).
    Returns the rows of RUNS_DIR/results.csv: per run, its grid values, status, kimg, wall seconds,
    img/s, final losses and best scores."""
    if launcher != "local":
        raise BigbatchError(f"sweep launcher {launcher!r}: only 'local' (one run after another) is available")
    if not isinstance(grid, dict) or not grid:
        raise BigbatchError(
            "sweep grid must map dotted config keys to lists of values, e.g. {'train.batch': [64, 256]}"
        )
    for key, values in grid.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise BigbatchError(f"sweep grid key {key!r} must map to a non-empty list of values, got {values!r}")
    root = Path(runs_dir)
    combos = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    configs = [(combo, base.override(combo)) for combo in combos]  # every config checked before any trains
    from bigbatch.loop import train

    for i, (combo, cfg) in enumerate(configs):
        run = root / run_name(combo)
        state = status(run, cfg)
        if not quiet:
            print(f"[{i + 1}/{len(configs)}] {run.name}: {state}", flush=True)
        if state != "finished":
            train(cfg, run_dir=run, resume="auto", quiet=quiet)
    rows = [result_row(root / run_name(combo), combo, cfg) for combo, cfg in configs]
    write_results(root, rows)
    return rows


def run_name(combo: dict[str, Any]) -> str:
    """The folder of one combination: its settings as short key=value pairs, safe as a file name."""
    parts = [f"{key.rsplit('.', 1)[-1]}={value}" for key, value in combo.items()]
    return re.sub(r"[^A-Za-z0-9_.=,+-]", "_", ",".join(parts))[:200]


def status(run: Path, cfg: Config) -> str:
    """'finished' (its newest checkpoint is at the run's length), 'interrupted' or 'new'."""
    if not run.exists():
        return "new"
    done = checkpoints.complete_checkpoints(run)
    total = math.ceil(cfg.train.kimg * 1000)
    if done and int((checkpoints.read_meta(done[-1]) or {}).get("nimg", 0)) >= total:
        return "finished"
    return "interrupted" if (run / "config.toml").exists() else "new"


def result_row(run: Path, combo: dict[str, Any], cfg: Config) -> dict[str, Any]:
    rows = read_metrics(run / "metrics.jsonl")
    logs = [r for r in rows if "eval_seconds" not in r]
    evals = [r for r in rows if "eval_seconds" in r]
    speeds = [r["img_per_s"] for r in logs if _number(r.get("img_per_s"))]
    out: dict[str, Any] = {"run": run.name, **combo, "status": status(run, cfg)}
    out["kimg"] = rows[-1]["kimg"] if rows else 0.0
    out["wall_s"] = round(rows[-1].get("seconds", math.nan), 1) if rows else math.nan
    out["img_per_s"] = round(sum(speeds) / len(speeds), 1) if speeds else math.nan
    for key in LOSSES:
        if logs and _number(logs[-1].get(key)):
            out[key] = round(logs[-1][key], 4)
    for key in SCORES:
        values = [r[key] for r in evals if _number(r.get(key))]
        if values:
            out[f"best_{key}"] = round((max if key in HIGHER_IS_BETTER else min)(values), 4)
    return out


def write_results(root: Path, rows: list[dict[str, Any]]) -> None:
    """RUNS_DIR/results.csv and results.md: one row per run, the union of the rows' columns."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    root.mkdir(parents=True, exist_ok=True)
    atomic_write(root / "results.csv", buf.getvalue())
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    atomic_write(root / "results.md", "\n".join(lines) + "\n")


def run_file(path: str | Path) -> None:
    """`bigbatch sweep FILE.py`: run the sweep file as a script (it calls bigbatch.sweep)."""
    import runpy

    path = Path(path)
    if not path.is_file():
        raise BigbatchError(f"sweep file {path} does not exist; give a Python file that calls bigbatch.sweep")
    runpy.run_path(str(path), run_name="__main__")


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _cell(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)
