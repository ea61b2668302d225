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
from bigbatch.errors import BigbatchError


def warmup_decay(
    lr: float,
    nimg: int,
    total: int,
    warmup: int = 0,
    decay: str = "none",
    steps: tuple[int, ...] = (),
    gamma: float = 0.1,
    start: float = 0.0,
    floor: float = 0.0,
    cooldown: int = 0,
) -> float:
    """train.lr's rate at the step starting at `nimg` of `total` images: a linear ramp to `lr` that
    reaches it after `warmup` images, from `start` (timm's warmup_lr; 0: the first step already trains at a small
    rate, never at 0), then `decay` over the rest of the run: "linear" or "cosine" down to `floor` (timm's min_lr)
    `cooldown` images before the end (held there after, timm's cooldown epochs), or "step"."""
    if nimg < warmup:
        return start + (lr - start) * nimg / warmup if start else lr * min(1.0, (nimg + 1) / warmup)
    p = min(1.0, (nimg - warmup) / max(1, total - cooldown - warmup))
    if decay == "linear":
        return floor + (lr - floor) * (1 - p)
    if decay == "cosine":
        return floor + (lr - floor) * 0.5 * (1 + math.cos(math.pi * p))
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
    cooldown = round(t.cooldown_kimg * 1000)
    by_phase = schedule.phases[0].lr is not None

    def lr(nimg: int) -> float:
        scale = batch_scale(cfg, schedule.phase_at(nimg).batch)
        if by_phase:
            return phase_rate(schedule, nimg, total) * scale
        rate = warmup_decay(t.lr, nimg, total, warmup, t.lr_decay, steps, t.lr_gamma, t.warmup_lr, t.lr_min, cooldown)
        return rate * scale

    return lr


def check(cfg: Config) -> None:
    """The rate's keys a classify config gives, read together: a schedule whose phases give rates takes none of
    train.lr's warm-up and decay; train.lr_min and train.cooldown_kimg are a linear or cosine decay's, train.warmup_lr
    a warm-up's, each below train.lr; the warm-up and the cool-down leave some of the run between them."""
    t = cfg.train
    if schedule_of(cfg).phases[0].lr is not None:
        given = t.changed("warmup_kimg", "warmup_lr", "lr_min") + (["train.lr_decay"] if t.lr_decay != "none" else [])
        if given:
            raise BigbatchError(
                f"config key 'data.schedule' gives each phase an lr, so {given[0]} must stay at its default (the "
                "phases are the whole learning-rate schedule); drop one or the other"
            )
    if t.lr_decay == "step" and not t.lr_steps:
        t._fail("lr_steps", 'must list kimg when train.lr_decay = "step"')
    if t.lr_decay not in ("linear", "cosine", "plateau") and t.changed("lr_min"):
        t._fail("lr_min", f'is read by train.lr_decay "linear", "cosine" or "plateau", not "{t.lr_decay}"')
    if t.lr_decay not in ("linear", "cosine") and t.changed("cooldown_kimg"):
        t._fail("cooldown_kimg", f'is read by train.lr_decay "linear" or "cosine", not "{t.lr_decay}"')
    if t.lr_decay != "plateau" and t.changed("plateau_patience"):
        t._fail("plateau_patience", f'is read by train.lr_decay "plateau", not "{t.lr_decay}"')
    if t.lr_decay == "plateau" and not cfg.eval.every_kimg:  # (the scores it follows)
        t._fail("lr_decay", '"plateau" follows the held-out scores, and nothing is scored (eval.every_kimg is 0)')
    if t.warmup_lr and not t.warmup_kimg:
        t._fail("warmup_lr", "is the rate a warm-up starts at, and there is none (train.warmup_kimg 0)")
    for name in ("warmup_lr", "lr_min"):
        if getattr(t, name) >= t.lr:
            t._fail(name, f"must be below train.lr ({t.lr:g}), got {getattr(t, name):g}")
    if t.cooldown_kimg and t.warmup_kimg + t.cooldown_kimg >= t.kimg:
        t._fail("cooldown_kimg", f"and train.warmup_kimg leave nothing of the run's {t.kimg:g} kimg to decay over")
