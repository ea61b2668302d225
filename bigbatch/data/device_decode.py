"""data.decode = "gpu": the JPEGs of an encoded data file decoded on the training device in batches
(torchvision.io.decode_jpeg: nvJPEG on CUDA) and cropped, resized and mirrored there, so that a few
CPU cores feed a fast GPU, as DALI and torchvision's GPU decode do.

The loader's workers read each step's encoded bytes and draw its crops and flips exactly as for the
CPU path (keyed by seed and global position: the same regions of the same images); the Feed decodes
them on the device. The pixels differ from the CPU path's in the last bits: nvJPEG's IDCT is not
libjpeg-turbo's, and the resize is bilinear with antialiasing (torch) where the CPU path uses
OpenCV's area averaging. Runs with data.decode = "gpu" are reproducible among themselves (resume, any
number of workers and ranks), not bit-equal to CPU-decoded ones."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from bigbatch.errors import BigbatchError


class Encoded(NamedTuple):
    """A batch still encoded: what the loader hands the Feed with data.decode = "gpu"."""

    data: list[np.ndarray]
    """Each image's encoded bytes (uint8)."""
    sizes: np.ndarray
    """(n, 2): each image's stored (h, w)."""
    boxes: list[tuple[float, float, float, float]]
    """The region of each image to keep: (left, top, w, h) in stored pixels."""
    out: tuple[int, int]
    """The (h, w) every region is resized to."""
    flips: torch.Tensor | None
    """Which images to mirror (None: none)."""


Decoder = Callable[[list[torch.Tensor], torch.device], list[torch.Tensor]]


def nvjpeg(data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """JPEG bytes (uint8 CPU tensors) -> RGB images (uint8 CHW) on `device`, decoded in one batch."""
    from torchvision.io import ImageReadMode, decode_jpeg

    return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)


def decode(batch: Encoded, device: torch.device, decoder: Decoder | None = None) -> torch.Tensor:
    """The batch's regions decoded on `device` (by `decoder`, default nvjpeg), each resized to
    `batch.out` (bilinear, antialiased) and mirrored where drawn: uint8 NHWC on `device`, ready for the
    caller's current stream.

    On CUDA the batch is decoded on a stream of the decoder's own, so that nvJPEG never writes memory another
    stream still uses: torchvision's CUDA decode_jpeg allocates its outputs on the caller's current stream,
    then decodes on another stream without waiting for the caller's (pytorch/vision PR #9606), and nvJPEG's
    hardware engine does not wait even for the stream it is given (meta-pytorch/torchcodec PR #1634). The
    caching allocator hands a block back as soon as it is freed on its stream: on the training stream the
    decoder could be given a block that queued training kernels have yet to read, and overwrite it. So:
    the decode stream is waited for first (no queued work on it can still read a block it reuses: it holds
    the last batch's resizes); the batch is decoded with it current (its blocks from its pool); the caller's
    stream waits for it, and the result is recorded on the caller's stream (its block returns to the decode
    stream's pool only once the caller's work that reads it has run)."""
    if device.type != "cuda":
        return _decode(batch, device, decoder)
    stream, caller = _decode_stream(device), torch.cuda.current_stream(device)
    stream.synchronize()
    with torch.cuda.stream(stream):
        x = _decode(batch, device, decoder)
    caller.wait_stream(stream)
    x.record_stream(caller)
    return x


_STREAMS: dict[int, torch.cuda.Stream] = {}


def _decode_stream(device: torch.device) -> torch.cuda.Stream:
    """The device's stream for decoding alone."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _STREAMS:
        _STREAMS[index] = torch.cuda.Stream(device=index)
    return _STREAMS[index]


def _decode(batch: Encoded, device: torch.device, decoder: Decoder | None) -> torch.Tensor:
    if not batch.data:
        return torch.zeros((0, *batch.out, 3), dtype=torch.uint8, device=device)
    images = (decoder or nvjpeg)([torch.from_numpy(d) for d in batch.data], device)
    out = []
    for image, (h, w), (left, top, bw, bh) in zip(images, batch.sizes.tolist(), batch.boxes):
        fy, fx = image.shape[1] / h, image.shape[2] / w  # 1 unless the decoder scaled
        x0, y0 = int(left * fx), int(top * fy)
        x1, y1 = max(x0 + 1, round((left + bw) * fx)), max(y0 + 1, round((top + bh) * fy))
        region = image[None, :3, y0:y1, x0:x1].float()
        out.append(F.interpolate(region, size=batch.out, mode="bilinear", align_corners=False, antialias=True))
    x = torch.cat(out).round_().clamp_(0, 255).to(torch.uint8)
    if batch.flips is not None:
        x = torch.where(batch.flips.to(device)[:, None, None, None], x.flip(3), x)
    return x.permute(0, 2, 3, 1).contiguous()


def check(data: Any, device: torch.device) -> None:
    """data.decode = "gpu" needs a JPEG data file of RGB images and a CUDA device; one line otherwise."""
    codec = getattr(data, "meta", {}).get("codec", "raw") if getattr(data, "encoded", False) else "raw"
    if codec != "jpeg" or getattr(data, "channels", 3) != 3:
        raise BigbatchError(
            f'data.decode = "gpu" decodes JPEG files of RGB images; {data.source} is {codec} with '
            f'{getattr(data, "channels", "?")} channels: prepare it with --codec jpeg, or set data.decode = "cpu"'
        )
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BigbatchError('data.decode = "gpu" decodes on a CUDA device and none is available here: use "cpu"')
    if device.type != "cuda":
        raise BigbatchError(
            f'data.decode = "gpu" decodes on a CUDA device and this run trains on {device.type}: '
            'set data.decode = "cpu" (the default)'
        )
