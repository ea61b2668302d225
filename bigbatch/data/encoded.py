"""A data file group of encoded images (`prepare --codec jpeg|png|webp`): one byte stream of the images'
encoded bytes back to back (`encoded`, uint8, chunked), where each starts (`offsets`, N + 1 int64),
the size each decodes to (`sizes`, N x 2: h, w) and the labels; FFCV's layout, in HDF5 so that every
guarantee of the raw files holds. Here: its content hash, its checks, and reading images' bytes as
file byte ranges (adjacent images in one read); h5write.py writes it, hdf5.py decodes it."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import h5py
import numpy as np

CHUNK = 256 << 10  # bytes per chunk of the byte stream (allocated whole: a small file wastes at most one)


def digest_start(codec: str, quality: int) -> Any:
    """The content hash of encoded images starts from the codec, so that the same pixels stored raw,
    or at another quality, never hash alike."""
    return hashlib.sha256(f"{codec}:{quality}".encode())


def hash_encoded(h: Any, lengths: np.ndarray, stream: np.ndarray, sizes: np.ndarray) -> None:
    """Update `h` with images' encoded bytes, each preceded by its length and its stored size (h, w):
    where one image ends and the size crops are cut from are part of the content."""
    at = 0
    for n, (height, width) in zip(lengths.tolist(), sizes.tolist()):
        h.update(n.to_bytes(8, "little") + int(height).to_bytes(4, "little") + int(width).to_bytes(4, "little"))
        h.update(stream[at : at + n])
        at += n


def stored_elsewhere(f: h5py.File, base: str, names: tuple[str, ...]) -> str | None:
    """What makes a dataset `base/name` of `names` read bytes from outside the file (a link, external storage, a
    virtual dataset), or None: prepare writes none, and a file made to read, say, /etc/passwd as images would draw
    it into the run's sample sheets (found from outside)."""
    for name in names:
        node, path = f, f"{base}/{name}".strip("/")
        for part in path.split("/"):
            link = node.get(part, getlink=True)
            if link is None:
                break  # (missing: the shape checks say it)
            if not isinstance(link, h5py.HardLink):
                return f"{path} is a link ({type(link).__name__}), which bigbatch does not follow"
            node = node[part]
        if isinstance(node, h5py.Dataset) and (node.external or node.is_virtual):
            return (
                f"{path} keeps its bytes outside the file (external or virtual storage), which bigbatch does not read"
            )
    return None


def check_group(f: h5py.File, base: str, count: int) -> str | None:
    """What is wrong with an encoded group of `count` images, or None."""
    encoded, offsets = f.get(base + "/encoded"), f.get(base + "/offsets")
    sizes, labels = f.get(base + "/sizes"), f.get(base + "/labels")
    if not all(isinstance(d, h5py.Dataset) for d in (encoded, offsets, sizes, labels)):
        return f"group {base or '/'} should hold encoded, offsets, sizes and labels"
    if encoded.ndim != 1 or encoded.dtype != np.uint8:
        return f"group {base or '/'} should hold its encoded images as one byte stream"
    if offsets.shape != (count + 1,) or sizes.shape != (count, 2) or labels.shape != (count,):
        return f"group {base or '/'} should index {count} images"
    starts = np.asarray(offsets[...], np.int64)
    if starts[0] != 0 or (np.diff(starts) <= 0).any():
        return f"group {base or '/'} has image offsets out of order"
    if starts[-1] != encoded.shape[0]:
        return f"group {base or '/'} indexes {int(starts[-1])} bytes of images, holds {encoded.shape[0]}"
    if count and np.asarray(sizes[...]).min() < 1:
        return f"group {base or '/'} records an image size below 1 pixel"
    return None


def verify_group(f: h5py.File, base: str, codec: str, quality: int) -> tuple[bytes, bytes]:
    """(image digest, label digest) recomputed from what an encoded group holds."""
    offsets = np.asarray(f[base + "/offsets"][...], np.int64)
    sizes = np.asarray(f[base + "/sizes"][...], np.int64)
    encoded = f[base + "/encoded"]
    h = digest_start(codec, quality)
    block = 64 << 20
    first = 0
    while first < len(offsets) - 1:  # whole images, about `block` bytes at a time
        last = max(first + 1, int(np.searchsorted(offsets, offsets[first] + block, side="right")) - 1)
        last = min(last, len(offsets) - 1)
        stream = encoded[int(offsets[first]) : int(offsets[last])]
        hash_encoded(h, np.diff(offsets[first : last + 1]), stream, sizes[first:last])
        first = last
    labels = np.ascontiguousarray(f[base + "/labels"][...], dtype="<i8")
    return h.digest(), hashlib.sha256(labels).digest()


def byte_ranges(
    starts: np.ndarray, ends: np.ndarray, chunk: int, chunk_offsets: np.ndarray
) -> tuple[list[tuple[int, int]], list[list[tuple[int, int, int]]]]:
    """The file byte ranges that hold stream bytes [starts[i], ends[i]) of each image, merged where they
    touch (adjacent images, and an image's consecutive chunks, in one read); and per range, the pieces
    (image, position in the image, length) it holds, in range order."""
    pieces = []  # (file offset, length, image, position in image)
    for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist())):
        at = s
        while at < e:
            c = at // chunk
            n = min(e, (c + 1) * chunk) - at
            pieces.append((int(chunk_offsets[c]) + at - c * chunk, n, i, at - s))
            at += n
    pieces.sort()
    ranges: list[tuple[int, int]] = []
    parts: list[list[tuple[int, int, int]]] = []
    for offset, n, i, pos in pieces:
        if ranges and ranges[-1][1] == offset:
            ranges[-1] = (ranges[-1][0], offset + n)
        else:
            ranges.append((offset, offset + n))
            parts.append([])
        parts[-1].append((i, pos, n))
    return ranges, parts


def read_images(
    starts: np.ndarray,
    ends: np.ndarray,
    chunk: int,
    chunk_offsets: np.ndarray,
    read_ranges: Callable[[list[tuple[int, int]]], list[bytes | bytearray | memoryview]],
) -> list[memoryview | bytearray]:
    """Each image's encoded bytes, read as merged file ranges by `read_ranges`: a view of the range that
    holds it whole (no copy), or pieced together where chunks split it."""
    ranges, parts = byte_ranges(starts, ends, chunk, chunk_offsets)
    sizes = (ends - starts).tolist()
    out: list[Any] = [None] * len(sizes)
    for data, held in zip(read_ranges(ranges), parts):
        view, at = memoryview(data), 0
        for i, pos, n in held:
            if n == sizes[i]:
                out[i] = view[at : at + n]
            else:
                out[i] = bytearray(sizes[i]) if out[i] is None else out[i]
                out[i][pos : pos + n] = view[at : at + n]
            at += n
    return out
