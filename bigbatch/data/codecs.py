"""How a data file stores an image: its raw uint8 pixels, or its encoded bytes (JPEG through Pillow's
libjpeg-turbo, PNG, WebP), and the decode back to pixels, at a reduced size where the phase asks
for one (JPEG's DCT scaling: a 128-px phase reads a 256-px store at a fraction of a full decode)."""

from __future__ import annotations

import io
import math
from typing import NamedTuple

import numpy as np
from PIL import Image

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
    """uint8 HxWx3 -> its bytes in `codec` (JPEG with 4:2:0 chroma, libjpeg's default at this quality;
    PNG at zlib level 6; WebP at `quality`, method 4)."""
    img = Image.fromarray(np.ascontiguousarray(image), "RGB")
    buffer = io.BytesIO()
    if codec == "jpeg":
        img.save(buffer, format="JPEG", quality=quality, subsampling="4:2:0", optimize=False)
    elif codec == "png":
        img.save(buffer, format="PNG", compress_level=6)
    elif codec == "webp":
        img.save(buffer, format="WEBP", quality=quality, method=4)
    else:
        raise BigbatchError(f"cannot encode with codec {codec!r}")
    return Encoded(buffer.getvalue(), (image.shape[0], image.shape[1], 3))


def decode(data: bytes | memoryview, at_least: int = 0) -> np.ndarray:
    """Encoded bytes -> uint8 HxWx3. `at_least` > 0: a JPEG is decoded at the smallest of 1/1, 1/2, 1/4
    and 1/8 of its size whose short side is still >= at_least (libjpeg's scaled IDCT: less than half
    the work at 1/2, a sixth at 1/4); the caller resizes to the phase's resolution as for any image."""
    with Image.open(io.BytesIO(data)) as img:
        if at_least and img.format == "JPEG":
            w, h = img.size
            scale = at_least / min(w, h)
            if scale <= 0.5:  # draft picks the largest reduction that keeps the requested size
                img.draft("RGB", (max(1, round(w * scale)), max(1, round(h * scale))))
        return np.asarray(img.convert("RGB"), dtype=np.uint8)


def decode_box(data: bytes | memoryview, box: tuple[float, float, float, float], size: int) -> np.ndarray:
    """The region `box` (left, top, w, h, in the stored image's pixels) of encoded bytes, resized to
    size x size (Pillow's antialiased bicubic). A JPEG is decoded at the smallest DCT scale that keeps
    the region at least `size` pixels on its short side, so a small crop of a large image, or a
    low-resolution phase, decodes a fraction of the pixels."""
    left, top, w, h = box
    with Image.open(io.BytesIO(data)) as img:
        full_w, full_h = img.size
        if img.format == "JPEG":
            scale = size / min(w, h)
            if scale <= 0.5:
                img.draft("RGB", (max(1, math.ceil(full_w * scale)), max(1, math.ceil(full_h * scale))))
        fx, fy = img.size[0] / full_w, img.size[1] / full_h  # the scale draft gave
        region = (left * fx, top * fy, (left + w) * fx, (top + h) * fy)
        out = img.convert("RGB").resize((size, size), Image.Resampling.BICUBIC, box=region)
        return np.asarray(out, dtype=np.uint8)
