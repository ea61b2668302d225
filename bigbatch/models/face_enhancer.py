"""DeepFaceLab's FaceEnhancer: the 4x face super-resolution network its merger applies at
`super_resolution_power` (facelib/FaceEnhancer.py), layer for layer, so that DFL's own weight file
(`facelib/FaceEnhancer.npy`, models/dfl.py's format) loads into it.

A U-Net of 3x3 convolutions and leaky ReLUs (0.1) over 192 px patches of BGR in [-1, 1]: five 2x average
poolings down, bilinear doublings up with skips, then the 1x output and two more doublings to 4x, each output
the one before it (upsampled) plus a tanh residual. Two scalar inputs (DFL's merger gives 0.2 and 1.0) enter
through bias-free dense layers. Where TensorFlow differs from torch, DFL's TensorFlow is followed: leras's
resize2d_bilinear is tf.compat.v1's resize_images, bilinear without half-pixel centres (source pixel =
output pixel / 2), not torch's align_corners=False.

`enhance` is DFL's FaceEnhancer.enhance: the face padded to at least 192 px, enhanced in 192 px patches half a
patch apart, blended by a pyramid weight, and cut back (resized to the input's size with preserve_size).
"""

from __future__ import annotations

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

PATCH = 192  # the patch DFL runs the network on
UP = 4
PARAMS = (0.2, 1.0)  # DFL's merger's two scalar inputs

# (name, in, out) of each convolution, in leras's names
_CONVS = [
    ("conv1", 3, 64),
    ("e0_conv0", 64, 64), ("e0_conv1", 64, 64), ("e1_conv0", 64, 112), ("e1_conv1", 112, 112),
    ("e2_conv0", 112, 192), ("e2_conv1", 192, 192), ("e3_conv0", 192, 336), ("e3_conv1", 336, 336),
    ("e4_conv0", 336, 512), ("e4_conv1", 512, 512),
    ("center_conv0", 512, 512), ("center_conv1", 512, 512), ("center_conv2", 512, 512), ("center_conv3", 512, 512),
    ("d4_conv0", 1024, 512), ("d4_conv1", 512, 512), ("d3_conv0", 848, 512), ("d3_conv1", 512, 512),
    ("d2_conv0", 704, 288), ("d2_conv1", 288, 288), ("d1_conv0", 400, 160), ("d1_conv1", 160, 160),
    ("d0_conv0", 224, 96), ("d0_conv1", 96, 96),
    ("out1x_conv0", 96, 48), ("out1x_conv1", 48, 3), ("dec2x_conv0", 96, 96), ("dec2x_conv1", 96, 96),
    ("out2x_conv0", 96, 48), ("out2x_conv1", 48, 3), ("dec4x_conv0", 96, 72), ("dec4x_conv1", 72, 72),
    ("out4x_conv0", 72, 36), ("out4x_conv1", 36, 3),
]  # fmt: skip


def _legacy_weights(n: int, device: torch.device) -> torch.Tensor:
    """The (2n, n) matrix of TF1's bilinear resize_images to twice the size without half-pixel centres: output
    pixel i reads source i / 2 (its floor and the next, clamped at the edge)."""
    src = torch.arange(2 * n, device=device, dtype=torch.float32) / 2
    low = src.floor().long()
    frac = src - low
    high = (low + 1).clamp(max=n - 1)
    w = torch.zeros(2 * n, n, device=device)
    rows = torch.arange(2 * n, device=device)
    w.index_put_((rows, low), 1 - frac, accumulate=True)
    w.index_put_((rows, high), frac, accumulate=True)
    return w


def upsample(x: torch.Tensor) -> torch.Tensor:
    """leras's resize2d_bilinear (TF1's, see the module): twice the size, NCHW."""
    h, w = x.shape[2:]
    return _legacy_weights(h, x.device).to(x.dtype) @ x @ _legacy_weights(w, x.device).to(x.dtype).T


class FaceEnhancer(nn.Module):
    """DFL's FaceEnhancer; `width` scales every layer's channels below 1 only for tests."""

    def __init__(self, width: float = 1.0) -> None:
        super().__init__()
        ch = {}

        def c(n: int) -> int:
            return n if n == 3 else ch.setdefault(n, max(1, round(n * width)))

        for name, cin, cout in _CONVS:
            if name.startswith("d") and name.endswith("_conv0") and name[1].isdigit():  # (concatenations)
                cin = {"d4": c(512) + c(512), "d3": c(512) + c(336), "d2": c(512) + c(192),
                       "d1": c(288) + c(112), "d0": c(160) + c(64)}[name[:2]]  # fmt: skip
            else:
                cin = c(cin)
            self.add_module(name, nn.Conv2d(cin, c(cout), 3, padding=1))
        self.dense1 = nn.Linear(1, c(64), bias=False)
        self.dense2 = nn.Linear(1, c(64), bias=False)

    def forward(self, bgr: torch.Tensor, param: torch.Tensor, param1: torch.Tensor) -> torch.Tensor:
        """The 4x face (N, 3, 4H, 4W) in about [-1, 1] of BGR faces (N, 3, H, W) in [-1, 1], H and W multiples of
        32; `param`, `param1` (N, 1)."""

        def act(name: str, x: torch.Tensor) -> torch.Tensor:
            return F.leaky_relu(getattr(self, name)(x), 0.1)

        x = self.conv1(bgr) + self.dense1(param)[:, :, None, None] + self.dense2(param1)[:, :, None, None]
        x = F.leaky_relu(x, 0.1)
        skips = []
        for level in range(5):
            if level:
                x = F.avg_pool2d(x, 2)
            x = act(f"e{level}_conv1", act(f"e{level}_conv0", x))
            skips.append(x)
        x = F.avg_pool2d(x, 2)
        for k in range(4):
            x = act(f"center_conv{k}", x)
        for level in (4, 3, 2, 1, 0):
            x = torch.cat([upsample(x), skips[level]], dim=1)
            x = act(f"d{level}_conv1", act(f"d{level}_conv0", x))
        d0 = x
        out1x = bgr + torch.tanh(self.out1x_conv1(act("out1x_conv0", d0)))
        d2x = upsample(act("dec2x_conv1", act("dec2x_conv0", d0)))
        out2x = upsample(out1x) + torch.tanh(self.out2x_conv1(act("out2x_conv0", d2x)))
        d4x = upsample(act("dec4x_conv1", act("dec4x_conv0", d2x)))
        return upsample(out2x) + torch.tanh(self.out4x_conv1(act("out4x_conv0", d4x)))


def enhance(model: FaceEnhancer, face: np.ndarray, preserve_size: bool = False, is_tanh: bool = False) -> np.ndarray:
    """DFL's FaceEnhancer.enhance of a BGR face (h, w, 3) float32 in [0, 1]: 4x the size (or the input's with
    `preserve_size`), in [0, 1]. `is_tanh`, as DFL's merger calls it: the face goes in as it is and comes out
    as the network gives it (DFL's merger passes its [0, 1] face so, unconverted)."""
    device = next(model.parameters()).device
    img = face.astype(np.float32) if is_tanh else np.clip(face.astype(np.float32) * 2 - 1, -1, 1)
    ih, iw = img.shape[:2]
    top, left = max(0, (PATCH - ih) // 2), max(0, (PATCH - iw) // 2)
    bottom, right = max(0, PATCH - ih - top), max(0, PATCH - iw - left)
    img = np.pad(img, ((top, bottom), (left, right), (0, 0)))
    h, w = img.shape[:2]
    out = np.zeros((h * UP, w * UP, 3), np.float32)
    weight = np.zeros((h * UP, w * UP, 1), np.float32)
    ramp = np.concatenate([np.linspace(0, 1, PATCH // 2 * UP), np.linspace(1, 0, PATCH // 2 * UP)])
    pyramid = (ramp[None, :] * ramp[:, None])[..., None].astype(np.float32)
    params = [torch.tensor([[p]], device=device) for p in PARAMS]
    for j in _starts(h):
        for i in _starts(w):
            patch = torch.from_numpy(np.ascontiguousarray(img[j : j + PATCH, i : i + PATCH])).permute(2, 0, 1)[None]
            with torch.inference_mode():
                x = model(patch.to(device), *params)[0].permute(1, 2, 0).float().cpu().numpy()
            out[j * UP : (j + PATCH) * UP, i * UP : (i + PATCH) * UP] += x * pyramid
            weight[j * UP : (j + PATCH) * UP, i * UP : (i + PATCH) * UP] += pyramid
    weight[weight == 0] = 1.0
    out /= weight
    out = out[top * UP : (h - bottom) * UP, left * UP : (w - right) * UP]
    if preserve_size:
        out = cv2.resize(out, (iw, ih), interpolation=cv2.INTER_LANCZOS4)
    return out if is_tanh else np.clip(out / 2 + 0.5, 0, 1)


def _starts(n: int) -> list[int]:
    """DFL's patch positions along a side of `n`: every half patch, the last flush with the end."""
    last, at, found = n - PATCH, 0, []
    while True:
        found.append(at)
        if at == last:
            return found
        at = min(at + PATCH // 2, last)
