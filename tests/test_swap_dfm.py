"""DeepFaceLive's .dfm: a swap run or a DeepFaceLab SAEHD model folder exported as the ONNX graph DFL's
`exportdfm` writes, read as DeepFaceLive's DFMModel reads it (one `in_face` input whose shape gives the
resolution, three outputs in DFL's order, BGR faces in [0, 1]) and swapping as the model does."""

import numpy as np
import pytest
import torch

from bigbatch.cli import main
from bigbatch.models import dfl
from bigbatch.models.saehd import SAEHD
from bigbatch.tasks.swap.load import load_autoencoder

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

TINY = {"ae_dims": 16, "e_dims": 4, "d_dims": 4, "d_mask_dims": 2}


def deepfacelive_reads(path):
    """The checks DeepFaceLive's DFMModel makes of a model file, and its session."""
    session = ort.InferenceSession(str(path))
    inputs = session.get_inputs()
    assert len(inputs) == 1 and "in_face" in inputs[0].name  # (a second input would have to be morph_value)
    height, width = inputs[0].shape[1:3]
    assert isinstance(height, int) and isinstance(width, int)
    return session, (height, width)


@pytest.mark.parametrize("archi", ["df-ud", "liae-ud"])
def test_a_dfl_model_and_its_run_export_to_dfm_as_deepfacelive_reads_it(archi, tmp_path, capsys):
    torch.manual_seed(0)
    model = SAEHD(64, archi, **TINY)
    dfl.save_model_folder(model, tmp_path / "dfl", "me", options={"face_type": "wf"})
    assert main(["export", str(tmp_path / "dfl"), str(tmp_path / "me.dfm")]) == 0
    said = capsys.readouterr().out
    assert "set its face aligner to face type whole_face (it swaps 64 px faces)" in said
    assert main(["convert", str(tmp_path / "dfl"), str(tmp_path / "run")]) == 0
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "live.onnx"), "--format", "dfm"]) == 0

    rgb = load_autoencoder(tmp_path / "run")
    faces = np.random.default_rng(1).random((3, 64, 64, 3), dtype=np.float32)  # BGR, as DeepFaceLive gives them
    with torch.no_grad():
        image, mask, dst_mask = rgb.swap(torch.from_numpy(faces[..., ::-1].copy()).permute(0, 3, 1, 2))
    for path in (tmp_path / "me.dfm", tmp_path / "live.onnx"):
        assert onnx.load(str(path)).opset_import[0].version == 12  # (DFL's tf2onnx export's)
        session, size = deepfacelive_reads(path)
        assert size == (64, 64)
        names = [o.name for o in session.get_outputs()]
        assert names == ["out_face_mask:0", "out_celeb_face:0", "out_celeb_face_mask:0"]
        assert [o.shape[1:] for o in session.get_outputs()] == [[64, 64, 1], [64, 64, 3], [64, 64, 1]]
        face_mask, celeb, celeb_mask = session.run(None, {"in_face:0": faces})
        assert np.abs(celeb[..., ::-1] - image.permute(0, 2, 3, 1).numpy()).max() < 1e-5  # BGR out, as in
        assert np.abs(celeb_mask[..., 0] - mask[:, 0].numpy()).max() < 1e-5
        assert np.abs(face_mask[..., 0] - dst_mask[:, 0].numpy()).max() < 1e-5
        assert np.abs(session.run(None, {"in_face:0": faces[:1]})[1] - celeb[:1]).max() < 1e-5  # (any batch)


def test_a_dfm_of_what_is_not_a_swap_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "notes").mkdir()
    dfl.save_model_folder(SAEHD(64, "df-ud", **TINY), tmp_path / "dfl", "me")
    for argv, words in [
        ([str(tmp_path / "notes")], "notes"),
        ([str(tmp_path / "dfl"), "--checkpoint", "best"], "is a DeepFaceLab model folder"),
    ]:
        assert main(["export", argv[0], str(tmp_path / "x.dfm"), *argv[1:]]) == 2
        err = capsys.readouterr().err
        assert err.startswith("bigbatch: error: ") and err.count("\n") == 1 and words in err, err
        assert not (tmp_path / "x.dfm").exists()
