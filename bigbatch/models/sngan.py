"""SN-GAN (Miyato et al. 2018) with the projection discriminator (Miyato & Koyama 2018): the ResNet
models of the authors' code, the CIFAR variant at 32 px and the ImageNet variant at 64 to 256 px.

G is a plain ResNet (BN, no spectral norm; class-conditional BN with per-class gains and biases when
conditional); D is spectrally normalised, its blocks "skinny" (hidden width = input width), the
first one SN-GAN's optimized block, with global sum pooling and a projection head. Both are built
from BigGAN's blocks, which generalise them. At 32 px (CIFAR) G is 4·ch wide and D 2·ch: with the
default ch 64 that is the paper's 256 and 128.
"""

from __future__ import annotations

from torch import nn

from bigbatch.errors import BigbatchError
from bigbatch.models import biggan, layers
from bigbatch.models.registry import register

G_ARCH = {
    32: ([4, 4, 4], [4, 4, 4]),
    64: ([16, 8, 4, 2], [8, 4, 2, 1]),
    128: biggan.G_ARCH[128],
    256: biggan.G_ARCH[256],
}
D_ARCH = {
    32: ([2, 2, 2], [2, 2, 2, 2], [True, True, False, False]),
    64: biggan.D_ARCH[64],
    128: biggan.D_ARCH[128],
    256: biggan.D_ARCH[256],
}


@register(init="xavier")
def sngan(
    *,
    resolution: int,
    n_classes: int = 0,
    ch: int = 64,
    dim_z: int = 128,
    img_channels: int = 3,
    bn_eps: float = 2e-5,
    sn_eps: float = 1e-12,
    d_cond: str = "PD",
) -> tuple[nn.Module, nn.Module]:
    """SN-GAN ResNet with projection D; ch 64 and dim_z 128 as in the authors' CIFAR and ImageNet models
    (BN eps 2e-5 as chainer's default; Xavier-uniform init where the authors scale it by sqrt(2))."""
    if resolution not in G_ARCH:
        raise BigbatchError(
            f"sngan supports resolutions {', '.join(map(str, G_ARCH))} (data.resolution), got {resolution}"
        )
    if not (sn_eps > 0 and bn_eps > 0):
        raise BigbatchError("sngan options sn_eps and bn_eps must be positive")
    layers.check_d_cond("sngan", d_cond, n_classes)
    G = biggan.BigGANGenerator(
        resolution=resolution,
        n_classes=n_classes,
        ch=ch,
        dim_z=dim_z,
        img_channels=img_channels,
        shared=False,
        shared_dim=1,
        hier=False,
        g_attn=0,
        bn_eps=bn_eps,
        sn_eps=sn_eps,
        arch=G_ARCH,
        sn=False,
        # Conditional BN starts as the identity for every class (gain 1, bias 0), as chainer's.
        bn_start="scheme_then_identity",
    )
    D = biggan.BigGANDiscriminator(
        resolution=resolution,
        n_classes=n_classes,
        ch=ch,
        img_channels=img_channels,
        d_attn=0,
        sn_eps=sn_eps,
        arch=D_ARCH,
        wide=False,
        d_cond=d_cond,
    )
    G.reference_family = D.reference_family = "sngan"  # (BigGAN's classes, no layout of BigGAN-PyTorch's: convert's)
    return G, D
