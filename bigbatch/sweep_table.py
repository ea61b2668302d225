"""A sweep's runs, named and tabulated: each combination's folder, a run's state (new, interrupted, finished),
its row of results (RUNS_DIR/results.csv and results.md) and the scores a run logs."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import re
from pathlib import Path
from typing import Any

from bigbatch import checkpoints
from bigbatch.config import Config
from bigbatch.files import atomic_write
from bigbatch.metrics_file import FACES, HIGHER_IS_BETTER, SCORES, read_metrics

LOSSES = ("loss_D", "loss_G", "loss", "train_top1", "src_loss", "dst_loss", "loss_xseg")


def logged_scores(cfg: Config) -> tuple[str, ...]:
    """The scores a run of `cfg` logs at each evaluation (metrics.jsonl), by the names a search's `metric` takes;
    a GAN's extractor "auto" is Inception where its weights are here, else the classifier (found from outside: taken
    for either, so a search on fcd trained every trial of runs that logged fid)."""
    if cfg.task == "gan":
        from bigbatch.metrics.evaluate import NAMES, parse_metrics, score_names
        from bigbatch.metrics.extractors import falls_back

        name = cfg.eval.extractor.split(":")[0]
        if name == "auto":
            name = "classifier" if falls_back("auto", cfg.eval.weights or None) else "inception"
        families = [f for f in NAMES if name in (f, f"{f}-torchscript")]
        return tuple(n for m in parse_metrics(cfg.eval.metrics) for f in families for n in score_names(m, f))
    if cfg.task == "classify":  # (top-5 of the 4 rotations, always 100, is not logged: found by review)
        return ("val_top1", "val_loss") if cfg.train.labels == "rotation" else ("val_top1", "val_top5", "val_loss")
    return {"swap": FACES[:3], "xseg": ("iou", "val_loss")}.get(cfg.task, ())


def existing_folders(root: Path, names: list[str]) -> list[str]:
    """Each combination's folder: the one an earlier sweep into RUNS_DIR named with the grid's keys in another
    order, or with its numbers written otherwise, if there is one (found from outside: {model.ch, train.batch}
    trained again what {train.batch, model.ch} had trained; lr=2.0 what lr=2 had), else its name."""
    there = [p.name for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
    in_order = {_parts(name): name for name in there}
    any_order = {tuple(sorted(_parts(name), key=repr)): name for name in there}

    def folder(name: str) -> str:
        parts = _parts(name)
        if name in there:
            return name
        if len({key for key, _ in parts}) < len(parts):  # (two keys of one short name, train.lr and swap.lr: their
            return in_order.get(parts, name)  # order is theirs)
        return any_order.get(tuple(sorted(parts, key=repr)), name)

    return [folder(name) for name in names]


def _parts(name: str) -> tuple[tuple[str, Any], ...]:
    """A run folder's name as its (key, value) pairs, a number's value as the number (2 and 2.0 are one)."""
    pairs = (part.partition("=")[::2] for part in name.split(","))
    return tuple((key, float(number) if is_number(number := _value(value)) else value) for key, value in pairs)


NAME_LIMIT = 200  # characters of a run folder's name


def run_name(combo: dict[str, Any]) -> str:
    """The folder of one combination: its settings as short key=value pairs, safe as a file name (a name
    too long for that ends in a digest of the combination instead, so that two never share a folder)."""
    parts = [f"{key.rsplit('.', 1)[-1]}={value}" for key, value in combo.items()]
    name = re.sub(r"[^A-Za-z0-9_.=,+-]", "_", ",".join(parts))
    return name if len(name) <= NAME_LIMIT else _digested(name, combo)


def run_names(combos: list[dict[str, Any]]) -> list[str]:
    """run_name of each combination; those that would share a folder (values that read alike once made
    safe: 'a/b' and 'a_b') end in a digest of their combination."""
    names = [run_name(combo) for combo in combos]
    return [_digested(n, c) if names.count(n) > 1 else n for n, c in zip(names, combos)]


def _digested(name: str, combo: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(combo, sort_keys=True, default=repr).encode()).hexdigest()[:12]
    return f"{name[: NAME_LIMIT - 13]}-{digest}"


def status(run: Path, cfg: Config) -> str:
    """'finished' (its newest checkpoint is at the run's length), 'interrupted' or 'new'."""
    if not run.exists():
        return "new"
    done = checkpoints.complete_checkpoints(run)
    total = cfg.train.images
    nimg = int((checkpoints.read_meta(done[-1]) or {}).get("nimg", 0)) if done else 0
    # Stopped past a shorter length than its own, a run is not finished (its resume refuses the length, naming it:
    # found from outside, called finished and tabulated beside runs of the new length); one that reached its own
    # length is (its resume says it is done).
    if done and nimg >= total and (nimg == total or nimg >= Config.load(done[-1] / "config.toml").train.images):
        return "finished"
    return "interrupted" if (run / "config.toml").exists() else "new"


def result_row(run: Path, combo: dict[str, Any], cfg: Config, job: Any = None) -> dict[str, Any]:
    """A run's row of the table; `job` (a sweep's, if given) says whether it failed or was pruned."""
    rows = read_metrics(run / "metrics.jsonl")
    logs = [r for r in rows if "eval_seconds" not in r]
    evals = [r for r in rows if "eval_seconds" in r]
    speeds = [r["img_per_s"] for r in logs if is_number(r.get("img_per_s"))]
    state = "failed" if job and job.failed else "pruned" if job and job.pruned else status(run, cfg)
    state = "running" if job and job.running else state  # (side by side, as another run ends)
    if job and job.pruned and job.reported:  # (its scores the study saw: found from outside, a pruned run went on, and
        evals = evals[: max(job.reported)]  # its later best outranked the study's best in the table)
    out: dict[str, Any] = {"run": run.name, **combo, "status": state}
    kept = checkpoints.complete_checkpoints(run)  # (a run stopped before its first log row has trained: its checkpoint)
    meta = (checkpoints.read_meta(kept[-1]) or {}) if kept else {}
    logged, saved = rows[-1]["kimg"] if rows else 0.0, meta.get("kimg", 0.0)
    out["kimg"] = max(logged, saved)
    out["wall_s"] = round(rows[-1].get("seconds", math.nan), 1) if rows else math.nan
    if saved > logged:  # (a stop's checkpoint past its last row: its seconds, with its kimg; found from outside, the
        out["wall_s"] = meta.get("seconds", out["wall_s"])  # row's; a checkpoint of before them: the row's still)
    out["img_per_s"] = round(sum(speeds) / len(speeds), 1) if speeds else math.nan
    for key in LOSSES:
        if logs and is_number(logs[-1].get(key)):
            out[key] = _significant(logs[-1][key])
    for key in SCORES:
        values = [r[key] for r in evals if is_number(r.get(key))]
        if values:
            out[f"best_{key}"] = _significant((max if key in HIGHER_IS_BETTER else min)(values))
    return out


def _significant(value: float) -> float:
    """`value` to 4 decimals, or to 5 significant digits where those are more (found from outside: to 4 decimals
    alone, KIDs of 4.4e-4 and 3.6e-4 were one)."""
    if not math.isfinite(value) or value == 0:
        return value
    return round(value, max(4, 4 - math.floor(math.log10(abs(value)))))


def write_results(root: Path, rows: list[dict[str, Any]]) -> None:
    """RUNS_DIR/results.csv and results.md: one row per run, the union of the rows' columns; rows of
    runs an earlier sweep into RUNS_DIR wrote stay (as they were), and rows of these runs replace theirs."""
    ours = {row["run"]: row for row in rows}
    earlier = _earlier_rows(root)
    # (in their places, ours where theirs were; found from outside: a later call's rows went to the bottom, its
    # numbers as 2 beside the earlier's 2.0)
    taken = {row.get("run") for row in earlier}
    rows = [ours.get(row.get("run"), row) for row in earlier] + [row for row in rows if row["run"] not in taken]
    columns = list(dict.fromkeys(k for row in rows for k in row if k is not None))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, columns, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    root.mkdir(parents=True, exist_ok=True)
    atomic_write(root / "results.csv", buf.getvalue())
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    atomic_write(root / "results.md", "\n".join(lines) + "\n")


def _earlier_rows(root: Path) -> list[dict[str, Any]]:
    """The rows of RUNS_DIR/results.csv, their numbers read as numbers."""
    try:
        with open(root / "results.csv", newline="") as f:
            return [{k: _value(v) for k, v in row.items()} for row in csv.DictReader(f)]
    except (OSError, csv.Error, UnicodeDecodeError):
        return []


def _value(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def earlier_statuses(root: Path) -> dict[str, str]:
    """Each run's status in RUNS_DIR/results.csv, as an earlier call of the sweep left it."""
    return {str(row.get("run")): str(row.get("status")) for row in _earlier_rows(root)}


def is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _cell(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)
