"""What a classify run's `bigbatch eval` leaves for scripts (found from outside, as a fastai and timm user): every
image's prediction by its place in the data file (fastai's top_losses with indices), whether the data was trained on,
the batch it scores at (timm's validate.py -b), and an out of memory that names eval's own fix."""

import csv
import json
import math

import numpy as np
import pytest
import torch
from PIL import Image
from test_classify import tiny

import bigbatch
from bigbatch.cli import main
from bigbatch.config import Config
from bigbatch.data.load import load_data, validation_data
from bigbatch.tasks.classify.validation import val_transform


def _rows(folder):
    with (folder / "predictions.csv").open() as f:
        return list(csv.DictReader(f))


def test_eval_writes_each_images_prediction_by_its_place_in_the_file(tmp_path, capsys):
    run = bigbatch.train(tiny(**{"train.kimg": 0.256}), run_dir=tmp_path / "run", quiet=True)
    cfg = Config.load(run / "config.toml")
    assert main(["eval", str(run), "--batch-size", "7"]) == 0
    folder = run / "eval" / "heldout-000000.256"
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["trained_on"] == 0  # the held-out split
    rows = _rows(folder)
    assert len(rows) == metrics["n"] == 360
    losses = [float(r["loss"]) for r in rows]
    assert losses == sorted(losses, reverse=True)  # the top losses first
    assert sum(losses) / len(losses) == pytest.approx(metrics["loss"], rel=1e-5)
    assert 100 * sum(r["class"] == r["predicted"] for r in rows) / 360 == pytest.approx(metrics["top1"], abs=1e-4)
    # Each index is the image's place in the data file the split was cut from: the network's output on that image
    # is the row's.
    net = bigbatch.load_classifier(run)
    whole = load_data(cfg.data.path, cfg.data.resolution)
    picked = rows[:3] + rows[-3:]
    images, labels = whole.get(torch.tensor([int(r["index"]) for r in picked]))
    with torch.no_grad():
        p = net(val_transform(images, 16, cfg.data.val_crop, False)).softmax(1)
    for row, label, probs in zip(picked, labels.tolist(), p):
        assert row["class"] == str(label) and row["predicted"] == str(int(probs.argmax()))
        assert float(row["p_class"]) == pytest.approx(float(probs[label]), rel=1e-4, abs=1e-6)
        assert float(row["p_predicted"]) == pytest.approx(float(probs.max()), rel=1e-4)
        assert float(row["loss"]) == pytest.approx(-math.log(float(probs[label])), rel=1e-4, abs=1e-5)
    assert set(int(r["index"]) for r in rows) < set(range(len(whole)))  # (the split's places, not 0..359)
    held = validation_data(cfg)
    assert sorted(int(r["index"]) for r in rows) == held.indices.tolist()

    # The run's own training data, scored: how many of its images it trained on is in the file, not only said.
    capsys.readouterr()
    assert main(["eval", str(run), "builtin:digits"]) == 0
    assert "is the data the run trained on" in capsys.readouterr().err
    (folder,) = (run / "eval").glob("digits-*")
    assert json.loads((folder / "metrics.json").read_text())["trained_on"] == 256  # (an epoch's first 256 images)
    assert [int(r["index"]) for r in _rows(folder)] != list(range(1797)) and len(_rows(folder)) == 1797

    assert {r["file"] for r in rows} == {""}  # (builtin data keeps no file names)

    # Data prepared from files: each row names its image's file (WebDataset's __key__; fastai's cleaner's paths).
    images, labels = whole.get(torch.arange(30))
    for i, (image, label) in enumerate(zip(images.numpy(), labels.tolist())):
        (tmp_path / "files" / str(label)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(tmp_path / "files" / str(label) / f"{i:02d}.png")
    for c in range(10):  # (every class of the run's, so that prepare numbers them as its)
        (tmp_path / "files" / str(c)).mkdir(exist_ok=True)
    argv = ["prepare", str(tmp_path / "files"), str(tmp_path / "files.h5"), "--classes", "builtin:digits"]
    assert main([*argv, "--codec", "png"]) == 0
    assert main(["eval", str(run), str(tmp_path / "files.h5")]) == 0
    (folder,) = (run / "eval").glob("files-*")
    rows = _rows(folder)
    assert len(rows) == 30 and all(r["file"].split("/")[0] == r["class"] for r in rows)
    for row in rows[:3]:
        x = torch.from_numpy(np.array(Image.open(tmp_path / "files" / row["file"])))[None]
        with torch.no_grad():
            p = net(val_transform(x, 16, cfg.data.val_crop, False)).softmax(1)[0]
        assert float(row["p_class"]) == pytest.approx(float(p[int(row["class"])]), rel=1e-4, abs=1e-6)

    for bad in ("0", "-1"):
        assert main(["eval", str(run), "--batch-size", bad]) == 2
        assert f"--batch-size must be 1 to 1,048,576, got {bad}" in capsys.readouterr().err


def test_an_eval_out_of_memory_names_evals_fix_not_trainings(tmp_path, capsys, monkeypatch):
    import bigbatch.tasks.classify.report as report

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 60.00 GiB")

    monkeypatch.setattr(report, "evaluate_classifier", oom)
    run = bigbatch.train(tiny(**{"train.kimg": 0.064, "eval.every_kimg": 0}), run_dir=tmp_path / "run", quiet=True)
    capsys.readouterr()
    assert main(["eval", str(run)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "out of memory (CUDA out of memory." in err
    assert "lower --batch-size" in err and "train.micro_batch" not in err
