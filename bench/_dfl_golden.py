"""What the two golden-data scripts (dfl_golden_faces.py, dfl_golden_detect.py) share: DFL's modules imported from a
checkout without running its package __init__s, the checkout's commit, the photo both use, a soft mask, and the .npz
writer.
DFL's code is only ever imported from the path given; nothing of it is in the repository."""

from __future__ import annotations

import subprocess
import sys
import types
import warnings
from pathlib import Path

import cv2
import numpy as np


def open_checkout(dfl: Path, needs: str, packages: tuple[str, ...]) -> Path:
    """`dfl` on sys.path with `packages` registered as empty modules whose __path__ is the checkout's folder (their
    __init__ files pull in TensorFlow, XSeg or the interactive merger; their plain modules still load from DFL's
    files), and facelib's FaceType re-exported as its __init__ does. Exits when `needs` is not in the checkout."""
    dfl = dfl.resolve()
    if not (dfl / needs).is_file():
        raise SystemExit(f"{dfl} is not a DeepFaceLab checkout (no {needs})")
    sys.path.insert(0, str(dfl))
    for package in packages:
        module = types.ModuleType(package)
        module.__path__ = [str(dfl / package)]
        sys.modules[package] = module
    # DFL's np.int / np.float (deprecated in NumPy 1.20, removed in 1.24): expected, and noise.
    warnings.filterwarnings("ignore", message=".*np\\.(int|float).*", category=DeprecationWarning)
    from facelib.FaceType import FaceType

    sys.modules["facelib"].FaceType = FaceType  # what facelib/__init__ re-exports: the class, not its module
    return dfl


def dfl_commit(dfl: Path) -> str:
    """The checkout's commit, if it is a git work tree; else the mirror's HEAD (what /tmp/dfl is archived from)."""
    for args in (
        ["git", f"--git-dir={dfl / '.git'}", "rev-parse", "HEAD"],
        ["git", "--git-dir=/work/.mirror/iperov+DeepFaceLab/repo", "log", "-1", "--format=%H"],
    ):
        try:
            return subprocess.run(args, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            continue
    return "unknown"


def astronaut_bgr() -> np.ndarray:
    """scikit-image's astronaut (public domain, NASA), 512x512 BGR uint8."""
    from skimage import data

    return np.ascontiguousarray(data.astronaut()[:, :, ::-1])


def write_golden(out: Path, golden: dict[str, np.ndarray]) -> None:
    """The golden arrays as one compressed .npz that np.load(allow_pickle=False) reads, and what it holds."""
    for key, value in golden.items():
        assert value.dtype != object, key
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, **golden)
    print(f"{out}: {out.stat().st_size / 1e6:.2f} MB, {len(golden)} keys")
    for key, value in golden.items():
        print(f"  {key:28s} {str(value.shape):22s} {value.dtype}")


def soft_ellipse(size: int, centre, axes, blur: int) -> np.ndarray:
    """A filled ellipse, Gaussian-blurred, quantised to 1/255 so that it is exactly u8 / 255 (float32)."""
    m = np.zeros((size, size), np.float32)
    cv2.ellipse(m, centre, axes, 0, 0, 360, 1.0, -1)
    m = cv2.GaussianBlur(m, (blur, blur), 0)
    return np.round(m * 255).astype(np.uint8)
