"""Building blocks shared by the model families: spectral norm, class embeddings, conditional BN,
weight initialisation (the GAN schemes, and He et al.'s for the ResNet classifiers).

Spectral norm is written here rather than taken from torch.nn.utils because the trainer must decide
when the power iteration runs (once per optimizer step, or once per micro-batch) and must be able
to replay the same normalisation on every micro-batch of a step: each layer declares
`before_micro_batch`, which the Replicator calls on the modules it prepares.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bigbatch.errors import BigbatchError


class SpectralNorm:
    """Mixin for layers with a `weight`: divides it by its largest singular value (Miyato et al. 2018).

    The estimate's vectors u, v are buffers. `sn_update` says which training forwards run a power
    iteration and store u and v: True every one (as torch's spectral_norm; the default), False none.
    Under a Replicator, `before_micro_batch` (the engine calls it on every module it prepared) runs the
    step's one power iteration itself, before the first micro-batch (or before each with
    `sn_every_micro_batch`), and leaves the forwards none: every micro-batch of a step,
    and every recomputation under activation checkpointing, sees exactly the same normalised weight
    (the step of the whole batch, whatever the split), and a compiled forward has one graph, not one
    that iterates and one that does not.
    """

    sn_update: bool = True
    sn_every_micro_batch: bool = False
    ema_copies = ("sn_u", "sn_v")  # an average of G's weights takes these from G (engine.ema.update_ema)
    sn_by_engine: bool = False  # the engine calls before_micro_batch (spectral_norm_hook leaves the layer)

    def before_micro_batch(self, index: int) -> None:
        """The engine's call before micro-batch `index` of a step (0 for a memory probe): in training
        mode, the step's power iteration now if `index` is 0 (each index with `sn_every_micro_batch`):
        the same arithmetic as in the forward that follows, outside it."""
        SpectralNorm.before_micro_batches([self], index)

    @staticmethod
    def before_micro_batches(layers: list[SpectralNorm], index: int) -> None:
        """`before_micro_batch` of many layers at once (the engine calls it so when a class has it): their
        power iterations' divisions, clamps and copies in a few kernels, the products and norms one per layer
        (BigGAN-128's 64 layers: 640 launches a step a layer at a time, 266 together; each one costs the host
        microseconds on a GPU). The same arithmetic, to the bit."""
        for m in layers:
            m.sn_by_engine = True
        iterate_before_forwards(layers, lambda m: index == 0 or m.sn_every_micro_batch)

    def _init_sn(self, eps: float) -> None:
        out = self.weight.shape[0]
        if self.weight.is_meta:  # (a dry run's model, its shapes alone: meta's normalize took 2 s a BigGAN-deep)
            u, v = torch.empty(1, out, device="meta"), torch.empty(1, self.weight[0].numel(), device="meta")
        else:
            u = F.normalize(torch.randn(1, out), dim=1, eps=eps)
            v = F.normalize(torch.randn(1, self.weight[0].numel()), dim=1, eps=eps)
        self.register_buffer("sn_u", u)
        self.register_buffer("sn_v", v)
        self.sn_eps = eps

    def normalized_weight(self) -> torch.Tensor:
        # In the weight's own precision (fp32) whatever the autocast: sigma in bf16 would jitter.
        if self.training and self.sn_update:
            self._power_iteration()
        with torch.autocast(self.weight.device.type, enabled=False):
            w = self.weight.flatten(1)
            sigma = (self.sn_u @ w @ self.sn_v.t()).squeeze()
            return self.weight / sigma

    def _power_iteration(self) -> None:
        with torch.no_grad(), torch.autocast(self.weight.device.type, enabled=False):
            w = self.weight.flatten(1)
            v = F.normalize(self.sn_u @ w, dim=1, eps=self.sn_eps)
            u = F.normalize(v @ w.t(), dim=1, eps=self.sn_eps)
        # In a forward, new tensors, not in-place copies: an earlier forward's graph may still hold the old ones.
        self.sn_u, self.sn_v = u, v


def iterate_before_forwards(layers: list[SpectralNorm], now: Callable[[SpectralNorm], bool]) -> None:
    """A power iteration now of each layer in training mode that `now(layer)` picks, and none in the forwards
    that follow (of any of `layers`). The vectors are written into u's and v's own memory: no graph holds them
    between micro-batches, and CUDA graphs read the buffers where they were recorded (new tensors would be a
    new recording a step). The layers' weights of one dtype on one device iterate together."""
    alike: dict[tuple[torch.device, torch.dtype], list[SpectralNorm]] = {}
    for m in layers:
        m.sn_update = False
        if m.training and now(m):  # (one buffer holds vectors of one dtype on one device)
            alike.setdefault((m.weight.device, m.weight.dtype), []).append(m)
    for group in alike.values():
        _iterate_together(group)


def _iterate_together(now: list[SpectralNorm]) -> None:
    """One power iteration of each layer of `now` (weights of one dtype on one device), as F.normalize makes
    it a layer at a time (the forwards' own iteration): the products and norms one per layer, the rest in a
    few kernels."""
    with torch.no_grad(), torch.autocast(now[0].weight.device.type, enabled=False):
        ws = [m.weight.flatten(1) for m in now]
        eps = [m.sn_eps for m in now]
        v_all, vs, v_widths = _laid_out([w.shape[1] for w in ws], ws[0])
        for m, w, v in zip(now, ws, vs):
            torch.mm(m.sn_u, w, out=v)
        _normalize(v_all, vs, v_widths, eps)
        u_all, us, u_widths = _laid_out([w.shape[0] for w in ws], ws[0])
        for v, w, u in zip(vs, ws, us):
            torch.mm(v, w.t(), out=u)
        _normalize(u_all, us, u_widths, eps)
        torch._foreach_copy_([m.sn_u for m in now], us)
        torch._foreach_copy_([m.sn_v for m in now], vs)


ALIGN_BYTES = 512  # where each vector of _laid_out starts: as CUDA's caching allocator aligns a tensor of its own


def _laid_out(sizes: list[int], like: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor], list[int]]:
    """One buffer of `like`'s dtype and device, a (1, n) row of it for each of `sizes`, end to end, each
    starting ALIGN_BYTES-aligned within it, and the widths they take (padding included): a product written
    there (mm's out) is the one a tensor of its own gets, to the bit (a BLAS sums in the same order from the
    same alignment)."""
    align = max(1, ALIGN_BYTES // like.element_size())
    widths = [-(-n // align) * align for n in sizes]
    starts = list(itertools.accumulate(widths, initial=0))
    buffer = like.new_empty(1, starts[-1])
    return buffer, [buffer[:, a : a + n] for a, n in zip(starts, sizes)], widths


def _normalize(buffer: torch.Tensor, rows: list[torch.Tensor], widths: list[int], eps: list[float]) -> None:
    """F.normalize(row, dim=1, eps) in place of each row `_laid_out` made, the same ops: the norms one per row,
    their clamps in one multi-tensor kernel, and the divisions in one kernel over the whole buffer (its padding,
    never read, divided too)."""
    norms = [row.norm(2, 1, keepdim=True) for row in rows]
    torch._foreach_clamp_min_(norms, eps)
    buffer.div_(torch.cat([norm.expand(1, width) for norm, width in zip(norms, widths)], dim=1))


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


D_CONDS = ("PD", "AC", "ADC")  # StudioGAN's names of the ways a D here reads the class (d_cond_mtd; ADC: aux_cls_type)


def check_d_cond(family: str, d_cond: str, n_classes: int) -> None:
    """Refuse a d_cond option (class_heads) that is not one of D_CONDS, or "AC" for a G and D without classes."""
    if d_cond not in D_CONDS:
        raise BigbatchError(
            f'{family} option d_cond must be "PD" (projection), "AC" (an auxiliary classifier, ACGAN) or "ADC" (an '
            f"auxiliary discriminative classifier, ADCGAN), got {d_cond!r}"
        )
    if d_cond != "PD" and not n_classes:
        raise BigbatchError(
            f"{family} option d_cond = {d_cond!r} classifies the images by class, and this G and D have none (an "
            "unconditional run: model.conditional = false, or data without classes)"
        )


def class_heads(d_cond: str, n_classes: int, width: int, **sn: Any) -> tuple[nn.Module | None, nn.Module | None]:
    """A conditional D's way of reading the class from its pooled features (`width` wide), as StudioGAN's d_cond_mtd
    (checked by check_d_cond): "PD", the projection (Miyato & Koyama 2018: an embedding of the class, whose product with
    the features joins the logit), or "AC", an auxiliary classifier (Odena et al. 2017, ACGAN: a bias-free linear map of
    the features to the classes' logits, put out beside the logit: `with_classes`), or "ADC", one of twice the classes,
    a real image's class c and a generated one's c + 1/2 apart (Hou et al. 2022, ADCGAN; `discriminative`). Returns
    (embedding, classifier), neither without classes."""
    if not n_classes:
        return None, None
    if d_cond == "PD":
        return embedding(n_classes, width, **sn), None
    head = linear(width, n_classes * (2 if d_cond == "ADC" else 1), bias=False, **sn)
    head.holds_classes = True  # (a fine-tune onto another number of classes starts it anew, as an embedding)
    head.discriminative = d_cond == "ADC"  # (its logits of class c: 2c for real images, 2c + 1 for generated ones)
    return None, head


def with_classes(logit: torch.Tensor, classifier: nn.Module | None, h: torch.Tensor) -> torch.Tensor:
    """D's output: the logits (N,), or with an auxiliary classifier (N, 1 + classes), the logit first."""
    return logit if classifier is None else torch.cat([logit.unsqueeze(1), classifier(h).to(logit.dtype)], 1)


class ClassEmbedding(nn.Embedding):
    """nn.Embedding that also takes class weights (N, n_classes) in place of labels."""

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return embed(y, self.weight)


# How a conditional BN's gain and bias start (ConditionalBatchNorm2d's `start`).
BN_STARTS = ("scheme", "identity", "scheme_then_identity")
INIT_SCHEMES = ("N02", "ortho", "xavier", "kaiming", "none", "equalized")


class ConditionalBatchNorm2d(nn.Module):
    """BatchNorm whose gain and bias come from the conditioning (de Vries et al. 2017; SN-GAN, BigGAN),
    gain = 1 + gain(cond) and bias = bias(cond), where the maps are either

    - per-class embeddings of the labels or class weights (`n_classes`: SN-GAN, DCGAN, BigGAN without
      a shared embedding), or
    - spectral-normalised linear maps, without bias, of a conditioning vector (`cond_dim`: BigGAN's
      shared class embedding and/or the block's chunk of z).

    With neither it is an ordinary affine BN that ignores `cond`, so a block calls every BN one way.
    `start` says how gain and bias begin under `init_weights`: "scheme", drawn by the family's init
    scheme like every other weight (BigGAN-PyTorch); "identity", zero (gain 1, bias 0 for every class)
    and left alone by the scheme; "scheme_then_identity", drawn and then zeroed: it starts as
    "identity" does, but the draws advance the RNG as SN-GAN's builder always has, so the weights
    after them (and every checkpoint made from a seed) stay what they were.
    """

    def __init__(
        self,
        num_features: int,
        *,
        n_classes: int = 0,
        cond_dim: int = 0,
        eps: float = 1e-5,
        sn_eps: float = 1e-6,
        start: str = "scheme",
    ):
        super().__init__()
        if n_classes and cond_dim:
            raise ValueError("a conditional BN reads either class labels (n_classes) or a vector (cond_dim)")
        if start not in BN_STARTS or (start != "scheme" and cond_dim):
            # A zero weight would give a spectral-normalised map sigma 0: only class embeddings start at zero.
            raise ValueError(f"start must be one of {BN_STARTS}, and 'scheme' with cond_dim; got {start!r}")
        self.bn = nn.BatchNorm2d(num_features, eps=eps, affine=not (n_classes or cond_dim))
        self.gain: nn.Module | None = None
        self.bias: nn.Module | None = None
        if n_classes:
            self.gain = ClassEmbedding(n_classes, num_features)
            self.bias = ClassEmbedding(n_classes, num_features)
            if start != "scheme":
                nn.init.zeros_(self.gain.weight)
                nn.init.zeros_(self.bias.weight)
        elif cond_dim:
            self.gain = linear(cond_dim, num_features, bias=False, sn=True, sn_eps=sn_eps)
            self.bias = linear(cond_dim, num_features, bias=False, sn=True, sn_eps=sn_eps)
        self.start = start

    def forward(self, x: torch.Tensor, cond: torch.Tensor | None = None) -> torch.Tensor:
        if self.gain is None:
            return self.bn(x)
        gain = 1 + self.gain(cond)[:, :, None, None]
        return self.bn(x) * gain + self.bias(cond)[:, :, None, None]


def init_weights(module: nn.Module, scheme: str) -> None:
    """Initialise conv, linear and embedding weights in module order: 'N02' (DCGAN), 'ortho' (BigGAN),
    'xavier' (SN-GAN) or 'kaiming' (the ResNets); biases of convs and linears to zero. Conditional BNs'
    gains and biases follow their `start`. 'equalized' (StyleGAN2's equalized learning rate) leaves the
    module as it is: its layers draw their N(0, 1) weights themselves. 'none' leaves PyTorch's own
    initialisation, as the layers drew it (BigGAN-PyTorch's --skip_init).

    'kaiming' is torchvision's ResNet initialisation: convs He-normal with the fan-out (He et al. 2015),
    BatchNorm weight 1 and bias 0; linears (and embeddings) N(0, 0.01) as in Goyal et al. 2017, where
    torchvision leaves the head at PyTorch's default."""
    if scheme not in INIT_SCHEMES:
        raise BigbatchError(f"unknown init scheme '{scheme}'; valid: {', '.join(INIT_SCHEMES)}")
    if scheme in ("equalized", "none"):
        return
    start = {
        id(e): m.start
        for m in module.modules()
        if isinstance(m, ConditionalBatchNorm2d) and m.gain is not None
        for e in (m.gain, m.bias)
    }
    for m in module.modules():
        how = start.get(id(m), "scheme")
        if scheme == "kaiming" and isinstance(m, nn.modules.batchnorm._BatchNorm) and m.affine:
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        if not isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear, nn.Embedding)) or how == "identity":
            continue
        if scheme == "kaiming":
            if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            else:
                nn.init.normal_(m.weight, 0.0, 0.01)
        elif scheme == "N02":
            nn.init.normal_(m.weight, 0.0, 0.02)
        elif scheme == "ortho":
            nn.init.orthogonal_(m.weight)
        else:
            nn.init.xavier_uniform_(m.weight)
        if getattr(m, "bias", None) is not None and not isinstance(m, nn.Embedding):
            nn.init.zeros_(m.bias)
        if how == "scheme_then_identity":
            nn.init.zeros_(m.weight)


def set_sn_update(module: nn.Module, enabled: bool) -> None:
    """Whether the spectral-norm layers of `module` run a power iteration in every training forward."""
    for m in module.modules():
        if isinstance(m, SpectralNorm):
            m.sn_update = enabled


def set_sn_every_micro_batch(module: nn.Module, enabled: bool) -> None:
    """Under a Replicator, run the spectral-norm power iteration of `module`'s layers on every
    micro-batch (BigGAN-PyTorch's behaviour; results then depend on the split) instead of once per step."""
    for m in module.modules():
        if isinstance(m, SpectralNorm):
            m.sn_every_micro_batch = enabled


def spectral_norm_hook(*modules: nn.Module, every_micro_batch: bool = False) -> Callable[[int], None]:
    """A `Replicator.on_micro_batch` hook for spectral-norm layers the Replicator did not prepare (those
    it prepared iterate through `before_micro_batch`, and the hook leaves them): before micro-batch i
    of a step, one power iteration when i == 0 (or on every micro-batch with `every_micro_batch`), and
    none in the forwards, so a recomputation under activation checkpointing repeats nothing."""
    sn_layers = [m for module in modules for m in module.modules() if isinstance(m, SpectralNorm)]

    def iterate(i: int) -> None:
        iterate_before_forwards([m for m in sn_layers if not m.sn_by_engine], lambda m: i == 0 or every_micro_batch)

    return iterate


def singular_values(module: nn.Module) -> dict[str, torch.Tensor]:
    """Each spectrally normalized layer's estimate of its weight's largest singular value (BigGAN-PyTorch's sv0, which
    the BigGAN paper watched rise before a collapse), by the layer's name: u W v^T of its weight now and the u, v of
    its last power iteration (the step's divisor was of the weight before the step; the next step's iterates once
    more), read without an iteration: 0-d tensors on the weights' device."""
    with torch.no_grad():
        return {
            name: (m.sn_u @ m.weight.flatten(1) @ m.sn_v.t()).squeeze()
            for name, m in module.named_modules()
            if isinstance(m, SpectralNorm) and hasattr(m, "sn_u")
        }


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
