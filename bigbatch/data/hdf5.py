"""DATA.h5: uint8 NHWC images and int64 labels in HDF5, written to a temporary file and renamed into
place, and read back by random access from local disk or an fsspec URL (s3://...)."""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import shlex
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import h5py
import numpy as np
import torch

from bigbatch.data.sources import url_fs
from bigbatch.errors import BigbatchError
from bigbatch.files import remove_stale
from bigbatch.urls import is_url, public_name

FORMAT = "bigbatch-images/1"
# Uncompressed chunks of at most about this many bytes, at least one image. H5Data reads each image's
# own bytes (the chunks only locate them); readers going through h5py pay one small chunk per image,
# and small images share chunks so that the chunk index stays small.
CHUNK_BYTES = 64 << 10
WRITE_ROWS = 256
# The blocks fsspec fetches while h5py walks a remote file's metadata.
REMOTE_BLOCK = 4 << 20


def content_hash(class_names: Sequence[str], groups: Sequence[tuple[tuple[int, ...], bytes, bytes]]) -> str:
    """sha256 of the class names and, per group of images in file order, its shape (N, H, W, C) and the
    sha256 digests of its image bytes and its int64 little-endian label bytes."""
    h = hashlib.sha256(json.dumps(list(class_names)).encode())
    for shape, image_digest, label_digest in groups:
        h.update("x".join(map(str, shape)).encode() + image_digest + label_digest)
    return "sha256:" + h.hexdigest()


def hash_arrays(class_names: Sequence[str], images: np.ndarray, labels: np.ndarray) -> str:
    """The content hash of one group held in RAM (as `prepare` would write it)."""
    labels = np.ascontiguousarray(labels, dtype="<i8")
    digests = (hashlib.sha256(np.ascontiguousarray(images)).digest(), hashlib.sha256(labels).digest())
    return content_hash(class_names, [(tuple(images.shape), *digests)])


class _GroupWriter:
    def __init__(self, f: h5py.File, name: str, shape: tuple[int, int, int]):
        self.name, self.shape = name, shape
        rows = max(1, CHUNK_BYTES // int(np.prod(shape)))
        g = f.require_group(name)
        self.images = g.create_dataset("images", (0, *shape), np.uint8, maxshape=(None, *shape), chunks=(rows, *shape))
        self.labels = g.create_dataset("labels", (0,), np.int64, maxshape=(None,), chunks=(1 << 14,))
        self.buf_images: list[np.ndarray] = []
        self.buf_labels: list[int] = []
        self.n = 0
        self.hash_images, self.hash_labels = hashlib.sha256(), hashlib.sha256()

    def add(self, image: np.ndarray, label: int) -> None:
        self.buf_images.append(image)
        self.buf_labels.append(label)
        if len(self.buf_images) >= WRITE_ROWS:
            self.flush()

    def flush(self) -> None:
        if not self.buf_images:
            return
        images = np.stack(self.buf_images)
        labels = np.asarray(self.buf_labels, dtype="<i8")
        m = self.n + len(labels)
        self.images.resize(m, axis=0)
        self.labels.resize(m, axis=0)
        self.images[self.n : m] = images
        self.labels[self.n : m] = labels
        self.hash_images.update(images)
        self.hash_labels.update(labels)
        self.n = m
        self.buf_images, self.buf_labels = [], []


class _WriteOnce(io.RawIOBase):
    """The file HDF5 writes through (h5py's fileobj driver). The first failed write (disk full, file
    size limit) is kept in `error` and every later write is dropped, so the HDF5 library can still
    close the file cleanly: a write error inside HDF5 itself leaves it in a state that crashes the
    interpreter at exit. The writer checks `error` and gives up on the file."""

    def __init__(self, path: Path):
        super().__init__()
        self.file, self.error = open(path, "w+b"), None

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        return self.file.seek(pos, whence)

    def tell(self) -> int:
        return self.file.tell()

    def readinto(self, buffer: Any) -> int:
        return self.file.readinto(buffer)

    def write(self, data: Any) -> int:
        if self.error is None:
            try:
                return self.file.write(data)
            except OSError as e:
                self.error = e
        return len(memoryview(data))

    def truncate(self, size: int | None = None) -> int:
        if self.error is None:
            try:
                return self.file.truncate(size)
            except OSError as e:
                self.error = e
        return self.file.tell() if size is None else size

    def flush(self) -> None:
        if self.error is None and not self.file.closed:
            try:
                self.file.flush()
                os.fsync(self.file.fileno())
            except OSError as e:
                self.error = e

    def close(self) -> None:
        super().close()
        self.file.close()


class H5Writer:
    """Appends images to a new data file under a temporary name; `commit()` moves it to `out`, so an
    interrupted prepare never leaves a file that looks complete. With `bucketed`, each image shape is
    its own group (aspect-ratio buckets); otherwise all images must share one shape."""

    def __init__(
        self,
        out: str,
        class_names: Sequence[str],
        attrs: dict[str, Any],
        bucketed: bool = False,
        storage_options: dict[str, Any] | None = None,
    ):
        self.out, self.class_names, self.attrs = str(out), list(class_names), dict(attrs)
        self.bucketed, self.storage_options = bucketed, storage_options
        self._tmpdir: str | None = None
        if is_url(self.out):
            self._tmpdir = tempfile.mkdtemp(prefix="bigbatch-prepare-")
            self.tmp = Path(self._tmpdir) / "data.h5"
        else:
            target = Path(self.out)
            target.parent.mkdir(parents=True, exist_ok=True)
            remove_stale(target.parent.glob(f".{glob.escape(target.name)}.partial-*"))  # of killed prepares
            self.tmp = target.with_name(f".{target.name}.partial-{os.getpid()}")
        # v110: the extensible-array chunk index, one lookup per random read however large the file.
        self.raw = _WriteOnce(self.tmp)
        self.f = h5py.File(self.raw, "w", libver=("v110", "latest"))
        self.groups: dict[tuple[int, ...], _GroupWriter] = {}

    def __enter__(self) -> H5Writer:
        return self

    def __exit__(self, kind: Any, *_: Any) -> None:
        if kind is not None:
            self.abort()

    @property
    def count(self) -> int:
        return sum(g.n + len(g.buf_labels) for g in self.groups.values())

    def add(self, image: np.ndarray, label: int) -> None:
        """Append one uint8 HxWxC image; the caller checks shapes when the file is not bucketed."""
        shape = tuple(image.shape)
        if shape not in self.groups:
            if self.groups and not self.bucketed:
                raise ValueError(f"image shape {shape} differs from {next(iter(self.groups))}")
            name = f"/buckets/{shape[0]}x{shape[1]}" if self.bucketed else "/"
            self.groups[shape] = _GroupWriter(self.f, name, shape)  # type: ignore[arg-type]
        self.groups[shape].add(image, label)
        self.check()

    def check(self) -> None:
        """Raise a BigbatchError naming the output and the OS error if a write has failed."""
        e = self.raw.error
        if e is not None:
            raise BigbatchError(
                f"cannot write {public_name(self.out)}: {e.strerror or e} (its partial file is removed); "
                "free space or choose another output, then prepare again"
            )

    def commit(self) -> dict[str, Any]:
        """Write the metadata, close, and move the file into place; returns the metadata."""
        for g in self.groups.values():
            g.flush()
        # Buckets ordered by aspect ratio (portrait to landscape), the order of their global indices.
        groups = sorted(self.groups.values(), key=lambda g: (g.shape[1] / g.shape[0], g.name))
        first = groups[0].shape if groups else (0, 0, 3)
        square = len(groups) == 1 and first[0] == first[1] and not self.bucketed
        meta = {
            "format": FORMAT,
            "count": sum(g.n for g in groups),
            "height": first[0] if len(groups) == 1 else 0,
            "width": first[1] if len(groups) == 1 else 0,
            "channels": first[2],
            "resolution": first[0] if square else 0,
            "class_names": self.class_names,
            "groups": [{"name": g.name, "count": g.n, "height": g.shape[0], "width": g.shape[1]} for g in groups],
            "content_hash": content_hash(
                self.class_names,
                [((g.n, *g.shape), g.hash_images.digest(), g.hash_labels.digest()) for g in groups],
            ),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **self.attrs,
        }
        for key, value in meta.items():
            self.f.attrs[key] = json.dumps(value) if isinstance(value, list | dict) else value
        self.f.close()
        self.raw.flush()  # fsync
        self.raw.close()
        self.check()
        try:
            if self._tmpdir is None:
                os.replace(self.tmp, self.out)
            else:
                fs, path = url_fs(self.out, self.storage_options)
                fs.put_file(str(self.tmp), path)  # an object store shows the object only once complete
        finally:
            self.abort()
        return meta

    def abort(self) -> None:
        """Close and delete the temporary file (after commit: only the temporary folder)."""
        try:
            self.f.close()
        except Exception:  # noqa: BLE001 -- already closed, or the failure we are cleaning up after
            pass
        self.raw.close()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
        else:
            self.tmp.unlink(missing_ok=True)


def _open_h5(path: str, storage_options: dict[str, Any] | None, sequential: bool = False) -> h5py.File:
    """The data file opened for reading, with a one-line error if it is missing or not HDF5.
    `sequential`: a remote file is streamed in big blocks (reading it all) rather than cached in small ones."""
    name = public_name(path)
    try:
        if is_url(path):
            fs, p = url_fs(path, storage_options)
            if sequential:
                handle = fs.open(p, "rb", block_size=64 << 20, cache_type="readahead")
            else:
                handle = fs.open(p, "rb", block_size=REMOTE_BLOCK, cache_type="blockcache")
            return h5py.File(handle, "r")
        if not Path(path).exists():
            raise FileNotFoundError(path)
        return h5py.File(path, "r")
    except BigbatchError:
        raise
    except FileNotFoundError:
        raise BigbatchError(
            f"cannot open data set '{name}': it does not exist "
            f"(write it with `bigbatch prepare SRC {shlex.quote(name)}`)"
        ) from None
    except Exception as e:  # noqa: BLE001 -- h5py, fsspec and botocore raise unrelated types
        raise BigbatchError(f"cannot open data set '{name}': {type(e).__name__}: {e}") from None


def read_meta(path: str | Path, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The metadata of a data file written by `prepare` (what `bigbatch info DATA.h5` prints)."""
    with _open_h5(str(path), storage_options) as f:
        return _meta(f, str(path))


def _meta(f: h5py.File, path: str) -> dict[str, Any]:
    attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
    if attrs.get("format") != FORMAT:
        raise BigbatchError(
            f"cannot open data set '{public_name(path)}': not a data file written by `bigbatch prepare` "
            f"(format {attrs.get('format')!r}, expected {FORMAT!r}); run `bigbatch prepare` on the images"
        )
    out: dict[str, Any] = {}
    try:
        for k, v in attrs.items():
            if k in ("class_names", "groups", "skipped_examples"):
                v = json.loads(v)
            elif isinstance(v, np.generic):
                v = v.item()
            out[k] = v
    except (ValueError, TypeError) as e:
        _damaged(path, f"its attribute {k} is not what prepare writes ({e})")
    _check_meta(out, path)
    return out


def _damaged(path: str, problem: str) -> NoReturn:
    raise BigbatchError(f"data file {public_name(path)} is damaged: {problem}; prepare it again")


def _check_meta(meta: dict[str, Any], path: str) -> None:
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


def _check_data(f: h5py.File, meta: dict[str, Any], path: str) -> None:
    """The metadata against what the file holds: each group's images and labels, of the recorded shapes."""
    for g in meta["groups"]:
        base = g["name"].rstrip("/")
        images, labels = f.get(base + "/images"), f.get(base + "/labels")
        shape = (g["count"], g["height"], g["width"], meta["channels"])
        if not isinstance(images, h5py.Dataset) or images.shape != shape or images.dtype != np.uint8:
            found = f"{images.shape} {images.dtype}" if isinstance(images, h5py.Dataset) else "nothing"
            _damaged(path, f"group {g['name']} should hold uint8 images of shape {shape}, holds {found}")
        if not isinstance(labels, h5py.Dataset) or labels.shape != (g["count"],) or labels.dtype.kind not in "iu":
            _damaged(path, f"group {g['name']} should hold {g['count']} integer labels")


def describe_data(path: str | Path, storage_options: dict[str, Any] | None = None) -> str:
    """A data file's metadata as a few lines of text."""
    m = read_meta(path, storage_options)
    names = m["class_names"]
    shapes = ", ".join(f"{g['height']}x{g['width']} ({g['count']})" for g in m["groups"])
    lines = [
        f"data        {public_name(str(path))}",
        f"images      {m['count']} uint8 NHWC, {m['channels']} channels, "
        + (f"{m['resolution']}px" if m["resolution"] else f"shapes {shapes}"),
        "classes     "
        + (f"{len(names)}: {', '.join(names[:10])}{', ...' if len(names) > 10 else ''}" if names else "none"),
        f"source      {m.get('source', '?')}",
        f"resize      {m.get('resize', '?')}",
        f"skipped     {m.get('skipped', 0)} files"
        + "".join(f"\n              {name}: {reason}" for name, reason in m.get("skipped_examples", [])),
        f"written     {m.get('created', '?')} by bigbatch {m.get('bigbatch_version', '?')}",
        f"content     {m['content_hash']}",
    ]
    return "\n".join(lines)


def verify_data(path: str | Path, storage_options: dict[str, Any] | None = None) -> str:
    """Recompute a data file's content hash from what it holds; raise if it differs from the one written
    at prepare time (a damaged or edited file). Returns the hash."""
    with _open_h5(str(path), storage_options, sequential=True) as f:
        meta = _meta(f, str(path))
        _check_data(f, meta, str(path))
        groups = []
        for g in meta["groups"]:
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
            f"data file {public_name(str(path))} is damaged: its content hash is {found}, not the "
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
    array: np.ndarray | None = None  # in-RAM copy


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


class H5Data:
    """A data file opened for training: the same interface as the built-in ImageData (`len`,
    `get(index) -> (uint8 NHWC, int64 labels)`, `n_classes`, `resolution`, `channels`, `class_names`,
    `source`) plus `content_hash`.

    Images are read by random access as byte ranges of the file: `os.preadv` locally, concurrent
    range requests for URLs. Nothing is held open across processes: each process (DataLoader worker,
    fork or spawn) opens its own handle on first use. `in_ram` reads all images once instead."""

    def __init__(self, path: str | Path, in_ram: bool = False, storage_options: dict[str, Any] | None = None):
        self.path, self.in_ram = str(path), in_ram
        self.storage_options = dict(storage_options or {})
        self.remote = is_url(self.path)
        self._pid, self._fd, self._fs, self._fs_path, self._h5 = -1, -1, None, "", None
        with _open_h5(self.path, self.storage_options) as f:
            self.meta = _meta(f, self.path)
            self.groups: list[_Group] = []
            labels, start = [], 0
            try:
                _check_data(f, self.meta, self.path)
                for g in self.meta["groups"]:
                    ds = f[g["name"].rstrip("/") + "/images"]
                    rows, offsets = _chunk_offsets(ds)
                    self.groups.append(_Group(ds.name, start, ds.shape[0], tuple(ds.shape[1:]), rows, offsets))
                    labels.append(np.asarray(f[g["name"].rstrip("/") + "/labels"][...], np.int64))
                    start += ds.shape[0]
            except (OSError, KeyError, ValueError, RuntimeError) as e:  # HDF5 internals that do not read back
                _damaged(self.path, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            self.labels = torch.from_numpy(np.concatenate(labels) if labels else np.zeros(0, np.int64))
        n = len(self.meta["class_names"])
        if len(self.labels) and (self.labels.min() < 0 or self.labels.max() >= max(n, 1)):
            _damaged(self.path, f"its labels run {int(self.labels.min())}..{int(self.labels.max())} for {n} classes")
        if in_ram:
            self._load_all()
        self._starts = np.array([g.start for g in self.groups], np.int64)

    def _load_all(self) -> None:
        with _open_h5(self.path, self.storage_options, sequential=True) as f:
            for g in self.groups:
                g.array = np.empty((g.count, *g.shape), np.uint8)
                if g.count:
                    f[g.path].read_direct(g.array)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_pid": -1, "_fd": -1, "_fs": None, "_h5": None}

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0 and self._pid == os.getpid():
            os.close(self._fd)

    def __repr__(self) -> str:  # never shows storage_options: they may hold credentials
        return f"H5Data({public_name(self.path)!r}, {len(self)} images, in_ram={self.in_ram})"

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
    def source(self) -> str:
        return public_name(self.path)

    @property
    def content_hash(self) -> str:
        return str(self.meta["content_hash"])

    @property
    def bucket_counts(self) -> list[int]:
        """Images per group (aspect-ratio bucket) in global index order: for BucketOrder."""
        return [g.count for g in self.groups]

    def _handles(self) -> None:
        """Open this process's handle on first use (a forked worker must not share its parent's)."""
        if self._pid == os.getpid():
            return
        self._pid, self._fd, self._fs, self._h5 = os.getpid(), -1, None, None
        if self.remote:
            self._fs, self._fs_path = url_fs(self.path, self.storage_options)
        elif any(g.chunk_offsets is not None for g in self.groups):
            self._fd = os.open(self.path, os.O_RDONLY)
        if any(g.chunk_offsets is None and g.array is None for g in self.groups):
            self._h5 = _open_h5(self.path, self.storage_options)

    def get(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Images (N, H, W, C) uint8 and labels (N,) int64 at the given indices, in their order; all
        indices must fall in one group (always so unless the file holds aspect-ratio buckets)."""
        idx = torch.as_tensor(index, dtype=torch.long).reshape(-1).numpy()
        if len(idx) and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"index out of range for {len(self)} images")
        gi = np.searchsorted(self._starts, idx, side="right") - 1 if len(idx) else np.zeros(0, np.int64)
        if len(idx) and (gi != gi[0]).any():
            raise BigbatchError(
                "one batch mixes images of different shapes (aspect-ratio buckets); read it in BucketOrder"
            )
        g = self.groups[int(gi[0])] if len(idx) else self.groups[0]
        rows = idx - g.start
        if g.array is not None:
            images = g.array[rows]
        else:
            self._handles()
            images = self._read_raw(g, rows) if g.chunk_offsets is not None else self._read_h5(g, rows)
        return torch.from_numpy(images), self.labels[torch.from_numpy(idx)]

    def _read_h5(self, g: _Group, rows: np.ndarray) -> np.ndarray:
        # h5py wants increasing, unique indices.
        unique, inverse = np.unique(rows, return_inverse=True)
        return self._h5[g.path][unique][inverse] if len(rows) else np.zeros((0, *g.shape), np.uint8)

    def _read_raw(self, g: _Group, rows: np.ndarray) -> np.ndarray:
        nbytes = int(np.prod(g.shape))
        out = np.empty((len(rows), nbytes), np.uint8)
        offsets = g.chunk_offsets[rows // g.chunk_rows] + (rows % g.chunk_rows) * nbytes
        # Images next to each other in the file are read as one range (sequential scans, small images).
        order = np.argsort(offsets, kind="stable")
        sorted_offsets = offsets[order]
        runs = np.split(np.arange(len(rows)), np.flatnonzero(np.diff(sorted_offsets) != nbytes) + 1)
        runs = [r for r in runs if len(r)]
        if self.remote:
            starts = [int(sorted_offsets[r[0]]) for r in runs]
            ends = [s + len(r) * nbytes for s, r in zip(starts, runs)]
            got = self._fs.cat_ranges([self._fs_path] * len(runs), starts, ends, on_error="raise")
            for r, data in zip(runs, got):
                out[order[r]] = np.frombuffer(data, np.uint8).reshape(len(r), nbytes)
        else:
            for r in runs:
                target = out[order[r[0]]] if len(r) == 1 else np.empty((len(r), nbytes), np.uint8)
                self._read_at(target, int(sorted_offsets[r[0]]))
                if len(r) > 1:
                    out[order[r]] = target
        return out.reshape(len(rows), *g.shape)

    def _read_at(self, target: np.ndarray, offset: int) -> None:
        """Fill `target` from the file at `offset` (positional reads: safe from several threads)."""
        view, done = memoryview(target).cast("B"), 0
        while done < len(view):
            n = os.preadv(self._fd, [view[done:]], offset + done)  # Linux and macOS; a read may come up short
            if n <= 0:
                raise BigbatchError(f"data file {self.path} is shorter than its index says: it is truncated")
            done += n
