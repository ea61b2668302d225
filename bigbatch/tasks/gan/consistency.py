"""Consistency regularization of a GAN (train.cr_real, train.cr_fake, train.zcr_d, train.zcr_g), as StudioGAN trains
its CR-, ICR-BigGAN: written from the papers and StudioGAN's description, not its code.

- CR (Zhang et al. 2020): D is asked to give a real image and a copy of it flipped and shifted (by up to 1/8 of the
  side, the border reflected) the same output: cr_real x the mean squared difference of D's outputs.
- bCR (Zhao et al. 2021, "balanced"): the same on generated images too, cr_fake (the papers' and StudioGAN's
  lambda_real = lambda_fake = 10).
- zCR (Zhao et al. 2021, "latent"): G(z) and G(z + sigma n), n ~ N(0, I), sigma = zcr_radius: D is asked to judge
  them alike (zcr_d x the mean squared difference of its outputs, StudioGAN's d_lambda 20), G to make them apart
  (-zcr_g x the mean squared difference of the images, g_lambda 0.5). ICR is bCR and zCR together.

D judges the transformed copy of an image as it is, while the image itself it judges through [augment]'s
transforms when a run has them (StudioGAN's order: CR's copy of the image as read, not of its augmented one); the
nearby G(z + sigma n) goes through its G(z)'s transforms (StudioGAN's D judges it untransformed, beside the transformed
G(z)) and takes G(z)'s own draws (StyleGAN2's noise and style mixing: found from outside, 330x the distance of the
latents' move), so that zCR compares what z moved and nothing else.

Every draw is made for the whole step from a stream keyed by the step, as z is, and each rank takes its share: the
same transforms and nearby latents whatever the micro-batch size, world size or resume.
"""

from __future__ import annotations

import numpy as np
import torch

from bigbatch.config import TrainConfig
from bigbatch.data.streams import CR, generator

SHIFT = 0.125  # the largest shift, a fraction of the side (StudioGAN's random_translation ratio, 1/8)
# One row a transform: flipped (0/1), shift y, shift x.
PARAMS = 3
# The kinds of draw in the CR stream: a D step's transforms (keyed by its first image, REAL or FAKE), the nearby
# latents of a D step (by its first image) and of a G step (by its index).
TRANSFORMS, NEAR_D, NEAR_G = 0, 1, 2
REAL, FAKE = 0, 1


def draw(n: int, size: int, seed: int, *keys: int) -> torch.Tensor:
    """CR's transforms of `n` images of side `size` (float32, (n, PARAMS)): each flipped left to right with
    probability 1/2, and shifted by a whole number of pixels in [-size / 8, size / 8] each way."""
    g = generator(seed, CR, *keys)
    out = torch.empty(n, PARAMS)
    out[:, 0] = (torch.rand(n, generator=g) < 0.5).float()
    reach = int(size * SHIFT)
    out[:, 1:] = torch.randint(-reach, reach + 1, (n, 2), generator=g).float()
    return out


def apply(x: torch.Tensor, params: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Images `x` (N, C, H, W) flipped and shifted by their transforms (from `draw`, on the host or x's device):
    output (i, j) reads input (i + dy, j + dx) of the image as flipped, an index past the border reflected back into
    the image (the border pixel once: as a reflect-padded copy, torch.nn.functional.pad's "reflect"). One gather of
    the pixels, in channels-last order (as the images arrive: found by review, a flip, a where and a reshape copied
    the batch three times more, and the result, NCHW, took channels-last from the batch D reads it in)."""
    params = torch.as_tensor(params).to(x.device, non_blocking=True)
    n, c, h, w = x.shape
    rows = reflect(torch.arange(h, device=x.device).view(1, h, 1) + params[:, 1].long().view(n, 1, 1), h)
    cols = reflect(torch.arange(w, device=x.device).view(1, 1, w) + params[:, 2].long().view(n, 1, 1), w)
    cols = torch.where(params[:, 0].bool().view(n, 1, 1), w - 1 - cols, cols)  # (the flip, read off the index)
    index = (rows * w + cols).view(n, h * w, 1).expand(n, h * w, c)
    pixels = x.permute(0, 2, 3, 1).reshape(n, h * w, c)  # (a view of a channels-last batch)
    return pixels.gather(1, index).view(n, h, w, c).permute(0, 3, 1, 2)


def reflect(i: torch.Tensor, size: int) -> torch.Tensor:
    """Indices in (-size, 2 size - 1) reflected into [0, size) about the border pixels (which are not repeated)."""
    i = i.abs()
    return torch.where(i >= size, 2 * (size - 1) - i, i)


def mean_square(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The mean squared difference, in float32 (StudioGAN's MSELoss)."""
    return (a.float() - b.float()).square().mean()


class Consistency:
    """The run's consistency regularization: its weights, and the draws of one step."""

    def __init__(self, t: TrainConfig, seed: int):
        self.real, self.fake, self.d, self.g, self.radius = t.cr_real, t.cr_fake, t.zcr_d, t.zcr_g, t.zcr_radius
        self.seed = seed

    def draw(self, n: int, size: int, nimg: int, which: int) -> torch.Tensor | None:
        """The transforms of the D step at `nimg`'s real or fake images (None where that weight is 0)."""
        weight = self.real if which == REAL else self.fake
        return draw(n, size, self.seed, TRANSFORMS, nimg, which) if weight else None

    def nearby(self, z: torch.Tensor, kind: int, key: int) -> torch.Tensor:
        """Latents near the whole step's `z`: z + zcr_radius x n, n a standard normal draw of the step (`kind`
        NEAR_D and the D step's first image, or NEAR_G and the G step's index)."""
        g = generator(self.seed, CR, kind, key)
        return z + self.radius * torch.randn(z.shape, generator=g)

    @staticmethod
    def copy(x: torch.Tensor, params: np.ndarray | None) -> torch.Tensor | None:
        """CR's transformed copy of images `x` (no gradient to them), or None (`params` None: off)."""
        return None if params is None else apply(x.detach(), params)

    def d_penalties(
        self, logits_real: torch.Tensor, logits_fake: torch.Tensor, judged: list[torch.Tensor]
    ) -> dict[str, tuple[float, torch.Tensor]]:
        """The D step's penalties, by the name logged, with their weights: `judged` D's outputs on the copies of the
        real images (cr_real), of the fake ones (cr_fake) and on the images of nearby latents (zcr_d), those on."""
        pairs = iter(judged)
        said = (("cr_real_penalty", self.real, logits_real), ("cr_fake_penalty", self.fake, logits_fake))
        said += (("zcr_d_penalty", self.d, logits_fake),)
        return {name: (weight, mean_square(logits, next(pairs))) for name, weight, logits in said if weight}
