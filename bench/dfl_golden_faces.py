"""Golden data for bigbatch's port of DeepFaceLab's face extraction and merge: DFL's own functions run on fixed,
made inputs, and their inputs and outputs written to one compressed .npz (tests/data/dfl_faces_golden.npz,
described key by key in tests/data/dfl_faces_golden.md) that bigbatch's tests compare against.

DFL (iperov/DeepFaceLab) is GPL-3: this script imports its code from a checkout given by --dfl at run time and
commits only the numbers it produces, never DFL's code. It needs DFL's Python files only (no .npy weights), and
a throwaway environment outside the repository with the NumPy and OpenCV DFL was written for (np.int is gone
from NumPy 1.24 on, and LandmarksProcessor still uses it); never bigbatch's .venv, and no torch:

    python3 -m venv /tmp/dflenv
    /tmp/dflenv/bin/pip install numpy==1.23.5 opencv-python-headless==4.10.0.84 'scipy<1.12' 'numexpr<2.9' \\
        pillow colorama tqdm scikit-image==0.22.0
    # The mirror lacks the .npy weights: archive the .py files only (git still warns about facelib/2DFAN.npy).
    mkdir -p /tmp/dfl && git --git-dir=/work/.mirror/iperov+DeepFaceLab/repo archive HEAD -- '*.py' | tar -x -C /tmp/dfl
    /tmp/dflenv/bin/python bench/dfl_golden_faces.py --dfl /tmp/dfl                 # writes the .npz
    /tmp/dflenv/bin/python bench/dfl_golden_faces.py --dfl /tmp/dfl --check-dfljpg DIR   # reads aligned faces
    /tmp/dflenv/bin/python bench/dfl_golden_faces.py --dfl /tmp/dfl --selftest-dfljpg    # checks that check

What it runs (the .md says each key's call):
  a. landmarks: 8 made 68-point faces (DFL's landmarks_68_3D turned by a yaw and pitch, projected, then a random
     similarity into a 1280x720 frame and +-1 px of noise), two of them turned far enough that HEAD's yaw matters;
  b. LandmarksProcessor.get_transform_mat for each of them, every FaceType, sizes 256 and 512, scales 1 and 1.25;
  c. transform_points forward and back through the WHOLE_FACE 512 matrix;
  d. get_image_hull_mask, get_image_eye_mask, get_image_mouth_mask on two faces in a 256 aligned (WHOLE_FACE) space;
  e. every colour transfer as merger/MergeMasked.py calls it (its arguments, masks and clipping), on 96x96 faces;
  f. merger/MergeMasked.py's MergeMasked (so MergeMaskedFace and the final BGRA) on a 320x240 crop of
     scikit-image's astronaut, with stand-in predictors, for 16 settings of MergerConfigMasked, and 8 of its
     finishing filters (with core/imagelib's blursharpen, LinearMotionBlur and reduce_colors alone);
  g. core/mathlib/umeyama.py's umeyama on get_transform_mat's own 33-point fits.

Stand-ins, none of them in bigbatch: facelib/__init__.py and merger/__init__.py import the TensorFlow models and
the interactive merger, so both packages are registered without running their __init__ (their plain modules load
from the checkout unchanged); the model is a predictor function (identity, or a fixed tint) with made masks; no
face enhancer (super_resolution_power 0), no XSeg (mask modes 6-9 not run); the finishing filters (motion blur,
with FrameInfo's motion_power and motion_deg set as Merger.py sets them, blursharpen, denoise, bicubic and colour
degrade) in 8 settings of their own (merge_finish_*), 0 in the others.

--check-dfljpg DIR loads every .jpg in DIR with DFL's own DFLIMG.DFLJPG.load and prints its fields, to check
that the aligned faces bigbatch's extractor writes are files DFL reads; --selftest-dfljpg writes one with DFL's
own DFLJPG (as Extractor.final_stage does) to a temporary folder and reads it back that way.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
from _dfl_golden import astronaut_bgr, dfl_commit, open_checkout, soft_ellipse, write_golden
from _dfl_golden_merge import golden_merge, golden_merge_finish

FRAME_W, FRAME_H = 1280, 720  # the frame the made landmarks lie in
SIZES = (256, 512)
SCALES = (1.0, 1.25)  # 1.25: the merger's scale for output_face_scale 25 (1 + 0.01 * 25)
CT_SIZE = 96
CT_SEEDS = 5  # seeds per random colour transfer (idt, sot, mix): their statistics, for a statistical check


def import_dfl(dfl: Path) -> SimpleNamespace:
    """DFL's modules, imported from the checkout at `dfl` without changing any of its files."""
    # facelib/__init__ imports S3FD, FAN, FaceEnhancer and XSeg (core.leras, so TensorFlow), merger/__init__ the
    # interactive merger (its subprocess pool and screens): none is needed here.
    open_checkout(dfl, "facelib/LandmarksProcessor.py", ("facelib", "merger"))
    from core import imagelib
    from core.mathlib.umeyama import umeyama
    from DFLIMG.DFLJPG import DFLJPG
    from facelib import LandmarksProcessor
    from facelib.FaceType import FaceType
    from merger import MergeMasked, MergerConfig
    from merger.FrameInfo import FrameInfo

    return SimpleNamespace(
        FaceType=FaceType,
        LP=LandmarksProcessor,
        imagelib=imagelib,
        umeyama=umeyama,
        DFLJPG=DFLJPG,
        MergeMasked=MergeMasked,
        MergerConfig=MergerConfig,
        FrameInfo=FrameInfo,
    )


# ---------------------------------------------------------------------------------------------------------------
# a. landmarks


def project(points3d: np.ndarray, yaw: float, pitch: float) -> np.ndarray:
    """Orthographic (x, y) of 3D points (x right, y down, z away from the camera) turned by yaw, then pitch."""
    cy, sy, cp, sp = math.cos(yaw), math.sin(yaw), math.cos(pitch), math.sin(pitch)
    yaw_m = np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]])
    pitch_m = np.array([[1, 0, 0], [0, cp, -sp], [0, sp, cp]])
    return (points3d.astype(np.float64) @ (pitch_m @ yaw_m).T)[:, :2]


def make_landmarks(dfl: SimpleNamespace) -> tuple[np.ndarray, np.ndarray]:
    """Eight realistic 68-point faces in a 1280x720 frame, float64 (as DFL has them: FANExtractor computes in
    float64, and DFLJPG's getters make float64 arrays of the stored lists), and the parameters that made each:
    (face width px, roll deg, yaw deg, pitch deg, centre x, centre y)."""
    rng = np.random.default_rng(20261128)
    mean3d = dfl.LP.landmarks_68_3D
    # Yaw in degrees: small for six faces, far to either side for two (HEAD's yaw shift is damped by
    # |tanh(2 yaw)|, so only a clearly turned face moves its square).
    yaws = [4.0, -7.0, 9.0, -3.0, 6.0, -9.0, 38.0, -42.0]
    sets, params = [], []
    for yaw in yaws:
        width = rng.uniform(80, 400)  # across the jaw, in pixels
        roll = rng.uniform(-40, 40)
        pitch = rng.uniform(-10, 10)
        xy = project(mean3d, math.radians(yaw), math.radians(pitch))
        xy -= xy.mean(axis=0)
        xy *= width / (mean3d[:, 0].max() - mean3d[:, 0].min())
        c, s = math.cos(math.radians(roll)), math.sin(math.radians(roll))
        xy = xy @ np.array([[c, s], [-s, c]])
        reach = np.abs(xy).max(axis=0) + 2  # the centre keeps the whole face inside the frame
        centre = rng.uniform(reach, np.array([FRAME_W, FRAME_H]) - reach)
        xy = xy + centre + rng.uniform(-1, 1, xy.shape)
        sets.append(xy)
        params.append([width, roll, yaw, pitch, *centre])
    return np.stack(sets), np.array(params, dtype=np.float64)


# ---------------------------------------------------------------------------------------------------------------
# b, c, g. transforms


def golden_transforms(dfl: SimpleNamespace, lms: np.ndarray) -> dict[str, np.ndarray]:
    """get_transform_mat for every face type, size and scale; transform_points; umeyama."""
    FaceType, LP = dfl.FaceType, dfl.LP
    accepted, rejected, reasons = [], [], []
    for ft in FaceType:
        try:
            LP.get_transform_mat(lms[0], 256, ft)
            accepted.append(ft)
        except Exception as e:  # MARK_ONLY: no entry in FaceType_to_padding_remove_align
            rejected.append(ft)
            reasons.append(f"{type(e).__name__}: {e}")
    mats = np.zeros((len(lms), len(accepted), len(SIZES), len(SCALES), 2, 3), dtype=np.float64)
    for i, lm in enumerate(lms):
        for j, ft in enumerate(accepted):
            for k, size in enumerate(SIZES):
                for m, scale in enumerate(SCALES):
                    mats[i, j, k, m] = LP.get_transform_mat(lm, size, ft, scale=scale)
    out = {
        "tm_face_types": np.array([ft.name for ft in accepted]),
        "tm_face_type_values": np.array([int(ft) for ft in accepted], dtype=np.int32),
        "tm_face_type_dfl_names": np.array([FaceType.toString(ft) for ft in accepted]),
        "tm_rejected_face_types": np.array([ft.name for ft in rejected]),
        "tm_rejected_reasons": np.array(reasons),
        "tm_sizes": np.array(SIZES, dtype=np.int32),
        "tm_scales": np.array(SCALES, dtype=np.float64),
        "tm_mats": mats,
    }

    # c. Forward: the image landmarks into the WHOLE_FACE 512 face; inverse: those back (a round trip), and the
    # face square's corners and centre into the image (what draw_rect_landmarks and the merger's warps do).
    whole = mats[:, accepted.index(FaceType.WHOLE_FACE), SIZES.index(512), SCALES.index(1.0)]
    corners = np.float32([(0, 0), (512, 0), (512, 512), (0, 512), (256, 256)])
    fwd = np.stack([LP.transform_points(lm, mat) for lm, mat in zip(lms, whole)])
    out["tp_mats"] = whole
    out["tp_forward"] = fwd
    out["tp_inverse"] = np.stack([LP.transform_points(p, mat, True) for p, mat in zip(fwd, whole)])
    out["tp_corners"] = corners
    out["tp_corners_inverse"] = np.stack([LP.transform_points(corners, mat, True) for mat in whole])

    # g. umeyama as get_transform_mat calls it: points 17-48 and 54 onto landmarks_2D_new, with scale; and once
    # without scale (a rotation and translation only).
    src = np.stack([np.concatenate([lm[17:49], lm[54:55]]) for lm in lms])
    out["umeyama_src"] = src
    out["umeyama_dst"] = np.asarray(LP.landmarks_2D_new)
    out["umeyama_T"] = np.stack([dfl.umeyama(s, LP.landmarks_2D_new, True) for s in src])
    out["umeyama_T_noscale"] = np.stack([dfl.umeyama(s, LP.landmarks_2D_new, False) for s in src])
    return out


# ---------------------------------------------------------------------------------------------------------------
# d. masks


def golden_masks(dfl: SimpleNamespace, lms: np.ndarray, which: tuple[int, ...] = (0, 6)) -> dict[str, np.ndarray]:
    """The hull, eye and mouth masks of two faces (one near frontal, one turned) in a WHOLE_FACE 256 face."""
    LP, FaceType = dfl.LP, dfl.FaceType
    shape = (256, 256, 3)
    aligned, hull, eye, mouth = [], [], [], []
    for i in which:
        mat = LP.get_transform_mat(lms[i], 256, FaceType.WHOLE_FACE)
        lm = LP.transform_points(lms[i], mat)
        aligned.append(lm)
        h = LP.get_image_hull_mask(shape, lm)[..., 0]
        assert set(np.unique(h)) <= {0.0, 1.0}  # filled convex polygons: binary, so uint8 keeps it exactly
        hull.append((h * 255).astype(np.uint8))
        eye.append(LP.get_image_eye_mask(shape, lm)[..., 0].astype(np.float16))
        mouth.append(LP.get_image_mouth_mask(shape, lm)[..., 0].astype(np.float16))
    return {
        "mask_set_index": np.array(which, dtype=np.int32),
        "mask_landmarks": np.stack(aligned),
        "mask_hull": np.stack(hull),
        "mask_eye": np.stack(eye),
        "mask_mouth": np.stack(mouth),
    }


# ---------------------------------------------------------------------------------------------------------------
# e. colour transfer


def golden_color(dfl: SimpleNamespace, astro: np.ndarray) -> dict[str, np.ndarray]:
    """Every colour transfer mode exactly as MergeMasked.py calls it before blending (non-seamless modes)."""
    il = dfl.imagelib
    rng = np.random.default_rng(96)
    # dst: the astronaut's face; prd: the same face mirrored, darker, tinted and mottled: another "face" whose
    # colour statistics differ clearly from dst's. Both quantised to u8, so the inputs are exactly u8 / 255.
    dst_u8 = cv2.resize(astro[45:175, 165:295], (CT_SIZE, CT_SIZE), interpolation=cv2.INTER_AREA)
    field = cv2.resize(
        rng.standard_normal((12, 12, 3)).astype(np.float32), (CT_SIZE, CT_SIZE), interpolation=cv2.INTER_CUBIC
    )
    prd = (dst_u8[:, ::-1].astype(np.float32) / 255) ** 1.3 * np.float32([1.15, 0.95, 0.75]) + 0.04 * field
    prd_u8 = np.round(np.clip(prd, 0, 1) * 255).astype(np.uint8)
    mask_u8 = soft_ellipse(CT_SIZE, (48, 52), (30, 38), 15)  # zero outside: the corners are masked out

    prd = prd_u8.astype(np.float32) / 255
    dst = dst_u8.astype(np.float32) / 255
    mask = (mask_u8.astype(np.float32) / 255)[..., None]  # the merger's wrk_face_mask_a: (H, W, 1)
    area = mask.copy()
    area[area > 0] = 1.0  # wrk_face_mask_area_a: every pixel the soft mask touches, as 1

    def rct():
        return il.reinhard_color_transfer(prd, dst, target_mask=area, source_mask=area)

    def sot_m():
        return np.clip(il.color_transfer_sot(prd * area, dst * area, steps=10, batch_size=30), 0.0, 1.0)

    def hist(masked: bool, threshold: int):
        # MergeMasked's hist-match mode: outside the (area) mask both faces are white, then per channel matching.
        hist_mask = np.ones(prd.shape[:2] + (1,), dtype=np.float32)
        if masked:
            hist_mask *= area
        white = (1.0 - hist_mask) * np.ones(prd.shape[:2] + (1,), dtype=np.float32)
        h1 = prd * hist_mask + white
        h1[h1 > 1.0] = 1.0
        h2 = dst * hist_mask + white
        h2[h1 > 1.0] = 1.0  # sic: DFL tests h1 here, a no-op since h1 was just clipped
        return il.color_hist_match(h1, h2, threshold).astype(np.float32)

    modes = {  # name: (call, random?)
        "rct": (rct, False),
        "lct": (lambda: il.linear_color_transfer(prd, dst), False),
        "mkl": (lambda: il.color_transfer_mkl(prd, dst), False),
        "mkl-m": (lambda: il.color_transfer_mkl(prd * area, dst * area), False),
        "idt": (lambda: il.color_transfer_idt(prd, dst), True),
        "idt-m": (lambda: il.color_transfer_idt(prd * area, dst * area), True),
        "sot-m": (sot_m, True),
        "mix-m": (lambda: il.color_transfer_mix(prd * area, dst * area), True),
        "hist-match-masked-238": (lambda: hist(True, 238), False),
        "hist-match-unmasked-255": (lambda: hist(False, 255), False),
    }
    a = area[..., 0] > 0

    def stats(img):
        return np.array([img.reshape(-1, 3).mean(0), img.reshape(-1, 3).std(0), img[a].mean(0), img[a].std(0)])

    outs, st, random_st, dtypes = [], [], [], []
    for call, random in modes.values():
        np.random.seed(0)  # idt's special_ortho_group.rvs and sot's np.random.normal draw from NumPy's global RNG
        o = call()
        dtypes.append(str(o.dtype))
        outs.append(o.astype(np.float16))
        st.append(stats(o.astype(np.float64)))
        if random:
            per_seed = []
            for seed in range(CT_SEEDS):
                np.random.seed(seed)
                per_seed.append(stats(call().astype(np.float64)))
            random_st.append(per_seed)
    return {
        "ct_prd_u8": prd_u8,
        "ct_dst_u8": dst_u8,
        "ct_mask_u8": mask_u8,
        "ct_modes": np.array(list(modes)),
        "ct_random": np.array([r for _, r in modes.values()]),
        "ct_out_dtype": np.array(dtypes),
        "ct_out": np.stack(outs),
        "ct_stats": np.stack(st),
        "ct_input_stats": np.stack([stats(prd.astype(np.float64)), stats(dst.astype(np.float64))]),
        "ct_random_modes": np.array([n for n, (_, r) in modes.items() if r]),
        "ct_random_stats": np.array(random_st),
    }


# ---------------------------------------------------------------------------------------------------------------
# DFLJPG


def check_dfljpg(dfl: SimpleNamespace, folder: Path) -> int:
    """Load every .jpg in `folder` with DFL's DFLJPG.load and print its fields; the number that failed."""
    files = sorted(folder.glob("*.jpg"))
    if not files:
        print(f"no .jpg in {folder}")
        return 1
    failed = 0
    for f in files:
        img = dfl.DFLJPG.load(str(f))
        if img is None or not img.has_data():
            # load returns an object with an empty dict for a JPEG without DFL's APP15 segment.
            print(f"{f.name}: {'not loaded' if img is None else 'loaded, but no DFL metadata'}")
            failed += 1
            continue

        def shape(value):
            return None if value is None else np.array(value).shape

        d = img.get_dict()
        print(
            f"{f.name}: loaded, image {img.get_shape()}, face_type {img.get_face_type()!r}, "
            f"landmarks {shape(d.get('landmarks'))}, source_filename {img.get_source_filename()!r}, "
            f"source_rect {None if img.get_source_rect() is None else list(np.array(img.get_source_rect()))}, "
            f"source_landmarks {shape(d.get('source_landmarks'))}, "
            f"image_to_face_mat {shape(img.get_image_to_face_mat())}, keys {sorted(d)}"
        )
        # The stored matrix and aligned landmarks against DFL's own from the stored source landmarks: the merger
        # recomputes the matrix, the trainer uses the landmarks, so both must be what DFL would have written.
        mat = img.get_image_to_face_mat()
        if mat is not None and d.get("source_landmarks") is not None and d.get("landmarks") is not None:
            src = img.get_source_landmarks()  # np.array of what is stored, as DFL's merger takes it
            ft = dfl.FaceType.fromString(img.get_face_type())
            own = dfl.LP.get_transform_mat(src, img.get_shape()[0], ft)
            lm_diff = np.abs(dfl.LP.transform_points(src, own) - img.get_landmarks()).max()
            print(
                f"  vs DFL's get_transform_mat(source_landmarks, {img.get_shape()[0]}, {ft.name}): matrix max |diff| "
                f"{np.abs(own - mat).max():.3g}, landmarks max |diff| {lm_diff:.3g} px"
            )
    print(f"{len(files) - failed} of {len(files)} loaded with DFL metadata")
    return failed


def selftest_dfljpg(dfl: SimpleNamespace, folder: Path) -> int:
    """Write one aligned face the way Extractor.final_stage does (cv2 JPEG at quality 90, then DFLJPG's setters
    and save), and read the folder back with check_dfljpg."""
    lms, _ = make_landmarks(dfl)
    image = cv2.resize(astronaut_bgr(), (FRAME_W, FRAME_H))  # stands in for a video frame
    lm = lms[0]
    size, ft = 512, dfl.FaceType.WHOLE_FACE
    mat = dfl.LP.get_transform_mat(lm, size, ft)
    face = cv2.warpAffine(image, mat, (size, size), cv2.INTER_LANCZOS4)  # sic, as DFL: the 4th argument is dst
    path = folder / "00001_0.jpg"
    cv2.imwrite(str(path), face, [int(cv2.IMWRITE_JPEG_QUALITY), 90])
    img = dfl.DFLJPG.load(str(path))
    img.set_face_type(dfl.FaceType.toString(ft))
    img.set_landmarks(dfl.LP.transform_points(lm, mat).tolist())
    img.set_source_filename("00001.png")
    img.set_source_rect(np.array([int(lm[:, 0].min()), int(lm[:, 1].min()), int(lm[:, 0].max()), int(lm[:, 1].max())]))
    img.set_source_landmarks(lm.tolist())
    img.set_image_to_face_mat(mat)
    img.save()
    back = dfl.DFLJPG.load(str(path))
    assert np.allclose(back.get_landmarks(), dfl.LP.transform_points(lm, mat))
    assert np.array_equal(back.get_image_to_face_mat(), mat)
    return check_dfljpg(dfl, folder)


# ---------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--dfl", type=Path, required=True, help="a DeepFaceLab checkout (its .py files)")
    parser.add_argument("--out", type=Path, default=Path("tests/data/dfl_faces_golden.npz"))
    parser.add_argument("--check-dfljpg", type=Path, metavar="DIR", help="only read DIR's .jpg with DFL's DFLJPG")
    parser.add_argument(
        "--selftest-dfljpg",
        action="store_true",
        help="only write one aligned face with DFL's DFLJPG to a temporary folder and read it back",
    )
    args = parser.parse_args(argv)
    dfl = import_dfl(args.dfl)
    if args.check_dfljpg is not None:
        return 1 if check_dfljpg(dfl, args.check_dfljpg) else 0
    if args.selftest_dfljpg:
        with tempfile.TemporaryDirectory() as tmp:
            return 1 if selftest_dfljpg(dfl, Path(tmp)) else 0

    lms, params = make_landmarks(dfl)
    astro = astronaut_bgr()
    golden = {
        "landmarks": lms,
        "landmarks_params": params,
        "landmarks_params_columns": np.array(["width_px", "roll_deg", "yaw_deg", "pitch_deg", "centre_x", "centre_y"]),
        "frame_size": np.array([FRAME_W, FRAME_H], dtype=np.int32),
        **golden_transforms(dfl, lms),
        **golden_masks(dfl, lms),
        **golden_color(dfl, astro),
        **golden_merge(dfl, astro),
        **golden_merge_finish(dfl, astro),
        "dfl_commit": np.array(dfl_commit(args.dfl)),
        "versions": np.array(
            [f"numpy {np.__version__}", f"opencv {cv2.__version__}", f"python {sys.version.split()[0]}"]
        ),
    }
    write_golden(args.out, golden)
    return 0


if __name__ == "__main__":
    sys.exit(main())
