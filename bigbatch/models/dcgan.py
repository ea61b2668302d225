"""DCGAN (Radford et al. 2016) as in PyTorch's DCGAN tutorial, any power-of-two resolution >= 16.

G: z -> 4x4 by a transposed conv, then stride-2 transposed convs halving the channels each time,
BN + ReLU between, tanh at the end. D mirrors it with stride-2 convs and LeakyReLU(0.2). With classes,
G's BatchNorms are class-conditional and D gains a projection head (Miyato & Koyama 2018); with
`d_sn` (the default here) D is spectrally normalised instead of batch-normalised (SN-DCGAN); with neither (`d_sn` and
`d_bn` false) it is WGAN-GP's critic (Gulrajani et al. 2017: no normalisation, whose gradient penalty is per image).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from bigbatch.errors import BigbatchError
from bigbatch.models import layers
from bigbatch.models.registry import register


def _levels(resolution: int) -> int:
    if resolution < 16 or resolution & (resolution - 1):
        raise BigbatchError(f"dcgan supports power-of-two resolutions >= 16 (data.resolution), got {resolution}")
    return int(math.log2(resolution)) - 2  # stride-2 layers between 4x4 and the output


class GBlock(nn.Module):
    """BN (class-conditional with classes, starting as the identity) -> ReLU -> stride-2 transposed conv."""

    def __init__(self, cin: int, cout: int, *, n_classes: int, bn_eps: float, sn: bool, sn_eps: float):
        super().__init__()
        # Unconditional, the tutorial's BN sits at `bn` itself: checkpoints name it blocks.<i>.bn.weight.
        if n_classes:
            self.bn = layers.ConditionalBatchNorm2d(cin, n_classes=n_classes, eps=bn_eps, start="identity")
        else:
            self.bn = nn.BatchNorm2d(cin, eps=bn_eps)
        self.conv = layers.conv_transpose2d(cin, cout, 4, 2, 1, bias=False, sn=sn, sn_eps=sn_eps)
        self.conditional = bool(n_classes)

    def forward(self, h: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
        return self.conv(torch.relu(self.bn(h, y) if self.conditional else self.bn(h)))


class DBlock(nn.Module):
    """Stride-2 conv -> BN (or nothing, with spectral norm) -> LeakyReLU(0.2)."""

    def __init__(self, conv: nn.Module, bn: nn.Module):
        super().__init__()
        self.conv, self.bn = conv, bn

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return nn.functional.leaky_relu(self.bn(self.conv(h)), 0.2)


class DCGANGenerator(nn.Module):
    """The tutorial's G, with the class one-hot joined to z and class-conditional BN when conditional."""

    def __init__(
        self,
        *,
        resolution: int,
        n_classes: int,
        ch: int,
        dim_z: int,
        img_channels: int,
        g_sn: bool,
        sn_eps: float,
        bn_eps: float,
    ):
        super().__init__()
        self.resolution, self.n_classes, self.dim_z, self.img_channels = resolution, n_classes, dim_z, img_channels
        n = _levels(resolution)
        widths = [ch * 2 ** (n - 1 - i) for i in range(n)] + [img_channels]  # 32px, ch 64: 256@4, 128@8, 64@16
        sn = dict(sn=g_sn, sn_eps=sn_eps)
        # With classes, the class one-hot joins z at the input (Mirza & Osindero 2014) as well as
        # steering every BatchNorm: the direct path makes samples class-dependent from the first step.
        self.input = layers.conv_transpose2d(dim_z + n_classes, widths[0], 4, 1, 0, bias=False, **sn)
        self.blocks = nn.ModuleList(
            GBlock(a, b, n_classes=n_classes, bn_eps=bn_eps, **sn) for a, b in zip(widths, widths[1:])
        )
        self.checkpoint_blocks = [f"blocks.{i}" for i in range(len(self.blocks))]

    def forward(self, z: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        if self.n_classes:
            onehot = y if y.is_floating_point() else nn.functional.one_hot(y, self.n_classes)
            z = torch.cat([z, onehot.to(z.dtype)], dim=1)
        h = self.input(z[:, :, None, None])
        for block in self.blocks:
            h = block(h, y)
        return torch.tanh(h)


class DCGANDiscriminator(nn.Module):
    """The tutorial's D (spectral norm in place of its BNs with `d_sn`; neither with `d_bn` false too), with a
    projection head when conditional."""

    def __init__(
        self,
        *,
        resolution: int,
        n_classes: int,
        ch: int,
        img_channels: int,
        d_sn: bool,
        sn_eps: float,
        bn_eps: float,
        d_bn: bool = True,
        d_cond: str = "PD",
    ):
        super().__init__()
        self.resolution, self.n_classes = resolution, n_classes
        n = _levels(resolution)
        widths = [img_channels] + [ch * 2**i for i in range(n)]  # e.g. 32px, ch 64: 64@16, 128@8, 256@4
        sn = dict(sn=d_sn, sn_eps=sn_eps)
        # The tutorial batch-normalises every conv but the first (none with a bias); spectral norm replaces that, and a
        # D of neither has biases (WGAN-GP's critic: found from outside, positively homogeneous without them).
        self.blocks = nn.ModuleList(
            DBlock(
                layers.conv2d(a, b, 4, 2, 1, bias=d_sn or not d_bn, **sn),
                nn.Identity() if d_sn or not d_bn or i == 0 else nn.BatchNorm2d(b, eps=bn_eps),
            )
            for i, (a, b) in enumerate(zip(widths, widths[1:]))
        )
        self.output = layers.conv2d(widths[-1], 1, 4, 1, 0, bias=d_sn or not d_bn, **sn)
        self.embed, self.classify = layers.class_heads(d_cond, n_classes, widths[-1], **sn)
        self.checkpoint_blocks = [f"blocks.{i}" for i in range(len(self.blocks))]

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        h = x
        for block in self.blocks:
            h = block(h)
        out = self.output(h).flatten()
        if self.embed is None and self.classify is None:  # (unconditional: nothing reads the pooled features)
            return out
        h = h.sum(dim=(2, 3))
        if self.embed is not None:
            out = out + (self.embed(y) * h).sum(dim=1)
        return layers.with_classes(out, self.classify, h)


@register(init="N02")
def dcgan(
    *,
    resolution: int,
    n_classes: int = 0,
    ch: int = 64,
    dim_z: int = 100,
    img_channels: int = 3,
    g_sn: bool = False,
    d_sn: bool = True,
    d_bn: bool = True,
    sn_eps: float = 1e-6,
    bn_eps: float = 1e-5,
    d_cond: str = "PD",
) -> tuple[nn.Module, nn.Module]:
    """DCGAN; ch and dim_z default to the tutorial's ngf = ndf = 64, nz = 100, init N(0, 0.02);
    d_sn=False gives its BN D, d_bn=False too a D of neither (WGAN-GP's critic)."""
    if not (sn_eps > 0 and bn_eps > 0):
        raise BigbatchError(f"dcgan options sn_eps and bn_eps must be positive, got {sn_eps} and {bn_eps}")
    layers.check_d_cond("dcgan", d_cond, n_classes)
    G = DCGANGenerator(
        resolution=resolution,
        n_classes=n_classes,
        ch=ch,
        dim_z=dim_z,
        img_channels=img_channels,
        g_sn=g_sn,
        sn_eps=sn_eps,
        bn_eps=bn_eps,
    )
    D = DCGANDiscriminator(
        resolution=resolution,
        n_classes=n_classes,
        ch=ch,
        img_channels=img_channels,
        d_sn=d_sn,
        sn_eps=sn_eps,
        bn_eps=bn_eps,
        d_bn=d_bn,
        d_cond=d_cond,
    )
    return G, D
