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
from bigbatch.models.resample import FUSE_FROM, conv_pool, upsample_conv

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


FUSED_ON = ("cuda",)  # device types whose attention goes through scaled_dot_product_attention


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fused: bool = True) -> torch.Tensor:
    """softmax(q kᵀ) v over the last two dims of (n, L, e), (n, S, e) and (n, S, ev), unscaled as SA-GAN's.
    On a GPU through `scaled_dot_product_attention`, whose fused kernels never hold the (n, L, S) map (at
    BigGAN-128's 64 px 4096 x 1024 an image: for D's 128 images 2 GiB in fp32, where autocast puts the
    softmax) and keep the softmax in fp32; they need q's and k's e to be a multiple of 8, so zero columns
    (q kᵀ unchanged) are added where it is not (D's at ch 96: 12). Elsewhere the formula as written: on CPU
    PyTorch's attention runs the same products, 0.67-0.97x as fast in fp32 at BigGAN's 32 px layers; and where
    not `fused`: the fused kernels have no derivative of their backward, which R1 takes."""
    if not fused or q.device.type not in FUSED_ON:
        return torch.softmax(q @ k.transpose(1, 2), dim=-1) @ v
    e = q.shape[-1]
    if e % 8:
        q, k = (F.pad(t, (0, 8 - e % 8)) for t in (q, k))
    q, k, v = (t.contiguous().unsqueeze(1) for t in (q, k, v))  # the kernels read rows of stride 1
    return F.scaled_dot_product_attention(q, k, v, scale=1.0).squeeze(1)


class Attention(nn.Module):
    """Self-attention (SA-GAN) with 1x1 spectral-normalised convs; phi and g are max-pooled 2x. `fused_attention`
    False: as its formula on a GPU too (a D under R1, whose gradient is differentiated, recomputed blocks included)."""

    fused_attention = True

    def __init__(self, ch: int, *, sn_eps: float):
        super().__init__()
        sn = dict(sn=True, sn_eps=sn_eps, bias=False)
        self.theta = layers.conv2d(ch, ch // 8, 1, **sn)
        self.phi = layers.conv2d(ch, ch // 8, 1, **sn)
        self.g = layers.conv2d(ch, ch // 2, 1, **sn)
        self.o = layers.conv2d(ch // 2, ch, 1, **sn)
        self.gamma = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        n, c, h, w = x.shape
        # (n, positions, channels): contiguous when x is channels-last
        q = self.theta(x).flatten(2).transpose(1, 2)
        k = F.max_pool2d(self.phi(x), 2).flatten(2).transpose(1, 2)
        v = F.max_pool2d(self.g(x), 2).flatten(2).transpose(1, 2)
        o = attend(q, k, v, self.fused_attention).transpose(1, 2).reshape(n, c // 2, h, w)  # a channels-last view
        layout = torch.channels_last if x.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format
        return x + self.gamma * self.o(o.contiguous(memory_format=layout))


def checkpointable(blocks: nn.ModuleList, attention: nn.Module | None) -> list[str]:
    """The submodule names the engine may activation-checkpoint: every block, and the attention."""
    return [f"blocks.{i}" for i in range(len(blocks))] + (["attention"] if attention is not None else [])


class ProjectionDiscriminator(nn.Module):
    """The forward pass BigGAN's, BigGAN-deep's and SN-GAN's D share: an input conv (or None), the blocks
    with attention after block `attn_after`, ReLU, global sum pooling, a linear output plus the
    projection of the class embedding (Miyato & Koyama 2018), or (model option d_cond "AC") the logit and an auxiliary
    classifier's logits of the classes (layers.class_heads)."""

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
        return layers.with_classes(out, self.classify, h)


class GBlock(nn.Module):
    """G's residual block: BN, ReLU, upsample 2x, conv, BN, ReLU, conv; a 1x1 conv on the upsampled
    shortcut. Its BNs read `cond` (see layers.ConditionalBatchNorm2d for `n_classes`, `cond_dim`, `bn_start`).
    `fused`: the upsampling and the first conv run as one transposed conv (models/resample.py); the
    shortcut's 1x1 conv runs before the upsampling, on a quarter of the pixels, either way."""

    def __init__(
        self,
        cin: int,
        cout: int,
        *,
        cond_dim: int,
        bn_eps: float,
        sn_eps: float,
        n_classes: int = 0,
        bn_start: str = "scheme",
        sn: bool = True,
        fused: bool = False,
    ):
        super().__init__()
        bn = dict(n_classes=n_classes, cond_dim=cond_dim, eps=bn_eps, sn_eps=sn_eps, start=bn_start)
        sn = dict(sn=sn, sn_eps=sn_eps)
        self.bn1 = layers.ConditionalBatchNorm2d(cin, **bn)
        self.conv1 = layers.conv2d(cin, cout, 3, padding=1, **sn)
        self.bn2 = layers.ConditionalBatchNorm2d(cout, **bn)
        self.conv2 = layers.conv2d(cout, cout, 3, padding=1, **sn)
        self.conv_sc = layers.conv2d(cin, cout, 1, **sn)
        self.fused = fused

    def forward(self, x: torch.Tensor, cond: torch.Tensor | None) -> torch.Tensor:
        h = torch.relu(self.bn1(x, cond))
        h = upsample_conv(self.conv1, h) if self.fused else self.conv1(F.interpolate(h, scale_factor=2.0))
        h = self.conv2(torch.relu(self.bn2(h, cond)))
        return h + F.interpolate(self.conv_sc(x), scale_factor=2.0)


class DBlock(nn.Module):
    """D's residual block. `wide` (BigGAN, SA-GAN): the hidden width is the output width; otherwise
    (SN-GAN) the input width. The first block (no preactivation) is SN-GAN's "optimized" block.
    `fused`: the second conv and the pooling run as one strided conv (models/resample.py). The shortcut
    pools before its 1x1 conv, on a quarter of the pixels."""

    def __init__(
        self,
        cin: int,
        cout: int,
        *,
        downsample: bool,
        preactivation: bool,
        sn_eps: float,
        wide: bool = True,
        fused: bool = False,
    ):
        super().__init__()
        sn = dict(sn=True, sn_eps=sn_eps)
        hidden = cout if wide or not preactivation else cin
        self.conv1 = layers.conv2d(cin, hidden, 3, padding=1, **sn)
        self.conv2 = layers.conv2d(hidden, cout, 3, padding=1, **sn)
        self.conv_sc = layers.conv2d(cin, cout, 1, **sn) if cin != cout or downsample else None
        self.downsample, self.preactivation, self.fused = downsample, preactivation, fused and downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv1(torch.relu(x) if self.preactivation else x))
        if self.fused:
            h = conv_pool(self.conv2, h)
        else:
            h = F.avg_pool2d(self.conv2(h), 2) if self.downsample else self.conv2(h)
        # BigGAN-PyTorch pools the first block's shortcut before its conv and the others' after: a 1x1 conv
        # and an average pooling commute, so every block pools first.
        x = F.avg_pool2d(x, 2) if self.downsample else x
        return h + (x if self.conv_sc is None else self.conv_sc(x))


def hierarchical_dim_z(family: str, *, resolution: int, dim_z: int, slots: int) -> int:
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
    """BigGAN's G, which also serves SA-GAN (no hierarchical z) and SN-GAN (its own widths, per-class
    BN, no spectral norm, no attention). `g_attn` is the resolution after whose block attention sits
    (attention_index); `arch` maps resolutions to channel multipliers (in, out) per block."""

    def __init__(
        self,
        *,
        resolution: int,
        n_classes: int,
        ch: int,
        dim_z: int,
        img_channels: int,
        shared: bool,
        shared_dim: int,
        hier: bool,
        g_attn: int,
        bn_eps: float,
        sn_eps: float,
        arch: dict = G_ARCH,
        sn: bool = True,
        bn_start: str = "scheme",
    ):
        super().__init__()
        ins, outs = ([ch * m for m in ms] for ms in arch[resolution])
        slots = len(ins) + 1 if hier else 1  # hierarchical z: one chunk for the input layer, one per block
        if hier:
            dim_z = hierarchical_dim_z("biggan", resolution=resolution, dim_z=dim_z, slots=slots)
        self.resolution, self.n_classes, self.dim_z, self.img_channels = resolution, n_classes, dim_z, img_channels
        self.chunk = dim_z // slots
        # The conditioning of every BN: the shared embedding (if any) joined with the block's z chunk
        # (if hierarchical); unshared, per-layer class embeddings read the labels instead.
        self.shared = layers.ClassEmbedding(n_classes, shared_dim) if n_classes and shared else None
        cond_dim = (shared_dim if self.shared is not None else 0) + (self.chunk if hier else 0)
        per_class = 0 if shared else n_classes
        self.hier = hier
        self.linear = layers.linear(self.chunk, ins[0] * 16, sn=sn, sn_eps=sn_eps)
        self.blocks = nn.ModuleList(
            GBlock(
                a,
                b,
                cond_dim=cond_dim,
                bn_eps=bn_eps,
                sn_eps=sn_eps,
                n_classes=per_class,
                bn_start=bn_start,
                sn=sn,
                fused=8 * 2**i >= FUSE_FROM,
            )
            for i, (a, b) in enumerate(zip(ins, outs))
        )
        self.attn_after = attention_index("g_attn", g_attn, [8 * 2**i for i in range(len(ins))], outs)
        self.attention = Attention(outs[self.attn_after], sn_eps=sn_eps) if self.attn_after is not None else None
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
    """BigGAN's D (also SA-GAN's, and SN-GAN's with `wide=False`): `d_attn` is the resolution after
    whose block attention sits; `arch` maps resolutions to (in, out, downsample) per block."""

    def __init__(
        self,
        *,
        resolution: int,
        n_classes: int,
        ch: int,
        img_channels: int,
        d_attn: int,
        sn_eps: float,
        arch: dict = D_ARCH,
        wide: bool = True,
        d_cond: str = "PD",
    ):
        super().__init__()
        ins, outs, down = arch[resolution]
        ins, outs = [img_channels] + [ch * m for m in ins], [ch * m for m in outs]
        self.resolution, self.n_classes = resolution, n_classes
        self.input_conv = None  # the first block reads the image
        res, r = [], resolution  # each block's output resolution
        for d in down:
            r //= 2 if d else 1
            res.append(r)
        self.blocks = nn.ModuleList(
            DBlock(a, b, downsample=d, preactivation=i > 0, sn_eps=sn_eps, wide=wide, fused=2 * r >= FUSE_FROM)
            for i, (a, b, d, r) in enumerate(zip(ins, outs, down, res))
        )
        self.attn_after = attention_index("d_attn", d_attn, res, outs)
        self.attention = Attention(outs[self.attn_after], sn_eps=sn_eps) if self.attn_after is not None else None
        self.linear = layers.linear(outs[-1], 1, sn=True, sn_eps=sn_eps)
        self.embed, self.classify = layers.class_heads(d_cond, n_classes, outs[-1], sn=True, sn_eps=sn_eps)
        self.checkpoint_blocks = checkpointable(self.blocks, self.attention)


ATTN_DEFAULT = 64  # g_attn's and d_attn's default: ImageNet-128's, which a smaller model has no block of


def attention_index(option: str, size: int, sizes: list[int], channels: list[int]) -> int | None:
    """The block (of outputs `sizes` px, `channels` wide) that attention follows, for option `option` = `size` (0:
    none). A size no block puts out is refused (found from outside: dropped without a word), but for the default,
    which smaller models lack (and BigGAN-PyTorch's drop too); so is a block too narrow for attention's ch // 8 query
    channels (found from outside: an IndexError of a zero-sized spectral norm, at 128 px with model.ch below 8)."""
    if size in sizes:
        at = sizes.index(size)
        if channels[at] < 8:
            raise BigbatchError(
                f"model.options.{option} = {size}: attention needs at least 8 channels, and the block at {size} px "
                f"has {channels[at]}: give a larger model.ch, or {option} = 0 for no attention"
            )
        return at
    if size and size != ATTN_DEFAULT:
        raise BigbatchError(
            f"model.options.{option} = {size}: no block of this model puts out {size} px; give one of "
            f"{', '.join(map(str, sorted(set(sizes))))}, or 0 for no attention"
        )
    return None


def check_values(
    family: str, *, resolution: int, sn_eps: float, bn_eps: float, shared_dim: int, resolutions: dict = G_ARCH
) -> None:
    """BigbatchError for a resolution the family lacks or an option that must be positive."""
    if resolution not in resolutions:
        raise BigbatchError(
            f"{family} supports resolutions {', '.join(map(str, resolutions))} (data.resolution), got {resolution}"
        )
    if not (sn_eps > 0 and bn_eps > 0 and shared_dim > 0):
        raise BigbatchError(f"{family} options sn_eps, bn_eps and shared_dim must be positive")


@register(init="ortho")
def biggan(
    *,
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
    d_cond: str = "PD",
) -> tuple[nn.Module, nn.Module]:
    """BigGAN; defaults are the 128-px ImageNet recipe (ch 96, dim_z 120, shared_dim 128, hierarchical z,
    attention at 64 px, orthogonal init). shared=False gives each BN its own class embeddings
    (BigGAN-PyTorch's CIFAR script); g_attn/d_attn = 0 turn attention off."""
    check_values("biggan", resolution=resolution, sn_eps=sn_eps, bn_eps=bn_eps, shared_dim=shared_dim)
    layers.check_d_cond("biggan", d_cond, n_classes)
    if n_classes and not shared and hier:
        # Per-class BN embeddings read the labels, hierarchical z feeds the BNs z chunks: one or the other.
        raise BigbatchError("biggan with classes and shared=False needs hier=False")
    G = BigGANGenerator(
        resolution=resolution,
        n_classes=n_classes,
        ch=ch,
        dim_z=dim_z,
        img_channels=img_channels,
        shared=shared,
        shared_dim=shared_dim,
        hier=hier,
        g_attn=g_attn,
        bn_eps=bn_eps,
        sn_eps=sn_eps,
    )
    D = BigGANDiscriminator(
        resolution=resolution,
        n_classes=n_classes,
        ch=ch,
        img_channels=img_channels,
        d_attn=d_attn,
        sn_eps=sn_eps,
        d_cond=d_cond,
    )
    return G, D


@register(init="xavier")
def sagan(
    *,
    resolution: int,
    n_classes: int = 0,
    ch: int = 64,
    dim_z: int = 128,
    img_channels: int = 3,
    shared: bool = True,
    shared_dim: int = 128,
    g_attn: int = 64,
    d_attn: int = 64,
    bn_eps: float = 1e-5,
    sn_eps: float = 1e-8,
    d_cond: str = "PD",
) -> tuple[nn.Module, nn.Module]:
    """SA-GAN (Zhang et al. 2019) as BigGAN-PyTorch's SA-GAN script builds it: BigGAN's residual blocks at ch 64,
    no hierarchical z, self-attention (64 px, the script's choice; the paper found 32 and 64 both good), spectral
    norm in G and D, Xavier init. `shared`: one class embedding (shared_dim wide) into every conditional BN, or
    (False) an embedding of its own per BN, as the script (launch_SAGAN_bs128x2_ema.sh passes no --G_shared) and the
    sagan128 preset; True stays the default so that runs made before it was an option load."""
    check_values("sagan", resolution=resolution, sn_eps=sn_eps, bn_eps=bn_eps, shared_dim=shared_dim)
    layers.check_d_cond("sagan", d_cond, n_classes)
    return biggan(
        resolution=resolution,
        n_classes=n_classes,
        ch=ch,
        dim_z=dim_z,
        img_channels=img_channels,
        shared=shared,
        shared_dim=shared_dim,
        hier=False,
        g_attn=g_attn,
        d_attn=d_attn,
        bn_eps=bn_eps,
        sn_eps=sn_eps,
        d_cond=d_cond,
    )
