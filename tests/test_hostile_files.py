"""Files made to break a reader (found from outside, each was a traceback or read whole into memory): JSON nested past
Python's parser in a run's files, an export's settings member that inflates to gigabytes, numbers past Python's
digit limit in a config, a DeepFaceLab model file whose options make a model of terabytes, face metadata that is not
numbers, a zip member named from the root. Each is one line, or passed over as damaged, never a traceback."""

import zipfile

import cv2
import numpy as np
import pytest

import bigbatch
from bigbatch.cli import main
from bigbatch.data.dfl_faces import write_metadata
from bigbatch.faces.merge_run import aligned_faces
from bigbatch.models import dfl

DEEP = "[" * 200_000 + "]" * 200_000


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cfg = bigbatch.preset("digits").override(
        {"data.resolution": 16, "model.ch": 8, "model.dim_z": 16, "train.batch": 16, "train.kimg": 0.032}
    )
    cfg = cfg.override({"checkpoint.every_kimg": 0.016, "sample.every_kimg": 0, "eval.every_kimg": 0})
    return bigbatch.train(cfg, run_dir=tmp_path_factory.mktemp("hostile") / "r", quiet=True)


def copied(run, tmp_path, name):
    import shutil

    return shutil.copytree(run, tmp_path / name)


def test_json_nested_too_deep_is_a_damaged_file(run, tmp_path, capsys):
    meta = copied(run, tmp_path, "meta")
    (meta / "checkpoints" / "000000.032" / "meta.json").write_text(DEEP)
    assert main(["sample", str(meta), "--n", "4"]) == 0  # the checkpoint before it, as of any damaged one
    assert "names no complete checkpoint (000000.032); using 000000.016" in capsys.readouterr().err
    plan = copied(run, tmp_path, "plan")
    (plan / "plan.json").write_text(DEEP)
    assert main(["info", str(plan)]) == 0
    rows = copied(run, tmp_path, "rows")
    with open(rows / "metrics.jsonl", "a") as f:
        f.write(DEEP + "\n")
    for argv in (["info", str(rows)], ["plot", str(rows)], ["train", "--run-dir", str(rows), "--resume"]):
        assert main([*argv, *(["train.kimg=0.048"] if argv[0] == "train" else [])]) == 0, argv
    assert "Traceback" not in capsys.readouterr().err


def test_an_exports_settings_too_large_to_be_bigbatchs_are_not_read(tmp_path, capsys):
    with zipfile.ZipFile(tmp_path / "m.pt", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("m/extra/bigbatch.json", '{"task": "gan"' + " " * (2 << 20) + "}")  # (2 MiB: a few KB deflated)
    assert main(["info", str(tmp_path / "m.pt")]) == 2
    assert "holds no settings of a bigbatch" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, said",
    [
        (
            ["train.kimg=" + "9" * 5000],
            "cannot read override train.kimg=...: it holds a number longer than 4,300 digits",
        ),
        (["model.options=" + "{a=" * 3000 + "1" + "}" * 3000], "model.options=...: it holds arrays or tables nested"),
    ],
)
def test_an_override_past_pythons_parser_is_one_line(capsys, argv, said):
    assert main(["train", "--dry-run", *argv]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1


def test_a_config_file_with_a_number_past_pythons_limit_is_one_line(tmp_path, capsys):
    (tmp_path / "c.toml").write_text("[train]\nkimg = " + "9" * 100_000 + "\n")
    assert main(["train", "--dry-run", "--config", str(tmp_path / "c.toml")]) == 2
    assert f"config file {tmp_path / 'c.toml'} holds a number longer than 4,300 digits" in capsys.readouterr().err


@pytest.mark.parametrize(
    "data, said",
    [
        ({"ae_dims": 100_000, "e_dims": 100_000, "d_dims": 100_000}, "(ae_dims 100000, e_dims 100000, d_dims 100000,"),
        ({"ae_dims": 10**5000}, "(ae_dims a number of about 5001 digits, e_dims 4"),
        ({"iter": 10**5000}, "its iter is a number of about 5001 digits, not a count of DFL's iterations"),
    ],
)
def test_a_dfl_model_file_of_absurd_numbers_is_one_line(tmp_path, capsys, data, said):
    from test_swap import TINY

    from bigbatch.models.saehd import SAEHD

    folder = tmp_path / "dfl"
    dfl.save_model_folder(SAEHD(64, "df-u", **TINY), folder, "m")
    options = {"resolution": 64, "archi": "df-u", "face_type": "f", **TINY}
    options |= {k: v for k, v in data.items() if k != "iter"}
    (folder / "m_SAEHD_data.dat").write_bytes(dfl.dumps({"options": options, "iter": data.get("iter", 1)}))
    assert main(["convert", str(folder), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err


def faces(folder, metas):
    """Aligned faces (grey JPEGs) carrying `metas`, each with in-range landmarks unless it gives its own."""
    folder.mkdir()
    landmarks = (np.random.default_rng(0).random((68, 2)) * 64).tolist()
    ok, jpg = cv2.imencode(".jpg", np.full((64, 64, 3), 128, np.uint8))
    for i, meta in enumerate(metas):
        meta = {"landmarks": landmarks, "source_landmarks": landmarks, "source_filename": f"{i:05d}.png", **meta}
        (folder / f"{i:05d}_0.jpg").write_bytes(write_metadata(jpg.tobytes(), meta))
    return folder


def test_sort_trashes_a_face_whose_rect_is_not_numbers_and_merge_names_one_whose_landmarks_are_not(tmp_path, capsys):
    rects = [[0, 0, 10, 10], "abc", [0, 0, 10**400, 5], [0, 0, 30, 30]]
    folder = faces(tmp_path / "aligned", [{"source_rect": r} for r in rects])
    assert main(["sort", str(folder), "--by", "face-source-rect-size"]) == 0
    assert sorted(p.name for p in (tmp_path / "aligned_trash").iterdir()) == ["00001_0.jpg", "00002_0.jpg"]
    assert len(list(folder.glob("*.jpg"))) == 2
    for bad in ([["a", "b"]] * 68, np.full((68, 2), np.nan).tolist(), [[10**400, 0]] * 68):
        odd = faces(tmp_path / f"odd{len(list(tmp_path.iterdir()))}", [{"source_landmarks": bad}])
        with pytest.raises(bigbatch.BigbatchError, match="its DeepFaceLab metadata's source_landmarks are not"):
            aligned_faces(odd)


def test_a_zip_member_named_from_the_root_or_out_of_the_archive_is_skipped_and_said(tmp_path, capsys):
    ok, png = cv2.imencode(".png", np.full((16, 16, 3), 100, np.uint8))
    with zipfile.ZipFile(tmp_path / "s.zip", "w") as z:
        for name in ("cls0/a.png", "cls0/b.png", "cls1/c.png", "/tmp/escaped.png", "../up.png", "cls1/../../x.png"):
            z.writestr(name, png.tobytes())
    assert main(["prepare", str(tmp_path / "s.zip"), str(tmp_path / "s.h5")]) == 0
    out = capsys.readouterr().out
    assert "3 images 16x16x3, 2 classes" in out and "skipped 3 files" in out
    assert "/tmp/escaped.png: a path out of the archive's folder (from the root, or through ..)" in out
