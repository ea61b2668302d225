"""RUN/metrics.jsonl: its rows read, and cut back to a checkpoint a run resumes from."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from bigbatch.errors import counted, warn
from bigbatch.files import atomic_write, metrics_row

# Scores where higher is better (the others, fid, kid, fcd, kcd, val_loss, lower).
MANIFOLD = tuple(p + v for p in ("", "c_") for v in ("precision", "recall", "density", "coverage"))
FACES = ("ssim", "src_ssim", "dst_ssim", "iou")  # a swap run's held-out scores, an xseg run's (its val_loss too)
HIGHER_IS_BETTER = {"is", "cs", "val_top1", "val_top5", *MANIFOLD, *FACES}
SCORES = ("fid", "is", "kid", "fcd", "cs", "kcd", *MANIFOLD, "val_top1", "val_top5", "val_loss", *FACES)


def read_metrics(path: Path) -> list[dict]:
    """The rows of a metrics.jsonl (none if it is missing), skipping a line cut short by a crash and
    any that is not a row of numbers at a kimg."""
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    return [row for row in map(metrics_row, lines) if row is not None]


def truncate_metrics(path: Path, nimg: int, scores_too: bool = False, superseded: str | None = None) -> None:
    """Drop log lines past the checkpoint being resumed, so metrics.jsonl reads as one run; `scores_too`: its
    evaluation's rows at the checkpoint too (the resumed run makes it again: a run stopped after it had made it
    once, before the checkpoint said so); `superseded`: the rows dropped kept in metrics.jsonl.SUPERSEDED (a
    rollback's), said. Lines that are not rows, but for a last one cut short by a crash, are damage: warned about,
    the file kept beside."""
    if not path.exists():
        return
    lines = path.read_text(errors="replace").splitlines()
    rows = [metrics_row(line) for line in lines]
    bad = [i for i, row in enumerate(rows) if row is None and lines[i].strip() and i < len(lines) - 1]
    if bad:
        aside = path.with_name(f"{path.name}.damaged")
        shutil.copyfile(path, aside)
        warn(
            f"{path}: {len(bad)} line{'s' if len(bad) > 1 else ''} (the first: line {bad[0] + 1}) not a log row, left "
            f"out of it; the file as it was is kept as {aside.name}"
        )
    keep = [row for row in rows if row is not None and round(row["kimg"] * 1000) <= nimg]
    if scores_too:
        keep = [row for row in keep if not ("eval_seconds" in row and round(row["kimg"] * 1000) == nimg)]
    dropped = [row for row in rows if row is not None and round(row["kimg"] * 1000) > nimg]
    if superseded and dropped:
        atomic_write(path.with_name(f"{path.name}.{superseded}"), "".join(json.dumps(row) + "\n" for row in dropped))
        warn(
            f"{path}: its {counted(len(dropped), 'row')} past {nimg / 1000:g} kimg, of another history, kept as "
            f"{path.name}.{superseded}"
        )
    atomic_write(path, "".join(json.dumps(row) + "\n" for row in keep))
