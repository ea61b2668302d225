"""Tar files of images as a source: WebDataset's shards (`train-{000000..000146}.tar`, a folder of .tar files,
local or at a URL), whose samples carry a class index in their `.cls`, and any uncompressed tar of an image
folder (its sub-folders are classes, as a folder's are). Nothing is unpacked: listing reads the headers (a local
tar seeks from header to header; one at a URL is read through once, 8 MiB ahead), and each image is then read at
the offset its header gives, a remote shard's neighbouring members fetched as one byte range. Written here:
webdataset's own reader streams samples in order, and `prepare` needs its listing first (labels, resume, --limit).
"""

from __future__ import annotations

import functools
import posixpath
import re
import tarfile
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import IO, Any

import numpy as np

from bigbatch.data.listing import (
    IMAGE_EXTENSIONS,
    Listing,
    Source,
    fetched,
    file_stamp,
    hidden,
    label_files,
    object_stamp,
)
from bigbatch.errors import BigbatchError, warn
from bigbatch.urls import Location, unreachable

# WebDataset's fields that are never images (the names its default decoders know): not listed as files.
METADATA = frozenset(
    ("cls", "cls2", "index", "inx", "id", "txt", "text", "transcript", "json", "jsn", "pyd", "pickle", "pth")
    + ("ten", "tb", "mp", "msg", "npy", "npz", "cbor", "seed", "key")
)
# A sample's image where it holds several, most preferred first; then any other image field.
PREFERRED = ("jpg", "jpeg", "png", "webp", "ppm", "bmp", "tif", "tiff")
# What a compressed tar starts with: its members have no offsets to read them at.
COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}
LISTERS = 8  # shards whose headers are read at once
MAX_CLASSES = 1 << 17  # a .cls past this is not a class index (ImageNet-21k has 21,841)
MAX_MEMBER = 512 << 20  # a member larger than this is not read (no image is)
GAP = 1 << 20  # members of a remote shard at most this far apart are fetched in one byte range
MAX_RANGE = 64 << 20  # ... and one range is at most this long
KEPT_WHOLE = 4  # shards kept whole at once from a server that ignores ranges (a chunk of each in flight, as prepare's
# fetching threads have them)
# WebDataset's split of a member's name into the sample's key and the field: the key runs to the first dot of
# the file name ("a/b.seg.png": key "a/b", field "seg.png").
_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


def sample_key(name: str) -> tuple[str, str]:
    """(key, field) of a member's name, as WebDataset groups members into samples."""
    m = _KEY.match(name)
    return (m.group(1), m.group(2)) if m else (name, "")


def is_tar_name(text: str) -> bool:
    return text.lower().endswith(".tar")


def shards_named(src: Location) -> list[Location] | None:
    """The shards a brace pattern names (`train-{000000..000146}.tar`, WebDataset's notation, local or at a
    URL), or a `.tar` URL as one shard; None for anything else (a local file is told a tar by its contents)."""
    text = src.text
    if "::" in text and not src.url:
        raise BigbatchError(
            f"source {src.name}: '::' joins WebDataset's sources, and prepare takes one: a brace pattern, a folder or "
            "prefix of the shards, or one .tar"
        )
    if "{" in text and "}" in text and (src.url or not src.path.exists()):
        from braceexpand import braceexpand

        try:
            names = list(braceexpand(text))
        except Exception as e:  # noqa: BLE001 -- braceexpand raises plain errors on a malformed pattern
            raise BigbatchError(f"source {src.name} is not a shard pattern braceexpand reads ({e})") from None
        if names != [text]:
            if len(set(names)) < len(names):  # (found from outside: its images twice, unsaid)
                twice = next(n for i, n in enumerate(names) if n in names[:i])
                raise BigbatchError(f"source {src.name} names shard {twice} more than once: give each shard once")
            if not all(is_tar_name(n) for n in names):
                raise BigbatchError(
                    f"source {src.name} names files other than .tar shards; a pattern names WebDataset shards, "
                    "as train-{000000..000146}.tar"
                )
            shards = [Location.of(n) for n in names]
            if not src.url:
                missing = [s.name for s in shards if not s.path.is_file()]
                if missing:
                    raise BigbatchError(
                        f"shard {missing[0]} does not exist ({len(missing)} of the {len(shards)} shards "
                        f"{src.name} names are missing); give a pattern of the shards there are"
                    )
            return shards
    if src.url and is_tar_name(text.split("?", 1)[0]):
        return [src]
    return None


def read_by_listing(src: Location) -> bool:
    """Whether `src` names no local file or folder of its own and is read by listing it: a URL, or a pattern of
    tar shards."""
    return src.url or shards_named(src) is not None


def shards_in(folder: Location, rel: list[str]) -> list[Location] | None:
    """A folder or URL prefix holding .tar files and no images (listed as `rel`, at any depth): its shards, in
    sorted order, all in one folder (train/ and validation/ shards are two data sets, not one)."""
    if not any(is_tar_name(r) for r in rel) or any(PurePosixPath(r).suffix.lower() in IMAGE_EXTENSIONS for r in rel):
        return None
    tars = sorted(r for r in rel if is_tar_name(r))
    places = sorted({posixpath.dirname(r) for r in tars})
    if len(places) > 1:
        shown = ", ".join(p or "(the top)" for p in places[:4]) + (", ..." if len(places) > 4 else "")
        raise BigbatchError(
            f"source {folder.name} holds .tar shards in {len(places)} folders ({shown}): give the folder of one set "
            "of shards, or a pattern of them"
        )
    base = folder.text.rstrip("/")
    return [Location.of(f"{base}/{r}") for r in tars]


class TarSource(Source):
    """Members of tar shards by (shard, offset, size) keys, "i:offset:size"; local shards read by the decoding
    processes, remote ones fetched by byte ranges in the main process."""

    def __init__(self, shards: list[Location], storage_options: dict[str, Any] | None, stamps: list[str]):
        self.shards, self.storage_options, self.stamps = shards, storage_options, stamps
        self.worker_reads = not shards[0].url
        # A server that ignores range requests (`python -m http.server`; found from outside: refused, where WebDataset
        # streams it) sends a shard whole: the last KEPT_WHOLE sent are kept, their members sliced from them. A
        # shard's first range is asked alone, under the lock (prepare fetches from several threads), so that it comes
        # whole once; shards whose server takes ranges are fetched by range alone after that.
        self._ranged: set[int] = set()
        self._whole: dict[int, bytes] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_whole": {}, "_lock": None}  # (a shard's bytes stay in the process that fetched it)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def stamp(self, key: str) -> str:
        return self.stamps[int(key.split(":", 1)[0])]

    def shown(self, key: str, name: str) -> str:
        """A member as a reader names it: its shard, then its name there."""
        return f"{self.shards[int(key.split(':', 1)[0])].name}/{name}"

    def member_name(self, key: str, name: str) -> str:
        return _in_shard(self.shards, int(key.split(":", 1)[0]), name)

    def read(self, keys: Sequence[str]) -> list[bytes | str]:
        spans = [tuple(int(v) for v in k.split(":")) for k in keys]
        out: list[bytes | str] = [""] * len(keys)
        wanted: dict[int, list[int]] = {}
        for j, (shard, _, size) in enumerate(spans):
            if size > MAX_MEMBER:
                out[j] = f"{size / 2**20:.0f} MiB, more than any image ({MAX_MEMBER >> 20} MiB): skipped"
            else:
                wanted.setdefault(shard, []).append(j)
        for shard, js in wanted.items():
            mine = [spans[j][1:] for j in js]
            got = self._local(shard, mine) if self.worker_reads else self._remote(shard, mine)
            for j, data in zip(js, got):
                size = spans[j][2]
                short = isinstance(data, bytes) and len(data) < size
                out[j] = f"truncated: {len(data)} of its {size} bytes in the shard" if short else data
        return out

    def _local(self, shard: int, spans: list[tuple[int, ...]]) -> list[bytes | str]:
        """The (offset, size) `spans` of a local shard."""
        try:
            with open(self.shards[shard].path, "rb") as f:
                got: list[bytes | str] = []
                for offset, size in spans:
                    f.seek(offset)
                    got.append(f.read(size))
                return got
        except OSError as e:
            return [f"unreadable ({e.strerror or e})"] * len(spans)

    def _remote(self, shard: int, spans: list[tuple[int, ...]]) -> list[bytes | str]:
        """The (offset, size) `spans` of a remote shard, neighbours fetched as one range (the shard whole, once, from
        a server that ignores ranges)."""
        probed: tuple[int, bytes | str] | None = None  # (a span fetched alone to learn whether ranges are taken)
        if shard not in self._ranged:
            with self._lock:
                whole = self._whole.get(shard)
                if whole is None and shard not in self._ranged:  # (its server not yet asked for a range)
                    first = min(range(len(spans)), key=lambda j: spans[j][0])
                    got, whole = self._ranges(shard, [spans[first]], probe=True)
                    if whole is not None:
                        self._whole[shard] = whole
                        while len(self._whole) > KEPT_WHOLE:
                            del self._whole[next(iter(self._whole))]  # (the oldest)
                    elif isinstance(got[0], bytes):  # (a range, as asked: the rest by range too)
                        self._ranged.add(shard)
                        probed = first, got[0]
                if whole is not None:
                    return [whole[offset : offset + size] for offset, size in spans]
        if probed is None:
            return self._ranges(shard, spans)[0]
        others = [span for j, span in enumerate(spans) if j != probed[0]]
        rest = iter(self._ranges(shard, others)[0] if others else [])
        return [probed[1] if j == probed[0] else next(rest) for j in range(len(spans))]

    def _ranges(
        self, shard: int, spans: list[tuple[int, ...]], probe: bool = False
    ) -> tuple[list[bytes | str], bytes | None]:
        """The `spans`, and (a `probe`'s one span) the shard whole where its server sent all of it."""
        fs, path = self.shards[shard].fs(self.storage_options)
        ranges: list[list[int]] = []  # [start, end, spans...]
        for j in sorted(range(len(spans)), key=lambda j: spans[j][0]):
            offset, size = spans[j]
            last = ranges[-1] if ranges else None
            if last is not None and offset - last[1] <= GAP and offset + size - last[0] <= MAX_RANGE:
                last[1] = max(last[1], offset + size)
                last.append(j)
            else:
                ranges.append([offset, offset + size, j])
        options = {"max_concurrency": 1} if getattr(fs, "max_concurrency", 1) > 1 else {}
        blobs = fs.cat_ranges(
            [path] * len(ranges), [r[0] for r in ranges], [r[1] for r in ranges], on_error="return", **options
        )
        found: dict[int, bytes | str] = {}
        for r, blob in zip(ranges, blobs):
            if isinstance(blob, bytes) and len(blob) > r[1] - r[0]:  # (found from outside: decoded as the images)
                if probe and len(blob) >= r[1]:  # the shard whole: the caller keeps it
                    return [blob[offset : offset + size] for offset, size in spans], blob
                blob = (
                    f"the server sent {len(blob):,} bytes for a range of {r[1] - r[0]:,}: it ignores HTTP range "
                    "requests, which reading a tar's members needs; serve it from one that takes them, or download it"
                )
            for j in r[2:]:
                if isinstance(blob, bytes):
                    start = spans[j][0] - r[0]
                    found[j] = blob[start : start + spans[j][1]]
                elif isinstance(blob, str):
                    found[j] = f"unreadable ({blob})"
                else:
                    found[j] = fetched(blob, self.shards[shard].name)
        return [found[j] for j in range(len(spans))], None


def list_tars(
    shards: list[Location], storage_options: dict[str, Any] | None, classes: bool, as_named: bool = False
) -> Listing:
    """Every image member of the shards, shard by shard, in sorted order: with WebDataset's `.cls` fields (any in
    the shards), one image a sample, labelled by its class index (`classes`); otherwise every file, labelled by
    its top folder as a folder's files are."""
    members: list[tuple[int, str, int, int]] = []  # (shard, name, offset, size)
    cls: dict[tuple[int, str], int | bytes] = {}
    fields_only: list[tuple[int, str]] = []
    fields: list[str] = []  # (as a listing names them: with the shard where there are several)
    stamps: list[str] = []
    damaged: list[tuple[str, str]] = []
    # Shards listed LISTERS at a time (a remote one is a download; a local one, seeks).
    with ThreadPoolExecutor(min(LISTERS, len(shards))) as pool:
        for i, scanned in enumerate(pool.map(lambda s: _scan(s, storage_options), shards)):
            members += [(i, *m) for m in scanned.members]
            cls.update(((i, k), v) for k, v in scanned.cls.items())
            fields_only += [(i, k) for k in scanned.fields_only]
            damaged += [(_in_shard(shards, i, n), why) for n, why in scanned.damaged]  # (a file's, a dangling link's)
            stamps.append(scanned.stamp)
            alone = set(scanned.fields_only) if classes else set()  # (samples of fields alone: skipped, said there)
            fields += [_in_shard(shards, i, n) for n in scanned.fields if sample_key(n)[0] not in alone]
    members.sort(key=lambda m: (m[0], m[1]))  # (shard order, then names sorted, as a folder's and a zip's are)
    source = TarSource(shards, storage_options, stamps)
    names = _unwrapped([m[1] for m in members], as_named)
    keys = [f"{m[0]}:{m[2]}:{m[3]}" for m in members]
    if cls:
        listing = _samples(source, members, names, keys, cls, fields_only, classes)
    elif classes and _class_tars(shards, members):  # ImageNet's train set: n01440764.tar holds n01440764_*.JPEG
        stems = sorted({_stem(s) for s in shards})
        at = {stem: i for i, stem in enumerate(stems)}
        labels = np.asarray([at[_stem(shards[m[0]])] for m in members], np.int64)
        listing = Listing(source, keys, names, labels, stems)
    elif classes:
        labels, class_names, keep, outside = label_files(names)
        listing = Listing(source, [keys[i] for i in keep], [names[i] for i in keep], labels, class_names, outside)
    else:
        listing = Listing(source, keys, names, np.zeros(len(keys), np.int64), [])
    listing.skipped = damaged + listing.skipped
    # The fields not read, left out as a folder's captions are (found from outside: unsaid); a .cls labels its sample.
    listing.left_out += [name for name in fields if not (cls and classes and _field_kind(name) == "cls")]
    kinds = {_field_kind(name) for name in fields} if classes and not cls else set()
    if labelled := sorted(kinds & {"json", "jsn", "cls2"}):  # (.txt: a caption)
        warn(  # (found from outside: a label in each sample's .json went unsaid, and the data unconditional)
            f"the shards' samples hold .{', .'.join(labelled)} fields and no .cls: a sample's class index is read "
            f"from its .cls field alone (WebDataset's cls), so these are "
            f"{'labelled by their folders' if listing.class_names else 'unlabelled'}; write it as KEY.cls to label them"
        )
    return listing


def _field_kind(name: str) -> str:
    """A field's kind, the last part of its ending (a.seg.json: json), lower case."""
    return sample_key(name)[1].rsplit(".", 1)[-1].lower()


def _in_shard(shards: list[Location], i: int, name: str) -> str:
    """A member of shard `i` as a listing's skipped files name it: with its shard where there are several."""
    return name if len(shards) == 1 or name == shards[i].name else f"{shards[i].name}/{name}"


def _stem(shard: Location) -> str:
    return posixpath.basename(shard.text.split("?", 1)[0])[: -len(".tar")]


def _class_tars(shards: list[Location], members: list[tuple[int, str, int, int]]) -> bool:
    """Whether each of several shards is a class: its files, in no folder, all named after it (ImageNet's
    ILSVRC2012_img_train.tar holds n01440764.tar, whose files are n01440764_10026.JPEG ...)."""
    stems = [_stem(s) for s in shards]
    flat = ((i, name.removeprefix("./")) for i, name, _, _ in members)
    return len(shards) > 1 and all("/" not in name and name.startswith(f"{stems[i]}_") for i, name in flat)


def _unwrapped(names: list[str], as_named: bool = False) -> list[str]:
    """Member names relative to the tar's own folder: one folder holding everything (`tar cf train.tar train/`)
    is a wrapper, not a class, as in a zip (but `as_named`: predict's names, the members' own, found by review);
    names under "./" (`tar -C DIR .`) are the folder's own already."""
    contents = bool(names) and all(n.startswith("./") for n in names)
    names = [n.removeprefix("./").lstrip("/") for n in names]
    tops = {n.split("/", 1)[0] for n in names}
    if not as_named and not contents and len(tops) == 1 and all("/" in n for n in names):
        names = [n.split("/", 1)[1] for n in names]
    return names


def _samples(
    source: TarSource,
    members: list[tuple[int, str, int, int]],
    names: list[str],
    keys: list[str],
    cls: dict[tuple[int, str], int | bytes],
    fields_only: list[tuple[int, str]],
    classes: bool,
) -> Listing:
    """One member a WebDataset sample (its image, by PREFERRED), labelled by its .cls; the samples of nothing but
    fields (`fields_only`) skipped."""
    chosen: dict[tuple[int, str], tuple[int, int]] = {}  # sample -> (rank, member index)
    others: list[int] = []  # the members of a sample besides its image
    for j, (shard, name, _, _) in enumerate(members):
        key, field = sample_key(name)
        last = field.rsplit(".", 1)[-1].lower()
        if f".{last}" in IMAGE_EXTENSIONS:  # a field such as "seg.png" after the sample's plain "png"
            rank = (PREFERRED.index(last) if last in PREFERRED else len(PREFERRED)) + 20 * ("." in field)
        else:  # (listed where the sample has no image: decoding says what it is instead)
            rank = 500
        before = chosen.get((shard, key), (1000, -1))
        if rank < before[0]:
            chosen[(shard, key)] = (rank, j)
        others.append(before[1] if rank < before[0] else j)
    out_keys, out_names, labels, skipped = [], [], [], []
    shown = functools.partial(_in_shard, source.shards)
    for (shard, key), (_, j) in chosen.items():  # (in the order samples first appear)
        label = 0
        if classes:
            found = cls.get((shard, key))
            if not isinstance(found, int):
                reason = "no .cls class index" if found is None else f"its .cls holds {found[:20]!r}, not a class index"
                skipped.append((shown(shard, names[j]), reason))
                continue
            label = found
        out_keys.append(keys[j])
        out_names.append(names[j])
        labels.append(label)
    # (found from outside: frame.0000.jpg ... frame.0003.jpg, one key; an image set, eval's, takes a sample's image)
    for j in sorted(o for o in others if o >= 0 and classes):
        image = names[chosen[(members[j][0], sample_key(members[j][1])[0])][1]]
        why = f"another file of the sample whose image is {image} (a sample: the files of one key, up to the first dot)"
        skipped.append((shown(members[j][0], names[j]), why))
    if classes:  # (a sample of fields alone is no image to score or predict: left alone there, as a folder's .json)
        why = "a sample with no file but its fields (.cls, .json, ...): no image"
        skipped += [(shown(shard, key.removeprefix("./")), why) for shard, key in fields_only]
    class_names = [str(c) for c in range(max(labels) + 1)] if classes and labels else []
    return Listing(source, out_keys, out_names, np.asarray(labels, np.int64), class_names, [], skipped, classes)


def _class_index(text: bytes) -> int | bytes:
    """The class index a .cls field holds (WebDataset writes it as decimal text), or the text where it holds none."""
    try:
        value = int(text.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return text
    return value if 0 <= value < MAX_CLASSES else text


def _open(shard: Location, storage_options: dict[str, Any] | None) -> tuple[IO[bytes], str]:
    """The shard opened for reading, and its stamp (local: size and time; remote: size and ETag)."""
    try:
        if not shard.url:
            return open(shard.path, "rb"), file_stamp(str(shard.path))  # noqa: SIM115 (closed by _scan)
        fs, path = shard.fs(storage_options)
        stamp = object_stamp(fs.info(path))
        return fs.open(path, "rb", block_size=8 << 20, cache_type="readahead"), stamp
    except FileNotFoundError as e:
        if said := unreachable(e, f"shard {shard.name}"):
            raise BigbatchError(said) from None
        raise BigbatchError(f"shard {shard.name} does not exist; give the shards there are") from None
    except BigbatchError:
        raise
    except Exception as e:  # noqa: BLE001 -- OSError locally; s3fs/botocore errors have no common base
        raise BigbatchError(f"cannot read shard {shard.name}: {type(e).__name__}: {e}") from None


@dataclass
class _Scanned:
    """What one shard's headers say: its files but WebDataset's fields (name, offset, size), its .cls class indices
    by sample key (or the text of one that is none), the samples of fields alone, the fields' names, the damage
    found, its stamp."""

    stamp: str
    members: list[tuple[str, int, int]] = field(default_factory=list)
    cls: dict[str, int | bytes] = field(default_factory=dict)
    fields_only: list[str] = field(default_factory=list)
    damaged: list[tuple[str, str]] = field(default_factory=list)
    fields: list[str] = field(default_factory=list)  # the names of its fields' members (KEY.cls, KEY.json, ...)


def _scan(shard: Location, storage_options: dict[str, Any] | None) -> _Scanned:
    """The regular files of one shard; where the tar is damaged, the members before the damage are kept and the
    damage is listed."""
    f, stamp = _open(shard, storage_options)
    out = _Scanned(stamp)
    members, damaged = out.members, out.damaged
    fields: set[str] = set()  # the samples that have fields (.cls, .json, ...)
    links: list[str] = []  # the member each link names (a link's member holds offset -1 and its place here)
    with f:
        head = f.read(6)
        kind = next((k for magic, k in COMPRESSED.items() if head.startswith(magic)), None)
        if kind:
            raise BigbatchError(
                f"shard {shard.name} is a {kind}-compressed tar; decompress it first (a compressed tar's images "
                "cannot be read where they lie; WebDataset's shards are plain .tar)"
            )
        f.seek(0)
        try:
            tar = tarfile.open(fileobj=f, mode="r:")
        except tarfile.ReadError as e:
            raise BigbatchError(f"{shard.name} is not a readable tar file ({e})") from None
        try:
            while (m := tar.next()) is not None:
                del tar.members[:]  # (only `next` is used: a million TarInfos need not be kept)
                if hidden(m.name.removeprefix("./")) or not (m.isreg() or m.islnk() or m.issym()) or m.issparse():
                    continue
                key, kind = sample_key(m.name)
                field = kind.rsplit(".", 1)[-1].lower() in METADATA
                if field:
                    out.fields.append(m.name)
                if not m.isreg():  # (hard links: `cp -al` trees, GNU tar's second name of a file; symbolic ones)
                    target = m.linkname if m.islnk() else posixpath.join(posixpath.dirname(m.name), m.linkname)
                    if not field:  # (a link as a field, .cls or .json, is not followed)
                        members.append((m.name, -1, len(links)))
                        links.append(posixpath.normpath(target))
                    continue
                if not field:
                    members.append((m.name, m.offset_data, m.size))
                    continue
                fields.add(key)
                if kind.lower() == "cls":
                    f.seek(m.offset_data)
                    out.cls[key] = _class_index(f.read(min(m.size, 64)))
        except (tarfile.TarError, EOFError, OSError) as e:
            end = f.seek(0, 2)  # (found from outside: a cut shard was said read up to a byte past its end)
            what = (f"cut short at byte {end}, within a member: what lies before it is read" if tar.offset > end
                    else f"what lies before byte {tar.offset} is read, nothing after")  # fmt: skip
            damaged.append((shard.name, f"a damaged tar: {what} ({e})"))
        else:
            f.seek(tar.offset)
            rest = f.read(tarfile.BLOCKSIZE)  # where `next` stopped: the end, or a header it could not read
            if rest.strip(b"\0"):
                damaged.append((shard.name, f"a damaged tar: byte {tar.offset} is not a tar header; the members "
                                            "after it are not read"))  # fmt: skip
            elif len(rest) < tarfile.BLOCKSIZE:  # (found from outside: a download cut between members read as whole)
                why = f"it ends at byte {tar.offset} without tar's end blocks, so members after it may be lost"
                damaged.append((shard.name, f"a tar cut short: {why}; what lies before is read"))
    if len({name for name, _, _ in members}) < len(members):  # (`tar rf` appends a file again: the last one stands)
        last = {name: i for i, (name, _, _) in enumerate(members)}
        members[:] = [m for i, m in enumerate(members) if last[m[0]] == i]
    if links:
        _resolve(links, out)
    images = {sample_key(name)[0] for name, _, _ in members}
    out.fields_only = sorted(fields - images)
    return out


def _resolve(links: list[str], out: _Scanned) -> None:
    """The shard's links (members at offset -1) read as the files they name in it (a link to a link followed, up to
    8), in their places; one naming no file of the shard is listed as damage."""
    found = {posixpath.normpath(name): (at, size) for name, at, size in out.members if at >= 0}
    named = {posixpath.normpath(name): links[i] for name, at, i in out.members if at < 0}
    resolved = []
    for name, at, size in out.members:
        if at < 0:
            target = links[size]
            for _ in range(8):
                if target in found or target not in named:
                    break
                target = named[target]
            if target not in found:
                out.damaged.append((name.removeprefix("./"), f"a link to {target}, which is no file of the shard"))
                continue
            at, size = found[target]
        resolved.append((name, at, size))
    out.members[:] = resolved
