"""Image collections `bigbatch prepare` reads: local folders, .zip files and fsspec URLs (s3://...),
listed with class labels from sub-folder names, and Pillow decoding to uint8 RGB."""

from __future__ import annotations

import io
import os
import stat
import tarfile
import urllib.parse
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from bigbatch.data import tars
from bigbatch.data.dfl_faces import (
    APPLIED,
    FACE_TYPES,
    LABELS,
    NoFaceData,
    face_masks,
    landmarks_of,
    read_metadata,
    yaw_and_type,
)
from bigbatch.data.listing import (
    Interrupted,
    Listing,
    Source,
    fetched_all,
    file_stamp,
    hidden,
    label_files,
    object_stamp,
)
from bigbatch.data.schedule import bucket_shapes, nearest_bucket
from bigbatch.errors import BigbatchError, warn
from bigbatch.urls import Location, unreachable, url_fix

# One filter for every image, written into each data file: the resize filter alone moves FID.
RESIZE = "center crop to the target aspect ratio, then Pillow LANCZOS (antialiased) resize"
# Transparent pixels become this colour rather than whatever RGB values they happen to hold.
BACKGROUND = (255, 255, 255)


class FolderSource(Source):
    def stamp(self, key: str) -> str:
        return file_stamp(key)

    def read(self, keys: Sequence[str]) -> list[bytes | str]:
        out: list[bytes | str] = []
        for k in keys:
            try:
                out.append(Path(k).read_bytes())
            except FileNotFoundError as e:  # (found from outside: a dangling link was "No such file or directory")
                out.append(f"a broken link to {os.readlink(k)}" if os.path.islink(k) else f"unreadable ({e.strerror})")
            except OSError as e:
                out.append(f"unreadable ({e.strerror or e})")
        return out


MAX_MEMBER = 512 << 20  # a zip member inflated beyond this is not read (a zip bomb: 1 MB holding gigabytes)


class ZipSource(Source):
    """Members of a zip file; each process opens its own handle (zipfile handles are not fork-safe)."""

    def __init__(self, location: Location, storage_options: dict[str, Any] | None = None):
        self.location, self.storage_options = location, storage_options
        self.worker_reads = not location.url
        self._zip: zipfile.ZipFile | None = None
        self._pid = -1

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_zip": None, "_pid": -1}

    def open(self) -> zipfile.ZipFile:
        if self._zip is None or self._pid != os.getpid():
            if self.location.url:
                fs, p = self.location.fs(self.storage_options)
                handle = fs.open(p, "rb", block_size=8 << 20, cache_type="readahead")
            else:
                handle = open(self.location.path, "rb")  # noqa: SIM115 (kept open for the zip's lifetime)
            try:
                self._zip = zipfile.ZipFile(handle)
            except zipfile.BadZipFile as e:
                raise BigbatchError(f"{self.location.name} is not a readable zip file ({e})") from None
            self._pid = os.getpid()
        return self._zip

    def read(self, keys: Sequence[str]) -> list[bytes | str]:
        z = self.open()
        out: list[bytes | str] = []
        for k in keys:
            try:
                size = z.getinfo(k).file_size  # (what zipfile inflates, at most: a bomb says so, or is cut there)
                if size > MAX_MEMBER:
                    out.append(
                        f"{size / 2**20:.0f} MiB inflated, more than any image ({MAX_MEMBER >> 20} MiB): skipped"
                    )
                    continue
                out.append(z.read(k))
            except (OSError, zipfile.BadZipFile, EOFError, NotImplementedError, KeyError) as e:
                out.append(f"unreadable in the zip ({e})")
        return out


class FsspecSource(Source):
    """Objects under a URL prefix, fetched by the main process many at a time (s3fs reads concurrently).
    `stamps`: each object's ETag (else its size and time) as listed, so that an object replaced since a
    killed prepare is not taken from its parts."""

    worker_reads = False

    def __init__(
        self, location: Location, storage_options: dict[str, Any] | None = None, stamps: dict[str, str] | None = None
    ):
        self.location, self.storage_options = location, storage_options
        self.stamps = stamps or {}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "stamps": {}}  # (a million of them; processes handed a source only read)

    def stamp(self, key: str) -> str:
        return self.stamps.get(key, "")

    def read(self, keys: Sequence[str]) -> list[bytes | str]:
        fs, _ = self.location.fs(self.storage_options)
        # One GET an object: cat_ranges takes each key as it is (cat globs a name holding [ ] * ?), and
        # s3fs's max_concurrency=1 skips the size it otherwise asks first (a HEAD an object, once the
        # listing is out of its cache) to split objects larger than 50 MB into concurrent ranges.
        options = {"max_concurrency": 1} if getattr(fs, "max_concurrency", 1) > 1 else {}
        got = fs.cat_ranges(list(keys), None, None, on_error="return", **options)
        return fetched_all(got, keys)


def _regular_or_missing(file: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(file).st_mode)
    except OSError:
        return True


def list_source(
    src: str | Location, storage_options: dict[str, Any] | None = None, classes: bool = True, as_named: bool = False
) -> Listing:
    """Every file of a folder, zip or URL prefix in sorted order, labelled by its top-level folder; without
    `classes`, every file at any depth, unlabelled (label 0: sub-folders are not classes). Tar files (one, a
    brace pattern of WebDataset shards, a folder or prefix of them) as bigbatch.data.tars lists them. A zip's one
    folder at the top (a tar's too) is a wrapper, left out of the names, unless `as_named` (the names its members
    have: predict's, found from outside)."""
    src = Location.of(src)
    globbed = not src.url and not src.path.exists() and any(c in src.name for c in "*?[")
    if src.name.startswith("pipe:") or globbed:
        raise BigbatchError(  # (found from outside: "does not exist", of WebDataset's habits)
            f"source {src.name}: WebDataset's pipe: URLs and shell globs are not read here; give the shards as a brace "
            "pattern (shards/train-{000000..000146}.tar), their folder, or an s3:// prefix"
        )
    shards = tars.shards_named(src)
    if shards is not None:
        return tars.list_tars(shards, storage_options, classes, as_named)
    if src.url:
        return _list_url(src, storage_options, classes, as_named)
    path = src.path
    if not path.exists():
        raise BigbatchError(
            f"source {src.name} does not exist; give a folder, a .zip, a .tar, an s3://bucket/prefix URL"
        )
    if path.is_file():
        if zipfile.is_zipfile(path):
            return _list_zip(ZipSource(src), classes, as_named)
        if path.suffix.lower() == ".zip":
            raise BigbatchError(f"source {src.name} is not a readable zip archive (damaged, or another kind of file)")
        if tars.is_tar_name(src.text) or tarfile.is_tarfile(path):
            return tars.list_tars([src], storage_options, classes, as_named)
        raise BigbatchError(f"source {src.name} is a single file; give a folder of images, a .zip or a .tar")
    rel, special = [], []
    # Each folder with the folders above it, by identity: a link to one of those is a loop, not followed. A
    # link to any other folder is followed (as torchvision's ImageFolder does), whatever order the walk takes.
    # The source's own ancestors count as above it: a link back to one of them is not followed either.
    ancestors = (os.stat(p) for p in path.resolve().parents)
    above: dict[str, frozenset[tuple[int, int]]] = {str(path): frozenset((a.st_dev, a.st_ino) for a in ancestors)}

    def unreadable(e: OSError) -> None:  # (found from outside: a folder this user may not read was "empty")
        raise BigbatchError(f"cannot read folder {e.filename}: {e.strerror or e}; give this user read access to it")

    for dirpath, dirnames, filenames in os.walk(path, followlinks=True, onerror=unreadable):
        st = os.stat(dirpath)
        chain = above.pop(dirpath, frozenset())
        if (st.st_dev, st.st_ino) in chain:
            dirnames.clear()
            continue
        chain |= {(st.st_dev, st.st_ino)}
        above.update((os.path.join(dirpath, d), chain) for d in dirnames)
        base = Path(dirpath).relative_to(path).as_posix()
        # Regular files (and dangling links, listed as unreadable): a named pipe or a device would block its reader,
        # so it is listed unread (found from outside: left out without a word).
        for f in filenames:
            (rel if _regular_or_missing(os.path.join(dirpath, f)) else special).append(
                f if base == "." else f"{base}/{f}"
            )
    rel = sorted(r for r in rel if not hidden(r))
    shards = tars.shards_in(src, rel)
    if shards is not None:
        return tars.list_tars(shards, storage_options, classes, as_named)
    listing = _listing(FolderSource(), [str(path / r) for r in rel], rel, classes)
    listing.special = sorted(r for r in special if not hidden(r))
    return listing


def _not_there(src: Location, fs: Any, root: str) -> str:
    """Why a URL lists nothing: over HTTP, a server that does not answer (fsspec's `exists` is False on it too: found
    from outside, called missing with AWS credentials to check) or an answer that is no file; else S3's reasons."""
    if not src.text.startswith(("http:", "https:")):
        return (
            f"source {src.name} does not exist, or cannot be listed with these credentials (check AWS_* and the "
            "endpoint); give a folder, a .zip, a .tar, an s3://bucket/prefix URL"
        )
    try:
        fs.info(root)
    except Exception as e:  # noqa: BLE001 -- any other answer: no file there
        if said := unreachable(e, f"source {src.name}"):
            return said
    return f"source {src.name} is not on its server: give a folder (its URL ending in /), a .zip or .tar shards"


def _list_url(src: Location, storage_options: dict[str, Any] | None, classes: bool, as_named: bool) -> Listing:
    """Every object under a URL prefix (or the members of a .zip object)."""
    fs, root = src.fs(storage_options)
    try:
        if not fs.exists(root):  # (s3fs says so too of a bucket these credentials may not list)
            raise BigbatchError(_not_there(src, fs, root))
        # (an HTTP server's folder page is a file too: a URL ending in "/" names the folder it lists)
        if not src.text.endswith("/") and fs.isfile(root):
            if root.lower().endswith(".zip"):
                return _list_zip(ZipSource(src, storage_options), classes, as_named)
            slash = " (over HTTP, a folder's URL ends in /)" if src.text.startswith(("http:", "https:")) else ""
            raise BigbatchError(
                f"source {src.name} is a single file; give a folder (prefix) of images{slash}, a .zip or .tar shards"
            )
        root = root.rstrip("/")
        stamps = _find(fs, root)
    except BigbatchError:
        raise
    except Exception as e:  # noqa: BLE001 -- s3fs/botocore errors have no common base; one line for all
        fix = url_fix(e) or "check the credentials (AWS_* in the environment) and the endpoint"
        raise BigbatchError(f"cannot list {src.name}: {type(e).__name__}: {e} ({fix})") from None
    cut = len(root) + 1
    # An HTTP server's folder page lists its files as links, percent-encoded ("d%C3%B6g%20spaced/"): they are named and
    # sorted by what they encode, read by the links (found from outside: classes named encoded, in another order, so
    # another content hash than the same folder's).
    http = src.text.startswith(("http:", "https:"))
    named = (lambda p: _link_name(p[cut:])) if http else (lambda p: p[cut:])
    paths = sorted((p for p in stamps if not hidden(named(p))), key=named)
    shards = tars.shards_in(src, [p[cut:] for p in paths])
    if shards is not None:
        return tars.list_tars(shards, storage_options, classes, as_named)
    return _listing(FsspecSource(src, storage_options, stamps), paths, [named(p) for p in paths], classes)


def _link_name(link: str) -> str:
    """What a folder page's relative link names: each part of it percent-decoded as UTF-8, where that is a name (a
    part that decodes to one with a "/" in it, or to no UTF-8, stays as written)."""
    parts = []
    for part in link.split("/"):
        try:
            name = urllib.parse.unquote(part, errors="strict")
        except UnicodeDecodeError:
            name = part
        parts.append(part if "/" in name else name)
    return "/".join(parts)


def _find(fs: Any, root: str) -> dict[str, str]:
    """Every object under `root` (folder markers, the empty keys ending in "/" that S3 consoles make,
    are not files) with its stamp, from one listing of the whole prefix, never one a folder: s3fs's
    find pages through ListObjectsV2, 1,000 keys a request."""
    found = fs.find(root, detail=True)
    stamps: dict[str, str] = {}
    for path, info in found.items():
        if path.startswith(root + "/") and not path.endswith("/") and info.get("type", "file") == "file":
            stamps[path] = object_stamp(info)
    del found
    # s3fs keeps each listed object's detail (about 1 KB) in its listings cache for the filesystem's
    # life, which decoding processes forked later copy page by page; nothing here reads it again.
    for path in [p for p in fs.dircache if p == root or p.startswith(root + "/")]:
        fs.dircache.pop(path, None)
    return stamps


def _utf8_name(info: zipfile.ZipInfo) -> str:
    """A member's name as its writer meant it: Info-ZIP's zip (Linux, macOS) stores UTF-8 names without the
    flag that says so, and zipfile then reads them as CP437 ("ünï" as "├╝n├»")."""
    if info.flag_bits & 0x800:
        return info.filename
    try:
        return info.filename.encode("cp437").decode("utf-8")
    except UnicodeError:  # CP437 indeed (old DOS and Windows tools)
        return info.filename


def _list_zip(source: ZipSource, classes: bool, as_named: bool = False) -> Listing:
    infos = [i for i in source.open().infolist() if not i.filename.endswith("/")]
    # A member named from the root, or out of the archive (../): where `unzip` would write outside its folder, no file
    # of the archive's tree (found from outside: /tmp/x.png made a class named ""), listed as skipped.
    unsafe = {i.filename for i in infos if i.filename.startswith("/") or ".." in i.filename.split("/")}
    infos = [i for i in infos if i.filename not in unsafe and not hidden(i.filename)]
    # A link stored as a link (`zip -y`) holds its target's path, no image (found from outside: said to be no image
    # Pillow can read, or a linked folder to be outside the class folders): skipped, saying so, as a tar's are.
    links = {i.filename: i for i in infos if stat.S_ISLNK(i.external_attr >> 16)}
    infos = [i for i in infos if i.filename not in links]
    # A name added again (`zip -u`, or appended) counts once, as its last copy, which reading by name gives; as a
    # tar's (found from outside: both entries were read, the last copy twice and the first lost)
    infos = sorted({i.filename: i for i in infos}.values(), key=_utf8_name)
    names = [i.filename for i in infos]  # what the zip is read by
    rel = [_utf8_name(i) for i in infos]  # what classes and labels are named by
    # Zips of a folder usually hold that one folder at the top: it is a wrapper, not a class.
    tops = {n.split("/", 1)[0] for n in rel}
    if not as_named and len(tops) == 1 and all("/" in n for n in rel):
        rel = [n.split("/", 1)[1] for n in rel]
    listing = _listing(source, names, rel, classes)
    listing.skipped += [
        (n, "a path out of the archive's folder (from the root, or through ..)") for n in sorted(unsafe)
    ]
    for name, info in sorted(links.items()):
        target = source.open().read(info)[:200].decode(errors="replace")
        listing.skipped.append((name, f"a link to {target}, which is no file of the zip (zip it without -y)"))
    return listing


def _listing(source: Source, keys: list[str], rel: list[str], classes: bool) -> Listing:
    if not classes:
        return Listing(source, keys, rel, np.zeros(len(keys), np.int64), [])
    labels, class_names, keep, outside = label_files(rel)
    return Listing(source, [keys[i] for i in keep], [rel[i] for i in keep], labels, class_names, outside)


def has_alpha(img: Image.Image) -> bool:
    """Whether the image carries transparency (an alpha channel, or a transparent colour)."""
    return img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in img.info


def to_rgb(img: Image.Image, composite: bool = True) -> Image.Image:
    """Any Pillow image as 8-bit RGB: 16-bit and float greyscale scaled (not clipped) to 0..255 (a float image from
    0..1, or read as 0..255 where a value passes 2),
    transparency composited onto BACKGROUND (or, not `composite`, dropped: the colours under it, as
    Pillow's convert("RGB") keeps them), CMYK/palette/greyscale converted by Pillow."""
    sample_bits = getattr(img, "tag_v2", {}).get(258, (0,))[0]  # (a TIFF's BitsPerSample)
    if img.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I") and sample_bits != 32:
        # Pillow's convert() clips 16-bit values at 255; scale the full range instead (a PGM of more than 8 bits is
        # read scaled to 16; a 32-bit integer TIFF, whose range is not its levels', is clipped as Pillow does: found
        # from outside, it was made near black).
        a = np.asarray(img, dtype=np.float64)
        a = np.clip(np.round(a / 257.0), 0, 255).astype(np.uint8)
        return Image.fromarray(a, "L").convert("RGB")
    if img.mode == "F":  # 0..1 (a float image's usual range), or 0..255 where a value passes 2 (as Pillow reads
        # it: found from outside, an ImageJ float TIFF of 0..255 was made near white)
        a = np.asarray(img, dtype=np.float64)
        # (past 2, not 1: a 0..1 image resampled overshoots a little; found by review, made near black)
        top = 255.0 if (finite := a[np.isfinite(a)]).size and finite.max() > 2.0 else 1.0  # (NaN black, inf white)
        a = np.nan_to_num(a, nan=0.0, posinf=top, neginf=0.0) * (255.0 / top)
        a = np.clip(np.round(a), 0, 255).astype(np.uint8)
        return Image.fromarray(a, "L").convert("RGB")
    if has_alpha(img) and composite:
        rgba = img.convert("RGBA")
        out = Image.new("RGBA", rgba.size, (*BACKGROUND, 255))
        out.alpha_composite(rgba)
        return out.convert("RGB")
    return img if img.mode == "RGB" else img.convert("RGB")


def fit(
    img: Image.Image, resolution: int | None, ratios: Sequence[float] | None = None, whole: bool = False
) -> tuple[int, Image.Image]:
    """(bucket, image) center-cropped to a square of `resolution`, or with `ratios` (width/height) to
    the nearest shape of `bucket_shapes(resolution, ratios)`, and resized with LANCZOS; unchanged
    without `resolution`. `whole`: not cropped, its short side scaled down to `resolution` (a smaller
    image stays as it is)."""
    bucket = 0
    if resolution is None:
        return bucket, img
    w, h = img.size
    if whole:
        if min(w, h) <= resolution:
            return bucket, img
        scale = resolution / min(w, h)
        size = (resolution, max(1, round(h * scale))) if w <= h else (max(1, round(w * scale)), resolution)
        return bucket, img.resize(size, Image.Resampling.LANCZOS)
    th, tw = resolution, resolution
    if ratios is not None:
        shapes = bucket_shapes(resolution, ratios)
        bucket = nearest_bucket(w, h, [sw / sh for sh, sw in shapes])
        th, tw = shapes[bucket]
    ratio = tw / th
    cw, ch = (max(1, round(h * ratio)), h) if w / h > ratio else (w, max(1, round(w / ratio)))
    if (cw, ch) != (w, h):
        # Crop first: resize(box=...) would let the filter reach pixels outside the crop.
        left, top = (w - cw) // 2, (h - ch) // 2
        img = img.crop((left, top, left + cw, top + ch))
    if (tw, th) != (cw, ch):
        img = img.resize((tw, th), Image.Resampling.LANCZOS)
    return bucket, img


def decode(
    data: bytes,
    resolution: int | None = None,
    ratios: Sequence[float] | None = None,
    alpha: bool = False,
    dfl_masks: int = 0,
    whole: bool = False,
    as_scorers: bool = False,
    yaw: bool = False,
    cut_to: str | None = None,
) -> tuple[int, np.ndarray, str | None, tuple[int, int], float | None]:
    """Decode one image file to (bucket, uint8 HxWx3, face type, its (height, width) as stored, yaw). With
    `resolution`: center-cropped to a square, or with `ratios` (width/height) to the nearest shape of
    `bucket_shapes(resolution, ratios)` (bucket is its index), and resized with LANCZOS. EXIF
    orientation is applied first. `alpha`: a fourth channel, the image's transparency (the face mask of
    the swap task), the colours kept as they are under it (not composited: the background stays the
    background); an image without transparency is refused. `dfl_masks` 1 or 2: the face mask (and the
    eyes-and-mouth region) a DeepFaceLab aligned face carries in its metadata, as channels 4 (and 5), or
    3 or 4 (dfl_faces.LABELS, APPLIED): its XSeg label, or its applied XSeg mask, as channel 4,
    and its face type (SAEHD's name for it; None for other images); with `cut_to` (a face type's SAEHD name), a face
    of another type is cut to that one from its landmarks, with its masks, as DFL's trainers cut it (`cut_face`).
    `yaw`: an aligned DFL face's yaw, and its face type where `dfl_masks` gave none (`dfl_faces.yaw_and_type`,
    whatever `dfl_masks` says; None for other images, and without `yaw`).
    `as_scorers`: as pytorch-fid, clean-fid and torch-fidelity read a file, `Image.open(f).convert("RGB")`:
    no EXIF orientation, the colours under any transparency kept (16-bit images are still scaled, where Pillow
    clips them).
    Raises on bad data."""
    with Image.open(io.BytesIO(data)) as img:
        # Pillow warns of each in two lines of its own (a large photo data set: thousands; the CLI silences them),
        # this once a process, in one. (Over twice its guard Pillow refuses: the file is listed.)
        if Image.MAX_IMAGE_PIXELS and img.width * img.height > Image.MAX_IMAGE_PIXELS:
            warn(
                f"images over {Image.MAX_IMAGE_PIXELS:,} pixels (Pillow's guard against decompression bombs) are "
                "decoded as they are; those over twice that are refused and listed",
                once=True,
            )
        img.load()  # decode now: truncated files fail here, not later
        if not as_scorers:
            ImageOps.exif_transpose(img, in_place=True)  # (in place: a TIFF's tags kept for to_rgb)
        planes = []
        if alpha:
            if not has_alpha(img):
                raise BigbatchError(
                    "has no transparency (alpha channel) to take its face mask from; give a folder of masks "
                    "(--masks DIR) for such images"
                )
            rgba = img.convert("RGBA")
            planes.append(rgba.getchannel("A"))
            img = rgba.convert("RGB")
        else:
            img = to_rgb(img, composite=not as_scorers)
    size = (img.height, img.width)
    face_type = None
    if dfl_masks:
        xseg = {LABELS: "labels", APPLIED: "applied"}.get(dfl_masks, "")
        found, face_type = face_masks(data, (img.height, img.width), dfl_masks == 2, xseg=xseg)
        planes += [Image.fromarray(p) for p in found]
        if cut_to and face_type != cut_to:
            img, planes = cut_face(data, img, planes, cut_to, resolution or img.width, bool(xseg))
            face_type = cut_to
    bucket, img = fit(img, resolution, ratios, whole)
    out = np.asarray(img, dtype=np.uint8)
    if planes:
        out = np.dstack([out, *(np.asarray(fit(p, resolution, ratios)[1], dtype=np.uint8) for p in planes)])
    if not yaw:
        return bucket, out, face_type, size, None
    found, kind = yaw_and_type(data)
    return bucket, out, face_type or kind, size, found


def cut_face(
    data: bytes, img: Image.Image, planes: list[Image.Image], kind: str, side: int, xseg: bool
) -> tuple[Image.Image, list[Image.Image]]:
    """An aligned DFL face and its mask planes cut to face type `kind` at `side` px from the face's own landmarks
    (DFL's get_transform_mat, in one resampling, the outside black), as DFL's trainers cut a face of another type:
    XSeg's (SampleGeneratorFaceXSeg) by Lanczos, SAEHD's (SampleProcessor) the face by bicubic and its masks by
    bilinear interpolation."""
    import cv2

    from bigbatch.data.align import transform_mat

    meta = read_metadata(data)
    mat = transform_mat(landmarks_of(meta or {}), side, kind)

    def cut(x: Image.Image, flags: int) -> Image.Image:
        return Image.fromarray(cv2.warpAffine(np.asarray(x), mat, (side, side), flags=flags))

    face, mask = (cv2.INTER_LANCZOS4,) * 2 if xseg else (cv2.INTER_CUBIC, cv2.INTER_LINEAR)
    return cut(img, face), [cut(p, mask) for p in planes]


def cut_to_name(face_type: str, masks: str | None) -> str:
    """--face-type as SAEHD names it, checked: DFL's aligned faces (--masks dfl, labels or xseg-applied) only."""
    from bigbatch.data.align import face_type as kind_of

    if masks not in ("dfl", "labels", "xseg-applied"):
        raise BigbatchError(
            "--face-type cuts DeepFaceLab's aligned faces to another type by their landmarks: give --masks dfl, "
            "labels or xseg-applied with it"
        )
    short = FACE_TYPES.get(kind_of(face_type).dfl_name)
    if short is None:
        raise BigbatchError(f"--face-type must be one of h, mf, f, wf, head, got {face_type!r}")
    return short


def decode_mask(
    data: bytes, resolution: int | None, ratios: Sequence[float] | None = None
) -> tuple[np.ndarray, tuple[int, int]]:
    """A mask image file (greyscale; any other mode converted) as uint8 HxW, cropped and resized as
    `decode` does its image, and its (height, width) as stored."""
    with Image.open(io.BytesIO(data)) as img:
        img.load()
        img = ImageOps.exif_transpose(img) or img
        img = img.convert("L")
    return np.asarray(fit(img, resolution, ratios)[1], dtype=np.uint8), (img.height, img.width)


class OutOfMemory(Interrupted):
    """Memory ran out decoding: not the file's fault, and not the command's (a prepare keeps what it decoded)."""


def decode_or_reason(
    data: bytes | str,
    resolution: int | None,
    ratios: Sequence[float] | None,
    alpha: bool = False,
    dfl_masks: int = 0,
    whole: bool = False,
    as_scorers: bool = False,
    yaw: bool = False,
    cut_to: str | None = None,
) -> tuple[int, np.ndarray, str | None, tuple[int, int], float | None] | str:
    """`decode`, or a one-line reason why the file is not a usable image."""
    if isinstance(data, str):
        return data
    try:
        return decode(data, resolution, ratios, alpha, dfl_masks, whole, as_scorers, yaw, cut_to)
    except Image.UnidentifiedImageError:
        return "an empty file" if not len(data) else "not an image Pillow can read"  # (found from outside: unsaid)
    except (BigbatchError, NoFaceData) as e:  # DFL metadata missing, or refused (a pickle asking for code)
        return str(e)
    except Image.DecompressionBombError as e:  # (not corrupt: larger than Pillow's guard lets decode)
        return f"too large to decode safely ({e})"
    except MemoryError:  # (not corrupt either: found from outside, a good file was called so)
        raise OutOfMemory(
            "out of memory decoding an image (its size, or --resolution's): run the same prepare again with fewer "
            "--workers or more memory"
        ) from None
    except Exception as e:  # noqa: BLE001 -- Pillow raises many types on corrupt data; each file is skipped alone
        stub = str(e).removeprefix("cannot find loader for this ")  # (Pillow knows HDF5, GRIB, BUFR: found from
        if stub != str(e):  # outside, a data file in a class folder was called a corrupt image)
            return f"not an image Pillow can read (its format: {stub.removesuffix(' file')})"
        return f"corrupt or truncated ({type(e).__name__}: {e})"
