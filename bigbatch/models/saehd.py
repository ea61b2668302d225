"""DeepFaceLab's SAEHD face-swap autoencoder (iperov/DeepFaceLab: core/leras/archis/DeepFakeArchi.py,
models/Model_SAEHD/Model.py), layer for layer, so that DFL's weights load into it and back.

Archis: "df" (one encoder and inter, a decoder per side) and "liae" (one encoder, inter_AB and inter_B,
one decoder fed [inter_B, inter_AB] for dst, [inter_AB, inter_AB] for src and for the swap), with DFL's
options: "u" (pixel-normalised code), "d" (double resolution: the inter works at res/32 and the decoder
ends in four convs and a depth-to-space), "t" (a fifth downscale and residual blocks in the encoder,
four upscales in the decoder), "c" (x·cos x activations). Images are NCHW in [0, 1]; each decoder
returns (image, mask) through sigmoids.

Exactly as leras computes: convs pad symmetrically ((k-1)//2 each side, also at stride 2), Dense is a
plain affine map, the encoder's output is flattened and the inter's reshaped in C, H, W order, and
depth-to-space orders its input channels (block row, block column, channel) — DFL's "DCR" order, not
`pixel_shuffle`'s (channel, block row, block column). `bigbatch.models.create_autoencoder("saehd", ...)`
starts the weights glorot-uniform with zero biases, as DFL's do (its CA initializer is commented out);
the class itself leaves torch's defaults (weights loaded from DFL's files overwrite them anyway).

DFL trains and merges in BGR: a DFL model's first conv reads B, G, R and its output convs write them,
so a model whose weights go to or come from DFL takes and gives BGR images (or has those channels
flipped on import and export).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from bigbatch.errors import BigbatchError
from bigbatch.models.registry import register

ARCHIS = ("df", "liae")
OPTIONS = "udtc"


def depth_to_space(x: torch.Tensor, size: int = 2) -> torch.Tensor:
    """leras's depth_to_space: out[c, y*s+dy, x*s+dx] = in[(dy*s + dx)*oc + c, y, x]. A channels-last `x`
    gives a channels-last result, moved once (through NCHW it was moved twice, and once more back)."""
    n, c, h, w = x.shape
    oc = c // (size * size)
    if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        y = x.permute(0, 2, 3, 1).reshape(n, h, w, size, size, oc).permute(0, 1, 3, 2, 4, 5)
        return y.reshape(n, h * size, w * size, oc).permute(0, 3, 1, 2)
    return x.view(n, size, size, oc, h, w).permute(0, 3, 4, 1, 5, 2).reshape(n, oc, h * size, w * size)


def pixel_norm(x: torch.Tensor) -> torch.Tensor:
    """leras's pixel_norm over the last axis (the flattened code): x / sqrt(mean(x²) + 1e-6). In fp16 it is
    computed in fp32: rsqrt's gradient, -v^-1.5 / 2, passes fp16's 65,504 once a code's mean square is below
    about 2e-3 (a -u archi's small codes), and every fp16 step was skipped."""
    if x.dtype == torch.float16:
        return pixel_norm(x.float()).to(x.dtype)
    return x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + 1e-6)


class _Act(nn.Module):
    """Leaky ReLU with DFL's slope, or x·cos x with the "c" option."""

    def __init__(self, slope: float, cos: bool) -> None:
        super().__init__()
        self.slope, self.cos = slope, cos

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.cos(x) if self.cos else nn.functional.leaky_relu(x, self.slope)


def _conv(cin: int, cout: int, k: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2)  # leras "SAME": ((k-1)+1)//2 each side


class _OneDNNWeights(dict):
    """A conv's weights reordered for oneDNN, by input slot (see `_conv_act`). A copy or a pickle of the model
    starts it empty: oneDNN's tensors have no storage to copy, and the copy's weights are its own."""

    def __deepcopy__(self, memo: dict) -> _OneDNNWeights:
        return _OneDNNWeights()

    def __reduce__(self) -> tuple:
        return (_OneDNNWeights, ())


def _stamp(t: torch.Tensor) -> tuple[int, int]:
    """Which tensor `t` is and how often it was written in place; an inference tensor (made under
    `torch.inference_mode`) keeps no count, and only inference mode can write it."""
    return (t.data_ptr(), -1 if t.is_inference() else t._version)


def _conv_act(
    conv: nn.Conv2d,
    x: torch.Tensor,
    act: _Act | None = None,
    made: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None,
    key: str = "",
    also: tuple[nn.Conv2d, ...] = (),
) -> torch.Tensor:
    """`act(conv(x))`; with `made`, the conv's stride and padding with the (weight, bias) `made()` gives, made
    of the weights of `conv` and the convs `also` and named `key`. In a model packed for CPU inference
    (`SAEHD.pack_for_cpu`), a forward on the CPU in fp32 without autograd runs as oneDNN's convolution with
    the leaky ReLU fused, on `x` in channels-last, with the weight reordered for oneDNN once (`conv2d`
    reorders it at every call: 38 MB for saehd128's largest), and again only when the input's shape or a
    weight changes: another tensor, or its version counter moved (an optimizer's step, `load_state_dict`,
    `copy_`; not a write through `.data`, which autograd does not count). Every conv here has a bias."""
    packed: dict | None = getattr(conv, "onednn", None)
    if packed is None or torch.is_grad_enabled() or x.device.type != "cpu" or x.dtype != torch.float32:
        y = conv(x) if made is None else F.conv2d(x, *made(), conv.stride, conv.padding)
        return y if act is None else act(y)
    x = x.contiguous(memory_format=torch.channels_last)
    pad, stride = list(conv.padding), list(conv.stride)
    slot, version = (
        (key, *x.shape[1:]),
        tuple(_stamp(t) for c in (conv, *also) for t in (c.weight, c.bias)),
    )
    hit = packed.get(slot)
    if hit is None or hit[0] != version:
        weight, bias = (conv.weight, conv.bias) if made is None else made()
        w = torch.ops.mkldnn._reorder_convolution_weight(weight.detach(), pad, stride, [1, 1], 1, list(x.shape))
        packed[slot] = hit = (version, w, bias.detach().clone())
    conv_pointwise, args = torch.ops.mkldnn._convolution_pointwise, (x, hit[1], hit[2], pad, stride, [1, 1], 1)
    if act is None or act.cos:  # (oneDNN has no x·cos x)
        y = conv_pointwise(*args, "none", [], "")
        return y if act is None else act(y)
    return conv_pointwise(*args, "leaky_relu", [act.slope], "")


class Downscale(nn.Module):
    def __init__(self, cin: int, cout: int, cos: bool, kernel_size: int = 5) -> None:
        super().__init__()
        self.conv1, self.act = _conv(cin, cout, kernel_size, 2), _Act(0.1, cos)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _conv_act(self.conv1, x, self.act)


class DownscaleBlock(nn.Module):
    def __init__(self, cin: int, ch: int, n: int, cos: bool) -> None:
        super().__init__()
        chs = [ch * min(2**i, 8) for i in range(n)]
        self.downs = nn.ModuleList(Downscale(a, b, cos) for a, b in zip([cin, *chs[:-1]], chs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for down in self.downs:
            x = down(x)
        return x


class Upscale(nn.Module):
    """conv 3×3 to 4× the channels, activation, then depth-to-space (in that order, as DFL)."""

    def __init__(self, cin: int, cout: int, cos: bool) -> None:
        super().__init__()
        self.conv1, self.act = _conv(cin, cout * 4, 3), _Act(0.1, cos)

    def forward(self, x: torch.Tensor | None, twin: torch.Tensor | None = None) -> torch.Tensor:
        """Of `x`; with `twin`, first of the inputs [twin, twin] (a code repeated along the channels:
        liae's src code), given once and convolved with the two halves of the weight summed (the
        same sums, half the products): rows twin's, then x's. The halves are summed as a view's sum, whose
        gradient is the same for both halves (slices' gradients were two zero-filled weight-sized tensors)."""
        outs = []
        if twin is not None:
            outs.append(_conv_act(self.conv1, twin, self.act, self._halves, "twin"))
        if x is not None:
            outs.append(_conv_act(self.conv1, x, self.act))
        return depth_to_space(torch.cat(outs) if len(outs) > 1 else outs[0])

    def _halves(self) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.conv1.weight
        return w.view(w.shape[0], 2, w.shape[1] // 2, *w.shape[2:]).sum(1), self.conv1.bias


class ResidualBlock(nn.Module):
    def __init__(self, ch: int, cos: bool) -> None:
        super().__init__()
        self.conv1, self.conv2, self.act = _conv(ch, ch, 3), _conv(ch, ch, 3), _Act(0.2, cos)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x + _conv_act(self.conv2, _conv_act(self.conv1, x, self.act)))


class Encoder(nn.Module):
    def __init__(self, cin: int, e_ch: int, opts: str) -> None:
        super().__init__()
        cos, self.t, self.u = "c" in opts, "t" in opts, "u" in opts
        if self.t:
            self.down1, self.res1 = Downscale(cin, e_ch, cos), ResidualBlock(e_ch, cos)
            self.down2 = Downscale(e_ch, e_ch * 2, cos)
            self.down3 = Downscale(e_ch * 2, e_ch * 4, cos)
            self.down4 = Downscale(e_ch * 4, e_ch * 8, cos)
            self.down5 = Downscale(e_ch * 8, e_ch * 8, cos)
            self.res5 = ResidualBlock(e_ch * 8, cos)
        else:
            self.down1 = DownscaleBlock(cin, e_ch, 4, cos)
        self.out_ch = e_ch * 8

    def out_res(self, resolution: int) -> int:
        return resolution // (32 if self.t else 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.t:
            x = self.res1(self.down1(x))
            x = self.res5(self.down5(self.down4(self.down3(self.down2(x)))))
        else:
            x = self.down1(x)
        x = x.flatten(1)  # C, H, W order, as leras's flatten
        return pixel_norm(x) if self.u else x


class Inter(nn.Module):
    def __init__(self, cin: int, ae_ch: int, ae_out_ch: int, lowest: int, opts: str) -> None:
        super().__init__()
        self.ae_out_ch, self.lowest = ae_out_ch, lowest
        self.dense1 = nn.Linear(cin, ae_ch)
        self.dense2 = nn.Linear(ae_ch, lowest * lowest * ae_out_ch)
        self.upscale1 = None if "t" in opts else Upscale(ae_out_ch, ae_out_ch, "c" in opts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In fp32 whatever autocast says: the two dense layers hold most of the weights (168M of 250M at
        # 512 px df-ud) for little compute, and under autocast a bf16/fp16 copy of them would be kept
        # for the backward (0.4 GiB there).
        with torch.autocast(x.device.type, enabled=False):
            x = self.dense2(self.dense1(x.to(self.dense1.weight.dtype)))
            x = x.view(-1, self.ae_out_ch, self.lowest, self.lowest)
        return x if self.upscale1 is None else self.upscale1(x)


class Decoder(nn.Module):
    def __init__(self, cin: int, d_ch: int, d_mask_ch: int, opts: str) -> None:
        super().__init__()
        cos, self.t, self.d = "c" in opts, "t" in opts, "d" in opts
        if self.t:
            chs, mchs = (
                [d_ch * 8, d_ch * 8, d_ch * 4, d_ch * 2],
                [d_mask_ch * 8, d_mask_ch * 8, d_mask_ch * 4, d_mask_ch * 2],
            )
        else:
            chs, mchs = [d_ch * 8, d_ch * 4, d_ch * 2], [d_mask_ch * 8, d_mask_ch * 4, d_mask_ch * 2]
        # Built in DFL's order (its files list the weights so): upscales, residual blocks, mask upscales,
        # out_conv, then with "d" out_conv1-3 and the extra mask upscale, then out_convm.
        for i, (a, b) in enumerate(zip([cin, *chs[:-1]], chs)):
            setattr(self, f"upscale{i}", Upscale(a, b, cos))
        for i, b in enumerate(chs):
            setattr(self, f"res{i}", ResidualBlock(b, cos))
        for i, (a, b) in enumerate(zip([cin, *mchs[:-1]], mchs)):
            setattr(self, f"upscalem{i}", Upscale(a, b, cos))
        self.out_conv = _conv(d_ch * 2, 3, 1)
        if self.d:  # the four pixels of each 2×2 output block: out_conv, out_conv1, 2, 3 (top-left, ...)
            self.out_conv1, self.out_conv2, self.out_conv3 = (_conv(d_ch * 2, 3, 3) for _ in range(3))
            setattr(self, f"upscalem{len(mchs)}", Upscale(mchs[-1], d_mask_ch, cos))
            mchs.append(d_mask_ch)
        self.n, self.nm = len(chs), len(mchs)
        self.out_convm = _conv(mchs[-1], 1, 1)

    def forward(self, z: torch.Tensor | None, twin: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(image, mask) of codes `z`; with `twin` (liae), first of the codes [twin, twin] (see Upscale)."""
        x = self.upscale0(z, twin)
        for i in range(self.n):
            x = getattr(self, f"res{i}")(x if i == 0 else getattr(self, f"upscale{i}")(x))
        if self.d:  # the four output convs as one (the 1×1 inside a zero 3×3): 3x faster than four of 3 channels
            others = (self.out_conv, self.out_conv2, self.out_conv3)
            x = torch.sigmoid(depth_to_space(_conv_act(self.out_conv1, x, made=self._out, key="out", also=others)))
        else:
            x = torch.sigmoid(_conv_act(self.out_conv, x))
        return x, self.mask(z, twin)

    def _out(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The weight and bias of "d"'s four output convs as one 3×3 conv."""
        convs = (self.out_conv, self.out_conv1, self.out_conv2, self.out_conv3)
        weight = torch.cat([F.pad(self.out_conv.weight, (1, 1, 1, 1)), *(c.weight for c in convs[1:])])
        return weight, torch.cat([c.bias for c in convs])

    def mask(self, z: torch.Tensor | None, twin: torch.Tensor | None = None) -> torch.Tensor:
        """The mask branch alone (a merge needs the dst path's mask, not its image: 40% of a swap's work)."""
        m = self.upscalem0(z, twin)
        for i in range(1, self.nm):
            m = getattr(self, f"upscalem{i}")(m)
        return torch.sigmoid(_conv_act(self.out_convm, m))


class SAEHD(nn.Module):
    """The SAEHD autoencoder (see the module docstring). Parts, named as DFL's files: df: encoder,
    inter, decoder_src, decoder_dst; liae: encoder, inter_AB, inter_B, decoder."""

    def __init__(
        self,
        resolution: int = 128,
        archi: str = "liae-ud",
        ae_dims: int = 256,
        e_dims: int = 64,
        d_dims: int = 64,
        d_mask_dims: int = 22,
        img_channels: int = 3,
    ) -> None:
        super().__init__()
        kind, dash, opts = archi.partition("-")
        known, once = kind in ARCHIS and all(o in OPTIONS for o in opts), len(set(opts)) == len(opts)
        if not (known and once) or (dash and not opts):  # (why, where it is a case or a repeat: found from outside)
            why = " (in lowercase)" if archi != archi.lower() else " (each option once)" if known and not once else ""
            raise BigbatchError(
                f"SAEHD archi must be df or liae with options from '{OPTIONS}' (e.g. liae-ud){why}, got {archi!r}"
            )
        step = 32 if "d" in opts or "t" in opts else 16  # (-t: a fifth downscale)
        if not (64 <= resolution <= 640 and resolution % step == 0):
            raise BigbatchError(
                f"SAEHD resolution (data.resolution) must be a multiple of {step} in 64..640 for {archi}, "
                f"got {resolution}"
            )
        for name, v in (("ae_dims", ae_dims), ("e_dims", e_dims), ("d_dims", d_dims), ("d_mask_dims", d_mask_dims)):
            if v < 1:
                raise BigbatchError(f"SAEHD {name} must be >= 1, got {v}")
        self.resolution, self.archi, self.kind, self.opts = resolution, archi, kind, opts
        self.ae_dims, self.e_dims, self.d_dims, self.d_mask_dims = ae_dims, e_dims, d_dims, d_mask_dims
        self.img_channels = img_channels
        lowest = resolution // (32 if "d" in opts else 16)  # DFL's lowest_dense_res
        self.encoder = Encoder(img_channels, e_dims, opts)
        code = self.encoder.out_ch * self.encoder.out_res(resolution) ** 2
        if kind == "df":
            self.inter = Inter(code, ae_dims, ae_dims, lowest, opts)
            self.decoder_src = Decoder(ae_dims, d_dims, d_mask_dims, opts)
            self.decoder_dst = Decoder(ae_dims, d_dims, d_mask_dims, opts)
        else:
            self.inter_AB = Inter(code, ae_dims, ae_dims * 2, lowest, opts)
            self.inter_B = Inter(code, ae_dims, ae_dims * 2, lowest, opts)
            self.decoder = Decoder(ae_dims * 4, d_dims, d_mask_dims, opts)

    @property
    def parts(self) -> list[str]:
        """DFL's file parts, in its order."""
        return (
            ["encoder", "inter", "decoder_src", "decoder_dst"]
            if self.kind == "df"
            else ["encoder", "inter_AB", "inter_B", "decoder"]
        )

    def pack_for_cpu(self) -> SAEHD:
        """Run this model's inference on the CPU (fp32, no autograd: a merge's, a swap's) through oneDNN's
        fused convolutions in channels-last, each weight reordered for oneDNN once (see `_conv_act`): 1.15-1.2x
        fewer seconds a face for saehd128 on an AVX2 CPU (bench/faces.py), the same outputs to float
        rounding. Training, autograd and other devices and dtypes take the plain path as before; a weight
        that changes is reordered again at its next use. Returns the model."""
        if torch.backends.mkldnn.is_available():
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    m.onednn = _OneDNNWeights()
        return self

    @property
    def checkpoint_blocks(self) -> list[str]:
        """Every downscale, upscale and residual block (the layers whose activations fill memory at
        high resolution), for activation checkpointing one block at a time."""
        return [name for name, m in self.named_modules() if isinstance(m, (Downscale, Upscale, ResidualBlock))]

    def forward(self, src: torch.Tensor, dst: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One training forward, as SAEHD's: (src image, src mask) reconstructed from `src`, (dst image,
        dst mask) from `dst`, and the codes the decoders read for each (the true-face discriminator's
        input). The parts both sides share (the encoder; df's inter; liae's inter_AB and decoder) take
        src and dst as one batch: the same per-sample arithmetic, in larger convolutions (DFL calls
        them once a side)."""
        n = src.shape[0]
        if self.kind == "df":
            code = self.inter(self.encoder(torch.cat([src, dst])))
            src_code, dst_code = code[:n], code[n:]
            return (*self.decoder_src(src_code), *self.decoder_dst(dst_code), src_code, dst_code)
        code = self.encoder(torch.cat([src, dst]))
        ab = self.inter_AB(code)
        dst_code = torch.cat([self.inter_B(code[n:]), ab[n:]], dim=1)
        image, mask = self.decoder(dst_code, twin=ab[:n])
        return image[:n], mask[:n], image[n:], mask[n:], torch.cat([ab[:n], ab[:n]], dim=1), dst_code

    def swap_from_code(self, dst_code: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The swap (image, mask) decoded from a dst code of `forward`: DFL's pred_src_dst (df: the src
        decoder reads it; liae: the decoder reads its inter_AB half twice), for the style losses."""
        if self.kind == "df":
            return self.decoder_src(dst_code)
        return self.decoder(None, twin=dst_code[:, dst_code.shape[1] // 2 :])

    def src(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """src reconstructed: (image, mask)."""
        if self.kind == "df":
            return self.decoder_src(self.inter(self.encoder(x)))
        return self.decoder(None, twin=self.inter_AB(self.encoder(x)))

    def dst(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """dst reconstructed: (image, mask)."""
        if self.kind == "df":
            return self.decoder_dst(self.inter(self.encoder(x)))
        code = self.encoder(x)
        return self.decoder(torch.cat([self.inter_B(code), self.inter_AB(code)], dim=1))

    def swap(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A dst face swapped to src: (image, its src-path mask, the dst-path mask), as DFL's merger
        predicts them."""
        code = self.encoder(x)
        if self.kind == "df":
            z = self.inter(code)
            (image, mask), dst_mask = self.decoder_src(z), self.decoder_dst.mask(z)
            return image, mask, dst_mask
        ab = self.inter_AB(code)
        image, mask = self.decoder(None, twin=ab)
        return image, mask, self.decoder.mask(torch.cat([self.inter_B(code), ab], dim=1))


@register(init="xavier", task="swap")
def saehd(
    *,
    resolution: int,
    img_channels: int = 3,
    archi: str = "liae-ud",
    ae_dims: int = 256,
    e_dims: int = 64,
    d_dims: int = 64,
    d_mask_dims: int = 22,
) -> SAEHD:
    """DeepFaceLab's SAEHD; its options are DFL's (defaults: liae-ud, 256/64/64/22)."""
    return SAEHD(resolution, archi, ae_dims, e_dims, d_dims, d_mask_dims, img_channels)
