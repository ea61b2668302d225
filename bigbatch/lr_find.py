"""`bigbatch lr-find`: Smith's learning-rate range test (Smith 2017; fastai's lr_find) on a config as it
would train: its data, model, batch (micro-batches and accumulation included, so the target batch on
small hardware), precision and augmentation. The rate rises exponentially step after step while the
loss is recorded (smoothed as fastai smooths it); the test stops when the loss diverges. Nothing is
written but the plot: the steps train a throwaway copy of the model.

A task takes part by naming the config key its rate is in (`lr_key`: train.lr for a classifier, per
train.lr_batch images; swap.lr for SAEHD's autoencoder), by `set_lr(rate)`, which holds the rate of
the steps that follow at `rate` in that key's units, and by naming the logged losses whose sum is the
curve (`range_loss`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from bigbatch.batching import replicator_for
from bigbatch.config import Config
from bigbatch.data.load import training_data
from bigbatch.data.schedule import Schedule, schedule_of
from bigbatch.engine.determinism import global_rngs_kept
from bigbatch.errors import BigbatchError
from bigbatch.tasks import Feed, build_task

SMOOTHING = 0.98  # fastai's exponential moving average of the loss, bias-corrected
DIVERGED = 4.0  # stop once the smoothed loss is this many times its minimum
MAX_STEPS = 10_000  # (fastai's default is 100; found from outside: 10^8 built its rates for minutes, then ran out)
SKIP_END = 5  # the last points of the curve left out of the plot, where the loss diverged (fastai's skip_end)


def lr_find(cfg: Config, start: float = 1e-7, end: float = 10.0, steps: int = 100) -> dict[str, Any]:
    """Run the range test; rates are in the config's own units (the task's `lr_key`). Returns the
    rates, smoothed losses and fastai's three suggestions: valley, steepest, minimum/10."""
    if not (0 < start < end and math.isfinite(end)) or not 5 <= steps <= MAX_STEPS:
        raise BigbatchError(
            f"lr-find needs 0 < start < end and 5 to {MAX_STEPS:,} steps, got {start:g}..{end:g}, {steps}"
        )
    first = schedule_of(cfg).phases[0]  # the first phase's resolution and batch, as training begins
    rep = replicator_for(cfg)
    with global_rngs_kept(rep.device):  # (the caller's generators, which the steps seed, put back after)
        try:
            data = training_data(cfg)
            task = build_task(cfg, rep, data)
            if not hasattr(task, "set_lr"):
                raise BigbatchError(f'lr-find takes classify and swap configs; this one trains task = "{cfg.task}"')
            rates = [start * (end / start) ** (i / (steps - 1)) for i in range(steps)]
            crop_scale, order = getattr(task, "loader_crop_scale", 0.0), getattr(task, "data_order", None)
            feed = Feed(data, Schedule([first]), rep, cfg, crop_scale=crop_scale, order=order)
            lrs, losses, average, best, skipped = [], [], 0.0, math.inf, 0
            try:
                for i in range(steps):
                    task.set_lr(rates[i])
                    stats = task.step(feed)
                    if rep.skipped(task.opt) and skipped < 10 and not losses:
                        skipped += 1  # fp16's loss scale settling in: not a divergence
                        continue
                    loss = sum(stats.get(k, math.nan) for k in task.range_loss)
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
    per = cfg.train.lr_batch if task.lr_key == "train.lr" else 0
    key = task.lr_key
    if key == "train.lr" and schedule_of(cfg).phases[0].lr is not None:  # (train.lr is not read then)
        key = "peak of data.schedule's phase lr"
    result = {"lr": lrs, "loss": losses, "key": key, "lr_batch": per, "batch": first.batch}
    return result | suggestions(lrs, losses, steps) | {"loss_name": " + ".join(task.range_loss)}


def suggestions(lrs: list[float], losses: list[float], planned: int | None = None) -> dict[str, float]:
    """fastai's suggestions from a range test of `planned` steps (default: as many as ran): `valley`
    (within the longest run of falling loss, a little past its middle), `steepest` (the steepest fall
    against log rate) and `minimum` (the rate of the lowest loss, divided by 10); as fastai, on the curve
    less its first tenth and its last 5 points (where the loss has diverged), when enough is left."""
    first = (planned or len(losses)) // 10
    if len(losses) - first - 5 >= 5:
        lrs, losses = lrs[first:-5], losses[first:-5]
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
    steepest = lrs[int(slopes.argmin())]  # (fastai's: the rate the steepest step starts from)
    minimum = lrs[int(torch.tensor(losses).argmin())] / 10
    return {"valley": valley, "steepest": steepest, "minimum": minimum}


def plot(result: dict[str, Any], out: str | Path) -> Path:
    """lr_find.png: the smoothed loss against the rate (log scale), the suggestions marked."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from bigbatch.files import save_figure

    fig, ax = plt.subplots(figsize=(7, 4.5))
    shown = slice(None, -SKIP_END if len(result["lr"]) > 2 * SKIP_END else None)  # (as fastai's plot_lr_find)
    ax.plot(result["lr"][shown], result["loss"][shown])
    ax.set_xscale("log")
    per = f" per {result['lr_batch']} images" if result["lr_batch"] else ""
    ax.set_xlabel(f"{result['key']}{per}")
    ax.set_ylabel(f"{result['loss_name']} (smoothed)")
    for name, marker in (("valley", "o"), ("steepest", "s"), ("minimum", "^")):
        lr = result[name]
        at = lr * 10 if name == "minimum" else lr  # (marked where the loss is lowest, as fastai marks it)
        i = min(range(len(result["lr"])), key=lambda k: abs(math.log(result["lr"][k] / at)))
        ax.plot([at], [result["loss"][i]], marker, label=f"{'minimum/10' if name == 'minimum' else name} {lr:.2e}")
    ax.legend()
    fig.tight_layout()
    return save_figure(fig, out)
