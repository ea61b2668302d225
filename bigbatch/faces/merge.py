"""Swapped faces put back into their frames as DeepFaceLab's merger does (merger/MergeMasked.py): per face, the
frame warped into the model's square by the face type's transform of the face's source landmarks (recomputed,
not the stored matrix), swapped by the model, its mask chosen and shaped (erode, blur) at 4x the model's
resolution, recoloured like the dst face, warped back by the inverse transform (bicubic) and blended, or
cloned (OpenCV's seamlessClone, as DFL calls it). Written from DFL's published behaviour and checked against
its own MergeMasked's outputs (tests/data/dfl_faces_golden.npz); no DFL code. Images are RGB here (DFL's are
BGR): every step is per channel or a colour transfer that takes RGB."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import cv2
import numpy as np
import torch

from bigbatch.data import align
from bigbatch.data.dfl_faces import hull_mask
from bigbatch.errors import BigbatchError
from bigbatch.faces.merge_filters import SHARPEN, blursharpen, color_degraded, degraded, linear_motion_blur
from bigbatch.tasks.swap import color

MODES = ("overlay", "hist-match", "seamless", "seamless-hist-match", "raw-rgb", "raw-predict", "original")
# DFL's mask modes 0-9 by name (xseg: XSeg-prd*XSeg-dst; learned*xseg: all four), and the landmarks' hull times
# the model's masks (not one of DFL's).
XSEG_MASKS = ("xseg-prd", "xseg-dst", "xseg", "learned*xseg")
PRD_MASKS = ("xseg-prd", "xseg", "learned*xseg")  # those that read XSeg's mask of the swap
MASKS = ("full", "hull", "learned-prd", "learned-dst", "learned", "learned-sum", "hull*learned", *XSEG_MASKS)
# DFL's own names of its mask modes (mask_mode_dict; its 1, "dst", is the landmarks' hull), taken as these
DFL_MASKS = {"dst": "hull", "learned-prd*learned-dst": "learned", "learned-prd+learned-dst": "learned-sum"}
DFL_MASKS |= {"xseg-prd*xseg-dst": "xseg", "learned-prd*learned-dst*xseg-prd*xseg-dst": "learned*xseg"}
COLORS = ("none", *color.MERGE_MODES)
BATCH = 8  # faces the model swaps at once, and frames merged together
UP = 4  # DFL's merge masks are shaped at 4x the model's resolution, and its face enhancer's output is 4x


def merge_threads() -> int:
    """The threads a merge works on (each a chunk of frames: its faces swapped, then each frame merged)."""
    return min(os.cpu_count() or 1, 8)


Predictor = Callable[[np.ndarray], tuple[np.ndarray, ...]]
"""A face (res, res, 3) RGB float32 in [0, 1] -> (the swapped face, the src-path mask, the dst-path mask), the
masks (res, res) in [0, 1]: what SAEHD's swap gives for one face; for the XSeg masks, then XSeg's masks of the
swapped face and of the dst face (faces/xseg.merge_masks)."""


Enhancer = Callable[[np.ndarray], np.ndarray]
"""The swapped face (res, res, 3) RGB -> 4x, as DFL's merger calls its FaceEnhancer (merge_run.enhancer_of)."""

Segmenter = Callable[[np.ndarray], np.ndarray]
"""A swapped face (n, n, 3) RGB -> XSeg's mask of it (n, n), as DFL's merger takes it (faces/xseg.merge_masks):
for super resolution, XSeg's mask of the enhanced swap."""


@dataclass(frozen=True)
class MergeSettings:
    """How faces go back into frames; the defaults are DFL's merger's (MergerConfigMasked)."""

    mode: str = "overlay"
    mask: str = "learned"  # DFL's learned-prd*learned-dst
    erode: int = 0  # mask erosion (dilation below 0), pixels at 4x the model's resolution; -400..400
    blur: int = 0  # mask feather, the same pixels; 0..400
    color: str = "rct"  # DFL's colour transfer of the swap to the dst face, or none
    scale: int = 0  # output face scale, percent: -50..50
    hist_threshold: int = 238  # hist-match's
    masked_hist: bool = True
    super_resolution: int = 0  # DFL's super_resolution_power: percent of its FaceEnhancer's 4x swap, 0..100
    # DFL's finishing filters (merge_filters), 0 (off) by default as DFL's:
    motion_blur: int = 0  # motion_blur_power: the face blurred along its motion between frames, 0..100
    sharpen: str = "none"  # sharpen_mode: box or gaussian, by blursharpen
    blursharpen: int = 0  # blursharpen_amount: -100..100 (below 0: the face median-blurred, whatever sharpen)
    denoise: int = 0  # image_denoise_power: the frame under the face median-blurred, 0..500
    bicubic_degrade: int = 0  # bicubic_degrade_power: the frame under the face shrunk and enlarged, 0..100
    color_degrade: int = 0  # color_degrade_power: the merged frame mixed with it in 256 colours, 0..100

    def __post_init__(self) -> None:
        if (dfl := self.mask.lower()) in DFL_MASKS or dfl in MASKS:  # (found from outside: DFL's names refused)
            object.__setattr__(self, "mask", DFL_MASKS.get(dfl, dfl))
        for name, value, valid in (("--mode", self.mode, MODES), ("--mask", self.mask, MASKS)):
            if value not in valid:
                raise BigbatchError(f"{name} {value!r} is not one of {', '.join(valid)}")
        if self.sharpen not in SHARPEN:
            raise BigbatchError(f"--sharpen {self.sharpen!r} is not one of {', '.join(SHARPEN)}")
        if self.color not in COLORS:
            raise BigbatchError(
                f"--color {self.color!r} is not one of {', '.join(COLORS)} (DFL's merger's but mix-m, which "
                "round-trips through 8-bit L*a*b*)"
            )
        for name, value, low, high in (
            ("--erode", self.erode, -400, 400),
            ("--blur", self.blur, 0, 400),
            ("--scale", self.scale, -50, 50),
            ("--hist-threshold", self.hist_threshold, 0, 255),
            ("--super-resolution", self.super_resolution, 0, 100),
            ("--motion-blur", self.motion_blur, 0, 100),
            ("--blursharpen", self.blursharpen, -100, 100),
            ("--denoise", self.denoise, 0, 500),
            ("--bicubic-degrade", self.bicubic_degrade, 0, 100),
            ("--color-degrade", self.color_degrade, 0, 100),
        ):
            if not low <= value <= high:
                raise BigbatchError(f"{name} must be {low} to {high}, got {value}")

    def unread(self) -> list[str]:
        """The settings given (not their defaults) that this mode does not read, as options (found from outside:
        --erode and --color with raw-rgb changed nothing, unsaid, and merged every frame again)."""
        # (a setting given off, none or 0, changes nothing: found from outside, --color none was said unread)
        off = ("none", 0)
        given = [
            f.name
            for f in fields(self)
            if (v := getattr(self, f.name)) != f.default and (isinstance(v, bool) or v not in off)
        ]
        option = {"masked_hist": "--no-masked-hist"}  # (its default, True, is the one without an option)
        return [option.get(n, f"--{n.replace('_', '-')}") for n in given if n not in READ[self.mode]]

    def unpaired(self) -> str | None:
        """Which of --sharpen and --blursharpen is given without the other, which it needs (DFL's merger asks the
        amount of a sharpen mode alone; found from outside, each alone changed nothing but merged every frame
        again), or None."""
        if self.mode not in FINISHED:
            return None
        if self.sharpen != "none" and not self.blursharpen:
            return "sharpen"
        return "blursharpen" if self.blursharpen > 0 and self.sharpen == "none" else None

    def as_read(self) -> MergeSettings:
        """These settings with those the mode does not read at their defaults: a merge's record of them, so that
        changing one of those keeps the frames merged before."""
        unread = {f.name for f in fields(self) if f.name not in READ[self.mode]} | {self.unpaired()}
        return replace(self, **{f.name: f.default for f in fields(self) if f.name in unread})

    def record(self) -> dict:
        """What a merge's record keeps of these settings: DFL's finishing filters only where on, so that a merge
        recorded before they were here is of the same settings (found by review: every such merge began again)."""
        added = ("motion_blur", "sharpen", "blursharpen", "denoise", "bicubic_degrade", "color_degrade")
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in added or getattr(self, f.name) != f.default
        }


# What each mode reads of MergeSettings (merge_face): raw-rgb warps the swap in whole, its mask only for masks/;
# raw-predict gives the model's face and mask; original the frame, and its shaped mask for masks/.
FINISHED = ("overlay", "hist-match", "seamless", "seamless-hist-match")  # the modes DFL's filters finish
_SHAPED = ("mode", "mask", "erode", "blur", "scale", "super_resolution")
_FINISHED = (*_SHAPED, "color", "motion_blur", "sharpen", "blursharpen", "denoise", "bicubic_degrade", "color_degrade")
READ = {
    "overlay": _FINISHED,
    "hist-match": (*_FINISHED, "hist_threshold", "masked_hist"),
    "seamless": _FINISHED,
    "seamless-hist-match": (*_FINISHED, "hist_threshold"),
    "raw-rgb": ("mode", "mask", "scale", "super_resolution"),
    "raw-predict": ("mode", "mask", "super_resolution"),
    "original": ("mode", "mask", "erode", "blur", "scale", "super_resolution"),  # (masks/ at 4x with it)
}


def _warp_in(image: np.ndarray, mat: np.ndarray, size: int) -> np.ndarray:
    return cv2.warpAffine(image, mat, (size, size), flags=cv2.INTER_CUBIC)


def _warp_out(face: np.ndarray, mat: np.ndarray, frame_size: tuple[int, int]) -> np.ndarray:
    return cv2.warpAffine(face, mat, frame_size, flags=cv2.WARP_INVERSE_MAP | cv2.INTER_CUBIC)


def hist_match(source: np.ndarray, template: np.ndarray, threshold: int = 255) -> np.ndarray:
    """DFL's color_hist_match: each channel's values mapped so that their histogram follows the template's,
    the source's quantiles scaled to `threshold`/255 of the range first (below 255: the brightest values are
    held back)."""
    out = np.empty(source.shape, np.float64)
    for c in range(source.shape[2]):
        s_values, s_index, s_counts = np.unique(source[..., c].ravel(), return_inverse=True, return_counts=True)
        t_values, t_counts = np.unique(template[..., c].ravel(), return_counts=True)
        s_q = np.cumsum(s_counts).astype(np.float64)
        s_q = threshold * s_q / s_q[-1]
        t_q = np.cumsum(t_counts).astype(np.float64)
        t_q = 255 * t_q / t_q[-1]
        out[..., c] = np.interp(s_q, t_q, t_values)[s_index].reshape(source.shape[:2])
    return out.astype(source.dtype)


def _transfer(mode: str, face: np.ndarray, dst: np.ndarray, area: np.ndarray, key: int) -> np.ndarray:
    """The merger's colour transfer of `face` like `dst` inside `area` (res, res, 1), through the swap task's
    batched implementation (tested against DFL's); idt's and sot's draws keyed by `key` (the frame)."""
    kind = "idt" if "idt" in mode else "sot" if "sot" in mode else "none"
    g = torch.Generator().manual_seed(key)
    draws = color.draw(1, g, kind, 0.0, color.MERGE_SOT_BATCH)[0]

    def chw(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(x, np.float32)).permute(2, 0, 1)[None]

    out = color.merge_transfer(mode, chw(face), chw(dst), chw(area), draws)
    return out[0].permute(1, 2, 0).numpy()


def _shape_mask(mask: np.ndarray, res: int, s: MergeSettings) -> np.ndarray:
    """DFL's mask processing at 4x the model's resolution: padded by `res`, eroded or dilated (an ellipse), a
    border of res + blur/2 cleared so the feather fades to zero inside the square, blurred, unpadded."""
    mask = np.pad(mask, res)
    if s.erode > 0:
        mask = cv2.erode(mask, cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (s.erode, s.erode)), iterations=1)
    elif s.erode < 0:
        mask = cv2.dilate(mask, cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (-s.erode, -s.erode)), iterations=1)
    clip = res + s.blur // 2
    mask[:clip], mask[-clip:], mask[:, :clip], mask[:, -clip:] = 0, 0, 0, 0
    if s.blur > 0:
        k = s.blur + (1 - s.blur % 2)
        mask = cv2.GaussianBlur(mask, (k, k), 0)
    return np.clip(mask[res:-res, res:-res], 0, 1)


def face_input(
    frame: np.ndarray, landmarks: np.ndarray, res: int, kind: align.FaceType, enhanced: bool = False
) -> np.ndarray:
    """What the model is given for a face of a frame (RGB uint8): the face type's square at the model's
    resolution, bicubic, float32 RGB in [0, 1] (from the part of the frame the square covers, as merge_face);
    `enhanced` (super resolution): cut at 4x and resized down (bilinear), as DFL's merger then does."""
    size = res * UP if enhanced else res
    mat = align.transform_mat(landmarks, size, kind)
    x0, y0, x1, y1 = _box([(mat, size)], frame.shape[1], frame.shape[0])
    part = frame[y0:y1, x0:x1].astype(np.float32) / 255
    face = np.clip(_warp_in(part, _shift(mat, x0, y0), size), 0, 1)
    return cv2.resize(face, (res, res)) if enhanced else face


def _box(mats: list[tuple[np.ndarray, int]], w: int, h: int, margin: int = 4) -> tuple[int, int, int, int]:
    """The part of a (w, h) frame the squares of `mats` (matrix, side) cover, with a margin for the bicubic
    kernel: the only pixels a face's merge reads or changes."""
    corners = np.concatenate(
        [align.transform_points([(0, 0), (n, 0), (n, n), (0, n)], m, invert=True) for m, n in mats]
    )
    x0, y0 = (max(int(np.floor(v)) - margin, 0) for v in corners.min(0))
    x1, y1 = (int(np.ceil(v)) + margin for v in corners.max(0))
    return x0, y0, min(max(x1, x0 + 1), w), min(max(y1, y0 + 1), h)


def _shift(mat: np.ndarray, x0: int, y0: int) -> np.ndarray:
    """A frame -> face matrix for the frame's part starting at (x0, y0)."""
    out = np.array(mat, np.float64)
    out[:, 2] += out[:, :2] @ (x0, y0)
    return out


def merge_face(
    frame: np.ndarray,
    landmarks: np.ndarray,
    predictor: Predictor,
    res: int,
    kind: align.FaceType,
    s: MergeSettings,
    key: int = 0,
    enhancer: Enhancer | None = None,
    segmenter: Segmenter | None = None,
    motion: tuple[float, float] = (0.0, 0.0),
    under: np.ndarray | None = None,
) -> tuple[tuple[int, int, int, int], np.ndarray | None, np.ndarray]:
    """One face of a frame (RGB uint8) swapped and merged, in the part of the frame it can change: (that box
    (x0, y0, x1, y1), the merged part float32 RGB in [0, 1] or None where the mask leaves nothing to merge into
    (the frame as it was), its merge mask (h, w, 1)); with mode raw-predict,
    the box is None and the model's face and mask come instead. Only the box is warped and blended (a face
    is a small part of a 720p frame); the pixels are those DFL's full-frame merge gives. With
    s.super_resolution, `enhancer` makes the swap 4x (DFL's FaceEnhancer) and the face is merged at that size; XSeg's
    mask of the swap is then `segmenter`'s of the enhanced swap, as DFL's (the predictor's, without). `motion`: the
    face's between frames (merge_filters.motions), for s.motion_blur; `under`: the whole frame degraded (float32,
    merge_filters.degraded) for s.denoise and s.bicubic_degrade, which the face is blended onto."""
    fh, fw = frame.shape[:2]
    sub = res * UP
    size = sub if s.super_resolution else res  # (DFL's output_size)
    face_mat = align.transform_mat(landmarks, size, kind)
    out_mat = align.transform_mat(landmarks, size, kind, 1.0 + 0.01 * s.scale)
    mask_mat = align.transform_mat(landmarks, sub, kind, 1.0 + 0.01 * s.scale)
    x0, y0, x1, y1 = box = _box([(face_mat, size), (out_mat, size), (mask_mat, sub)], fw, fh)
    part = frame[y0:y1, x0:x1]
    image = part.astype(np.float32) / 255
    h, w = image.shape[:2]
    face_mat, out_mat, mask_mat = (_shift(m, x0, y0) for m in (face_mat, out_mat, mask_mat))

    dst = np.clip(_warp_in(image, face_mat, size), 0, 1)
    hull = np.clip(_warp_in(hull_mask((h, w), np.asarray(landmarks) - (x0, y0)), face_mat, size), 0, 1)
    given = cv2.resize(dst, (res, res)) if size != res else dst
    prd, prd_mask, dst_mask, *xseg = (np.clip(np.asarray(x, np.float32), 0, 1) for x in predictor(given))
    x_prd, x_dst = xseg if xseg else (None, None)
    if s.super_resolution:  # DFL's: the swap and its 4x enhancement mixed by the power; the masks resized
        if enhancer is None:
            raise ValueError("super_resolution needs the enhancer")
        power = s.super_resolution / 100
        prd = np.clip(cv2.resize(prd, (size, size)) * (1 - power) + enhancer(prd) * power, 0, 1)
        prd_mask, dst_mask, x_dst = (  # (XSeg's dst mask by way of res: DFL resizes it from 256 to 4x at once)
            None if m is None else cv2.resize(m, (size, size), interpolation=cv2.INTER_CUBIC)
            for m in (prd_mask, dst_mask, x_dst)
        )
        if segmenter is not None:  # XSeg of the enhanced swap (DFL's XSeg-prd reads the face it merges)
            x_prd = np.clip(segmenter(prd), 0, 1).astype(np.float32)
    mask = {
        "full": lambda: np.ones_like(hull),
        "hull": lambda: hull,
        "learned-prd": lambda: prd_mask,
        "learned-dst": lambda: dst_mask,
        "learned": lambda: prd_mask * dst_mask,
        "learned-sum": lambda: np.clip(prd_mask + dst_mask, 0, 1),
        "hull*learned": lambda: hull * prd_mask * dst_mask,
        "xseg-prd": lambda: x_prd,
        "xseg-dst": lambda: x_dst,
        "xseg": lambda: x_prd * x_dst,
        "learned*xseg": lambda: prd_mask * dst_mask * x_prd * x_dst,
    }[s.mask]().copy()
    mask[mask < 1 / 255] = 0  # DFL: noise
    mask = cv2.resize(mask, (sub, sub), interpolation=cv2.INTER_CUBIC)
    if not s.mode.startswith("raw"):
        mask = _shape_mask(mask, res, s)
    frame_mask = np.clip(_warp_out(mask, mask_mat, (w, h)), 0, 1)[..., None]
    frame_mask[frame_mask < 1 / 255] = 0
    mask = cv2.resize(mask, (size, size), interpolation=cv2.INTER_CUBIC)[..., None]

    if s.mode == "original":
        return box, image, frame_mask
    if s.mode == "raw-predict":
        return None, np.clip(prd, 0, 1), mask
    if s.mode == "raw-rgb":
        face = _warp_out(prd, out_mat, (w, h))
        square = _warp_out(np.ones_like(prd), out_mat, (w, h))
        return box, np.clip(image * (1 - square) + face * square, 0, 1), frame_mask

    inside = np.argwhere(frame_mask[..., 0] >= 0.1)
    if not inside.size or min(inside.max(0) - inside.min(0)) < 4:
        return box, None, frame_mask  # nothing of the mask left to merge into: the frame as it was
    area = (mask > 0).astype(np.float32)
    seamless = s.mode.startswith("seamless")
    if not seamless and s.color != "none":
        prd = _transfer(s.color, prd, dst, area, key)
    if s.mode == "hist-match":
        m = area if s.masked_hist else np.ones_like(area)
        white = 1.0 - m
        prd = hist_match(np.minimum(prd * m + white, 1.0), dst * m + white, s.hist_threshold).astype(np.float32)
    out = np.clip(_warp_out(prd, out_mat, (w, h)), 0, 1)
    if seamless:
        out = _clone(out, frame, frame_mask, box)
    out = image * (1 - frame_mask) + out * frame_mask
    recolour = seamless and s.color != "none"
    if recolour or s.mode == "seamless-hist-match" or s.motion_blur or s.blursharpen or under is not None:
        # finished as DFL's: the merged face taken back into the square, recoloured (after cloning), blurred or
        # sharpened, and warped out again onto the frame (degraded, where asked)
        face = _warp_in(out, face_mat, size)
        if recolour:
            face = _transfer(s.color, face, dst, area, key)
        if s.mode == "seamless-hist-match":
            face = hist_match(face, dst, s.hist_threshold)
        if s.motion_blur and (k := int(motion[0] * s.motion_blur / 100)) >= 1:
            face = linear_motion_blur(face, int(np.clip(k + 1, 2, 50)) * (2 if s.super_resolution else 1), motion[1])
        if s.blursharpen:
            face = blursharpen(face, s.sharpen, s.blursharpen)
        below = image if under is None else under[y0:y1, x0:x1]
        out = np.clip(below * (1 - frame_mask) + _warp_out(face, face_mat, (w, h)) * frame_mask, 0, 1)
    return box, out, frame_mask


def _clone(out: np.ndarray, frame: np.ndarray, mask: np.ndarray, box: tuple[int, int, int, int]) -> np.ndarray:
    """DFL's seamless step: the mask binarised at the first tenth that leaves pixels, and the face cloned into
    the whole frame (OpenCV's Poisson blending sees the frame around it) about the mask's bounding box's centre.
    Returns the box's part of the result."""
    x0, y0, x1, y1 = box
    binary = None
    for i in range(1, 10):
        above = mask > i / 10
        if above.any():
            binary = mask.copy()
            binary[above] = 1.0
            binary[binary <= i / 10] = 0.0
            break
    src = frame.copy()
    src[y0:y1, x0:x1] = (out * 255).astype(np.uint8)
    whole = np.zeros(frame.shape[:2], np.uint8)
    whole[y0:y1, x0:x1] = (binary[..., 0] * 255).astype(np.uint8)
    x, y, bw, bh = cv2.boundingRect(whole)
    try:
        cloned = cv2.seamlessClone(src, frame, whole, (int(x + bw / 2), int(y + bh / 2)), cv2.NORMAL_CLONE)
    except cv2.error:  # (DFL too goes on with the overlay when OpenCV cannot clone: a mask at the border)
        return out
    return cloned[y0:y1, x0:x1].astype(np.float32) / 255


def merge_frame(
    frame: np.ndarray,
    faces: list[np.ndarray],
    predictor: Predictor,
    res: int,
    kind: align.FaceType,
    s: MergeSettings,
    key: int = 0,
    enhancer: Enhancer | None = None,
    segmenter: Segmenter | None = None,
    motion: tuple[float, float] = (0.0, 0.0),
) -> tuple[np.ndarray, np.ndarray]:
    """A frame (RGB uint8) with each face (its source landmarks) swapped in: (RGB uint8, the merge mask uint8),
    each face merged into the original frame and the results laid over one another, as DFL's MergeMasked;
    8-bit by truncation, as DFL converts (outside the faces, the frame's own values, but where s.denoise,
    s.bicubic_degrade or s.color_degrade change the whole frame, as DFL's do). A frame without faces comes back
    as it was, with an empty mask; mode raw-predict gives the model's face and mask instead. `motion`: its faces'
    (merge_filters.motions), for s.motion_blur."""
    out, mask_out = frame.copy(), np.zeros(frame.shape[:2], np.uint8)
    # DFL's denoise, bicubic and colour degrade change the whole frame of each face merged (each face's own frame, as
    # DFL's: a face left as it was, of no mask to merge into, is the frame as it was)
    whole_frame = bool(faces) and s.mode in FINISHED and bool(s.denoise or s.bicubic_degrade or s.color_degrade)
    original = frame.astype(np.float32) / 255 if whole_frame else None
    under = degraded(original, s.denoise, s.bicubic_degrade) if original is not None else None
    merged = [merge_face(frame, lm, predictor, res, kind, s, key, enhancer, segmenter, motion, under) for lm in faces]
    if s.mode == "raw-predict" and merged:
        face, mask = merged[0][1], merged[0][2]
        return (face * 255).astype(np.uint8), (mask[..., 0] * 255).astype(np.uint8)
    if not merged:
        return out, mask_out
    # the faces' parts laid over one another inside the box that holds them all (the whole frame, where it changes)
    x0, y0 = min(b[0] for b, _, _ in merged), min(b[1] for b, _, _ in merged)
    x1, y1 = max(b[2] for b, _, _ in merged), max(b[3] for b, _, _ in merged)
    if original is not None:
        x0, y0, x1, y1 = 0, 0, frame.shape[1], frame.shape[0]
    own = frame[y0:y1, x0:x1].astype(np.float32) / 255 if original is None else original
    final = final_mask = None
    for (bx0, by0, bx1, by1), part, mask in merged:
        face = own  # (a face of no mask to merge into: the frame as it was)
        if part is not None:
            face = (own if under is None else under).copy()
            face[by0 - y0 : by1 - y0, bx0 - x0 : bx1 - x0] = part
            if original is not None:  # (DFL's clip of the whole frame: bicubic's overshoot, found from outside)
                face = np.clip(face, 0, 1)
                face = color_degraded(face, s.color_degrade) if s.color_degrade else face
        whole = np.zeros((*own.shape[:2], 1), np.float32)
        whole[by0 - y0 : by1 - y0, bx0 - x0 : bx1 - x0] = mask
        if final is None:
            final, final_mask = face, whole
        else:
            final = final * (1 - whole) + face * whole
            final_mask = np.clip(final_mask + whole, 0, 1)
    out[y0:y1, x0:x1] = (final * 255).astype(np.uint8)
    mask_out[y0:y1, x0:x1] = (final_mask[..., 0] * 255).astype(np.uint8)
    return out, mask_out
