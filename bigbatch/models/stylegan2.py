"""StyleGAN2 (Karras et al. 2020, config F) as StyleGAN2-ADA's PyTorch code trains it, written here from
the papers: a mapping network z -> w (8 layers at 0.01x learning rate, class-conditional through an
embedding of the class joined to z), a synthesis network of modulated and demodulated 3x3 convolutions
from a learned 4x4 constant with per-pixel noise and a skip ("output skips") image path, a residual D
with a minibatch standard deviation layer and, with classes, a projection onto a mapped class embedding.
Every weight uses the equalized learning rate (stored N(0, 1), scaled by 1/sqrt(fan-in) when used), so
the family's `init` is "equalized": the layers initialise themselves. Resampling is the [1, 3, 3, 1]
FIR filter of the papers (zero padding), D's 2x downsampling a blur before a stride-2 convolution and
G's upsampling a stride-2 transposed convolution followed by the blur.

Where it differs from StyleGAN2-ADA's code, by design:
- Per-image randomness (the noise inputs; style mixing's second z, its cut-off and whether it mixes)
  is drawn from a seed made from the image's own z, on the CPU, so it is the same whatever images
  share the micro-batch, the rank and the device, and `G(z)` is a function of z: the same sample twice.
  ADA draws one cut-off per batch from the global RNG.
- The minibatch standard deviation groups consecutive images (ADA strides its groups across the
  batch), so a group lies within any micro-batch that is a multiple of the group size: the statistic
  does not depend on how a step is split. Other micro-batches are refused.
- w_avg (the truncation trick's centre) is tracked once per G step from the whole step's latents
  (`track_w_avg`, called by the GAN task), not in each forward on each GPU's share.
- Exported (ONNX, TorchScript, pt2), G uses each layer's fixed noise image (ADA's noise_mode="const").
Weights are not interchangeable with ADA's pickles.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bigbatch.compiling import eager
from bigbatch.data.streams import host_rows, per_row, row_seeds
from bigbatch.errors import BigbatchError
from bigbatch.models import fused
from bigbatch.models.registry import register

SQRT2 = math.sqrt(2)
NOISE_MODES = ("random", "const", "none")


def _lrelu(x: torch.Tensor) -> torch.Tensor:
    return F.leaky_relu(x, fused.SLOPE) * SQRT2  # the gain that keeps the activations' second moment


def fir(like: torch.Tensor | None = None) -> torch.Tensor:
    """The 4x4 [1, 3, 3, 1] filter, normalised to sum 1, in float32 (on `like`'s device: made from it, not
    copied there, so that a TorchScript trace of G, which keeps a device given by name as a constant, runs
    on any device)."""
    one = torch.ones(1) if like is None else like.new_ones(1, dtype=torch.float32)
    f = torch.cat([one, 3 * one, 3 * one, one])
    return torch.outer(f, f) / f.sum() ** 2


_WEIGHTS: dict[tuple[torch.device, torch.dtype, float], torch.Tensor] = {}


def _weights(x: torch.Tensor, gain: float) -> torch.Tensor:
    """The filter times `gain` in x's dtype and on its device, (1, 1, 4, 4): made once a device, dtype and gain when
    run eagerly (ten small kernels a call otherwise); made from x where traced, exported or compiled. Kept only as a
    plain tensor (not one made under inference mode, a fake-tensor mode or vmap, which a later step could not use);
    made on the stream and outside any CUDA graph capture of its first call (the project's steps: the default stream,
    and the compiled graphs make their own)."""
    if fused.exporting() or torch.compiler.is_compiling():
        return (fir(x) * gain).to(x.dtype)[None, None]
    key = (x.device, x.dtype, float(gain))
    if (f := _WEIGHTS.get(key)) is None:
        f = (fir(x) * gain).to(x.dtype)[None, None]
        if type(f) is torch.Tensor and not f.is_inference() and not torch._C._functorch.is_functorch_wrapped_tensor(f):
            _WEIGHTS[key] = f
    return f


def _filtered(x: torch.Tensor, pad: int, gain: float) -> torch.Tensor:
    """The FIR filter times `gain` over each channel of x, `pad` zeros on each side: on the devices in fused.ON one
    compiled kernel (`_fused_fir`), or its sums traced into a compiled model's graph, which fuses them; else a grouped
    convolution, which cuDNN may run slowest (a group a channel) and oneDNN, on this project's CPUs, fastest."""
    if fused.runs(x):
        return _fused_fir(x, pad, gain)
    if x.device.type in fused.ON and torch.compiler.is_compiling() and not fused.exporting():
        return _fir_sums(x, pad, gain)
    return _grouped(x, pad, gain)


def _grouped(x: torch.Tensor, pad: int, gain: float) -> torch.Tensor:
    """The filter as a grouped convolution, a group a channel (conv2d's padding: the same sums as padding first,
    without a padded copy of x)."""
    return F.conv2d(x, _weights(x, gain).expand(x.shape[1], 1, 4, 4), padding=pad, groups=x.shape[1])


def _fir_sums(x: torch.Tensor, pad: int, gain: float) -> torch.Tensor:
    """The filter as sums of shifted slices: [1, 3, 3, 1] / 8 along the width, then the height (it is their outer
    product), each tap times sqrt(gain). Eagerly a dozen memory-bound ops; compiled, a fused kernel or two."""
    a, b = (tap * math.sqrt(gain) / 8 for tap in (1.0, 3.0))
    x = F.pad(x, [pad] * 4)
    x = (x[..., :-3] + x[..., 3:]) * a + (x[..., 1:-2] + x[..., 2:-1]) * b
    return (x[..., :-3, :] + x[..., 3:, :]) * a + (x[..., 1:-2, :] + x[..., 2:-1, :]) * b


def _fused_fir(x: torch.Tensor, pad: int, gain: float) -> torch.Tensor:
    """`_fir_sums` as one compiled kernel (fused.run), in autocast's dtype where autocast is on, as the grouped
    convolution computes (`_Blur` differentiates it)."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        x = x.to(torch.get_autocast_dtype(device))
    return fused.run(_fir_sums, x, pad, float(gain))


class _Blur(torch.autograd.Function):
    """`blur` with a backward of its own. The filter is symmetric, so the gradient of a blur over `pad` zeros is
    the blur of the gradient over 3 - pad zeros: a blur again, and every order of gradient one grouped convolution
    with the same filter. Autograd's own double backward of a grouped convolution (R1's and path length's) ran a
    convolution for each channel: a D step with R1 at 256 px dispatched 8,424 convolutions where a plain one
    dispatches 320, now 488 (`python bench/roofline.py`, its phases)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, pad: int, gain: float) -> torch.Tensor:
        ctx.pad, ctx.gain = pad, gain
        return _filtered(x, pad, gain)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        with torch.autocast(grad.device.type, enabled=False):  # in the gradient's dtype, as autograd's own
            return _blurred(grad, 3 - ctx.pad, ctx.gain), None, None


def _blurred(x: torch.Tensor, pad: int, gain: float) -> torch.Tensor:
    if torch.is_grad_enabled() and x.requires_grad and not fused.exporting():
        return _Blur.apply(x, pad, gain)
    return _filtered(x, pad, gain)


def blur(x: torch.Tensor, pad: int, gain: float = 1.0) -> torch.Tensor:
    """The FIR filter over every channel, `pad` (at most 3) zeros on each side (the output is 2 * pad - 3 larger).
    Differentiated by `_Blur` where a gradient is wanted; traced or exported as the one convolution it is."""
    if not 0 <= pad <= 3:
        raise ValueError(f"blur pads 0 to 3 pixels, not {pad}")
    return _blurred(x, pad, gain)


def upsample(x: torch.Tensor) -> torch.Tensor:
    """2x upsampling: zeros between the pixels, then the FIR filter with gain 4."""
    c = x.shape[1]
    f = _weights(x, 4.0).expand(c, 1, 4, 4)
    return F.conv_transpose2d(x, f, stride=2, padding=1, groups=c)


class EqualLinear(nn.Module):
    """A fully connected layer with the equalized learning rate: weight N(0, 1) / lr_mul, used times
    lr_mul / sqrt(fan-in); the bias (starting at `bias_init`) times lr_mul; leaky ReLU with `act`."""

    def __init__(self, cin: int, cout: int, *, bias_init: float = 0.0, lr_mul: float = 1.0, act: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cout, cin) / lr_mul)
        self.bias = nn.Parameter(torch.full((cout,), float(bias_init)))
        self.weight_gain, self.lr_mul, self.act = lr_mul / math.sqrt(cin), lr_mul, act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.linear(x, self.weight * self.weight_gain, self.bias * self.lr_mul)
        return _lrelu(x) if self.act else x


class EqualConv(nn.Module):
    """D's convolution with the equalized learning rate; `down`: blur, then stride 2 (half the size)."""

    def __init__(self, cin: int, cout: int, k: int, *, bias: bool = True, act: bool = True, down: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cout, cin, k, k))
        self.bias = nn.Parameter(torch.zeros(cout)) if bias else None
        self.gain, self.act, self.down, self.k = 1 / math.sqrt(cin * k * k), act, down, k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight * self.gain
        fuse = self.act and self.bias is not None and fused.runs(x)  # (the bias with the activation, one kernel)
        bias = None if fuse else self.bias
        if self.down:
            x = F.conv2d(blur(x, (self.k + 1) // 2), w, bias, stride=2)
        else:
            x = F.conv2d(x, w, bias, padding=self.k // 2)
        if fuse:
            return fused.bias_act(x, self.bias.to(x.dtype), SQRT2)
        return _lrelu(x) if self.act else x


def normalize_2nd_moment(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    return x * (x.square().mean(dim=1, keepdim=True) + eps).rsqrt()


class Mapping(nn.Module):
    """z (and the class, embedded) -> w through `layers` leaky-ReLU layers at lr_mul; dim_z 0: the class
    alone (D's class mapping). Classes are labels (N,) or class weights (N, n_classes)."""

    def __init__(self, dim_z: int, n_classes: int, w_dim: int, layers: int, lr_mul: float):
        super().__init__()
        self.dim_z, self.n_classes = dim_z, n_classes
        self.embed = EqualLinear(n_classes, w_dim) if n_classes else None
        if self.embed is not None:
            self.embed.holds_classes = True  # (fine-tuning onto other classes starts it afresh, as an nn.Embedding)
        widths = [dim_z + (w_dim if n_classes else 0)] + [w_dim] * layers
        self.fc = nn.ModuleList(EqualLinear(a, b, lr_mul=lr_mul, act=True) for a, b in zip(widths[:-1], widths[1:]))

    def forward(self, z: torch.Tensor | None, y: torch.Tensor | None) -> torch.Tensor:
        parts = [] if z is None or not self.dim_z else [normalize_2nd_moment(z)]
        if self.embed is not None:
            if y is None:
                raise BigbatchError("this StyleGAN2 is class-conditional: give it classes")
            onehot = y if y.is_floating_point() else F.one_hot(y, self.n_classes)
            parts.append(normalize_2nd_moment(self.embed(onehot.to(self.embed.weight.dtype))))
        x = torch.cat(parts, dim=1)
        for layer in self.fc:
            x = layer(x)
        return x


class SynthesisLayer(nn.Module):
    """A modulated 3x3 convolution (`up`: 2x upsampling, transposed and blurred), demodulated, with the
    noise input (per-layer strength, starting at 0), bias and leaky ReLU."""

    def __init__(self, cin: int, cout: int, w_dim: int, resolution: int, *, up: bool = False):
        super().__init__()
        self.affine = EqualLinear(w_dim, cin, bias_init=1.0)
        self.weight = nn.Parameter(torch.randn(cout, cin, 3, 3))
        self.bias = nn.Parameter(torch.zeros(cout))
        self.noise_strength = nn.Parameter(torch.zeros(()))
        self.register_buffer("noise_const", torch.randn(resolution, resolution))
        self.up, self.resolution = up, resolution

    def forward(self, x: torch.Tensor, w: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        styles = self.affine(w)
        weight = self.weight
        # Demodulation: each output channel of the per-image weight (weight x styles) scaled to unit norm:
        # sum_i,k (w_oik s_i)^2 = sum_i s_i^2 sum_k w_oik^2, a matmul, never the (N, O, I, 3, 3) weights.
        with torch.autocast(x.device.type, enabled=False):  # in fp32 whatever the autocast: it is small
            dcoefs = (styles.float().square() @ weight.square().sum(dim=[2, 3]).t() + 1e-8).rsqrt()
        x = x * styles.to(x.dtype)[:, :, None, None]
        if self.up:
            x = F.conv_transpose2d(x, weight.transpose(0, 1), stride=2)  # (unflipped, as ADA's)
            x = blur(x, 1, gain=4)
        else:
            x = F.conv2d(x, weight, padding=1)
        noise = None if noise is None else (noise * self.noise_strength).to(x.dtype)
        # (demodulated, the noise and the bias added, the activation: one kernel eagerly on fused.ON's devices)
        return fused.bias_act(x, self.bias.to(x.dtype), SQRT2, dcoefs.to(x.dtype)[:, :, None, None], noise)


class ToRGB(nn.Module):
    """A modulated 1x1 convolution to the image's channels, not demodulated, with bias, no activation."""

    def __init__(self, cin: int, img_channels: int, w_dim: int):
        super().__init__()
        self.affine = EqualLinear(w_dim, cin, bias_init=1.0)
        self.weight = nn.Parameter(torch.randn(img_channels, cin, 1, 1))
        self.bias = nn.Parameter(torch.zeros(img_channels))
        self.gain = 1 / math.sqrt(cin)

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        styles = self.affine(w) * self.gain
        x = F.conv2d(x * styles.to(x.dtype)[:, :, None, None], self.weight)
        return x + self.bias.to(x.dtype)[:, None, None]


class SynthesisBlock(nn.Module):
    """One resolution of the synthesis network: (the 4x4 constant, or an upsampling layer), a layer, and
    the image's channels added to the upsampled image of the block before (output skips)."""

    def __init__(self, cin: int, cout: int, w_dim: int, resolution: int, img_channels: int):
        super().__init__()
        self.first = resolution == 4
        if self.first:
            self.const = nn.Parameter(torch.randn(cout, 4, 4))
        else:
            self.conv0 = SynthesisLayer(cin, cout, w_dim, resolution, up=True)
        self.conv1 = SynthesisLayer(cout, cout, w_dim, resolution)
        self.torgb = ToRGB(cout, img_channels, w_dim)
        self.n_conv = 1 if self.first else 2
        self.resolution = resolution

    def layers(self) -> list[SynthesisLayer]:
        return [self.conv1] if self.first else [self.conv0, self.conv1]

    def forward(
        self, x: torch.Tensor | None, img: torch.Tensor | None, ws: torch.Tensor, noise: list[torch.Tensor | None]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ws: (N, n_conv + 1, w_dim), the last for the image's layer (the next block's first w)."""
        if self.first:
            x = self.const.to(ws.dtype).expand(ws.shape[0], -1, -1, -1)
        for i, layer in enumerate(self.layers()):
            x = layer(x, ws[:, i], noise[i])
        y = self.torgb(x, ws[:, self.n_conv])
        img = y if img is None else upsample(img).to(y.dtype) + y
        return x, img


class StyleGAN2Generator(nn.Module):
    """G(z, y) -> images: the mapping to w, broadcast to every layer (two w's cut at a random layer for a
    `mixing` share of the images in training), the truncation trick when `truncation_psi` < 1, then the
    synthesis. `noise_mode`: "random" (per image, from its z), "const" (each layer's fixed noise image)
    or "none"."""

    supports_path_length = True  # forward(..., return_ws=True)

    def __init__(
        self,
        *,
        resolution: int,
        n_classes: int,
        dim_z: int,
        w_dim: int,
        img_channels: int,
        channels: dict[int, int],
        map_layers: int,
        map_lr_mul: float,
        mixing: float,
        w_avg_beta: float,
    ):
        super().__init__()
        self.resolution, self.n_classes, self.dim_z, self.img_channels = resolution, n_classes, dim_z, img_channels
        self.w_dim, self.mixing, self.w_avg_beta = w_dim, mixing, w_avg_beta
        self.mapping = Mapping(dim_z, n_classes, w_dim, map_layers, map_lr_mul)
        resolutions = [2**i for i in range(2, int(math.log2(resolution)) + 1)]
        self.blocks = nn.ModuleList(
            SynthesisBlock(channels[max(r // 2, 4)], channels[r], w_dim, r, img_channels) for r in resolutions
        )
        self.num_ws = sum(b.n_conv for b in self.blocks) + 1
        self.register_buffer("w_avg", torch.zeros(w_dim))
        self.truncation_psi = 1.0
        self.noise_mode = "random"
        self.checkpoint_blocks = [f"blocks.{i}" for i in range(len(self.blocks))]
        self.draw_keys: np.ndarray | None = None

    @contextmanager
    def keyed(self, z: np.ndarray) -> Iterator[None]:
        """The forwards inside take their per-image draws from `z`, the host's copy of the latents they are
        given: on a GPU they then draw without reading the latents back, which waits for the device's queue
        and leaves it idle while the host draws. The same draws, bit for bit."""
        before, self.draw_keys = self.draw_keys, z
        try:
            yield
        finally:
            self.draw_keys = before

    def _layers(self) -> list[SynthesisLayer]:
        return [layer for b in self.blocks for layer in b.layers()]

    @eager  # per-image Python draws: run as they are under train.compile
    def _draws(self, z: torch.Tensor, noise: bool, mix: bool) -> tuple[list[torch.Tensor | None], torch.Tensor | None]:
        """Each image's noise images and style-mixing draws from its own seed: (noise per layer, or Nones;
        (z2 (N, dim_z), cut-off (N,)) stacked as one (N, dim_z + 1) tensor, or None)."""
        layers = self._layers()
        sizes = [layer.resolution**2 for layer in layers]
        n = len(z)
        flat = host_rows(n, (sum(sizes),), z.device) if noise else None

        def draw(i: int, g: torch.Generator) -> torch.Tensor | None:
            row = None
            if mix:
                mixes = bool(torch.rand((), generator=g) < self.mixing)
                cut = int(torch.randint(1, self.num_ws, (), generator=g)) if mixes else self.num_ws
                row = torch.cat([torch.randn(self.dim_z, generator=g), torch.tensor([float(cut)])])
            if flat is not None:
                torch.randn(sum(sizes), generator=g, out=flat[i])
            return row

        keys = self.draw_keys
        if keys is not None and keys.shape != z.shape:
            raise BigbatchError(f"G.keyed: latents {tuple(keys.shape)} on the host for a forward of {tuple(z.shape)}")
        keyed_by = z if keys is None else torch.from_numpy(keys)
        mix_rows = per_row(row_seeds(keyed_by), draw, sum(sizes) if noise else self.dim_z)
        mixed = torch.stack(mix_rows).to(z.device, non_blocking=True) if mix else None
        if flat is None:
            return [None] * len(layers), mixed
        parts = flat.to(z.device, non_blocking=True).split(sizes, dim=1)
        return [p.view(n, 1, layer.resolution, layer.resolution) for p, layer in zip(parts, layers)], mixed

    @torch.no_grad()
    def track_w_avg(self, z: torch.Tensor, y: torch.Tensor | None) -> None:
        """Move w_avg toward the mean w of a step's latents (all of them: every rank the same)."""
        device = self.w_avg.device
        z, y = z.to(device, non_blocking=True), None if y is None else y.to(device, non_blocking=True)
        w = self.mapping(z, y).float().mean(dim=0)
        self.w_avg.copy_(w.lerp(self.w_avg, self.w_avg_beta))

    def forward(
        self,
        z: torch.Tensor,
        y: torch.Tensor | None = None,
        return_ws: bool = False,
        ws: torch.Tensor | None = None,
    ):
        """Images (N, C, H, W) in about [-1, 1]; with `return_ws`, (images, the w of every layer (N, num_ws,
        w_dim)), for path length regularization's gradient with respect to them. `ws`: the w of every layer to
        synthesize from, as `return_ws` gives them (truncated), in place of z's and y's (a style-mixing sheet's);
        z then only draws the noise."""
        mode = self.noise_mode
        if fused.exporting():
            mode = "const" if mode == "random" else mode  # an exported G holds no seeding code
        mix = self.training and self.mixing > 0 and self.num_ws > 1 and ws is None
        if mode == "random" or mix:
            noise, mixed = self._draws(z, mode == "random", mix)
        else:
            noise, mixed = [None] * len(self._layers()), None
        if mode == "const":
            noise = [layer.noise_const.expand(z.shape[0], 1, -1, -1) for layer in self._layers()]
        if ws is None:
            ws = self.mapping(z, y)[:, None].expand(-1, self.num_ws, -1)
            if mixed is not None:
                w2 = self.mapping(mixed[:, :-1], y)
                later = torch.arange(self.num_ws, device=z.device)[None, :] >= mixed[:, -1:]
                ws = torch.where(later[:, :, None], w2[:, None], ws)
            if self.truncation_psi != 1:
                ws = self.w_avg.to(ws.dtype).lerp(ws, self.truncation_psi)
        elif ws.shape[1:] != (self.num_ws, self.w_dim) or len(ws) != len(z):
            raise BigbatchError(f"ws {tuple(ws.shape)} for {len(z)} images of {self.num_ws} layers of w {self.w_dim}")
        x = img = None
        k = 0
        for block in self.blocks:
            x, img = block(x, img, ws[:, k : k + block.n_conv + 1], noise[k : k + block.n_conv])
            k += block.n_conv
        return (img, ws) if return_ws else img


def minibatch_stddev(x: torch.Tensor, group: int) -> torch.Tensor:
    """x with one more channel: the standard deviation over each group of `group` consecutive images,
    averaged over channels and pixels, the same for every image of the group."""
    n, c, h, w = x.shape
    if n % group:
        raise BigbatchError(
            f"stylegan2's D computes a standard deviation over groups of {group} images and was given {n}: "
            f"give train.micro_batch a multiple of {group} (or set model.options.mbstd_group)"
        )
    y = x.float().reshape(n // group, group, c, h, w)
    y = (y.var(dim=1, unbiased=False) + 1e-8).sqrt().mean(dim=[1, 2, 3])  # (n // group,)
    y = y.repeat_interleave(group)[:, None, None, None].expand(n, 1, h, w)
    return torch.cat([x, y.to(x.dtype)], dim=1)


class DBlock(nn.Module):
    """D's block: two 3x3 convolutions, the second halving the size; `resnet`: beside a 1x1 skip, each side
    times sqrt(1/2) (ADA's "resnet" architecture; without, its "orig")."""

    def __init__(self, cin: int, cout: int, resnet: bool):
        super().__init__()
        self.conv0 = EqualConv(cin, cin, 3)
        self.conv1 = EqualConv(cin, cout, 3, down=True)
        self.skip = EqualConv(cin, cout, 1, bias=False, act=False, down=True) if resnet else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.skip is None:
            return self.conv1(self.conv0(x))
        return (self.skip(x) + self.conv1(self.conv0(x))) * math.sqrt(0.5)


class StyleGAN2Discriminator(nn.Module):
    """D(x, y) -> logits (N,): from RGB, residual blocks down to 4x4, the minibatch standard deviation,
    a 3x3 convolution and two fully connected layers; with classes, the output (cmap_dim wide) projected
    onto the class's mapped embedding, over sqrt(cmap_dim)."""

    reads_real_and_fake_apart = True  # the minibatch statistic must see real and fake images apart

    def __init__(
        self,
        *,
        resolution: int,
        n_classes: int,
        img_channels: int,
        channels: dict[int, int],
        mbstd_group: int,
        map_layers: int,
        map_lr_mul: float,
        resnet: bool,
    ):
        super().__init__()
        self.resolution, self.n_classes, self.mbstd_group = resolution, n_classes, mbstd_group
        self.fromrgb = EqualConv(img_channels, channels[resolution], 1)
        resolutions = [2**i for i in range(int(math.log2(resolution)), 2, -1)]
        self.blocks = nn.ModuleList(DBlock(channels[r], channels[r // 2], resnet) for r in resolutions)
        c = channels[4]
        self.conv = EqualConv(c + 1, c, 3)
        self.fc = EqualLinear(c * 16, c, act=True)
        self.cmap_dim = c if n_classes else 1
        self.out = EqualLinear(c, self.cmap_dim)
        self.mapping = Mapping(0, n_classes, self.cmap_dim, map_layers, map_lr_mul) if n_classes else None
        self.checkpoint_blocks = [f"blocks.{i}" for i in range(len(self.blocks))]

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        h = self.fromrgb(x)
        for block in self.blocks:
            h = block(h)
        # (training: a micro-batch smaller than a group is one group, as ADA's min(group, N); eval: any batch)
        group = min(self.mbstd_group, len(h)) if self.training else math.gcd(self.mbstd_group, len(h))
        h = self.conv(minibatch_stddev(h, group))
        out = self.out(self.fc(h.flatten(1)))
        if self.mapping is None:
            return out.squeeze(1)
        cmap = self.mapping(None, y)
        return (out * cmap.to(out.dtype)).sum(dim=1) / math.sqrt(self.cmap_dim)


@register(init="equalized")
def stylegan2(
    *,
    resolution: int,
    n_classes: int = 0,
    ch: int = 64,
    dim_z: int = 512,
    img_channels: int = 3,
    ch_max: int = 512,
    w_dim: int = 512,
    map_layers: int = 8,
    map_lr_mul: float = 0.01,
    mixing: float = 0.9,
    mbstd_group: int = 4,
    w_avg_beta: float = 0.995,
    d_map_layers: int = 8,
    d_resnet: bool = True,
) -> tuple[nn.Module, nn.Module]:
    """StyleGAN2 at any power-of-two resolution >= 8. `ch`: the width at 256 px, doubling at each halving
    of the resolution up to `ch_max` (ADA's channel_base = 256 ch; ch 64 is its paper256 config, 128 its
    cifar, paper512 and config F). `mixing`: the share of G's training images whose w switches to a second
    z's at a random layer (ADA: 0.9, 0 for cifar). `d_map_layers`: the layers of D's class mapping (ADA
    keeps its default 8 whatever G's); `d_resnet`: D's residual skips (ADA's cifar config: off)."""
    if resolution < 8 or resolution & (resolution - 1):
        raise BigbatchError(f"stylegan2 supports power-of-two resolutions >= 8 (data.resolution), got {resolution}")
    sizes = {"ch_max": ch_max, "w_dim": w_dim, "map_layers": map_layers, "d_map_layers": d_map_layers}
    for name, value in (*sizes.items(), ("mbstd_group", mbstd_group)):
        if value < 1:
            raise BigbatchError(f"stylegan2 option {name} must be >= 1, got {value}")
    for name, value, fits, want in (  # (found from outside: the three rules in one line, naming neither key nor value)
        ("mixing", mixing, 0 <= mixing <= 1, "in [0, 1]"),
        ("w_avg_beta", w_avg_beta, 0 <= w_avg_beta < 1, "in [0, 1)"),
        ("map_lr_mul", map_lr_mul, map_lr_mul > 0, "> 0"),
    ):
        if not fits:
            raise BigbatchError(f"stylegan2 option {name} must be {want}, got {value}")
    channels = {2**i: min(ch * 256 // 2**i, ch_max) or 1 for i in range(2, int(math.log2(resolution)) + 1)}
    G = StyleGAN2Generator(
        resolution=resolution,
        n_classes=n_classes,
        dim_z=dim_z,
        w_dim=w_dim,
        img_channels=img_channels,
        channels=channels,
        map_layers=map_layers,
        map_lr_mul=map_lr_mul,
        mixing=mixing,
        w_avg_beta=w_avg_beta,
    )
    D = StyleGAN2Discriminator(
        resolution=resolution,
        n_classes=n_classes,
        img_channels=img_channels,
        channels=channels,
        mbstd_group=mbstd_group,
        map_layers=d_map_layers,
        map_lr_mul=map_lr_mul,
        resnet=d_resnet,
    )
    return G, D
