"""BigGAN (Brock et al. 2019) at 32 to 512 px, with the architecture of BigGAN-PyTorch's reference
launch scripts: residual blocks, class-conditional BN fed by a shared class embedding and a chunk of
z (hierarchical z), self-attention, spectral norm in G and D, a projection discriminator.

At 128 px with ch 96, dim_z 120, shared_dim 128 and 1000 classes, G has 70,433,988 parameters and
D 87,982,370, as the reference's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bigbatch.errors import BigbatchError
from bigbatch.models import layers
from bigbatch.models.registry import register

# Channel multipliers of ch per block (input, output) and, for D, where it downsamples.
G_ARCH = {
    32: ([4, 4, 4], [4, 4, 4]),
    64: ([16, 16, 8, 4], [16, 8, 4, 2]),
    128: ([16, 16, 8, 4, 2], [16, 8, 4, 2, 1]),
    256: ([16, 16, 8, 8, 4, 2], [16, 8, 8, 4, 2, 1]),
    512: ([16, 16, 8, 8, 4, 2, 1], [16, 8, 8, 4, 2, 1, 1]),
}
D_ARCH = {
    32: ([4, 4, 4], [4, 4, 4, 4], [True, True, False, False]),
    64: ([1, 2, 4, 8], [1, 2, 4, 8, 16], [True, True, True, True, False]),
    128: ([1, 2, 4, 8, 16], [1, 2, 4, 8, 16, 16], [True] * 5 + [False]),
    256: ([1, 2, 4, 8, 8, 16], [1, 2, 4, 8, 8, 16, 16], [True] * 6 + [False]),
    512: ([1, 1, 2, 4, 8, 8, 16], [1, 1, 2, 4, 8, 8, 16, 16], [True] * 7 + [False]),
}


class CondBatchNorm2d(nn.Module):
    """BN with gain and bias predicted linearly (spectral-normalised, no bias) from the conditioning
    vector: the shared class embedding joined with this block's chunk of z."""

    def __init__(self, num_features: int, cond_dim: int, eps: float, sn_eps: float):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features, eps=eps, affine=False)
        self.gain = layers.linear(cond_dim, num_features, bias=False, sn=True, sn_eps=sn_eps)
        self.bias = layers.linear(cond_dim, num_features, bias=False, sn=True, sn_eps=sn_eps)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        gain = 1 + self.gain(cond)[:, :, None, None]
        return self.bn(x) * gain + self.bias(cond)[:, :, None, None]


class Attention(nn.Module):
    """Self-attention (SA-GAN) with 1x1 spectral-normalised convs; phi and g are max-pooled 2x."""

    def __init__(self, ch: int, sn_eps: float):
        super().__init__()
        sn = dict(sn=True, sn_eps=sn_eps, bias=False)
        self.theta = layers.conv2d(ch, ch // 8, 1, **sn)
        self.phi = layers.conv2d(ch, ch // 8, 1, **sn)
        self.g = layers.conv2d(ch, ch // 2, 1, **sn)
        self.o = layers.conv2d(ch // 2, ch, 1, **sn)
        self.gamma = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        n, c, h, w = x.shape
        theta = self.theta(x).flatten(2)
        phi = F.max_pool2d(self.phi(x), 2).flatten(2)
        g = F.max_pool2d(self.g(x), 2).flatten(2)
        beta = torch.softmax(theta.transpose(1, 2) @ phi, dim=-1)
        o = self.o((g @ beta.transpose(1, 2)).view(n, c // 2, h, w))
        return x + self.gamma * o


class GBlock(nn.Module):
    def __init__(self, cin: int, cout: int, cond_dim: int, bn_eps: float, sn_eps: float):
        super().__init__()
        sn = dict(sn=True, sn_eps=sn_eps)
        self.bn1 = CondBatchNorm2d(cin, cond_dim, bn_eps, sn_eps)
        self.conv1 = layers.conv2d(cin, cout, 3, padding=1, **sn)
        self.bn2 = CondBatchNorm2d(cout, cond_dim, bn_eps, sn_eps)
        self.conv2 = layers.conv2d(cout, cout, 3, padding=1, **sn)
        self.conv_sc = layers.conv2d(cin, cout, 1, **sn)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = F.interpolate(torch.relu(self.bn1(x, cond)), scale_factor=2.0)
        h = self.conv2(torch.relu(self.bn2(self.conv1(h), cond)))
        return h + self.conv_sc(F.interpolate(x, scale_factor=2.0))


class DBlock(nn.Module):
    def __init__(self, cin: int, cout: int, downsample: bool, preactivation: bool, sn_eps: float):
        super().__init__()
        sn = dict(sn=True, sn_eps=sn_eps)
        self.conv1 = layers.conv2d(cin, cout, 3, padding=1, **sn)  # "wide": hidden width = output width
        self.conv2 = layers.conv2d(cout, cout, 3, padding=1, **sn)
        self.conv_sc = layers.conv2d(cin, cout, 1, **sn) if cin != cout or downsample else None
        self.downsample, self.preactivation = downsample, preactivation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(x) if self.preactivation else x
        h = self.conv2(torch.relu(self.conv1(h)))
        if self.downsample:
            h = F.avg_pool2d(h, 2)
        # The first block (no preactivation) pools before its shortcut conv, the others after.
        if self.preactivation:
            x = x if self.conv_sc is None else self.conv_sc(x)
            x = F.avg_pool2d(x, 2) if self.downsample else x
        else:
            x = F.avg_pool2d(x, 2) if self.downsample else x
            x = x if self.conv_sc is None else self.conv_sc(x)
        return h + x


class BigGANGenerator(nn.Module):
    def __init__(self, resolution, n_classes, ch, dim_z, img_channels, shared_dim, g_attn, bn_eps, sn_eps):
        super().__init__()
        ins, outs = ([ch * m for m in ms] for ms in G_ARCH[resolution])
        self.resolution, self.n_classes, self.dim_z, self.img_channels = resolution, n_classes, dim_z, img_channels
        slots = len(ins) + 1  # hierarchical z: one chunk for the input layer, one per block
        if dim_z % slots:
            raise BigbatchError(
                f"biggan at {resolution}px splits z into {slots} chunks (hierarchical z): dim_z must be a multiple "
                f"of {slots}, e.g. {slots * max(1, round(dim_z / slots))}; got {dim_z}"
            )
        self.chunk = dim_z // slots
        # Unconditional: the conditioning vector is the z chunk alone.
        self.shared = layers.ClassEmbedding(n_classes, shared_dim) if n_classes else None
        cond_dim = self.chunk + (shared_dim if n_classes else 0)
        self.linear = layers.linear(self.chunk, ins[0] * 16, sn=True, sn_eps=sn_eps)
        self.blocks = nn.ModuleList(GBlock(a, b, cond_dim, bn_eps, sn_eps) for a, b in zip(ins, outs))
        res = [8 * 2**i for i in range(len(ins))]
        self.attn_after = res.index(g_attn) if g_attn in res else None
        self.attention = Attention(outs[self.attn_after], sn_eps) if self.attn_after is not None else None
        self.out_bn = nn.BatchNorm2d(outs[-1], eps=bn_eps)
        self.out_conv = layers.conv2d(outs[-1], img_channels, 3, padding=1, sn=True, sn_eps=sn_eps)
        self.checkpoint_blocks = [f"blocks.{i}" for i in range(len(self.blocks))] + (
            ["attention"] if self.attention is not None else []
        )

    def forward(self, z: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        zs = z.split(self.chunk, dim=1)
        if self.shared is not None:
            e = self.shared(y).to(z.dtype)
            conds = [torch.cat([e, zi], dim=1) for zi in zs[1:]]
        else:
            conds = list(zs[1:])
        h = self.linear(zs[0]).view(z.shape[0], -1, 4, 4)
        for i, block in enumerate(self.blocks):
            h = block(h, conds[i])
            if i == self.attn_after:
                h = self.attention(h)
        return torch.tanh(self.out_conv(torch.relu(self.out_bn(h))))


class BigGANDiscriminator(nn.Module):
    def __init__(self, resolution, n_classes, ch, img_channels, d_attn, sn_eps):
        super().__init__()
        ins, outs, down = D_ARCH[resolution]
        ins, outs = [img_channels] + [ch * m for m in ins], [ch * m for m in outs]
        self.resolution, self.n_classes = resolution, n_classes
        self.blocks = nn.ModuleList(DBlock(a, b, d, i > 0, sn_eps) for i, (a, b, d) in enumerate(zip(ins, outs, down)))
        res, r = [], resolution
        for d in down:
            r //= 2 if d else 1
            res.append(r)
        self.attn_after = res.index(d_attn) if d_attn in res else None
        self.attention = Attention(outs[self.attn_after], sn_eps) if self.attn_after is not None else None
        self.linear = layers.linear(outs[-1], 1, sn=True, sn_eps=sn_eps)
        self.embed = layers.embedding(n_classes, outs[-1], sn=True, sn_eps=sn_eps) if n_classes else None
        self.checkpoint_blocks = [f"blocks.{i}" for i in range(len(self.blocks))] + (
            ["attention"] if self.attention is not None else []
        )

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        h = x
        for i, block in enumerate(self.blocks):
            h = block(h)
            if i == self.attn_after:
                h = self.attention(h)
        h = torch.relu(h).sum(dim=(2, 3))
        out = self.linear(h).flatten()
        if self.embed is not None:
            out = out + (self.embed(y) * h).sum(dim=1)
        return out


@register
def biggan(
    resolution: int,
    n_classes: int = 0,
    ch: int = 96,
    dim_z: int = 120,
    img_channels: int = 3,
    shared_dim: int = 128,
    g_attn: int = 64,
    d_attn: int = 64,
    bn_eps: float = 1e-5,
    sn_eps: float = 1e-6,
    init: str = "ortho",
) -> tuple[nn.Module, nn.Module]:
    """BigGAN; defaults are the 128-px ImageNet recipe (ch 96, dim_z 120, shared_dim 128, attention at 64 px)."""
    if resolution not in G_ARCH:
        raise BigbatchError(f"biggan supports resolutions {', '.join(map(str, G_ARCH))}, got {resolution}")
    if not (sn_eps > 0 and bn_eps > 0 and shared_dim > 0):
        raise BigbatchError("biggan options sn_eps, bn_eps and shared_dim must be positive")
    G = BigGANGenerator(resolution, n_classes, ch, dim_z, img_channels, shared_dim, g_attn, bn_eps, sn_eps)
    D = BigGANDiscriminator(resolution, n_classes, ch, img_channels, d_attn, sn_eps)
    for net in (G, D):
        layers.init_weights(net, init)
    return G, D
