"""The classifier's learning rate as a pure function of images seen (nanoGPT's `get_lr(it)`), so a
resumed run and one of another world size step with the same rates.

Two ways to give it, both scaled to the batch in force, linearly (Goyal et al. 2017, "Accurate, large
minibatch SGD": lr = train.lr x batch / train.lr_batch) or with train.lr_scale = "sqrt" by the square root of
that ratio (timm's --lr-base-scale, its default for Adam's family and LAMB; Hoffer et al. 2017):
- train.lr with a linear warm-up over train.warmup_kimg, then train.lr_decay: none, linear or cosine
  to 0 at train.kimg, or step (x train.lr_gamma at each of train.lr_steps);
- or the lr of each data.schedule phase, [start, end] linear over the phase, as fast.ai's ImageNet in
  18 minutes writes its schedule (its rates are for a GPU's batch, and DDP averages the gradients of its 8 GPUs:
  a rate applies to 8 such batches, so train.lr_batch = 8 x that batch: 4,096 for its 512 a GPU).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from bigbatch.config import Config
from bigbatch.data.schedule import Schedule, schedule_of


def warmup_decay(
    lr: float,
    nimg: int,
    total: int,
    warmup: int = 0,
    decay: str = "none",
    steps: tuple[int, ...] = (),
    gamma: float = 0.1,
) -> float:
    """train.lr's rate at the step starting at `nimg` of `total` images: a linear ramp to `lr` that
    reaches it after `warmup` images (the first step already trains at a small rate, never at 0), then
    `decay` over the rest of the run."""
    if nimg < warmup:
        return lr * min(1.0, (nimg + 1) / warmup)
    p = min(1.0, (nimg - warmup) / max(1, total - warmup))
    if decay == "linear":
        return lr * (1 - p)
    if decay == "cosine":
        return lr * 0.5 * (1 + math.cos(math.pi * p))
    if decay == "step":
        return lr * gamma ** sum(nimg >= s for s in steps)
    return lr


def phase_rate(schedule: Schedule, nimg: int, total: int) -> float:
    """The rate the schedule's phase lr ranges give the step starting at `nimg`: linear from the
    phase's start rate at its first step to its end rate at the next phase's first step (the last
    phase: at `total`)."""
    begins = schedule.begins()
    begins.append(max(total, begins[-1] + 1))
    i = max(j for j, b in enumerate(begins[:-1]) if b <= nimg)
    start, end = schedule.phases[i].lr or (0.0, 0.0)
    p = (nimg - begins[i]) / max(1, begins[i + 1] - begins[i])
    return start + (end - start) * min(1.0, p)


def batch_scale(cfg: Config, batch: int) -> float:
    """What a rate given per train.lr_batch images is multiplied by at `batch` images a step (train.lr_scale)."""
    t = cfg.train
    ratio = batch / t.lr_batch if t.lr_batch else 1.0
    return math.sqrt(ratio) if t.lr_scale == "sqrt" else ratio


def lr_schedule(cfg: Config) -> Callable[[int], float]:
    """`lr(nimg)`: the learning rate of the step starting at `nimg` images seen, as the config gives it."""
    t = cfg.train
    schedule = schedule_of(cfg)
    total = t.images
    warmup = round(t.warmup_kimg * 1000)
    steps = tuple(round(k * 1000) for k in t.lr_steps)
    by_phase = schedule.phases[0].lr is not None

    def lr(nimg: int) -> float:
        scale = batch_scale(cfg, schedule.phase_at(nimg).batch)
        if by_phase:
            return phase_rate(schedule, nimg, total) * scale
        return warmup_decay(t.lr, nimg, total, warmup, t.lr_decay, steps, t.lr_gamma) * scale

    return lr
