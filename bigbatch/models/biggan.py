"""BigGAN (Brock et al. 2019) at 32 to 512 px, and SA-GAN (Zhang et al. 2019) on the same blocks,
with the architecture of BigGAN-PyTorch's reference launch scripts: residual blocks, class-conditional
BN fed by a shared class embedding and a chunk of z (hierarchical z), self-attention, spectral norm in
G and D, a projection discriminator.

Parameter counts equal the reference's (1000 classes, ch 96, dim_z 120, shared_dim 128): at 128 px
G 70,433,988 and D 87,982,370; at 256 px G 82,108,548 and D 99,225,890.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bigbatch.errors import BigbatchError, warn
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
    """BN with gain and bias predicted from the conditioning: linearly (spectral-normalised, no bias)
    from a vector (the shared class embedding and/or this block's chunk of z), or, with `n_classes`,
    from the labels by per-layer class embeddings (BigGAN-PyTorch without G_shared). With neither, an
    ordinary affine BN."""

    def __init__(self, num_features: int, cond_dim: int, eps: float, sn_eps: float, n_classes: int = 0):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features, eps=eps, affine=not (cond_dim or n_classes))
        self.gain = self.bias = None
        if n_classes:
            self.gain = layers.ClassEmbedding(n_classes, num_features)
            self.bias = layers.ClassEmbedding(n_classes, num_features)
        elif cond_dim:
            self.gain = layers.linear(cond_dim, num_features, bias=False, sn=True, sn_eps=sn_eps)
            self.bias = layers.linear(cond_dim, num_features, bias=False, sn=True, sn_eps=sn_eps)

    def forward(self, x: torch.Tensor, cond: torch.Tensor | None) -> torch.Tensor:
        if self.gain is None:
            return self.bn(x)
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


def checkpointable(blocks: nn.ModuleList, attention: nn.Module | None) -> list[str]:
    """The submodule names the engine may activation-checkpoint: every block, and the attention."""
    return [f"blocks.{i}" for i in range(len(blocks))] + (["attention"] if attention is not None else [])


class ProjectionDiscriminator(nn.Module):
    """The forward pass BigGAN's, BigGAN-deep's and SN-GAN's D share: an input conv (or None), the blocks
    with attention after block `attn_after`, ReLU, global sum pooling, a linear output plus the
    projection of the class embedding (Miyato & Koyama 2018)."""

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        h = x if self.input_conv is None else self.input_conv(x)
        for i, block in enumerate(self.blocks):
            h = block(h)
            if i == self.attn_after:
                h = self.attention(h)
        h = torch.relu(h).sum(dim=(2, 3))
        out = self.linear(h).flatten()
        if self.embed is not None:
            out = out + (self.embed(y) * h).sum(dim=1)
        return out


class GBlock(nn.Module):
    def __init__(
        self, cin: int, cout: int, cond_dim: int, bn_eps: float, sn_eps: float, n_classes: int = 0, sn: bool = True
    ):
        super().__init__()
        sn = dict(sn=sn, sn_eps=sn_eps)
        self.bn1 = CondBatchNorm2d(cin, cond_dim, bn_eps, sn_eps, n_classes)
        self.conv1 = layers.conv2d(cin, cout, 3, padding=1, **sn)
        self.bn2 = CondBatchNorm2d(cout, cond_dim, bn_eps, sn_eps, n_classes)
        self.conv2 = layers.conv2d(cout, cout, 3, padding=1, **sn)
        self.conv_sc = layers.conv2d(cin, cout, 1, **sn)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = F.interpolate(torch.relu(self.bn1(x, cond)), scale_factor=2.0)
        h = self.conv2(torch.relu(self.bn2(self.conv1(h), cond)))
        return h + self.conv_sc(F.interpolate(x, scale_factor=2.0))


class DBlock(nn.Module):
    """D's residual block. `wide` (BigGAN, SA-GAN): the hidden width is the output width; otherwise
    (SN-GAN) the input width. The first block (no preactivation) is SN-GAN's "optimized" block."""

    def __init__(self, cin: int, cout: int, downsample: bool, preactivation: bool, sn_eps: float, wide: bool = True):
        super().__init__()
        sn = dict(sn=True, sn_eps=sn_eps)
        hidden = cout if wide or not preactivation else cin
        self.conv1 = layers.conv2d(cin, hidden, 3, padding=1, **sn)
        self.conv2 = layers.conv2d(hidden, cout, 3, padding=1, **sn)
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


def hierarchical_dim_z(family: str, resolution: int, dim_z: int, slots: int) -> int:
    """The z length a hierarchical G uses: BigGAN-PyTorch splits z into equal chunks, one for the
    input layer and one per block, and drops the remainder (dim_z 120 at 256 px: 7 chunks of 17)."""
    if dim_z < slots:
        raise BigbatchError(f"{family} at {resolution}px splits z into {slots} chunks: dim_z must be >= {slots}")
    if dim_z % slots:
        used = dim_z // slots * slots
        warn(
            f"{family} at {resolution}px splits z into {slots} chunks (hierarchical z) and uses dim_z {used}, "
            f"as BigGAN-PyTorch does; set model.dim_z={used} to say so"
        )
    return dim_z // slots * slots


class BigGANGenerator(nn.Module):
    def __init__(
        self, resolution, n_classes, ch, dim_z, img_channels, shared, shared_dim, hier, g_attn, bn_eps, sn_eps, **kw
    ):
        super().__init__()
        arch, sn = kw.get("arch", G_ARCH), kw.get("sn", True)  # SN-GAN: its own widths, no spectral norm in G
        ins, outs = ([ch * m for m in ms] for ms in arch[resolution])
        slots = len(ins) + 1 if hier else 1  # hierarchical z: one chunk for the input layer, one per block
        dim_z = hierarchical_dim_z("biggan", resolution, dim_z, slots) if hier else dim_z
        self.resolution, self.n_classes, self.dim_z, self.img_channels = resolution, n_classes, dim_z, img_channels
        self.chunk = dim_z // slots
        # The conditioning of every BN: the shared embedding (if any) joined with the block's z chunk
        # (if hierarchical); unshared, per-layer class embeddings read the labels instead.
        self.shared = layers.ClassEmbedding(n_classes, shared_dim) if n_classes and shared else None
        cond_dim = (shared_dim if self.shared is not None else 0) + (self.chunk if hier else 0)
        per_class = 0 if shared else n_classes
        self.hier = hier
        self.linear = layers.linear(self.chunk, ins[0] * 16, sn=sn, sn_eps=sn_eps)
        self.blocks = nn.ModuleList(GBlock(a, b, cond_dim, bn_eps, sn_eps, per_class, sn) for a, b in zip(ins, outs))
        res = [8 * 2**i for i in range(len(ins))]
        self.attn_after = res.index(g_attn) if g_attn in res else None
        self.attention = Attention(outs[self.attn_after], sn_eps) if self.attn_after is not None else None
        self.out_bn = nn.BatchNorm2d(outs[-1], eps=bn_eps)
        self.out_conv = layers.conv2d(outs[-1], img_channels, 3, padding=1, sn=sn, sn_eps=sn_eps)
        self.checkpoint_blocks = checkpointable(self.blocks, self.attention)

    def conditions(self, z: torch.Tensor, y: torch.Tensor | None) -> tuple[torch.Tensor, list]:
        """The input layer's z and each block's BN conditioning."""
        zs = z.split(self.chunk, dim=1) if self.hier else (z,)
        n = len(self.blocks)
        if self.shared is not None:
            e = self.shared(y).to(z.dtype)
            return zs[0], [torch.cat([e, zi], dim=1) for zi in zs[1:]] if self.hier else [e] * n
        if self.hier:
            return zs[0], list(zs[1:])
        return z, [y] * n  # labels for per-layer class embeddings, or None

    def forward(self, z: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        z0, conds = self.conditions(z, y)
        h = self.linear(z0).view(z.shape[0], -1, 4, 4)
        for i, block in enumerate(self.blocks):
            h = block(h, conds[i])
            if i == self.attn_after:
                h = self.attention(h)
        return torch.tanh(self.out_conv(torch.relu(self.out_bn(h))))


class BigGANDiscriminator(ProjectionDiscriminator):
    def __init__(self, resolution, n_classes, ch, img_channels, d_attn, sn_eps, arch=D_ARCH, wide=True):
        super().__init__()
        ins, outs, down = arch[resolution]
        ins, outs = [img_channels] + [ch * m for m in ins], [ch * m for m in outs]
        self.resolution, self.n_classes = resolution, n_classes
        self.input_conv = None  # the first block reads the image
        self.blocks = nn.ModuleList(
            DBlock(a, b, d, i > 0, sn_eps, wide) for i, (a, b, d) in enumerate(zip(ins, outs, down))
        )
        res, r = [], resolution
        for d in down:
            r //= 2 if d else 1
            res.append(r)
        self.attn_after = res.index(d_attn) if d_attn in res else None
        self.attention = Attention(outs[self.attn_after], sn_eps) if self.attn_after is not None else None
        self.linear = layers.linear(outs[-1], 1, sn=True, sn_eps=sn_eps)
        self.embed = layers.embedding(n_classes, outs[-1], sn=True, sn_eps=sn_eps) if n_classes else None
        self.checkpoint_blocks = checkpointable(self.blocks, self.attention)


def check_options(
    family: str, resolution: int, sn_eps: float, bn_eps: float, shared_dim: int, resolutions=G_ARCH
) -> None:
    if resolution not in resolutions:
        raise BigbatchError(f"{family} supports resolutions {', '.join(map(str, resolutions))}, got {resolution}")
    if not (sn_eps > 0 and bn_eps > 0 and shared_dim > 0):
        raise BigbatchError(f"{family} options sn_eps, bn_eps and shared_dim must be positive")


@register
def biggan(
    resolution: int,
    n_classes: int = 0,
    ch: int = 96,
    dim_z: int = 120,
    img_channels: int = 3,
    shared: bool = True,
    shared_dim: int = 128,
    hier: bool = True,
    g_attn: int = 64,
    d_attn: int = 64,
    bn_eps: float = 1e-5,
    sn_eps: float = 1e-6,
    init: str = "ortho",
) -> tuple[nn.Module, nn.Module]:
    """BigGAN; defaults are the 128-px ImageNet recipe (ch 96, dim_z 120, shared_dim 128, hierarchical z,
    attention at 64 px). shared=False gives each BN its own class embeddings (BigGAN-PyTorch's CIFAR
    script); g_attn/d_attn = 0 turn attention off."""
    check_options("biggan", resolution, sn_eps, bn_eps, shared_dim)
    G = BigGANGenerator(
        resolution, n_classes, ch, dim_z, img_channels, shared, shared_dim, hier, g_attn, bn_eps, sn_eps
    )
    D = BigGANDiscriminator(resolution, n_classes, ch, img_channels, d_attn, sn_eps)
    for net in (G, D):
        layers.init_weights(net, init)
    return G, D


@register
def sagan(
    resolution: int,
    n_classes: int = 0,
    ch: int = 64,
    dim_z: int = 128,
    img_channels: int = 3,
    shared_dim: int = 128,
    g_attn: int = 64,
    d_attn: int = 64,
    bn_eps: float = 1e-5,
    sn_eps: float = 1e-8,
    init: str = "xavier",
) -> tuple[nn.Module, nn.Module]:
    """SA-GAN (Zhang et al. 2019) as BigGAN-PyTorch's SA-GAN scripts build it: BigGAN's residual blocks
    at ch 64, a shared class embedding into every conditional BN but no hierarchical z, self-attention
    (64 px, the scripts' choice; the paper found 32 and 64 both good), spectral norm in G and D, Xavier init."""
    check_options("sagan", resolution, sn_eps, bn_eps, shared_dim)
    G = BigGANGenerator(resolution, n_classes, ch, dim_z, img_channels, True, shared_dim, False, g_attn, bn_eps, sn_eps)
    D = BigGANDiscriminator(resolution, n_classes, ch, img_channels, d_attn, sn_eps)
    for net in (G, D):
        layers.init_weights(net, init)
    return G, D
