"""eval.resolution: a classifier scored, predicting and exported at another side than it trained at (FixRes),
and `bigbatch eval RUN --resolution N` trying a side on a trained run."""

import json
import re

import numpy as np
import pytest
from test_classify import tiny

import bigbatch
from bigbatch.cli import main
from bigbatch.metrics import get_extractor
from bigbatch.tasks.classify.inference import inference_of


def test_a_classifier_scored_above_its_training_side_is_scored_predicts_and_reports_there(tmp_path, capsys):
    run = bigbatch.train(tiny(**{"eval.resolution": 20}), run_dir=tmp_path / "run", quiet=True)
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in logged if "val_top1" in r][-1]
    # eval of the run scores where its validation scored, and says so; predict and export take images there.
    assert main(["eval", str(run)]) == 0
    assert "360 images at 20 px" in capsys.readouterr().out
    at20 = json.loads((run / "eval" / "heldout-000000.512" / "metrics.json").read_text())
    assert at20["resolution"] == 20 and at20["loss"] == pytest.approx(last["val_loss"])
    assert inference_of(run).resolution == 20
    assert get_extractor(f"classifier:{run}", device="cpu").resolution == 20  # (a GAN's FCD by it: review)
    assert main(["info", str(run)]) == 0
    said = capsys.readouterr().out  # (the recipe's optimizer and augmentation too: found from outside, unsaid)
    assert "at 16px, scored at 20px" in said and ", sgd momentum 0.9 nesterov lr 0.2 per 64" in said
    assert "\naugment     none\n" in said
    # --resolution tries another side, in a report of its own; the run's is left as it was.
    assert main(["eval", str(run), "--resolution", "16"]) == 0
    at16 = json.loads((run / "eval" / "heldout-16px-000000.512" / "metrics.json").read_text())
    assert at16["resolution"] == 16 and at16["loss"] != at20["loss"]
    assert json.loads((run / "eval" / "heldout-000000.512" / "metrics.json").read_text()) == at20
    # The best checkpoint's scores are kept with the side they were scored at.
    assert json.loads((run / "checkpoints" / "best" / "meta.json").read_text())["best"]["settings"]["resolution"] == 20
    capsys.readouterr()
    bigbatch.train(tiny(**{"train.kimg": 0.768}), run_dir=run, resume=True)  # (back to where it trains: said how)
    assert "was scored with other eval settings (resolution 20, now none)" in capsys.readouterr().err
    assert main(["eval", str(run), "--resolution", "2"]) == 2
    assert capsys.readouterr().err == "bigbatch: error: --resolution must be 4 to 16384 pixels, got 2\n"


def test_a_scoring_side_is_refused_for_runs_that_score_at_their_data_resolution(capsys):
    assert main(["train", "--preset", "digits", "eval.resolution=64", "--run-dir", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'eval.resolution' is the side a classifier is scored at; a gan run's is" in err
    assert main(["train", "--preset", "fashion_resnet", "eval.resolution=-1", "--run-dir", "x"]) == 2
    assert "'eval.resolution' must be 0 (where it trained) or a side in pixels, got -1" in capsys.readouterr().err
    assert main(["train", "--preset", "fashion_resnet", "eval.resolution=2", "--run-dir", "x"]) == 2
    assert "'eval.resolution' must be 0 (where it trained) or at least 4 pixels, got 2" in capsys.readouterr().err


def test_upscaled_data_is_said_with_the_side_and_the_key_that_ask_for_it(tmp_path, capsys):
    # Found from outside: a held-out side set by eval.resolution was blamed on data.resolution and data.schedule,
    # the fix naming the training's side; a phase of resolution 0 (data.resolution) was left out of the warning,
    # and the start line said "0px".
    for side in (8, 16):
        bigbatch.data.prepare("builtin:digits", str(tmp_path / f"d{side}.h5"), side, limit=100, workers=0)
    over = {"data.path": str(tmp_path / "d16.h5"), "data.val_path": str(tmp_path / "d16.h5"), "train.kimg": 0.064}
    bigbatch.train(
        tiny(**over, **{"eval.resolution": 24, "data.val_fraction": 0.0}), run_dir=tmp_path / "fix", quiet=True
    )
    assert (
        "d16.h5 holds 16px images, and the run scores its held-out images at up to 24px (eval.resolution): they are "
        "upscaled, no sharper than at their own size; prepare the images at 24px"
    ) in capsys.readouterr().err
    phases = {"data.path": str(tmp_path / "d8.h5"), "data.schedule": "0:0:1x,0.032:8:1x", "train.kimg": 0.064}
    bigbatch.train(tiny(**phases), run_dir=tmp_path / "zero")
    out, err = capsys.readouterr()
    assert "holds 8px images, and the run trains at up to 16px (data.resolution, data.schedule)" in err
    assert ": 16px batch 64 = " in out and "; then 8px batch 64 from 0.064 kimg" in out, out


def test_whole_images_prepared_below_the_side_a_run_trains_at_are_said_upscaled(tmp_path, capsys):
    # Found from outside: a store of short side 64 (--crop none) trained and scored at 128 px without a word, in
    # training and in its dry run, where a store of 64 px squares was warned of.
    from test_codecs import photos

    data = tmp_path / "whole.h5"
    bigbatch.data.prepare(str(photos(tmp_path / "src", n=8)), str(data), 12, workers=0, codec="jpeg", crop="none")
    said = (
        "holds whole images of short side 12px, and the run trains at up to 16px (data.resolution, data.schedule): "
        "they are upscaled, no sharper than at their own size; prepare the images again with --resolution 16 "
        "--crop none for the detail"
    )
    over = {"data.path": str(data), "data.val_fraction": 0.25, "train.batch": 4, "train.micro_batch": 4}
    bigbatch.train(tiny(**over, **{"train.kimg": 0.004, "eval.batch_size": 2}), run_dir=tmp_path / "r", quiet=True)
    assert said in capsys.readouterr().err
    argv = ["train", "--dry-run", "--preset", "fashion_resnet", f"data.path={data}", "data.resolution=16"]
    assert main(argv) == 0
    assert said in capsys.readouterr().err
    assert main([*argv[:-1], "data.resolution=12"]) == 0 and "upscaled" not in capsys.readouterr().err
    # Images below the side asked of prepare, kept at their own size: the median's short side (found from outside:
    # short sides of 56 prepared at 64 trained at 64 unsaid, and scored at 72 as "of short side 64").
    small = tmp_path / "small.h5"
    photos(tmp_path / "s", n=8, size=(24, 20))
    bigbatch.data.prepare(str(tmp_path / "s"), str(small), 64, workers=0, codec="jpeg", crop="none")
    shorts = bigbatch.data.load_data(str(small), 0).stored_sizes(np.arange(8)).min(1)
    assert shorts.max() < 64
    over = {**over, "data.path": str(small), "data.resolution": 64, "train.kimg": 0.004, "eval.batch_size": 2}
    bigbatch.train(tiny(**over), run_dir=tmp_path / "small", quiet=True)
    said = re.search(r"holds whole images of short side (\d+)px, and the run trains at up to 64px.*; (.*)\n",
                     capsys.readouterr().err)  # fmt: skip
    assert said and shorts.min() <= int(said[1]) <= shorts.max(), said  # (the median of the training split's)
    assert (
        said[2] == f"most were smaller than the side they were prepared at: train at {said[1]}px, or give larger ones"
    )


def test_prepares_hint_trains_whole_images_kept_below_its_side_at_the_side_training_takes(tmp_path, capsys):
    # Found from outside: whole images mostly smaller than --resolution were hinted data.resolution=64, and the
    # hinted run's first line said they were upscaled: "train at 22px".
    import shlex

    from test_codecs import photos

    photos(tmp_path / "s", n=8, size=(24, 20))
    argv = ["prepare", str(tmp_path / "s"), "small.h5", "--resolution", "64", "--codec", "jpeg", "--crop", "none"]
    assert main([*argv, "--workers", "1"]) == 0
    hint = capsys.readouterr().out.splitlines()[-1]
    side = bigbatch.data.load.stored_side(bigbatch.data.load_data("small.h5", 64))  # (what the run itself takes)
    assert hint.startswith("train a classifier on it with: ") and f" data.resolution={side} " in hint, hint
    assert side < 64
    assert main([*shlex.split(hint.split(": ", 1)[1])[1:], "--dry-run"]) == 0
    assert "upscaled" not in capsys.readouterr().err
