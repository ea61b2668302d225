"""Mixup (Zhang et al. 2018) and CutMix (Yun et al. 2019) for a classifier, as timm applies them (alphas
train.mixup and train.cutmix; with both, each pair takes one of the two at even odds; CutMix's weight is
the share of pixels its box really covers), in large-batch form: an image is mixed with its neighbour in the step
(global positions 2k and 2k + 1, each of the pair with the other), and each pair's draws are keyed by the
step and the pair's place in it. So a step's mixed images and its loss do not depend on how the batch is
split into micro-batches or over processes (timm mixes each process's batch with itself reversed, which
does), as long as the micro-batch is even: pairs are never cut.

A step's draws (`draw`) are one row per image: [kind (1 mixup, 2 CutMix), the weight of the image's
own label, the box's top, left, bottom, right as fractions of the side]; they are cut with the batch."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bigbatch.data.streams import MIX
from bigbatch.errors import BigbatchError

MIXUP, CUTMIX = 1, 2


def draw(
    batch: int, mixup: float, cutmix: float, seed: int, nimg: int, prob: float = 1.0, switch: float = 0.5
) -> torch.Tensor:
    """The mixing of the step at `nimg` of `batch` images (even), one row per image (see the module); drawn
    by NumPy's generator (whose Beta draws are vectorized; torch's Beta takes no generator) from a seed of the
    step's own. As timm's: with both, a pair takes CutMix with probability `switch`; it is mixed at all with
    probability `prob` (else its own weight 1, no box)."""
    pairs = batch // 2
    rng = np.random.default_rng(np.random.SeedSequence([seed & 0xFFFFFFFFFFFFFFFF, MIX, nimg]))
    boxed = rng.random(pairs) < switch if mixup and cutmix else np.full(pairs, not mixup)
    alpha = np.where(boxed, cutmix or 1.0, mixup or 1.0)
    lam = rng.beta(alpha, alpha)
    # CutMix's box: of area 1 - lam, centred anywhere, clipped to the image; lam is then its true complement.
    cy, cx = rng.random(pairs), rng.random(pairs)
    half = np.sqrt(1 - lam) / 2
    top, bottom = np.clip(cy - half, 0, 1), np.clip(cy + half, 0, 1)
    left, right = np.clip(cx - half, 0, 1), np.clip(cx + half, 0, 1)
    lam = np.where(boxed, 1 - (bottom - top) * (right - left), lam)
    if prob < 1:  # (drawn last: with every pair mixed, the draws are those of before)
        kept = rng.random(pairs) >= prob  # (a pair left as it is: its own weight 1, no box)
        lam, boxed = np.where(kept, 1.0, lam), boxed & ~kept
        top, left, bottom, right = (np.where(kept, 0.0, side) for side in (top, left, bottom, right))
    kind = np.where(boxed, CUTMIX, MIXUP)
    rows = torch.from_numpy(np.stack([kind, lam, top, left, bottom, right], 1)).float()
    return rows.repeat_interleave(2, 0)  # (both images of a pair: the same draws)


def partner(t: torch.Tensor) -> torch.Tensor:
    """Each image's (or label's) neighbour: 2k <-> 2k + 1 (an even number of rows, pairs never cut)."""
    return t.reshape(len(t) // 2, 2, *t.shape[1:]).flip(1).reshape(t.shape)


def mix(x: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Images NCHW mixed with their neighbours by their rows of `draw` (on x's device), and the weight of each
    image's own label: a CutMix's, the share of its pixels left its own at this resolution (as timm's box of
    whole pixels; the box's fractions are at any size)."""
    rows = rows.to(x.device, non_blocking=True)
    h, w = x.shape[2], x.shape[3]
    ys = (torch.arange(h, device=x.device, dtype=torch.float32) + 0.5) / h
    xs = (torch.arange(w, device=x.device, dtype=torch.float32) + 0.5) / w
    top, left, bottom, right = (rows[:, i].view(-1, 1, 1) for i in range(2, 6))
    rows_in = (ys.view(1, h, 1) >= top) & (ys.view(1, h, 1) < bottom)
    inside = rows_in & (xs.view(1, 1, w) >= left) & (xs.view(1, 1, w) < right)
    # Each pixel's weight of the image's own: mixup's lam everywhere, CutMix's 0 inside its box and 1 outside.
    cutmix = rows[:, 0] == CUTMIX
    weight = torch.where(cutmix.view(-1, 1, 1), (~inside).float(), rows[:, 1].view(-1, 1, 1)).unsqueeze(1)
    mixed = weight.to(x.dtype) * x + (1 - weight.to(x.dtype)) * partner(x)
    return mixed, torch.where(cutmix, weight.mean((1, 2, 3)), rows[:, 1])


def loss(logits: torch.Tensor, labels: torch.Tensor, lam: torch.Tensor, smoothing: float) -> torch.Tensor:
    """The cross-entropy against each image's mixed target: `lam` (what `mix` returned) of its own (smoothed)
    label and 1 - lam of its neighbour's, the mean over the micro-batch (smoothing is linear in the target:
    this is timm's loss on its mixed, smoothed targets)."""
    lam = lam.to(logits.device, non_blocking=True)
    own = F.cross_entropy(logits, labels, label_smoothing=smoothing, reduction="none")
    theirs = F.cross_entropy(logits, partner(labels), label_smoothing=smoothing, reduction="none")
    return (lam * own + (1 - lam) * theirs).mean()


def targets(labels: torch.Tensor, classes: int, smoothing: float, lam: torch.Tensor | None = None) -> torch.Tensor:
    """Each image's target over the classes, as timm's mixup_target: its label smoothed (1 - smoothing +
    smoothing / classes, the others smoothing / classes), `lam` of it and 1 - lam of its neighbour's where mixed."""
    off = smoothing / classes
    own = F.one_hot(labels, classes).float() * (1 - smoothing) + off
    if lam is None:
        return own
    lam = lam.to(own.device, non_blocking=True).view(-1, 1)
    return lam * own + (1 - lam) * partner(own)


def bce(logits: torch.Tensor, target: torch.Tensor, threshold: float) -> torch.Tensor:
    """timm's BinaryCrossEntropy of the logits against `targets`: the mean over images and classes; `threshold`
    (> 0) makes the targets above it 1 and the others 0 (its target_threshold)."""
    target = (target > threshold).float() if threshold else target
    return F.binary_cross_entropy_with_logits(logits, target)


def check(t: Any) -> None:
    """The train section's keys of mixing and of the binary cross-entropy, refused where nothing reads them."""
    given = t.changed("mixup_prob", "mixup_switch_prob", "mixup_off_kimg")
    if given and not (t.mixup or t.cutmix):
        raise BigbatchError(f"config key '{given[0]}' is read with train.mixup or train.cutmix, and both are off")
    if t.changed("mixup_switch_prob") and not (t.mixup and t.cutmix):
        t._fail("mixup_switch_prob", "picks CutMix over mixup for a pair: it is read with both train.mixup and cutmix")
    if t.bce_threshold and not t.bce_loss:
        t._fail("bce_threshold", "is the binary cross-entropy's (train.bce_loss = true), which is off")
    if (t.mixup or t.cutmix) and t.mixup_prob == 0:  # (found from outside: mixing asked for, none done)
        t._fail("mixup_prob", "is 0: no pair is mixed; turn mixing off with train.mixup = 0 and train.cutmix = 0")


def check_threshold(t: Any, classes: int) -> None:
    """train.bce_threshold between a smoothed target's two values for `classes` classes: at or above an image's own
    class's, 1 - smoothing + smoothing / classes, every target is 0 (found from outside: a run that learned nothing);
    at or below the others', smoothing / classes, every one is 1."""
    if not t.bce_threshold:
        return
    own, other = 1 - t.label_smoothing + t.label_smoothing / classes, t.label_smoothing / classes
    if not other < t.bce_threshold < own:
        t._fail(
            "bce_threshold",
            f"must lie between a smoothed target's values for {classes} classes, {other:g} and {own:g} (outside them "
            f"every target is {0 if t.bce_threshold >= own else 1}), got {t.bce_threshold:g}",
        )
