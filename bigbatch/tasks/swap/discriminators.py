"""SAEHD's two discriminators, as DeepFaceLab builds them (core/leras/models): the code discriminator of
`true_face_power` and the U-Net patch discriminator of `gan_power`. They exist only in training (DFL
saves them beside the model, but its merger never reads them), so they keep torch's layout.

leras pads "SAME" convs by ((k-1)+1)//2 on each side (2 for the code discriminator's 4x4: found from outside, its
logits were a position short a side); its "SAME" transposed conv of stride 2 keeps the
first 2·n outputs of the full transposed convolution, where `padding=1, output_padding=1` would keep
outputs 1..2·n: here a transposed conv without padding, cropped.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bigbatch.engine.determinism import seeded
from bigbatch.errors import BigbatchError
from bigbatch.models import layers


class CodeDiscriminator(nn.Module):
    """Judges an inter code (ae_dims x code_res²): 1 + code_res // 8 stride-2 convs (4x4 then 3x3) at
    256·min(2^i, 8) channels with LeakyReLU 0.1, then a 1x1 conv to one logit per position."""

    def __init__(self, in_ch: int, code_res: int, ch: int = 256) -> None:
        super().__init__()
        convs, prev = [], in_ch
        for i in range(1 + code_res // 8):
            cur = ch * min(2**i, 8)
            k = 4 if i == 0 else 3
            convs.append(nn.Conv2d(prev, cur, k, stride=2, padding=k // 2))
            prev = cur
        self.convs = nn.ModuleList(convs)
        self.out_conv = nn.Conv2d(prev, 1, 1)
        layers.init_weights(self, "xavier")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = F.leaky_relu(conv(x), 0.1)
        return self.out_conv(x)


def receptive_field(specs: list[tuple[int, int]]) -> int:
    """The receptive field of a stack of (kernel, stride) convs."""
    rf, stride = 0, 1
    for i, (k, s) in enumerate(specs):
        rf = k if i == 0 else rf + (k - 1) * stride
        stride *= s
    return rf


def find_archi(patch_size: int) -> list[tuple[int, int]]:
    """DFL's search for the 3x3 conv stack (first stride 2, the others 1 or 2) whose receptive field is
    nearest `patch_size`: fewest layers, then most striding."""
    best = _archis()
    fields = sorted(best)
    return best[fields[int(np.abs(np.array(fields) - patch_size).argmin())]][2]


@functools.lru_cache(maxsize=1)
def _archis(max_layers: int = 9) -> dict[int, tuple[int, int, list[tuple[int, int]]]]:
    """{receptive field: (layers, strides summed, the stack)} of each field's stack as find_archi prefers it."""
    best: dict[int, tuple[int, int, list[tuple[int, int]]]] = {}
    for count in range(1, max_layers + 1):
        val = 1 << (count - 1)
        while True:
            val -= 1
            specs = [(3, 2)] + [(3, 1 + (1 if val & (1 << i) else 0)) for i in range(count - 1)]
            strides = sum(s for _, s in specs)
            rf = receptive_field(specs)
            if rf not in best or count < best[rf][0] or (count == best[rf][0] and strides > best[rf][1]):
                best[rf] = (count, strides, specs)
            if val == 0:
                break
    return best


class _UpConv(nn.Module):
    """leras's "SAME" 3x3 transposed conv: stride 1 pads 1; stride 2 keeps the first 2·n outputs."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.ConvTranspose2d(cin, cout, 3, stride=stride, padding=1 if stride == 1 else 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if self.stride == 1:
            return y
        h, w = x.shape[-2:]
        return y[..., : h * self.stride, : w * self.stride]


class UNetPatchDiscriminator(nn.Module):
    """DFL's U-Net patch discriminator (after Schönfeld et al. 2020): a 1x1 conv, the conv stack
    `find_archi(patch_size)` at base_ch·2^i channels (at most 512), a centre 1x1 logit, transposed
    convs back up with skip connections, and a 1x1 logit per pixel. LeakyReLU 0.2 throughout.
    Returns (centre logits, per-pixel logits)."""

    def __init__(self, patch_size: int, in_ch: int = 3, base_ch: int = 16) -> None:
        super().__init__()
        specs = find_archi(patch_size)
        chs = [min(base_ch * 2**i, 512) for i in range(len(specs) + 1)]  # chs[i + 1]: level i's
        self.in_conv = nn.Conv2d(in_ch, chs[0], 1)
        self.convs = nn.ModuleList(
            nn.Conv2d(chs[i], chs[i + 1], k, s, padding=k // 2) for i, (k, s) in enumerate(specs)
        )
        ups = [_UpConv(chs[i + 1] * (2 if i != len(specs) - 1 else 1), chs[i], s) for i, (_, s) in enumerate(specs)]
        self.upconvs = nn.ModuleList(reversed(ups))
        self.out_conv = nn.Conv2d(chs[0] * 2, 1, 1)
        self.center_out = nn.Conv2d(chs[-1], 1, 1)
        self.center_conv = nn.Conv2d(chs[-1], chs[-1], 1)
        layers.init_weights(self, "xavier")

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.leaky_relu(self.in_conv(x), 0.2)
        skips = []
        for conv in self.convs:
            skips.insert(0, x)
            x = F.leaky_relu(conv(x), 0.2)
        center, x = self.center_out(x), F.leaky_relu(self.center_conv(x), 0.2)
        for up, skip in zip(self.upconvs, skips):
            x = torch.cat([skip, F.leaky_relu(up(x), 0.2)], dim=1)
        return center, self.out_conv(x)


def discriminators(cfg: Any, net: nn.Module) -> dict[str, nn.Module]:
    """The discriminators swap.* turns on for the autoencoder `net` (DFL's code discriminator and its
    U-Net patch discriminator), initialised from train.seed + 1, the global RNG left as it was; the
    i-th's optimizer takes dropout stream i + 1."""
    s, out = cfg.swap, {}
    with seeded(cfg.train.seed + 1):
        if s.true_face_power:
            code_res = net.inter.lowest * (1 if net.inter.upscale1 is None else 2)
            out["code_discriminator"] = CodeDiscriminator(net.ae_dims, code_res).train()
        if s.gan_power:
            patch = s.gan_patch_size or cfg.data.resolution // 8
            check_patch_size(patch, cfg.data.resolution, "swap.gan_patch_size" if s.gan_patch_size else "")
            out["gan"] = UNetPatchDiscriminator(patch, 3, s.gan_dims).train()
    return out


def check_new_discriminators(cfg: Any) -> None:
    """What a new run's discriminators take: gan_dims in DFL's 4..512 (found from outside: 1 and 2000 taken, and
    written into DFL's options by export-dfl; a run saved with them still loads, found by review)."""
    if cfg.swap.gan_power and not 4 <= cfg.swap.gan_dims <= 512:
        cfg.swap._fail("gan_dims", f"must be in 4..512 (DFL's range; 16 typical), got {cfg.swap.gan_dims}")


def check_patch_size(patch: int, resolution: int, key: str = "") -> None:
    """A patch discriminator whose stride-2 convs `resolution` px faces do not halve evenly down to 2 px, refused
    (its skips then differ in size: found from outside, a traceback at the first step; DFL's cannot be built
    either), naming the largest patch size that fits."""

    def fits(specs: list[tuple[int, int]]) -> bool:
        return resolution % 2 ** sum(stride == 2 for _, stride in specs) == 0

    if not fits(find_archi(patch)):
        largest = max(field for field, (_, _, specs) in _archis().items() if fits(specs))
        said = f"{key} = {patch}" if key else f"the patch discriminator of {patch} px (resolution / 8)"
        raise BigbatchError(
            f"{said} is too large for {resolution} px faces: its convs halve them more often than they halve evenly "
            f"(DFL's cannot be built either); give swap.gan_patch_size at most {largest}"
        )
