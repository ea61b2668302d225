"""Image files the face commands read: decoded by OpenCV once their headers pass Pillow's guard against
decompression bombs."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from bigbatch.errors import BigbatchError

HEADER = 1 << 20  # bytes of an image file read for its size


class TooLarge(BigbatchError):
    """An image whose header gives more pixels than Pillow decodes (a decompression bomb, or a giant scan)."""


def check_size(image: Path | np.ndarray | bytes, name: str | None = None) -> None:
    """Raise TooLarge (one line naming `name`, else the path) where the header of `image` (a file or its bytes;
    only the header is read) gives more pixels than Pillow decodes: twice Image.MAX_IMAGE_PIXELS, or what a user
    who changed it set (None: no limit). OpenCV's own limit is 2^30 pixels (found by review: a 1.1 MB PNG of
    20000x20000 took extract 10.7 GB and 3.5 minutes); formats Pillow does not read are left to it."""
    from PIL import Image

    try:
        _header_size(image)
    except Image.DecompressionBombError as e:
        raise TooLarge(f"{name or image}: too large to decode safely ({e})") from None
    except Exception:  # noqa: BLE001 -- not a format Pillow reads, or a damaged header: OpenCV's to say
        pass


def header_size(image: Path | np.ndarray | bytes) -> tuple[int, int] | None:
    """(height, width) as the header of `image` gives it, or None where Pillow does not read it (or refuses it: see
    check_size)."""
    try:
        return _header_size(image)
    except Exception:  # noqa: BLE001 -- as check_size
        return None


def _header_size(image: Path | np.ndarray | bytes) -> tuple[int, int]:
    import warnings

    from PIL import Image

    # (a file's first MiB holds its header: found by review, the whole file copied to read it cost 10% of a PNG's
    # decode; a JPEG's metadata past it leaves the file to OpenCV's limit)
    head = image if isinstance(image, Path) else io.BytesIO(memoryview(image).cast("B")[:HEADER].tobytes())
    with warnings.catch_warnings():  # (Pillow's warning between 1x and 2x its limit: the image is decoded)
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        with Image.open(head) as opened:
            return opened.size[1], opened.size[0]


def imdecode(data: np.ndarray, flags: int, name: str) -> np.ndarray | None:
    """cv2.imdecode(data, flags) (None where it does not decode), once `check_size` passed the file `name`."""
    import cv2

    check_size(data, name)
    return cv2.imdecode(data, flags) if data.size else None  # (an empty file: OpenCV's assertion, found from outside)


def imread(path: Path) -> np.ndarray:
    """The image file `path` as BGR uint8 (cv2.imread's IMREAD_COLOR), once `check_size` passed it; one line where
    it does not decode."""
    import cv2

    image = imdecode(np.fromfile(str(path), np.uint8), cv2.IMREAD_COLOR, str(path))
    if image is None:
        raise BigbatchError(f"{path} does not decode as an image")
    return image
