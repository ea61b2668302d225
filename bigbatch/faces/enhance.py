"""`bigbatch enhance FACES --weights DFL/facelib`: DeepFaceLab's faceset enhancer (mainscripts/FacesetEnhancer.py),
which sharpens low-resolution aligned faces before a swap trains on them: each face through DFL's FaceEnhancer
(models/face_enhancer.py, from a DFL install's `facelib/FaceEnhancer.npy`) at 4x and back to its own size
(Lanczos), written as a JPEG of quality 100 with the face's metadata as it was (landmarks, XSeg labels and
mask), as DFL's does, without DFL's TensorFlow.

The faces go to FACES_enhanced (DFL's folder; `--out` another); `--in-place` then moves each over its original,
as DFL's "merge" answer does. A rerun goes on where an interrupted one stopped: faces already enhanced with the
same weights are kept (`.enhance.json` records the weights' hash), and an in-place run that was moving its
faces back moves the rest without enhancing any face twice. Faces enhanced with other weights are redone.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import cv2
import numpy as np
import torch

from bigbatch.data.dfl_faces import NoFaceData, read_metadata, write_metadata
from bigbatch.errors import BigbatchError
from bigbatch.files import atomic_write
from bigbatch.models import dfl
from bigbatch.models.face_enhancer import FaceEnhancer, enhance

ENHANCER_FILE = "FaceEnhancer.npy"
RECORD = ".enhance.json"


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


def _digest(file: Path) -> str:
    from bigbatch.faces.merge_record import content_digest

    return content_digest(file)


def enhance_folder(
    folder: str | Path,
    weights: str | Path,
    out: str | Path | None = None,
    in_place: bool = False,
    device: str | torch.device = "cpu",
) -> tuple[int, list[tuple[str, str]], Path]:
    """Enhance every aligned face in `folder` (see the module). Returns (faces enhanced, [(file, why skipped)],
    where they are: `out`, FOLDER_enhanced, or `folder` itself with `in_place`)."""
    from bigbatch.faces.xseg import face_files

    folder = Path(folder)
    faces = face_files(folder)
    if in_place and out is not None:
        raise BigbatchError("--in-place writes the faces over FACES; --out writes them elsewhere: give one of them")
    target = Path(out) if out is not None else folder.with_name(folder.name + "_enhanced")
    if target.resolve() == folder.resolve():
        raise BigbatchError(f"--out {target} is FACES itself: give --in-place to replace the faces, or another folder")
    model = load_enhancer(weights, device)
    digest = _digest(enhancer_file(weights))
    target.mkdir(parents=True, exist_ok=True)
    record = _read_record(target)
    if not record and any((target / f.name).exists() for f in faces):  # (not ours: never deleted)
        raise BigbatchError(
            f"{target} already holds faces named as those of {folder} that bigbatch enhance did not write: give an "
            "empty or new folder (--out)"
        )
    if record.get("weights") != digest:  # (another enhancer's faces, or none: start afresh, as DFL empties it)
        if record.get("moving"):
            raise BigbatchError(
                f"{target} holds faces an in-place enhance was moving back with other weights: run it again with "
                "those weights to finish, or delete the folder"
            )
        for name in [f.name for f in faces]:
            (target / name).unlink(missing_ok=True)
        record = {"weights": digest, "moving": False}
        atomic_write(target / RECORD, json.dumps(record).encode())
    done, skipped = 0, []
    if not record.get("moving"):
        for path in faces:
            if (target / path.name).is_file():
                done += 1
                continue
            try:
                atomic_write(target / path.name, _enhanced(model, path))
                done += 1
            except NoFaceData as e:
                skipped.append((path.name, str(e)))
    if not in_place:
        return done, skipped, target
    atomic_write(target / RECORD, json.dumps({**record, "moving": True}).encode())
    for path in sorted(target.glob("*.jpg")):  # (each move atomic; a rerun moves the rest)
        os.replace(path, folder / path.name)
    shutil.rmtree(target)
    return done, skipped, folder


def _enhanced(model: FaceEnhancer, path: Path) -> bytes:
    """The face in `path` enhanced, as a JPEG of quality 100 carrying its metadata; NoFaceData if it is none."""
    data = path.read_bytes()
    meta = read_metadata(data, str(path))
    if meta is None:
        raise NoFaceData("not an aligned DeepFaceLab face (no metadata)")
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise NoFaceData("it does not decode as an image")
    out = enhance(model, image.astype(np.float32) / 255, preserve_size=True)
    ok, jpeg = cv2.imencode(".jpg", np.clip(out * 255, 0, 255).astype(np.uint8), [cv2.IMWRITE_JPEG_QUALITY, 100])
    if not ok:
        raise NoFaceData("its enhanced face did not encode")
    return write_metadata(jpeg.tobytes(), meta)


def _read_record(target: Path) -> dict:
    try:
        record = json.loads((target / RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}
