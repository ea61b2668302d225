"""Golden data of DFL's merge (dfl_golden_faces.py's part f): merger/MergeMasked.py's MergeMasked on a crop of
scikit-image's astronaut with a stand-in model, for MergerConfigMasked's settings and its finishing filters, and
core/imagelib's filters alone. DFL's modules come from dfl_golden_faces.import_dfl (a checkout given at run time)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
from _dfl_golden import soft_ellipse

MERGE_RES = 128  # the stand-in model's resolution (predictor_input_shape)

# Hand-placed on the crop (x 80..400, y 0..240 of the 512 astronaut): eye centres, nose tip, mouth corners; the
# 68 points are DFL's frontal mean face (landmarks_68_3D x, y) moved onto them by a least-squares similarity.
ASTRO_CROP = (slice(0, 240), slice(80, 400))
ASTRO_KEYPOINTS = np.array([(122.5, 100.5), (166.5, 103.0), (146.0, 124.0), (124.5, 143.5), (163.5, 142.0)])

# Settings columns of merge_settings; the numbers are MergerConfig.py's (mode_dict, mask_mode_dict, ctm_dict).
MERGE_COLUMNS = (
    "mode",
    "mask_mode",
    "erode_mask_modifier",
    "blur_mask_modifier",
    "color_transfer_mode",
    "output_face_scale",
    "masked_hist_match",
    "hist_match_threshold",
    "predictor",
)
PREDICTORS = ("identity", "tint")
# mode, mask mode, erode, blur, colour transfer, output_face_scale, masked_hist_match, threshold, predictor
MERGE_CASES = (
    ("overlay", 0, 0, 0, "None", 0, 1, 238, "identity"),  # full square, nothing changed but the square's edge
    ("overlay", 1, 0, 0, "None", 0, 1, 238, "identity"),
    ("overlay", 1, 20, 50, "None", 0, 1, 238, "tint"),
    ("overlay", 1, -20, 50, "rct", 0, 1, 238, "tint"),
    ("overlay", 3, 0, 50, "rct", 10, 1, 238, "tint"),
    ("overlay", 4, 20, 0, "None", 0, 1, 238, "tint"),
    ("overlay", 2, 0, 50, "None", 0, 1, 238, "tint"),
    ("overlay", 5, -20, 50, "None", 10, 1, 238, "tint"),
    ("hist-match", 1, 0, 50, "None", 0, 1, 238, "tint"),
    ("hist-match", 4, 20, 50, "rct", 0, 0, 255, "tint"),
    ("seamless", 0, 0, 0, "None", 0, 1, 238, "identity"),
    ("seamless", 1, 0, 50, "None", 0, 1, 238, "tint"),
    ("seamless", 1, 20, 50, "rct", 0, 1, 238, "tint"),  # seamless + colour transfer: the second warp-in pass
    ("seamless-hist-match", 1, 0, 50, "None", 10, 1, 238, "tint"),
    ("raw-rgb", 1, 0, 0, "None", 0, 1, 238, "tint"),
    ("raw-rgb", 0, 0, 0, "None", 10, 1, 238, "tint"),
)
RAW_PREDICT_CASE = ("raw-predict", 3, 0, 0, "None", 0, 1, 238, "tint")  # its output is the model's face
TINT_MUL = np.float32([1.08, 0.97, 0.88])
TINT_ADD = np.float32([0.0, 0.01, 0.03])


def astronaut_landmarks(dfl: SimpleNamespace) -> np.ndarray:
    """68 points on the astronaut crop's face, float64 (what the merger gets from DFLJPG.get_source_landmarks)."""
    mean = dfl.LP.landmarks_68_3D[:, :2].astype(np.float64)
    model = np.array([mean[36:42].mean(0), mean[42:48].mean(0), mean[30], mean[48], mean[54]])
    T = dfl.umeyama(model, ASTRO_KEYPOINTS, True)
    return mean @ T[:2, :2].T + T[:2, 2]


def stand_in_masks() -> tuple[np.ndarray, np.ndarray]:
    """The stand-in model's two masks in its 128 face (WHOLE_FACE), u8: prd (the src decoder's mask) a little lower
    and narrower than dst's, so that their product and sum differ from each."""
    return soft_ellipse(MERGE_RES, (64, 70), (40, 50), 9), soft_ellipse(MERGE_RES, (64, 64), (46, 46), 9)


def predictor(kind: str):  # noqa: ANN201 - DFL's predictor_func
    """The stand-in model: SAEHD's predictor_func's (bgr, mask_src_dstm[..., 0], mask_dst_dstm[..., 0]), HxWx3 and two
    HxW; its face the input as it is ("identity") or tinted ("tint")."""
    prd_mask, dst_mask = (m.astype(np.float32) / 255 for m in stand_in_masks())

    def face(x: np.ndarray) -> np.ndarray:
        return np.clip(x * TINT_MUL + TINT_ADD, 0, 1).astype(np.float32) if kind == "tint" else x.copy()

    return lambda x: (face(x), prd_mask.copy(), dst_mask.copy())


def golden_merge(dfl: SimpleNamespace, astro: np.ndarray) -> dict[str, np.ndarray]:
    """MergeMasked (DFL's per-frame merge) with a stand-in model, one frame, several MergerConfigMasked settings."""
    MC = dfl.MergerConfig
    frame = np.ascontiguousarray(astro[ASTRO_CROP])
    lm = astronaut_landmarks(dfl)
    prd_mask_u8, dst_mask_u8 = stand_in_masks()

    ctm = {v: k for k, v in MC.ctm_dict.items()}
    settings, names, outs, masks = [], [], [], []
    raw = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "00001.png"  # MergeMasked reads the frame itself (cv2_imread, normalize_channels)
        cv2.imwrite(str(path), frame)
        for case in (*MERGE_CASES, RAW_PREDICT_CASE):
            mode, mask_mode, erode, blur, ct, scale, masked_hist, threshold, pred = case
            cfg = MC.MergerConfigMasked(
                face_type=dfl.FaceType.WHOLE_FACE,
                mode=mode,
                masked_hist_match=bool(masked_hist),
                hist_match_threshold=threshold,
                mask_mode=mask_mode,
                erode_mask_modifier=erode,
                blur_mask_modifier=blur,
                output_face_scale=scale,
                color_transfer_mode=ctm[ct],
            )
            assert cfg.mode == mode  # the constructor silently falls back to overlay on an unknown mode
            info = dfl.FrameInfo(filepath=path, landmarks_list=[lm])
            bgra = dfl.MergeMasked.MergeMasked(predictor(pred), (MERGE_RES, MERGE_RES, 3), None, None, cfg, info)
            row = [
                MC.mode_str_dict[mode],
                mask_mode,
                erode,
                blur,
                ctm[ct],
                scale,
                masked_hist,
                threshold,
                PREDICTORS.index(pred),
            ]
            name = f"{mode}/{MC.mask_mode_dict[mask_mode]}/erode{erode}/blur{blur}/ct-{ct}/scale{scale}/{pred}"
            if case is RAW_PREDICT_CASE:
                raw = {
                    "merge_rawpredict_settings": np.array(row, dtype=np.int32),
                    "merge_rawpredict_name": np.array(name),
                    "merge_rawpredict_out": bgra[..., :3],
                    "merge_rawpredict_mask": bgra[..., 3],
                }
                continue
            settings.append(row)
            names.append(name)
            # Stored as the change from the frame: outside the face nothing changes, and the zeros compress
            # (the full images would take 3 MB); merge_frame + merge_out_delta is DFL's output.
            outs.append(bgra[..., :3].astype(np.int16) - frame)
            masks.append(bgra[..., 3])
    return {
        "merge_frame": frame,
        "merge_landmarks": lm,
        "merge_face_type": np.array("WHOLE_FACE"),
        "merge_resolution": np.array(MERGE_RES, dtype=np.int32),
        "merge_prd_mask_u8": prd_mask_u8,
        "merge_dst_mask_u8": dst_mask_u8,
        "merge_tint_mul": TINT_MUL,
        "merge_tint_add": TINT_ADD,
        "merge_predictors": np.array(PREDICTORS),
        "merge_settings_columns": np.array(MERGE_COLUMNS),
        "merge_settings": np.array(settings, dtype=np.int32),
        "merge_names": np.array(names),
        "merge_out_delta": np.stack(outs),
        "merge_mask": np.stack(masks),
        "merge_mode_names": np.array([MC.mode_dict[k] for k in sorted(MC.mode_dict)]),
        "merge_mask_mode_names": np.array([MC.mask_mode_dict[k] for k in sorted(MC.mask_mode_dict)]),
        "merge_ctm_names": np.array([MC.ctm_dict[k] for k in sorted(MC.ctm_dict)]),
        **raw,
    }


# The finishing filters: motion blur (FrameInfo's motion_power and motion_deg, as mainscripts/Merger.py sets them),
# blursharpen, the frame's denoise and bicubic degrade, and the colour degrade of the whole frame.
FINISH_COLUMNS = (
    "mode",
    "mask_mode",
    "erode_mask_modifier",
    "blur_mask_modifier",
    "color_transfer_mode",
    "motion_power",
    "motion_deg",
    "motion_blur_power",
    "sharpen_mode",
    "blursharpen_amount",
    "image_denoise_power",
    "bicubic_degrade_power",
    "color_degrade_power",
)
FINISH_CASES = (  # each with the tint predictor, output_face_scale 0, masked_hist_match 1, threshold 238
    ("overlay", 1, 0, 50, "None", 12.5, 30.0, 50, 0, 0, 0, 0, 0),
    ("overlay", 1, 0, 50, "None", 0.5, -60.0, 100, 0, 0, 0, 0, 0),  # (k 0: the face only warped in and out)
    ("seamless", 1, 0, 50, "rct", 0.0, 0.0, 0, 1, 40, 0, 0, 0),
    ("overlay", 1, 0, 50, "None", 0.0, 0.0, 0, 2, 30, 0, 0, 0),
    ("overlay", 1, 0, 50, "None", 0.0, 0.0, 0, 1, -25, 0, 0, 0),
    ("hist-match", 1, 0, 50, "None", 0.0, 0.0, 0, 0, 0, 150, 40, 0),
    ("overlay", 1, 0, 50, "rct", 0.0, 0.0, 0, 0, 0, 0, 0, 60),
    ("seamless-hist-match", 1, 20, 50, "None", 30.0, 135.0, 100, 0, 0, 25, 0, 100),
)


def golden_merge_finish(dfl: SimpleNamespace, astro: np.ndarray) -> dict[str, np.ndarray]:
    """MergeMasked with the finishing filters on (the same frame, landmarks and tint predictor as golden_merge)."""
    MC = dfl.MergerConfig
    frame = np.ascontiguousarray(astro[ASTRO_CROP])
    lm = astronaut_landmarks(dfl)
    ctm = {v: k for k, v in MC.ctm_dict.items()}
    settings, outs, masks = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "00001.png"
        cv2.imwrite(str(path), frame)
        for case in FINISH_CASES:
            mode, mask_mode, erode, blur, ct, power, deg, motion, sharpen, amount, denoise, bicubic, degrade = case
            cfg = MC.MergerConfigMasked(
                face_type=dfl.FaceType.WHOLE_FACE,
                mode=mode,
                mask_mode=mask_mode,
                erode_mask_modifier=erode,
                blur_mask_modifier=blur,
                color_transfer_mode=ctm[ct],
                motion_blur_power=motion,
                sharpen_mode=sharpen,
                blursharpen_amount=amount,
                image_denoise_power=denoise,
                bicubic_degrade_power=bicubic,
                color_degrade_power=degrade,
            )
            assert cfg.mode == mode
            info = dfl.FrameInfo(filepath=path, landmarks_list=[lm])
            info.motion_power, info.motion_deg = power, deg
            bgra = dfl.MergeMasked.MergeMasked(predictor("tint"), (MERGE_RES, MERGE_RES, 3), None, None, cfg, info)
            settings.append([MC.mode_str_dict[mode], mask_mode, erode, blur, ctm[ct], *case[5:]])
            outs.append(bgra[..., :3].astype(np.int16) - frame)  # (as merge_out_delta: the change compresses)
            masks.append(bgra[..., 3])
    # The filters alone (core/imagelib's), on the frame's face part as float32 BGR: blursharpen (box, gaussian,
    # median blur), LinearMotionBlur and reduce_colors.
    il = dfl.imagelib
    part = np.ascontiguousarray(frame[88:136, 120:168]).astype(np.float32) / 255  # (48 px: eyes, nose, mouth)
    filters = {
        "box 40": il.blursharpen(part, 1, 3, 40),
        "gaussian 30": il.blursharpen(part, 2, 3, 30),
        "median -25": il.blursharpen(part, 1, 3, -25),
        "motion 7 30": il.LinearMotionBlur(part, 7, 30.0),
        "motion 12 -135": il.LinearMotionBlur(part, 12, -135.0),
        "reduce_colors 256": il.reduce_colors(part, 256),
    }
    return {
        "merge_filter_input": part,
        "merge_filter_names": np.array(list(filters)),
        "merge_filter_out": np.stack(list(filters.values())).astype(np.float32),
        "merge_finish_columns": np.array(FINISH_COLUMNS),
        "merge_finish_settings": np.array(settings, dtype=np.float64),
        "merge_finish_out_delta": np.stack(outs),
        "merge_finish_mask": np.stack(masks),
    }
