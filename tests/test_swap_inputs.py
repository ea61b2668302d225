"""A DeepFaceLab user's slips with SAEHD's commands, each refused or warned of in one line that names the way on
(found from outside)."""

from test_swap import dfl_folder

from bigbatch.cli import main
from bigbatch.config import Config


def test_dfl_folders_names_and_outputs_are_checked_as_dfl_would_read_them(tmp_path, capsys):
    (tmp_path / "dfl").mkdir()
    dfl_folder(tmp_path / "dfl")  # (its options train both discriminators: gan_power and true_face_power 0.1)
    assert main(["convert", str(tmp_path / "dfl"), str(tmp_path / "run")]) == 0
    # Converted without data, the run goes on as DFL does with --resume and the data (it said train.init_from alone).
    assert f"bigbatch train --run-dir {tmp_path / 'run'} --resume data.path=SRC.h5" in capsys.readouterr().out
    assert Config.load(tmp_path / "run" / "config.toml").name == "saehd64-df-u"  # (was the saehd128 recipe's)
    assert main(["convert", str(tmp_path / "dfl"), str(tmp_path / "with"), "data.path=s.h5", "data.dst_path=d.h5"]) == 0
    assert capsys.readouterr().out.rstrip().endswith(f"--run-dir {tmp_path / 'with'} --resume")  # (given: not asked)
    assert main(["train", "--run-dir", str(tmp_path / "run"), "--resume", "train.kimg=0.004"]) == 2
    err = capsys.readouterr().err  # (was: cannot open 'data/src.h5', the preset's path, "write it with prepare")
    assert f"was converted from {tmp_path / 'dfl'} without its data, and its data.path data/src.h5 does not" in err
    assert "give the data to train on, data.path=SRC.h5 data.dst_path=DST.h5 (with --resume)" in err

    # DFL lists a model by its files' names up to the first "_": my_model_SAEHD_* would be a new model "my" there.
    assert main(["export-dfl", str(tmp_path / "run"), str(tmp_path / "out"), "--name", "my_model"]) == 2
    assert "give 'my model' (as DFL names it) or a name without '_'" in capsys.readouterr().err
    assert main(["export-dfl", str(tmp_path / "run"), str(tmp_path / "out"), "--name", "my model"]) == 0
    err = capsys.readouterr().err  # (the discriminators were dropped without a word)
    assert "the run's discriminators (swap.gan_power, swap.true_face_power) are not written" in err
    assert (tmp_path / "out" / "my model_SAEHD_data.dat").is_file()

    # eval of a DFL folder says what it is (it "holds no image files"), as export and info do.
    assert main(["eval", str(tmp_path / "dfl")]) == 2
    assert "holds a DeepFaceLab SAEHD model (dfl_SAEHD_data.dat), not a bigbatch run" in capsys.readouterr().err
    # swap into a file (it named OUT/masks), and a folder missing a part its options call for (no such file).
    (tmp_path / "faces").mkdir()
    (tmp_path / "note.txt").write_text("hi")
    assert main(["swap", str(tmp_path / "run"), str(tmp_path / "faces"), str(tmp_path / "note.txt")]) == 2
    assert f"{tmp_path / 'note.txt'} is a file: give a folder for the swapped faces" in capsys.readouterr().err
    (tmp_path / "dfl" / "dfl_SAEHD_inter.npy").unlink()
    assert main(["convert", str(tmp_path / "dfl"), str(tmp_path / "again")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dfl_SAEHD_inter.npy is missing: the model's options (df-u) call for its" in err


def test_built_in_data_sets_which_cannot_have_masks_are_not_told_to_prepare_them(tmp_path, capsys):
    from test_swap import TINY

    import bigbatch

    cfg = bigbatch.preset("saehd_cpu").override(
        {
            "data.dst_path": "builtin:digits",
            "model.options": {"archi": "df-u", **TINY},
            "train.batch": 4,
            "train.micro_batch": 4,
            "train.kimg": 0.004,
            "eval.every_kimg": 0,
            "sample.every_kimg": 0,
            "checkpoint.every_kimg": 0.004,
        }  # fmt: skip
    )
    bigbatch.train(cfg, run_dir=tmp_path / "r", quiet=True)  # (the preset's own data: warned of at every run)
    assert "neither data set has face masks" not in capsys.readouterr().err


def test_a_patch_discriminator_the_faces_cannot_take_is_refused_before_the_run_is_made(tmp_path, capsys):
    # Found from outside: gan_patch_size 300 at 64 px passed its check (3..640), then the first step was a traceback
    # and the run folder left behind refused the mended command; gan_dims 1 and 2000 were taken.
    over = ["swap.gan_power=0.1", "--run-dir", str(tmp_path / "r")]
    assert main(["train", "--preset", "saehd_cpu", *over, "swap.gan_patch_size=300"]) == 2
    said = "swap.gan_patch_size = 300 is too large for 64 px faces: its convs halve them more often than they halve"
    assert said in capsys.readouterr().err and not (tmp_path / "r").exists()
    assert main(["train", "--preset", "saehd_cpu", *over, "swap.gan_patch_size=239", "--dry-run"]) == 0
    capsys.readouterr()
    for dims in ("1", "2000"):
        assert main(["train", "--preset", "saehd_cpu", *over, f"swap.gan_dims={dims}", "--dry-run"]) == 2
        assert f"must be in 4..512 (DFL's range; 16 typical), got {dims}" in capsys.readouterr().err
