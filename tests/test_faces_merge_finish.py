"""DFL's merger's finishing filters (motion blur, blursharpen, the frame's denoise and bicubic degrade, colour degrade)
against DFL's own MergeMasked (tests/data/dfl_faces_golden.npz, merge_finish_*), and the face motion between frames
that motion blur reads, as DFL's Merger.py measures it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_faces_merge import DFL_MASKS, GOLDEN, _golden_predictor

from bigbatch.data import align
from bigbatch.faces import merge, merge_filters

CASES = range(len(GOLDEN["merge_finish_settings"]))


def _finish_settings(row: np.ndarray) -> tuple[merge.MergeSettings, tuple[float, float]]:
    mode, mask, erode, blur, ct, power, deg, motion, sharpen, amount, denoise, bicubic, degrade = row.tolist()
    ct_name = str(GOLDEN["merge_ctm_names"][int(ct)])
    settings = merge.MergeSettings(
        mode=str(GOLDEN["merge_mode_names"][int(mode)]),
        mask=DFL_MASKS[int(mask)],
        erode=int(erode),
        blur=int(blur),
        color="none" if ct_name == "None" else ct_name,
        motion_blur=int(motion),
        sharpen=merge_filters.SHARPEN[int(sharpen)],
        blursharpen=int(amount),
        denoise=int(denoise),
        bicubic_degrade=int(bicubic),
        color_degrade=int(degrade),
    )
    return settings, (power, deg)


@pytest.mark.parametrize("name", list(GOLDEN["merge_filter_names"]))
def test_each_filter_is_dfls_on_the_same_image(name):
    """Each filter on the same float32 face part gives DFL's (core/imagelib's) values, to float32's rounding; the
    palette of 256 colours, Pillow's, the same colours."""
    part = GOLDEN["merge_filter_input"][..., ::-1]  # (DFL's BGR, as RGB here)
    kind, *args = name.split()
    if kind == "motion":
        out = merge_filters.linear_motion_blur(part, int(args[0]), float(args[1]))
    elif kind == "reduce_colors":
        out = merge_filters.color_degraded(part, 100)
    else:
        out = merge_filters.blursharpen(part, kind if kind != "median" else "box", int(args[0]))
    want = GOLDEN["merge_filter_out"][list(GOLDEN["merge_filter_names"]).index(name)][..., ::-1]
    # (the motion kernel, a line turned by warpAffine: OpenCV 4, DFL's, weighs its bilinear taps in 32nds, OpenCV 5
    # exactly; up to 0.013 of a tap, 0.0032 of a value here: under one level of 8 bits)
    np.testing.assert_allclose(out, want, atol={"motion": 1 / 255, "reduce_colors": 0}.get(kind, 2e-6))


# The merged frame amplifies the warps' float32 rounding (test_faces_merge's few levels) where a filter sharpens, or
# picks another of the palette's colours for a value at a boundary: these, within a few levels on average.
AMPLIFIED = {2, 3, 6, 7}  # box and Gaussian sharpening, colour degrade


@pytest.mark.parametrize("case", CASES)
def test_the_finishing_filters_are_dfls_within_a_few_levels(case):
    """Each filter gives DFL's merged frame, the whole frame where it changes the whole frame (denoise, bicubic and
    colour degrade): the same pixels but a few, off by a few levels (the float32 warps' rounding, as in
    test_faces_merge), but where a filter amplifies those (AMPLIFIED)."""
    frame = np.ascontiguousarray(GOLDEN["merge_frame"][..., ::-1])
    want = (GOLDEN["merge_frame"].astype(np.int16) + GOLDEN["merge_finish_out_delta"][case]).astype(np.uint8)
    settings, motion = _finish_settings(GOLDEN["merge_finish_settings"][case])
    res = int(GOLDEN["merge_resolution"])
    out, mask = merge.merge_frame(frame, [GOLDEN["merge_landmarks"]], _golden_predictor("tint"), res,
                                  align.FaceType.WHOLE_FACE, settings, motion=motion)  # fmt: skip
    diff = np.abs(out.astype(int) - want[..., ::-1])
    mean, most = (0.5, 0.05) if case in AMPLIFIED else (0.1, 2e-3)
    assert diff.mean() < mean and (diff > 2).mean() < most, (settings, diff.max(), diff.mean(), (diff > 2).mean())
    assert np.abs(mask.astype(int) - GOLDEN["merge_finish_mask"][case]).max() <= 6
    unchanged = merge.merge_frame(frame, [GOLDEN["merge_landmarks"]], _golden_predictor("tint"), res,
                                  align.FaceType.WHOLE_FACE, merge.MergeSettings(mode=settings.mode, mask="hull",
                                  blur=50, color=settings.color))[0]  # fmt: skip
    assert np.abs(out.astype(int) - unchanged).max() > 2  # (each case's filter changes the frame)


def test_a_faces_motion_is_its_squares_centre_moving_from_the_frame_before_to_the_one_after():
    lm = GOLDEN["merge_landmarks"]
    faces = {"1": [lm], "2": [lm + (3.0, 0.0)], "3": [lm + (6.0, -6.0)], "5": [lm]}
    moved = merge_filters.motions(["1", "2", "3", "4", "5"], faces)
    # (the first frame its own frame before; frame 4 has no face, so frames 3 and 5, beside it, have no motion)
    assert set(moved) == {"1", "2"}
    power, deg = moved["2"]
    assert power == pytest.approx(math.hypot(6, 6), abs=1e-6) and deg == pytest.approx(45.0, abs=1e-6)
    assert moved["1"][0] == pytest.approx(3.0, abs=1e-6) and moved["1"][1] == pytest.approx(0.0, abs=1e-6)
    assert merge_filters.motions(["1", "2"], {"1": [lm, lm], "2": [lm]}) is None  # several faces: none, as DFL's


def test_finishing_settings_are_checked_and_read_by_the_modes_that_finish():
    with pytest.raises(merge.BigbatchError, match="--sharpen 'laplace' is not one of none, box, gaussian"):
        merge.MergeSettings(sharpen="laplace")
    for name, value in (("denoise", 501), ("blursharpen", -101), ("motion_blur", 101), ("color_degrade", -1)):
        with pytest.raises(merge.BigbatchError, match=f"--{name.replace('_', '-')} must be"):
            merge.MergeSettings(**{name: value})
    raw = merge.MergeSettings(mode="raw-rgb", denoise=100, sharpen="box", blursharpen=20)
    assert raw.unread() == ["--sharpen", "--blursharpen", "--denoise"] and raw.as_read() == merge.MergeSettings(
        mode="raw-rgb"
    )


def test_a_face_of_no_mask_leaves_its_frame_as_it_was_and_the_degraded_frame_is_clipped():
    # Found by review and from outside: a face whose mask kept nothing left an undegraded box in a denoised frame
    # (DFL's merger gives the frame as it was), and bicubic's overshoot wrapped around in 8 bits (DFL clips).
    frame = np.ascontiguousarray(GOLDEN["merge_frame"][..., ::-1])
    res, lm, kind = int(GOLDEN["merge_resolution"]), [GOLDEN["merge_landmarks"]], align.FaceType.WHOLE_FACE
    gone = merge.MergeSettings(mask="hull", erode=400, color="none", denoise=100, color_degrade=50)
    out, mask = merge.merge_frame(frame, lm, _golden_predictor("tint"), res, kind, gone)
    assert np.array_equal(out, frame) and not mask.any()
    bicubic = merge.MergeSettings(mask="hull", blur=50, color="none", bicubic_degrade=80)
    out = merge.merge_frame(frame, lm, _golden_predictor("tint"), res, kind, bicubic)[0]
    under = merge_filters.degraded(frame.astype(np.float32) / 255, 0, 80)
    assert under.min() < 0 or under.max() > 1  # (it overshoots)
    want = (np.clip(under, 0, 1) * 255).astype(np.uint8)
    assert np.array_equal(out[:, :8], want[:, :8])  # (a strip far from the face: the degraded frame, clipped)


def test_a_merge_recorded_before_the_filters_were_here_is_of_the_same_settings():
    # Found by review: the record held every setting, so a merge recorded before these six went again, all of it.
    before = {"mode", "mask", "erode", "blur", "color", "scale", "hist_threshold", "masked_hist", "super_resolution"}
    assert set(merge.MergeSettings().record()) == before
    assert merge.MergeSettings(denoise=5).record() == {**merge.MergeSettings().record(), "denoise": 5}


def test_sharpening_needs_its_mode_and_its_amount():
    assert merge.MergeSettings(sharpen="gaussian").unpaired() == "sharpen"
    assert merge.MergeSettings(blursharpen=40).unpaired() == "blursharpen"
    assert merge.MergeSettings(blursharpen=-40).unpaired() is None  # (a median blur needs no mode)
    assert merge.MergeSettings(sharpen="box", blursharpen=40).as_read().blursharpen == 40
    assert merge.MergeSettings(blursharpen=40).as_read() == merge.MergeSettings()
    assert merge.MergeSettings(mode="raw-rgb", color="none").unread() == []  # (off: nothing to say)
