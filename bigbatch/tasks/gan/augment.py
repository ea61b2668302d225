"""Differentiable augmentation of D's inputs, for GANs on limited data ([augment]).

D sees real and generated images through the same kinds of random transforms, in its own step and in
G's, where G's gradient flows back through them; so D cannot memorise the few real images, and G is
not pushed to make augmented-looking ones. Two sets of transforms (augment.pipeline): DiffAugment's
(Zhao et al. 2020), here, written from the paper's description: colour (brightness, saturation,
contrast), translation with zero fill, cutout; and ADA's (Karras et al. 2020; ada.py). Each applies to
an image with probability p (DiffAugment: 1); ADA's heuristic adjusts p during training so that
r_t = E[sign(D(real))], the overfitting signal, stays at a target.

Every draw is made for the whole step from a stream keyed by the step, as z is, and each rank takes
its share: a micro-batch gets the same transforms whatever the micro-batch size, world size or
resume. p changes only between steps, from the step's r_t summed over all ranks: the same on all.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from bigbatch.config import AugmentConfig
from bigbatch.data.streams import generator
from bigbatch.tasks.gan import ada

# One row of parameters per image: brightness, saturation, contrast, shift y, shift x, cutout (0/1), its y, its x.
PARAMS = 8
TRANSLATION, CUTOUT = 0.125, 0.5  # DiffAugment's: a shift of up to 1/8 of the side, a square of half of it
ADA_IMAGES = 256  # ADA adjusts p every 4 steps of batch 64; here every step of at least 256 images, or every few


def draw(policy: list[str], p: float, n: int, size: int, seed: int, stream: int, *keys: int) -> torch.Tensor:
    """The transforms of `n` images of side `size` (float32, (n, PARAMS)): each on with probability `p`,
    else the identity. The same count of numbers is drawn whatever the policy and p."""
    g = generator(seed, stream, *keys)
    on = torch.rand(n, 5, generator=g) < p  # brightness, saturation, contrast, translation, cutout
    colour = torch.rand(n, 3, generator=g)
    reach = int(size * TRANSLATION + 0.5)
    shift = torch.randint(-reach, reach + 1, (n, 2), generator=g)
    side = int(size * CUTOUT + 0.5)
    centre = torch.randint(0, size + (1 - side % 2), (n, 2), generator=g)
    out = torch.zeros(n, PARAMS)
    out[:, 1:3] = 1.0
    if "color" in policy:
        out[:, 0] = torch.where(on[:, 0], colour[:, 0] - 0.5, 0.0)
        out[:, 1] = torch.where(on[:, 1], colour[:, 1] * 2, 1.0)
        out[:, 2] = torch.where(on[:, 2], colour[:, 2] + 0.5, 1.0)
    if "translation" in policy:
        out[:, 3:5] = torch.where(on[:, 3:4], shift, 0).float()
    if "cutout" in policy:
        out[:, 5] = on[:, 4].float()
        out[:, 6:8] = centre.float()
    return out


def apply(x: torch.Tensor, params: torch.Tensor | np.ndarray, policy: list[str]) -> torch.Tensor:
    """Images `x` (N, C, H, W, square) through their transforms (`params` from `draw`, on the host or x's
    device), in the policy's order; differentiable in `x`. An image whose transform is off passes through
    that one unchanged."""
    params = torch.as_tensor(params).to(x.device, non_blocking=True)
    n, _, h, w = x.shape
    rows = torch.arange(h, device=x.device).view(1, h, 1)
    cols = torch.arange(w, device=x.device).view(1, 1, w)
    for name in policy:
        if name == "color":
            b, s, c = (params[:, i].to(x.dtype).view(n, 1, 1, 1) for i in range(3))
            x = x + b
            mean = x.mean(dim=1, keepdim=True)
            x = torch.where(s != 1, (x - mean) * s + mean, x)
            mean = x.mean(dim=(1, 2, 3), keepdim=True)
            x = torch.where(c != 1, (x - mean) * c + mean, x)
        elif name == "translation":
            y = rows + params[:, 3].long().view(n, 1, 1)  # output (i, j) reads input (i + dy, j + dx)
            z = cols + params[:, 4].long().view(n, 1, 1)
            inside = (y >= 0) & (y < h) & (z >= 0) & (z < w)
            index = (y.clamp(0, h - 1) * w + z.clamp(0, w - 1)).view(n, 1, h * w).expand(n, x.shape[1], h * w)
            x = x.reshape(n, -1, h * w).gather(2, index).view(x.shape) * inside.unsqueeze(1).to(x.dtype)
        elif name == "cutout":
            side_h, side_w = int(h * CUTOUT + 0.5), int(w * CUTOUT + 0.5)
            top = params[:, 6].long().view(n, 1, 1) - side_h // 2
            left = params[:, 7].long().view(n, 1, 1) - side_w // 2
            hole = (rows >= top) & (rows < top + side_h) & (cols >= left) & (cols < left + side_w)
            hole &= params[:, 5].bool().view(n, 1, 1)
            x = x * (~hole).unsqueeze(1).to(x.dtype)
    return x


class Augment:
    """The run's augmentation: its transforms, p and (ADA) how p follows D's sign on real images."""

    def __init__(self, cfg: AugmentConfig, seed: int):
        self.policy, self.seed = cfg.transforms, seed
        self._draw, self._apply = (ada.draw, ada.apply) if cfg.pipeline == "ada" else (draw, apply)
        self.target, self.speed = cfg.target, cfg.speed_kimg * 1000
        self.p = cfg.start_p
        self.signs = 0  # sum of sign(D(real)) over the real images since p last moved (ADA)
        self.images = 0

    @property
    def on(self) -> bool:
        return bool(self.policy)

    @property
    def highest_p(self) -> float:
        """The most p can be in this run (ADA's may reach 1): what micro_batch "auto" probes at."""
        return 1.0 if self.target else self.p

    def draw(self, n: int, size: int, stream: int, *keys: int) -> torch.Tensor:
        return self._draw(self.policy, self.p, n, size, self.seed, stream, *keys)

    def __call__(self, x: torch.Tensor, params: torch.Tensor | np.ndarray) -> torch.Tensor:
        return self._apply(x, params, self.policy)

    def observe(self, sign_mean: float, images: int) -> None:
        """ADA: after a D step on `images` real images whose mean sign of D's output was `sign_mean`
        (over all ranks), move p towards the target once ADA_IMAGES have been seen."""
        if not self.target:
            return
        self.signs += round(sign_mean * images)
        self.images += images
        if self.images >= ADA_IMAGES:
            r_t = self.signs / self.images
            step = self.images / self.speed
            direction = (r_t > self.target) - (r_t < self.target)  # up while D overfits, down while it does not
            self.p = min(1.0, max(0.0, self.p + direction * step))
            self.signs = self.images = 0

    def state_dict(self) -> dict[str, Any]:
        return {"p": self.p, "signs": self.signs, "images": self.images}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.p, self.signs, self.images = float(state["p"]), int(state["signs"]), int(state["images"])
