"""A classify run's scoring as it trains (eval.every_kimg): the held-out split's scores, the best checkpoint they
keep, and train.lr_decay = "plateau", the rate that follows them."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bigbatch.config import Config
from bigbatch.errors import BigbatchError
from bigbatch.tasks.best import Best
from bigbatch.tasks.classify.validation import Validation, scores_top5

PLATEAU_THRESHOLD = 1e-4  # PyTorch's ReduceLROnPlateau's (relative), as timm's --sched plateau leaves it


def scored_metric(cfg: Config) -> tuple[str, bool]:
    """The held-out score a run follows (eval.best; val_top1 by default), and whether higher is better."""
    metric = cfg.eval.best or "val_top1"
    return metric, metric != "val_loss"


class Plateau:
    """train.lr_decay = "plateau", as timm's --sched plateau (PyTorch's ReduceLROnPlateau after the warm-up): the
    scored metric (eval.best; val_top1 by default) not better than its best by a relative 1e-4 for more than
    train.plateau_patience evaluations in a row multiplies the rate by train.lr_gamma (then counts again), never
    below train.lr_min. Every rank scores alike, so every rank steps alike; the factor is kept in the checkpoint."""

    def __init__(self, cfg: Config):
        t = cfg.train
        self.metric, self.higher = scored_metric(cfg)
        self.patience, self.gamma, self.warmup = t.plateau_patience, t.lr_gamma, t.warmup_kimg
        self.factor, self.best, self.bad = 1.0, None, 0
        self.floor = t.lr_min / t.lr  # (train.lr_min as a share of train.lr: both are scaled to the batch alike)

    def rates(self, schedule: Callable[[int], float]) -> Callable[[int], float]:
        """`schedule` (the warm-up, then train.lr scaled to the batch) times the factor after the warm-up, not below
        train.lr_min scaled alike."""
        return lambda nimg: schedule(nimg) * (1.0 if nimg < self.warmup * 1000 else max(self.factor, self.floor))

    def observe(self, scores: dict[str, float], nimg: int) -> None:
        """An evaluation's `scores` at `nimg` images (after the warm-up: none before or at its end, as timm's)."""
        if (self.warmup and nimg <= self.warmup * 1000) or self.metric not in scores:  # (timm's epoch <= warmup_t)
            return
        value = scores[self.metric]
        t = PLATEAU_THRESHOLD  # (a score that is not finite: never the best, as PyTorch's)
        better = math.isfinite(value) and (
            self.best is None or (value > self.best * (1 + t) if self.higher else value < self.best * (1 - t))
        )
        self.best, self.bad = (value, 0) if better else (self.best, self.bad + 1)
        if self.bad > self.patience:
            self.factor, self.bad = self.factor * self.gamma, 0

    def state(self) -> dict[str, Any]:
        return {"plateau": {"factor": self.factor, "best": self.best, "bad": self.bad}}

    def load(self, state: dict[str, Any]) -> None:
        kept = state.get("plateau") or {}
        self.factor, self.best, self.bad = float(kept.get("factor", 1.0)), kept.get("best"), int(kept.get("bad", 0))


class ClassifyScorer:
    """eval.every_kimg: the held-out split scored (val_top1, val_top5, val_loss) at eval.resolution, else the
    phase's; the best val_top1 (or eval.best) keeps RUN/checkpoints/best/."""

    def __init__(self, task: Any, run: Path, resumed_at: int | None, quiet: bool):  # (task.py's ClassifyTask)
        cfg, rep = task.cfg, task.rep
        self.task = task
        self.validation = Validation(
            task.val_data,
            task.scored_at,
            cfg.eval.batch_size,
            cfg.data.val_crop,
            cfg.data.val_rect,
            rep.precision,
            rep.device,
            rep.rank,
            rep.world_size,
            rotation=task.rotation,
            tta=cfg.eval.tta,
        )
        metric, higher = scored_metric(cfg)
        if metric == "val_top5" and not scores_top5(self.validation.classes):
            raise BigbatchError(
                f"eval.best = 'val_top5' is 100 at every evaluation of {self.validation.classes} classes (top-5 "
                "of 5 or fewer classes is not scored): give eval.best = 'val_top1' or 'val_loss'"
            )
        settings = {
            "metric": metric,
            "data": task.val_data.content_hash,
            "crop": cfg.data.val_crop,
            "rect": cfg.data.val_rect,
            **({"resolution": cfg.eval.resolution} if cfg.eval.resolution else {}),
            **({"tta": True} if cfg.eval.tta else {}),
        }
        self.tracker = Best(metric, higher, settings, run, resumed_at, quiet)

    def __call__(self) -> dict[str, float]:
        if self.task.cfg.eval.standing_stats:
            self.task.standing_stats(self.task.cfg.eval.standing_stats)
        # (the side it scored at, beside the scores: found from outside, a phase's side unsaid in its rows)
        scores = {**self.validation(self.task.evaluated()), "eval_resolution": self.task.scored_at()}
        if self.task.plateau is not None:  # (the rate of the steps after it)
            self.task.plateau.observe(scores, self.task.seen)
        return scores

    def improved(self, scores: dict[str, float]) -> bool:
        return self.tracker.improved(scores)

    def best_record(self) -> dict[str, Any]:
        return self.tracker.record()
