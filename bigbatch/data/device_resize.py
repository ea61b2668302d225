"""A batch's regions of decoded images of different sizes, each resized to one size and mirrored where drawn,
in a few dozen device kernels a group of regions: data.decode = "gpu"'s cuts, resizes and flips.

Each region resized alone took two ops (a cast and an antialiased resize), 1,032 launches for ResNet-50's 512
crops with the batch's cat, made from the decode thread beside the step's own launches. On an H200 they took 20
of the 34 ms that nvJPEG's 512 crops took in all (the decoder 13 ms; bench/RESULTS.md, 2026-12-04). Here the
images are read into one padded batch by a gather, and each region's resize is two batched matrix products: its
rows by an (out_h, h) matrix, its columns by an (out_w, w) one, whose rows hold the weights of torch's antialiased
bilinear resize (`F.interpolate(mode="bilinear", antialias=True)`, PIL's triangle filter stretched by the
downscaling factor; the same weights, to float rounding), a flip being the column matrix's rows reversed. The
images are taken in groups whose padded batch stays under GROUP elements, the largest regions together (about
280 ops for 512 crops of 256 x 340 images: `python bench/host_ops.py`). The products follow torch's float32
matmul precision: in fp32 (PyTorch's default) a pixel differs from torch's resize by a level of rounding at most
and rarely; under TF32 (`torch.set_float32_matmul_precision("high")`) about 3% of them do.
"""

from __future__ import annotations

import numpy as np
import torch

from bigbatch.errors import BigbatchError

GROUP = 1 << 24  # elements of a group's padded batch (64 MiB in fp32, its index 128 MiB)


def resized(
    images: list[torch.Tensor],
    regions: np.ndarray,
    out: tuple[int, int],
    flips: torch.Tensor | None,
    device: torch.device,
) -> torch.Tensor:
    """`images` (CHW uint8 on `device`, 3 channels or more: the first 3 are kept), each one's region `regions[i]`
    = (y0, y1, x0, x1) resized to `out` (h, w) and mirrored where `flips` (host booleans): uint8 NHWC on
    `device`."""
    if not images:
        return torch.zeros((0, *out, 3), dtype=torch.uint8, device=device)
    if min(image.shape[0] for image in images) < 3:
        raise BigbatchError("a decoded JPEG has fewer than 3 channels: decode them as RGB")
    flat, starts, strides = _flattened(images)
    sizes = regions[:, [1, 3]] - regions[:, [0, 2]]
    order = np.argsort(-(sizes[:, 0] * sizes[:, 1]), kind="stable")
    mirror = np.zeros(len(images), bool) if flips is None else flips.cpu().numpy().astype(bool)
    parts, taken = [], 0
    while taken < len(order):
        # As many of the largest regions left as fit GROUP padded to their tallest and widest.
        hs, ws = (np.maximum.accumulate(sizes[order[taken:], axis]) for axis in (0, 1))
        count = max(1, int((np.arange(1, len(hs) + 1) * 3 * hs * ws <= GROUP).sum()))
        group = order[taken : taken + count]
        taken += count
        m, hc, wc = len(group), int(hs[count - 1]), int(ws[count - 1])
        # Element (k, y, c, x) of the padded batch: its image's start + row, channel and column strides.
        ys = starts[group, None] + _clamped(regions[group, 0], sizes[group, 0], hc) * strides[group, 1:2]
        cs = np.arange(3) * strides[group, 0:1]
        xs = _clamped(regions[group, 2], sizes[group, 1], wc) * strides[group, 2:3]
        small = np.concatenate([ys.ravel(), cs.ravel(), xs.ravel(), sizes[group].T.ravel(), mirror[group]])
        small = torch.from_numpy(small).to(device, non_blocking=True)  # (one copy to the device)
        ys_, cs_, xs_, h_, w_, flipped = small.split([ys.size, cs.size, xs.size, m, m, m])
        x = flat[ys_.view(m, hc, 1, 1) + cs_.view(m, 1, 3, 1) + xs_.view(m, 1, 1, wc)].float()
        rows, cols = _weights(h_, out[0], hc), _weights(w_, out[1], wc, flipped.bool())
        # Rows, then columns: (m, out_h, hc) @ (m, hc, 3 wc), then (m, out_h 3, wc) @ (m, wc, out_w).
        y = torch.bmm(rows, x.view(m, hc, 3 * wc)).view(m, out[0] * 3, wc)
        parts.append(torch.bmm(y, cols.transpose(1, 2)).view(m, out[0], 3, out[1]))
    y = torch.cat(parts) if len(parts) > 1 else parts[0]
    if (order != np.arange(len(order))).any():
        y = y[torch.from_numpy(np.argsort(order)).to(device, non_blocking=True)]
    return y.round_().clamp_(0, 255).to(torch.uint8).transpose(2, 3).contiguous()


def _flattened(images: list[torch.Tensor]) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """The images' elements as one flat tensor (each image's in its own memory order, copied only if it is not
    dense), where each starts in it, and each one's (channel, row, column) strides."""
    flats, strides = [], []
    for image in images:
        order = sorted(range(3), key=lambda d: -image.stride(d))
        if not image.permute(order).is_contiguous():
            image = image.contiguous()
            order = [0, 1, 2]
        flats.append(image.permute(order).reshape(-1))
        strides.append(image.stride())
    starts = np.cumsum([0] + [f.numel() for f in flats[:-1]])
    return torch.cat(flats), starts, np.array(strides, dtype=np.int64)


def _clamped(start: np.ndarray, size: np.ndarray, padded: int) -> np.ndarray:
    """(n, padded): each region's pixel positions along one axis, the last repeated past its size (the weights
    there are 0)."""
    return start[:, None] + np.minimum(np.arange(padded), size[:, None] - 1)


def _weights(size: torch.Tensor, out: int, padded: int, flipped: torch.Tensor | None = None) -> torch.Tensor:
    """(n, out, padded) float: row i of image k holds the weights of its output pixel i (of out - 1 - i where
    `flipped[k]`) over its `size[k]` input pixels, as torch's antialiased bilinear resize (align_corners False)
    computes them: centre scale * (i + 0.5), the triangle filter over (j - centre + 0.5) / max(scale, 1), which
    is 0 outside torch's window of taps, normalized to sum 1; 0 past the size."""
    size = size.float()[:, None, None]
    scale = size / out
    support = scale.clamp(min=1.0)
    i = torch.arange(out, device=size.device)[None, :]
    if flipped is not None:
        i = torch.where(flipped[:, None], out - 1 - i, i)
    centre = scale * (i[:, :, None] + 0.5)
    j = torch.arange(padded, device=size.device, dtype=torch.float32)[None, None, :]
    w = (j - centre).add_(0.5).div_(support).abs_().neg_().add_(1).clamp_(min=0)  # (in place: one n x out x padded)
    w.masked_fill_(j >= size, 0.0)
    return w.div_(w.sum(dim=2, keepdim=True))
