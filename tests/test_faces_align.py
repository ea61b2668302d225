"""bigbatch's DFL alignment against DeepFaceLab's own outputs (tests/data/dfl_faces_golden.npz, made by
bench/dfl_golden_faces.py running DFL's LandmarksProcessor on 8 landmark sets, turned up to 42 degrees)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bigbatch.data import align
from bigbatch.data.dfl_faces import hull_mask
from bigbatch.errors import BigbatchError

GOLDEN = np.load(Path(__file__).parent / "data" / "dfl_faces_golden.npz", allow_pickle=False)


def test_umeyama_is_dfls():
    for src, with_scale in zip(GOLDEN["umeyama_src"], GOLDEN["umeyama_T"]):
        np.testing.assert_allclose(align.umeyama(src, GOLDEN["umeyama_dst"]), with_scale, atol=1e-6)


@pytest.mark.parametrize("k", range(7))
def test_every_face_type_crops_the_square_dfl_crops(k):
    """Points mapped through our matrix and DFL's agree within 1e-3 of an output pixel (3e-3 for the *_NO_ALIGN
    types, whose side comes from a float32 shoelace area that BLAS sums in another order, an ulp apart): DFL
    builds the square's corners in float32, so raw translations of hundreds of pixels differ in their last
    float32 digits; what lands where in the face does not."""
    kind = align.face_type(str(GOLDEN["tm_face_type_dfl_names"][k]))
    assert kind.value == GOLDEN["tm_face_type_values"][k]
    tolerance = 1e-3 if kind.aligned else 3e-3
    for i, landmarks in enumerate(GOLDEN["landmarks"]):
        for s, size in enumerate(GOLDEN["tm_sizes"]):
            for c, scale in enumerate(GOLDEN["tm_scales"]):
                want = GOLDEN["tm_mats"][i, k, s, c]
                got = align.transform_mat(landmarks, int(size), kind, float(scale))
                probe = np.concatenate([landmarks, align.square_in_frame(want, int(size))])
                np.testing.assert_allclose(
                    align.transform_points(probe, got), align.transform_points(probe, want), atol=tolerance
                )
                np.testing.assert_allclose(got[:, :2], want[:, :2], rtol=1e-4, atol=1e-9)


def test_transform_points_is_dfls():
    for i, mat in enumerate(GOLDEN["tp_mats"]):
        forward = align.transform_points(GOLDEN["landmarks"][i], mat)
        np.testing.assert_allclose(forward, GOLDEN["tp_forward"][i], atol=1e-6)
        np.testing.assert_allclose(
            align.transform_points(GOLDEN["tp_forward"][i], mat, invert=True), GOLDEN["tp_inverse"][i], atol=1e-6
        )
        np.testing.assert_allclose(
            align.transform_points(GOLDEN["tp_corners"], mat, invert=True), GOLDEN["tp_corners_inverse"][i], atol=2e-3
        )


def test_the_hull_mask_is_dfls_pixel_for_pixel():
    for points, want in zip(GOLDEN["mask_landmarks"], GOLDEN["mask_hull"]):
        got = np.round(hull_mask((256, 256), points) * 255).astype(np.uint8)
        assert (got != want).sum() == 0


def test_face_type_names():
    assert align.face_type("wf") is align.FaceType.WHOLE_FACE
    assert align.face_type("whole_face") is align.FaceType.WHOLE_FACE
    assert align.face_type("HEAD") is align.FaceType.HEAD
    assert [align.face_type(n).dfl_name for n in align.SHORT_NAMES] == [
        "half_face", "midfull_face", "full_face", "whole_face", "head"
    ]  # fmt: skip
    with pytest.raises(BigbatchError, match="unknown face type 'mark_only'"):
        align.face_type("mark_only")  # DFL's MARK_ONLY has no crop (its get_transform_mat raises on it)
