"""What a merge's OUT was merged from (OUT/.merge.json): its settings, the model (its checkpoint or DFL folder and
its weight files' names, sizes and times), the aligned faces and the frames, so that a rerun keeps the frames an
interrupted merge of the same inputs wrote, and merges every frame again when any input changed; and the videos
merges of OUT wrote (--video), which a merge again may replace without --overwrite."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bigbatch.faces.extract_journal import same_source
from bigbatch.files import atomic_write, read_record

RECORD = ".merge.json"
# The record's parts, and what changed when one differs (said in the line that says all frames merge again).
PARTS = {"settings": "the merge settings", "model": "the model", "aligned": "the aligned faces", "frames": "the frames"}


def content_digest(path: Path) -> str:
    """A short hash of a file's bytes (found from outside: another XSeg model of the same name, size and time was
    taken for the one merged with; and a copy of it for another)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:20]


def files_digest(paths: Iterable[Path]) -> str:
    """A short hash of files' names, sizes and modification times: changes when any is added, gone or rewritten."""
    rows = []
    for p in paths:
        st = p.stat()
        rows.append([p.name, st.st_size, st.st_mtime_ns])
    return hashlib.sha256(json.dumps(sorted(rows)).encode()).hexdigest()[:20]


def model_identity(run: str | Path, model: Any) -> dict:
    """The model a merge swaps with: a run's checkpoint by its weights' checksums (meta.json's: the same weights
    copied elsewhere, or their checkpoint written again, are the same model; more training writes others), or the
    DFL model's folder and name with its weight files' digest."""
    from bigbatch import checkpoints
    from bigbatch.tasks.swap.load import dfl_model

    named = dfl_model(run)
    if named is not None:
        folder, name = named
        pattern = f"{name}_SAEHD_*" if name else "*_SAEHD_*"
        files = [
            p for p in folder.glob(pattern) if p.is_file() and (p.suffix == ".npy" or p.name.endswith("_data.dat"))
        ]
        return {"path": str(folder.resolve()), "name": name, "files": files_digest(files)}
    sums = ((checkpoints.read_meta(Path(model.checkpoint)) or {}).get("checksums") or {}).get(checkpoints.CHECKSUM, {})
    return {"weights": {f: v for f, v in sorted(sums.items()) if f.endswith(".safetensors")}}


def aligned_identity(folder: Path) -> dict:
    """The aligned faces: the folder and its JPEGs' digest (faces deleted or extracted again change it)."""
    faces = [p for p in folder.iterdir() if p.suffix.lower() in (".jpg", ".jpeg") and p.is_file()]
    return {"path": str(folder.resolve()), "files": files_digest(faces)}


def frames_identity(source: Any) -> dict:
    """The frames (an extract FrameSource): a video's path, size, time and checksum (`changed_since` compares it by
    its bytes: touched or moved, the same frames), or the images' folder and digest."""
    found = dict(source.identity())
    if source.files:
        found["files"] = files_digest(source.files)
    return found


def merged_stems(names: list[str] | None) -> dict:
    """The record's list of the frames a merge writes (their stems: `names`, FRAMES's frames; none for a video whose
    container gives no frame count), for the next merge into OUT to tell them from the user's images."""
    return {"names": [Path(n).stem for n in names]} if names is not None else {}


def merged_here(out: Path, frames: list[str] | None) -> Callable[[str], bool]:
    """Whether OUT's image of stem `stem` is one a merge into OUT wrote, as OUT's record says: a frame it lists (a
    record without that list, an older bigbatch's or a video's without a frame count: one of FRAMES' `frames`, or
    a frame's number, as video frames and DFL name them); with no record, none is (found from outside: merging
    again deleted the user's images in OUT)."""
    if not (out / RECORD).exists():
        return lambda stem: False
    names = read_record(out / RECORD).get("names")
    if isinstance(names, list):
        return set(names).__contains__
    current = {Path(n).stem for n in frames or ()}
    return lambda stem: stem in current or re.fullmatch(r"\d+", stem) is not None


def changed_since(out: Path, record: dict) -> list[str] | None:
    """What differs between OUT's record and `record` (named as PARTS): [] when nothing does (an interrupted
    merge of the same inputs, whose frames stand), None when OUT has no record."""
    if not (out / RECORD).exists():
        return None
    was = read_record(out / RECORD)  # (a record not ours to read: merged again)

    def same(key: str) -> bool:  # (the frames by extract's rule: a video by its bytes, a record of before by its time)
        if key == "frames" and isinstance(was.get(key), dict) and isinstance(record.get(key), dict):
            return same_source(was[key], record[key])
        return was.get(key) == record.get(key)

    if all(same(key) for key in PARTS):  # (the videos written are not an input)
        return []
    return [said for key, said in PARTS.items() if not same(key)] or [PARTS["settings"]]


def write(out: Path, record: dict) -> None:
    """`record` as OUT's, for the next merge into OUT (the videos its merges wrote kept)."""
    videos = read_record(out / RECORD).get("videos") or []
    atomic_write(out / RECORD, json.dumps({**record, **({"videos": videos} if videos else {})}))


def _video_key(video: str | Path) -> str:
    return str(Path(video).resolve())


def wrote_video(out: Path, video: str | Path) -> bool:
    """Whether a merge into OUT wrote `video` (its --video), as OUT's record says."""
    return _video_key(video) in (read_record(out / RECORD).get("videos") or [])


def add_video(out: Path, video: str | Path) -> None:
    """`video` written by the merge into OUT: recorded, so that the same merge run again may replace it (found
    from outside: --video replaced any file of its name, another folder's source video among them)."""
    was = read_record(out / RECORD)
    if not was or wrote_video(out, video):
        return
    atomic_write(out / RECORD, json.dumps({**was, "videos": [*(was.get("videos") or []), _video_key(video)]}))
