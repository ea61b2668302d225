"""A 3x3 convolution and the 2x resampling next to it, as one convolution with 2.25x fewer multiply-adds.

- D's `avg_pool2d(conv3x3(x), 2)` is a stride-2 4x4 convolution of x whose kernel is the 3x3 kernel
  averaged over the four 2x2 shifts: 16 taps per output pixel instead of 9 on each of 4 pixels.
- G's `conv3x3(upsample_nearest_2x(x))` is a stride-2 4x4 transposed convolution of x whose kernel is
  the flipped 3x3 kernel summed over the four shifts: 16 taps per input pixel instead of 9 on each of the
  4 pixels it becomes.

Both are the same linear map of the input, weight and bias as the two steps. They differ by rounding:
in fp32 at 128 channels the largest error against float64 was 3.7e-7 (D) and 5.9e-7 (G) of the largest
output, where the two steps gave 2.4e-7 and 3.3e-7; tests/test_models.py checks the map in float64.
The module keeps its 3x3 weight: checkpoints, spectral norm, initialisation and weight conversion are
unchanged. The 4x4 kernel is a matmul of the 3x3 one (in fp32, whatever the autocast) on every call.

On this project's CPU (oneDNN, one thread; `python bench/resample.py`, in bench/RESULTS.md) the single
convolution is 1.2-2.3x faster forward and backward from a full resolution of 32 px on, fp32 and bf16,
128 and 512 channels; at 16 px it goes either way and at 8 px it is 1.5-3x slower. The blocks use it
from FUSE_FROM px on: a choice fixed by the architecture, never by the batch, so results do not depend
on how a batch is split.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# The smallest full resolution (D: the convolution's input; G: its output) computed as one convolution.
FUSE_FROM = 32


def _box(transposed: bool, like: torch.Tensor) -> torch.Tensor:
    """(9, 16) map of a 3x3 kernel to the 4x4 one: the mean (conv then pool) or, flipped, the sum
    (upsample then conv) of its four 2x2 shifts; made on `like`'s device in its dtype (a few tiny ops:
    a constant copied to a GPU on every call would wait for it, and a cached one is not for torch.compile).
    From `like.new_ones`, not `device=like.device`: a TorchScript trace (`bigbatch export`) keeps a device
    given by name as a constant, so a generator exported on the CPU failed on a GPU."""
    eye = torch.diag_embed(like.new_ones(3))
    shifts = F.pad(eye, (0, 1)) + F.pad(eye, (1, 0))  # (3, 4): row i has ones at i and i + 1
    one_axis = shifts.flip(0) if transposed else shifts * 0.5
    return torch.kron(one_axis, one_axis)


def _kernel4(conv: nn.Conv2d, transposed: bool) -> torch.Tensor:
    if conv.kernel_size != (3, 3) or conv.padding != (1, 1) or conv.stride != (1, 1) or conv.groups != 1:
        raise ValueError(f"a fused resampling needs a 3x3 conv, padding 1, stride 1, one group; got {conv}")
    with torch.autocast(conv.weight.device.type, enabled=False):
        normalized = getattr(conv, "normalized_weight", None)
        w = normalized() if normalized is not None else conv.weight
        o, i = w.shape[:2]
        return (w.reshape(o * i, 9) @ _box(transposed, w)).view(o, i, 4, 4)


def conv_pool(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """`F.avg_pool2d(conv(x), 2)` for a 3x3 `conv` (padding 1), as one stride-2 4x4 convolution."""
    return F.conv2d(x, _kernel4(conv, False), conv.bias, stride=2, padding=1)


def upsample_conv(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """`conv(F.interpolate(x, scale_factor=2.0))` (nearest) for a 3x3 `conv` (padding 1), as one stride-2
    4x4 transposed convolution."""
    return F.conv_transpose2d(x, _kernel4(conv, True).transpose(0, 1), conv.bias, stride=2, padding=1)
