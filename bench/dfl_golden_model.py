"""Golden data: a bigbatch SAEHD exported to DeepFaceLab's files, loaded by DFL's own SAEHDModel (TensorFlow,
leras) and merged by DFL's own MergeMasked, so tests/test_faces_merge.py can check that the same model merged
by bigbatch gives the same frames (issue 42: "a model exported to DFL and merged there").

    .venv/bin/python bench/dfl_golden_model.py --dfl /tmp/dfl --dfl-python /tmp/tfenv/bin/python \
        [--out tests/data/dfl_model_golden.npz]

In this Python: a small liae-ud SAEHD (64 px, dims 32/16/16/16) whose every weight is drawn from a seeded NumPy
generator (`fill_weights`, which the test repeats), written as a DFL model folder by bigbatch's exporter
(`dfl.save_model_folder`: BGR, DFL's keys and layouts, `_data.dat`). In DFL's Python (TensorFlow 1 API, DFL's
requirements): DFL's SAEHDModel opens that folder for merging (is_training=False), its `get_MergerConfig`
predictor swaps four faces cut from scikit-image's astronaut, and MergeMasked merges the golden frame of
tests/data/dfl_faces_golden.npz with that predictor under a few settings. DFL's code runs from the path given;
none of it is in the repository. The .npz holds the faces, DFL's predictions and merged frames (as the change
from the frame).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

RES, ARCHI, DIMS = 64, "liae-ud", {"ae_dims": 32, "e_dims": 16, "d_dims": 16, "d_mask_dims": 16}
NAME = "golden"
# (mode, DFL mask mode, erode, blur, colour transfer): DFL's defaults (learned-prd*learned-dst, rct) and others.
MERGE_CASES = (
    ("overlay", 4, 0, 0, "rct"),
    ("overlay", 2, 20, 40, "none"),
    ("seamless", 4, 0, 20, "rct"),
    ("hist-match", 5, 0, 0, "none"),
)


def fill_weights(model) -> None:  # noqa: ANN001 - a bigbatch SAEHD
    """Every weight of `model` (RGB, bigbatch's layout) drawn from NumPy's generator seeded 0, in state-dict
    order: convolutions and dense layers uniform within glorot's bound, biases uniform in ±0.1 (zero biases
    would hide a misplaced one)."""
    import torch

    rng = np.random.default_rng(0)
    with torch.no_grad():
        for name, p in model.state_dict().items():
            if name.endswith("bias"):
                values = rng.uniform(-0.1, 0.1, p.shape)
            else:
                fan_in = int(np.prod(p.shape[1:]))
                fan_out = p.shape[0] * (int(np.prod(p.shape[2:])) if p.dim() > 2 else 1)
                bound = float(np.sqrt(6 / (fan_in + fan_out)))
                values = rng.uniform(-bound, bound, p.shape)
            p.copy_(torch.from_numpy(values.astype(np.float32)))


def golden_model():  # noqa: ANN201 - a bigbatch SAEHD
    from bigbatch.models.saehd import SAEHD

    model = SAEHD(RES, ARCHI, **DIMS).eval()
    fill_weights(model)
    return model


def faces_bgr() -> np.ndarray:
    """Four 64x64 BGR float32 faces in [0, 1]: squares of the astronaut around her face, shifted and scaled."""
    import cv2
    from skimage import data

    astro = np.ascontiguousarray(data.astronaut()[:, :, ::-1])
    boxes = [(150, 60, 300), (170, 80, 260), (130, 40, 340), (160, 50, 280)]  # (x, y, side)
    crops = [cv2.resize(astro[y : y + s, x : x + s], (RES, RES), interpolation=cv2.INTER_AREA) for x, y, s in boxes]
    return (np.stack(crops).astype(np.float32) / 255).astype(np.float32)


def make_folder(folder: Path) -> None:
    """The golden model as a DFL model folder, written by bigbatch's exporter."""
    import bigbatch
    from bigbatch.models import dfl
    from bigbatch.tasks.swap.files import dfl_options

    cfg = bigbatch.preset("saehd128").override({"data.resolution": RES, "model.options": {"archi": ARCHI, **DIMS}})
    dfl.save_model_folder(golden_model(), folder, NAME, options=dfl_options(cfg, "wf"), iteration=1)


def dfl_side(a: argparse.Namespace) -> None:
    """In DFL's Python: its SAEHDModel on the folder, its predictor on the faces, MergeMasked on the frame."""
    sys.path.insert(0, a.dfl)
    import warnings

    warnings.filterwarnings("ignore")
    import cv2
    from core.interact import interact as io
    from core.leras import nn

    io.input_in_time = lambda *args, **kw: False  # "press enter to override the model's settings": no
    nn.initialize_main_env()
    nn.initialize(nn.DeviceConfig.CPU())
    import merger  # noqa: F401 - (its __init__ puts the classes where the modules' names were)
    import models
    from merger.FrameInfo import FrameInfo

    MC, merge_masked = sys.modules["merger.MergerConfig"], sys.modules["merger.MergeMasked"].MergeMasked

    from facelib import FaceType

    folder = Path(a.folder)
    model = models.import_model("SAEHD")(
        is_training=False, saved_models_path=folder, force_model_name=NAME, cpu_only=True, no_preview=True
    )
    predictor, shape, _ = model.get_MergerConfig()
    inputs = np.load(folder / "inputs.npz")
    out = {"pred_bgr": [], "pred_mask_src": [], "pred_mask_dst": []}
    for face in inputs["faces"]:
        bgr, mask_src, mask_dst = predictor(face)
        out["pred_bgr"].append(bgr)
        out["pred_mask_src"].append(mask_src)
        out["pred_mask_dst"].append(mask_dst)
    out = {k: np.stack(v).astype(np.float32) for k, v in out.items()}
    frame, landmarks = inputs["frame"], inputs["landmarks"]
    path = folder / "00001.png"
    cv2.imwrite(str(path), frame)
    ctm = {v: k for k, v in MC.ctm_dict.items()}
    deltas, masks = [], []
    for mode, mask_mode, erode, blur, ct in MERGE_CASES:
        cfg = MC.MergerConfigMasked(
            face_type=FaceType.WHOLE_FACE, mode=mode, mask_mode=mask_mode, erode_mask_modifier=erode,
            blur_mask_modifier=blur, color_transfer_mode=ctm["None" if ct == "none" else ct],
        )  # fmt: skip
        assert cfg.mode == mode
        bgra = merge_masked(predictor, shape, None, None, cfg, FrameInfo(filepath=path, landmarks_list=[landmarks]))
        deltas.append(bgra[..., :3].astype(np.int16) - frame)
        masks.append(bgra[..., 3])
    np.savez(folder / "dfl_out.npz", **out, merge_out_delta=np.stack(deltas), merge_mask=np.stack(masks))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dfl", required=True, help="a DeepFaceLab checkout")
    parser.add_argument("--dfl-python", help="a Python with DFL's requirements (TensorFlow)")
    parser.add_argument("--out", default=str(Path(__file__).parents[1] / "tests" / "data" / "dfl_model_golden.npz"))
    parser.add_argument("--dfl-side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.dfl_side:
        dfl_side(a)
        return
    if not a.dfl_python:
        raise SystemExit("give --dfl-python, a Python with DeepFaceLab's requirements")
    sys.path.insert(0, str(Path(__file__).parent))
    from _dfl_golden import dfl_commit, write_golden

    faces_golden = np.load(Path(__file__).parents[1] / "tests" / "data" / "dfl_faces_golden.npz")
    with tempfile.TemporaryDirectory(prefix="dfl-golden-model-") as tmp:
        folder = Path(tmp)
        make_folder(folder)
        faces = faces_bgr()
        frame, landmarks = faces_golden["merge_frame"], faces_golden["merge_landmarks"]
        np.savez(folder / "inputs.npz", faces=faces, frame=frame, landmarks=landmarks)
        subprocess.run([a.dfl_python, __file__, "--dfl-side", "--dfl", a.dfl, "--folder", str(folder)], check=True)
        got = dict(np.load(folder / "dfl_out.npz"))
    write_golden(
        Path(a.out),
        {
            "faces": faces,
            **got,
            "merge_cases": np.array([json.dumps(c) for c in MERGE_CASES]),
            "dfl_commit": np.array(dfl_commit(Path(a.dfl))),
        },
    )


if __name__ == "__main__":
    main()
