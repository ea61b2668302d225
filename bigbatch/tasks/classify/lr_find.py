"""`bigbatch lr-find`: Smith's learning-rate range test (Smith 2017; fastai's lr_find) on a classify
config as it would train: its data, model, batch (micro-batches and accumulation included, so the
target batch on small hardware), precision and crops. The rate rises exponentially step after step
while the loss is recorded (smoothed as fastai smooths it); the test stops when the loss diverges.
Nothing is written but the plot: the steps train a throwaway copy of the model."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from bigbatch.batching import replicator_for
from bigbatch.config import Config
from bigbatch.data.load import training_data
from bigbatch.data.schedule import Schedule, schedule_of
from bigbatch.errors import BigbatchError
from bigbatch.tasks.interface import Feed, build_task

SMOOTHING = 0.98  # fastai's exponential moving average of the loss, bias-corrected
DIVERGED = 4.0  # stop once the smoothed loss is this many times its minimum


def lr_find(cfg: Config, start: float = 1e-7, end: float = 10.0, steps: int = 100) -> dict[str, Any]:
    """Run the range test; rates are in the config's own units (train.lr per train.lr_batch images).
    Returns the rates, smoothed losses and fastai's three suggestions: valley, steepest, minimum/10."""
    if cfg.task != "classify":
        raise BigbatchError(f'lr-find takes classify configs (task = "classify"); this one trains task = "{cfg.task}"')
    if not (0 < start < end and math.isfinite(end)) or steps < 5:
        raise BigbatchError(f"lr-find needs 0 < start < end and at least 5 steps, got {start:g}..{end:g}, {steps}")
    cfg = cfg.override({"train.freeze_kimg": 0.0})  # the whole network's rate, not a frozen body's
    first = schedule_of(cfg).phases[0]  # the first phase's resolution and batch, as training begins
    rep = replicator_for(cfg)
    try:
        data = training_data(cfg)
        task = build_task(cfg, rep, data)
        t = cfg.train
        scale = first.batch / t.lr_batch if t.lr_batch else 1.0  # the task's rate is train.lr x this
        rates = [start * (end / start) ** (i / (steps - 1)) for i in range(steps)]
        task.lr = lambda nimg: rates[min(nimg // first.batch, steps - 1)] * scale  # type: ignore[attr-defined]
        feed = Feed(data, Schedule([first]), rep, cfg, crop_scale=getattr(task, "loader_crop_scale", 0.0))
        lrs, losses, average, best, skipped = [], [], 0.0, math.inf, 0
        try:
            for i in range(steps):
                stats = task.step(feed)
                if rep.skipped(task.opt) and skipped < 10 and not losses:
                    skipped += 1  # fp16's loss scale settling in: not a divergence
                    continue
                loss = stats.get("loss", math.nan)
                if not math.isfinite(loss):
                    break
                average = SMOOTHING * average + (1 - SMOOTHING) * loss
                smoothed = average / (1 - SMOOTHING ** (len(losses) + 1))
                lrs.append(rates[i])
                losses.append(smoothed)
                best = min(best, smoothed)
                if smoothed > DIVERGED * best:
                    break
        finally:
            feed.close()
    finally:
        rep.close()
    if len(losses) < 5:
        raise BigbatchError(f"the loss diverged within {len(losses)} steps: start the range lower (--start-lr)")
    return {"lr": lrs, "loss": losses, **suggestions(lrs, losses), "lr_batch": t.lr_batch, "batch": first.batch}


def suggestions(lrs: list[float], losses: list[float]) -> dict[str, float]:
    """fastai's suggestions from a range test: `valley` (within the longest run of falling loss, a
    little past its middle), `steepest` (the steepest fall against log rate) and `minimum` (the rate
    of the lowest loss, divided by 10)."""
    n = len(losses)
    # The longest decreasing subsequence, fastai's `valley`.
    lds, max_start, max_end = [1] * n, 0, 0
    for i in range(1, n):
        for j in range(i):
            if losses[i] < losses[j] and lds[i] < lds[j] + 1:
                lds[i] = lds[j] + 1
            if lds[max_end] < lds[i]:
                max_end, max_start = i, i - lds[i]
    sections = (max_end - max_start) / 3
    valley = lrs[max(0, min(n - 1, max_start + int(sections) + int(sections / 2)))]
    logs = torch.tensor(lrs, dtype=torch.float64).log()
    slopes = (torch.tensor(losses[1:], dtype=torch.float64) - torch.tensor(losses[:-1])) / logs.diff()
    steepest = lrs[int(slopes.argmin()) + 1]
    minimum = lrs[int(torch.tensor(losses).argmin())] / 10
    return {"valley": valley, "steepest": steepest, "minimum": minimum}


def plot(result: dict[str, Any], out: str | Path) -> Path:
    """lr_find.png: the smoothed loss against the rate (log scale), the suggestions marked."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from bigbatch.files import save_figure

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(result["lr"], result["loss"])
    ax.set_xscale("log")
    per = f" per {result['lr_batch']} images" if result["lr_batch"] else ""
    ax.set_xlabel(f"train.lr{per}")
    ax.set_ylabel("loss (smoothed)")
    for name, marker in (("valley", "o"), ("steepest", "s"), ("minimum", "^")):
        lr = result[name]
        i = min(range(len(result["lr"])), key=lambda k: abs(math.log(result["lr"][k] / lr)))
        ax.plot([lr], [result["loss"][i]], marker, label=f"{name} {lr:.2e}")
    ax.legend()
    fig.tight_layout()
    return save_figure(fig, out)
