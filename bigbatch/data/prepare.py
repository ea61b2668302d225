"""`bigbatch prepare`: any collection of images (folder, zip, s3://..., builtin:NAME) into one checked
DATA.h5, decoded in parallel worker processes, bad files skipped and reported."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bigbatch.config_types import MAX_PROCESSES, MAX_RESOLUTION
from bigbatch.data import codecs
from bigbatch.data import labels as labelling
from bigbatch.data.dfl_faces import APPLIED, LABELS
from bigbatch.data.h5write import H5Writer
from bigbatch.data.labels import class_index, labelled_by, name_indices, nfc, read_labels, renumber, training_classes
from bigbatch.data.listing import FACE_SETS, by_ending, endings, hidden, top_level
from bigbatch.data.parts import Result
from bigbatch.data.prepare_output import SHOWN, Report, no_usable_images, refuse_output, say_tars_left_out, sole_writer
from bigbatch.data.prepare_pool import CHUNK, decoded, parts_kept_unless_refused, parts_of
from bigbatch.data.schedule import BUCKET_RATIOS
from bigbatch.data.sources import RESIZE, FolderSource, Listing, cut_to_name, decode_mask, list_source
from bigbatch.errors import BigbatchError, counted, named_few, printable, warn
from bigbatch.images_done import ImagesDone
from bigbatch.urls import Location, is_url, public_name


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
    face_type: str | None = None,
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
    mask, else its landmarks' hull), "labels" the mask drawn in DFL's XSeg editor (what `task = "xseg"`
    trains on; a face without one is skipped), "xseg-applied" its applied XSeg mask cut at 0.5 (what DFL's XSeg
    trainer takes where no face is labelled; a face without one is skipped; both at XSeg's 256 px unless `resolution`
    says otherwise), or a local folder holds a greyscale
    mask per image under the same relative name (any image extension: faces/a.jpg -> MASKS/faces/a.png).
    `eyes_mouth`: a folder of eyes-and-mouth masks the same way, or "dfl" (from the landmarks, with masks "dfl"),
    a fifth channel (needs `masks`). An image without its mask is skipped (an error with `strict`).
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
    source, target = Location.of(src, "the source"), Location.of(out, "the output")
    if not source.url and (source.path / "config.toml").is_file() and (source.path / "checkpoints").is_dir():
        raise BigbatchError(  # (found from outside: refused as "images differ in size", its samples' sheets)
            f"source {source.name} is a run directory, not a folder of images: give the images to prepare"
        )
    refuse_output(target, storage_options, overwrite)
    settings = _Settings.checked(resolution, workers, limit, strict, buckets, masks, eyes_mouth, codec, quality, crop)
    if face_type:  # DFL's aligned faces of another type cut to this one, as its trainers cut them
        settings = dataclasses.replace(settings, cut_to=cut_to_name(face_type, masks))
    import bigbatch

    attrs: dict[str, Any] = {"source": source.name, "bigbatch_version": bigbatch.__version__}
    if settings.codec != "raw":
        attrs.update(codec=settings.codec, quality=settings.quality)
    if settings.whole:
        attrs.update(crop="none", short_side=resolution or 0)
    if source.text.startswith("builtin:"):
        if masks or eyes_mouth:
            raise BigbatchError("built-in data sets have no masks: --masks and --eyes-mouth take image folders")
        if labels or classes or settings.whole:
            raise BigbatchError(
                "built-in data sets come labelled and square: --labels, --classes and --crop none take image folders"
            )
        return _prepare_builtin(source, target, resolution, limit, attrs, storage_options, start)

    skipped: list[tuple[str, str]] = []
    listing = _listed(source, settings, labels, classes, storage_options, skipped, target)
    if listing.left_out:
        attrs.update(left_out=endings(listing.left_out))
    say_tars_left_out(listing.left_out, len(listing.keys))
    # (a worker a chunk at most: found from outside, --workers 64 of 6 files started 64 processes)
    settings = dataclasses.replace(settings, workers=min(settings.workers, -(-len(listing.keys) // CHUNK)))
    attrs.update(settings.attrs())
    with sole_writer(target, storage_options, overwrite):
        parts = None if target.url else parts_of(listing, target.path, settings.key())
        with (
            parts_kept_unless_refused(parts, target),
            decoded(listing, settings.workers, settings.decoding(), parts) as results,
        ):
            shown = ImagesDone(len(listing.keys), "prepare", progress, lambda: parts.resumed if parts else 0)
            meta = _write(
                results,
                listing,
                target,
                settings,
                attrs,
                storage_options,
                skipped,
                shown,
                relabelled=bool(labels or classes or listing.indexed),
                named=bool(classes),
            )
    shape = (meta["height"], meta["width"], meta["channels"]) if meta["height"] else ()
    return Report(
        target.text,
        meta["count"],
        shape,
        listing.class_names,
        meta["source"],
        meta["content_hash"],
        time.perf_counter() - start,
        settings.workers,
        skipped,
        parts.resumed if parts is not None else 0,
        _empty_folders(source, listing) if not labels else [],
        meta.get("enlarged", 0),
        meta.get("below_short_side", 0),
        meta.get("crop") == "none",
        meta.get("left_out", {}),
        meta.get("class_counts", []),
    )


@dataclass(frozen=True)
class _Settings:
    """What a prepare command asks of each file, checked: how it is decoded (and encoded), which files are
    taken, and what makes one skipped or an error."""

    resolution: int | None
    workers: int
    limit: int | None
    strict: bool
    buckets: bool
    masks: str | None
    eyes_mouth: str | None
    codec: str
    quality: int | None
    whole: bool
    folders: tuple[Path, ...]
    """The mask folders read beside the images (none for masks "alpha", "dfl" or "labels")."""
    cut_to: str | None = None  # --face-type: DFL's faces of other types cut to this one (SAEHD's name for it)

    @classmethod
    def checked(
        cls,
        resolution: int | None,
        workers: int | None,
        limit: int | None,
        strict: bool,
        buckets: bool,
        masks: str | None,
        eyes_mouth: str | None,
        codec: str,
        quality: int | None,
        crop: str,
    ) -> _Settings:
        """prepare's options, each checked (one line naming the option and what is valid)."""
        quality = codecs.check(codec, quality, 4 if masks else None)
        if masks in XSEG_MASKS and resolution is None:  # XSeg's side, the one it trains on (found from outside: DFL's
            from bigbatch.models.xseg import RESOLUTION  # 512 px faces kept their size, and XSeg refused them)

            resolution = RESOLUTION
        if crop not in ("center", "none"):
            raise BigbatchError(f"--crop must be center or none, got {crop!r}")
        whole = crop == "none"
        if whole and codec == "raw":
            raise BigbatchError(
                "--crop none keeps each image's own size, which raw storage cannot: add --codec jpeg (or png, webp)"
            )
        if whole and buckets:
            raise BigbatchError("--crop none keeps every aspect ratio already: drop --buckets")
        if whole and resolution is None:
            raise BigbatchError("--crop none needs --resolution: the short side the images are scaled down to")
        if resolution is not None and not 1 <= resolution <= MAX_RESOLUTION:  # (found from outside: 100000 px was
            # an image of 30 GB a worker, and the kernel's kill, without a word)
            raise BigbatchError(
                f"--resolution must be a positive number of pixels up to {MAX_RESOLUTION} (data.resolution's bound), "
                f"got {resolution}"
            )
        if buckets and resolution is None:
            raise BigbatchError("aspect-ratio buckets need --resolution (the side of the square of the same area)")
        if limit is not None and limit < 1:
            raise BigbatchError(f"--limit must be at least 1, got {limit}")
        folders = tuple(_mask_folders(masks, eyes_mouth))
        workers = default_workers() if workers is None else workers
        if not 0 <= workers <= MAX_PROCESSES:  # (found from outside: 2**63 forked until memory ran out)
            raise BigbatchError(f"--workers must be 0 (decode in this process) to {MAX_PROCESSES}, got {workers}")
        return cls(resolution, workers, limit, strict, buckets, masks, eyes_mouth, codec, quality, whole, folders)

    @property
    def ratios(self) -> Sequence[float] | None:
        return BUCKET_RATIOS if self.buckets else None

    def decoding(self) -> dict[str, Any]:
        """What the decoding processes are given: how each file is decoded and encoded."""
        own = {"dfl": 2 if self.eyes_mouth == "dfl" else 1, "labels": LABELS, "xseg-applied": APPLIED}
        dfl = own.get(str(self.masks), 0)  # the planes from DFL's metadata
        decoding = dict(resolution=self.resolution, ratios=self.ratios, alpha=self.masks == "alpha", dfl=dfl)
        cut = {"cut_to": self.cut_to} if self.cut_to else {}  # (keys of parts kept from before stay as they were)
        return {**decoding, "whole": self.whole, "codec": (self.codec, self.quality), **cut}

    def key(self) -> dict[str, Any]:
        """What decides the decoded images besides the files: keys the parts a killed prepare kept."""
        return {**self.decoding(), "masks": str(self.masks), "eyes_mouth": str(self.eyes_mouth), "limit": self.limit}

    def attrs(self) -> dict[str, Any]:
        """What the data file records of how its images were made."""
        resize = RESIZE if self.resolution else "none (images kept at their size)"
        if self.whole and self.resolution:
            resize = (
                "whole images, the short side scaled down (Pillow LANCZOS, antialiased) to the resolution if longer"
            )
        attrs: dict[str, Any] = {"resize": resize, "skipped": 0}
        if self.masks:
            em = "none" if not self.eyes_mouth else "dfl" if self.eyes_mouth == "dfl" else "folder"
            attrs.update(masks=self.masks if self.masks in OWN_MASKS else "folder", eyes_mouth=em)
        return attrs


def _listed(
    source: Location,
    settings: _Settings,
    labels: str | None,
    classes: str | None,
    storage_options: dict[str, Any] | None,
    skipped: list[tuple[str, str]],
    target: Location | None = None,
) -> Listing:
    """The files to prepare, labelled (by their folders, or by the `labels` file), thinned to `limit`; the
    files outside the class folders skipped."""
    face_set = settings.masks in FACE_SETS and not labels  # (a labels file names files at any depth)
    listing = list_source(source, storage_options, classes=not labels and not face_set)
    listing = top_level(listing) if face_set else listing
    folder = isinstance(listing.source, FolderSource)
    if target is not None and not target.url and folder:  # the output itself, inside its source (found
        out = os.path.realpath(target.path)  # from outside: listed as corrupt, and --strict failed on it)
        if any(os.path.realpath(source.path / name) == out for name in (*listing.names, *listing.outside)):
            keep = [i for i, k in enumerate(listing.keys) if os.path.realpath(k) != out]
            outside = [n for n in listing.outside if os.path.realpath(source.path / n) != out]
            keys, names = [listing.keys[i] for i in keep], [listing.names[i] for i in keep]
            listing = dataclasses.replace(listing, keys=keys, names=names, labels=listing.labels[keep], outside=outside)
    if not listing.indexed:  # (WebDataset's samples: their images chosen by their endings already)
        listing = by_ending(listing, source.name, refuse_emptied=not classes)  # (--classes keeps a class of none)
    if not listing.keys:
        if listing.skipped:  # (found by review: every sample's .cls a synset, and the reason went unsaid)
            name, why = listing.skipped[0]
            more = f" (and {len(listing.skipped) - 1} more)" if len(listing.skipped) > 1 else ""
            raise BigbatchError(f"source {source.name} holds no file to take: {name}: {why}{more}")
        raise BigbatchError(f"source {source.name} holds no files to read; give a folder or zip of images")
    ada = None if labels or face_set else labelling.ada_dataset(listing, source, storage_options)
    if ada is not None:  # (StyleGAN2-ADA's dataset_tool.py's: its dataset.json's labels, its folders no classes)
        listing, table, names = ada
        if table is not None:  # (class indices, as WebDataset's .cls: --classes names them)
            listing, skips = labelled_by(listing, table, names, labelling.ADA_LABELS)
            listing = dataclasses.replace(listing, indexed=True)
            for name, reason in skips:
                _skip(skipped, name, reason, settings.strict)
    if labels:  # (before --limit: a label is missing only if the whole source lacks its file)
        listing = _labelled(listing, labels, classes, storage_options, skipped, settings.strict)
    elif classes and listing.indexed:  # WebDataset's class indices (ADA's), named as the training file's
        listing = name_indices(listing, training_classes(classes, storage_options), classes)
    elif classes:  # class folders numbered as the training file's (a validation set lacking a class)
        if not listing.class_names:
            raise BigbatchError(
                f"--classes numbers class folders or a --labels file's classes as TRAIN.h5 does, and {source.name} "
                "has no class folders: give --labels FILE.csv too"
            )

        names = training_classes(classes, storage_options)
        listing = renumber(listing, names, f"--classes {public_name(classes)}")
    if settings.limit is not None:
        listing = listing.subset(settings.limit)
    special = [(name, "not a regular file (a named pipe, socket or device): not read") for name in listing.special]
    for name, why in listing.skipped + special:
        _skip(skipped, name, why, settings.strict)
    for name in listing.outside:
        _skip(
            skipped, name, "outside the class folders (every file must be in one when there are any)", settings.strict
        )
    return listing


def _write(
    decoded: Iterator[Result],
    listing: Listing,
    target: Location,
    settings: _Settings,
    attrs: dict[str, Any],
    storage_options: dict[str, Any] | None,
    skipped: list[tuple[str, str]],
    shown: ImagesDone,
    relabelled: bool,
    named: bool = False,
) -> dict[str, Any]:
    """The `decoded` images of `listing` (or why each was skipped) written to `target`, with their masks;
    the data file's metadata. Refused: images of different sizes where one is needed, a class left without
    images (unless `relabelled` by a labels file, whose indices stay: said where `named` by --classes), faces of
    several DFL face types."""
    first: tuple[str, tuple[int, ...]] | None = None
    face_types: dict[str, str] = {}  # DFL's face type -> the first face of it
    written = np.zeros(max(1, len(listing.class_names)), np.int64)  # images written per class
    yaws: list[float | None] = []  # each written image's, if an aligned DFL face (swap.uniform_yaw bins them)
    no_yaw: str | None = None  # the first written image without one
    unread = len(skipped)  # (the files skipped as listed)
    enlarged = 0  # images whose short side was below the resolution (--crop none keeps them as they are: counted)
    with H5Writer(target, listing.class_names, attrs, settings.buckets, storage_options, len(listing.keys)) as writer:
        for i, result in enumerate(decoded):
            shown.add(1)
            name = listing.shown(i)  # (with its shard: a member of one of several)
            image = _image_of(result, listing.names[i], settings, face_types)
            if isinstance(image, str):
                _skip(skipped, name, image, settings.strict)
                continue
            if first is None:
                first = (name, image.shape)
            elif image.shape != first[1] and not (settings.buckets or settings.whole):
                raise BigbatchError(
                    f"images differ in size ({first[0]} is {first[1][1]}x{first[1][0]}, {name} is "
                    f"{image.shape[1]}x{image.shape[0]}); give --resolution N to center-crop and resize them all"
                )
            writer.add(image, int(listing.labels[i]), name)
            written[int(listing.labels[i])] += 1
            source_size = result[3]  # type: ignore[index]
            # (whole images: below the short side, kept as they are; found from outside, unsaid)
            side = settings.resolution if settings.whole else min(image.shape[:2])  # (the side it was scaled to)
            enlarged += bool(source_size and min(source_size) < (side or 0))
            yaws.append(result[4])  # type: ignore[index]
            no_yaw = no_yaw or (name if result[4] is None else None)  # type: ignore[index]
        shown.close()
        if writer.count == 0:  # (a file read says why, before one listed: found from outside, a listed one did)
            raise no_usable_images(attrs["source"], listing, skipped, unread)
        if not relabelled:  # (classes from a CSV, or a train file's --classes, keep their indices)
            listed = np.bincount(np.asarray(listing.labels, np.int64), minlength=len(written))
            _refuse_empty_classes(
                listing.class_names, written, listed, skipped, settings.limit if listing.thinned else None
            )
        elif named and not listing.thinned and (none := [c for c, n in zip(listing.class_names, written) if not n]):
            warn(  # (found from outside: unsaid)
                f"{counted(len(none), 'class')} of the {len(listing.class_names)} --classes names "
                f"{'has' if len(none) == 1 else 'have'} no image here ({named_few(none, SHOWN)}): "
                "kept, numbered as given, for a classifier's outputs"
            )
        if len(face_types) > 1 and settings.masks in FACE_SETS:  # (without masks: a face type recorded if one)
            shown = ", ".join(f"{t} ({name})" for t, name in face_types.items())
            model = "an XSeg model" if settings.masks in XSEG_MASKS else "a SAEHD model"
            raise BigbatchError(  # (found from outside: it said the faces could not be cut to one type here)
                f"the faces were extracted with different DeepFaceLab face types: {shown}; {model} trains on one: "
                "give --face-type (h, mf, f, wf or head; your model's) to cut each face to it, as DFL's trainers do"
            )
        if len(face_types) == 1:
            writer.attrs.update(face_type=next(iter(face_types)))
        _keep_yaws(writer, yaws, no_yaw, settings)
        writer.attrs.update(skipped=len(skipped), skipped_examples=[list(x) for x in skipped[:SHOWN]])
        if listing.class_names:  # (found from outside: a class gutted by corrupt files went unsaid)
            writer.attrs.update(class_counts=written.tolist())
        writer.tables["skipped"] = skipped  # (every one, for `info --skipped`: found from outside, 5 named of 2,000)
        writer.attrs.update(skipped_listed=True)
        writer.attrs.update({("below_short_side" if settings.whole else "enlarged"): enlarged} if enlarged else {})
        return writer.commit()


def _keep_yaws(writer: H5Writer, yaws: list[float | None], no_yaw: str | None, settings: _Settings) -> None:
    """Each face's yaw beside the images, when every image is an aligned DFL face (with landmarks) and the file
    is one group (its written order is its index order); said when some faces have one and it is not kept
    (found by review: one face without landmarks dropped every yaw without a word)."""
    if not any(y is not None for y in yaws):
        return
    if no_yaw is not None:
        missing = sum(y is None for y in yaws)
        warn(
            f"{missing} of the {len(yaws)} images carry no usable DeepFaceLab landmarks (none, NaN or not numbers; "
            f"e.g. {no_yaw}): the faces' yaws (swap.uniform_yaw) are not kept; remove those images or extract them "
            "again, and prepare the aligned faces alone"
        )
    elif settings.buckets or settings.whole:
        warn("the faces' yaws (swap.uniform_yaw) are not kept with --buckets or --crop none")
    else:
        writer.arrays["yaws"] = np.array(yaws, np.float32)
        writer.attrs.update(face_yaws=True)


def _image_of(result: Result, name: str, settings: _Settings, face_types: dict[str, str]) -> np.ndarray | str:
    """A decoded file's image with its masks from the mask folders, or why it is skipped; its DFL face type
    (if any) noted in `face_types`."""
    if isinstance(result, str):
        return result
    if result[2] is not None:
        face_types.setdefault(result[2], name)
    if not settings.folders:
        return result[1]
    return _with_masks(result[1], result[3], name, list(settings.folders), settings.resolution, settings.ratios)


def _refuse_empty_classes(
    class_names: list[str], written: np.ndarray, listed: np.ndarray, skipped: list[tuple[str, str]], limit: int | None
) -> None:
    """A class folder whose files were all skipped (unreadable, not images) would be a class of no image,
    shifting the class indices and leaving a classifier an output it never learns: refused, naming it.
    (`listed`: files per class in the listing; one that --limit left without files is not refused. Under
    `limit`, a class whose few files taken were all skipped is warned of: the folder may hold usable ones, found
    from outside refused as holding none.)"""
    # (a class of no file listed, but under --limit: a class tar of no image, found by review to be taken unsaid)
    empty = [c for c, n, m in zip(class_names, written.tolist(), listed.tolist()) if n == 0 and (m or limit is None)]
    if not empty:
        return
    example = next(((f, why) for f, why in skipped if any(f.startswith(f"{c}/") or f"/{c}/" in f for c in empty)), None)
    shown = named_few(empty, SHOWN)
    one = len(empty) == 1
    if limit is not None:
        warn(
            f"--limit {limit}: the files taken of class folder{'' if one else 's'} {shown} were all skipped"
            + (f" (e.g. {example[0]}: {example[1]})" if example else "")
            + f", so {'it has' if one else 'they have'} no image in this file; a larger --limit takes others"
        )
        return
    files = f" (every file skipped, e.g. {example[0]}: {example[1]})" if example else ""
    raise BigbatchError(
        f"class folder{'' if one else 's'} {shown} hold{'s' if one else ''} no usable image{files}: a class of no "
        f"images shifts the other classes' indices; remove {'it' if one else 'them'} or put images in "
        f"{'it' if one else 'them'}, then run prepare again"
    )


def _empty_folders(source: Location, listing: Listing) -> list[str]:
    """The sub-folders of a local source folder with classes that hold no image file (not classes, then)."""
    if not listing.class_names or listing.indexed or not isinstance(listing.source, FolderSource):
        return []  # (classes by index, ADA's: its folders hold images of any class)
    names = class_index(listing.class_names)  # (numbered by --classes: a folder may be named by a class's synset)
    folders = source.path.iterdir()
    return sorted(d.name for d in folders if d.is_dir() and not hidden(d.name) and nfc(d.name) not in names)


def _labelled(
    listing: Listing,
    labels: str,
    classes: str | None,
    storage_options: dict[str, Any] | None,
    skipped: list[tuple[str, str]],
    strict: bool,
) -> Listing:
    """The listing labelled by the `labels` file (class order from the data file `classes`)."""

    names = training_classes(classes, storage_options) if classes else None
    table = read_labels(labels, storage_options)  # (a file it refuses is refused before the warning below)
    if names is None:  # (a validation set missing a class would be numbered off by one against its training set)
        warn(
            f"class indices from the names in {public_name(labels)} alone, sorted (as numbers where all are): to "
            "number them as a training file does, give --classes TRAIN.h5"
        )
    labelled, skips = labelled_by(listing, table, names, f"labels file {public_name(labels)}")
    for name, reason in skips:
        _skip(skipped, name, reason, strict)
    return labelled


def _skip(skipped: list[tuple[str, str]], name: str, reason: str, strict: bool) -> None:
    # (as they are said and kept: a newline or a terminal's escape in a name as its escapes, UTF-8 text; found from
    # outside and by review)
    name, reason = printable(name), printable(reason)
    if strict:
        raise BigbatchError(f"{name}: {reason} (--strict; without --strict such files are skipped and listed)")
    skipped.append((name, reason))


OWN_MASKS = ("alpha", "dfl", "labels", "xseg-applied")  # --masks read from the images themselves, not a folder
XSEG_MASKS = ("labels", "xseg-applied")  # what XSeg trains on (task = "xseg")
MASK_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")


def _mask_folders(masks: str | None, eyes_mouth: str | None) -> list[Path]:
    """The mask folders to read (none for --masks alpha, dfl or labels), checked."""
    if eyes_mouth and not masks:
        raise BigbatchError("--eyes-mouth is channel 5, after the mask: give --masks alpha, dfl or DIR too")
    if eyes_mouth and masks in XSEG_MASKS:  # (first: found from outside, "give --masks dfl" of XSeg's)
        raise BigbatchError(f"--eyes-mouth is for a swap's faces, --masks {masks} for XSeg's: give one of them")
    if eyes_mouth == "dfl" and masks != "dfl":
        raise BigbatchError("--eyes-mouth dfl reads DeepFaceLab's aligned faces: give --masks dfl with it")
    folders = [Path(f) for f in (masks, eyes_mouth) if f and f not in OWN_MASKS]
    for folder in folders:
        if is_url(str(folder)) or not folder.is_dir():
            raise BigbatchError(
                f"mask folder {folder} is not a local folder; give --masks alpha (the images' alpha channel), dfl "
                "(DeepFaceLab's aligned faces' own masks), labels or xseg-applied (their XSeg labels or masks) or a "
                "folder of masks"
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


def _prepare_builtin(
    src: Location,
    out: Location,
    resolution: int | None,
    limit: int | None,
    attrs: dict[str, Any],
    storage_options: dict[str, Any] | None,
    start: float,
) -> Report:
    from bigbatch.data.builtin import NATIVE_RESOLUTION
    from bigbatch.data.load import load_data

    name = src.text.removeprefix("builtin:")
    resolution = resolution or NATIVE_RESOLUTION.get(name, 32)
    data = load_data(src.text, resolution)
    n = len(data) if limit is None else min(limit, len(data))
    take = (np.arange(n) * len(data)) // n
    images, labels = data.images.numpy()[take], data.labels.numpy()[take]
    attrs.update(resize=f"as builtin:{name} at {resolution}px (torch bicubic, antialiased)", skipped=0)
    with H5Writer(out, data.class_names, attrs, storage_options=storage_options, expected=n) as writer:
        for image, label in zip(images, labels):
            writer.add(image, int(label))
        meta = writer.commit()
    return Report(
        out.text,
        meta["count"],
        (meta["height"], meta["width"], meta["channels"]),
        data.class_names,
        meta["source"],
        meta["content_hash"],
        time.perf_counter() - start,
        0,
    )


__all__ = ["Report", "default_workers", "prepare"]
