"""DFL's own detector and landmarker (S3FD, 2DFAN) from a DFL install's weight files: `bigbatch extract --weights
DFL/facelib`. Checked against DFL's own code run on seeded weights written in DFL's layout
(tests/data/dfl_detect_golden.npz, made by bench/dfl_golden_detect.py); the files are read restricted."""

from __future__ import annotations

import pickle
from pathlib import Path

import cv2
import numpy as np

from bigbatch.cli import main
from bigbatch.faces import dfl_nets


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


def test_bad_weight_folders_are_one_line(tmp_path, capsys):
    cv2.imwrite(str(tmp_path / "a.png"), np.zeros((200, 200, 3), np.uint8))
    (tmp_path / "facelib").mkdir()
    assert main(["extract", str(tmp_path / "a.png"), str(tmp_path / "o"), "--weights", str(tmp_path / "facelib")]) == 2
    assert "lacks S3FD.npy and 2DFAN.npy: give a DeepFaceLab install's facelib folder" in capsys.readouterr().err

    class Payload:
        def __reduce__(self):
            return (print, ("ran",))

    (tmp_path / "facelib" / "S3FD.npy").write_bytes(pickle.dumps({"x": Payload()}))
    (tmp_path / "facelib" / "2DFAN.npy").write_bytes(pickle.dumps({}))
    args = ["extract", str(tmp_path / "a.png"), str(tmp_path / "o"), "--weights", str(tmp_path / "facelib")]
    assert main([*args, "--workers", "1"]) == 2
    out, err = capsys.readouterr()
    assert "ran" not in out and "asks to load builtins.print" in err and len(err.strip().splitlines()) == 1
    assert main([*args, "--workers", "2"]) == 2  # (the same line when a worker process could not start)
    assert "asks to load builtins.print" in capsys.readouterr().err
    (tmp_path / "facelib" / "S3FD.npy").write_bytes(pickle.dumps({"conv1_1/weight:0": np.zeros(3)}))
    assert main([*args, "--workers", "1"]) == 2
    assert "S3FD.npy: conv1_1/weight:0 is (3,), DFL's S3FD has (64, 3, 3, 3)" in capsys.readouterr().err


GOLDEN_PATH = Path(__file__).parent / "data" / "dfl_detect_golden.npz"
