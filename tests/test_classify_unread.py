"""What a classifier's config leaves unread, said once as its training starts (not on eval, info or a resume, where
nothing can be done of it), and a schedule's phases as they train (each found from outside)."""

import json
import shutil

import pytest
from test_classify import tiny

import bigbatch
from bigbatch.cli import main
from bigbatch.config import parse_override

PHASES_LR = "[{kimg=0, resolution=16, batch=32, lr=[0.1, 0.2]}, {kimg=0.064, lr=[0.2, 0.01]}]"


def test_keys_the_run_does_not_read_are_said_as_it_starts_and_not_by_what_reads_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("bigbatch.errors._WARNED", set())  # (said once a process: maybe by another test)
    small = {"train.kimg": 0.128, "checkpoint.every_kimg": 0.128, "eval.every_kimg": 0, "sample.every_kimg": 0}
    # With the phases' lr, train.lr=100 trained the same weights as 1.0 without a word.
    cfg = tiny(**small).override({"data.schedule": bigbatch.config.parse_override(f"x={PHASES_LR}")[1]})
    run = bigbatch.train(cfg.override({"train.lr": 100.0}), run_dir=tmp_path / "r", quiet=True)
    assert "'train.lr' is not read: data.schedule's phases give the learning rates" in capsys.readouterr().err
    monkeypatch.setattr("bigbatch.errors._WARNED", set())
    for argv in (["eval", str(run)], ["info", str(run)]):  # (it was said again by each)
        assert main(argv) == 0
        out, err = capsys.readouterr()
        assert "is not read" not in err, argv
    assert (
        "sgd momentum 0.9 nesterov lr per phase (data.schedule, below)" in out
    )  # (info showed the rate it does not read)
    # timm's --decay-epochs under a cosine schedule, Nesterov without momentum: silent.
    monkeypatch.setattr("bigbatch.errors._WARNED", set())
    over = {"train.lr_decay": "cosine", "train.lr_steps": [0.064], "train.nesterov": True, "train.momentum": 0.0}
    bigbatch.train(tiny(**small, **over), run_dir=tmp_path / "c", quiet=True)
    err = capsys.readouterr().err
    assert 'config key \'train.lr_steps\' is not read by train.lr_decay = "cosine" (only by "step")' in err
    assert "train.nesterov needs train.momentum > 0, which is 0: plain SGD without momentum is trained" in err


def test_a_phase_at_resolution_0_trains_at_data_resolution_and_a_side_past_any_is_refused(tmp_path, capsys):
    small = {"train.kimg": 0.064, "checkpoint.every_kimg": 0.064, "eval.every_kimg": 0, "sample.every_kimg": 0}
    bigbatch.train(tiny(**small, **{"data.schedule": "0:0:32"}), run_dir=tmp_path / "z", quiet=True)
    assert "none at data.resolution" not in capsys.readouterr().err  # (warned, with no sides named)
    with pytest.raises(bigbatch.BigbatchError, match=r"phase 0 trains at 100000 px, past the 16384 px any resolution"):
        tiny(**{"data.schedule": "0:100000:32"})  # (passed --dry-run, then ran out of memory: exit 1)


def test_the_dry_run_says_what_the_run_would_leave_unread(capsys, monkeypatch):
    monkeypatch.setattr("bigbatch.errors._WARNED", set())  # (found from outside: said by the run alone)
    argv = ["train", "--preset", "fashion_resnet_fast", "train.lr_decay=cosine", "train.lr_steps=[10]", "--dry-run"]
    assert main(argv) == 0
    assert "config key 'train.lr_steps' is not read by train.lr_decay = \"cosine\"" in capsys.readouterr().err
    # ... and what the run would never reach or leave (found from outside: said by the run alone).
    assert main(["train", "--preset", "fashion_resnet_fast", "data.resolution=32", "train.kimg=1", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "phases train at 16, 28 px and none at data.resolution = 32" in err
    assert "data.schedule's phases from kimg 60 (28 px, batch 128) begin at or past the run's end" in err
    assert "train.warmup_kimg 30 is not shorter than the run (train.kimg 1)" in err
    assert main(["train", "--preset", "digits", "train.precision=fp16", "--dry-run"]) == 0  # (and the engine's)
    assert "fp16 precision on a CPU: PyTorch's CPU fp16 kernels are slow" in capsys.readouterr().err


@pytest.mark.parametrize(
    "key", ["eval.metrics=is,kid", "eval.n=500", "eval.extractor=inception", "sample.truncation=0.5",
            "model.conditional=false"],
)  # fmt: skip
def test_a_gans_scoring_keys_are_refused_for_a_classifier(key, capsys):
    # Found from outside: eval.metrics=fid (and eval.n, sample.truncation, ...) were taken by a classify run, which
    # then reported top-1 alone; its GAN train keys were refused already.
    assert main(["train", "--preset", "fashion_resnet", "--dry-run", key]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"config key '{key.split('=')[0]}' is " in err and 'task = "classify"' in err
    bigbatch.preset("fashion_resnet").override(dict([parse_override(key)]))  # (a saved run's still loads: by review)


def test_turning_a_presets_weight_average_off_says_to_turn_its_cap_off_with_it(capsys):
    # Found from outside: "set train.model_ema_kimg" to a user who had set it to 0; the preset had set ema_rampup.
    assert main(["train", "--preset", "fashion_resnet_fast", "train.model_ema_kimg=0", "--dry-run"]) == 2
    assert "or turn the cap off with it (train.ema_rampup=0.0)" in capsys.readouterr().err
    assert (
        main(["train", "--preset", "fashion_resnet_fast", "train.model_ema_kimg=0", "train.ema_rampup=0", "--dry-run"])
        == 0
    )


def test_a_resumed_run_scores_a_checkpoint_at_a_phase_start_at_the_side_its_last_step_trained(tmp_path):
    # Found from outside: an evaluation the resume made again, of the checkpoint at the 16 px phase's start, was
    # scored at 16 px; the run left alone scored it at 12, where its last step trained.
    over = {"data.schedule": "0:12:64,0.128:16:64", "train.kimg": 0.256, "checkpoint.every_kimg": 0.128}
    over |= {"eval.every_kimg": 0.128, "sample.every_kimg": 0, "checkpoint.keep": 10}
    whole = bigbatch.train(tiny(**over), run_dir=tmp_path / "whole", quiet=True)

    again = shutil.copytree(whole, tmp_path / "again", ignore=shutil.ignore_patterns(".lock"))
    (again / "checkpoints" / "latest").write_text("000000.128\n")  # (rolled back: its evaluation made again)
    bigbatch.train(tiny(**over), run_dir=again, resume=True, quiet=True)

    def scored(run):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [(r["kimg"], r["eval_resolution"], r["val_top1"]) for r in rows if "val_top1" in r]

    assert scored(again) == scored(whole) and scored(whole)[0][:2] == (0.128, 12)
