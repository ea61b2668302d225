"""DATA.h5: images (raw uint8 NHWC, or encoded: bigbatch/data/encoded.py) and int64 labels in HDF5, written to a
temporary file and renamed into place, and read back by random access from local disk or an fsspec URL (s3://...)."""

from __future__ import annotations

import hashlib
import math
import os
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import h5py
import numpy as np
import torch

from bigbatch.data import encoded as enc
from bigbatch.data import jpeg_region
from bigbatch.data.codecs import decode, decode_box
from bigbatch.data.crops import center_box, rrc_box
from bigbatch.data.device_decode import Encoded
from bigbatch.data.h5stamp import RemoteCheck, local_stamp, remote_stamp, same_file
from bigbatch.data.h5write import FORMAT, FORMAT_ENCODED, content_hash
from bigbatch.errors import BigbatchError
from bigbatch.files import json_loads
from bigbatch.urls import Location, unreachable, url_fix

# The blocks fsspec fetches while h5py walks a remote file's metadata.
REMOTE_BLOCK = 4 << 20


def open_h5(path: Location, storage_options: dict[str, Any] | None, sequential: bool = False) -> h5py.File:
    """The data file opened for reading, with a one-line error if it is missing or not HDF5.
    `sequential`: a remote file is streamed in big blocks (reading it all) rather than cached in small ones."""
    name = path.name
    try:
        if path.url:
            fs, p = path.fs(storage_options)
            if sequential:
                handle = fs.open(p, "rb", block_size=64 << 20, cache_type="readahead")
            else:
                handle = fs.open(p, "rb", block_size=REMOTE_BLOCK, cache_type="blockcache")
            # The file system lives as long as the file: a chained one (zip://DATA.h5::URL) closes the file it
            # reads from when it is collected.
            handle.bigbatch_fs = fs
            return h5py.File(handle, "r")
        if not path.path.exists():
            raise FileNotFoundError(path.text)
        if path.path.is_dir():
            raise BigbatchError(
                f"cannot open data set '{name}': it is a folder; give a DATA.h5 that `bigbatch prepare` wrote (a "
                f"folder of images becomes one with `bigbatch prepare {shlex.quote(name)} DATA.h5`)"
            )
        return h5py.File(path.path, "r")
    except BigbatchError:
        raise
    except FileNotFoundError as e:  # (a server that did not answer: found from outside, called missing)
        if path.url and (said := unreachable(e, f"data set '{name}'")):
            raise BigbatchError(said) from None
        # A run's config names its data as given: a relative path, run from another folder, misses it.
        here = "" if path.url or path.path.is_absolute() else f" in the current folder {os.getcwd()}"
        fix = "check the URL" if path.url else "give its path from here"  # (found from outside: "from here" of a URL)
        fix += f", or write it with `bigbatch prepare SRC {shlex.quote(name)}`"
        raise BigbatchError(f"cannot open data set '{name}': it does not exist{here} ({fix})") from None
    except PermissionError as e:
        hint = (
            "the object store refused the credentials (check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or "
            "AWS_PROFILE, and the bucket's access)"
            if path.url
            else "this user may not read it"
        )
        raise BigbatchError(f"cannot open data set '{name}': {hint}: {e}") from None
    except Exception as e:  # noqa: BLE001 -- h5py, fsspec and botocore raise unrelated types
        if "file signature not found" in str(e):
            raise BigbatchError(
                f"cannot open data set '{name}': not an HDF5 file (give a DATA.h5 that `bigbatch prepare` wrote)"
            ) from None
        if "truncated file" in str(e):  # h5py: "truncated file: eof = 3000, ..., stored_eof = 200013"
            cut = f"the file is cut short ({e}); copy it again, or write it again with `bigbatch prepare`"
            raise BigbatchError(f"cannot open data set '{name}': {cut}") from None
        said = " ".join(str(e).split())  # (HDF5's messages run over lines)
        if path.url and storage_options and isinstance(e, (TypeError, ValueError)):  # ("'int' object is not iterable"
            said += f" (the file system took data.storage_options {sorted(storage_options)}: check their values)"
        elif path.url and (fix := url_fix(e)):  # (from outside, both: the first for endpoint_url=5; an endpoint down)
            said += f" ({fix})"
        raise BigbatchError(f"cannot open data set '{name}': {type(e).__name__}: {said}") from None


def read_meta(path: str | Path | Location, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The metadata of a data file written by `prepare` (what `bigbatch info DATA.h5` prints)."""
    location = Location.of(path)
    with open_h5(location, storage_options) as f, readable(location):
        return _meta(f, location)


def read_skipped(path: str | Path | Location, storage_options: dict[str, Any] | None = None) -> list[list[str]] | None:
    """Every file a data file's prepare skipped, with why (`info --skipped`); None where the file keeps no list (one
    written before prepare kept them: its first five are in its metadata)."""
    location = Location.of(path)
    with open_h5(location, storage_options) as f, readable(location):
        if "skipped" not in f:
            return None if f.attrs.get("skipped", 0) else []
        return [[str(v) for v in row] for row in f["skipped"].asstr()[()].tolist()]


@contextmanager
def readable(path: Location) -> Iterator[None]:
    """HDF5's own failures to read what a data file holds, said as the file's damage in one line (found from
    outside: bytes overwritten inside a file gave a traceback, or a line that named neither the file nor a fix)."""
    try:
        yield
    except (RuntimeError, KeyError, OSError) as e:
        if isinstance(e, OSError) and (e.errno is not None or path.url):  # (the file system's or the network's own)
            raise
        said = " ".join(str(e.args[0] if isinstance(e, KeyError) and e.args else e).split())  # (over lines)
        raise BigbatchError(f"data file {path.name} is damaged: HDF5 reads {said!r}; prepare it again") from None


def _meta(f: h5py.File, path: Location) -> dict[str, Any]:
    attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
    if attrs.get("format") not in (FORMAT, FORMAT_ENCODED):
        raise BigbatchError(
            f"cannot open data set '{path.name}': not a data file written by `bigbatch prepare` "
            f"(format {attrs.get('format')!r}, expected {FORMAT!r} or {FORMAT_ENCODED!r}); run `bigbatch "
            "prepare` on the images (or a newer bigbatch)"
        )
    out: dict[str, Any] = {}
    try:
        for k, v in attrs.items():
            if k in ("class_names", "groups", "skipped_examples", "left_out", "class_counts"):
                v = json_loads(v)
            elif isinstance(v, np.generic):
                v = v.item()
            out[k] = v
    except (ValueError, TypeError) as e:
        _damaged(path, f"its attribute {k} is not what prepare writes ({e})")
    _check_meta(out, path)
    return out


def _damaged(path: Location, problem: str) -> NoReturn:
    raise BigbatchError(f"data file {path.name} is damaged: {problem}; prepare it again")


def _check_meta(meta: dict[str, Any], path: Location) -> None:
    """The metadata's own consistency: the keys prepare writes, of their types, the counts adding up."""

    def count(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    for key in ("count", "channels", "resolution", "height", "width"):
        if not count(meta.get(key)):
            _damaged(path, f"its attribute {key} is {meta.get(key)!r}, not a count")
    names, groups = meta.get("class_names"), meta.get("groups")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        _damaged(path, "its attribute class_names is not a list of names")
    if not isinstance(meta.get("content_hash"), str):
        _damaged(path, "its attribute content_hash is missing")
    keys = {"name": str, "count": int, "height": int, "width": int}
    if not isinstance(groups, list) or not all(
        isinstance(g, dict) and all(isinstance(g.get(k), t) for k, t in keys.items()) for g in groups
    ):
        _damaged(path, "its attribute groups is not a list of {name, count, height, width}")
    if sum(g["count"] for g in groups) != meta["count"]:
        _damaged(path, f"its attribute count is {meta['count']}, but its groups hold {sum(g['count'] for g in groups)}")


def _check_data(f: h5py.File, meta: dict[str, Any], path: Location) -> None:
    """The metadata against what the file holds: each group's images and labels, of the recorded shapes."""
    for g in meta["groups"]:
        base = g["name"].rstrip("/")
        if problem := enc.stored_elsewhere(f, base, ("images", "labels", "encoded", "offsets", "sizes")):
            _damaged(path, problem)
        if meta.get("codec", "raw") != "raw":
            problem = enc.check_group(f, base, g["count"])
            if problem:
                _damaged(path, problem)
            continue
        images, labels = f.get(base + "/images"), f.get(base + "/labels")
        shape = (g["count"], g["height"], g["width"], meta["channels"])
        if not isinstance(images, h5py.Dataset) or images.shape != shape or images.dtype != np.uint8:
            found = f"{images.shape} {images.dtype}" if isinstance(images, h5py.Dataset) else "nothing"
            _damaged(path, f"group {g['name']} should hold uint8 images of shape {shape}, holds {found}")
        if not isinstance(labels, h5py.Dataset) or labels.shape != (g["count"],) or labels.dtype.kind not in "iu":
            _damaged(path, f"group {g['name']} should hold {g['count']} integer labels")


def verify_data(path: str | Path | Location, storage_options: dict[str, Any] | None = None) -> str:
    """Recompute a data file's content hash from what it holds; raise if it differs from the one written
    at prepare time (a damaged or edited file). Returns the hash."""
    path = Location.of(path)
    with open_h5(path, storage_options, sequential=True) as f:
        meta = _meta(f, path)
        _check_data(f, meta, path)
        groups = []
        for g in meta["groups"]:
            if meta.get("codec", "raw") != "raw":
                shape = (g["count"], g["height"], g["width"], meta["channels"])
                groups.append((shape, *enc.verify_group(f, g["name"].rstrip("/"), meta["codec"], meta["quality"])))
                continue
            images, labels = f[g["name"].rstrip("/") + "/images"], f[g["name"].rstrip("/") + "/labels"]
            h = hashlib.sha256()
            rows = max(1, (64 << 20) // max(1, int(np.prod(images.shape[1:]))))
            for i in range(0, images.shape[0], rows):
                h.update(np.ascontiguousarray(images[i : i + rows]))
            digest = hashlib.sha256(np.ascontiguousarray(labels[...], dtype="<i8")).digest()
            groups.append((images.shape, h.digest(), digest))
    found = content_hash(meta["class_names"], groups)
    if found != meta["content_hash"]:
        raise BigbatchError(
            f"data file {path.name} is damaged: its content hash is {found}, not the "
            f"{meta['content_hash']} written by prepare; prepare it again"
        )
    return found


@dataclass
class _Group:
    path: str  # HDF5 path of the images dataset
    start: int  # global index of its first image
    count: int
    shape: tuple[int, int, int]
    chunk_rows: int
    chunk_offsets: np.ndarray | None  # file byte offset per chunk; None: read through h5py
    array: np.ndarray | None = None  # in-RAM copy (encoded: the byte stream)
    offsets: np.ndarray | None = None  # encoded: where each image starts in the byte stream (N + 1)
    sizes: np.ndarray | None = None  # encoded: each image's stored (h, w)

    def sizes_of(self, rows: np.ndarray) -> np.ndarray:
        """The stored (h, w) of the images at `rows` (n, 2): their own, or the group's shape."""
        return self.sizes[rows] if self.sizes is not None else np.tile(self.shape[:2], (len(rows), 1))


def _chunk_offsets(ds: h5py.Dataset) -> tuple[int, np.ndarray | None]:
    """(rows per chunk, byte offset of each chunk) when the images can be read as plain byte ranges."""
    n = ds.shape[0]
    if ds.id.get_create_plist().get_nfilters() or n == 0:
        return 1, None
    if ds.chunks is None:
        offset = ds.id.get_offset()
        return max(n, 1), None if offset is None else np.array([offset], np.int64)
    rows = ds.chunks[0]
    offsets = np.full(-(-n // rows), -1, np.int64)

    def visit(info: Any) -> None:
        offsets[info.chunk_offset[0] // rows] = info.byte_offset

    ds.id.chunk_iter(visit)
    return rows, None if (offsets < 0).any() else offsets


def _index(f: h5py.File, meta: dict[str, Any], location: Location) -> tuple[list[_Group], torch.Tensor]:
    """Where a data file's images lie (a _Group per shape: its rows, chunks and, encoded, each image's bytes and
    size), and every image's label, in global index order; a file whose layout does not read back is damaged."""
    encoded = meta.get("codec", "raw") != "raw"
    groups: list[_Group] = []
    labels, start = [], 0
    try:
        _check_data(f, meta, location)
        for g in meta["groups"]:
            base = g["name"].rstrip("/")
            shape = (g["height"], g["width"], meta["channels"])
            if encoded:
                ds = f[base + "/encoded"]
                rows, offsets = _chunk_offsets(ds)
                group = _Group(ds.name, start, g["count"], shape, rows, offsets)
                group.offsets = np.asarray(f[base + "/offsets"][...], np.int64)
                group.sizes = np.asarray(f[base + "/sizes"][...], np.int64)
            else:
                ds = f[base + "/images"]
                rows, offsets = _chunk_offsets(ds)
                group = _Group(ds.name, start, ds.shape[0], tuple(ds.shape[1:]), rows, offsets)
            groups.append(group)
            labels.append(np.asarray(f[base + "/labels"][...], np.int64))
            start += g["count"]
    except (OSError, KeyError, ValueError, RuntimeError) as e:  # HDF5 internals that do not read back
        _damaged(location, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return groups, torch.from_numpy(np.concatenate(labels) if labels else np.zeros(0, np.int64))


def _yaws(f: h5py.File, meta: dict[str, Any], location: Location) -> np.ndarray | None:
    """Each face's yaw (float32, index order) where prepare kept them (aligned DFL faces), else None."""
    if "yaws" not in f:
        return None
    try:
        yaws = np.asarray(f["yaws"][...], np.float32)
    except (OSError, KeyError, ValueError, RuntimeError) as e:
        _damaged(location, f"its yaws do not read ({type(e).__name__})")
    if yaws.shape != (meta["count"],) or not np.isfinite(yaws).all():
        _damaged(location, f"its yaws hold {yaws.shape} values for {meta['count']} images, or not finite ones")
    return yaws


def _fd_of(f: h5py.File) -> int | None:
    """The descriptor h5py reads a local file through, or None (another driver)."""
    try:
        return int(f.id.get_vfd_handle())
    except Exception:  # noqa: BLE001 -- (a driver without one)
        return None


class _Reader:
    """One process's access to a data file's bytes: positional reads of a local file, concurrent range
    requests of a URL, h5py for a layout only it reads (filters, or no chunk index). Made on first use in each
    process: a forked worker must not share its parent's handles."""

    def __init__(
        self, location: Location, storage_options: dict[str, Any], groups: list[_Group], stamp: tuple | None = None
    ):
        self.location, self.pid, self.fd, self.fs, self.fs_path, self.h5 = location, os.getpid(), -1, None, "", None
        self.check: RemoteCheck | None = None
        if location.url:
            self.fs, self.fs_path = location.fs(storage_options)
            self.check = RemoteCheck(location, self.fs, self.fs_path, stamp)
        elif any(g.chunk_offsets is not None for g in groups):
            self.fd = os.open(location.path, os.O_RDONLY)
            same_file(location, local_stamp(self.fd), stamp)
        if any(g.chunk_offsets is None and g.array is None for g in groups):
            self.h5 = open_h5(location, storage_options)
            same_file(location, None if location.url else local_stamp(_fd_of(self.h5)), stamp)  # (a URL's: above)

    def __del__(self) -> None:
        if getattr(self, "fd", -1) >= 0 and self.pid == os.getpid():
            os.close(self.fd)

    def images(self, g: _Group, rows: np.ndarray) -> np.ndarray:
        """Raw images at `rows` of group `g` (N, H, W, C)."""
        if g.chunk_offsets is None:  # h5py wants increasing, unique indices
            unique, inverse = np.unique(rows, return_inverse=True)
            return self.h5[g.path][unique][inverse] if len(rows) else np.zeros((0, *g.shape), np.uint8)
        nbytes = int(np.prod(g.shape))
        out = np.empty((len(rows), nbytes), np.uint8)
        offsets = g.chunk_offsets[rows // g.chunk_rows] + (rows % g.chunk_rows) * nbytes
        # Images next to each other in the file are read as one range (sequential scans, small images).
        order = np.argsort(offsets, kind="stable")
        sorted_offsets = offsets[order]
        runs = np.split(np.arange(len(rows)), np.flatnonzero(np.diff(sorted_offsets) != nbytes) + 1)
        runs = [r for r in runs if len(r)]
        ranges = [(int(sorted_offsets[r[0]]), int(sorted_offsets[r[0]]) + len(r) * nbytes) for r in runs]
        for r, data in zip(runs, self.ranges(ranges)):
            out[order[r]] = np.frombuffer(data, np.uint8).reshape(len(r), nbytes)
        return out.reshape(len(rows), *g.shape)

    def encoded(self, g: _Group, starts: np.ndarray, ends: np.ndarray) -> list[Any]:
        """The bytes [starts[i], ends[i]) of group `g`'s byte stream, an image each."""
        if g.chunk_offsets is not None:
            return enc.read_images(starts, ends, g.chunk_rows, g.chunk_offsets, self.ranges)
        return [self.h5[g.path][s:e].tobytes() for s, e in zip(starts.tolist(), ends.tolist())]

    def ranges(self, ranges: list[tuple[int, int]]) -> list[Any]:
        """File byte ranges, as concurrent range requests (remote) or positional reads (local)."""
        if self.fs is not None:
            if self.check is not None:  # (made with self.fs: a URL's)
                self.check()
            starts, ends = [a for a, _ in ranges], [b for _, b in ranges]
            return self.fs.cat_ranges([self.fs_path] * len(ranges), starts, ends, on_error="raise")
        out = []
        for a, b in ranges:
            buffer = np.empty(b - a, np.uint8)
            self._read_at(buffer, a)
            out.append(buffer)
        return out

    def _read_at(self, target: np.ndarray, offset: int) -> None:
        """Fill `target` from the file at `offset` (positional reads: safe from several threads)."""
        view, done = memoryview(target).cast("B"), 0
        while done < len(view):
            n = os.preadv(self.fd, [view[done:]], offset + done)  # Linux and macOS; a read may come up short
            if n <= 0:
                raise BigbatchError(f"data file {self.location.name} is shorter than its index says: it is truncated")
            done += n


class H5Data:
    """A data file opened for training: the same interface as the built-in ImageData (`len`,
    `get(index) -> (uint8 NHWC, int64 labels)`, `n_classes`, `resolution`, `channels`, `class_names`,
    `source`) plus `content_hash`.

    Images are read by random access as byte ranges of the file: `os.preadv` locally, concurrent
    range requests for URLs. Nothing is held open across processes: each process (DataLoader worker,
    fork or spawn) opens its own handle on first use. `in_ram` reads all images once instead."""

    def __init__(
        self, path: str | Path | Location, in_ram: bool = False, storage_options: dict[str, Any] | None = None
    ):
        self.location, self.in_ram = Location.of(path), in_ram
        self.storage_options = dict(storage_options or {})
        self._reader: _Reader | None = None
        with open_h5(self.location, self.storage_options) as f, readable(self.location):
            if self.location.url:  # (its ETag: found from outside, an object replaced as a run read it, unsaid)
                self._stamp = remote_stamp(*self.location.fs(self.storage_options))
            else:
                self._stamp = local_stamp(_fd_of(f))
            self.meta = _meta(f, self.location)
            self.encoded = self.meta.get("codec", "raw") != "raw"
            self.whole = self.meta.get("crop") == "none"  # whole images, cropped as they are read
            self.groups, self.labels = _index(f, self.meta, self.location)
            self.yaws = _yaws(f, self.meta, self.location)
        n = len(self.meta["class_names"])
        if len(self.labels) and (self.labels.min() < 0 or self.labels.max() >= max(n, 1)):
            low, high = int(self.labels.min()), int(self.labels.max())
            _damaged(self.location, f"its labels run {low}..{high} for {n} classes")
        if in_ram:
            self._load_all()
        self._starts = np.array([g.start for g in self.groups], np.int64)

    def _load_all(self) -> None:
        with open_h5(self.location, self.storage_options, sequential=True) as f, readable(self.location):
            same_file(self.location, None if self.location.url else local_stamp(_fd_of(f)), self._stamp)
            for g in self.groups:
                g.array = np.empty(f[g.path].shape if self.encoded else (g.count, *g.shape), np.uint8)
                if g.array.size:
                    f[g.path].read_direct(g.array)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_reader": None}

    def verify(self) -> str:
        """`verify_data` of this file: its content hash recomputed from what it holds (a BigbatchError if an edit
        or damage changed it since prepare)."""
        return verify_data(self.location, self.storage_options)

    def __repr__(self) -> str:  # never shows storage_options: they may hold credentials
        return f"H5Data({self.location.name!r}, {len(self)} images, in_ram={self.in_ram})"

    def __len__(self) -> int:
        return int(self.meta["count"])

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    @property
    def class_names(self) -> list[str]:
        return list(self.meta["class_names"])

    @property
    def resolution(self) -> int:
        """Side of the square images, 0 when they are not all square of one size."""
        return int(self.meta["resolution"])

    @property
    def channels(self) -> int:
        return int(self.meta["channels"])

    @property
    def path(self) -> str:
        """The file's path or URL, as given (file:// dropped)."""
        return self.location.text

    @property
    def source(self) -> str:
        return self.location.name

    @property
    def content_hash(self) -> str:
        return str(self.meta["content_hash"])

    @property
    def bucket_counts(self) -> list[int]:
        """Images per group (aspect-ratio bucket) in global index order: for BucketOrder."""
        return [g.count for g in self.groups]

    def _bytes(self) -> _Reader:
        """This process's reader of the file (made on first use in each process)."""
        if self._reader is None or self._reader.pid != os.getpid():
            self._reader = _Reader(self.location, self.storage_options, self.groups, self._stamp)
        return self._reader

    def get(self, index: torch.Tensor, resolution: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Images (N, H, W, C) uint8 and labels (N,) int64 at the given indices, in their order; all
        indices must fall in one group (always so unless the file holds aspect-ratio buckets).
        `resolution`: what the caller resizes them to next; an encoded file may then decode them at a
        reduced size no smaller than it (JPEG's DCT scaling). Raw files return them as stored."""
        idx = torch.as_tensor(index, dtype=torch.long).reshape(-1).numpy()
        if len(idx) and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"index out of range for {len(self)} images")
        g = self._group_of(idx)
        rows = idx - g.start
        if self.encoded:
            return self._decoded(g, rows, idx, resolution), self.labels[torch.from_numpy(idx)]
        images = g.array[rows] if g.array is not None else self._bytes().images(g, rows)
        return torch.from_numpy(images), self.labels[torch.from_numpy(idx)]

    def crop_boxes(self, index: torch.Tensor, draws: torch.Tensor, min_scale: float) -> list:
        """The random-resized crops (left, top, w, h) that `draws` make of the images at `index` as stored."""
        sizes = self.stored_sizes(index)
        return [rrc_box(int(w), int(h), d, min_scale) for (h, w), d in zip(sizes, draws)]

    def crops_decode_partially(self) -> bool:
        """A JPEG file with restart markers (its first image says): a crop decodes only its own MCUs
        (jpeg_region). Files prepared before bigbatch wrote the markers are decoded whole."""
        if self.meta.get("codec") != "jpeg" or not len(self):
            return False
        first = self._encoded_bytes(self.groups[0], np.zeros(1, np.int64))[0]
        layout = jpeg_region.layout(first)
        return layout is not None and layout.interval > 0

    def stored_sizes(self, index: torch.Tensor) -> np.ndarray:
        """The stored (h, w) of the images at `index` (of one group: a file of whole images is one)."""
        idx = torch.as_tensor(index, dtype=torch.long).reshape(-1).numpy()
        g = self._group_of(idx)
        return g.sizes_of(idx - g.start)

    def _group_of(self, idx: np.ndarray) -> _Group:
        """The group of the images at `idx` (a batch's, which reads one; whole images are one group)."""
        groups = np.searchsorted(self._starts, idx, side="right") - 1 if len(idx) else np.zeros(1, np.int64)
        if (groups != groups[0]).any():
            raise BigbatchError(
                "one batch mixes images of different shapes (aspect-ratio buckets); read it in BucketOrder"
            )
        return self.groups[int(groups[0])]

    def get_regions(
        self, index: torch.Tensor, boxes: list, out: int | tuple[int, int], placed: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """An encoded file (of whole images, or of squares: of one group): the regions `boxes` (left, top, w, h,
        in each stored image's pixels) of the images at `index`, each decoded no larger than it needs and resized
        to `out` (a side, or (h, w)), `placed` as codecs.decode_box says; and their labels."""
        idx = torch.as_tensor(index, dtype=torch.long).reshape(-1).numpy()
        g = self._group_of(idx)
        images = self._decoded(g, idx - g.start, idx, 0, boxes, out, placed)
        return images, self.labels[torch.from_numpy(idx)]

    def _decoded(
        self,
        g: _Group,
        rows: np.ndarray,
        idx: np.ndarray,
        resolution: int,
        boxes: list | None = None,
        out: int | tuple[int, int] = 0,
        placed: bool = True,
    ) -> torch.Tensor:
        assert g.offsets is not None
        out = out or resolution or self.resolution
        if self.whole and not out:
            raise BigbatchError(f"data file {self.source} holds whole images of their own sizes: give a resolution")
        if self.whole and boxes is None:  # the center square
            boxes = [center_box(int(w), int(h)) for h, w in g.sizes[rows]]  # type: ignore[index]
        data = self._encoded_bytes(g, rows)
        jpeg = self.meta.get("codec") == "jpeg"
        sizes = g.sizes_of(rows).tolist()
        images = []
        for k, (i, d) in enumerate(zip(idx.tolist(), data)):
            try:
                if boxes is not None:
                    images.append(decode_box(d, sizes[k], boxes[k], out, jpeg, placed))
                else:
                    images.append(decode(d, sizes[k], resolution, jpeg))
            except Exception as e:  # noqa: BLE001 -- decoders raise many types on corrupt bytes
                raise BigbatchError(
                    f"data file {self.source}: image {i} does not decode ({type(e).__name__}: {e}); the file "
                    "is damaged (bigbatch info --verify says more): prepare it again"
                ) from None
        if not images:
            shape = (out, out) if isinstance(out, int) else out
            cut = self.whole or boxes is not None
            return torch.zeros((0, *shape, g.shape[2]) if cut else (0, *g.shape), dtype=torch.uint8)
        return torch.from_numpy(np.stack(images))

    def _encoded_bytes(self, g: _Group, rows: np.ndarray) -> list[Any]:
        """The encoded bytes of the images at `rows` of group `g`."""
        assert g.offsets is not None
        starts, ends = g.offsets[rows], g.offsets[rows + 1]
        if g.array is not None:
            return [memoryview(g.array)[s:e] for s, e in zip(starts.tolist(), ends.tolist())]
        return self._bytes().encoded(g, starts, ends)

    def get_encoded(
        self, index: torch.Tensor, boxes: list | None = None, out: int | tuple[int, int] = 0
    ) -> tuple[Encoded, torch.Tensor]:
        """data.decode = "gpu": the images at `index` (of one group) as their encoded bytes, with the
        region of each to cut (`boxes`; default: a whole image's center square, a square's all of it)
        and the output size (default: the file's resolution), for `device_decode.decode`; and labels."""
        if not self.encoded:
            raise BigbatchError(f'data file {self.source} is raw: data.decode = "gpu" decodes encoded files')
        idx = torch.as_tensor(index, dtype=torch.long).reshape(-1).numpy()
        g = self._group_of(idx)
        rows = idx - g.start
        sizes = g.sizes_of(rows)
        if boxes is None:
            boxes = [center_box(int(w), int(h)) if self.whole else (0, 0, int(w), int(h)) for h, w in sizes]
        out = out or self.resolution
        shape = (out, out) if isinstance(out, int) else tuple(out)
        data = [np.frombuffer(d, np.uint8) for d in self._encoded_bytes(g, rows)]
        if self.meta.get("codec") == "jpeg":  # only each region's MCUs (jpeg_region), for less to decode
            boxes = list(boxes)
            for k, (left, top, w, h) in enumerate(boxes):
                part = jpeg_region.region(data[k], (int(left), int(top), math.ceil(left + w), math.ceil(top + h)))
                if part is not None:
                    data[k], sizes[k] = np.frombuffer(part.data, np.uint8), (part.height, part.width)
                    boxes[k] = (left - part.left, top - part.top, w, h)
        return Encoded(data, sizes, boxes, shape, None), self.labels[torch.from_numpy(idx)]
