"""DeepFaceLab's face alignment (facelib/LandmarksProcessor.py, FaceType.py): the similarity that maps a face's
68 landmarks onto DFL's mean face, and from it the square each face type crops, so that a face bigbatch aligns
and one DFL aligns are the same pixels (tests/test_faces_align.py checks against DFL's own outputs,
tests/data/dfl_faces_golden.npz). Written from DFL's published constants and Umeyama's paper; no DFL code.
In the data layer, as DFL's aligned faces are: `prepare` cuts faces to another face type by it, as the faces
pipeline (bigbatch/faces) extracts and merges by it."""

from __future__ import annotations

import enum
import math

import cv2
import numpy as np

from bigbatch.data.dfl_faces import jaw_yaw
from bigbatch.errors import BigbatchError


class FaceType(enum.IntEnum):
    """DFL's face types, in its numbering (each larger one holds the smaller)."""

    HALF = 0
    MID_FULL = 1
    FULL = 2
    FULL_NO_ALIGN = 3
    WHOLE_FACE = 4
    HEAD = 10
    HEAD_NO_ALIGN = 20

    @property
    def dfl_name(self) -> str:
        """The name DFL writes into an aligned face's metadata (face_type)."""
        return _DFL_NAMES[self]

    @property
    def padding(self) -> float:
        """How far the crop reaches past the mean face's unit square, as a fraction of its diagonal."""
        return _PADDING[self]

    @property
    def aligned(self) -> bool:
        """False for the *_NO_ALIGN types: the square is centred on the face but not rotated with it."""
        return self not in (FaceType.FULL_NO_ALIGN, FaceType.HEAD_NO_ALIGN)


_DFL_NAMES = {
    FaceType.HALF: "half_face",
    FaceType.MID_FULL: "midfull_face",
    FaceType.FULL: "full_face",
    FaceType.FULL_NO_ALIGN: "full_face_no_align",
    FaceType.WHOLE_FACE: "whole_face",
    FaceType.HEAD: "head",
    FaceType.HEAD_NO_ALIGN: "head_no_align",
}
_PADDING = {
    FaceType.HALF: 0.0,
    FaceType.MID_FULL: 0.0675,
    FaceType.FULL: 0.2109375,
    FaceType.FULL_NO_ALIGN: 0.2109375,
    FaceType.WHOLE_FACE: 0.40,
    FaceType.HEAD: 0.70,
    FaceType.HEAD_NO_ALIGN: 0.70,
}
# What users type: SAEHD's short names (h, mf, f, wf, head), DFL's metadata names, and a few spelled out.
_NAMES = {
    **{t.dfl_name: t for t in FaceType},
    "h": FaceType.HALF,
    "half": FaceType.HALF,
    "mf": FaceType.MID_FULL,
    "mid-full": FaceType.MID_FULL,
    "f": FaceType.FULL,
    "full": FaceType.FULL,
    "wf": FaceType.WHOLE_FACE,
    "whole-face": FaceType.WHOLE_FACE,
}
SHORT_NAMES = ("h", "mf", "f", "wf", "head")


def face_type(name: str | FaceType) -> FaceType:
    """The face type a name means (SAEHD's h/mf/f/wf/head, or DFL's metadata name); one line if none."""
    if isinstance(name, FaceType):
        return name
    found = _NAMES.get(str(name).lower().replace("_", "-")) or _NAMES.get(str(name).lower())
    if found is None:
        raise BigbatchError(
            f"unknown face type {name!r}: give one of {', '.join(SHORT_NAMES)} (half, mid-full, full, whole face, "
            "head) or DFL's name (half_face, midfull_face, full_face, whole_face, head)"
        )
    return found


# DFL's mean face (landmarks_2D_new): iBUG-68 points 17-48 (brows, nose, eyes, mouth corner 48) and 54, in the
# unit square the alignment maps a face onto. The jaw is left out: it moves with the mouth and the pose.
MEAN_FACE = np.array(
    [
        [0.000213256, 0.106454], [0.0752622, 0.038915], [0.18113, 0.0187482], [0.29077, 0.0344891],
        [0.393397, 0.0773906], [0.586856, 0.0773906], [0.689483, 0.0344891], [0.799124, 0.0187482],
        [0.904991, 0.038915], [0.98004, 0.106454], [0.490127, 0.203352], [0.490127, 0.307009],
        [0.490127, 0.409805], [0.490127, 0.515625], [0.36688, 0.587326], [0.426036, 0.609345],
        [0.490127, 0.628106], [0.554217, 0.609345], [0.613373, 0.587326], [0.121737, 0.216423],
        [0.187122, 0.178758], [0.265825, 0.179852], [0.334606, 0.231733], [0.260918, 0.245099],
        [0.182743, 0.244077], [0.645647, 0.231733], [0.714428, 0.179852], [0.793132, 0.178758],
        [0.858516, 0.216423], [0.79751, 0.244077], [0.719335, 0.245099], [0.254149, 0.780233],
        [0.726104, 0.780233],
    ],
    dtype=np.float32,
)  # fmt: skip


def umeyama(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The similarity (rotation, uniform scale, translation) that best maps points `src` onto `dst` in the
    least-squares sense, as a homogeneous (d+1, d+1) matrix (Umeyama 1991, eqs. 38-43; reflections excluded)."""
    src = np.asarray(src, np.float64)
    dst = np.asarray(dst, np.float64)
    n, dim = src.shape
    src_mean, dst_mean = src.mean(0), dst.mean(0)
    src_d, dst_d = src - src_mean, dst - dst_mean
    A = dst_d.T @ src_d / n
    d = np.ones(dim)
    if np.linalg.det(A) < 0:
        d[-1] = -1
    T = np.eye(dim + 1)
    U, S, Vt = np.linalg.svd(A)
    rank = np.linalg.matrix_rank(A)
    if rank == 0:
        return np.full_like(T, np.nan)
    if rank == dim - 1 and np.linalg.det(U) * np.linalg.det(Vt) <= 0:
        d_ = d.copy()
        d_[-1] = -1
        R = U @ np.diag(d_) @ Vt
    elif rank == dim - 1:
        R = U @ Vt
    else:
        R = U @ np.diag(d) @ Vt
    scale = (S @ d) / src_d.var(0).sum()
    T[:dim, :dim] = R * scale
    T[:dim, dim] = dst_mean - scale * (R @ src_mean)
    return T


def transform_points(points: np.ndarray, mat: np.ndarray, invert: bool = False) -> np.ndarray:
    """Points (n, 2) through a 2x3 affine matrix (or its inverse)."""
    mat = np.asarray(mat, np.float64)
    if invert:
        mat = cv2.invertAffineTransform(mat)
    points = np.asarray(points, np.float64).reshape(-1, 2)
    return points @ mat[:, :2].T + mat[:, 2]


def transform_mat(landmarks: np.ndarray, size: int, kind: FaceType | str, scale: float = 1.0) -> np.ndarray:
    """The 2x3 matrix that maps a frame onto the `size`-pixel aligned square of face type `kind` (DFL's
    get_transform_mat); `scale` > 1 zooms in, as the merger's output face scale does."""
    kind = face_type(kind)
    landmarks = np.asarray(landmarks, np.float32)
    if landmarks.shape != (68, 2):
        raise ValueError(f"landmarks must be 68 (x, y) points, got shape {landmarks.shape}")
    fit = umeyama(np.concatenate([landmarks[17:49], landmarks[54:55]]), MEAN_FACE)[:2]
    # The mean face's unit square (corners and centre) back in the frame; DFL keeps these float32.
    g = transform_points(np.float32([(0, 0), (1, 0), (1, 1), (0, 1), (0.5, 0.5)]), fit, invert=True)
    g = g.astype(np.float32)
    centre = g[4].copy()
    tb = (g[2] - g[0]).astype(np.float32)
    tb /= np.linalg.norm(tb)
    bt = (g[1] - g[3]).astype(np.float32)
    bt /= np.linalg.norm(bt)
    # float32 throughout, as NumPy 1's value-based casting kept DFL's arithmetic (the crop moves by 1e-3 px else)
    reach = np.float32((1.0 / scale) * (np.linalg.norm(g[0] - g[2]) * (kind.padding * math.sqrt(2.0) + 0.5)))
    if kind == FaceType.WHOLE_FACE:  # 7% higher, to take in the forehead
        up = (g[0] - g[3]).astype(np.float32)
        centre += up * 0.07
    elif kind == FaceType.HEAD:
        # sideways by the yaw (damped near zero), then half the face's height up
        yaw = jaw_yaw(transform_points(landmarks, fit))
        side = (g[0] - g[1]).astype(np.float32)
        side_len = np.linalg.norm(side)
        yaw *= abs(math.tanh(yaw * 2))
        centre -= side / side_len * (yaw * side_len / 2.0)
        up = (g[0] - g[3]).astype(np.float32)
        centre += up * 0.50
    corners = np.array([centre - tb * reach, centre + bt * reach, centre + tb * reach])
    if not kind.aligned:  # the same area, upright
        square = np.array([*corners, centre - bt * reach])
        x, y = square[:, 0].astype(np.float32), square[:, 1].astype(np.float32)
        area = 0.5 * abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1)))
        half = np.float32(math.sqrt(area) / 2)
        corners = np.array([centre + [-half, -half], centre + [half, -half], centre + [half, half]])
    target = np.float32([(0, 0), (size, 0), (size, size)])
    return cv2.getAffineTransform(corners.astype(np.float32), target)


def warp_face(image: np.ndarray, mat: np.ndarray, size: int) -> np.ndarray:
    """The aligned face: the frame warped bilinearly onto the square (what DFL's warpAffine call does: its
    LANCZOS4 flag lands in the `dst` argument, so OpenCV's default, bilinear, runs)."""
    return cv2.warpAffine(image, np.asarray(mat, np.float64), (size, size), flags=cv2.INTER_LINEAR)


def square_in_frame(mat: np.ndarray, size: int) -> np.ndarray:
    """The aligned square's four corners in the frame (top-left, bottom-left, bottom-right, top-right)."""
    return transform_points([(0, 0), (0, size - 1), (size - 1, size - 1), (size - 1, 0)], mat, invert=True)


def polygon_area(points: np.ndarray) -> float:
    """The area of a simple polygon (shoelace)."""
    x, y = np.asarray(points, np.float64).T
    return float(0.5 * abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1))))
