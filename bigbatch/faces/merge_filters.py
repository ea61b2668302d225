"""DeepFaceLab's merger's finishing filters (merger/MergeMasked.py with core/imagelib's blursharpen.py and
reduce_colors.py, and mainscripts/Merger.py's motion of a face between frames), written from their published
behaviour and checked against their outputs (tests/data/dfl_faces_golden.npz); no DFL code. Images are float32
in [0, 1], RGB (DFL's BGR: each filter is per channel, and Pillow's palette is of the colours whatever their order)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import cv2
import numpy as np
from PIL import Image

from bigbatch.data import align

SHARPEN = ("none", "box", "gaussian")  # DFL's sharpen_mode 0, 1, 2


def linear_motion_blur(image: np.ndarray, size: int, angle: float) -> np.ndarray:
    """DFL's LinearMotionBlur: a line `size` pixels long through the kernel's centre, turned by `angle` degrees."""
    k = np.zeros((size, size), np.float32)
    k[(size - 1) // 2, :] = 1.0
    k = cv2.warpAffine(k, cv2.getRotationMatrix2D((size / 2 - 0.5, size / 2 - 0.5), angle, 1.0), (size, size))
    return cv2.filter2D(image, -1, k * (1.0 / np.sum(k)))


def blursharpen(image: np.ndarray, mode: str, amount: int, kernel: int = 3) -> np.ndarray:
    """DFL's blursharpen: above 0, sharpened by `amount` (a box or a Gaussian `kernel` wide; "none" leaves it);
    below 0, median-blurred (5 px) a whole pass for each 10 and a share of one for the rest."""
    kernel += kernel % 2 == 0
    if amount > 0:
        if mode == "box":
            k = np.zeros((kernel, kernel), np.float32)
            k[kernel // 2, kernel // 2] = 1.0
            k = k + (k - np.full((kernel, kernel), 1 / kernel**2, np.float32)) * amount
            return cv2.filter2D(image, -1, k)
        if mode == "gaussian":
            blur = cv2.GaussianBlur(image, (kernel, kernel), 0)
            return cv2.addWeighted(image, 1.0 + 0.5 * amount, blur, -(0.5 * amount), 0)
        return image
    return _median_passes(image, -amount, 10)


def _median_passes(image: np.ndarray, n: int, whole: int) -> np.ndarray:
    """DFL's median blurs (5 px) in passes of 10 of `n`: a pass whole while n / `whole` is 1 or more, else a share
    (n % whole) / whole of it (blursharpen's blur: whole 10; image_denoise_power's: whole 100)."""
    while n > 0:
        blurred = cv2.medianBlur(image, 5)
        if n // whole:
            image = blurred
        else:
            share = (n % whole) / whole
            image = image * (1.0 - share) + blurred * share
        n = max(n - 10, 0)
    return image


def degraded(frame: np.ndarray, denoise: int, bicubic: int) -> np.ndarray:
    """The whole frame as DFL's merger degrades it under a merged face: image_denoise_power's median passes, then
    bicubic_degrade_power's shrink (by 1 - power / 101) and enlargement back (bicubic)."""
    if denoise:
        frame = _median_passes(frame, denoise, 100)
    if bicubic:
        h, w = frame.shape[:2]
        p = 1.0 - bicubic / 101.0
        small = cv2.resize(frame, (int(w * p), int(h * p)), interpolation=cv2.INTER_CUBIC)
        frame = cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)
    return frame


def color_degraded(image: np.ndarray, power: int) -> np.ndarray:
    """DFL's color_degrade_power: the image in an adaptive palette of 256 colours (Pillow's), mixed in by power %."""
    rgb = Image.fromarray((image * 255.0).astype(np.uint8))
    reduced = np.asarray(rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=256).convert("RGB"), np.float32)
    reduced /= 255.0
    if power == 100:
        return reduced
    alpha = power / 100.0
    return image * (1.0 - alpha) + reduced * alpha


def motions(stems: Sequence[str], faces: dict[str, list[np.ndarray]]) -> dict[str, tuple[float, float]] | None:
    """Each frame's face motion as DFL's merger measures it for motion_blur_power: the centre of the first face's
    full-face square (at 256 px) moving from the frame before to the frame after (the first and last frames their
    own neighbours), as (pixels, degrees); none where any of the three has no face. None where a frame has several
    faces: no frame moves then (DFL's merger says it uses no motion blur)."""
    if any(len(f) > 1 for f in faces.values()):
        return None
    size = 256
    centre = np.array([[size // 2 - 1, size // 2 - 1]], np.float64)

    def at(stem: str) -> np.ndarray | None:
        found = faces.get(stem)
        if not found:
            return None
        mat = align.transform_mat(found[0], size, align.FaceType.FULL)
        return np.asarray(align.transform_points(centre, mat, invert=True), np.float64).reshape(-1, 2)[0]

    points = [at(stem) for stem in stems]
    out = {}
    for i, stem in enumerate(stems):
        before, now, after = points[max(0, i - 1)], points[i], points[min(i + 1, len(stems) - 1)]
        if before is None or now is None or after is None:
            continue
        vector = after - before
        power = float(np.linalg.norm(vector))
        unit = vector / power if power else np.zeros(2)
        out[stem] = (power, -math.atan2(unit[1], unit[0]) * 180 / math.pi)
    return out
