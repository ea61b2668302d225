"""Crops of whole stored images, decided before decoding: the center square (GANs, validation) and the
random-resized crop of classifier training (Szegedy et al. 2015, torchvision's RandomResizedCrop:
area fraction in [min_scale, 1] of the whole image, aspect ratio log-uniform in [3/4, 4/3], ten tries,
then the center crop of the nearest allowed ratio). A step's draws come from one stream keyed by the
seed and the step's position, sliced by rank, so a crop depends on the image's global position only."""

from __future__ import annotations

import math

import torch

from bigbatch.data.streams import RRC, generator

TRIES = 10  # torchvision's
RATIO = (3 / 4, 4 / 3)


def rrc_draws(seed: int, nimg: int, batch: int) -> torch.Tensor:
    """The uniforms (batch, TRIES, 4) of a whole step's random-resized crops: area, log ratio, top, left."""
    return torch.rand(batch, TRIES, 4, generator=generator(seed, RRC, nimg), dtype=torch.float64)


def rrc_box(width: int, height: int, draws: torch.Tensor, min_scale: float) -> tuple[int, int, int, int]:
    """(left, top, w, h) of a random-resized crop of a width x height image from its draws (TRIES, 4)."""
    area = width * height
    lo, hi = math.log(RATIO[0]), math.log(RATIO[1])
    for u_area, u_ratio, u_top, u_left in draws.tolist():
        target = area * (min_scale + (1 - min_scale) * u_area)
        aspect = math.exp(lo + (hi - lo) * u_ratio)
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return int(u_left * (width - w + 1)), int(u_top * (height - h + 1)), w, h
    in_ratio = width / height
    if in_ratio < RATIO[0]:
        w, h = width, round(width / RATIO[0])
    elif in_ratio > RATIO[1]:
        w, h = round(height * RATIO[1]), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def center_box(width: int, height: int) -> tuple[int, int, int, int]:
    """(left, top, w, h) of the centered square of the short side."""
    side = min(width, height)
    return (width - side) // 2, (height - side) // 2, side, side
