"""Building blocks shared by the model families: spectral norm, class embeddings, conditional BN.

Spectral norm is written here rather than taken from torch.nn.utils because the engine must decide
when the power iteration runs (once per optimizer step, or once per micro-batch) and must be able
to replay the same normalisation on every micro-batch of a step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bigbatch.errors import BigbatchError


class SpectralNorm:
    """Mixin for layers with a `weight`: divides it by its largest singular value (Miyato et al. 2018).

    The estimate's vectors u, v are buffers. `sn_update` says which training forwards run a power
    iteration and store u and v: True every one (as torch's spectral_norm; the default outside the
    engine), False none, "once" only the next one. The engine arms "once" per optimizer step (or per
    micro-batch), so every micro-batch of a step, and every recomputation under activation
    checkpointing, sees exactly the same normalised weight.
    """

    sn_update: bool | str = True

    def _init_sn(self, eps: float) -> None:
        out = self.weight.shape[0]
        u = F.normalize(torch.randn(1, out), dim=1, eps=eps)
        v = F.normalize(torch.randn(1, self.weight[0].numel()), dim=1, eps=eps)
        self.register_buffer("sn_u", u)
        self.register_buffer("sn_v", v)
        self.sn_eps = eps

    def normalized_weight(self) -> torch.Tensor:
        # In the weight's own precision (fp32) whatever the autocast: sigma in bf16 would jitter.
        with torch.autocast(self.weight.device.type, enabled=False):
            w = self.weight.flatten(1)
            if self.training and self.sn_update:
                with torch.no_grad():
                    v = F.normalize(self.sn_u @ w, dim=1, eps=self.sn_eps)
                    u = F.normalize(v @ w.t(), dim=1, eps=self.sn_eps)
                # New tensors, not in-place copies: an earlier forward's graph may still hold the old ones.
                self.sn_u, self.sn_v = u, v
                if self.sn_update == "once":
                    self.sn_update = False
            sigma = (self.sn_u @ w @ self.sn_v.t()).squeeze()
            return self.weight / sigma


class SNConv2d(SpectralNorm, nn.Conv2d):
    def __init__(self, *args, sn_eps: float = 1e-6, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_sn(sn_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, self.normalized_weight(), self.bias)


class SNConvTranspose2d(SpectralNorm, nn.ConvTranspose2d):
    def __init__(self, *args, sn_eps: float = 1e-6, **kwargs):
        super().__init__(*args, **kwargs)
        # A transposed conv's weight is (in, out, k, k): normalise it as the (in, out*k*k) matrix.
        self._init_sn(sn_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv_transpose2d(
            x,
            self.normalized_weight(),
            self.bias,
            self.stride,
            self.padding,
            self.output_padding,
            self.groups,
            self.dilation,
        )


class SNLinear(SpectralNorm, nn.Linear):
    def __init__(self, *args, sn_eps: float = 1e-6, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_sn(sn_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.normalized_weight(), self.bias)


class SNEmbedding(SpectralNorm, nn.Embedding):
    def __init__(self, *args, sn_eps: float = 1e-6, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_sn(sn_eps)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return embed(y, self.normalized_weight())


def conv2d(*args, sn: bool, sn_eps: float, **kwargs) -> nn.Module:
    return SNConv2d(*args, sn_eps=sn_eps, **kwargs) if sn else nn.Conv2d(*args, **kwargs)


def conv_transpose2d(*args, sn: bool, sn_eps: float, **kwargs) -> nn.Module:
    return SNConvTranspose2d(*args, sn_eps=sn_eps, **kwargs) if sn else nn.ConvTranspose2d(*args, **kwargs)


def linear(*args, sn: bool, sn_eps: float, **kwargs) -> nn.Module:
    return SNLinear(*args, sn_eps=sn_eps, **kwargs) if sn else nn.Linear(*args, **kwargs)


def embedding(*args, sn: bool, sn_eps: float, **kwargs) -> nn.Module:
    return SNEmbedding(*args, sn_eps=sn_eps, **kwargs) if sn else ClassEmbedding(*args, **kwargs)


def embed(y: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Class labels (N,) or class weights (N, n_classes) -> embeddings (N, dim).

    Class weights (one-hot, or a mixture for interpolating between classes) give the same mix of
    embeddings, which is how class interpolation sheets are made.
    """
    if y.is_floating_point():
        return y.to(weight.dtype) @ weight
    return F.embedding(y, weight)


class ClassEmbedding(nn.Embedding):
    """nn.Embedding that also takes class weights (N, n_classes) in place of labels."""

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return embed(y, self.weight)


class ConditionalBatchNorm2d(nn.Module):
    """BatchNorm whose gain and bias come from the class (de Vries et al. 2017; SN-GAN, BigGAN).

    gain = 1 + gain_embed(y), bias = bias_embed(y), where y is labels or class weights.
    """

    def __init__(self, num_features: int, n_classes: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features, eps=eps, momentum=momentum, affine=False)
        self.gain = ClassEmbedding(n_classes, num_features)
        self.bias = ClassEmbedding(n_classes, num_features)
        nn.init.zeros_(self.gain.weight)
        nn.init.zeros_(self.bias.weight)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        gain = 1 + self.gain(y)[:, :, None, None]
        bias = self.bias(y)[:, :, None, None]
        return self.bn(x) * gain + bias


def batch_norm(num_features: int, n_classes: int, eps: float) -> nn.Module:
    """Conditional BN when there are classes, plain affine BN otherwise."""
    if n_classes:
        return ConditionalBatchNorm2d(num_features, n_classes, eps=eps)
    return nn.BatchNorm2d(num_features, eps=eps)


def apply_bn(bn: nn.Module, x: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
    return bn(x, y) if isinstance(bn, ConditionalBatchNorm2d) else bn(x)


def init_weights(module: nn.Module, scheme: str) -> None:
    """Initialise conv, linear and embedding weights: 'N02' (DCGAN), 'ortho' (BigGAN) or 'xavier' (SN-GAN).

    Conditional-BN embeddings keep their zero init, so every class starts at gain 1, bias 0.
    """
    cbn = {id(e) for m in module.modules() if isinstance(m, ConditionalBatchNorm2d) for e in (m.gain, m.bias)}
    for m in module.modules():
        if not isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear, nn.Embedding)) or id(m) in cbn:
            continue
        if scheme == "N02":
            nn.init.normal_(m.weight, 0.0, 0.02)
        elif scheme == "ortho":
            nn.init.orthogonal_(m.weight)
        elif scheme == "xavier":
            nn.init.xavier_uniform_(m.weight)
        else:
            raise BigbatchError(f"unknown init scheme '{scheme}'; valid: N02, ortho, xavier")
        if getattr(m, "bias", None) is not None and not isinstance(m, nn.Embedding):
            nn.init.zeros_(m.bias)


def set_sn_update(module: nn.Module, enabled: bool | str) -> None:
    """Set when the spectral-norm layers of `module` run a power iteration: True, False or "once"."""
    for m in module.modules():
        if isinstance(m, SpectralNorm):
            m.sn_update = enabled


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
