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
    # (memory was blamed: 39 MiB of 21 GiB); and said by the dry run, before any probe (found from outside: only
    # once probed, by the run)
    from bigbatch.batching import warn_under_group

    monkeypatch.setattr("bigbatch.errors._WARNED", set())
    over = ["train.batch=8", "model.options.mbstd_group=3", "train.micro_batch=auto"]
    assert main(["train", "--preset", "stylegan2_cifar", *over, "--dry-run"]) == 0
    err = capsys.readouterr().err
    said = "micro_batch auto settles under stylegan2's D group of 3 images for its standard deviation, which then "
    said += "groups fewer: no multiple of 3 divides the batch share of 8, so the step depends on the memory budget; "
    assert said + "give a train.batch of a multiple of 3, or set model.options.mbstd_group to a divisor of 8" in err
    cfg = bigbatch.preset("stylegan2_cifar").override({"train.batch": 8, "model.options.mbstd_group": 3})
    cfg = cfg.override({"train.micro_batch": "auto"})
    warn_under_group(cfg, 2)  # (once probed: not said again)
    assert capsys.readouterr().err == ""


def test_weights_given_to_the_classifier_extractor_are_refused(tmp_path, capsys):
    assert main(["train", *BASE, "--run-dir", str(tmp_path / "r"), "--quiet"]) == 0
    argv = ["eval", str(tmp_path / "r"), "--metrics", "fid", "--n", "16", "--extractor", "classifier"]
    assert main([*argv, "--weights", str(tmp_path / "nowhere.pt")]) == 2  # (taken without a word, and scored)
    assert "--weights is an Inception weights file, and --extractor classifier scores with" in capsys.readouterr().err


def test_a_biggan_pytorch_users_slips_are_said(tmp_path, capsys, monkeypatch):
    # Found from outside, each: attention on a block narrower than 8 channels was an IndexError; --G_attn 64 carried
    # to a 32 px run was dropped unsaid; ortho was inside loss_D and loss_G; FreezeD without a pretrained D, and an
    # EMA that starts after the run ends, were silent.
    import json

    small = ["--preset", "digits", "model.name=biggan", "train.batch=32", "sample.every_kimg=0", "--dry-run"]
    assert main(["train", *small, "data.resolution=128", "model.ch=4"]) == 2
    assert "model.options.d_attn = 64: attention needs at least 8 channels" in capsys.readouterr().err
    assert main(["train", *small, "model.ch=8", "model.options.g_attn=64"]) == 2
    assert "g_attn = 64: no block of this 32 px biggan puts out 64 px" in capsys.readouterr().err
    rows = {}
    for name, extra in (("plain", []), ("ortho", ["train.g_ortho=1", "train.d_ortho=1", "train.freeze_d=1"])):
        argv = [*small[:-1], "model.ch=8", "train.kimg=0.032", "train.log_every_kimg=0.032", *extra]
        assert main(["train", *argv, "train.ema_start_kimg=5", "--run-dir", str(tmp_path / name), "--quiet"]) == 0
        rows[name] = json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[0])
        err = capsys.readouterr().err
        assert "train.ema_start_kimg = 5 is not before the run's end (train.kimg = 0.032)" in err
        assert ("train.freeze_d = 1 freezes D's first blocks at their random start" in err) == (name == "ortho")
        # (and the dry run of the same, which said neither: found from outside)
        assert main(["train", *argv, "train.ema_start_kimg=5", "--dry-run"]) == 0
        err = capsys.readouterr().err
        assert "train.ema_start_kimg = 5 is not before the run's end (train.kimg = 0.032)" in err
        assert ("train.freeze_d = 1 freezes D's first blocks at their random start" in err) == (name == "ortho")
    plain, ortho = rows["plain"], rows["ortho"]
    assert ortho["loss_D"] == plain["loss_D"] and ortho["ortho_D"] > 0 and ortho["ortho_G"] > 0
    assert "ortho_D" not in plain
    # A run saved with g_attn = 64 on a model of no 64 px block (as bigbatch took it before) still loads and samples.
    with monkeypatch.context() as before:
        before.setattr("bigbatch.tasks.gan.checks.check_attention_given", lambda *a: None)
        argv = [*small[:-1], "model.ch=8", "train.kimg=0.032", "model.options.g_attn=64", "--quiet"]
        assert main(["train", *argv, "--run-dir", str(tmp_path / "old")]) == 0
    assert main(["sample", str(tmp_path / "old"), "--n", "2", "--out", str(tmp_path / "s.png")]) == 0


def test_a_dcgan_fine_tuned_onto_another_number_of_classes_is_told_why_in_classes(tmp_path, capsys):
    # Found from outside: the refusal named a tensor's shape, (30, 32, 4, 4) against (23, 32, 4, 4).
    from test_codecs import photos

    bigbatch.data.prepare(str(photos(tmp_path / "src", n=8)), str(tmp_path / "two.h5"), 16, workers=0)
    small = ["--preset", "digits", "data.resolution=16", "model.ch=4", "train.batch=8", "sample.every_kimg=0"]
    assert main(["train", *small, "train.kimg=0.008", "--run-dir", str(tmp_path / "ten"), "--quiet"]) == 0
    argv = ["train", *small, f"data.path={tmp_path / 'two.h5'}", "--init-from", str(tmp_path / "ten")]
    assert main([*argv, "--run-dir", str(tmp_path / "tuned")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "was trained on 10 classes and this data set has 2: dcgan feeds the class" in err
    # ... and where model.conditional is what differs, that (found from outside: "this data set has 0", of digits).
    unconditional = ["train", *small, "model.conditional=false", "--init-from", str(tmp_path / "ten")]
    assert main([*unconditional, "--run-dir", str(tmp_path / "u")]) == 2
    err = capsys.readouterr().err
    assert "was trained on 10 classes and this run is unconditional (model.conditional = false, or data" in err, err
    assert "so it fine-tunes with model.conditional = true only" in err
