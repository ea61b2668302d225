"""The run directory: opening a new run or the one to resume (its config checked against the run's),
the start record (config.toml, plan.json), checkpoints of a task with the loop's state, restoring them,
and metrics.jsonl. Only rank 0 writes; every rank reads."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bigbatch import checkpoints
from bigbatch.config import Config, EvalConfig
from bigbatch.engine import dist
from bigbatch.engine.replicator import Replicator
from bigbatch.errors import BigbatchError
from bigbatch.files import atomic_write
from bigbatch.sampling import save_png
from bigbatch.tasks.interface import Task


@dataclass
class Run:
    path: Path
    cfg: Config
    """The config the run trains with (on resume: the run's own, with the changes a resume may make)."""
    checkpoint: Path | None = None
    """The checkpoint a resumed run continues from."""

    @property
    def resumed_at(self) -> int | None:
        """Images seen at the checkpoint resumed from (None for a new run)."""
        if self.checkpoint is None:
            return None
        return int((checkpoints.read_meta(self.checkpoint) or {}).get("nimg", 0))

    # ---- start -----------------------------------------------------------------------------------
    def write_start(self, rep: Replicator) -> None:
        """config.toml (which reproduces the run) and plan.json (the batch plan, as resolved)."""
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path / "config.toml", self.cfg.dumps())
        atomic_write(self.path / "plan.json", json.dumps(plan_record(rep, self.cfg), indent=1) + "\n")

    # ---- checkpoints -----------------------------------------------------------------------------
    def save(self, task: Task, rep: Replicator, nimg: int, seconds: float) -> Path:
        """The checkpoint at `nimg`, `seconds` into the run (all but the newest checkpoint.keep are deleted)."""
        state, info = snapshot(task, rep, nimg, seconds), task.model_info()
        return checkpoints.save_checkpoint(
            self.path, nimg, task.nets(), state, self.cfg.dumps(), self.cfg.checkpoint.keep, info
        )

    def save_best(self, task: Task, rep: Replicator, nimg: int, seconds: float, scores: dict[str, float]) -> Path:
        """checkpoints/best/: the checkpoint at `nimg`, with the scores that made it the best."""
        assert task.scorer is not None
        info = {**task.model_info(), "eval": scores, "best": task.scorer.best_record()}
        return checkpoints.save_best(
            self.path, nimg, task.nets(), snapshot(task, rep, nimg, seconds), self.cfg.dumps(), info
        )

    def restore(self, task: Task, rep: Replicator) -> tuple[int, float]:
        """Load the checkpoint resumed from into `task` and `rep` (weights, optimizer moments, loss scalers,
        the batch plan, RNG); return the images seen and the seconds of training up to it. metrics.jsonl
        loses the rows past it."""
        ckpt = self.checkpoint
        assert ckpt is not None
        nets = task.nets()
        weights, saved = checkpoints.load_checkpoint(ckpt, nets=tuple(nets))
        for key, net in nets.items():
            checkpoints.load_weights(net, weights[key], f"{key} of checkpoint {ckpt}")
        engine = saved.get("engine", {})
        if "plan" not in engine:  # checkpoints from before the plan was engine state: plan.json holds it
            engine = {**engine, "plan": _legacy_plan(self.path)}
        try:
            task.load_state_dict(saved)
            rep.load_state_dict(engine)
            nimg, seconds = int(saved["nimg"]), float(saved.get("seconds", 0.0))
            torch.set_rng_state(saved["rng_cpu"])
            if rep.device.type == "cuda" and "rng_cuda" in saved:
                torch.cuda.set_rng_state(saved["rng_cuda"], rep.device)
        except (KeyError, ValueError, TypeError, RuntimeError) as e:
            raise BigbatchError(f"checkpoint {ckpt} has an unusable state.pt ({e})") from None
        if rep.is_main:
            truncate_metrics(self.path / "metrics.jsonl", nimg)
        return nimg, seconds

    def write_previews(self, task: Task, nimg: int, at_checkpoint: bool) -> None:
        """The task's previews under RUN/samples/, named after the images seen (as checkpoints are)."""
        for prefix, image in task.previews(at_checkpoint).items():
            save_png(image, self.path / "samples" / f"{prefix}-{checkpoints.checkpoint_name(nimg)}.png")

    # ---- metrics.jsonl ---------------------------------------------------------------------------
    def log(self, row: dict[str, Any]) -> None:
        with open(self.path / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


def snapshot(task: Task, rep: Replicator, nimg: int, seconds: float) -> dict[str, Any]:
    """A checkpoint's state.pt: the task's state, the engine's, the images seen, the seconds of training
    (summed over resumes) and the global RNG."""
    return {
        **task.state_dict(),
        "nimg": nimg,
        "seconds": seconds,
        "engine": rep.state_dict(),
        "rng_cpu": torch.get_rng_state(),
        **({"rng_cuda": torch.cuda.get_rng_state(rep.device)} if rep.device.type == "cuda" else {}),
    }


def _legacy_plan(run: Path) -> dict[str, Any] | None:
    """The micro_batch "auto" plan RUN/plan.json records, in Replicator.state_dict's form (None if it has none)."""
    try:
        record = json.loads((run / "plan.json").read_text())
        keys = ("micro_batch", "world_size", "memory_budget_bytes", "probes")
        return {k: record[k] for k in keys}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def open_run(cfg: Config, run_dir: str | Path | None, resume: bool) -> Run:
    """The run `cfg` trains: rank 0 picks (and checks) the run directory, the others follow it. On resume
    the config must agree with the run's own (see `resume_config`)."""
    found = _catch(lambda: _choose_dir(run_dir, cfg.name, resume)) if dist.context().rank == 0 else None
    ok, found = dist.broadcast(found)
    if not ok:
        raise BigbatchError(found)
    run = Path(found)
    if not resume:
        return Run(run, cfg)
    ckpt = checkpoints.find_checkpoint(run)
    return Run(run, resume_config(run, cfg), ckpt)


def _catch(fn: Any) -> tuple[bool, str]:
    """(True, str(fn())) or (False, its BigbatchError's message): plain data to hand to the other ranks."""
    try:
        return True, str(fn())
    except BigbatchError as e:
        return False, str(e)


def _choose_dir(run_dir: str | Path | None, name: str, resume: bool) -> Path:
    """The run directory: a new numbered one by default; an existing run only with --resume."""
    if run_dir is None:
        if resume:
            raise BigbatchError("--resume needs --run-dir naming the run to continue")
        root = Path("runs")
        taken = {p.name for p in root.iterdir()} if root.is_dir() else set()
        number = next(i for i in range(100000) if f"{name}-{i:05d}" not in taken)
        return root / f"{name}-{number:05d}"
    run = Path(run_dir)
    holds_run = (run / "config.toml").exists() or (run / "checkpoints").exists()
    if resume and not holds_run:
        raise BigbatchError(f"{run} holds no run to resume; drop --resume to start a new run there")
    if not resume and holds_run:
        raise BigbatchError(f"{run} already holds a run; add --resume to continue it, or choose another --run-dir")
    if not resume and run.exists() and not run.is_dir():
        raise BigbatchError(f"{run} is a file; --run-dir must name a directory")
    return run


# What a resumed run may change: its length, its output and how it runs, never what it trains.
RESUMABLE_CHANGES = {
    "train.kimg",
    "train.micro_batch",
    "train.memory_budget",
    "train.checkpointing",
    "train.compile",
    "train.device",
    "train.log_every_kimg",
    "checkpoint.every_kimg",
    "checkpoint.keep",
    "sample.every_kimg",
    "data.workers",
    "data.in_ram",
    "data.storage_options",
    *(f"eval.{f.name}" for f in dataclasses.fields(EvalConfig)),
}


def resume_config(run: Path, cfg: Config) -> Config:
    """On resume the run's own config holds; only the run length and output cadences may change."""
    saved, given = flatten(Config.load(run / "config.toml").to_dict()), flatten(cfg.to_dict())
    changed = [k for k in given if given[k] != saved.get(k)]
    fixed = [k for k in changed if not any(k == r or k.startswith(r + ".") for r in RESUMABLE_CHANGES)]
    if fixed:
        raise BigbatchError(
            f"the config differs from the run's in {', '.join(fixed)}; a resumed run may change only "
            f"{', '.join(sorted(RESUMABLE_CHANGES))} (start a new run to change more)"
        )
    return cfg


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict) and k != "options":
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def plan_record(rep: Replicator, cfg: Config) -> dict[str, Any]:
    """What RUN/plan.json holds: the resolved batch plan and how it was found."""
    record: dict[str, Any] = {
        **rep.plan.to_dict(),
        "checkpointing": cfg.train.checkpointing,
        "compile": cfg.train.compile,
        "sync_bn": cfg.train.sync_bn,
        "sn_update": cfg.model.sn_update,
    }
    if cfg.train.micro_batch == "auto":
        record["memory_budget_bytes"] = rep.budget
        record["probes"] = [dataclasses.asdict(p) for p in rep.probes]
    return record


def read_metrics(path: Path) -> list[dict]:
    """The rows of a metrics.jsonl (none if it is missing), skipping a line cut short by a crash."""
    rows = []
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def truncate_metrics(path: Path, nimg: int) -> None:
    """Drop log lines past the checkpoint being resumed, so metrics.jsonl reads as one run."""
    if path.exists():
        keep = [row for row in read_metrics(path) if round(row.get("kimg", math.inf) * 1000) <= nimg]
        atomic_write(path, "".join(json.dumps(row) + "\n" for row in keep))
