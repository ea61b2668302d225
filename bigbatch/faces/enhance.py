"""`bigbatch enhance FACES --weights DFL/facelib`: DeepFaceLab's faceset enhancer (mainscripts/FacesetEnhancer.py),
which sharpens low-resolution aligned faces before a swap trains on them: each face through DFL's FaceEnhancer
(models/face_enhancer.py, from a DFL install's `facelib/FaceEnhancer.npy`) at 4x and back to its own size
(Lanczos), written as a JPEG of quality 100 with the face's metadata as it was (landmarks, XSeg labels and
mask), as DFL's does, without DFL's TensorFlow.

The faces go to FACES_enhanced (DFL's folder; `--out` another); `--in-place` then moves each over its original,
as DFL's "merge" answer does. A rerun goes on where an interrupted one stopped: `.enhance.json` records the
weights' hash and each face's source (size and time; `.enhance.journal` each face as it is written, between
records), so faces enhanced with the same weights from the same
source are kept, and faces changed, renamed or deleted since, or enhanced with other weights, are redone or
dropped; an in-place run that was moving its faces back moves the rest it recorded, enhancing none twice.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import torch

from bigbatch.data.dfl_faces import NoFaceData, write_metadata
from bigbatch.data.sources import file_stamp
from bigbatch.errors import BigbatchError, named_few
from bigbatch.faces.merge_record import content_digest
from bigbatch.faces.xseg import face_files, read_face
from bigbatch.files import atomic_write, json_loads, read_record
from bigbatch.models import dfl
from bigbatch.models.face_enhancer import FaceEnhancer, enhance

ENHANCER_FILE = "FaceEnhancer.npy"
RECORD = ".enhance.json"
JOURNAL = ".enhance.journal"  # each face's start and end, appended as they happen, folded into RECORD on the next run


def enhancer_file(weights: str | Path) -> Path:
    """The FaceEnhancer weight file `weights` names: a DFL install's facelib folder, or the file."""
    path = Path(weights)
    return path if path.is_file() else path / ENHANCER_FILE


def load_enhancer(weights: str | Path, device: str | torch.device, what: str = "--weights") -> FaceEnhancer:
    """DFL's FaceEnhancer from `weights` (see enhancer_file), in eval mode on `device`; one line if there is none."""
    file = enhancer_file(weights)
    if not file.is_file():
        raise BigbatchError(
            f"{what} {weights} holds no {ENHANCER_FILE}: give a DeepFaceLab install's facelib folder (its face "
            "enhancer is DFL's FaceEnhancer.npy)"
        )
    arrays = dfl.read_weights(file)
    first = np.asarray(arrays.get("conv1/weight:0", np.zeros((3, 3, 3, 64))))
    model = FaceEnhancer(width=first.shape[-1] / 64 if first.ndim == 4 else 1.0)  # (DFL's: 1; narrower in tests)
    dfl.import_part(model, arrays, str(file))
    return model.to(device).eval().requires_grad_(False)


@dataclass
class Enhanced:
    """What `enhance_folder` did: faces enhanced (`done`), faces moved over their originals (`moved`, with
    in_place), [(file, why skipped)], where the enhanced faces are, and how many of an interrupted in-place run were
    left there (`left`: their originals renamed, changed or deleted since); of `done`, those an earlier run had
    enhanced (`kept`)."""

    done: int
    moved: int
    skipped: list[tuple[str, str]]
    where: Path
    left: int = 0
    kept: int = 0


def enhance_folder(
    folder: str | Path,
    weights: str | Path,
    out: str | Path | None = None,
    in_place: bool = False,
    device: str | torch.device = "cpu",
) -> Enhanced:
    """Enhance every aligned face in `folder` (see the module): into `out` (default FOLDER_enhanced), then with
    `in_place` over the faces themselves. The record beside the enhanced faces holds the weights' hash and each
    face's source stamp (a face changed, renamed or deleted since is redone or dropped), and, while an in-place
    run moves them back, the names it moves."""
    folder = Path(folder).resolve()  # (found by review: "." had no name to put "_enhanced" after)
    if in_place and out is not None:
        raise BigbatchError("--in-place writes the faces over FACES; --out writes them elsewhere: give one of them")
    target = Path(out).resolve() if out is not None else folder.with_name(folder.name + "_enhanced")
    if target == folder:
        raise BigbatchError(f"--out {out} is FACES itself: give --in-place to replace the faces, or another folder")
    record = read_record(target / RECORD)
    file = enhancer_file(weights)
    digest = content_digest(file) if file.is_file() else None
    if record.get("moving") is not None:  # an in-place run stopped while it moved the faces back
        if not in_place or record.get("weights") != digest:
            raise BigbatchError(
                f"an in-place enhance of {folder} stopped while moving its faces back from {target}: run it again "
                "with --in-place and the same --weights to finish"
            )
        moved, left, aside = _move_back(record, target, folder)
        return Enhanced(0, moved, [], aside if left else folder, left)
    faces = face_files(folder)
    model = load_enhancer(weights, device)
    target.mkdir(parents=True, exist_ok=True)
    started, finished = _read_journal(target)  # (what a run stopped before its record was written did)
    record.setdefault("faces", {}).update(finished)
    ours = set(record["faces"]) | started
    if theirs := [f.name for f in faces if f.name not in ours and (target / f.name).exists()]:  # (never replaced:
        raise BigbatchError(  # found from outside, one was, where an earlier enhance had written its record)
            f"{target} already holds faces named as those of {folder} that bigbatch enhance did not write "
            f"({named_few(theirs, 3)}): give an empty or new folder (--out)"
        )
    for name in started - set(finished):  # begun, never ended: done again
        (target / name).unlink(missing_ok=True)
    now = {f.name: file_stamp(str(f)) for f in faces}
    kept = record.get("faces", {}) if record.get("weights") == digest else {}
    for name in record.get("faces", {}):  # ours, but of other weights, or of a face changed or gone since
        if kept.get(name) != now.get(name):
            (target / name).unlink(missing_ok=True)
    record = {"weights": digest, "faces": {k: v for k, v in kept.items() if now.get(k) == v}, "moving": None}
    _write_record(target, record)
    (target / JOURNAL).unlink(missing_ok=True)  # (folded into the record)
    done, skipped, kept = 0, [], 0
    for path in faces:
        if path.name in record["faces"] and (target / path.name).is_file():
            done, kept = done + 1, kept + 1
            continue
        try:
            face = _enhanced(model, path)
        except NoFaceData as e:
            skipped.append((path.name, str(e)))
            continue
        # Each face journalled as it is written (found from outside: the record, written every 10 s, lost the faces
        # of a run stopped sooner, which were then done again)
        _append_journal(target, {"started": path.name})
        atomic_write(target / path.name, face)
        _append_journal(target, {"finished": path.name, "stamp": now[path.name]})
        done += 1
        record["faces"][path.name] = now[path.name]
    _write_record(target, record)
    (target / JOURNAL).unlink(missing_ok=True)
    if not record["faces"]:  # (found from outside: a folder of no face left one holding the record alone)
        (target / RECORD).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            target.rmdir()
    if not in_place:
        return Enhanced(done, 0, skipped, target, kept=kept)
    record["moving"] = sorted(record["faces"])
    _write_record(target, record)
    moved, left, aside = _move_back(record, target, folder)
    return Enhanced(done, moved, skipped, aside if left else folder, left, kept)


def _move_back(record: dict, target: Path, folder: Path) -> tuple[int, int, Path]:
    """Move the faces the record names over their originals (each atomically; a rerun moves the rest), then take
    the record and, when nothing else is in it, the folder away. How many were moved now, how many were left, and
    where (a folder in `target`): those whose original is no longer what was enhanced (found from outside: after a
    `sort` between an interrupted run and its rerun, the enhanced copies came back beside the renamed faces)."""
    moved = left = 0
    aside = target / time.strftime("left-%Y%m%d-%H%M%S")  # (found by review: left among the names of the next run)
    for name in record["moving"]:
        path = target / name
        if not path.is_file():
            continue  # (moved before an interruption)
        if file_stamp(str(folder / name)) != record["faces"].get(name):
            aside.mkdir(exist_ok=True)
            os.replace(path, aside / name)
            left += 1
            continue
        try:
            os.replace(path, folder / name)
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
            atomic_write(folder / name, path.read_bytes())  # (across file systems: a copy, then the original gone)
            path.unlink()
        moved += 1
    (target / RECORD).unlink(missing_ok=True)
    (target / JOURNAL).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        target.rmdir()  # (only when empty: what else the user put there stays)
    return moved, left, aside


def _write_record(target: Path, record: dict) -> None:
    atomic_write(target / RECORD, json.dumps(record).encode())


def _append_journal(target: Path, entry: dict) -> None:
    """One line appended (not fsynced: a line lost to a crash only has its face done again)."""
    with open(target / JOURNAL, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def _read_journal(target: Path) -> tuple[set[str], dict[str, str]]:
    """The faces a run stopped before its last record began writing, and those it ended ({name: stamp}); a line cut
    short by the stop is left out."""
    started, finished = set(), {}
    with contextlib.suppress(FileNotFoundError):
        for line in (target / JOURNAL).read_text(encoding="utf-8", errors="replace").splitlines():
            with contextlib.suppress(ValueError, TypeError, AttributeError, LookupError):
                entry = json_loads(line)
                if "finished" in entry:
                    finished[str(entry["finished"])] = str(entry["stamp"])
                else:
                    started.add(str(entry["started"]))
    return started, finished


def _enhanced(model: FaceEnhancer, path: Path) -> bytes:
    """The face in `path` enhanced, as a JPEG of quality 100 carrying its metadata; NoFaceData if it is none."""
    _, meta, image = read_face(path)
    out = enhance(model, image, preserve_size=True)
    ok, jpeg = cv2.imencode(".jpg", np.clip(out * 255, 0, 255).astype(np.uint8), [cv2.IMWRITE_JPEG_QUALITY, 100])
    if not ok:
        raise NoFaceData("its enhanced face did not encode")
    return write_metadata(jpeg.tobytes(), meta)
