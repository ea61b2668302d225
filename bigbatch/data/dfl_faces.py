"""The face masks DeepFaceLab keeps inside its aligned face images (DFLIMG/DFLJPG.py): each JPEG its
extractor writes carries, in an APP15 segment, a pickled dict of the face's 68 landmarks (in the
aligned image's pixels), `eyebrows_expand_mod`, and, once XSeg has been applied, `xseg_mask` (a PNG
or JPEG of the mask). `bigbatch prepare --masks dfl [--eyes-mouth dfl]` reads them, so DFL's
`workspace/data_src/aligned` and `data_dst/aligned` folders prepare as they are:

- the face mask is the XSeg mask when there is one, else the landmarks' hull with the eyebrows
  raised (facelib/LandmarksProcessor.py: get_image_hull_mask), what DFL's trainer uses;
- the eyes-and-mouth region is the hull of each eye and of the inner mouth, dilated (an ellipse of
  size/32) and blurred (a Gaussian of size/16), as get_image_eye_mask + get_image_mouth_mask;
- with `--masks labels`, the mask drawn by hand in DFL's XSeg editor (`seg_ie_polys`: include polygons
  filled, then exclude polygons cleared, as SegIEPolys.overlay_mask), what XSeg trains on.

Polygons are filled, dilated and blurred by OpenCV's calls as DFL makes them (pixel for pixel: tests/
test_dfl_faces.py compares with DFL's code written out). The pickle is read by the restricted unpickler
(`bigbatch.safe_pickle`): metadata that asks for anything but arrays, strings and numbers is refused.
"""

from __future__ import annotations

import io
import struct
from typing import Any

import numpy as np
from PIL import Image

from bigbatch import safe_pickle
from bigbatch.errors import BigbatchError

APP15 = 0xEF


class NoFaceData(ValueError):
    """The image does not carry what DFL's aligned faces carry (one line: why)."""


def read_metadata(data: bytes, what: str = "image") -> dict[str, Any] | None:
    """The DFL dict in a JPEG's APP15 segment, or None when the file has none (not a JPEG, or not an
    aligned face from DFL's extractor). A segment that does not unpickle to a dict is an error."""
    if data[:2] != b"\xff\xd8":
        return None
    at = 2
    while at + 4 <= len(data) and data[at] == 0xFF:
        marker = data[at + 1]
        if marker == 0xFF:  # a fill byte before the marker
            at += 1
            continue
        if marker == 0xDA or marker == 0xD9:  # start of scan / end of image: no more headers
            return None
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:  # markers without a length
            at += 2
            continue
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        if marker == APP15:
            found = safe_pickle.loads(data[at + 4 : at + 2 + length], f"{what}'s DeepFaceLab metadata")
            if not isinstance(found, dict):
                raise NoFaceData("its DeepFaceLab metadata is not a dict")
            return found
        at += 2 + length
    return None


def _plain(value: Any) -> Any:
    """Arrays and NumPy scalars as lists and Python numbers: a pickle of a NumPy 2 array names `numpy._core`,
    which DFL's NumPy (1.19) cannot load."""
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def write_metadata(data: bytes, meta: dict[str, Any]) -> bytes:
    """The JPEG `data` with `meta` in an APP15 segment after its last APPn segment (any earlier APP15 is
    replaced), as DFL's DFLJPG.dump writes it: None values dropped, arrays as lists but `xseg_mask` (the PNG's
    bytes, a uint8 array as DFL keeps it), pickle protocol 3 (DFL's Python 3.6 reads it). Raises ValueError
    when the dict does not fit one segment (65533 bytes)."""
    if data[:2] != b"\xff\xd8":
        raise ValueError("not a JPEG")
    plain = {k: v if k == "xseg_mask" else _plain(v) for k, v in meta.items() if v is not None}
    body = safe_pickle.numpy1_dumps(plain, 3)  # (xseg_mask stays an array: DFL cv2.imdecode's it)
    if len(body) > 0xFFFF - 2:
        raise ValueError(f"DeepFaceLab metadata of {len(body)} bytes does not fit one JPEG segment")
    headers, at = [], 2  # the segments before the scan, each (marker, bytes)
    while at + 4 <= len(data) and data[at] == 0xFF and data[at + 1] not in (0xDA, 0xD9):
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        headers.append((data[at + 1], data[at : at + 2 + length]))
        at += 2 + length
    headers = [(m, b) for m, b in headers if m != APP15]
    last_app = max((i + 1 for i, (m, _) in enumerate(headers) if 0xE0 <= m <= 0xEF), default=0)
    segment = b"\xff" + bytes([APP15]) + struct.pack(">H", len(body) + 2) + body
    parts = [b for _, b in headers[:last_app]] + [segment] + [b for _, b in headers[last_app:]]
    return data[:2] + b"".join(parts) + data[at:]


LANDMARK_RANGE = 1e7  # pixels: past any frame's size (a yaw of larger ones overflowed to NaN)


def landmarks_of(meta: dict[str, Any], key: str = "landmarks") -> np.ndarray:
    """The 68 (x, y) landmarks of an aligned face's metadata (`key`: "source_landmarks", those in its frame);
    NoFaceData (one line) for any that are not 68 finite numbers (found from outside: NaN ones made an empty mask,
    strings a traceback in sort, and in merge)."""
    try:
        points = np.asarray(meta.get(key, ()), dtype=np.float64)
    except (TypeError, ValueError, OverflowError):  # (OverflowError: an integer past float64's range)
        raise NoFaceData(f"its DeepFaceLab metadata's {key} are not numbers") from None
    if points.shape != (68, 2):
        raise NoFaceData(f"its DeepFaceLab metadata has no 68 {key} (of shape {points.shape})")
    if not (np.isfinite(points).all() and (np.abs(points) < LANDMARK_RANGE).all()):
        raise NoFaceData(f"its DeepFaceLab metadata's {key} are not all finite numbers within any image")
    return points


def jaw_yaw(points: np.ndarray) -> float:
    """DFL's yaw estimate from the jaw line's distances to the nose bridge (its head alignment's), in the units
    of `points`."""
    left = ((points[27, 0] - points[0, 0]) + (points[28, 0] - points[1, 0]) + (points[29, 0] - points[2, 0])) / 3
    right = ((points[16, 0] - points[27, 0]) + (points[15, 0] - points[28, 0]) + (points[14, 0] - points[29, 0])) / 3
    return float(right - left)


def face_yaw(points: np.ndarray) -> float:
    """A face's yaw from its 68 landmarks, in units of its width: the jaw line's distance to the nose bridge
    on the right less that on the left (DFL's head alignment's measure), over the face's width; 0 facing the
    camera, near +-1 in profile. `bigbatch sort` orders by it and swap.uniform_yaw bins it (DFL solves a 3D
    head pose for both: nearly the same order, rank correlation 0.99 on test faces)."""
    return jaw_yaw(points) / max(abs(float(points[16, 0] - points[0, 0])), 1e-6)  # (abs: a mirrored face's too)


def extracted_type(meta: dict[str, Any]) -> str:
    """The face type DFL's extractor recorded in a face's metadata, by DFL's name (full_face where none is, as
    DFLJPG.get_face_type reads it)."""
    return str(meta.get("face_type", "full_face"))


def yaw_and_type(data: bytes) -> tuple[float | None, str | None]:
    """The yaw (`face_yaw`) of an aligned DFL face from the landmarks in its metadata, and its face type as SAEHD's
    option names it (found from outside: a face set prepared without --masks kept its yaws, not its face type);
    None for any other image (no metadata, no landmarks or landmarks that are not finite numbers, or metadata the
    restricted unpickler refuses): never an error, the image is good either way."""
    try:
        meta = read_metadata(data)
    except (NoFaceData, BigbatchError, ValueError, TypeError):
        return None, None
    if meta is None:
        return None, None
    kind = FACE_TYPES.get(extracted_type(meta))
    try:
        yaw = face_yaw(landmarks_of(meta))
    except (NoFaceData, BigbatchError, ValueError, TypeError, OverflowError):
        return None, kind
    return (yaw if np.isfinite(yaw) else None), kind


def _fill(size: tuple[int, int], parts: list[np.ndarray]) -> np.ndarray:
    """A float mask (h, w) with the convex hull of each point set filled with 1, as DFL fills it:
    cv2.fillConvexPoly(mask, cv2.convexHull(points), 1) (OpenCV's rasterization: a polygon drawn with
    Pillow covered fewer edge pixels, and DFL's masks came out smaller, an eyes-and-mouth plane by 3-6%)."""
    import cv2

    mask = np.zeros(size, np.float32)
    for points in parts:
        cv2.fillConvexPoly(mask, cv2.convexHull(np.asarray(points, np.int32)), 1.0)
    return mask


def _expand_eyebrows(points: np.ndarray, mod: float) -> np.ndarray:
    """DFL's expand_eyebrows: the eyebrows raised by half their height above the eyes, × mod (integer
    pixels, as DFL casts them)."""
    lm = points.astype(np.int64)
    ml, mr = (lm[36] + lm[0]) // 2, (lm[16] + lm[45]) // 2
    ql, qr = (lm[36] + ml) // 2, (lm[45] + mr) // 2
    bot_l = np.array([ql, lm[36], lm[37], lm[38], lm[39]])
    bot_r = np.array([lm[42], lm[43], lm[44], lm[45], qr])
    out = lm.astype(np.float64)
    out[17:22] = lm[17:22] + mod * 0.5 * (lm[17:22] - bot_l)
    out[22:27] = lm[22:27] + mod * 0.5 * (lm[22:27] - bot_r)
    return out.astype(np.int64)  # (DFL assigns into its int array: truncated)


def hull_mask(size: tuple[int, int], points: np.ndarray, eyebrows_expand_mod: float = 1.0) -> np.ndarray:
    """DFL's get_image_hull_mask: the union of the hulls of the jaw, cheeks, nose ridge, eye and nose
    regions of the 68 landmarks, the eyebrows raised first. Float (h, w) in {0, 1}."""
    lm = _expand_eyebrows(points, eyebrows_expand_mod)
    parts = [
        np.concatenate([lm[0:9], lm[17:18]]),
        np.concatenate([lm[8:17], lm[26:27]]),
        np.concatenate([lm[17:20], lm[8:9]]),
        np.concatenate([lm[24:27], lm[8:9]]),
        np.concatenate([lm[19:25], lm[8:9]]),
        np.concatenate([lm[17:22], lm[27:28], lm[31:36], lm[8:9]]),
        np.concatenate([lm[22:27], lm[27:28], lm[31:36], lm[8:9]]),
        np.concatenate([lm[27:31], lm[31:36]]),
    ]
    return _fill(size, parts)


def eyes_mouth_mask(size: tuple[int, int], points: np.ndarray) -> np.ndarray:
    """DFL's eyes-and-mouth region (get_image_eye_mask + get_image_mouth_mask, clipped to 1), with its
    OpenCV calls: the hulls of both eyes and the inner lips, dilated by an ellipse of h/32 and blurred
    by a Gaussian of h/16 taps (sigma 0: OpenCV's own for the size). Float (h, w) in [0, 1]."""
    import cv2

    h = size[0]
    lm = points.astype(np.int64)
    total = np.zeros(size, dtype=np.float32)
    for parts in ([lm[36:42], lm[42:48]], [lm[60:68]]):
        mask = _fill(size, parts)
        d = h // 32
        mask = cv2.dilate(mask, cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (d, d)), iterations=1)
        k = h // 16
        k += 1 - k % 2
        total += cv2.GaussianBlur(mask, (k, k), 0)
    return np.clip(total, 0, 1)


# `decode`'s dfl_masks beyond 1 (the face mask) and 2 (and the eyes-and-mouth region): the XSeg labels (drawn in
# DFL's editor), or the XSeg mask applied (what DFL's XSeg trainer takes where no face of a set is labelled).
LABELS, APPLIED = 3, 4


def label_mask(meta: dict[str, Any], size: tuple[int, int]) -> np.ndarray:
    """The face's XSeg label (h, w float32 in {0, 1}) as DFL's SegIEPolys.overlay_mask draws it: its
    include polygons filled with 1, then its exclude polygons with 0, each by cv2.fillPoly on the
    points truncated to integers. NoFaceData when the face has no labelled points (DFL's XSeg trainer
    leaves such faces out)."""
    import cv2

    polys = meta.get("seg_ie_polys")
    if isinstance(polys, dict):
        polys = [(p.get("type"), p.get("pts")) for p in polys.get("polys", []) if isinstance(p, dict)]
    drawn = []
    for kind, pts in polys if isinstance(polys, list | tuple) else []:
        try:
            pts = np.asarray(pts if pts is not None else np.zeros((0, 2)), dtype=np.float64)
        except (TypeError, ValueError):
            pts = np.zeros((0, 3))
        if pts.size == 0 and pts.ndim == 1 and kind in (0, 1):  # (a polygon of no points, []: DFL skips it; found
            continue  # from outside, the face was refused)
        if kind not in (0, 1) or pts.ndim != 2 or pts.shape[1] != 2:
            raise NoFaceData("its XSeg polygons are not DFL's (a type 0 or 1 and (x, y) points each)")
        if not np.isfinite(pts).all() or (np.abs(pts) > 2**20).any():
            raise NoFaceData("its XSeg polygons hold points that are no pixels (not finite, or far outside)")
        if len(pts):
            drawn.append((int(kind) == 1, pts.astype(np.int32)))
    if not drawn:
        raise NoFaceData("it has no XSeg labels (polygons drawn in DeepFaceLab's XSeg editor, which XSeg trains on)")
    mask = np.zeros(size, np.float32)
    for include, pts in sorted(drawn, key=lambda d: not d[0]):  # (SegIEPolys.sort: includes first, stable)
        cv2.fillPoly(mask, [pts], 1.0 if include else 0.0)
    return mask


# DFL's face types as its extractor writes them into a face (FaceType.toString) -> SAEHD's face_type option.
FACE_TYPES = {"half_face": "h", "midfull_face": "mf", "full_face": "f", "whole_face": "wf", "head": "head"}


def face_masks(
    data: bytes, size: tuple[int, int], eyes_mouth: bool, what: str = "image", xseg: str = ""
) -> tuple[list[np.ndarray], str]:
    """The mask planes (uint8, h × w of the image) an aligned DFL face carries: the face mask, and with
    `eyes_mouth` the eyes-and-mouth region (or with `xseg` "labels", its XSeg label alone; "applied", its applied
    XSeg mask alone, cut at 0.5 as DFL's XSeg trainer cuts it, NoFaceData without one); and its face type as
    SAEHD's option names it (h, mf, f, wf, head). Raises NoFaceData (one line) when it carries none, or a
    type SAEHD does not train."""
    meta = read_metadata(data, what)
    if meta is None:
        raise NoFaceData("it has no DeepFaceLab metadata (an aligned face from DFL's extractor is a JPEG that has)")
    extracted = extracted_type(meta)
    if extracted not in FACE_TYPES:
        raise NoFaceData(f"its face type {extracted!r} is not one SAEHD trains ({', '.join(FACE_TYPES)})")
    if xseg == "labels":
        return [np.round(label_mask(meta, size) * 255).astype(np.uint8)], FACE_TYPES[extracted]
    if xseg == "applied" and meta.get("xseg_mask") is None:
        raise NoFaceData("it has no XSeg mask applied (bigbatch xseg apply, or DFL's, writes one)")
    applied = xseg == "applied"
    xseg = meta.get("xseg_mask")
    points = landmarks_of(meta) if eyes_mouth or xseg is None else None
    if xseg is not None:  # the compressed mask XSeg wrote into the image
        with Image.open(io.BytesIO(np.asarray(xseg, dtype=np.uint8).tobytes())) as img:
            img = img.convert("L")
            if applied:  # (DFL's XSeg trainer: cut at 0.5 as stored, at 256 px)
                img = img.point(lambda v: 255 if v >= 128 else 0)
            mask = np.asarray(img.resize(size[::-1], Image.Resampling.BICUBIC), dtype=np.float32) / 255
    else:
        mask = hull_mask(size, points, float(meta.get("eyebrows_expand_mod", 1.0) or 1.0))
    planes = [mask]
    if eyes_mouth:
        planes.append(eyes_mouth_mask(size, points))
    return [np.clip(np.round(p * 255), 0, 255).astype(np.uint8) for p in planes], FACE_TYPES[extracted]
