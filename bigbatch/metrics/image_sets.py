"""Sets of images to score that are not data files: a folder (searched recursively), a .zip, an fsspec
prefix (s3://…) or an .npz/.npy array, read through the data-set interface (len, get, source,
content_hash); and feature extraction over images whose sizes differ from one to the next."""

from __future__ import annotations

import hashlib
import os
import shlex
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from bigbatch.data.images import ImageData
from bigbatch.data.listing import IMAGE_ENDINGS, Listing, is_image_name
from bigbatch.data.sources import decode_or_reason, list_source
from bigbatch.data.tars import read_by_listing
from bigbatch.errors import BigbatchError, first_line
from bigbatch.metrics.features import Extractor
from bigbatch.urls import Location

# Where sample files keep their images: "arr_0" (np.savez(f, images); bigbatch sample --npz, ADM),
# "x" (BigGAN-PyTorch's and StudioGAN's samples.npz), then other common names.
NPZ_KEYS = ("arr_0", "x", "images", "imgs", "samples", "image", "img", "data")
# Bumped when decoding changes, so that statistics cached for an image set are not reused across it.
DECODE_VERSION = "pillow-rgb/v1"


def open_images(path: str | Path | Location, storage_options: dict | None = None) -> ImageFiles | ImageData:
    """The images at `path`: a folder (recursively), .zip or .tar (or WebDataset's shards) of image files, an fsspec
    URL prefix, or an
    .npz/.npy holding one uint8 array (N, H, W, C), (N, C, H, W) or grey (N, H, W)."""
    where = Location.of(path)
    if not read_by_listing(where):
        if not where.path.exists():
            raise BigbatchError(f"{where.name} does not exist; give a folder, .zip or .npz of images")
        if where.path.suffix.lower() in (".npz", ".npy"):
            return array_images(where.path)
    listing = list_source(where, storage_options, classes=False)
    if listing.skipped:  # (a damaged tar: the images after the damage are not there to score)
        name, why = listing.skipped[0]
        raise BigbatchError(f"{where.name}: {name}: {why}; a score needs every image of the set: mend it")
    return ImageFiles(listing, where.name, as_scorers=True)


class ImageFiles:
    """Image files of a folder, zip or URL prefix, in sorted order, decoded on demand as `bigbatch prepare`
    decodes them (Pillow; EXIF orientation; grey, palette, 16-bit and transparent images to 8-bit RGB),
    each at its own size; `as_scorers`: as pytorch-fid, clean-fid and torch-fidelity decode them (what
    the metrics read: no EXIF orientation, transparency dropped, not composited). Sub-folders are not
    classes here: every image file counts."""

    def __init__(
        self,
        listing: Listing,
        source: str,
        give: str = "give a folder, .zip or .npz of images",
        as_scorers: bool = False,
    ):
        self.as_scorers = as_scorers
        # (a listing of every file: list_source(..., classes=False); a class listing leaves some outside)
        order = [i for i, r in enumerate(listing.names) if is_image_name(r)]
        self.keys, self.names = [listing.keys[i] for i in order], [listing.names[i] for i in order]
        self.others = sorted(set(listing.names) - set(self.names))  # the files passed over (predict lists them)
        self.reader, self.source = listing.source, source
        self.skipped = list(listing.skipped)  # (what the listing could not take: a damaged tar's rest)
        if not self.keys:
            raise BigbatchError(f"{source} holds no image files ({IMAGE_ENDINGS}); {give}")

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def class_names(self) -> list[str]:
        return []  # sub-folders are not classes here (a classifier extractor learns rotations instead)

    def __repr__(self) -> str:
        return f"ImageFiles({self.source!r}, {len(self)} images)"

    @cached_property
    def _pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(min(8, os.cpu_count() or 1))  # Pillow decodes without the GIL

    def read(self, index: Sequence[int] | torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        """The images at `index`: uint8 (N, H, W, 3), or a list of (H, W, 3) images when their sizes differ."""
        idx = [int(i) for i in torch.as_tensor(index).reshape(-1)]
        files = self.reader.read([self.keys[i] for i in idx])
        decoded = list(self._pool.map(lambda f: decode_or_reason(f, None, None, as_scorers=self.as_scorers), files))
        for i, d in zip(idx, decoded):
            if isinstance(d, str):
                raise BigbatchError(f"{self.source}: {self.names[i]} is {d}; remove it or replace it")
        images = [torch.tensor(d[1]) for d in decoded]  # a copy: Pillow's arrays are read-only
        if images and all(im.shape == images[0].shape for im in images):
            return torch.stack(images)
        return images

    def get(self, index: Sequence[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Images (N, H, W, 3) uint8 and labels (all 0) at `index`, when the images share one size."""
        images = self.read(index)
        if isinstance(images, list):
            sizes = sorted({(im.shape[1], im.shape[0]) for im in images})  # (W x H, as PIL and prepare say them)
            raise BigbatchError(
                f"{self.source} holds images of different sizes ({sizes[0][0]}x{sizes[0][1]}, "
                f"{sizes[-1][0]}x{sizes[-1][1]}) and this needs one size: make a data set of one size with "
                f"`bigbatch prepare {shlex.quote(self.source)} DATA.h5 --resolution N`"
            )
        return images, torch.zeros(len(images), dtype=torch.long)

    @cached_property
    def content_hash(self) -> str:
        """SHA-256 of the files' bytes in order (and of the decoder's version): what keys cached statistics."""
        h = hashlib.sha256(f"{DECODE_VERSION}:{self.as_scorers}:{len(self)}".encode())
        for start in range(0, len(self), 256):
            chunk = range(start, min(start + 256, len(self)))
            for i, data in zip(chunk, self.reader.read([self.keys[i] for i in chunk])):
                if isinstance(data, str):
                    raise BigbatchError(f"{self.source}: {self.names[i]} is {data}")
                h.update(len(data).to_bytes(8, "little") + data)
        return "files:" + h.hexdigest()


def array_images(path: Path) -> ImageData:
    """The images of an .npz (key arr_0, x, …, or its only array) or .npy file, as uint8 NHWC. Never
    unpickles: an array of Python objects is refused."""
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError as e:
        raise BigbatchError(f"cannot read {path}: {first_line(e)}") from None
    if not head.startswith((b"PK\x03\x04", b"PK\x05\x06", b"\x93NUMPY")):  # a zip (.npz), an .npy
        raise BigbatchError(
            f"{path} is not an .npz or .npy file (it does not begin as one); give images saved by np.savez"
        )
    try:
        loaded = np.load(path, allow_pickle=False)  # an .npz, or the array of an .npy (by content, not name)
        if isinstance(loaded, np.ndarray):
            array, key = loaded, None
        else:
            with loaded:
                array, key = _pick_array(loaded, path)
    except BigbatchError:
        raise
    except ValueError as e:
        if "allow_pickle" in str(e):
            raise BigbatchError(
                f"{path} holds Python objects, which bigbatch never unpickles; save the images as one uint8 array"
            ) from None
        raise BigbatchError(f"cannot read {path} as .npz or .npy ({e})") from None
    except Exception as e:  # noqa: BLE001 - numpy raises many types for a bad file; all mean the same
        raise BigbatchError(f"cannot read {path} as .npz or .npy ({type(e).__name__}: {e})") from None
    what = f"{path}" + (f" [{key!r}]" if key else "")
    if array.dtype != np.uint8:
        raise BigbatchError(
            f"{what} holds {array.dtype} values; images must be uint8 in 0..255 (e.g. np.clip(x * 255, 0, 255)"
            ".round().astype(np.uint8) for images in 0..1)"
        )
    if array.ndim == 3:
        array = array[..., None]  # grey (N, H, W)
    if array.ndim == 4 and len(array) == 0:
        raise BigbatchError(f"{what} holds no images (shape {array.shape}): save at least one")
    if array.ndim != 4 or not ({array.shape[-1], array.shape[1]} & {1, 3}):
        raise BigbatchError(
            f"{what} has shape {array.shape}; images must be (N, H, W, C) or (N, C, H, W) with C 1 or 3"
        )
    if array.shape[-1] not in (1, 3):
        array = array.transpose(0, 2, 3, 1)  # NCHW, as BigGAN-PyTorch writes them
    images = torch.from_numpy(np.ascontiguousarray(array))
    return ImageData(images, torch.zeros(len(images), dtype=torch.long), [], str(path))


def _pick_array(z: np.lib.npyio.NpzFile, path: Path) -> tuple[np.ndarray, str]:
    keys = list(z.keys())
    if {"mu", "sigma"} & set(keys):
        raise BigbatchError(
            f"{path} holds feature statistics (mu, sigma), not images: it can only be the reference (B)"
        )
    key = next((k for k in NPZ_KEYS if k in keys), None)
    if key is None:
        arrays = [k for k in keys if z[k].ndim in (3, 4)]
        key = arrays[0] if len(arrays) == 1 else None
    if key is None:
        raise BigbatchError(
            f"{path} has no image array: expected one of the keys {', '.join(NPZ_KEYS)} or a single (N, H, W, C) "
            f"array, found {', '.join(keys) or 'nothing'}"
        )
    return z[key], key


def read_images(data: object, index: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
    """The uint8 images of any data set or image set at `index`: one (N, H, W, C) tensor, or a list of
    images when their sizes differ (image files of several sizes, a data file's aspect-ratio buckets)."""
    if isinstance(data, ImageFiles):
        return data.read(index)
    counts = getattr(data, "bucket_counts", None)
    if counts is None or len(counts) < 2:
        return data.get(index)[0]
    # A data file's get() takes one bucket at a time: read each run of indices within a bucket.
    starts = np.cumsum([0, *counts])
    idx = torch.as_tensor(index).reshape(-1)
    bucket = np.searchsorted(starts, idx.numpy(), side="right") - 1
    runs = np.split(np.arange(len(idx)), np.flatnonzero(np.diff(bucket)) + 1)
    parts = [data.get(idx[r])[0] for r in runs if len(r)]
    if all(p.shape[1:] == parts[0].shape[1:] for p in parts):
        return torch.cat(parts)
    return [im for p in parts for im in p]


class AnySize(Extractor):
    """An extractor that also takes a list of images of different sizes: each run of one size goes
    through the extractor as a batch. The pipeline resizes every image on its own, so the features
    are those of the same images in any batches; the digest is the extractor's own."""

    def __init__(self, inner: Extractor):
        self.inner = inner
        for attr in ("name", "family", "digest", "dims", "has_logits", "device"):
            setattr(self, attr, getattr(inner, attr))

    def __getattr__(self, name: str) -> object:  # the rest (source, key, model) as the inner one has it
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.inner.forward(images)

    def __call__(self, images: torch.Tensor | list[torch.Tensor]) -> dict[str, torch.Tensor]:
        if isinstance(images, torch.Tensor):
            return self.inner(images)
        runs: list[list[torch.Tensor]] = []
        for im in images:
            if runs and runs[-1][0].shape == im.shape:
                runs[-1].append(im)
            else:
                runs.append([im])
        parts = [self.inner(torch.stack(run)) for run in runs]
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def any_size(extractor: Extractor) -> AnySize:
    """`extractor`, taking lists of images of different sizes too (see AnySize)."""
    return extractor if isinstance(extractor, AnySize) else AnySize(extractor)
