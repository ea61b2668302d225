"""The classify task: the fast-ImageNet recipe's parts (phases of size, batch and lr; warm-up and decay
scaled to the batch; no decay on norms and biases; rectangular validation), held-out splits, and runs
on the same loop as the GAN: accuracy reached, resume inside a phase, 2 processes equal to 1."""

import json
import math
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

import bigbatch
from bigbatch.config import CheckpointConfig, Config, DataConfig, EvalConfig, ModelConfig, SampleConfig, TrainConfig
from bigbatch.data.load import training_data, validation_data
from bigbatch.errors import BigbatchError
from bigbatch.tasks.classify.lr import lr_schedule
from bigbatch.tasks.classify.task import ClassifyTask, param_groups
from bigbatch.tasks.classify.validation import Validation, crop_size, val_batches, val_transform


def tiny(**overrides) -> Config:
    """ResNet-8 (width 8) on digits at 16 px, 20% held out: a few seconds per epoch on a CPU."""
    cfg = Config(
        name="cls",
        task="classify",
        data=DataConfig(path="builtin:digits", resolution=16, val_fraction=0.2),
        model=ModelConfig(name="resnet_cifar", ch=8, options={"depth": 8}),
        train=TrainConfig(kimg=0.512, batch=64, micro_batch=32, lr=0.2, lr_batch=64, log_every_kimg=0.128),
        checkpoint=CheckpointConfig(every_kimg=0.256),
        sample=SampleConfig(every_kimg=0.512, n=16),
        eval=EvalConfig(every_kimg=0.256, batch_size=100),
    )
    return cfg.override(overrides)


# ---- the learning rate ------------------------------------------------------------------------
def test_warmup_then_decay_at_chosen_steps():
    cfg = tiny(**{"train.kimg": 10, "train.warmup_kimg": 1, "train.lr_decay": "cosine", "train.lr": 0.4})
    lr = lr_schedule(cfg)  # batch 64 at lr_batch 64: no scaling
    assert lr(0) == pytest.approx(0.4 / 1000)  # the first step already moves
    assert lr(499) == pytest.approx(0.2)
    assert lr(1000) == pytest.approx(0.4)
    assert lr(5500) == pytest.approx(0.2)  # half-way through the decay: cos(pi / 2)
    assert lr(10_000) == pytest.approx(0.0, abs=1e-12)
    linear = lr_schedule(cfg.override({"train.lr_decay": "linear"}))
    assert linear(3250) == pytest.approx(0.3)
    step = lr_schedule(cfg.override({"train.lr_decay": "step", "train.lr_steps": [4, 8], "train.warmup_kimg": 0}))
    assert [step(n) for n in (0, 3999, 4000, 8000)] == pytest.approx([0.4, 0.4, 0.04, 0.004])


def test_a_run_shorter_than_its_step_decay_or_phases_says_so(capsys, monkeypatch, tmp_path):
    """Found from outside: a preset's step decay at 300 and 450 kimg and progressive resizing at 60 kimg, in a run
    shortened below them, trained at the full rate (and the small size) throughout, without a word."""
    from bigbatch.batching import replicator_for
    from bigbatch.data.load import training_data
    from bigbatch.tasks import build_task

    def warned(**over):
        monkeypatch.setattr("bigbatch.errors._WARNED", set())
        cfg = tiny(**over)
        build_task(cfg, replicator_for(cfg), training_data(cfg), run=tmp_path, resumed_at=None, quiet=True)
        return capsys.readouterr().err  # (a run's: lr-find and show-batch, which build none, say nothing of it)

    said = warned(**{"train.lr_decay": "step", "train.lr_steps": [0.256, 0.512, 3.0]})
    assert "train.lr_steps 0.512, 3 kimg lie at or past the run's end (train.kimg 0.512)" in said
    said = warned(**{"data.schedule": "0:16:64,0.256:16:64,0.6:24:64"})
    assert "data.schedule's phases from kimg 0.6 (24 px, batch 64) begin at or past the run's end" in said
    assert warned(**{"train.lr_decay": "step", "train.lr_steps": [0.256]}) == ""


def test_lr_scales_with_the_batch_of_the_phase():
    cfg = tiny(**{"data.schedule": "0:16:64,1:16:128", "train.lr_batch": 256, "train.lr": 1.0})
    lr, sqrt = lr_schedule(cfg), lr_schedule(cfg.override({"train.lr_scale": "sqrt"}))  # (timm's for Adam's family)
    assert (lr(0), lr(1024), sqrt(0), sqrt(1024)) == pytest.approx((0.25, 0.5, 0.5, 0.5**0.5))


def test_fast_imagenet_preset_has_the_published_rates():
    cfg = bigbatch.preset("imagenet_resnet50_fast")
    lr, epoch = lr_schedule(cfg), 1_281_167
    assert lr(0) == pytest.approx(1.0)
    assert lr(round(6.999 * epoch)) == pytest.approx(2.0, rel=1e-3)  # the end of the warm-up
    begins = bigbatch.data.schedule.schedule_of(cfg).begins()
    assert lr(begins[2]) == pytest.approx(0.4375) and lr(begins[4]) == pytest.approx(0.0025)
    assert [p.resolution for p in bigbatch.data.schedule.schedule_of(cfg).phases] == [128, 128, 224, 224, 288]
    assert [p.batch for p in bigbatch.data.schedule.schedule_of(cfg).phases] == [4096, 4096, 1792, 1792, 1024]
    # A batch override scales every phase, as the published schedule's ratios, instead of being ignored.
    smaller = bigbatch.data.schedule.schedule_of(cfg.override({"train.batch": 256}))
    assert [p.batch for p in smaller.phases] == [1024, 1024, 448, 448, 256]


def test_a_frozen_body_with_nothing_to_load_or_frozen_throughout_is_said(capsys, monkeypatch):
    # Found from outside: train.freeze_kimg without train.init_from kept a random body frozen without a word.
    monkeypatch.setattr("bigbatch.errors._WARNED", set())  # (said once a process: maybe by another test)
    tiny(**{"train.freeze_kimg": 0.1})
    assert "there is no train.init_from to load it: it stays random" in capsys.readouterr().err
    tiny(**{"train.freeze_kimg": 2.0, "train.kimg": 1.0, "train.init_from": "r18.pth"})
    assert "lasts the whole run of 1 kimg: the body never trains" in capsys.readouterr().err


def test_a_phase_batch_may_be_a_multiple_of_train_batch():
    cfg = tiny(**{"train.batch": 32, "data.schedule": "0:12:2x,0.256:16:1x"})
    assert [p.batch for p in bigbatch.data.schedule.schedule_of(cfg).phases] == [64, 32]
    with pytest.raises(BigbatchError, match=r"batch '0.3x' of train.batch=32 is 9.6 images, not a whole number"):
        tiny(**{"train.batch": 32, "data.schedule": "0:12:0.3x"})
    with pytest.raises(BigbatchError, match="like '2x', got 'twox'"):
        tiny(**{"data.schedule": "0:12:twox"})


def test_phase_lr_parses_from_the_command_line_and_must_be_all_or_none():
    cfg = tiny(**{"data.schedule": "0:12:64:0.1:0.2,0.256:16:128:0.05"})
    phases = bigbatch.data.schedule.schedule_of(cfg).phases
    assert phases[0].lr == (0.1, 0.2) and phases[1].lr == (0.05, 0.05)
    with pytest.raises(BigbatchError, match="every phase"):
        tiny(**{"data.schedule": "0:12:64:0.1,0.256:16:128"})
    with pytest.raises(BigbatchError, match="warmup_kimg"):
        tiny(**{"data.schedule": "0:12:64:0.1", "train.warmup_kimg": 1})


# ---- parameter groups, config checks ----------------------------------------------------------
def test_no_weight_decay_on_norms_and_biases():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Linear(4, 2))
    decay, exempt = param_groups(model, 1e-4, norm_decay=False)
    assert decay["weight_decay"] == 1e-4 and exempt["weight_decay"] == 0
    assert {id(p) for p in decay["params"]} == {id(model[0].weight), id(model[2].weight)}
    assert {id(p) for p in exempt["params"]} == {
        id(model[0].bias),
        id(model[1].weight),
        id(model[1].bias),
        id(model[2].bias),
    }
    (everything,) = param_groups(model, 1e-4, norm_decay=True)
    assert len(everything["params"]) == 6


@pytest.mark.parametrize(
    "overrides, words",
    [
        ({"train.g_lr": 1e-3}, ["'train.g_lr'", "GAN key"]),
        ({"model.name": "dcgan"}, ["'model.name'", "resnet_cifar"]),
        ({"data.val_fraction": 0}, ["eval.every_kimg", "data.val_path"]),
        ({"eval.best": "fid"}, ["'eval.best'", "val_top1"]),
        ({"data.val_fraction": 1.5}, ["'data.val_fraction'"]),
        ({"data.val_path": "builtin:digits"}, ["'data.val_fraction'", "set one"]),
        # Found from outside: these did nothing, without a word.
        ({"swap.lr": 1.0}, ["'swap.lr'", 'task = "swap" only']),
        ({"train.optimizer": "adamw", "train.momentum": 0.5}, ["'train.momentum'", "reads train.betas"]),
        # (found from outside: a preset's key was to be "removed"; the reset is named)
        (
            {"train.nesterov": False, "train.optimizer": "adamw"},
            ["'train.nesterov'", '"adamw"', "(train.nesterov=true)"],
        ),
        ({"train.betas": [0.5, 0.9]}, ["'train.betas'", '"sgd"', "reads train.momentum"]),
        ({"train.ema_rampup": 0.05}, ["'train.ema_rampup'", "train.model_ema_kimg"]),
        ({"train.model_ema_kimg": -1}, ["'train.model_ema_kimg'", ">= 0"]),
    ],
)
def test_classify_config_mistakes_name_the_key(overrides, words):
    with pytest.raises(BigbatchError) as e:
        tiny(**overrides)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_adamw_takes_pytorchs_betas_unless_they_are_set(tmp_path):
    # train.betas's default is BigGAN's Adam's (0.0, 0.999): a classifier's AdamW (finetune_resnet50's) had no momentum.
    def betas(run_dir, **overrides):
        cfg = tiny(**{"train.optimizer": "adamw", "train.kimg": 0.064, **overrides})
        bigbatch.train(cfg, run_dir=run_dir, quiet=True)
        state = torch.load(run_dir / "checkpoints" / "000000.064" / "state.pt", weights_only=True)
        return {tuple(g["betas"]) for g in state["opt"]["param_groups"]}

    assert betas(tmp_path / "default") == {(0.9, 0.999)}
    assert betas(tmp_path / "set", **{"train.betas": [0.5, 0.99]}) == {(0.5, 0.99)}


def test_a_warm_up_as_long_as_the_run_is_warned_about(tmp_path, capsys):
    # Found from outside: a preset's 30 kimg warm-up in a 0.256 kimg run trained at <1% of the rate, silently.
    bigbatch.train(tiny(**{"train.warmup_kimg": 1, "train.kimg": 0.064}), run_dir=tmp_path / "short", quiet=True)
    assert "train.warmup_kimg 1 is not shorter than the run (train.kimg 0.064)" in capsys.readouterr().err
    # ... and so are images stored smaller than the run trains them (upscaled, as a GAN refuses outright).
    bigbatch.data.prepare("builtin:digits", str(tmp_path / "d8.h5"), 8, limit=100, workers=0)
    up = tiny(**{"data.path": str(tmp_path / "d8.h5"), "train.kimg": 0.064})
    bigbatch.train(up, run_dir=tmp_path / "up", quiet=True)
    assert "d8.h5 (train) holds 8px images, and the run trains at up to 16px" in capsys.readouterr().err


def test_random_resized_crops_of_square_images_are_torchvisions():
    # Found from outside: a box too wide or tall for the image was clipped to it, not drawn again as
    # torchvision's RandomResizedCrop does (ten tries, then the whole image): crops came out smaller.
    from bigbatch.data.crops import rrc_box, rrc_draws

    boxes = torch.tensor([rrc_box(1000, 1000, d, 0.35) for d in rrc_draws(0, 0, 20000)], dtype=torch.float64)
    w, h = boxes[:, 2] / 1000, boxes[:, 3] / 1000
    assert float(w.max()) <= 1 and float(h.max()) <= 1
    assert 0.75 - 3e-3 <= float((w / h).min()) and float((w / h).max()) <= 4 / 3 + 3e-3  # (whole pixels)
    rng, areas = np.random.default_rng(0), []
    for _ in range(20000):  # torchvision's loop, on a square image of side 1
        for _ in range(10):
            a, r = rng.uniform(0.35, 1), math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
            if math.sqrt(a * r) <= 1 and math.sqrt(a / r) <= 1:
                areas.append(a)
                break
        else:
            areas.append(1.0)
    assert float((w * h).mean()) == pytest.approx(np.mean(areas), abs=0.005)


def test_a_gan_refuses_classifier_keys():
    with pytest.raises(BigbatchError, match="'train.lr' is not read by the GAN"):
        bigbatch.preset("digits").override({"train.lr": 0.5})
    with pytest.raises(BigbatchError, match="'swap.random_warp' is read by task = \"swap\" only"):
        bigbatch.preset("digits").override({"swap.random_warp": False})
    with pytest.raises(BigbatchError, match="'train.model_ema_kimg' is not read by the GAN"):
        bigbatch.preset("digits").override({"train.model_ema_kimg": 1.0})
    with pytest.raises(BigbatchError, match="power of two"):
        bigbatch.preset("digits").override({"data.resolution": 28})


# ---- held-out splits ----------------------------------------------------------------------------
def test_val_fraction_holds_out_the_same_images_whatever_the_seed():
    a, b = tiny(), tiny(**{"train.seed": 5})
    train_a, val_a = training_data(a), validation_data(a)
    train_b, val_b = training_data(b), validation_data(b)
    assert torch.equal(val_a.indices, val_b.indices) and torch.equal(train_a.indices, train_b.indices)
    assert len(val_a) == math.ceil(1797 * 0.2) and len(train_a) + len(val_a) == 1797
    assert not set(val_a.indices.tolist()) & set(train_a.indices.tolist())
    images, labels = val_a.get(torch.tensor([0, 1]))
    parent = train_a.data.get(val_a.indices[:2])
    assert torch.equal(images, parent[0]) and torch.equal(labels, parent[1])


def test_a_held_out_split_hands_the_device_the_crops_of_its_own_images(tmp_path):
    # Found by bench/gpu_check.py: data.decode = "gpu" with data.val_fraction stopped at the first batch
    # ('Subset' object has no attribute 'crop_boxes'): the training split did not pass the encoded reading on.
    from test_codecs import photos

    from bigbatch.data import H5Data, prepare
    from bigbatch.data.loader import Step, read_batch
    from bigbatch.data.split import holdout

    prepare(str(photos(tmp_path / "src", n=8)), str(tmp_path / "d.h5"), 64, workers=0, codec="jpeg", crop="none")
    data = H5Data(tmp_path / "d.h5")
    train, _ = holdout(data, 0.25)
    for scale in (0.35, 0.0):  # random-resized crops cut before decoding, and whole images' center squares
        request = Step(nimg=0, batch=4, resolution=32, offset=0, indices=torch.tensor([0, 2, 3, 1]))
        split = read_batch(train, request, xflip=True, seed=1, crop_scale=scale, on_device=True)
        parent = read_batch(data, request._replace(indices=train.indices[request.indices]), True, 1, scale, True)
        assert [bytes(d) for d in split.images.data] == [bytes(d) for d in parent.images.data]
        assert split.images.boxes == parent.images.boxes and torch.equal(split.labels, parent.labels)


# ---- rectangular validation ---------------------------------------------------------------------
def test_rectangular_crops_keep_the_aspect_ratio_with_the_long_side_a_multiple_of_8():
    assert crop_size(300, 400, 224, rect=True) == (224, 296)  # 224 * 4/3 = 298.7 -> 296
    assert crop_size(400, 300, 224, rect=True) == (296, 224)
    assert crop_size(300, 400, 224, rect=False) == (224, 224)
    x = torch.randint(0, 256, (3, 60, 80, 3), dtype=torch.uint8)
    out = val_transform(x, 32, crop=1.14, rect=True)
    assert out.shape == (3, 3, 32, 40) and out.min() >= -1 and out.max() <= 1
    square = val_transform(x, 32, crop=1.14, rect=False)
    assert square.shape == (3, 3, 32, 32)
    # The center: a crop of an image whose left half is black and right half white stays balanced.
    half = torch.zeros(1, 64, 64, 3, dtype=torch.uint8)
    half[:, :, 32:] = 255
    assert val_transform(half, 32, crop=1.5, rect=False).mean().abs() < 0.05


def test_validation_batches_stay_within_a_bucket_in_file_order():
    batches = val_batches([5, 0, 3], 2)
    assert [b.tolist() for b in batches] == [[0, 1], [2, 3], [4], [5, 6], [7]]


def test_rectangular_validation_of_bucketed_data(tmp_path):
    from PIL import Image

    from bigbatch.data import load_data, prepare

    for cls, size in (("wide", (48, 32)), ("tall", (32, 48)), ("square", (40, 40))):
        (tmp_path / "src" / cls).mkdir(parents=True)
        for i in range(5):
            Image.new("RGB", size, (40 * i, 100, 200)).save(tmp_path / "src" / cls / f"{i}.png")
    prepare(str(tmp_path / "src"), str(tmp_path / "val.h5"), resolution=16, buckets=True, workers=0)
    data = load_data(str(tmp_path / "val.h5"), 16)
    shapes = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            shapes.append(tuple(x.shape[-2:]))
            return torch.zeros(len(x), 3)

    # Stored at about 16x16 pixels each (14x20, 16x16, 20x14), validated at 32: the short side 32, the
    # long side 32 x 20/14 = 45.7 floored to a multiple of 8.
    scores = Validation(data, lambda: 32, 4, 1.14, True, "fp32", torch.device("cpu"))(Probe())
    assert scores["val_top1"] == pytest.approx(100 / 3)  # all predicted class 0: one class in three
    assert "val_top5" not in scores  # (always 100 of 3 classes: left out, as eval leaves it; found from outside)
    # Portrait first, then square, then landscape (file order), each batch of one shape.
    assert shapes == [(40, 32), (40, 32), (32, 32), (32, 32), (32, 40), (32, 40)]


def test_training_refuses_validation_images_of_other_classes_and_bucketed_training_images(tmp_path, capsys):
    # Found from outside: a data.val_path of other classes trained to the end with val_top1 0 (or, with fewer
    # classes in the run, a traceback at the first evaluation), and picked checkpoints/best by it.
    from bigbatch.cli import main
    from bigbatch.data import prepare

    for folder, classes in (("train", ("blue", "green", "red")), ("val", ("green", "red"))):
        for cls in classes:
            (tmp_path / folder / cls).mkdir(parents=True)
            for i in range(4):
                Image.new("RGB", (20 + 4 * i, 16), (40 * i, 100, 200)).save(tmp_path / folder / cls / f"{i}.png")
        prepare(str(tmp_path / folder), str(tmp_path / f"{folder}.h5"), resolution=16, workers=0)
    prepare(str(tmp_path / "train"), str(tmp_path / "buckets.h5"), resolution=16, buckets=True, workers=0)
    over = ["model.name=resnet_cifar", "model.ch=8", "model.options.depth=8", "train.batch=8", "train.kimg=0.016"]
    cases = [
        (
            f"data.val_path={tmp_path / 'val.h5'}",
            "val.h5 has other classes than data.path",
            "number 0: 'green' here, 'blue' in data.path",
        ),
        ("data.val_path=builtin:digits", "builtin:digits has other classes", "data.val_fraction=0.1"),
    ]
    for val, *words in cases:
        code = main(["train", "--preset", "fashion_resnet_fast", f"data.path={tmp_path / 'train.h5'}", val, *over,
                     "data.resolution=16", "data.schedule=[]", "--run-dir", str(tmp_path / "run")])  # fmt: skip
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and all(w in err for w in words), err
    code = main(["train", "--preset", "fashion_resnet_fast", f"data.path={tmp_path / 'buckets.h5'}", *over,
                 "data.val_path=", "data.val_fraction=0.25", "data.resolution=16", "data.schedule=[]",
                 "--run-dir", str(tmp_path / "run")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "holds images of several shapes (prepare --buckets)" in err
    assert not (tmp_path / "run").exists()  # refused before anything was written
    val = ["data.val_path=", "data.val_fraction=0.25"]
    for preset, more in [("fashion_resnet_fast", val), ("digits", [])]:  # found by review: a GAN's dry run passed
        code = main(["train", "--preset", preset, "--dry-run", f"data.path={tmp_path / 'buckets.h5'}",
                     "data.resolution=16", "data.schedule=[]", *more])  # fmt: skip
        err = capsys.readouterr().err
        assert code == 2 and "buckets.h5 holds images of several shapes (prepare --buckets)" in err, err
    # Not scored while training (eval.every_kimg = 0): trained, and said at its start (`eval` would refuse it after).
    code = main(["train", "--preset", "fashion_resnet_fast", f"data.path={tmp_path / 'train.h5'}", *over,
                 f"data.val_path={tmp_path / 'val.h5'}", "eval.every_kimg=0", "data.resolution=16", "data.schedule=[]",
                 "--run-dir", str(tmp_path / "run"), "--quiet"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0 and "val.h5 has other classes than data.path" in err and "training goes on" in err, err


# ---- whole runs -------------------------------------------------------------------------------
def rows(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_tiny_run_on_digits_learns_the_classes(tmp_path):
    cfg = tiny(**{"train.kimg": 8, "eval.every_kimg": 4, "checkpoint.every_kimg": 8, "train.log_every_kimg": 2})
    cfg = cfg.override({"train.warmup_kimg": 1, "train.lr_decay": "cosine", "model.options.zero_init_residual": True})
    run = bigbatch.train(cfg, run_dir=tmp_path / "run", quiet=True)
    scores = [r for r in rows(run) if "val_top1" in r]
    assert [r["kimg"] for r in scores] == [4.032, 8.0]
    assert scores[-1]["val_top1"] > 90 and scores[-1]["val_top5"] > 99 and scores[-1]["val_loss"] < 0.4
    train_rows = [r for r in rows(run) if "loss" in r]
    assert all({"lr", "train_top1", "grad_norm", "seconds"} <= set(r) for r in train_rows)
    best = json.loads((run / "checkpoints" / "best" / "meta.json").read_text())
    assert best["best"]["metric"] == "val_top1"
    assert list((run / "samples").glob("predictions-*.png"))


PHASES = {"data.schedule": "0:12:32,0.256:16:64", "train.kimg": 0.768, "checkpoint.every_kimg": 0.384}


def test_phases_change_size_and_batch_and_resume_inside_a_phase_is_bit_identical(tmp_path, monkeypatch):
    # The average resumes too, with its BatchNorm statistics re-estimated at each evaluation.
    cfg = tiny(**PHASES, **{"train.model_ema_kimg": 0.2, "train.ema_rampup": 0.5, "eval.standing_stats": 2})
    whole = bigbatch.train(cfg, run_dir=tmp_path / "whole", quiet=True)
    seen = []
    step = ClassifyTask.step

    def step_then_signal(self, feed):
        out = step(self, feed)
        seen.append(self.resolution)
        if feed.nimg == 512:  # inside phase 1 (from 256 images), between checkpoints
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(ClassifyTask, "step", step_then_signal)
    with pytest.raises(bigbatch.Stopped) as stopped:
        bigbatch.train(cfg, run_dir=tmp_path / "part", quiet=True)
    assert ((part := stopped.value.run) / "checkpoints" / "000000.512").is_dir()
    assert seen[:9] == [12] * 8 + [16]  # 8 steps of 32 at 12 px, then steps of 64 at 16 px
    monkeypatch.setattr(ClassifyTask, "step", step)
    bigbatch.train(cfg, run_dir=part, resume=True, quiet=True)
    for name in ("model.safetensors", "model_ema.safetensors"):
        a = (whole / "checkpoints" / "000000.768" / name).read_bytes()
        b = (part / "checkpoints" / "000000.768" / name).read_bytes()
        assert a == b, name
    plan = [r["batch"] for r in rows(whole) if "batch" in r]
    assert plan[0] == 32 and plan[-1] == 64
    # Each row says the side it trained at, each evaluation the side it scored at (found from outside: neither).
    trained = [(r["kimg"], r["resolution"]) for r in rows(whole) if "eval_seconds" not in r]
    assert trained == [(0.128, 12), (0.256, 12), (0.384, 16), (0.512, 16), (0.64, 16), (0.768, 16)]
    scored = [(r["kimg"], r["eval_resolution"]) for r in rows(whole) if "eval_seconds" in r]
    assert scored == [(0.256, 12), (0.512, 16), (0.768, 16)]
    # `bigbatch info` says the resolution the run last trained at, and which phase was in force.
    from bigbatch.info import describe_run

    text = describe_run(part / "checkpoints" / "000000.512")
    assert "at 12-16px (data.schedule), last trained at 16px" in text  # (the phases', not an unused data.resolution)
    assert "16px batch 64 from 0.256 kimg (current)" in text and "12px batch 32 from 0 kimg," in text


def cli_train(run_dir, procs, *args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "BIGBATCH_CACHE": str(run_dir) + "-cache"}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "bigbatch.cli", "train"]
    if procs > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}"]
        cmd += ["-m", "bigbatch.cli", "train"]
    cmd += [*args, "--run-dir", str(run_dir)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return load_file(run_dir / "checkpoints" / "000000.256" / "model.safetensors")


def test_two_processes_train_the_weights_of_one(tmp_path):
    # batch 32 = micro 8 x accumulation 2 x 2 processes, or micro 8 x accumulation 4 x 1 process; the
    # crops and flips follow the images' global positions, the phase switch the images seen, dropout's and drop
    # path's masks the micro-batch's place in the step.
    args = ["--preset", "fashion_resnet", "data.path=builtin:digits", "data.val_path=", "data.resolution=16",
            "data.val_fraction=0.2", "data.xflip=true", "train.lr_decay=none",
            "model.name=resnet_cifar", "model.ch=8", "model.options={depth=8, drop_rate=0.3, drop_path_rate=0.3}",
            "train.lr=0.1", "train.crop_scale=0.5", "train.kimg=0.256", "train.batch=32", "train.micro_batch=8",
            "eval.every_kimg=0.256", "eval.batch_size=100", "checkpoint.every_kimg=0.256",
            "data.schedule=0:12:32,0.128:16:32"]  # fmt: skip
    one, two = cli_train(tmp_path / "one", 1, *args), cli_train(tmp_path / "two", 2, *args)
    for k in one:
        if k.rsplit(".", 1)[-1] not in ("running_mean", "running_var", "num_batches_tracked"):
            assert torch.allclose(one[k], two[k], rtol=1e-4, atol=1e-6), k
    val = [next(r for r in rows(tmp_path / d) if "val_top1" in r) for d in ("one", "two")]
    # BatchNorm running statistics (what validation normalises with) are the one thing that depends on
    # how micro-batches were spread over ranks (an average of per-rank running averages): close, not equal.
    assert val[1]["val_top1"] == pytest.approx(val[0]["val_top1"], abs=3)
    assert val[1]["val_loss"] == pytest.approx(val[0]["val_loss"], rel=0.05)


def test_loaded_weights_are_a_plain_classifier(tmp_path):
    run = bigbatch.train(tiny(**{"eval.every_kimg": 0, "data.val_fraction": 0}), run_dir=tmp_path / "r", quiet=True)
    state = load_file(run / "checkpoints" / "000000.512" / "model.safetensors")
    net = bigbatch.models.create_classifier("resnet_cifar", 10, ch=8, depth=8)
    net.load_state_dict(state)
    assert net(torch.zeros(2, 3, 16, 16)).shape == (2, 10)


def test_a_classify_run_scores_images_as_the_fcd_extractor(tmp_path, capsys):
    from bigbatch.cli import main
    from bigbatch.metrics import extract, get_extractor

    run = bigbatch.train(tiny(**{"train.kimg": 2, "checkpoint.every_kimg": 2}), run_dir=tmp_path / "r", quiet=True)
    ext = get_extractor(f"classifier:{run}", device="cpu")
    assert ext.family == "classifier" and ext.resolution == 16 and ext.dims == ext.net.feature_dim
    val = validation_data(tiny())
    images, labels = val.get(torch.arange(len(val)))
    # eval's JSON names which classifier scored (it said "classifier", as for the data set's own).
    np.savez(tmp_path / "a.npz", images[::2].numpy())
    np.savez(tmp_path / "b.npz", images[1::2].numpy())
    argv = ["eval", str(tmp_path / "a.npz"), str(tmp_path / "b.npz"), "--extractor", f"classifier:{run}"]
    capsys.readouterr()
    assert main([*argv, "--metrics", "fid"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["extractor"] == f"classifier:{run}"
    out = extract(ext, images, 128)
    assert out["pool"].shape == (len(val), ext.dims)
    # Its predictions are the run's: the accuracy its last evaluation logged (of checkpoints/best/).
    best = json.loads((run / "checkpoints" / "best" / "meta.json").read_text())["eval"]["val_top1"]
    assert 100 * (out["logits"].argmax(1) == labels).float().mean() == pytest.approx(best, abs=1e-3)
    # The same classifier through a GAN config key and the CLI's --extractor.
    cfg = bigbatch.preset("digits").override({"eval.extractor": f"classifier:{run}"})
    assert cfg.eval.extractor.startswith("classifier:")
    with pytest.raises(BigbatchError, match="classifier:RUN"):
        bigbatch.preset("digits").override({"eval.extractor": "resnet"})
    sizes = {"train.kimg": 0.064, "train.batch": 32, "train.micro_batch": 32, "data.resolution": 16, "model.ch": 8}
    gan = bigbatch.preset("digits").override(sizes)
    gan_run = bigbatch.train(gan, run_dir=tmp_path / "gan", quiet=True)
    with pytest.raises(BigbatchError, match="not a classifier"):
        get_extractor(f"classifier:{gan_run}")


def accuracy(ext, cfg: Config) -> float:
    """Top-1 (percent) of a loaded classifier (`get_extractor("classifier:RUN")`) on cfg's held-out split."""
    from bigbatch.metrics import extract

    val = validation_data(cfg)
    images, labels = val.get(torch.arange(len(val)))
    return float(100 * (extract(ext, images, 128)["logits"].argmax(1) == labels).float().mean())


def first_bn_inputs(net, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-channel mean and unbiased variance of what the first BatchNorm normalises, averaged over
    micro-batches of 32 (as training forms them)."""
    with torch.no_grad():
        parts = net.conv1(x).split(32)
    means, variances = (torch.stack([f.mean((0, 2, 3)) for f in parts]), torch.stack([f.var((0, 2, 3)) for f in parts]))
    return means.mean(0), variances.mean(0)


def test_the_average_of_the_weights_is_what_is_scored_kept_and_put_to_use(tmp_path):
    from bigbatch.metrics import get_extractor
    from bigbatch.tasks.classify.finetune import read_state_dict

    over = {"train.kimg": 1.024, "eval.every_kimg": 1.024, "checkpoint.every_kimg": 1.024, "train.model_ema_kimg": 0.3}
    run = bigbatch.train(tiny(**over), run_dir=tmp_path / "r", quiet=True)
    ckpt = run / "checkpoints" / "000001.024"
    trained, average = load_file(ckpt / "model.safetensors"), load_file(ckpt / "model_ema.safetensors")
    assert not torch.equal(trained["fc.weight"], average["fc.weight"])
    # BatchNorm statistics are averaged with the weights they normalise (a copy of the latest would not fit).
    assert not torch.equal(trained["bn1.running_mean"], average["bn1.running_mean"])
    assert torch.equal(trained["bn1.num_batches_tracked"], average["bn1.num_batches_tracked"])
    # Scored: the accuracy logged is that of the average (the held-out split through the run's classifier).
    ext = get_extractor(f"classifier:{run}", device="cpu")
    assert all(torch.equal(v, average[k]) for k, v in ext.net.state_dict().items())
    assert accuracy(ext, tiny()) == pytest.approx(next(r for r in rows(run) if "val_top1" in r)["val_top1"], abs=1e-3)
    # Put to use: predict/export load it (load_classifier), and so does a fine-tuning from the run.
    weights, names, _ = read_state_dict(str(run))
    assert all(torch.equal(v, average[k]) for k, v in weights.items()) and names == [str(i) for i in range(10)]


def test_precise_bn_gives_what_is_scored_and_kept_its_own_statistics(tmp_path):
    from bigbatch.data.schedule import schedule_of
    from bigbatch.metrics import get_extractor
    from bigbatch.sampling import from_uint8
    from bigbatch.tasks.interface import peek

    # eval.standing_stats = 3: before scoring, the average's BatchNorm statistics are re-estimated over
    # the images of the last 3 steps (192 images, in micro-batches of 32), and kept so.
    over = {"train.kimg": 0.512, "eval.every_kimg": 0.512, "checkpoint.every_kimg": 0.512}
    cfg = tiny(**over, **{"train.model_ema_kimg": 0.2, "eval.standing_stats": 3})
    run = bigbatch.train(cfg, run_dir=tmp_path / "r", quiet=True)
    average = load_file(run / "checkpoints" / "000000.512" / "model_ema.safetensors")
    net = bigbatch.models.create_classifier("resnet_cifar", 10, ch=8, depth=8)
    net.load_state_dict(average)
    data, schedule = training_data(cfg), schedule_of(cfg)
    x = torch.cat([from_uint8(peek(data, schedule, cfg, start, 64).images) for start in (320, 384, 448)])
    means, variances = first_bn_inputs(net, x)
    assert torch.allclose(average["bn1.running_mean"], means, atol=1e-5)
    assert torch.allclose(average["bn1.running_var"], variances, rtol=1e-4, atol=1e-6)
    # What was scored is what is kept and put to use.
    ext = get_extractor(f"classifier:{run}", device="cpu")
    assert accuracy(ext, cfg) == pytest.approx(next(r for r in rows(run) if "val_top1" in r)["val_top1"], abs=1e-3)
    # Without the average, the model's own statistics are re-estimated, and training goes on in training
    # mode (normalising with each batch's statistics): the weights are those of a run without it.
    mid = {**over, "eval.every_kimg": 0.256}
    plain = bigbatch.train(tiny(**mid, **{"eval.standing_stats": 3}), run_dir=tmp_path / "p", quiet=True)
    ref = bigbatch.train(tiny(**mid), run_dir=tmp_path / "ref", quiet=True)
    state, ref = (load_file(r / "checkpoints" / "000000.512" / "model.safetensors") for r in (plain, ref))
    net.load_state_dict(state)
    assert torch.allclose(state["bn1.running_mean"], first_bn_inputs(net, x)[0], atol=1e-5)
    stats = ("running_mean", "running_var", "num_batches_tracked")
    assert all(torch.equal(v, ref[k]) for k, v in state.items() if not k.endswith(stats))


def test_rotation_labels_need_no_classes(tmp_path, capsys):
    # Which of four rotations each digit was given: learnable without labels (what fcd uses on unlabelled data).
    cfg = tiny(**{"train.labels": "rotation", "train.kimg": 4, "eval.every_kimg": 4, "checkpoint.every_kimg": 4})
    run = bigbatch.train(cfg, run_dir=tmp_path / "rot")
    said = capsys.readouterr().out  # (found from outside: it named eval, which scores class labels only)
    assert "Fine-tune it on your classes: bigbatch train ... train.init_from=" in said and "bigbatch eval" not in said
    (score,) = [r for r in rows(run) if "val_top1" in r]
    assert score["val_top1"] > 60 and "val_top5" not in score  # chance: 25; top-5 of 4 classes always 100
    with pytest.raises(bigbatch.BigbatchError, match="eval.best = 'val_top5' is 100 at every evaluation of 4 classes"):
        bigbatch.train(cfg.override({"eval.best": "val_top5"}), run_dir=tmp_path / "rot5")
    meta = json.loads((run / "checkpoints" / "000004.032" / "meta.json").read_text())
    assert meta["class_names"] == ["0", "90", "180", "270"] and meta["n_classes"] == 4


def test_lr_find_sweeps_the_rate_and_suggests_fastais_points(tmp_path, capsys, monkeypatch):
    from bigbatch.cli import main
    from bigbatch.lr_find import suggestions

    lrs = [10 ** (-6 + 6 * i / 59) for i in range(60)]
    losses = [1 + (math.log10(lr) + 2) ** 2 for lr in lrs]  # falls to 1e-2, then rises
    s = suggestions(lrs, losses)
    assert s["minimum"] == pytest.approx(lrs[losses.index(min(losses))] / 10)
    assert s["steepest"] == lrs[6] and lrs[6] < s["valley"] < lrs[losses.index(min(losses))]  # (fastai: 60 // 10)
    tail = losses[:55] + [30.0, 20.0, 10.0, 5.0, 4.9]  # a diverged tail's last dip (it was steepest, at --end-lr)
    assert suggestions(lrs, tail, 60)["steepest"] == lrs[6]
    monkeypatch.chdir(tmp_path)
    argv = ["lr-find", "data.path=builtin:digits", "data.resolution=16", "data.schedule=", "train.batch=64"]
    argv += ["train.micro_batch=32", "model.ch=8", "model.options.depth=8", "data.val_path=", "data.val_fraction=0.2"]
    argv += ["--steps", "30"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "30 steps at batch 64, rates 1.0e-07..1.0e+01" in out and "suggested train.lr per 128 images" in out
    assert Image.open(tmp_path / "lr_find.png").size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lr_find.json", "lr_find.png"]
    curve = json.loads((tmp_path / "lr_find.json").read_text())  # the curve's numbers, as fastai's recorder keeps them
    assert len(curve["lr"]) == len(curve["loss"]) == 30 and f"valley {curve['valley']:.2e}" in out
    assert main(["lr-find", "--preset", "digits", "--steps", "10"]) == 2
    assert 'lr-find takes classify and swap configs; this one trains task = "gan"' in capsys.readouterr().err
