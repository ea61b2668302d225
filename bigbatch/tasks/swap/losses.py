"""SAEHD's losses, as DeepFaceLab computes them (core/leras/ops, models/Model_SAEHD/Model.py)."""

from __future__ import annotations

import functools

import torch
from torch.nn import functional as F


@functools.lru_cache(maxsize=16)
def _gaussian(size: int, sigma: float) -> torch.Tensor:
    """DFL's SSIM window: softmax of -(dx² + dy²) / 2σ² about the window's centre (σ fixed at 1.5)."""
    d = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    logits = -(d[None, :] ** 2 + d[:, None] ** 2) / (2 * sigma**2)
    return torch.softmax(logits.flatten(), 0).view(1, 1, size, size).float()


def dssim(a: torch.Tensor, b: torch.Tensor, filter_size: int, max_val: float = 1.0, sigma: float = 1.5) -> torch.Tensor:
    """(1 - SSIM) / 2 per image and channel, (N, C), as DFL's nn.dssim: a Gaussian window without
    padding (valid positions only), k1 0.01, k2 0.03. Always computed in float32, whatever autocast
    says: the large windows overflow float16 (and lose too much in bfloat16)."""
    size = max(1, int(filter_size))
    with torch.autocast(a.device.type, enabled=False):
        a, b = a.float(), b.float()
        channels = a.shape[1]
        window = _gaussian(size, sigma).to(a.device).expand(channels, 1, size, size)

        def mean(x: torch.Tensor) -> torch.Tensor:
            return F.conv2d(x, window, groups=channels)

        c1, c2 = (0.01 * max_val) ** 2, (0.03 * max_val) ** 2
        mu_a, mu_b = mean(a), mean(b)
        num0, den0 = mu_a * mu_b * 2.0, mu_a.square() + mu_b.square()
        luminance = (num0 + c1) / (den0 + c1)
        num1, den1 = mean(a * b) * 2.0, mean(a.square() + b.square())
        cs = (num1 - num0 + c2) / (den1 - den0 + c2)
        return (1.0 - (luminance * cs).mean(dim=(2, 3))) / 2.0


def reconstruction_loss(target: torch.Tensor, pred: torch.Tensor, resolution: int) -> torch.Tensor:
    """SAEHD's image term per sample (N,): 10·DSSIM (window res/11.6) below 256 px, from 256 px
    5·DSSIM(res/11.6) + 5·DSSIM(res/23.2); plus 10·MSE. The rest of SAEHD's loss is the task's: with
    masked training both images are first multiplied by the target mask blurred (σ max(1, res//32)),
    clipped to [0, 0.5] and doubled; each side adds 10·MSE of its predicted mask against the target's
    (unblurred), and 300·L1 inside the eyes and mouth when that priority is on. DFL differentiates the
    sum over each GPU's samples (a mean times the per-GPU batch), which matters for clipnorm."""
    if resolution < 256:
        loss = 10 * dssim(target, pred, int(resolution / 11.6)).mean(1)
    else:
        loss = 5 * dssim(target, pred, int(resolution / 11.6)).mean(1)
        loss = loss + 5 * dssim(target, pred, int(resolution / 23.2)).mean(1)
    return loss + 10 * (target.float() - pred.float()).square().mean(dim=(1, 2, 3))
