"""Random erasing (Zhong et al. 2020) as timm applies it (--reprob, --remode pixel): with probability p an
image gets one rectangle of 2% to 1/3 of its area, of aspect ratio log-uniform in [0.3, 1/0.3] (ten tries
to fit, else none), filled with per-pixel normal noise. timm's noise is N(0, 1) after ImageNet's mean and
std; here images are in [-1, 1], where that is a normal of mean 2 mean - 1 and standard deviation 2 std,
channel by channel (about -0.03 to -0.19 and 0.45; a grey image takes their averages).

On the device, after RandAugment. The rectangles are drawn on the host for the whole step, keyed by the
step and each image's place in it; the noise is a hash of a per-image key and the pixel's index, computed
where the image is, so the erased images do not depend on the micro-batch, the number of processes or the
device's random generator.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from bigbatch.data.streams import ERASE
from bigbatch.models.resnet import IMAGENET_MEAN, IMAGENET_STD  # (timm's normalization)

AREA = (0.02, 1 / 3)
RATIO = (0.3, 1 / 0.3)
TRIES = 10
# A row per image: [erased (0/1), top, left, height, width (fractions of the side), noise key (< 2**24)].
ERASED, TOP, LEFT, HEIGHT, WIDTH, KEY = range(COLUMNS := 6)


def draw(p: float, batch: int, seed: int, nimg: int) -> np.ndarray:
    """The step's rectangles (batch, 6), as timm's RandomErasing draws one: up to ten tries of an area and
    an aspect ratio until the rectangle fits, then its place uniformly."""
    rng = np.random.default_rng(np.random.SeedSequence([seed & 0xFFFFFFFFFFFFFFFF, ERASE, nimg]))
    out = np.zeros((batch, COLUMNS), np.float32)
    erased = rng.random(batch) < p
    area = rng.uniform(*AREA, (batch, TRIES))
    ratio = np.exp(rng.uniform(math.log(RATIO[0]), math.log(RATIO[1]), (batch, TRIES)))
    height, width = np.sqrt(area * ratio), np.sqrt(area / ratio)
    fits = (height < 1) & (width < 1)
    first = fits.argmax(1)  # the first try that fits
    rows = np.arange(batch)
    out[:, ERASED] = erased & fits.any(1)
    out[:, HEIGHT], out[:, WIDTH] = height[rows, first], width[rows, first]
    out[:, TOP] = rng.random(batch) * (1 - out[:, HEIGHT])
    out[:, LEFT] = rng.random(batch) * (1 - out[:, WIDTH])
    out[:, KEY] = rng.integers(0, 1 << 24, batch)
    return out


def _mix32(h: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (int64 holding values below 2**32): xor-shifts and multiplies."""
    h = h ^ (h >> 16)
    h = (h * 0x7FEB352D) & 0xFFFFFFFF
    h = h ^ (h >> 15)
    h = (h * 0x846CA68B) & 0xFFFFFFFF
    return h ^ (h >> 16)


def noise(keys: torch.Tensor, shape: tuple[int, int, int]) -> torch.Tensor:
    """N(0, 1) noise (len(keys), *shape) on keys' device, a function of each key and the pixel's index."""
    count = shape[0] * shape[1] * shape[2]
    index = torch.arange(count, device=keys.device, dtype=torch.int64)
    h = _mix32((keys.view(-1, 1) * 0x9E3779B1 + index) & 0xFFFFFFFF)
    g = _mix32(h ^ 0x5BD1E995)
    # Box-Muller in float32 from 24 bits each (float64 runs at a 32nd of the speed on a consumer GPU, and
    # not at all on some: found by review); u1 in (0, 1], so its log is finite.
    u1 = ((h >> 8).float() + 0.5) / 2**24
    u2 = (g >> 8).float() / 2**24
    z = torch.sqrt(-2 * torch.log(u1)) * torch.cos(2 * math.pi * u2)
    return z.view(len(keys), *shape)


def _fill(c: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The noise's mean and standard deviation per channel in [-1, 1] (see the module), (1, c, 1, 1) each."""
    mean = [2 * m - 1 for m in IMAGENET_MEAN]
    std = [2 * s for s in IMAGENET_STD]
    if c != 3:
        mean, std = [sum(mean) / 3] * c, [sum(std) / 3] * c
    # (made on the host and copied without waiting: torch.tensor(data, device=cuda) copies blocking, found by review)
    both = torch.tensor([mean, std], device="cpu").to(device, non_blocking=True)
    return both[0].view(1, c, 1, 1), both[1].view(1, c, 1, 1)


def apply(x: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
    """Images x (N, C, H, W, in [-1, 1]) with their rectangles of `rows` (on the host) filled with noise."""
    erased = np.flatnonzero(rows[:, ERASED] > 0)
    if not len(erased):
        return x
    c, h, w = x.shape[1:]
    with torch.no_grad():
        at = torch.from_numpy(erased).to(x.device, non_blocking=True)
        box = torch.from_numpy(rows[erased]).to(x.device, non_blocking=True)
        # Whole pixels, as timm's: rounded sides, the top-left corner at a whole pixel.
        sides = torch.stack([(box[:, HEIGHT] * h).round().clamp(1, h), (box[:, WIDTH] * w).round().clamp(1, w)], 1)
        top = (box[:, TOP] * h).floor().clamp(max=h - sides[:, 0])
        left = (box[:, LEFT] * w).floor().clamp(max=w - sides[:, 1])
        ys = torch.arange(h, device=x.device).view(1, h, 1)
        xs = torch.arange(w, device=x.device).view(1, 1, w)
        inside = (ys >= top.view(-1, 1, 1)) & (ys < (top + sides[:, 0]).view(-1, 1, 1))
        inside = inside & (xs >= left.view(-1, 1, 1)) & (xs < (left + sides[:, 1]).view(-1, 1, 1))
        mean, std = _fill(c, x.device)
        fill = noise(box[:, KEY].long(), (c, h, w)) * std + mean
        images = torch.where(inside.unsqueeze(1), fill.to(x.dtype), x[at])
        return x.index_put((at,), images)
