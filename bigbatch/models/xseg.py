"""DeepFaceLab's XSeg: the face segmentation network DFL trains on hand-drawn polygons and applies to aligned
faces (their `xseg_mask`), layer for layer as leras builds it (core/leras/models/XSeg.py), so that DFL's own
weight file (`XSeg_256.npy`, e.g. its generic XSeg model) loads into it and back (models/dfl.py's format).

A U-Net at 256 px: six down stages of 3x3 convolutions with filter response normalisation and a thresholded
linear unit (FRN + TLU, Singh and Krishnan 2019) and anti-aliased pooling (BlurPool, Zhang 2019), a dense
bottleneck at 4x4, and six up stages of transposed convolutions with skips. Input: BGR in [0, 1] as DFL
feeds it (cv2's order; the weights are DFL's); output: the mask's logits (N, 1, 256, 256).

Where leras and torch differ, leras is followed: its SAME transposed convolution is the gradient of a SAME
strided convolution (padding after, not around: torch's padding=0, then the first 2n rows and columns), and its
flatten and reshape read NCHW order in either data format (so the dense layers' weights are as saved).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bigbatch.errors import BigbatchError, whole_number
from bigbatch.models.registry import register

RESOLUTION = 256  # (the dense bottleneck is at 4x4 after six halvings: the network reads 256 px only)


class FRNorm(nn.Module):
    """Filter response normalisation: x / sqrt(mean over H, W of x^2 + |eps|), then weight and bias."""

    def __init__(self, ch: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ch))
        self.bias = nn.Parameter(torch.zeros(ch))
        self.eps = nn.Parameter(torch.full((1,), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        nu2 = x.float().square().mean(dim=(2, 3), keepdim=True)  # (float32: a mean over 65,536 squares)
        x = x * torch.rsqrt(nu2 + self.eps.abs()).to(x.dtype)
        return x * self.weight.view(1, -1, 1, 1) + self.bias.view(1, -1, 1, 1)


class TLU(nn.Module):
    """max(x, tau), tau per channel."""

    def __init__(self, ch: int) -> None:
        super().__init__()
        self.tau = nn.Parameter(torch.zeros(ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.maximum(x, self.tau.view(1, -1, 1, 1).to(x.dtype))


class BlurPool(nn.Module):
    """leras's BlurPool: a normalised binomial filter of `size` taps, padded floor/ceil((size - 1) / 2), stride 2."""

    def __init__(self, size: int) -> None:
        super().__init__()
        a = np.array([[1.0], [1.0, 1.0], [1.0, 2.0, 1.0], [1.0, 3.0, 3.0, 1.0]][size - 1])
        k = np.outer(a, a)
        self.register_buffer("kernel", torch.from_numpy(k / k.sum()).float()[None, None], persistent=False)
        self.pad = ((size - 1) // 2, (size - 1) - (size - 1) // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        before, after = self.pad
        x = F.pad(x, (before, after, before, after))
        kernel = self.kernel.to(x.dtype).expand(x.shape[1], 1, -1, -1)
        return F.conv2d(x, kernel, stride=2, groups=x.shape[1])


class ConvBlock(nn.Module):
    """3x3 convolution, FRN, TLU; `up`: leras's Conv2DTranspose 3x3 stride 2 SAME instead (see the module)."""

    def __init__(self, cin: int, cout: int, up: bool = False) -> None:
        super().__init__()
        self.up = up
        self.conv = nn.ConvTranspose2d(cin, cout, 3, stride=2) if up else nn.Conv2d(cin, cout, 3, padding=1)
        self.frn = FRNorm(cout)
        self.tlu = TLU(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[2:]
        y = self.conv(x)
        return self.tlu(self.frn(y[:, :, : 2 * h, : 2 * w] if self.up else y))


# (name, its in and out channels in units of base_ch) of each stage, in leras's order and names
_DOWN = [
    [("conv01", 0, 1), ("conv02", 1, 1)],
    [("conv11", 1, 2), ("conv12", 2, 2)],
    [("conv21", 2, 4), ("conv22", 4, 4)],
    [("conv31", 4, 8), ("conv32", 8, 8), ("conv33", 8, 8)],
    [("conv41", 8, 8), ("conv42", 8, 8), ("conv43", 8, 8)],
    [("conv51", 8, 8), ("conv52", 8, 8), ("conv53", 8, 8)],
]
_BLUR = (4, 3, 2, 2, 2, 2)
# (up block, in, out), then the convs after it: the first reads the up block's output and the skip
_UP = [
    (("up5", 8, 4), [("uconv53", 12, 8), ("uconv52", 8, 8), ("uconv51", 8, 8)]),
    (("up4", 8, 4), [("uconv43", 12, 8), ("uconv42", 8, 8), ("uconv41", 8, 8)]),
    (("up3", 8, 4), [("uconv33", 12, 8), ("uconv32", 8, 8), ("uconv31", 8, 8)]),
    (("up2", 8, 4), [("uconv22", 8, 4), ("uconv21", 4, 4)]),
    (("up1", 4, 2), [("uconv12", 4, 2), ("uconv11", 2, 2)]),
    (("up0", 2, 1), [("uconv02", 2, 1), ("uconv01", 1, 1)]),
]


class XSeg(nn.Module):
    """DFL's XSeg(in_ch=3, base_ch=32, out_ch=1); `base_ch` smaller only for tests."""

    def __init__(self, base_ch: int = 32, in_ch: int = 3) -> None:
        super().__init__()
        self.base_ch = base_ch

        def ch(units: int) -> int:
            return in_ch if units == 0 else units * base_ch

        for stage, size in zip(_DOWN, _BLUR):
            for name, cin, cout in stage:
                self.add_module(name, ConvBlock(ch(cin), ch(cout)))
            self.add_module(f"bp{stage[0][0][4]}", BlurPool(size))
        self.dense1 = nn.Linear(4 * 4 * base_ch * 8, 512)
        self.dense2 = nn.Linear(512, 4 * 4 * base_ch * 8)
        for (up, cin, cout), convs in _UP:
            self.add_module(up, ConvBlock(ch(cin), ch(cout), up=True))
            for name, cin, cout in convs:
                self.add_module(name, ConvBlock(ch(cin), ch(cout)))
        self.out_conv = nn.Conv2d(base_ch, 1, 3, padding=1)

    @property
    def checkpoint_blocks(self) -> list[str]:
        """The convolution blocks (the activations that weigh, at 256 px and 128 px)."""
        return [name for name, m in self.named_children() if isinstance(m, ConvBlock)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Mask logits (N, 1, 256, 256) of BGR faces (N, 3, 256, 256) in [0, 1]."""
        if tuple(x.shape[2:]) != (RESOLUTION, RESOLUTION):
            raise ValueError(f"XSeg reads {RESOLUTION}x{RESOLUTION} faces, got {tuple(x.shape[2:])}")
        skips = []
        for stage in _DOWN:
            for name, _, _ in stage:
                x = getattr(self, name)(x)
            skips.append(x)
            x = getattr(self, f"bp{stage[0][0][4]}")(x)
        x = self.dense2(self.dense1(x.flatten(1)))  # (NCHW order, as leras's flatten in either format)
        x = x.view(-1, self.base_ch * 8, 4, 4)
        for ((up, _, _), convs), skip in zip(_UP, reversed(skips)):
            x = getattr(self, up)(x)
            x = torch.cat([x, skip], dim=1)
            for name, _, _ in convs:
                x = getattr(self, name)(x)
        return self.out_conv(x)


@register(init="xavier", task="xseg")
def xseg(*, resolution: int, img_channels: int, base_ch: int = 32) -> XSeg:
    """DFL's XSeg (Glorot-uniform weights and zero biases, as leras initialises it): 256 px BGR faces in, their
    mask's logits out. `base_ch`: 32, DFL's (its weight files load into that only)."""
    if resolution != RESOLUTION:
        raise BigbatchError(f"XSeg reads {RESOLUTION} px faces (DFL's network): set data.resolution={RESOLUTION}")
    if img_channels != 3:
        raise BigbatchError(f"XSeg reads colour faces (3 channels), not {img_channels}")
    whole_number("base_ch", base_ch, 1)
    return XSeg(base_ch=base_ch)
