"""BigGAN-deep (Brock et al. 2019, appendix B) at 32 to 512 px, with the layout of
BigGAN-PyTorch's BigGANdeep.py: bottleneck residual blocks (1x1 down to a quarter of the channels,
two 3x3, 1x1 back up), `depth` blocks per resolution, channels dropped (G) or concatenated (D) in the
skip path instead of 1x1 shortcut convs, the whole z joined with the shared class embedding into every
conditional BN.

Parameter counts equal the reference's (ch 128, depth 2, dim_z 128, shared_dim 128, attention at 64,
1000 classes): at 128 px G 50,244,484 and D 34,590,210; at 256 px G 55,736,708 and D 38,247,426. Its 32 and 64 px
networks are the reference's too; its 32 px D's attention is not (the reference labels each of that D's stages 16 px,
and attends after every one at d_attn 16).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bigbatch.errors import BigbatchError
from bigbatch.models import layers
from bigbatch.models.biggan import Attention, ProjectionDiscriminator, attention_index, check_values, checkpointable
from bigbatch.models.registry import register
from bigbatch.models.resample import FUSE_FROM, upsample_conv

# Per resolution stage: channel multipliers of ch (in, out). G upsamples in every stage, D downsamples.
G_ARCH = {
    32: ([4, 4, 4], [4, 4, 4]),
    64: ([16, 16, 8, 4], [16, 8, 4, 2]),
    128: ([16, 16, 8, 4, 2], [16, 8, 4, 2, 1]),
    256: ([16, 16, 8, 8, 4, 2], [16, 8, 8, 4, 2, 1]),
    512: ([16, 16, 8, 8, 4, 2, 1], [16, 8, 8, 4, 2, 1, 1]),
}
D_ARCH = {
    32: ([4, 4, 4], [4, 4, 4]),
    64: ([1, 2, 4, 8], [2, 4, 8, 16]),
    128: ([1, 2, 4, 8, 16], [2, 4, 8, 16, 16]),
    256: ([1, 2, 4, 8, 8, 16], [2, 4, 8, 8, 16, 16]),
    # Not in the reference code; the paper's 512-px D (its Table 8) adds one stage at the top.
    512: ([1, 1, 2, 4, 8, 8, 16], [1, 2, 4, 8, 8, 16, 16]),
}
D_KEEPS = {32: 2}  # stages that keep their resolution (the reference's 32 px D: 32 -> 16 -> 8 -> 8); else each halves


class DeepGBlock(nn.Module):
    """G's bottleneck block; its BNs read the conditioning vector (z joined with the class embedding).
    `fused`: an upsampling block runs the upsampling and its first 3x3 conv as one (models/resample.py)."""

    def __init__(
        self, cin: int, cout: int, *, cond_dim: int, upsample: bool, bn_eps: float, sn_eps: float, fused: bool = False
    ):
        super().__init__()
        hidden = cin // 4
        bn = dict(cond_dim=cond_dim, eps=bn_eps, sn_eps=sn_eps)
        sn = dict(sn=True, sn_eps=sn_eps)
        self.bn1 = layers.ConditionalBatchNorm2d(cin, **bn)
        self.conv1 = layers.conv2d(cin, hidden, 1, **sn)
        self.bn2 = layers.ConditionalBatchNorm2d(hidden, **bn)
        self.conv2 = layers.conv2d(hidden, hidden, 3, padding=1, **sn)
        self.bn3 = layers.ConditionalBatchNorm2d(hidden, **bn)
        self.conv3 = layers.conv2d(hidden, hidden, 3, padding=1, **sn)
        self.bn4 = layers.ConditionalBatchNorm2d(hidden, **bn)
        self.conv4 = layers.conv2d(hidden, cout, 1, **sn)
        self.cout, self.upsample, self.fused = cout, upsample, fused and upsample

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn2(self.conv1(torch.relu(self.bn1(x, cond))), cond))
        x = x[:, : self.cout]  # the skip path drops the channels the block sheds
        if self.fused:
            h = upsample_conv(self.conv2, h)
        else:
            h = self.conv2(F.interpolate(h, scale_factor=2.0) if self.upsample else h)
        if self.upsample:
            x = F.interpolate(x, scale_factor=2.0)
        h = self.conv3(torch.relu(self.bn3(h, cond)))
        h = self.conv4(torch.relu(self.bn4(h, cond)))
        return h + x


class DeepDBlock(nn.Module):
    """D's bottleneck block; the skip path keeps x and appends learned channels."""

    def __init__(self, cin: int, cout: int, *, downsample: bool, sn_eps: float):
        super().__init__()
        hidden = cout // 4
        sn = dict(sn=True, sn_eps=sn_eps)
        self.conv1 = layers.conv2d(cin, hidden, 1, **sn)
        self.conv2 = layers.conv2d(hidden, hidden, 3, padding=1, **sn)
        self.conv3 = layers.conv2d(hidden, hidden, 3, padding=1, **sn)
        self.conv4 = layers.conv2d(hidden, cout, 1, **sn)
        # The skip path keeps x and appends cout - cin learned channels.
        self.conv_sc = layers.conv2d(cin, cout - cin, 1, **sn) if cin != cout else None
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(torch.relu(x))
        h = torch.relu(self.conv3(torch.relu(self.conv2(torch.relu(h)))))
        if self.downsample:
            h = F.avg_pool2d(h, 2)
            x = F.avg_pool2d(x, 2)
        if self.conv_sc is not None:
            x = torch.cat([x, self.conv_sc(x)], dim=1)
        return self.conv4(h) + x


class BigGANDeepGenerator(nn.Module):
    """BigGAN-deep's G: `depth` blocks per resolution; attention after the stage at `g_attn` px."""

    def __init__(
        self,
        *,
        resolution: int,
        n_classes: int,
        ch: int,
        dim_z: int,
        img_channels: int,
        depth: int,
        shared_dim: int,
        g_attn: int,
        bn_eps: float,
        sn_eps: float,
    ):
        super().__init__()
        ins, outs = ([ch * m for m in ms] for ms in G_ARCH[resolution])
        self.resolution, self.n_classes, self.dim_z, self.img_channels = resolution, n_classes, dim_z, img_channels
        self.shared = layers.ClassEmbedding(n_classes, shared_dim) if n_classes else None
        cond_dim = dim_z + (shared_dim if n_classes else 0)
        self.linear = layers.linear(cond_dim, ins[0] * 16, sn=True, sn_eps=sn_eps)
        blocks: list[nn.Module] = []
        self.attn_after = None
        attn_stage = attention_index("g_attn", g_attn, [8 * 2**stage for stage in range(len(ins))], outs)
        for stage, (a, b) in enumerate(zip(ins, outs)):
            # Within a stage the channels stay at `a` until the last block, which changes them and upsamples.
            for j in range(depth):
                last = j == depth - 1
                fused = 8 * 2**stage >= FUSE_FROM  # the stage's output resolution
                blocks.append(
                    DeepGBlock(
                        a, b if last else a, cond_dim=cond_dim, upsample=last, bn_eps=bn_eps, sn_eps=sn_eps, fused=fused
                    )
                )
            if stage == attn_stage:
                self.attn_after = len(blocks) - 1
                self.attention = Attention(b, sn_eps=sn_eps)
        self.blocks = nn.ModuleList(blocks)
        if self.attn_after is None:
            self.attention = None
        self.out_bn = nn.BatchNorm2d(outs[-1], eps=bn_eps)
        self.out_conv = layers.conv2d(outs[-1], img_channels, 3, padding=1, sn=True, sn_eps=sn_eps)
        self.checkpoint_blocks = checkpointable(self.blocks, self.attention)

    def forward(self, z: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        cond = z if self.shared is None else torch.cat([z, self.shared(y).to(z.dtype)], dim=1)
        h = self.linear(cond).view(z.shape[0], -1, 4, 4)
        for i, block in enumerate(self.blocks):
            h = block(h, cond)
            if i == self.attn_after:
                h = self.attention(h)
        return torch.tanh(self.out_conv(torch.relu(self.out_bn(h))))


class BigGANDeepDiscriminator(ProjectionDiscriminator):
    """BigGAN-deep's D: an input conv, `depth` blocks per resolution; attention after the stage at `d_attn` px."""

    def __init__(
        self,
        *,
        resolution: int,
        n_classes: int,
        ch: int,
        img_channels: int,
        depth: int,
        d_attn: int,
        sn_eps: float,
        d_cond: str = "PD",
    ):
        super().__init__()
        ins, outs = ([ch * m for m in ms] for ms in D_ARCH[resolution])
        self.resolution, self.n_classes, self.depth = resolution, n_classes, depth
        self.input_conv = layers.conv2d(img_channels, ins[0], 3, padding=1, sn=True, sn_eps=sn_eps)
        blocks: list[nn.Module] = []
        self.attn_after, self.attention = None, None
        halves = [stage != D_KEEPS.get(resolution) for stage in range(len(ins))]
        sides = [resolution // 2 ** sum(halves[: stage + 1]) for stage in range(len(ins))]
        attn_stage = attention_index("d_attn", d_attn, sides, outs)
        for stage, (a, b) in enumerate(zip(ins, outs)):
            for j in range(depth):  # the first block of a stage changes the channels and downsamples
                blocks.append(DeepDBlock(a if j == 0 else b, b, downsample=j == 0 and halves[stage], sn_eps=sn_eps))
            if stage == attn_stage:
                self.attn_after = len(blocks) - 1
                self.attention = Attention(b, sn_eps=sn_eps)
        self.blocks = nn.ModuleList(blocks)
        self.linear = layers.linear(outs[-1], 1, sn=True, sn_eps=sn_eps)
        self.embed, self.classify = layers.class_heads(d_cond, n_classes, outs[-1], sn=True, sn_eps=sn_eps)
        self.checkpoint_blocks = checkpointable(self.blocks, self.attention)


@register(init="ortho")
def biggan_deep(
    *,
    resolution: int,
    n_classes: int = 0,
    ch: int = 128,
    dim_z: int = 128,
    img_channels: int = 3,
    depth: int = 2,
    shared_dim: int = 128,
    g_attn: int = 64,
    d_attn: int = 64,
    bn_eps: float = 1e-5,
    sn_eps: float = 1e-6,
    d_cond: str = "PD",
) -> tuple[nn.Module, nn.Module]:
    """BigGAN-deep; defaults are BigGAN-PyTorch's launch_BigGAN_deep.sh (ch 128, depth 2, dim_z 128, shared_dim 128)."""
    layers.check_d_cond("biggan_deep", d_cond, n_classes)
    check_values(
        "biggan_deep", resolution=resolution, sn_eps=sn_eps, bn_eps=bn_eps, shared_dim=shared_dim, resolutions=G_ARCH
    )
    if ch % 4 or depth < 1:
        raise BigbatchError(
            f"biggan_deep needs ch divisible by 4 (bottlenecks are ch/4 wide) and depth >= 1; got {ch}, {depth}"
        )
    G = BigGANDeepGenerator(
        resolution=resolution,
        n_classes=n_classes,
        ch=ch,
        dim_z=dim_z,
        img_channels=img_channels,
        depth=depth,
        shared_dim=shared_dim,
        g_attn=g_attn,
        bn_eps=bn_eps,
        sn_eps=sn_eps,
    )
    D = BigGANDeepDiscriminator(
        resolution=resolution,
        n_classes=n_classes,
        ch=ch,
        img_channels=img_channels,
        depth=depth,
        d_attn=d_attn,
        sn_eps=sn_eps,
        d_cond=d_cond,
    )
    return G, D
