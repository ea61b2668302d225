"""A look at the batch: every task's batch sheet shows the first images of a step exactly as its models
receive them (loader crops and flips, the task's own crops, rotations, warps and colour transfer), runs
write one at their start and at each phase's, and `bigbatch show-batch` draws one without training."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

import bigbatch
from bigbatch.batching import replicator_for
from bigbatch.cli import main
from bigbatch.config import CheckpointConfig, Config, DataConfig, EvalConfig, ModelConfig, SampleConfig, TrainConfig
from bigbatch.data.load import training_data
from bigbatch.data.schedule import schedule_of
from bigbatch.sampling import to_uint8
from bigbatch.tasks import Feed, build_task


def pictures(sheet: Image.Image, n: int, side: int, ncol: int = 8, lines: int = 1) -> torch.Tensor:
    """The first n pictures of a captioned sheet (square, `side` px, scaled up by nearest to 64 px cells
    framed by 1 px), read back as uint8 NHWC."""
    cell = max(64, side)
    scale = cell // side
    width, height = cell + 2, cell + 2 + 12 * lines + 2
    a = np.asarray(sheet.convert("RGB"))
    out = []
    for k in range(n):
        x, y = (k % ncol) * width + 1, (k // ncol) * height + 1
        out.append(a[y : y + cell : scale, x : x + cell : scale])
    return torch.from_numpy(np.stack(out))


def first_inputs(task, net, steps=1):
    """What `net` receives first when the task takes its first step (its positional arguments)."""
    seen = []
    hook = net.register_forward_pre_hook(lambda module, args: seen.append(args) if not seen else None)
    cfg = task.cfg
    rep = task.rep
    feed = Feed(training_data(cfg) if not hasattr(task, "src") else task.src, schedule_of(cfg), rep, cfg,
                crop_scale=getattr(task, "loader_crop_scale", 0.0))  # fmt: skip
    try:
        for _ in range(steps):
            task.step(feed)
    finally:
        feed.close()
        hook.remove()
    return seen[0]


def classify(**overrides) -> Config:
    cfg = Config(
        name="cls",
        task="classify",
        data=DataConfig(path="builtin:digits", resolution=64, xflip=True),
        model=ModelConfig(name="resnet_cifar", ch=4, options={"depth": 8}),
        train=TrainConfig(kimg=0.128, batch=64, micro_batch=32, lr=0.1, lr_batch=64, crop_scale=0.35),
        checkpoint=CheckpointConfig(every_kimg=0.128),
        sample=SampleConfig(every_kimg=0.128, n=8),
        eval=EvalConfig(every_kimg=0.0),
    )
    return cfg.override(overrides)


@pytest.mark.parametrize("labels", ["data", "rotation"])
def test_a_classifiers_sheet_is_what_its_network_receives(labels):
    cfg = classify(**{"train.labels": labels})
    rep = replicator_for(cfg)
    task = build_task(cfg, rep, training_data(cfg))
    sheet = task.batch_sheet(0)
    (x,) = first_inputs(task, task.plain())  # the first micro-batch: the step's first 32 images
    fed = to_uint8(x)
    assert fed.shape == (32, 64, 64, 3)
    assert torch.equal(pictures(sheet, 32, 64), fed)
    # Crops, flips (and rotations) were applied: not the stored images themselves.
    stored = training_data(cfg).get(torch.arange(len(training_data(cfg))))[0]
    assert not any(torch.equal(fed[0], img) for img in stored)


def test_a_mixed_classifiers_sheet_names_each_images_two_classes_and_shares(monkeypatch):
    # Found from outside: under mixup and CutMix each image was captioned by its own class alone.
    import bigbatch.tasks.classify.task as classify_task

    cfg = classify(**{"train.mixup": 0.8, "train.cutmix": 1.0})
    task = build_task(cfg, replicator_for(cfg), training_data(cfg))
    cells = []
    monkeypatch.setattr(classify_task, "captioned_sheet", lambda c: cells.extend(c))
    task.batch_sheet(0)
    captions = [[text for text, _ in caption] for _, caption in cells]
    for (own, other), (other_back, own_back) in zip(captions[0::2], captions[1::2]):  # (pairs: 2k and 2k + 1)
        share, name = own.split(" ", 1)
        rest, partner = other.split(" ", 1)
        assert int(share[:-1]) + int(rest[:-1]) in (99, 100, 101) and name != "" and partner != ""
        assert own_back.endswith(f" {name}") and other_back.endswith(f" {partner}")
    assert any(not c[0].startswith("100% ") for c in captions)  # (something mixed)


def test_a_gan_sheet_is_what_d_receives_as_real(tiny):
    cfg = tiny.override({"data.xflip": True})
    task = build_task(cfg, replicator_for(cfg), training_data(cfg))
    sheet = task.batch_sheet(0)
    fed, _ = first_inputs(task, task.plain("D"))  # D reads a step's real and fake images as one batch, real first
    assert torch.equal(pictures(sheet, 16, 16), to_uint8(fed[: len(fed) // 2]))


def test_a_swap_sheet_shows_the_warped_inputs_the_autoencoder_receives():
    cfg = bigbatch.preset("saehd_cpu").override(
        {
            "model.options": {"archi": "df-u", "ae_dims": 16, "e_dims": 4, "d_dims": 4, "d_mask_dims": 2},
            "data.val_fraction": 0.0,
            "eval.every_kimg": 0.0,
            "train.batch": 4,
            "train.micro_batch": 4,
            "swap.random_warp": True,
            "swap.ct_mode": "rct",
            "swap.src_flip": True,
        }
    )
    task = build_task(cfg, replicator_for(cfg), training_data(cfg))
    sheet = task.batch_sheet(0)
    src_in, dst_in = first_inputs(task, task.plain())
    cells = pictures(sheet, 24, 64, ncol=6)  # per row: src in, target, mask, dst in, target, mask
    as_uint8 = lambda x: (x.float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1)  # noqa: E731
    assert torch.equal(cells[0::6], as_uint8(src_in))
    assert torch.equal(cells[3::6], as_uint8(dst_in))
    assert not torch.equal(cells[0], cells[1])  # the input is warped, the target not


def test_runs_write_a_batch_sheet_at_their_start_and_at_each_phase(tmp_path):
    cfg = classify(**{"data.resolution": 16, "data.schedule": "0:12:32,0.064:16:64"})
    run = bigbatch.train(cfg, run_dir=tmp_path / "run", quiet=True)
    assert sorted(p.name for p in (run / "samples").glob("batch-*.png")) == [
        "batch-000000.000.png",
        "batch-000000.064.png",
    ]
    at_start = Image.open(run / "samples" / "batch-000000.000.png")
    task = build_task(cfg, replicator_for(cfg), training_data(cfg))
    assert np.array_equal(np.asarray(at_start), np.asarray(task.batch_sheet(0)))


def test_show_batch_draws_a_presets_batch_without_training(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("bigbatch.errors._WARNED", set())  # (a warning said earlier in this process would hide)
    assert main(["show-batch", "--preset", "digits", "--out", str(tmp_path / "b.png"), "train.batch=16"]) == 0
    out = capsys.readouterr().out
    assert "at kimg 0 (32 px, batch 16)" in out
    sheet = Image.open(io.BytesIO((tmp_path / "b.png").read_bytes()))
    assert sheet.size == (8 * 66, 2 * 80)  # 16 images, 8 a row, each captioned with its class
    assert not list(tmp_path.glob("runs*")) and not (tmp_path / "runs").exists()
    assert main(["show-batch", "--kimg", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--kimg must be a number of kimg, 0 to 1e12, got -1" in err
    far = ["show-batch", "--kimg", "1e9", "train.batch=16", "train.kimg=1", "--out", str(tmp_path / "far.png")]
    assert main(far) == 0  # (found from outside: said nothing)
    assert "--kimg 1e+09 is at or past the run's end (train.kimg 1)" in capsys.readouterr().err
    # Found from outside: a fine-tuning recipe's batch asked for the weights it starts from, not read to feed it.
    fine = ["show-batch", "--preset", "finetune_resnet50", "data.path=builtin:digits", "data.resolution=16"]
    assert main([*fine, "train.init_from=nowhere.pth", "--out", str(tmp_path / "f.png")]) == 0
    out, err = capsys.readouterr()
    assert "(16 px, batch 64)" in out and "warning" not in err
    # ... nor a classifier's held-out split, which evaluation needs and a sheet of training images does not (found
    # from outside: refused).
    plain = ["show-batch", "--preset", "fashion_resnet_fast", "data.path=builtin:digits", "data.resolution=16"]
    assert main([*plain, 'data.val_path=""', "data.val_fraction=0", "--out", str(tmp_path / "c.png")]) == 0, (
        capsys.readouterr().err
    )


def test_the_predictions_sheet_names_the_true_class_under_a_wrong_prediction():
    from bigbatch.tasks.classify.task import prediction_sheet

    image = torch.full((16, 16, 3), 128, dtype=torch.uint8)
    sheet = np.asarray(prediction_sheet([(image, 1), (image, 1)], [1, 2], ["cat", "dog", "fox"]))
    first, second = sheet[:, :66], sheet[:, 66:132]  # cells 66 px wide: a right and a wrong prediction
    line2 = slice(66 + 12, 66 + 24)
    assert (first[66:78] != 255).any() and (second[66:78] != 255).any()  # the predicted class under each
    assert (first[line2] == 255).all() and (second[line2] != 255).any()  # the true class under the wrong one
    assert (first[66:78, :, 1] > first[66:78, :, 0]).any() and (second[66:78, :, 0] > second[66:78, :, 1]).any()


def test_captions_draw_letters_beyond_ascii_and_fit_their_cell():
    # Found from outside: class names such as "ünï" came out as boxes (Pillow's default font is ASCII only),
    # and captions were cut by a count of characters, not by their width.
    from bigbatch.sampling import captioned_sheet

    def sheet(text):
        return np.asarray(captioned_sheet([(torch.zeros(8, 8, 3, dtype=torch.uint8), [(text, (0, 0, 0))])]))

    assert not np.array_equal(sheet("ü"), sheet("ï"))  # two letters, not the same missing-glyph box
    assert not np.array_equal(sheet("Ж"), sheet("Д"))
    assert sheet("a class name longer than its picture").shape[1] > 64 + 2  # (the least cell widened to hold it)
    long = sheet("a class name far longer than its cell, " * 8)  # (beyond 256 px: cut)
    assert long.shape == (64 + 2 + 12 + 2, 256 + 2, 3)  # (the picture kept at its size: found by review, 16x)
    assert (long[66:, -3:] == 255).all()  # the text stops inside its column, with an ellipsis
