"""`bigbatch prepare`: any collection of images (folder, zip, s3://..., builtin:NAME) into one checked
DATA.h5, decoded in parallel worker processes, bad files skipped and reported."""

from __future__ import annotations

import errno
import hashlib
import multiprocessing
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bigbatch.data import codecs
from bigbatch.data.h5write import H5Writer, cannot_write
from bigbatch.data.parts import PART, Parts, Result
from bigbatch.data.schedule import BUCKET_RATIOS
from bigbatch.data.sources import (
    RESIZE,
    Listing,
    decode_mask,
    decode_or_reason,
    file_stamp,
    list_source,
    url_fs,
)
from bigbatch.errors import BigbatchError, warn
from bigbatch.signals import die_with_parent
from bigbatch.urls import WHERE_CREDENTIALS_GO, is_url, option_credentials, public_name, refuse_credentials

CHUNK = 32  # files per task sent to a worker: big enough to amortise the hand-off, small enough to balance
SHOWN = 5  # skipped files named in the report
FETCHERS = 4  # threads fetching chunks of a remote source at once (each chunk's files concurrently too)


@dataclass
class Report:
    """What `prepare` wrote and what it skipped."""

    out: str
    count: int
    shape: tuple[int, ...]
    class_names: list[str]
    source: str
    content_hash: str
    seconds: float
    workers: int
    skipped: list[tuple[str, str]] = field(default_factory=list)
    resumed: int = 0  # files whose results an interrupted prepare of the same command had kept
    empty_folders: list[str] = field(default_factory=list)  # class folders without an image file: not classes

    @property
    def images_per_s(self) -> float:
        return self.count / max(self.seconds, 1e-9)

    def summary(self) -> str:
        """A few lines for the terminal: what was written, and the first skipped files with reasons."""
        classes = f"{len(self.class_names)} classes" if self.class_names else "unconditional (no classes)"
        shape = "x".join(map(str, self.shape)) if self.shape else "of several shapes"
        lines = [
            f"wrote {self.out}: {self.count} images {shape}, {classes}, from {self.source} "
            f"in {self.seconds:.1f} s ({self.images_per_s:.0f} img/s, {self.workers} workers)",
            f"content {self.content_hash}",
        ]
        if self.resumed:
            lines.insert(1, f"resumed: {self.resumed} files as an interrupted prepare of this command had decoded them")
        if self.empty_folders:
            shown = ", ".join(self.empty_folders[:SHOWN]) + (", ..." if len(self.empty_folders) > SHOWN else "")
            lines.append(f"{len(self.empty_folders)} folders hold no image files, so they are not classes: {shown}")
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)} files (--strict: an error instead):")
            lines += [f"  {name}: {reason}" for name, reason in self.skipped[:SHOWN]]
            if len(self.skipped) > SHOWN:
                lines.append(f"  ... and {len(self.skipped) - SHOWN} more")
        return "\n".join(lines)


def default_workers() -> int:
    """The CPU cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def prepare(
    src: str,
    out: str,
    resolution: int | None = None,
    workers: int | None = None,
    limit: int | None = None,
    strict: bool = False,
    storage_options: dict[str, Any] | None = None,
    buckets: bool = False,
    progress: bool = False,
    masks: str | None = None,
    eyes_mouth: str | None = None,
    codec: str = "raw",
    quality: int | None = None,
    crop: str = "center",
    labels: str | None = None,
    classes: str | None = None,
    overwrite: bool = False,
) -> Report:
    """Write the images of `src` to the data file `out` (a local .h5 path or a URL to one).

    src: a folder (each sub-folder a class, named after it; no sub-folders: unconditional), a .zip of
    such a folder, an fsspec URL (s3://bucket/prefix; credentials from `storage_options` or the
    environment), or builtin:NAME. `resolution`: center-crop to square and resize to this side
    (LANCZOS); None keeps the images' size, which must then be the same for all. `buckets`: crop
    each image to the nearest aspect ratio of BUCKET_RATIOS instead of a square, about resolution**2
    pixels, stored by bucket. `limit`: use this many files, spread evenly over the listing.
    `strict`: a file that is not a usable image is an error instead of being skipped.
    `masks` (the swap task's face masks, a fourth channel): "alpha" keeps each image's transparency
    (opaque where it has none), "dfl" takes the mask a DeepFaceLab aligned face carries (its XSeg
    mask, else its landmarks' hull), or a local folder holds a greyscale mask per image under the same
    relative name (any image extension: faces/a.jpg -> MASKS/faces/a.png). `eyes_mouth`: a folder of
    eyes-and-mouth masks the same way, or "dfl" (from the landmarks, with masks "dfl"), a fifth
    channel (needs `masks`). An image without its mask is skipped (an error with `strict`).
    `codec`: "raw" stores the pixels; "jpeg", "png" or "webp" each image's encoded bytes (`quality`
    for jpeg and webp, default 90), encoded in the decoding processes. `crop`: "center" crops to the
    square (or bucket) as above; "none" keeps each image whole, its short side scaled down to
    `resolution` (smaller ones as they are), for random-resized crops of the whole image in training
    and each image's own aspect ratio in validation (an encoded codec only: sizes differ).
    `labels`: a CSV of `file,label` rows labelling the source's files (ImageNet's flat validation
    folder), class indices in the order of `classes` (the training data file's class names; else the
    labels' names sorted). A file without a label is skipped and listed, and so is a labelled file
    the source lacks (an error with `strict`). An existing `out` is refused unless `overwrite`."""
    start = time.perf_counter()
    quality = codecs.check(codec, quality, 4 if masks else None)
    if crop not in ("center", "none"):
        raise BigbatchError(f"--crop must be center or none, got {crop!r}")
    whole = crop == "none"
    if whole and codec == "raw":
        raise BigbatchError("--crop none keeps each image's own size, which raw storage cannot: add --codec jpeg")
    if whole and buckets:
        raise BigbatchError("--crop none keeps every aspect ratio already: drop --buckets")
    if whole and resolution is None:
        raise BigbatchError("--crop none needs --resolution: the short side the images are scaled down to")
    if classes and not labels:
        raise BigbatchError("--classes orders the classes of a --labels file: give --labels FILE.csv too")
    refuse_credentials(str(src), "the source")
    refuse_credentials(str(out), "the output")
    secrets = option_credentials(storage_options or {}, keys=False)  # a key and secret given here are never written
    if secrets:
        raise BigbatchError(f"the storage options hold credentials ({', '.join(secrets)}); {WHERE_CREDENTIALS_GO}")
    if not str(out).lower().endswith((".h5", ".hdf5")):
        raise BigbatchError(f"output {public_name(out)} must end in .h5 (data.path recognises data files by it)")
    if not overwrite and _exists(str(out), storage_options):
        raise BigbatchError(
            f"output {public_name(out)} exists: give --overwrite to replace it (runs trained on it then refuse to "
            "resume: its content changes), or another name"
        )
    if resolution is not None and resolution < 1:
        raise BigbatchError(f"--resolution must be a positive number of pixels, got {resolution}")
    if buckets and resolution is None:
        raise BigbatchError("aspect-ratio buckets need --resolution (the side of the square of the same area)")
    if limit is not None and limit < 1:
        raise BigbatchError(f"--limit must be at least 1, got {limit}")
    folders = _mask_folders(masks, eyes_mouth)
    workers = default_workers() if workers is None else workers
    if workers < 0:
        raise BigbatchError(f"--workers must be >= 0 (0: decode in this process), got {workers}")
    import bigbatch

    attrs: dict[str, Any] = {"source": public_name(src), "bigbatch_version": bigbatch.__version__}
    if codec != "raw":
        attrs.update(codec=codec, quality=quality)
    if whole:
        attrs.update(crop="none", short_side=resolution or 0)
    if str(src).startswith("builtin:"):
        if masks or eyes_mouth:
            raise BigbatchError("built-in data sets have no masks: --masks and --eyes-mouth take image folders")
        if labels or whole:
            raise BigbatchError(
                "built-in data sets come labelled and square: --labels and --crop none take image folders"
            )
        return _prepare_builtin(str(src), str(out), resolution, limit, attrs, storage_options, start)

    listing = list_source(src, storage_options)
    if not listing.keys:
        raise BigbatchError(f"source {public_name(src)} holds no files to read; give a folder or zip of images")
    skipped: list[tuple[str, str]] = []
    if labels:  # (before --limit: a label is missing only if the whole source lacks its file)
        listing = _labelled(listing, labels, classes, storage_options, skipped, strict)
    if limit is not None:
        listing = listing.subset(limit)
    for name in listing.outside:
        _skip(skipped, name, "outside the class folders (every file must be in one when there are any)", strict)
    resize = RESIZE if resolution else "none (images kept at their size)"
    if whole and resolution:
        resize = "whole images, the short side scaled down (Pillow LANCZOS, antialiased) to the resolution if longer"
    attrs.update(resize=resize, skipped=0)
    if masks:
        em = "none" if not eyes_mouth else "dfl" if eyes_mouth == "dfl" else "folder"
        attrs.update(masks=masks if masks in ("alpha", "dfl") else "folder", eyes_mouth=em)
    dfl_masks = 0 if masks != "dfl" else 2 if eyes_mouth == "dfl" else 1  # planes from DFL's metadata
    ratios = BUCKET_RATIOS if buckets else None
    first: tuple[str, tuple[int, ...]] | None = None
    face_types: dict[str, str] = {}  # DFL's face type -> the first face of it
    bar = _progress(len(listing.keys), progress)
    written = np.zeros(max(1, len(listing.class_names)), np.int64)  # images written per class
    # How each file is decoded (what the decoding processes are given), which also keys the parts.
    decoding = dict(resolution=resolution, ratios=ratios, alpha=masks == "alpha", dfl=dfl_masks, whole=whole)
    decoding.update(codec=(codec, quality))
    folders_key = {"masks": str(masks), "eyes_mouth": str(eyes_mouth)}
    parts = None if is_url(out) else _parts(listing, Path(out), {**decoding, **folders_key})
    with (
        _parts_kept_unless_refused(parts, out),
        _decoder(listing, workers, decoding, parts) as decoded,
        H5Writer(out, listing.class_names, attrs, bucketed=buckets, storage_options=storage_options) as writer,
    ):
        for i, result in enumerate(decoded):
            bar.update(1)
            name = listing.names[i]
            if isinstance(result, str):
                _skip(skipped, name, result, strict)
                continue
            image = result[1]
            if result[2] is not None:
                face_types.setdefault(result[2], name)
            if folders:
                found = _with_masks(image, result[3], name, folders, resolution, ratios)
                if isinstance(found, str):
                    _skip(skipped, name, found, strict)
                    continue
                image = found
            if first is None:
                first = (name, image.shape)
            elif image.shape != first[1] and not (buckets or whole):
                raise BigbatchError(
                    f"images differ in size ({first[0]} is {first[1][1]}x{first[1][0]}, {name} is "
                    f"{image.shape[1]}x{image.shape[0]}); give --resolution N to center-crop and resize them all"
                )
            writer.add(image, int(listing.labels[i]))
            written[int(listing.labels[i])] += 1
        bar.close()
        if writer.count == 0:
            reason = f"; e.g. {skipped[0][0]}: {skipped[0][1]}" if skipped else ""
            raise BigbatchError(f"source {public_name(src)} holds no usable images{reason}")
        if not labels:  # (classes from a CSV, or a train file's --classes, keep their indices)
            listed = np.bincount(np.asarray(listing.labels, np.int64), minlength=len(written))
            _refuse_empty_classes(listing.class_names, written, listed, skipped)
        if len(face_types) > 1:
            shown = ", ".join(f"{t} ({name})" for t, name in face_types.items())
            raise BigbatchError(
                f"the faces were extracted with different DeepFaceLab face types: {shown}; a SAEHD model takes "
                "one (its merger crops by it): prepare each face type into its own file"
            )
        if face_types:
            writer.attrs.update(face_type=next(iter(face_types)))
        writer.attrs.update(skipped=len(skipped), skipped_examples=[list(x) for x in skipped[:SHOWN]])
        meta = writer.commit()
    shape = (meta["height"], meta["width"], meta["channels"]) if meta["height"] else ()
    return Report(
        str(out),
        meta["count"],
        shape,
        listing.class_names,
        meta["source"],
        meta["content_hash"],
        time.perf_counter() - start,
        workers,
        skipped,
        parts.resumed if parts is not None else 0,
        _empty_folders(src, listing) if not labels else [],
    )


def _refuse_empty_classes(
    class_names: list[str], written: np.ndarray, listed: np.ndarray, skipped: list[tuple[str, str]]
) -> None:
    """A class folder whose files were all skipped (unreadable, not images) would be a class of no image,
    shifting the class indices and leaving a classifier an output it never learns: refused, naming it.
    (`listed`: files per class in the listing; one that --limit left without files is not refused.)"""
    empty = [name for name, n, m in zip(class_names, written.tolist(), listed.tolist()) if n == 0 and m > 0]
    if not empty:
        return
    example = next(((f, why) for f, why in skipped if any(f.startswith(f"{c}/") for c in empty)), None)
    files = f" (every file skipped, e.g. {example[0]}: {example[1]})" if example else ""
    shown = ", ".join(empty[:SHOWN]) + (", ..." if len(empty) > SHOWN else "")
    one = len(empty) == 1
    raise BigbatchError(
        f"class folder{'' if one else 's'} {shown} hold{'s' if one else ''} no usable image{files}: a class of no "
        f"images shifts the other classes' indices; remove {'it' if one else 'them'} or put images in "
        f"{'it' if one else 'them'}, then run prepare again"
    )


def _empty_folders(src: str, listing: Listing) -> list[str]:
    """The sub-folders of a local source folder with classes that hold no image file (not classes, then)."""
    folder = Path(src.removeprefix("file://"))
    if not listing.class_names or is_url(src) or not folder.is_dir():
        return []
    names = set(listing.class_names)
    return sorted(d.name for d in folder.iterdir() if d.is_dir() and not d.name.startswith(".") and d.name not in names)


def _labelled(
    listing: Listing,
    labels: str,
    classes: str | None,
    storage_options: dict[str, Any] | None,
    skipped: list[tuple[str, str]],
    strict: bool,
) -> Listing:
    """The listing labelled by the `labels` file (class order from the data file `classes`)."""
    from bigbatch.data.hdf5 import read_meta
    from bigbatch.data.labels import read_labels, relabel

    if classes and classes.startswith("builtin:"):
        raise BigbatchError(
            f"--classes {classes}: give the data file the training images were prepared into (DATA.h5), whose "
            "class order the labels take"
        )
    names = read_meta(classes, storage_options)["class_names"] if classes else None
    if classes and not names:
        raise BigbatchError(f"--classes {public_name(classes)} has no classes (it was prepared unconditional)")
    if names is None:  # (a validation set missing a class would be numbered off by one against its training set)
        warn(
            f"class indices from the names in {public_name(labels)} alone, sorted: to number them as a training "
            "file does, give --classes TRAIN.h5"
        )
    what = f"labels file {public_name(labels)}"
    labelled, unlabelled, missing = relabel(listing, read_labels(labels, storage_options), names, what)
    for name, reason in unlabelled:
        _skip(skipped, name, reason, strict)
    for name in missing:
        _skip(skipped, f"{name} (in {what})", "labelled, but not in the source", strict)
    return labelled


def _skip(skipped: list[tuple[str, str]], name: str, reason: str, strict: bool) -> None:
    if strict:
        raise BigbatchError(f"{name}: {reason} (--strict; drop it to skip such files and list them)")
    skipped.append((name, reason))


def _progress(total: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="img", disable=not enabled or not sys.stderr.isatty(), dynamic_ncols=True)


MASK_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")


def _mask_folders(masks: str | None, eyes_mouth: str | None) -> list[Path]:
    """The mask folders to read (none for --masks alpha or dfl), checked."""
    if eyes_mouth and not masks:
        raise BigbatchError("--eyes-mouth is channel 5, after the mask: give --masks alpha, dfl or DIR too")
    if eyes_mouth == "dfl" and masks != "dfl":
        raise BigbatchError("--eyes-mouth dfl reads DeepFaceLab's aligned faces: give --masks dfl with it")
    folders = [Path(f) for f in (masks, eyes_mouth) if f and f not in ("alpha", "dfl")]
    for folder in folders:
        if is_url(str(folder)) or not folder.is_dir():
            raise BigbatchError(
                f"mask folder {folder} is not a local folder; give --masks alpha (the images' alpha channel), dfl "
                "(DeepFaceLab's aligned faces' own masks) or a folder of masks"
            )
    return folders


def _with_masks(
    image: np.ndarray,
    size: tuple[int, int] | None,
    name: str,
    folders: list[Path],
    resolution: int | None,
    ratios: Sequence[float] | None,
) -> np.ndarray | str:
    """`image` with one channel more per mask folder (the mask of the same relative name), or the reason why
    not. `size`: the image's (height, width) as stored (None: unknown, from an older prepare's parts); a
    mask must have that shape, or be a scaled copy of it, so that the same crop lines it up."""
    channels = [image]
    for folder in folders:
        stem = Path(name).with_suffix("")
        found = [folder / f"{stem}{s}" for s in MASK_SUFFIXES if (folder / f"{stem}{s}").is_file()]
        if not found:
            return f"no mask {stem}.png (or .jpg, ...) in {folder}"
        try:
            mask, (mh, mw) = decode_mask(found[0].read_bytes(), resolution, ratios)
        except Exception as e:  # noqa: BLE001 -- Pillow raises many types on corrupt data
            return f"mask {found[0]} is not a usable image ({type(e).__name__}: {e})"
        if size is not None and abs(mw * size[0] - mh * size[1]) > max(size):  # not the image's aspect ratio
            return (
                f"mask {found[0]} is {mw}x{mh}, its image {size[1]}x{size[0]}: a mask must have its image's "
                "shape (or be a scaled copy of it)"
            )
        if mask.shape != image.shape[:2]:
            return f"mask {found[0]} is {mask.shape[1]}x{mask.shape[0]}, the image {image.shape[1]}x{image.shape[0]}"
        channels.append(mask[..., None])
    return np.concatenate(channels, axis=2)


_worker: dict[str, Any] = {}


def _init_worker(listing_source: Any, decoding: dict[str, Any], parent: int | None = None) -> None:
    """Set up a decoding process. A pool's workers (`parent`: the main process's PID) ignore SIGTERM and
    SIGINT (sent to the whole process group by a terminal or a job scheduler): the main process stops
    them after their current chunk. A worker killed while it writes a result leaves half a message in
    the pool's pipe, and the pool's manager thread waits for the rest forever (a hang at shutdown and at
    exit). A main process killed outright (SIGKILL) takes them with it."""
    if parent is not None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        die_with_parent(parent)
    _worker.update(source=listing_source, **decoding)


def _decode_chunk(payload: list[Any]) -> list[Result]:
    """In a worker: read the files (local sources) or take the bytes (remote), then decode them."""
    source = _worker["source"]
    data = source.read(payload) if source.worker_reads else payload
    w = _worker
    out = [decode_or_reason(d, w["resolution"], w["ratios"], w["alpha"], w["dfl"], w["whole"]) for d in data]
    codec, quality = w["codec"]
    if codec == "raw":
        return out
    return [r if isinstance(r, str) else (r[0], codecs.encode(r[1], codec, quality), *r[2:]) for r in out]


@contextmanager
def _decoder(
    listing: Listing, workers: int, decoding: dict[str, Any], parts: Parts | None = None
) -> Iterator[Iterator[Result]]:
    """Decoded images (or reasons) in listing order, from `workers` processes (0 or 1: this one), as
    `decoding` says (resolution, ratios, the mask planes `decode` adds: alpha, dfl; whole; (codec,
    quality) to encode them with). Entered before the output file is opened, so
    that no worker inherits its handle. With `parts`, the results of each PART files are kept as they
    come and those a killed run kept are read back instead of decoded (`parts.resumed` counts them)."""
    source = listing.source
    n = len(listing.keys)
    todo = [k for k in range(-(-n // PART)) if parts is None or not parts.done(k)]
    spans = [
        (i, min(i + CHUNK, (k + 1) * PART, n)) for k in todo for i in range(k * PART, min((k + 1) * PART, n), CHUNK)
    ]
    chunks = [listing.keys[a:b] for a, b in spans]
    pool = fetcher = None
    if workers > 1:
        # fork: workers start at once (spawn would re-import torch in each); they run only Pillow and file reads.
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        context = multiprocessing.get_context(method)
        pool = ProcessPoolExecutor(workers, context, initializer=_init_worker, initargs=(source, decoding, os.getpid()))
        pool.submit(int).result()  # start the workers now
    else:
        _init_worker(source, decoding)
    if not source.worker_reads:
        # Remote bytes are fetched by threads here, several chunks ahead, while the workers decode.
        fetcher = ThreadPoolExecutor(FETCHERS)
    try:
        computed = _results(chunks, source, pool, fetcher, workers)
        yield computed if parts is None else _through_parts(computed, parts, n, set(todo))
    finally:  # also when stopped early (--strict, a size mismatch): drop the work not yet started
        for executor in (pool, fetcher):
            if executor is not None:
                executor.shutdown(wait=True, cancel_futures=True)


def _exists(out: str, storage_options: dict[str, Any] | None) -> bool:
    if not is_url(out):
        return os.path.lexists(out)
    fs, path = url_fs(out, storage_options)
    return bool(fs.exists(path))


@contextmanager
def _parts_kept_unless_refused(parts: Parts | None, out: str | os.PathLike) -> Iterator[None]:
    """The parts go once the data file is written, or when prepare is refused (a bad file with
    --strict, a full disk: nothing left behind); a prepare killed or interrupted keeps them to resume."""
    try:
        yield
    except BigbatchError:
        if parts is not None:
            parts.remove()
        raise
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or parts is None:
            raise
        parts.remove()  # (a full disk's parts are what fills it)
        raise cannot_write(out, e) from None
    if parts is not None:
        parts.remove()


def _parts(listing: Listing, out: Path, settings: dict[str, Any]) -> Parts:
    """The parts folder of this command: what decides the decoded images (the files, in order, with
    their labels, and how they are decoded) keys it."""
    import bigbatch

    h = hashlib.sha256()
    for key, name in zip(listing.keys, listing.names):
        h.update(f"{key}\0{name}\0{listing.source.stamp(key)}\0".encode())
    h.update(np.ascontiguousarray(listing.labels, "<i8").tobytes())
    source = getattr(listing.source, "path", None)  # a zip: its own size and time
    key = {**settings, "files": h.hexdigest(), "classes": listing.class_names, "part": PART}
    key.update(version=bigbatch.__version__, archive=file_stamp(source) if isinstance(source, str) else "")
    return Parts(out.with_name(f".{out.name}.parts"), key)


def _through_parts(
    computed: Iterator[Any], parts: Parts, n: int, todo: set[int]
) -> Iterator[tuple[int, Any, str | None] | str]:
    """Every file's result in order: a kept part's read back, the others' decoded and kept."""
    for k in range(-(-n // PART)):
        if k not in todo:
            results = parts.load(k)
        else:
            results = [next(computed) for _ in range(min(PART, n - k * PART))]
            parts.save(k, results)
        yield from results


def _ordered(submit: Any, items: Iterable[Any], window: int) -> Iterator[Any]:
    """submit(item).result() for each item in order, with up to `window` in flight."""
    pending: deque[Future] = deque()
    for item in items:
        pending.append(submit(item))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def _results(
    chunks: list[list[str]], source: Any, pool: Any, fetcher: Any, workers: int
) -> Iterator[tuple[int, Any, str | None] | str]:
    payloads: Iterable[Any] = chunks
    if fetcher is not None:
        payloads = _ordered(lambda keys: fetcher.submit(source.read, keys), chunks, 2 * FETCHERS)
    if pool is None:
        for payload in payloads:
            yield from _decode_chunk(payload)
    else:
        for decoded in _ordered(lambda payload: pool.submit(_decode_chunk, payload), payloads, 2 * workers):
            yield from decoded


def _prepare_builtin(
    src: str,
    out: str,
    resolution: int | None,
    limit: int | None,
    attrs: dict[str, Any],
    storage_options: dict[str, Any] | None,
    start: float,
) -> Report:
    from bigbatch.data.builtin import NATIVE_RESOLUTION
    from bigbatch.data.load import load_data

    name = src.removeprefix("builtin:")
    resolution = resolution or NATIVE_RESOLUTION.get(name, 32)
    data = load_data(src, resolution)
    n = len(data) if limit is None else min(limit, len(data))
    take = (np.arange(n) * len(data)) // n
    images, labels = data.images.numpy()[take], data.labels.numpy()[take]
    attrs.update(resize=f"as builtin:{name} at {resolution}px (torch bicubic, antialiased)", skipped=0)
    with H5Writer(out, data.class_names, attrs, storage_options=storage_options) as writer:
        for image, label in zip(images, labels):
            writer.add(image, int(label))
        meta = writer.commit()
    return Report(
        out,
        meta["count"],
        (meta["height"], meta["width"], meta["channels"]),
        data.class_names,
        meta["source"],
        meta["content_hash"],
        time.perf_counter() - start,
        0,
    )


__all__ = ["Report", "default_workers", "is_url", "prepare"]
