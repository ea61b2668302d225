"""A GAN's previews during training: a fixed-seed sample grid from G_ema, and at checkpoints its class
sheet (one row per class, same z) and interpolation sheet."""

from __future__ import annotations

import torch
from PIL import Image
from torch import nn

from bigbatch.config import SampleConfig
from bigbatch.sampling import class_sheet, draw_latents, generate, grid, interpolation_sheet


class Sheets:
    """sample.n images from the same z (and one class per row of 8) all run long, so grids compare."""

    def __init__(self, sample: SampleConfig, dim_z: int, n_classes: int):
        self.seed, self.n_classes = sample.seed, n_classes
        self.z, self.y = draw_latents(sample.n, dim_z, sample.seed, 0, truncation=sample.truncation)
        if n_classes:
            self.y = (torch.arange(sample.n) // 8) % n_classes

    def __call__(self, G_ema: nn.Module, at_checkpoint: bool) -> dict[str, Image.Image]:
        """The sample grid, or with `at_checkpoint` the sheets written with each checkpoint."""
        if at_checkpoint:
            sheets = {"classes": class_sheet(G_ema, self.seed)} if self.n_classes else {}
            return {**sheets, "interp": interpolation_sheet(G_ema, self.seed)}
        device = next(G_ema.parameters()).device
        return {"grid": grid(generate(G_ema, self.z.to(device), None if self.y is None else self.y.to(device)))}
