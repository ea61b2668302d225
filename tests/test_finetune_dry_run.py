"""`bigbatch train --dry-run` of a fine-tune refuses what the run would refuse as it starts: train.init_from's weights
against the models built for the data (family, shapes), and train.freeze_d against D's blocks."""

import bigbatch
from bigbatch.cli import main
from bigbatch.config import parse_override

TINY = ["--preset", "digits", "data.resolution=16", "model.ch=8", "model.dim_z=16", "train.batch=8"]
TINY += ["eval.every_kimg=0", "sample.every_kimg=0"]


def test_the_built_in_sets_classes_are_known_without_making_them():
    from bigbatch.data.builtin import BUILTIN, CHANNELS, CLASSES

    assert CLASSES.keys() == BUILTIN.keys()
    made = BUILTIN["digits"](8)
    assert made.class_names == CLASSES["digits"] and made.channels == CHANNELS


def test_a_dry_run_refuses_the_fine_tunes_the_run_refuses(tmp_path, capsys):
    cfg = bigbatch.preset("digits").override(dict(parse_override(a) for a in TINY[2:]) | {"train.kimg": 0.008})
    bigbatch.train(cfg, run_dir=tmp_path / "pretrained", quiet=True)
    start = ["--init-from", str(tmp_path / "pretrained")]
    # What matches dry-runs (a plan printed), and what does not is the run's own line, before anything runs.
    assert main(["train", "--dry-run", *TINY, *start, "train.freeze_d=2"]) == 0
    assert "# plan: batch 8" in capsys.readouterr().out
    for bad, words in (
        (["model.ch=4"], "input.weight has shape (26, 16, 4, 4), this model needs (26, 8, 4, 4)"),
        (["model.conditional=false"], "was trained on 10 classes and this run is unconditional"),  # (dcgan's)
        (["model.name=stylegan2", "model.options={}"], "is a dcgan run, and this one trains stylegan2"),
        (["train.freeze_d=9"], "train.freeze_d=9, but this D has 2 blocks"),
    ):
        assert main(["train", "--dry-run", *TINY, *start, *bad]) == 2, bad
        dry = capsys.readouterr().err
        assert dry.startswith("bigbatch: error: ") and dry.count("\n") == 1 and words in dry, (bad, dry)
        assert main(["train", *TINY, *start, *bad, "train.kimg=0.008", "--run-dir", str(tmp_path / "r")]) == 2
        assert capsys.readouterr().err == dry  # the run's refusal, word for word
