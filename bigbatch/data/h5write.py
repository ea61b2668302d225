"""Writing a DATA.h5: images appended to a new file under a temporary name (raw uint8 groups, or encoded
ones in the layout of bigbatch/data/encoded.py), the content hash of what was written, and the rename
into place."""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from bigbatch.data import encoded as enc
from bigbatch.data.codecs import Encoded, encode
from bigbatch.errors import BigbatchError
from bigbatch.files import create_new, remove_stale
from bigbatch.urls import Location

FORMAT = "bigbatch-images/1"  # raw pixels
FORMAT_ENCODED = "bigbatch-images/2"  # encoded images (older readers refuse it by its format, not as damaged)
# Uncompressed chunks of at most about this many bytes, at least one image. H5Data reads each image's
# own bytes (the chunks only locate them); readers going through h5py pay one small chunk per image,
# and small images share chunks so that the chunk index stays small.
CHUNK_BYTES = 64 << 10
WRITE_ROWS = 256


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


class _Buffered:
    """A group being appended to: images and labels gathered WRITE_ROWS at a time, then `flush`ed."""

    def __init__(self, name: str, shape: tuple[int, int, int]):
        self.name, self.shape = name, shape
        self.names: list[str | None] = []  # each image's name in its source
        self.buf_images: list[Any] = []
        self.buf_labels: list[int] = []
        self.n = 0

    def add(self, image: Any, label: int) -> None:
        self.buf_images.append(image)
        self.buf_labels.append(label)
        if len(self.buf_images) >= WRITE_ROWS:
            self.flush()

    def flush(self) -> None:
        raise NotImplementedError


def _fit(expected: int | None, least: int, most: int) -> int:
    """A chunk's length: `most`, or where the file's images are known to be few (`expected`: rows, or bytes of
    their stream), the power of two that holds them, at least `least` (found from outside: HDF5 allocates a chunk
    whole, so a small set's file was several times its size)."""
    return most if expected is None else min(most, max(least, 1 << max(0, expected - 1).bit_length()))


class _GroupWriter(_Buffered):
    """Raw uint8 images of one shape."""

    def __init__(self, f: h5py.File, name: str, shape: tuple[int, int, int], expected: int | None):
        super().__init__(name, shape)
        rows = min(max(1, CHUNK_BYTES // int(np.prod(shape))), _fit(expected, 1, 1 << 14))
        g = f.require_group(name)
        self.images = g.create_dataset("images", (0, *shape), np.uint8, maxshape=(None, *shape), chunks=(rows, *shape))
        labels = _fit(expected, 64, 1 << 14)
        self.labels = g.create_dataset("labels", (0,), np.int64, maxshape=(None,), chunks=(labels,))
        self.hash_images, self.hash_labels = hashlib.sha256(), hashlib.sha256()

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


class _EncodedGroupWriter(_Buffered):
    """Encoded images as one byte stream with their offsets and stored sizes (bigbatch/data/encoded.py)."""

    def __init__(
        self, f: h5py.File, name: str, shape: tuple[int, int, int], codec: str, quality: int, expected: int | None
    ):
        super().__init__(name, shape)
        g = f.require_group(name)
        rows = _fit(expected, 64, 1 << 14)  # (the stream's chunk takes an image as an eighth of its pixels' bytes)
        pixels = int(np.prod(shape))  # (0 for --crop none's whole images, of sizes unknown: found by review, sized 0)
        stream = _fit(None if expected is None or not pixels else expected * pixels // 8, 1 << 12, enc.CHUNK)
        self.encoded = g.create_dataset("encoded", (0,), np.uint8, maxshape=(None,), chunks=(stream,))
        self.offsets = g.create_dataset("offsets", (1,), np.int64, maxshape=(None,), chunks=(rows,))
        self.sizes = g.create_dataset("sizes", (0, 2), np.int32, maxshape=(None, 2), chunks=(rows, 2))
        self.labels = g.create_dataset("labels", (0,), np.int64, maxshape=(None,), chunks=(rows,))
        self.end = 0
        self.hash_images, self.hash_labels = enc.digest_start(codec, quality), hashlib.sha256()

    def flush(self) -> None:
        if not self.buf_images:
            return
        lengths = np.array([len(e.data) for e in self.buf_images], np.int64)
        sizes = np.array([e.shape[:2] for e in self.buf_images], np.int64)
        stream = np.frombuffer(b"".join(e.data for e in self.buf_images), np.uint8)
        labels = np.asarray(self.buf_labels, dtype="<i8")
        m, end = self.n + len(labels), self.end + len(stream)
        self.encoded.resize(end, axis=0)
        self.encoded[self.end : end] = stream
        self.offsets.resize(m + 1, axis=0)
        self.offsets[self.n + 1 : m + 1] = self.end + np.cumsum(lengths)
        self.sizes.resize(m, axis=0)
        self.sizes[self.n : m] = sizes
        self.labels.resize(m, axis=0)
        self.labels[self.n : m] = labels
        enc.hash_encoded(self.hash_images, lengths, stream, sizes)
        self.hash_labels.update(labels)
        self.n, self.end = m, end
        self.buf_images, self.buf_labels = [], []


class _WriteOnce(io.RawIOBase):
    """The file HDF5 writes through (h5py's fileobj driver). The first failed write (disk full, file
    size limit) is kept in `error` and every later write is dropped, so the HDF5 library can still
    close the file cleanly: a write error inside HDF5 itself leaves it in a state that crashes the
    interpreter at exit. The writer checks `error` and gives up on the file."""

    def __init__(self, path: Path):
        super().__init__()
        self.file, self.error = create_new(path, "w+b"), None

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


class CannotWrite(BigbatchError):
    """The data file could not be written (`error`: the OS's): its partial file goes, and the parts, if any are
    whole, stay for the rerun (prepare_pool.parts_kept_unless_refused)."""

    def __init__(self, message: str, error: OSError):
        super().__init__(message)
        self.error = error


def cannot_write(out: Location, e: OSError, staging: str | None = None) -> CannotWrite:
    """What a prepare that cannot write `out` (or the parts it resumes from) says: its partial files go. `staging`:
    the local folder a URL's file is written in first (found from outside: a full /tmp was said of the bucket)."""
    if staging is not None:
        return CannotWrite(
            f"cannot write {out.name}'s local copy in {staging}: {e.strerror or e} (it is removed); the whole file "
            "is written there before its upload: free space there, or set TMPDIR to a folder with room for it, then "
            "prepare again",
            e,
        )
    return CannotWrite(
        f"cannot write {out.name}: {e.strerror or e} (its partial files are removed); "
        "free space or choose another output, then prepare again",
        e,
    )


class H5Writer:
    """Appends images to a new data file under a temporary name; `commit()` moves it to `out`, so an
    interrupted prepare never leaves a file that looks complete. With `bucketed`, each image shape is
    its own group (aspect-ratio buckets); otherwise all images must share one shape."""

    def __init__(
        self,
        out: str | os.PathLike | Location,
        class_names: Sequence[str],
        attrs: dict[str, Any],
        bucketed: bool = False,
        storage_options: dict[str, Any] | None = None,
        expected: int | None = None,
    ):
        self.out, self.class_names, self.attrs = Location.of(out), list(class_names), dict(attrs)
        self.expected = expected  # (images at most, if known: a small file's chunks are sized by it)
        self.bucketed, self.storage_options = bucketed, storage_options
        self.codec, self.quality = str(attrs.get("codec", "raw")), int(attrs.get("quality", 0))
        self.whole = attrs.get("crop") == "none"  # whole images of their own sizes, in one group
        self._tmpdir: str | None = None
        if self.out.url:  # (written here first; the folders of killed prepares go: found from outside, kept; of
            # this host's alone, whose processes it can see: a TMPDIR on storage nodes share, or another container's)
            host = socket.gethostname()
            remove_stale(Path(tempfile.gettempdir()).glob(f"bigbatch-prepare-*-{glob.escape(host)}-*"))
            self._tmpdir = tempfile.mkdtemp(prefix="bigbatch-prepare-", suffix=f"-{host}-{os.getpid()}")
            self.tmp = Path(self._tmpdir) / "data.h5"
        else:
            target = self.out.path
            target.parent.mkdir(parents=True, exist_ok=True)
            remove_stale(target.parent.glob(f".{glob.escape(target.name)}.partial-*"))  # of killed prepares
            self.tmp = target.with_name(f".{target.name}.partial-{os.getpid()}")
        # v110: the extensible-array chunk index, one lookup per random read however large the file.
        try:
            self.raw = _WriteOnce(self.tmp)
        except OSError as e:  # (a folder this user may not write, a read-only file system: the output's fault)
            raise OSError(e.errno, e.strerror, str(self.tmp) if self.out.url else self.out.name) from None
        self.f = h5py.File(self.raw, "w", libver=("v110", "latest"))
        self.groups: dict[tuple[int, ...], _GroupWriter | _EncodedGroupWriter] = {}
        self.arrays: dict[str, np.ndarray] = {}  # per-image arrays beside the images, in index order (e.g. "yaws")
        self.tables: dict[str, list[tuple[str, ...]]] = {}  # rows of text (e.g. "skipped": each file and why)

    def __enter__(self) -> H5Writer:
        return self

    def __exit__(self, kind: Any, *_: Any) -> None:
        if kind is not None:
            self.abort()

    @property
    def count(self) -> int:
        return sum(g.n + len(g.buf_labels) for g in self.groups.values())

    def add(self, image: np.ndarray | Encoded, label: int, name: str | None = None) -> None:
        """Append one uint8 HxWxC image (encoded here if the file's codec is not raw, unless it comes
        encoded), `name`d as its source names it (kept where every image has one: `names`, WebDataset's __key__);
        the caller checks shapes when the file is not bucketed."""
        if self.codec != "raw" and not isinstance(image, Encoded):
            image = encode(image, self.codec, self.quality)
        shape = (0, 0, 3) if self.whole else tuple(image.shape)
        if shape not in self.groups:
            if self.groups and not self.bucketed:
                raise ValueError(f"image shape {shape} differs from {next(iter(self.groups))}")
            group = f"/buckets/{shape[0]}x{shape[1]}" if self.bucketed else "/"
            if self.codec == "raw":
                self.groups[shape] = _GroupWriter(self.f, group, shape, self.expected)  # type: ignore[arg-type]
            else:
                self.groups[shape] = _EncodedGroupWriter(self.f, group, shape, self.codec, self.quality, self.expected)  # type: ignore[arg-type]
        self.groups[shape].add(image, label)  # type: ignore[arg-type]
        self.groups[shape].names.append(name)
        self.check()

    def check(self) -> None:
        """Raise a BigbatchError naming the output and the OS error if a write has failed."""
        e = self.raw.error
        if e is not None:
            raise cannot_write(self.out, e, str(Path(self._tmpdir).parent) if self._tmpdir else None)

    def commit(self) -> dict[str, Any]:
        """Write the metadata, close, and move the file into place; returns the metadata."""
        for g in self.groups.values():
            g.flush()
        # Buckets ordered by aspect ratio (portrait to landscape), the order of their global indices.
        groups = sorted(self.groups.values(), key=lambda g: (g.shape[1] / max(1, g.shape[0]), g.name))
        first = groups[0].shape if groups else (0, 0, 3)
        square = len(groups) == 1 and first[0] == first[1] and not self.bucketed
        meta = {
            "format": FORMAT if self.codec == "raw" else FORMAT_ENCODED,
            "count": sum(g.n for g in groups),
            "height": first[0] if len(groups) == 1 else 0,
            "width": first[1] if len(groups) == 1 else 0,
            "channels": first[2],
            "resolution": int(self.attrs.get("short_side", 0)) if self.whole else first[0] if square else 0,
            "class_names": self.class_names,
            "groups": [{"name": g.name, "count": g.n, "height": g.shape[0], "width": g.shape[1]} for g in groups],
            "content_hash": content_hash(
                self.class_names,
                [((g.n, *g.shape), g.hash_images.digest(), g.hash_labels.digest()) for g in groups],
            ),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **({} if self.codec == "raw" else {"encoded_bytes": sum(g.end for g in groups)}),  # type: ignore[union-attr]
            **self.attrs,
        }
        for key, value in meta.items():
            self.f.attrs[key] = json.dumps(value) if isinstance(value, list | dict) else value
        for name, array in self.arrays.items():
            if len(array) != meta["count"]:
                raise ValueError(f"{name} holds {len(array)} values for {meta['count']} images")
            self.f.create_dataset(name, data=array)
        for name, rows in self.tables.items():
            if rows:
                self.f.create_dataset(name, data=np.array(rows, dtype=object), dtype=h5py.string_dtype())
        names = [n for g in groups for n in g.names]  # (in index order: the buckets' order)
        if names and None not in names:  # their bytes one after another (as on disk: surrogates kept), compressed,
            # and where each ends (a long path costs its own bytes alone, where one length for all padded them)
            encoded = [n.encode(errors="surrogateescape") for n in names]
            ends = np.cumsum([len(n) for n in encoded], dtype=np.int64)
            blob = np.frombuffer(b"".join(encoded), np.uint8)
            for key, array in (("names", blob), ("name_ends", ends)):
                chunk = (max(1, min(len(array), 1 << 16)),)
                self.f.create_dataset(key, data=array, compression="gzip", chunks=chunk)
        self.f.close()
        self.raw.flush()  # fsync
        self.raw.close()
        self.check()
        try:
            if self._tmpdir is None:
                os.replace(self.tmp, self.out.path)
            else:
                fs, path = self.out.fs(self.storage_options)
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
