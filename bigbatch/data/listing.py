"""What a source of images lists: its files in a fixed order with their labels, and the reader of their bytes.
`bigbatch prepare`, image sets (`eval`) and `predict` take these from folders, zips, URL prefixes and tar shards."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from bigbatch.errors import BigbatchError, printable
from bigbatch.urls import unreachable

# Files with these endings are images (pytorch-fid's and torch-fidelity's list, and a few more Pillow
# opens); anything else in a folder (captions, .json, .npz) is left alone, as those tools do.
IMAGE_EXTENSIONS = frozenset(
    e
    for e in (".bmp", ".gif", ".jpeg", ".jpg", ".jpe", ".jfif", ".pbm", ".pgm", ".png", ".pnm", ".ppm", ".tga")
    + (".tif", ".tiff", ".webp", ".avif", ".qoi", ".jp2", ".j2k")
    if Image.registered_extensions().get(e) in Image.OPEN
)

IMAGE_ENDINGS = ", ".join(sorted(e[1:] for e in IMAGE_EXTENSIONS))  # (said in messages)

# What `bigbatch extract` writes beside the aligned faces it makes: the frames in which it found no face.
NO_FACE_LIST = "no_face.txt"


def hidden(rel: str) -> bool:
    # Dot files, macOS resource forks and zip folders: operating-system litter, not images; and extract's list of
    # frames without a face, at the top of its output (prepare reads what extract wrote, --strict too).
    return rel == NO_FACE_LIST or any(p.startswith(".") or p == "__MACOSX" for p in rel.split("/"))


@dataclass
class Listing:
    """The files of a source in a fixed order, with labels; `outside` lists files that sit beside
    class folders and so have no class."""

    source: Source
    keys: list[str]
    names: list[str]
    labels: np.ndarray
    class_names: list[str]
    outside: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """Files (or WebDataset samples) the listing already knows cannot be taken, and why."""
    indexed: bool = False
    """The labels are class indices as the source gave them (WebDataset's .cls), not places in sorted folder
    names: a class without images shifts nothing, and --classes only names them."""
    thinned: bool = False
    """Some of the source's files left out (--limit)."""
    special: list[str] = field(default_factory=list)
    """A folder's named pipes, sockets and devices: never read (their reader would block), listed by prepare."""
    left_out: list[str] = field(default_factory=list)
    """Files that are no images by their endings (by_ending): left out, counted by prepare."""

    def shown(self, i: int) -> str:
        """How messages name file `i` (found from outside: a tar member without its shard, as the listing's own
        skips name it)."""
        return self.source.member_name(self.keys[i], self.names[i])

    def subset(self, limit: int) -> Listing:
        """`limit` files: each class's share of them (by largest remainders) spread evenly over its files (found from
        outside: spread over the listing, WebDataset shards' interleaved classes were not kept in their shares)."""
        take = np.arange(len(self.keys))
        if limit < len(self.keys):
            _, inverse, counts = np.unique(self.labels, return_inverse=True, return_counts=True)
            quota = counts * limit / len(self.keys)
            share = np.floor(quota).astype(int)
            share[np.argsort(share - quota, kind="stable")[: limit - share.sum()]] += 1
            picks = [np.flatnonzero(inverse == c)[(np.arange(k) * counts[c]) // k] for c, k in enumerate(share) if k]
            take = np.sort(np.concatenate(picks))
        return dataclasses.replace(
            self,
            keys=[self.keys[i] for i in take],
            names=[self.names[i] for i in take],
            labels=self.labels[take],
            thinned=self.thinned or limit < len(self.keys),
        )


def is_image_name(name: str) -> bool:
    """Whether a file is an image by its name's ending (IMAGE_EXTENSIONS, any case)."""
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def by_ending(listing: Listing, source: str, refuse_emptied: bool = True) -> Listing:
    """The listing's image files by their endings, the others left out (`left_out`), as torchvision's ImageFolder
    and FFCV leave them (found from outside: img2dataset's captions and .json beside each image were decoded and
    skipped as corrupt, burying the corrupt images among them, and --strict refused the layout). A class folder
    holding files but no image is refused, as one whose images are all unreadable is (a class of no images
    shifts the other classes' indices), where `refuse_emptied`; a source of no image file, always."""
    keep = [i for i, name in enumerate(listing.names) if is_image_name(name)]
    left_out = sorted(n for n in (*listing.names, *listing.outside) if not is_image_name(n))
    if not left_out:
        return listing
    if not keep and not any(map(is_image_name, listing.outside)):
        fix = archives_said(left_out) or f": images are taken by their endings ({IMAGE_ENDINGS})"
        raise BigbatchError(f"source {source} holds no image files, only {said_left_out(endings(left_out))}{fix}")
    if listing.class_names and refuse_emptied:
        emptied = sorted(set(listing.labels.tolist()) - set(listing.labels[keep].tolist()))
        if shown := [listing.class_names[c] for c in emptied]:
            one = len(shown) == 1
            # (a class tar's members are named without their class: found by review, no example to give)
            example = next((f"e.g. {n}; " for n in left_out if n.startswith(f"{shown[0]}/")), "")
            raise BigbatchError(
                f"class folder{'' if one else 's'} {', '.join(shown[:5])}{', ...' if len(shown) > 5 else ''} of "
                f"{source} hold{'s' if one else ''} no image file ({example}images are taken by their endings: "
                f"{IMAGE_ENDINGS}): a class of no images shifts the other classes' indices; remove "
                f"{'it' if one else 'them'} or put images in {'it' if one else 'them'}"
            )
    return dataclasses.replace(
        listing,
        keys=[listing.keys[i] for i in keep],
        names=[listing.names[i] for i in keep],
        labels=listing.labels[keep],
        outside=[n for n in listing.outside if is_image_name(n)],
        left_out=[*listing.left_out, *left_out],
    )


def endings(names: Sequence[str]) -> dict[str, int]:
    """How many of `names` end in each ending (lower case; "" for none), most first."""
    counts: dict[str, int] = {}
    for name in names:
        ending = os.path.splitext(name)[1].lower()
        counts[ending] = counts.get(ending, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def archives_said(names: list[str]) -> str:
    """What to do where a source of no images holds archives (found from outside), or ""."""
    if not any(name.lower().endswith((".tar", ".tar.gz", ".tgz")) for name in names):
        return ""
    return (
        "; it holds archives, as ImageNet's training tar holds a tar a class: unpack it once (tar xf) and give the "
        "folder, whose class tars prepare reads"
    )


def said_left_out(counts: dict[str, int]) -> str:
    """Files left out by their endings (`endings`' counts), said with how many of each ending."""
    kinds = ", ".join(f"{ending or 'no ending'} {n}" for ending, n in counts.items())
    n = sum(counts.values())
    what = "1 file that is no image by its" if n == 1 else f"{n} files that are no images by their"
    return f"{what} ending ({kinds})"


def per_class(names: Sequence[str], counts: Sequence[int]) -> str:
    """Images of each class, said: each one's where there are few classes, else the range and the fewest."""
    if len(names) <= 10:
        return ", ".join(f"{printable(name)} {n}" for name, n in zip(names, counts))
    order = sorted(range(len(names)), key=lambda c: (counts[c], c))
    low, high, median = counts[order[0]], counts[order[-1]], float(np.median(counts))
    fewest = ", ".join(f"{printable(names[c])} {counts[c]}" for c in order[:3])
    return f"{low} to {high} images (median {median:g}); fewest: {fewest}"


FACE_SETS = ("dfl", "labels", "xseg-applied")  # prepare's --masks of a DeepFaceLab face set (an aligned folder)
IN_A_SUB_FOLDER = (
    "in a sub-folder: a face set is its folder's top level, as DFL's trainer reads it (move it up to take it)"
)


def top_level(listing: Listing) -> Listing:
    """A DeepFaceLab face set's files as DFL's trainer reads its folder: those of the top level, a sub-folder's (a
    swap's masks/, a rejects/ folder) skipped and said; all of them where none is at the top (found from outside:
    a rejects/ sub-folder was taken as the one class folder, and the faces beside it left out)."""
    top = [i for i, name in enumerate(listing.names) if "/" not in name]
    if not top or len(top) == len(listing.names):
        return listing
    below = [(name, IN_A_SUB_FOLDER) for name in listing.names if "/" in name]
    keys, names = [listing.keys[i] for i in top], [listing.names[i] for i in top]
    return dataclasses.replace(
        listing, keys=keys, names=names, labels=listing.labels[top], skipped=[*listing.skipped, *below]
    )


def label_files(rel: list[str]) -> tuple[np.ndarray, list[str], list[int], list[str]]:
    """Class labels from the first folder of each relative path: (labels, class names, indices of the
    files in a class, files outside any class). No sub-folders at all: unconditional, label 0."""
    tops = sorted({p.split("/", 1)[0] for p in rel if "/" in p})
    if not tops:
        return np.zeros(len(rel), np.int64), [], list(range(len(rel))), []
    index = {name: i for i, name in enumerate(tops)}
    keep = [i for i, p in enumerate(rel) if "/" in p]
    labels = np.array([index[rel[i].split("/", 1)[0]] for i in keep], np.int64)
    return labels, tops, keep, [p for p in rel if "/" not in p]


class Interrupted(BigbatchError):
    """What stops a prepare that is neither a file's fault nor the command's (memory ran out, the source stopped
    answering): it keeps what it decoded, and the same command goes on from there."""


class SourceFailed(Interrupted):
    """A remote source that stopped answering (the network, the server, credentials that expired)."""


def fetched(got: object, name: str) -> bytes | str:
    """What a remote read (fsspec's cat_ranges, on_error="return") gave for the object `name`: its bytes, or
    the reason it is skipped where it is gone since it was listed. Any other failure is not the file's: it stops
    the prepare, which goes on from there when run again (found from outside: a server gone half way through was
    220 files "unreadable", skipped, and a prepare that ended with exit 0 and a data file missing them)."""
    if isinstance(got, bytes):
        return got
    if isinstance(got, FileNotFoundError) and not unreachable(got, name):  # (over HTTP, a server down says so too)
        return f"unreadable (gone since it was listed: {got})"
    if refused(got):  # (the object's own: an ACL, a KMS key; found by review, it stopped every rerun)
        return f"unreadable (refused: {type(got).__name__}: {got})"
    raise SourceFailed(
        f"reading {name} failed ({type(got).__name__}: {got}); once the source answers again (network, server, "
        "credentials), run the same command"
    )


def refused(got: object) -> bool:
    """A remote read refused for the object itself: permission denied (S3's 403), or an HTTP answer 4xx but a
    timeout's or too-many-requests'."""
    status = getattr(got, "status", None)
    return isinstance(got, PermissionError) or (
        isinstance(status, int) and 400 <= status < 500 and status not in (408, 429)
    )


def fetched_all(got: Sequence[object], names: Sequence[str]) -> list[bytes | str]:
    """`fetched` of each; where every object of several read together was refused, not the objects' doing (expired
    credentials, say): it stops the prepare (SourceFailed), as a source that stops answering does."""
    if len(got) > 1 and all(map(refused, got)):
        raise SourceFailed(
            f"reading {names[0]} and the {len(got) - 1} read with it was refused ({type(got[0]).__name__}: {got[0]}); "
            "once the credentials let them be read, run the same command"
        )
    return [fetched(g, n) for g, n in zip(got, names)]


class Source:
    """Reads the bytes of listed files. `worker_reads`: decoding processes read files themselves
    (local); otherwise the main process fetches them, concurrently, and ships the bytes."""

    worker_reads = True

    def read(self, keys: Sequence[str]) -> list[bytes | str]:
        """The bytes of each file, or a reason why it could not be read."""
        raise NotImplementedError

    def stamp(self, key: str) -> str:
        """What changes when the listed file does, as the listing saw it ("": nothing known; a zip's
        members are stamped by the zip's own)."""
        return ""

    def member_name(self, key: str, name: str) -> str:
        """How messages name the listed file `name` (a shard's member: with its shard where there are several)."""
        return name


def file_stamp(path: str) -> str:
    """A local file's size and modification time ("" if it cannot be read): a file changed since a killed
    prepare is not taken from its parts."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return ""
    return f"{st.st_size}:{st.st_mtime_ns}"


# What an object's listing says changes with it, by filesystem (s3fs, gcsfs, adlfs; local and memory).
STAMP_FIELDS = ("ETag", "etag", "md5Hash", "mtime", "LastModified", "updated", "created")


def object_stamp(info: dict[str, Any]) -> str:
    """What changes when a remote object does, from its fsspec listing (its size, and its ETag or time)."""
    tag = next((info[f] for f in STAMP_FIELDS if info.get(f)), "")
    return f"{info.get('size', '')}:{tag}"
