"""Consistency regularization of a GAN (train.cr_real, cr_fake, zcr_d, zcr_g; StudioGAN's CR, bCR, zCR): the papers'
transforms, drawn per step (world-size invariance: tests/test_distributed.py's ada variant), penalties that train,
logged apart from D's and G's adversarial losses, and a resumed run that ends with the bits of one left alone."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import bigbatch
from bigbatch.cli import main
from bigbatch.tasks.gan import consistency


def test_cr_copies_are_flipped_and_shifted_with_the_border_reflected():
    x = torch.randn(64, 3, 16, 16)
    params = consistency.draw(64, 16, 0, 0, 5, 0)
    flipped, shift = params[:, 0], params[:, 1:].long()
    assert set(flipped.tolist()) == {0.0, 1.0} and 16 < flipped.sum() < 48  # half of them, about
    assert shift.min() == -2 and shift.max() == 2  # (up to 1/8 of 16 px, every shift drawn)
    got = consistency.apply(x, params.numpy())
    for i in range(64):  # StudioGAN's: a reflect-padded copy, cut at the shift
        image = x[i].flip(2) if flipped[i] else x[i]
        padded = np.pad(image.numpy(), ((0, 0), (2, 2), (2, 2)), mode="reflect")
        dy, dx = shift[i].tolist()
        assert np.array_equal(got[i].numpy(), padded[:, 2 + dy : 18 + dy, 2 + dx : 18 + dx]), i
    assert torch.equal(consistency.draw(64, 16, 0, 0, 5, 0), params)
    assert not torch.equal(consistency.draw(64, 16, 0, 0, 5, 1), params)  # (the fake images' own)


SMALL = ["--preset", "digits", "data.resolution=16", "model.ch=8", "model.dim_z=16", "train.batch=8"]
ICR = ["train.cr_real=10", "train.cr_fake=10", "train.zcr_d=20", "train.zcr_g=0.5"]
ARGS = [*SMALL, *ICR, "sample.every_kimg=0", "eval.every_kimg=0", "train.log_every_kimg=0.032"]
ARGS += ["checkpoint.every_kimg=0.032"]


def test_icr_logs_its_penalties_and_resumes_to_the_bits_of_one_left_alone(tmp_path, capsys):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert main(["train", *ARGS, "train.kimg=0.064", "--run-dir", str(whole)]) == 0
    rows = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    for key in ("cr_real_penalty", "cr_fake_penalty", "zcr_d_penalty", "zcr_g_distance"):
        assert all(r[key] > 0 for r in rows), key
    assert all({"loss_D", "loss_G"} <= r.keys() for r in rows)  # (the adversarial losses, apart)
    assert main(["info", str(whole)]) == 0
    assert "CR real 10, CR fake 10, zCR D 20 G 0.5 radius 0.05" in capsys.readouterr().out
    assert main(["train", *ARGS, "train.kimg=0.032", "--run-dir", str(parts)]) == 0
    assert main(["train", *ARGS, "train.kimg=0.064", "--run-dir", str(parts), "--resume"]) == 0
    for net in ("G", "D", "G_ema"):
        a, b = (load_file(run / "checkpoints" / "000000.064" / f"{net}.safetensors") for run in (whole, parts))
        assert all(torch.equal(a[k], b[k]) for k in a), net


def test_each_weight_trains_its_own_net(tmp_path):
    def one_iteration(name, *changes):
        run = tmp_path / name
        args = [*ARGS, "train.kimg=0.008", "checkpoint.every_kimg=0.008", *changes, "--run-dir", str(run)]
        assert main(["train", *args]) == 0
        return {net: load_file(run / "checkpoints" / "000000.008" / f"{net}.safetensors") for net in ("G", "D")}

    def equal(a, b):  # (the weights: G's BatchNorm statistics count the images of nearby latents too)
        return all(torch.equal(a[k], b[k]) for k in a if "running_" not in k and "num_batches" not in k)

    icr = one_iteration("icr")
    for key in ICR:  # its D step comes first: D's weights show D's terms, and G's alone zCR's G term
        off = one_iteration(key, key.split("=")[0] + "=0")
        d_term = not key.startswith("train.zcr_g")
        assert equal(icr["D"], off["D"]) != d_term and not equal(icr["G"], off["G"]), key


def test_consistency_settings_are_checked_and_those_that_change_nothing_said(capsys):
    for override, said in (
        ({"train.cr_real": -1.0}, "'train.cr_real' must be a finite number >= 0 (0 = off), got -1.0"),
        ({"train.zcr_g": float("inf")}, "'train.zcr_g' must be a finite number >= 0 (0 = off), got inf"),
        ({"train.zcr_radius": 0.0}, "'train.zcr_radius' must be a positive number, got 0.0"),
        ({"train.cr_fake": 1e39}, "'train.cr_fake' must be below 3.4e38, float32's largest number, got 1e+39"),
    ):
        with pytest.raises(bigbatch.BigbatchError) as e:
            bigbatch.preset("digits").override(override)
        assert said in str(e.value)
    assert main(["train", *SMALL, "train.zcr_radius=0.03", "--dry-run"]) == 0
    assert "train.zcr_radius given, and train.zcr_d and train.zcr_g are 0: zCR is off" in capsys.readouterr().err
    classify = ["--preset", "fashion_resnet", "data.path=builtin:digits", "data.val_path=", "train.cr_real=10"]
    assert main(["train", *classify, "--dry-run"]) == 2
    assert "train.cr_real" in capsys.readouterr().err


def test_zcr_moves_only_the_latents_of_a_g_that_draws_per_image(tmp_path):
    # Found from outside: StyleGAN2's G(z + n) took style mixing and noise of its own, keyed by its latents: a
    # distance 330x that of the latents' move; with G(z)'s draws, a nudge of 1e-6 moves the images by about nothing.
    stylegan2 = ["model.name=stylegan2", "model.ch=2", "model.options={ch_max=16, w_dim=16, map_layers=2}"]
    args = [*SMALL, *stylegan2, "train.loss=ns", "train.zcr_g=0.5", "train.zcr_radius=1e-6", "train.kimg=0.008"]
    run = tmp_path / "run"
    args += ["sample.every_kimg=0", "eval.every_kimg=0", "train.log_every_kimg=0.008", "--run-dir", str(run)]
    assert main(["train", *args]) == 0
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert 0 < row["zcr_g_distance"] < 1e-9
