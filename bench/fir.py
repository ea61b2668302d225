"""StyleGAN2's FIR resampling (bigbatch/models/stylegan2.py's `blur`: the 4x4 [1, 3, 3, 1] filter over every
channel) as the model computes it and two other ways, in the layers that use it: D's downsampling convolution
(blur, then a stride-2 3x3 conv) and G's upsampling one (a stride-2 transposed 3x3 conv, then blur), forward
and backward, per layer shape, in one process. On an H200 StyleGAN2 256 trained at 48 img/s, 2% of the GPU's
measured bf16 rate (bench/RESULTS.md, 2026-12-04): this says how much of it a way of filtering is.

    python bench/fir.py                                  # on the CPU, fp32 and bf16, batch 4
    python bench/fir.py --device cuda --batch 32 --precisions bf16

The ways (the same linear map, each differentiated as the model differentiates its filter: the gradient of a filter is
the filter again, computed the same way; each cell also gives its largest difference from the model's, over the
largest output):
- grouped: the model's, a depthwise 4x4 convolution (conv2d with groups = channels), which cuDNN runs on a GPU for
  the model's channels-last tensors;
- nchw: the same convolution on a contiguous (NCHW) copy, where PyTorch runs its own depthwise kernel on a GPU, and
  back to channels-last;
- separable: the filter is an outer product: a 4-tap pass along each axis, each a weighted sum of 4 shifted
  slices (the model's `_fir_sums` run eagerly: elementwise ops, memory-bound, no convolution kernel);
- one-channel: the channels as images, a 4x4 convolution of (N x C, 1, H, W);
- fused: the separable sums compiled (a fused kernel or two: the model's filter on the devices in fused.ON;
  compiled on first use, before the timed passes);
- fused+act: the model as it runs on the devices in fused.ON (bigbatch/models/fused.py): the fused filter, and the
  layer's bias, leaky ReLU and gain one compiled kernel more (ADA's bias_act), where the other ways leave them as
  the plain ops (D: the convolution's bias, then the activation; G: the bias added, then the activation).
Each cell: median ms of --repeats forward+backward passes (input, weight and bias gradients) after two untimed, the
backward from one dense channels-last gradient in the layer's output dtype.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from _args import device_arg, name_list, positive_int  # noqa: E402
from _env import measured_on  # noqa: E402
from resample import seconds  # noqa: E402

from bigbatch.models import fused, stylegan2  # noqa: E402


def nchw(x: torch.Tensor, pad: int, gain: float) -> torch.Tensor:
    """The grouped convolution of a contiguous copy (PyTorch's depthwise kernel on a GPU), back to x's layout."""
    y = stylegan2._grouped(x.contiguous(), pad, gain)
    return y.contiguous(memory_format=torch.channels_last) if x.is_contiguous(memory_format=torch.channels_last) else y


def one_channel(x: torch.Tensor, pad: int, gain: float) -> torch.Tensor:
    """The channels as images: one 4x4 convolution of (N x C, 1, H, W)."""
    n, c, h, w = x.shape
    y = F.conv2d(F.pad(x.reshape(n * c, 1, h, w), [pad] * 4), stylegan2._weights(x, gain))
    return y.reshape(n, c, *y.shape[2:])


# Each as the model's `_filtered`: (x, pad, the filter's gain) -> the filtered x.
WAYS: dict[str, Callable[[torch.Tensor, int, float], torch.Tensor]] = {
    "grouped": stylegan2._grouped,
    "nchw": nchw,
    "separable": stylegan2._fir_sums,
    "one-channel": one_channel,
    "fused": stylegan2._fused_fir,
}


ALL_FUSED = "fused+act"
TIMED = [*WAYS, ALL_FUSED]


def using(way: str) -> AbstractContextManager:
    """StyleGAN2's layers filter the way named while entered (all of this process's models); ALL_FUSED: they run
    as on the devices in fused.ON, on every device."""
    if way == ALL_FUSED:
        return mock.patch.object(fused, "ON", ("cpu", "cuda"))
    return mock.patch.object(stylegan2, "_filtered", WAYS[way])


# (full resolution, channels) of ADA's paper256 (cbase 16384, cmax 512): D's input and G's output sizes.
PAPER256 = ((256, 64), (128, 128), (64, 256), (32, 512), (16, 512), (8, 512))


def layer(
    kind: str, channels: int, side: int, device: torch.device
) -> tuple[Callable[[torch.Tensor], torch.Tensor], int]:
    """D's down layer (`side`: its input) or G's up layer (`side`: its output), and its input's side."""
    torch.manual_seed(0)
    if kind == "D":
        conv = stylegan2.EqualConv(channels, channels, 3, down=True).to(device, memory_format=torch.channels_last)
        return conv, side
    layer = stylegan2.SynthesisLayer(channels, channels, 32, side, up=True).to(
        device, memory_format=torch.channels_last
    )
    w = torch.randn(1, 32, device=device)
    return (lambda x: layer(x, w.expand(len(x), -1), None)), side // 2


def cell(kind: str, batch: int, channels: int, side: int, precision: str, repeats: int, device: torch.device) -> dict:
    """ms per forward+backward of the layer with each way's blur, and each way's error against the model's."""
    f, insize = layer(kind, channels, side, device)
    x = torch.randn(batch, channels, insize, insize, device=device).to(memory_format=torch.channels_last)
    if precision == "bf16":  # (as the layers get them under autocast: D's filter reads its input as it comes)
        x = x.to(torch.bfloat16)
    x.requires_grad_()
    out: dict[str, tuple[float, float]] = {}
    reference = dy = None
    for name in TIMED:
        with using(name):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                raw = f(x)
            y = raw.float()
            reference = y.detach() if reference is None else reference
            error = float((y.detach() - reference).abs().max() / reference.abs().max())
            # The gradient a training step's next layer gives: dense, channels-last, in the layer's output dtype (a
            # sum's, broadcast, would cost the backward no reading at all; an NCHW one a transposition training does
            # not; another dtype a cast).
            dy = torch.randn_like(raw.detach()) if dy is None else dy

            def step() -> None:
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                    y = f(x)
                y.backward(dy)  # noqa: B023 -- the same gradient for every way

            out[name] = (seconds(step, repeats, device), error)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", type=device_arg)
    p.add_argument("--batch", type=positive_int, default=4)
    p.add_argument("--precisions", type=name_list(("fp32", "bf16")), default="fp32,bf16", help="of fp32, bf16")
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--largest", type=positive_int, default=256, help="the largest full resolution measured")
    a = p.parse_args()
    print(measured_on(a.device))
    device = torch.device(a.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    # The fused ways compiled afresh, for this process's threads: a kernel a run with other settings left in the user's
    # compile cache was taken as it was (on this CPU a bf16 filter ran at half the rate of one compiled here).
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache = tempfile.mkdtemp(prefix="bigbatch-fir-")
    try:
        table(a, device)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def table(a: argparse.Namespace, device: torch.device) -> None:
    print(f"# {device}, batch {a.batch}, channels-last; ms per forward+backward: " + ", ".join(TIMED))
    print("# (in brackets: the largest difference from grouped's output over its largest)\n")
    print("| precision | layer | px | channels | " + " | ".join(TIMED) + " |")
    print("|---|---|---|---|" + "---|" * len(TIMED))
    for precision in a.precisions:
        for kind in ("D", "G"):
            for side, channels in PAPER256:
                if side > a.largest:
                    continue
                ways = cell(kind, a.batch, channels, side, precision, a.repeats, device)
                cells = [f"{1e3 * s:.2f} ({e:.0e})" for s, e in ways.values()]
                print(f"| {precision} | {kind} | {side} | {channels} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
