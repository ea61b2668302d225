"""The fast-ImageNet recipe as an FFCV user meets it (found from outside): the ImageNet presets validate at 256 -> 224
as torchvision and FFCV do, and task=classify without a classifier's preset is refused in its own terms."""

from __future__ import annotations

import json

import pytest

import bigbatch
from bigbatch.cli import main
from bigbatch.tasks.classify.validation import val_geometry


@pytest.mark.parametrize("name", ["imagenet_resnet50", "imagenet_resnet50_fast", "finetune_resnet50"])
def test_the_imagenet_presets_resize_to_256_for_a_center_crop_of_224(name):
    crop = bigbatch.preset(name).data.val_crop
    _, short, long, height, width = val_geometry(375, 500, 224, crop, False)  # (1.14 resized to 255)
    assert (short, long, height, width) == (256, 341, 224, 224)


def test_task_classify_over_the_default_gan_preset_names_the_classifier_presets(capsys):
    assert main(["train", "--dry-run", "task=classify", "model.name=resnet_cifar"]) == 2
    err = capsys.readouterr().err.strip()
    assert "task=classify with neither --preset nor --config is laid over the default preset digits" in err
    assert "give --preset of a classify recipe (fashion_resnet," in err and len(err.splitlines()) == 1, err
    assert main(["train", "--dry-run", "--preset", "fashion_resnet", "task=classify"]) == 0


def test_eval_tta_scores_the_held_out_split_with_the_mirror_images_as_eval_does(tmp_path, capsys):
    # Found from outside: FFCV and airbench score with flip TTA as they train; only `bigbatch eval --tta` could.
    run = tmp_path / "r"
    args = ["train", "--preset", "fashion_resnet", "--run-dir", str(run), "data.path=builtin:digits"]
    args += ["data.val_path=", "data.val_fraction=0.2", "data.resolution=16", "data.schedule=0:16:32", "model.ch=8"]
    args += ["model.options={depth=8}", "train.kimg=0.064", "train.batch=32", "train.micro_batch=32"]
    args += ["train.lr_batch=32", "eval.every_kimg=0.064", "--quiet"]
    assert main([*args, "eval.tta=true"]) == 0
    logged = [row for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "val_loss" in row]
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0  # (the run's eval.tta: with the mirror images)
    assert main(["eval", str(run), "--no-tta"]) == 0
    scored = {p.name: json.loads((p / "metrics.json").read_text()) for p in (run / "eval").iterdir() if p.is_dir()}
    tta = next(v for k, v in scored.items() if "-tta-" in k)
    plain = next(v for k, v in scored.items() if "-tta-" not in k)
    assert tta["tta"] and not plain["tta"]
    assert logged[-1]["val_top1"] == pytest.approx(tta["top1"]) and logged[-1]["val_loss"] == pytest.approx(tta["loss"])
    assert plain["loss"] != pytest.approx(tta["loss"])
    assert main(["train", "--dry-run", "eval.tta=true"]) == 2  # (a GAN's)
    assert "config key 'eval.tta' averages a classifier's predictions" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["imagenet_resnet50_ffcv", "imagenet_resnet18_ffcv"])
def test_ffcvs_imagenet_recipes_ramp_160_to_192_as_its_configs_and_validate_at_256_with_tta(name, capsys):
    # Found from outside: an FFCV user found BlurPool and TTA, but not its recipe: its rn50/rn18 configs' ramp, rate
    # and validation. Its ramp from 160 to 192 px in steps of 32, rounded as NumPy rounds, is one step at its middle.
    from bigbatch.presets_classify import IMAGENET, ffcv_resolutions

    cfg = bigbatch.preset(name)
    epoch = IMAGENET / 1000
    assert [(round(p["kimg"] / epoch), p["resolution"]) for p in cfg.data.schedule] == [(0, 160), (71, 192)]
    assert [(round(p["kimg"] / epoch), p["resolution"]) for p in ffcv_resolutions(16, 11, 13)] == [(0, 160), (12, 192)]
    assert cfg.eval.resolution == 256 and cfg.eval.tta and cfg.model.options["blurpool"]
    assert cfg.train.kimg == pytest.approx(88 * epoch) and cfg.train.warmup_kimg == pytest.approx(2 * epoch)
    assert cfg.train.warmup_lr == pytest.approx(cfg.train.lr * 1e-4) and cfg.train.lr_decay == "linear"
    t = cfg.train  # (its yaml's batch over its GPUs, lr, weight decay; SGD without Nesterov, no decay on norms)
    ffcv = {"imagenet_resnet50_ffcv": (4096, 1.7, 1e-4), "imagenet_resnet18_ffcv": (1024, 0.5, 5e-5)}[name]
    assert (t.batch, t.lr, t.weight_decay) == ffcv and t.lr_batch == t.batch and t.label_smoothing == 0.1
    assert t.optimizer == "sgd" and not t.nesterov and not t.norm_decay and t.precision == "fp16"
    assert main(["train", "--preset", name, "--dry-run"]) == 0
    assert "160px batch" in (said := capsys.readouterr().out) and "then 192px batch" in said
