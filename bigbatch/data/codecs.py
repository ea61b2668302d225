"""How a data file stores an image: its raw uint8 pixels, or its encoded bytes (JPEG, PNG, WebP; encoded
by Pillow), and the decode back to pixels by OpenCV (libjpeg-turbo), at a reduced size where the phase
asks for one (JPEG's DCT scaling: a 128-px phase reads a 256-px store at a fraction of a full decode),
and of a crop's MCUs only (jpeg_region: JPEGs are written with a restart marker after every MCU),
resized by OpenCV or PyTorch's uint8 kernels."""

from __future__ import annotations

import io
import math
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from bigbatch.data import jpeg_region
from bigbatch.errors import BigbatchError

CODECS = ("raw", "jpeg", "png", "webp")
DEFAULT_QUALITY = {"jpeg": 90, "webp": 90}  # png is lossless; raw stores the pixels
LOSSY = ("jpeg", "webp")


class Encoded(NamedTuple):
    """One image's encoded bytes and the shape (h, w, c) they decode to."""

    data: bytes
    shape: tuple[int, int, int]


def check(codec: str, quality: int | None, channels: int | None = None) -> int:
    """The quality to encode with (0 where the codec takes none), or a one-line error for a codec,
    quality or channel count it cannot store."""
    if codec not in CODECS:
        raise BigbatchError(f"unknown codec {codec!r}; valid: {', '.join(CODECS)}")
    if quality is not None and codec not in LOSSY:
        raise BigbatchError(f"--quality is for jpeg and webp (lossy); {codec} takes none")
    if codec in LOSSY:
        quality = DEFAULT_QUALITY[codec] if quality is None else quality
        if not 1 <= quality <= 100:
            raise BigbatchError(f"--quality must be 1..100, got {quality}")
    if codec != "raw" and channels not in (None, 3):
        raise BigbatchError(
            f"--codec {codec} stores RGB images; images with masks ({channels} channels) need --codec raw"
        )
    return quality or 0


def encode(image: np.ndarray, codec: str, quality: int) -> Encoded:
    """uint8 HxWx3 -> its bytes in `codec` (JPEG with 4:2:0 chroma, libjpeg's default at this quality, and
    a restart marker after every MCU so that a crop decodes only its own (jpeg_region); PNG at zlib
    level 6; WebP at `quality`, method 4)."""
    img = Image.fromarray(np.ascontiguousarray(image), "RGB")
    buffer = io.BytesIO()
    if codec == "jpeg":
        img.save(
            buffer,
            format="JPEG",
            quality=quality,
            subsampling="4:2:0",
            optimize=False,
            restart_marker_blocks=jpeg_region.RESTART_MCUS,
        )
    elif codec == "png":
        img.save(buffer, format="PNG", compress_level=6)
    elif codec == "webp":
        img.save(buffer, format="WEBP", quality=quality, method=4)
    else:
        raise BigbatchError(f"cannot encode with codec {codec!r}")
    return Encoded(buffer.getvalue(), (image.shape[0], image.shape[1], 3))


def _reduction(side: float, target: int, jpeg: bool) -> int:
    """The largest of libjpeg's DCT scales 1/8, 1/4, 1/2 that keeps `side` pixels at least `target`
    (1: a full decode; always for PNG and WebP)."""
    if jpeg and target:
        for factor in (8, 4, 2):
            if side / factor >= target:
                return factor
    return 1


def _imdecode(data: bytes | bytearray | memoryview, factor: int, size: tuple[int, int]) -> np.ndarray:
    """OpenCV's decode (libjpeg-turbo, libpng, libwebp) to RGB, at 1/factor for a JPEG, of an image stored at `size`
    (h, w): decoded to another size, its bytes are damaged (not_as_stored)."""
    import cv2

    flag = {1: cv2.IMREAD_COLOR_RGB, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4}.get(
        factor, cv2.IMREAD_REDUCED_COLOR_8
    )
    if factor > 1:  # the reduced flags ask for BGR: ask for RGB instead
        flag = (flag & ~cv2.IMREAD_COLOR_BGR) | cv2.IMREAD_COLOR_RGB
    image = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
    if image is None:
        raise ValueError("the bytes do not decode")
    if (wrong := not_as_stored(image.shape[:2], size, (factor,))) is not None:
        raise ValueError(wrong)
    return image


def not_as_stored(shape: tuple[int, int], size: tuple[int, int], factors: tuple[int, ...] = (1, 2, 4, 8)) -> str | None:
    """Why an image decoded to (h, w) `shape` is not one stored at `size` (h, w) decoded at 1/factor for one of
    `factors` (libjpeg's size: rounded up), or None where it is: other bytes than prepare wrote (found from outside:
    a damaged JPEG decoded, with libjpeg's warning alone, to another size, and was trained on)."""
    if any(tuple(shape) == (-(-size[0] // f), -(-size[1] // f)) for f in factors):
        return None
    return f"it decodes to {shape[1]}x{shape[0]}, not the {size[1]}x{size[0]} stored"


def decode(data: bytes | memoryview, size: tuple[int, int], at_least: int = 0, jpeg: bool = True) -> np.ndarray:
    """Encoded bytes of an image of `size` (h, w) -> uint8 HxWx3 RGB. `at_least` > 0: a JPEG is
    decoded at the smallest of 1/1, 1/2, 1/4 and 1/8 of its size whose short side is still >=
    at_least (libjpeg's scaled IDCT: a quarter of the pixels at 1/2); the caller resizes to the
    phase's resolution as for any image."""
    return _imdecode(data, _reduction(min(size), at_least, jpeg), size)


def decode_box(
    data: bytes | memoryview,
    size: tuple[int, int],
    box: tuple[float, float, float, float],
    out: int | tuple[int, int],
    jpeg: bool = True,
    placed: bool = True,
) -> np.ndarray:
    """The region `box` (left, top, w, h, in pixels of the stored image of `size` (h, w)) of encoded
    bytes, resized to out x out, or to `out` = (h, w) (`resized`), RGB. A JPEG is decoded at the smallest DCT
    scale that keeps the region at least as large as the output, so a low-resolution phase decodes a fraction
    of the pixels, and only the MCUs the region touches (jpeg_region). A box whose edges fall within the
    decoded pixels (a reduced scale's, most) is resampled where it lies where `placed`; else (a random crop,
    whose place is drawn anyway) at its size from the pixel nearest its start: half a decoded pixel off at most,
    its resize six times as fast as the placed one's."""
    left, top, w, h = box
    out_h, out_w = (out, out) if isinstance(out, int) else out
    factor = _reduction(min(w / out_w, h / out_h), 1, jpeg)
    full_h, full_w = -(-size[0] // factor), -(-size[1] // factor)  # libjpeg's size at 1/factor
    # libjpeg's 1/factor puts a stored pixel's edge x at x / factor (found from outside: the box was taken as
    # ceil(width / factor) / width of it, and its edges floored, a center crop at 1/4 1-2 stored pixels off)
    edges = left / factor, top / factor, min(full_w, (left + w) / factor), min(full_h, (top + h) / factor)
    x0, y0 = int(edges[0]), int(edges[1])
    x1, y1 = max(x0 + 1, math.ceil(edges[2])), max(y0 + 1, math.ceil(edges[3]))
    if not placed:  # (a pixel more, where the image has one, for a start that rounds up)
        x1, y1 = x1 + (x1 < full_w and edges[0] > x0), y1 + (y1 < full_h and edges[1] > y0)
    within = (edges[0] - x0, edges[1] - y0, edges[2] - x0, edges[3] - y0)  # (the box in the decoded region)
    part = jpeg_region.region(data, (x0, y0, x1, y1), factor) if jpeg else None
    if part is not None:  # only the crop's MCUs, from the same coefficients
        data, dx, dy = part.data, part.left // factor, part.top // factor
        x0, x1, y0, y1 = x0 - dx, x1 - dx, y0 - dy, y1 - dy
        size = (part.height, part.width)
    return resized(_imdecode(data, factor, size)[y0:y1, x0:x1], (out_h, out_w), within, placed)


def resized(
    region: np.ndarray,
    size: tuple[int, int],
    box: tuple[float, float, float, float] | None = None,
    placed: bool = True,
) -> np.ndarray:
    """uint8 HxWxC `region`, or its part `box` (x0, y0, x1, y1) -> `size` (h, w), bicubic: `resize` where it
    shrinks on either axis, OpenCV's where it only enlarges (or keeps) both. A box whose edges fall within pixels
    is resampled where it lies (`placed`: Pillow's box resize, of the filter `resize` matches, where it shrinks;
    OpenCV's warpAffine, of resize's kernel and map, where it enlarges), or taken at its size from the pixel nearest
    its start (PyTorch's kernels of the same filters, scaled by it: half a pixel off at most, under one at the
    image's right or bottom edge)."""
    import cv2

    out_h, out_w = size
    h, w = region.shape[:2]
    x0, y0, x1, y1 = box or (0, 0, w, h)
    shrinks = x1 - x0 > out_w or y1 - y0 > out_h
    if (x0, y0, x1, y1) == (0, 0, w, h):
        if shrinks:
            return resize(region, size)
        out = cv2.resize(region, (out_w, out_h), interpolation=cv2.INTER_CUBIC)
    elif placed and shrinks:
        grey = region.shape[2] == 1
        img = Image.fromarray(region[..., 0] if grey else region)
        out = np.asarray(img.resize((out_w, out_h), Image.Resampling.BICUBIC, box=(x0, y0, x1, y1)))
    elif placed:  # (resize's map, dst -> (dst + 0.5) * scale - 0.5, from x0, y0)
        sx, sy = (x1 - x0) / out_w, (y1 - y0) / out_h
        to = np.array([[sx, 0, x0 + sx / 2 - 0.5], [0, sy, y0 + sy / 2 - 0.5]])
        flags = cv2.INTER_CUBIC | cv2.WARP_INVERSE_MAP
        out = cv2.warpAffine(region, to, (out_w, out_h), flags=flags, borderMode=cv2.BORDER_REPLICATE)
    else:
        left, top = min(round(x0), int(w - (x1 - x0))), min(round(y0), int(h - (y1 - y0)))
        part = torch.from_numpy(region[top : top + math.ceil(y1 - y0), left : left + math.ceil(x1 - x0)])
        op = torch.ops.aten._upsample_bicubic2d_aa if shrinks else torch.ops.aten.upsample_bicubic2d
        y = op(part[None].permute(0, 3, 1, 2), [out_h, out_w], False, out_h / (y1 - y0), out_w / (x1 - x0))
        return np.ascontiguousarray(y.permute(0, 2, 3, 1)[0].numpy())
    return out[..., None] if out.ndim == 2 else out  # (OpenCV and Pillow drop a single channel's axis)


def resize(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """uint8 HxWxC -> size (h, w): bicubic, antialiased where it shrinks, Pillow's BICUBIC filter (as
    resize_batch and torchvision's antialiased resize; PyTorch's fixed-point uint8 kernel lands a level
    or so from Pillow's). It shrinks by 1-2x where the reduced decode leaves a region, in half the
    time of OpenCV's area averaging there, which it replaced: sharper, and less aliased."""
    x = torch.from_numpy(image)[None].permute(0, 3, 1, 2)  # a channels-last view: no copy, and out
    y = F.interpolate(x, size=size, mode="bicubic", align_corners=False, antialias=True)
    return y.permute(0, 2, 3, 1)[0].numpy()  # (channels-last: HxWxC, contiguous)
