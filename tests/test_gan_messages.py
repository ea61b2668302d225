"""A StyleGAN2-ADA user's slips, each named in one line by the key and value at fault (found from outside)."""

import pytest

import bigbatch
from bigbatch.cli import main

BASE = ["--preset", "stylegan2_cifar", "data.path=builtin:digits", "data.resolution=16", "model.ch=2"]
BASE += ["train.kimg=0.016", "eval.every_kimg=0", "sample.every_kimg=0", "train.batch=8"]


@pytest.mark.parametrize(
    "over, said",
    [
        ("model.options.map_lr_mul=0", "stylegan2 option map_lr_mul must be > 0, got 0"),
        ("model.options.w_avg_beta=2", "stylegan2 option w_avg_beta must be in [0, 1), got 2"),
        ("model.options.mixing=1.5", "stylegan2 option mixing must be in [0, 1], got 1.5"),
        ("augment.policy=bgc,blit", "names 'blit' (twice: bgc holds it)"),
        ("augment.policy=bg,bgc", "names 'blit' (twice: bg and bgc hold it)"),
    ],
)
def test_a_bad_option_is_named_with_its_value(tmp_path, capsys, over, said):
    assert main(["train", *BASE, over, "--run-dir", str(tmp_path / "r"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err, err


def test_a_group_no_micro_batch_can_reach_says_the_batch_is_why(capsys, monkeypatch):
    from bigbatch.batching import warn_under_group

    monkeypatch.setattr("bigbatch.errors._WARNED", set())
    cfg = bigbatch.preset("stylegan2_cifar").override({"train.batch": 8, "model.options.mbstd_group": 3})
    warn_under_group(cfg.override({"train.micro_batch": "auto"}), 2)  # (memory was blamed: 39 MiB of 21 GiB)
    err = capsys.readouterr().err
    assert "no multiple of 3 divides the batch share of 8; give a train.batch of a multiple of 3, or set" in err


def test_weights_given_to_the_classifier_extractor_are_refused(tmp_path, capsys):
    assert main(["train", *BASE, "--run-dir", str(tmp_path / "r"), "--quiet"]) == 0
    argv = ["eval", str(tmp_path / "r"), "--metrics", "fid", "--n", "16", "--extractor", "classifier"]
    assert main([*argv, "--weights", str(tmp_path / "nowhere.pt")]) == 2  # (taken without a word, and scored)
    assert "--weights is an Inception weights file, and --extractor classifier scores with" in capsys.readouterr().err
