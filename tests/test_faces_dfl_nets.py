"""DFL's own detector and landmarker (S3FD, 2DFAN) from a DFL install's weight files: `bigbatch extract --weights
DFL/facelib`. Checked against DFL's own code run on seeded weights written in DFL's layout
(tests/data/dfl_detect_golden.npz, made by bench/dfl_golden_detect.py); the files are read restricted."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from bigbatch.cli import main
from bigbatch.faces import dfl_nets

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # (the golden data's recipe)


def test_weights_in_dfls_layout_load_as_written(tmp_path):
    """A state written as DFL's save_weights writes it (HWIO kernels, `:0` names, list items as `m_0`) loads back
    to the same tensors."""
    net = dfl_nets.FAN()
    state = net.state_dict()
    written = {}
    for name, t in state.items():
        if name.endswith("num_batches_tracked"):
            continue
        value = t.numpy()
        written[dfl_nets.dfl_key(name)] = value.transpose(2, 3, 1, 0) if value.ndim == 4 else value
    assert "m_3/b2_plus/b2_plus/b2_plus/b3/conv3/weight:0" in written  # (the depth-4 hourglass, nested)
    (tmp_path / "2DFAN.npy").write_bytes(pickle.dumps(written, 4))
    loaded = dfl_nets.load_dfl_weights(dfl_nets.FAN(), tmp_path / "2DFAN.npy")
    for name, t in loaded.state_dict().items():
        assert np.array_equal(t.numpy(), state[name].numpy()), name


def test_bad_weight_folders_are_one_line(tmp_path, capfd):
    cv2.imwrite(str(tmp_path / "a.png"), np.zeros((200, 200, 3), np.uint8))
    (tmp_path / "facelib").mkdir()
    assert main(["extract", str(tmp_path / "a.png"), str(tmp_path / "o"), "--weights", str(tmp_path / "facelib")]) == 2
    assert "lacks S3FD.npy and 2DFAN.npy: give a DeepFaceLab install's facelib folder" in capfd.readouterr().err

    class Payload:
        def __reduce__(self):
            return (print, ("ran",))

    (tmp_path / "facelib" / "S3FD.npy").write_bytes(pickle.dumps({"x": Payload()}))
    (tmp_path / "facelib" / "2DFAN.npy").write_bytes(pickle.dumps({}))
    args = ["extract", str(tmp_path / "a.png"), str(tmp_path / "o"), "--weights", str(tmp_path / "facelib")]
    assert main([*args, "--workers", "1"]) == 2
    out, err = capfd.readouterr()
    assert "ran" not in out and "asks to load builtins.print" in err and len(err.strip().splitlines()) == 1
    assert main([*args, "--workers", "2"]) == 2  # the same line alone (found from outside: a worker's traceback
    err = capfd.readouterr().err.strip()  # on its own stderr before it, and OUT made)
    assert "asks to load builtins.print" in err and len(err.splitlines()) == 1 and not (tmp_path / "o").exists(), err
    (tmp_path / "facelib" / "S3FD.npy").write_bytes(pickle.dumps({"conv1_1/weight:0": np.zeros(3)}))
    assert main([*args, "--workers", "1"]) == 2
    assert "S3FD.npy: conv1_1/weight:0 is (3,), DFL's S3FD has (64, 3, 3, 3)" in capfd.readouterr().err


GOLDEN_PATH = Path(__file__).parent / "data" / "dfl_detect_golden.npz"
GOLDEN = np.load(GOLDEN_PATH, allow_pickle=False)


def _made_weights(model: str) -> dict[str, np.ndarray]:
    """The golden data's weights, drawn again by the script's own recipe (bench/dfl_golden_detect.py's
    make_weights, NumPy alone) and checked byte for byte against what DFL loaded there (its per-key MD5s)."""
    import hashlib

    from dfl_golden_detect import make_weights

    keys, shapes, ranks = GOLDEN[f"{model}_keys"], GOLDEN[f"{model}_shapes"], GOLDEN[f"{model}_ranks"]
    names_shapes = [(str(k), tuple(int(v) for v in shape[:rank])) for k, shape, rank in zip(keys, shapes, ranks)]
    out = make_weights(names_shapes, int(GOLDEN[f"{model}_seed"]), model)
    for (key, _), want in zip(sorted(names_shapes), GOLDEN[f"{model}_md5"]):
        assert hashlib.md5(np.ascontiguousarray(out[key]).tobytes()).hexdigest() == want, key
    return out


@pytest.fixture(scope="module")
def facelib(tmp_path_factory) -> Path:
    """A DFL facelib/ folder with the golden data's weights, pickled as DFL's save_weights writes them."""
    folder = tmp_path_factory.mktemp("facelib")
    for model, name in (("s3fd", dfl_nets.S3FD_FILE), ("fan", dfl_nets.FAN_FILE)):
        (folder / name).write_bytes(pickle.dumps(_made_weights(model), 4))
    return folder


@pytest.fixture(scope="module")
def extractor(facelib):
    """bigbatch's extractor on DFL's nets, loaded once: its detect is S3FD, its landmarks 2DFAN."""
    from bigbatch.faces.extract import Extractor, Settings

    return Extractor(Settings(detector="dfl"), dfl_weights=facelib)


def _rgb(bgr: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(bgr[..., ::-1])


def test_s3fd_is_dfls_layer_for_layer_and_box_for_box(extractor):
    detector = extractor.detect
    assert isinstance(detector, dfl_nets.S3FDDetector) and isinstance(extractor.landmarks, dfl_nets.FANLandmarks)
    image = GOLDEN["s3fd_0_image"]
    small = cv2.resize(_rgb(image), (320, 240), interpolation=cv2.INTER_LINEAR)
    x = torch.from_numpy(small.astype(np.float32)).permute(2, 0, 1)[None]
    with torch.inference_mode():
        levels = detector.net(x)
    for i, (scores, offsets) in enumerate(levels, 1):
        want_cls, want_reg = GOLDEN[f"s3fd_0_cls{i}"], GOLDEN[f"s3fd_0_reg{i}"]
        np.testing.assert_allclose(scores[0].permute(1, 2, 0).numpy(), want_cls, atol=1e-4)
        np.testing.assert_allclose(offsets[0].permute(1, 2, 0).numpy(), want_reg, atol=2e-3 * np.abs(want_reg).max())
    # DFL's decoding of DFL's own outputs gives DFL's boxes (decode is checked apart from the network)
    dfl_levels = [(GOLDEN[f"s3fd_0_cls{i}"].transpose(2, 0, 1), GOLDEN[f"s3fd_0_reg{i}"].transpose(2, 0, 1))
                  for i in range(1, 7)]  # fmt: skip
    assert np.array_equal(np.array(dfl_nets.decode(dfl_levels)), GOLDEN["s3fd_0_refine"])
    # the whole extract: sizing, decoding, the 40-px floor, the longer box, the order
    for k, frame in ((0, image), (1, None)):
        if frame is None:  # a 320x240 window: (top, left, height, width)
            y0, x0, h, w = (int(v) for v in GOLDEN["s3fd_1_image_window"])
            frame = image[y0 : y0 + h, x0 : x0 + w]
        found = [d.box.astype(np.int64) for d in detector(_rgb(frame))]
        assert np.array_equal(np.array(found).reshape(-1, 4), GOLDEN[f"s3fd_{k}_rects"]), k


def test_fan_is_dfls_crop_heatmap_and_point(extractor):
    landmarks = extractor.landmarks
    image = _rgb(GOLDEN["s3fd_0_image"])
    for j, rect in enumerate(GOLDEN["fan_rects"]):
        centre, scale = GOLDEN["fan_centers"][j], float(GOLDEN["fan_scales"][j])
        crop = dfl_nets.fan_crop(image, centre, scale)
        assert np.array_equal(crop, GOLDEN["fan_crops"][j])
        x = torch.from_numpy(crop.astype(np.float32) / 255).permute(2, 0, 1)[None]
        with torch.inference_mode():
            maps = landmarks.net(x)[0].numpy()
        want = GOLDEN[f"fan_heatmaps_f16_{j}"].astype(np.float32)
        got = maps if j == 0 else maps[GOLDEN["fan_heatmap_subset"]]
        np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max())
        # DFL's decoding of the stored heatmaps, exactly
        np.testing.assert_allclose(dfl_nets.heatmap_points(want, centre, scale), GOLDEN[f"fan_pts_from_f16_{j}"],
                                   atol=1e-9)  # fmt: skip
        # the whole landmarker: points where DFL's argmax is not a near tie
        firm = GOLDEN["fan_argmax_gap"][j] > 1e-2 * float(GOLDEN["fan_heatmap_absmax"][j])
        got_pts = landmarks(image, rect.astype(np.float64))
        np.testing.assert_allclose(got_pts[firm], GOLDEN["fan_landmarks"][j][firm], atol=1e-4)
    firm = (GOLDEN["fan_multi_argmax_gap"] > 1e-2 * GOLDEN["fan_multi_heatmap_absmax"][:, None]).all(0)
    got = landmarks(image, GOLDEN["fan_multi_rects"][0].astype(np.float64), samples=True)
    np.testing.assert_allclose(got[firm], GOLDEN["fan_multi_landmarks"][0][firm], atol=1e-4)


def test_dfls_second_pass_through_the_extractor(extractor):
    """FAN on a box, the face aligned to full at 256, S3FD there (one face), FAN's five samples, mapped back."""
    image = _rgb(GOLDEN["s3fd_0_image"])
    first = extractor.landmarks(image, GOLDEN["fan_second_rects"][0].astype(np.float64))
    np.testing.assert_allclose(first, GOLDEN["fan_second_first_pass_pts"], atol=1e-3)
    refined = extractor._refine(image, first)
    np.testing.assert_allclose(refined, GOLDEN["fan_second_landmarks"][0], atol=1e-2)
