"""SAEHD's losses, as DeepFaceLab computes them (core/leras/ops, models/Model_SAEHD/Model.py)."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.nn import functional as F


@functools.lru_cache(maxsize=16)
def _gaussian(size: int, sigma: float) -> torch.Tensor:
    """DFL's SSIM window, softmax of -(dx² + dy²) / 2σ² about the window's centre (σ fixed at 1.5), as
    its separable factor: the window is the outer product of this 1-D softmax with itself."""
    d = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    return torch.softmax(-(d**2) / (2 * sigma**2), 0).float()


def _separable(x: torch.Tensor, kernel: torch.Tensor, padding: int = 0) -> torch.Tensor:
    """x (N, C, H, W) filtered per channel by kernel ⊗ kernel, as two 1-D convolutions."""
    return _Separable.apply(x, kernel.to(x.device, x.dtype, non_blocking=True), padding)


def _filter(x: torch.Tensor, kernel: torch.Tensor, padding: int) -> torch.Tensor:
    c, k = x.shape[1], len(kernel)
    x = F.conv2d(x, kernel.view(1, 1, k, 1).expand(c, 1, k, 1), padding=(padding, 0), groups=c)
    return F.conv2d(x, kernel.view(1, 1, 1, k).expand(c, 1, 1, k), padding=(0, padding), groups=c)


class _Separable(torch.autograd.Function):
    """A fixed filter is linear: its backward is the transposed filter on the gradient and needs no saved
    input. (Autograd's convolutions would keep theirs: the four images DSSIM averages and their half-
    filtered copies, 0.2 GiB a call at 512 px and batch 8.)"""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, kernel: torch.Tensor, padding: int) -> torch.Tensor:
        ctx.save_for_backward(kernel)
        ctx.padding = padding
        return _filter(x, kernel, padding)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (kernel,) = ctx.saved_tensors
        c, k, p = grad.shape[1], len(kernel), ctx.padding
        kernel = kernel.to(grad.dtype)
        if grad.is_cuda:
            # The transposed filter as the flipped one over a padding of k-1-p (the same products): on a GPU
            # a grouped transposed convolution goes to cuDNN, which took a 491 MiB workspace for DSSIM's
            # 44-tap window at 512 px and batch 8 (an H200, fp32: the step's peak); a plain depthwise one
            # runs PyTorch's own kernel, with none. On CPU the transposed one is 2-3x faster (oneDNN).
            return _filter(grad.contiguous(), kernel.flip(0), k - 1 - p), None, None
        grad = F.conv_transpose2d(grad, kernel.view(1, 1, 1, k).expand(c, 1, 1, k), padding=(0, p), groups=c)
        grad = F.conv_transpose2d(grad, kernel.view(1, 1, k, 1).expand(c, 1, k, 1), padding=(p, 0), groups=c)
        return grad, None, None


def dssim(a: torch.Tensor, b: torch.Tensor, filter_size: int, max_val: float = 1.0, sigma: float = 1.5) -> torch.Tensor:
    """(1 - SSIM) / 2 per image and channel, (N, C), as DFL's nn.dssim: a Gaussian window without
    padding (valid positions only), k1 0.01, k2 0.03. Always computed in float32, whatever autocast
    says: the large windows overflow float16 (and lose too much in bfloat16). The window is applied as
    two 1-D passes (the same sums; 2k instead of k² products per pixel: 88 not 1,936 at 512 px), to
    the four images it averages at once (one convolution of 4C channels: 1.5-1.8x faster than four)."""
    size = max(1, int(filter_size))
    with torch.autocast(a.device.type, enabled=False):
        a, b = a.float(), b.float()
        c1, c2 = (0.01 * max_val) ** 2, (0.03 * max_val) ** 2
        means = _separable(torch.cat([a, b, a * b, a.square() + b.square()], dim=1), _gaussian(size, sigma))
        mu_a, mu_b, mean_ab, mean_squares = means.chunk(4, dim=1)
        num0, den0 = mu_a * mu_b * 2.0, mu_a.square() + mu_b.square()
        luminance = (num0 + c1) / (den0 + c1)
        cs = (mean_ab * 2.0 - num0 + c2) / (mean_squares - den0 + c2)
        return (1.0 - (luminance * cs).mean(dim=(2, 3))) / 2.0


def ssim(a: torch.Tensor, b: torch.Tensor, resolution: int) -> torch.Tensor:
    """The SSIM per image (N,) that SAEHD's first DSSIM term measures (window int(res / 11.6))."""
    return 1 - 2 * dssim(a, b, int(resolution / 11.6)).mean(1)


def gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """DFL's nn.gaussian_blur: a normalised Gaussian of max(3, int(4σ)) taps (made odd), zero padding."""
    size = max(3, int(4 * sigma))
    size += 1 - size % 2
    d = torch.arange(size, dtype=torch.float64) - size // 2
    kernel = torch.exp(-(d**2) / (2 * sigma**2))
    return _separable(x, (kernel / kernel.sum()).float(), size // 2)


def blur_out(image: torch.Tensor, mask: torch.Tensor, resolution: int) -> torch.Tensor:
    """DFL's blur_out_mask: the image outside the mask replaced by its background blurred (σ res/128)
    and renormalised by the blurred background weight, so the area next to the face is smoothed
    (float32, whatever autocast says)."""
    sigma = resolution / 128
    with torch.autocast(image.device.type, enabled=False):
        image, mask = image.float(), mask.float()
        anti = 1 - mask
        background = gaussian_blur(image * anti, sigma)
        weight = 1 - gaussian_blur(mask, sigma)
        weight = torch.where(weight == 0, torch.ones_like(weight), weight)
        return image * mask + background / weight * anti


def style_loss(content: torch.Tensor, style: torch.Tensor, blur: float, weight: float) -> torch.Tensor:
    """DFL's nn.style_loss per sample (N,): both blurred (σ `blur`), then the squared differences of
    their per-channel means and standard deviations (sqrt(var + 1e-5)), summed, × weight / channels."""
    with torch.autocast(content.device.type, enabled=False):
        content, style = content.float(), style.float()
        if blur > 0:
            content, style = gaussian_blur(content, blur), gaussian_blur(style, blur)
        c_var, c_mean = torch.var_mean(content, dim=(2, 3), correction=0)
        s_var, s_mean = torch.var_mean(style, dim=(2, 3), correction=0)
        mean_loss = (c_mean - s_mean).square().sum(1)
        std_loss = ((c_var + 1e-5).sqrt() - (s_var + 1e-5).sqrt()).square().sum(1)
        return (mean_loss + std_loss) * (weight / content.shape[1])


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
