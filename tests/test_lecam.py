"""LeCam regularization of D (train.lecam; StudioGAN's lecam_lambda): the authors' penalty on moving averages of D's
outputs that every micro-batch of a step reads alike (world-size invariance: tests/test_distributed.py's diffaugment
variant), kept in checkpoints, so a resumed run ends with the bits of one left alone."""

import json

import pytest
import torch
from safetensors.torch import load_file

import bigbatch
from bigbatch.cli import main
from bigbatch.tasks.gan.losses import LeCam


def test_the_penalty_is_studiogans_on_averages_that_move_after_their_start():
    lecam = LeCam(0.3, 0.9, start=2)
    real, fake = torch.tensor([1.0, -2.0, 3.0]), torch.tensor([-1.0, 0.5, 2.0])
    assert lecam.penalty(real, fake, 0) is None  # (no averages before a step's)
    for iteration, (d_real, d_fake) in enumerate(((1.0, -1.0), (2.0, -2.0))):  # before the start: means as they are
        lecam.observe(d_real, d_fake, iteration)
        assert lecam.means == (d_real, d_fake) and lecam.penalty(real, fake, iteration) is None
    lecam.observe(float("inf"), 0.0, 2)  # (an overflowed step's means: left out)
    lecam.observe(4.0, 0.0, 2)
    assert lecam.means == pytest.approx((0.9 * 2 + 0.1 * 4, 0.9 * -2 + 0.1 * 0))
    assert lecam.penalty(real, fake, 2) is None  # (StudioGAN's: applied after its start iteration)
    ema_real, ema_fake = lecam.means
    want = torch.relu(real - ema_fake).square().mean() + torch.relu(ema_real - fake).square().mean()
    assert lecam.penalty(real, fake, 3).item() == pytest.approx(want.item(), rel=1e-6)
    again = LeCam(0.3, 0.9, start=2)
    again.load_state_dict(json.loads(json.dumps(lecam.state_dict())))
    assert again.means == lecam.means


SMALL = ["--preset", "digits", "data.resolution=16", "model.ch=8", "model.dim_z=16", "train.batch=8"]
ARGS = [*SMALL, "train.lecam=0.3", "train.lecam_start=1", "sample.every_kimg=0", "eval.every_kimg=0"]
ARGS += ["train.log_every_kimg=0.032", "checkpoint.every_kimg=0.032"]


def test_a_run_with_lecam_logs_its_penalty_and_resumes_to_the_bits_of_one_left_alone(tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert main(["train", *ARGS, "train.kimg=0.064", "--run-dir", str(whole)]) == 0
    rows = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    assert all(r["lecam_penalty"] > 0 for r in rows) and "loss_D" in rows[0]
    assert main(["train", *ARGS, "train.kimg=0.032", "--run-dir", str(parts)]) == 0
    assert main(["train", *ARGS, "train.kimg=0.064", "--run-dir", str(parts), "--resume"]) == 0
    for net in ("G", "D", "G_ema"):
        a, b = (load_file(run / "checkpoints" / "000000.064" / f"{net}.safetensors") for run in (whole, parts))
        assert all(torch.equal(a[k], b[k]) for k in a), net
    off = tmp_path / "off"
    assert main(["train", *ARGS, "train.lecam=0", "train.kimg=0.064", "--run-dir", str(off)]) == 0
    a, b = (load_file(run / "checkpoints" / "000000.064" / "D.safetensors") for run in (whole, off))
    assert not all(torch.equal(a[k], b[k]) for k in a)  # (the penalty trains D)


def test_lecam_settings_are_checked(capsys):
    for override, said in (
        ({"train.lecam": -1.0}, "'train.lecam' must be a finite number >= 0 (0 = off), got -1.0"),
        ({"train.lecam_decay": 1.0}, "'train.lecam_decay' must be a fraction in [0, 1), got 1.0"),
    ):
        with pytest.raises(bigbatch.BigbatchError) as e:
            bigbatch.preset("digits").override(override)
        assert said in str(e.value)
    classify = ["--preset", "fashion_resnet", "data.path=builtin:digits", "data.val_path=", "train.lecam=0.3"]
    assert main(["train", *classify, "--dry-run"]) == 2
    assert "train.lecam" in capsys.readouterr().err


def test_lecam_settings_that_change_nothing_are_said(capsys):
    # Found from outside: a run shorter than lecam_start's 1,000 iterations never applied the penalty, and a
    # lecam_decay without train.lecam was taken without a word.
    assert main(["train", *SMALL, "train.kimg=0.32", "train.lecam=0.3", "--dry-run"]) == 0
    said = "train.lecam_start = 1000 iterations is not before the run's end (40): the LeCam penalty never applies"
    assert said in capsys.readouterr().err
    assert main(["train", *SMALL, "train.kimg=0.32", "train.lecam_decay=0.9", "--dry-run"]) == 0
    assert "train.lecam_decay given, and train.lecam is 0: LeCam is off" in capsys.readouterr().err
