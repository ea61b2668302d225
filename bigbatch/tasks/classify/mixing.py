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

import numpy as np
import torch
import torch.nn.functional as F

from bigbatch.data.streams import MIX

MIXUP, CUTMIX = 1, 2


def draw(batch: int, mixup: float, cutmix: float, seed: int, nimg: int) -> torch.Tensor:
    """The mixing of the step at `nimg` of `batch` images (even), one row per image (see the module); drawn
    by NumPy's generator (whose Beta draws are vectorized; torch's Beta takes no generator) from a seed of the
    step's own."""
    pairs = batch // 2
    rng = np.random.default_rng(np.random.SeedSequence([seed & 0xFFFFFFFFFFFFFFFF, MIX, nimg]))
    boxed = rng.random(pairs) < 0.5 if mixup and cutmix else np.full(pairs, not mixup)
    alpha = np.where(boxed, cutmix or 1.0, mixup or 1.0)
    lam = rng.beta(alpha, alpha)
    # CutMix's box: of area 1 - lam, centred anywhere, clipped to the image; lam is then its true complement.
    cy, cx = rng.random(pairs), rng.random(pairs)
    half = np.sqrt(1 - lam) / 2
    top, bottom = np.clip(cy - half, 0, 1), np.clip(cy + half, 0, 1)
    left, right = np.clip(cx - half, 0, 1), np.clip(cx + half, 0, 1)
    lam = np.where(boxed, 1 - (bottom - top) * (right - left), lam)
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
