"""`prepare`'s output, checked before anything is decoded: its name, whether it exists, that it can be
written (a local folder, a bucket), and one writer at a time; and its report of what it wrote."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bigbatch.data.listing import Listing, archives_said, per_class, said_left_out
from bigbatch.data.tars import is_tar_name
from bigbatch.errors import BigbatchError, counted, named_few, warn
from bigbatch.files import lock_folder, unlock_folder
from bigbatch.urls import WHERE_CREDENTIALS_GO, Location, option_credentials, url_fix


def refuse_output(target: Location, storage_options: dict[str, Any] | None, overwrite: bool) -> None:
    """An output that is not a .h5 name, or that exists (unless `overwrite`), refused; so are storage
    options that carry credentials (they would be written with the run)."""
    secrets = option_credentials(storage_options or {}, keys=False)  # a key and secret given here are never written
    if secrets:
        raise BigbatchError(f"the storage options hold credentials ({', '.join(secrets)}); {WHERE_CREDENTIALS_GO}")
    if target.url and ("?" in target.text or "#" in target.text):  # (found from outside: "x.h5 must end in .h5")
        raise BigbatchError(
            f"output {target.name}: an output URL takes no query string or fragment ({target.text}); name the object "
            "alone"
        )
    if not target.text.lower().endswith((".h5", ".hdf5")):
        raise BigbatchError(f"output {target.name} must end in .h5 (data.path recognises data files by it)")
    if not target.url:
        _refuse_local(target)
    if not overwrite and _exists(target, storage_options):
        raise BigbatchError(
            f"output {target.name} exists: give --overwrite to replace it (runs trained on it refuse to resume if "
            "its content changes), or another name"
        )
    if target.url:
        _probe(target, storage_options)


def _refuse_local(target: Location) -> None:
    """A local output that is a folder, or under a file, refused before anything is decoded."""
    if target.path.is_dir():
        raise BigbatchError(f"output {target.name} is a folder; give a file in it, e.g. {target.path / 'data.h5'}")
    above = target.path.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise BigbatchError(f"output {target.name} cannot be written: {above} is a file, not a folder")


def _probe(target: Location, storage_options: dict[str, Any] | None) -> None:
    """An object written beside a URL output and removed, so that a missing bucket or a refused write is said
    before anything is decoded, not after."""
    fs, path = target.fs(storage_options)
    probe = f"{path.rsplit('/', 1)[0]}/.{path.rsplit('/', 1)[-1]}.probe-{os.getpid()}"
    try:
        fs.pipe_file(probe, b"")
    except Exception as e:  # noqa: BLE001 -- s3fs/botocore errors have no common base; one line for all
        fix = url_fix(e) or "check the bucket, the credentials and the endpoint"
        raise BigbatchError(f"cannot write output {target.name}: {type(e).__name__}: {e} ({fix})") from None
    try:
        fs.rm_file(probe)
    except Exception:  # noqa: BLE001 -- (allowed to write but not to delete: the empty object stays)
        warn(f"could not remove the empty object {probe} this prepare wrote to check the output can be written")


@contextmanager
def sole_writer(target: Location, storage_options: dict[str, Any] | None, overwrite: bool) -> Iterator[None]:
    """One prepare at a time writes a local output: two would share its parts folder, and the one resumed
    could take images made with the other's settings. (A URL output has no parts; its object is put whole.)"""
    if target.url:
        yield
        return

    def busy(folder: Path, pid: str, held_by: str) -> str:
        return (
            f"output {target.name} is being written by another prepare ({held_by}); wait for it to end, or give "
            "this one another output"
        )

    try:
        target.path.parent.mkdir(parents=True, exist_ok=True)
        lock = lock_folder(target.path.parent, f".{target.path.name}.lock", busy)
    except OSError as e:  # (a folder this user may not write, a read-only file system)
        raise BigbatchError(f"cannot write output {target.name}: {e.strerror or e}; choose another output") from None
    try:
        refuse_output(target, storage_options, overwrite)  # (again: the other may have written it meanwhile)
        yield
    finally:
        unlock_folder(lock, remove=True)


def _exists(out: Location, storage_options: dict[str, Any] | None) -> bool:
    if not out.url:
        return os.path.lexists(out.path)
    try:
        fs, path = out.fs(storage_options)
        return bool(fs.exists(path))
    except Exception as e:  # noqa: BLE001 -- s3fs/botocore errors have no common base; one line for all
        # (found from outside: no credentials was a traceback)
        fix = url_fix(e) or "check the bucket, the credentials and the endpoint"
        raise BigbatchError(f"cannot reach output {out.name}: {type(e).__name__}: {e} ({fix})") from None


SHOWN = 5  # skipped files named in the report


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
    enlarged: int = 0  # images smaller than the resolution, scaled up to it (found from outside: unsaid)
    below: int = 0  # whole images (--crop none) whose short side is below the resolution's, kept as they are
    whole: bool = False  # --crop none: each image at its own size
    left_out: dict[str, int] = field(default_factory=dict)  # files no images by their endings: how many, by ending
    class_counts: list[int] = field(default_factory=list)  # images written of each class

    @property
    def images_per_s(self) -> float:
        """Images decoded a second, those read back from an interrupted prepare's parts left out (found from outside:
        a resumed prepare said 764 img/s of 190)."""
        return max(0, self.count - self.resumed) / max(self.seconds, 1e-9)

    def summary(self) -> str:
        """A few lines for the terminal: what was written, and the first skipped files with reasons."""
        n = len(self.class_names)
        classes = counted(n, "class") if self.class_names else "unconditional (no classes)"
        # (found from outside: whole images, all of one size, were said to be "of several shapes")
        shape = "x".join(map(str, self.shape)) if self.shape else "whole" if self.whole else "of several shapes"
        lines = [
            f"wrote {self.out}: {counted(self.count, 'image')} {shape}, {classes}, from {self.source} "
            f"in {self.seconds:.1f} s ({self.images_per_s:.0f} img/s, {counted(self.workers, 'worker')})",
            f"content {self.content_hash}",
        ]
        if self.class_counts:
            lines.append(f"per class: {per_class(self.class_names, self.class_counts)}")
        if self.resumed:
            lines.insert(1, f"resumed: {self.resumed} files as an interrupted prepare of this command had decoded them "
                         "(the rate is of the rest)")  # fmt: skip
        if self.empty_folders:
            shown = named_few(self.empty_folders, SHOWN)
            n = len(self.empty_folders)
            held = f"{n} folder holds" if n == 1 else f"{n} folders hold"
            lines.append(f"{held} no image files, so they are not classes: {shown}")
        if self.enlarged:
            lines.append(f"enlarged {self.enlarged} of them: smaller than the resolution, scaled up to it (blurred)")
        if self.below:  # (found from outside: unsaid, where README said they were counted)
            lines.append(f"{self.below} of them below the short side asked for: kept at their own size, not enlarged")
        if self.left_out:  # (found from outside: captions beside each image were each a skipped "corrupt" file)
            lines.append(f"left out {said_left_out(self.left_out)}, as torchvision's ImageFolder leaves them")
        if self.skipped:
            lines.append(f"skipped {counted(len(self.skipped), 'file')} (--strict: an error instead):")
            lines += [f"  {name}: {reason}" for name, reason in self.skipped[:SHOWN]]
            if len(self.skipped) > SHOWN:  # (found from outside: 5 of 2,000 named, no count of why, nor a list)
                lines.append(f"  ... and {len(self.skipped) - SHOWN} more; by reason: {by_reason(self.skipped)}")
                lines.append(f"  every one: bigbatch info {shlex.quote(self.out)} --skipped")
        return "\n".join(lines)


def by_reason(skipped: Sequence[Sequence[str]], shown: int = 6) -> str:
    """How many files were skipped for each kind of reason (the reason up to its details), most first."""
    counts: dict[str, int] = {}
    for _, reason in skipped:
        kind = re.split(r" \(|: ", reason, maxsplit=1)[0]
        counts[kind] = counts.get(kind, 0) + 1
    kinds = sorted(counts.items(), key=lambda kv: -kv[1])
    said = "; ".join(f"{kind} {n}" for kind, n in kinds[:shown])
    return said + (
        f"; {len(kinds) - shown} other reasons {sum(n for _, n in kinds[shown:])}" if len(kinds) > shown else ""
    )


def no_usable_images(source: str, listing: Listing, skipped: list[tuple[str, str]], unread: int) -> BigbatchError:
    """The refusal of a source of which no image could be used: an image that failed as the example (`skipped`'s
    from `unread` on were read), a damaged shard of the source as the cause (found from outside: a cut shard was
    advised to be unpacked as ImageNet's tar of tars), archives inside it as what to unpack."""
    own = {shard.name for shard in getattr(listing.source, "shards", ())}
    cut = [entry for entry in skipped if entry[0] in own]
    failed = skipped[unread:]
    read = f"of those read, {len(failed)} failed, " if failed else ""
    example = (failed or [entry for entry in skipped if entry not in cut])[:1]
    reason = f"; {read}e.g. {example[0][0]}: {example[0][1]}" if example else ""
    reason += "".join(f"; {name}: {why}" for name, why in cut[:1])
    archives = archives_said([name for name, _ in skipped if name not in own] + listing.left_out)
    return BigbatchError(f"source {source} holds no usable images{reason}{archives}")


def say_tars_left_out(left_out: list[str], images: int) -> None:
    """Warn of tar files a folder of images leaves out (found from outside: one stray image beside a folder's shards
    prepared that image alone, the shards counted among the files left out)."""
    if tars := [name for name in left_out if is_tar_name(name)]:
        warn(
            f"{counted(len(tars), 'tar file')} left out ({named_few(tars, SHOWN)}): a folder is read as shards where "
            f"it holds no images, and this one holds {counted(images, 'image')}; prepare the shards by their pattern "
            "(train-{000..009}.tar), or move the images out"
        )
