"""Built-in data sets (`builtin:NAME`): scikit-learn's digits and Debian's Fashion-MNIST, made in RAM."""

from __future__ import annotations

import gzip
import importlib.util
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bigbatch.data.images import ImageData
from bigbatch.engine.memory import default_budget, format_bytes
from bigbatch.errors import BigbatchError

FASHION_CLASSES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]
# Where Debian's dataset-fashion-mnist puts the IDX files; BIGBATCH_FASHION_MNIST overrides it.
FASHION_DIR = "/usr/share/datasets/fashion-mnist"
# The size the built-in images come in (`bigbatch prepare builtin:NAME` keeps it without --resolution).
NATIVE_RESOLUTION = {"digits": 8, "fashion-mnist": 28, "fashion-mnist-test": 28}


# Images resized at a time: the float copy of a part, not of the whole set (60,000 at 512 px in float32: 63 GB).
RESIZE_PART = 1024


def _resize_gray(images: np.ndarray, peak: float, resolution: int, name: str) -> torch.Tensor:
    """(N, h, w) grayscale with values in [0, peak] -> (N, R, R, 3) uint8, bicubic with antialiasing. A set that
    would not fit in the memory free is refused in one line (found from outside: Fashion-MNIST at 512 px was an
    out-of-memory error blamed on the training step)."""
    size = len(images) * resolution**2 * 3
    if size > (free := default_budget(torch.device("cpu"))):
        raise BigbatchError(
            f"builtin:{name} at {resolution} px takes {format_bytes(size)} in memory, more than the "
            f"{format_bytes(free)} free: give a smaller data.resolution (its images are {images.shape[-1]} px, "
            "enlarged to it), or images of that size prepared into a file (bigbatch prepare)"
        )
    parts = []
    for at in range(0, len(images), RESIZE_PART):
        x = torch.from_numpy(images[at : at + RESIZE_PART].astype(np.float32) / peak)[:, None]
        if x.shape[-1] != resolution:
            x = F.interpolate(x, size=(resolution, resolution), mode="bicubic", align_corners=False, antialias=True)
        parts.append((x.clamp(0, 1) * 255).round().to(torch.uint8))
    return torch.cat(parts).permute(0, 2, 3, 1).expand(-1, -1, -1, 3).contiguous()


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits (images (N, 8, 8) float64, targets (N,) int), read from its CSV as
    load_digits reads it, but without importing scikit-learn: that import (scipy with it) took 2 s of each
    process that trains on digits."""
    spec = importlib.util.find_spec("sklearn")  # (finds the package without importing it)
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if path is None or not path.is_file():  # another layout: its own loader
        from sklearn.datasets import load_digits

        d = load_digits()
        return d.images, d.target
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int, copy=False)


def digits(resolution: int) -> ImageData:
    """scikit-learn's 1,797 handwritten digits (8x8, 17 grey levels), upscaled to `resolution`."""
    images, target = _digits_arrays()
    images = _resize_gray(images, 16.0, resolution, "digits")
    return ImageData(images, torch.from_numpy(target).long(), list(CLASSES["digits"]), "builtin:digits")


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (the MNIST format), gzipped or not."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
        zero, dtype, ndim = raw[0:2], raw[2], raw[3]
        if zero != b"\0\0" or dtype != 0x08:
            raise ValueError("not an unsigned-byte IDX file")
        shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
        return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(shape)
    except (OSError, ValueError, EOFError) as e:
        raise BigbatchError(f"cannot read IDX file {path}: {e}") from None


def fashion_mnist(resolution: int, folder: str | None = None, split: str = "train") -> ImageData:
    """Fashion-MNIST's 60,000 training images (split "train") or 10,000 test images ("t10k"), 28x28
    grey, resized to `resolution`."""
    root = Path(folder or os.environ.get("BIGBATCH_FASHION_MNIST", FASHION_DIR))
    files = {}
    for part in (f"{split}-images-idx3-ubyte", f"{split}-labels-idx1-ubyte"):
        found = [p for p in (root / part, root / f"{part}.gz") if p.exists()]
        if not found:
            raise BigbatchError(
                f"Fashion-MNIST file {part}[.gz] is not in {root}: install Debian's dataset-fashion-mnist "
                "or set BIGBATCH_FASHION_MNIST to a folder holding the IDX files"
            )
        files[part] = found[0]
    images = read_idx(files[f"{split}-images-idx3-ubyte"])
    labels = read_idx(files[f"{split}-labels-idx1-ubyte"])
    if images.ndim != 3 or labels.shape != images.shape[:1]:
        raise BigbatchError(f"Fashion-MNIST files in {root} do not match: {images.shape} images, {labels.shape} labels")
    name = "fashion-mnist" + ("" if split == "train" else "-test")
    return ImageData(
        _resize_gray(images, 255.0, resolution, name),
        torch.from_numpy(labels.astype(np.int64)),
        FASHION_CLASSES,
        f"builtin:{name}",
    )


def fashion_mnist_test(resolution: int) -> ImageData:
    """Fashion-MNIST's 10,000 test images: the held-out split of a classifier trained on builtin:fashion-mnist."""
    return fashion_mnist(resolution, split="t10k")


BUILTIN = {"digits": digits, "fashion-mnist": fashion_mnist, "fashion-mnist-test": fashion_mnist_test}
# Each set's classes, and the channels of all (gray as RGB), known without making it (a dry run's).
CLASSES = {"digits": [str(i) for i in range(10)], "fashion-mnist": FASHION_CLASSES}
CLASSES["fashion-mnist-test"] = FASHION_CLASSES
CHANNELS = 3
