"""`bigbatch eval`'s report files read by other programs: its CSVs in a spreadsheet."""

import csv
import json

import numpy as np
import pytest
import torch
from PIL import Image
from test_classify import tiny

import bigbatch
from bigbatch.cli import main


def test_class_names_a_spreadsheet_would_run_as_formulas_are_quoted_in_the_csvs(tmp_path, capsys):
    # Found from outside: class folders named "=HYPERLINK(...)" or "+cmd|..." went into per_class.csv and
    # confusion.csv as they are, formulas to a spreadsheet (OWASP's CSV injection); a number stays a number.
    names = ['=HYPERLINK("evil.example","y")', "+cmd|' -C calc'!A0", "-1", "cat", "-inf"]  # (-inf: float() took it)
    rng = np.random.default_rng(0)
    for c, name in enumerate(names):
        (tmp_path / "src" / name).mkdir(parents=True)
        for i in range(10):
            pixels = np.clip(rng.normal(60 * c, 20, (16, 16, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(tmp_path / "src" / name / f"{i}.png")
    assert main(["prepare", str(tmp_path / "src"), str(tmp_path / "d.h5"), "--resolution", "16"]) == 0
    over = {"data.path": str(tmp_path / "d.h5"), "data.val_fraction": 0.5, "train.kimg": 0.064, "eval.every_kimg": 0}
    run = bigbatch.train(tiny(**over, **{"train.batch": 16, "train.micro_batch": 16}), run_dir=tmp_path / "r")
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as patch:  # a launch's second rank (found from outside: each scored it all)
        patch.setenv("RANK", "1")
        patch.setenv("WORLD_SIZE", "2")
        assert main(["eval", str(run)]) == 0 and not (run / "eval").exists() and not capsys.readouterr().out
    assert main(["eval", str(run)]) == 0
    (folder,) = (run / "eval").iterdir()
    # A run given as the data (found from outside: a GAN run, for its samples, "holds images: prepare it")
    assert main(["eval", str(run), str(run)]) == 2
    assert f"{run} is a run, not data: `bigbatch eval RUN DATA` scores" in capsys.readouterr().err
    per_class = [row[0] for row in csv.reader((folder / "per_class.csv").open())][1:]
    confusion = next(csv.reader((folder / "confusion.csv").open()))[1:]
    quoted = ["'" + names[0], "'" + names[1], "-1", "cat", "'-inf"]
    assert sorted(per_class) == sorted(confusion) == sorted(quoted)
    # Of 5 classes top-5 is always 100: left out of metrics.json as of the printed report (found from outside)
    assert "top5" not in json.loads((folder / "metrics.json").read_text())


def test_eval_finds_the_run_s_relative_data_from_another_folder_and_says_when_data_was_trained_on(
    tmp_path, monkeypatch, capsys
):
    # Found from outside: `bigbatch eval RUN` from another folder than training's could not find its relative
    # data.path, and nothing could be given to find the held-out split; the run's own training file given as DATA
    # was scored (its images mostly trained on) without a word.
    for folder in ("work", "elsewhere"):
        (tmp_path / folder).mkdir()
    monkeypatch.chdir(tmp_path / "work")
    assert main(["prepare", "builtin:digits", "d.h5", "--resolution", "16"]) == 0
    run = bigbatch.train(tiny(**{"data.path": "d.h5"}), run_dir=tmp_path / "run", quiet=True)
    # (its length in epochs too: found from outside, 600 kimg on 540 images was 1,111 epochs, unsaid)
    assert "; 0.512 kimg (0.3563 epochs of 1,437 images)\n" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path / "elsewhere")
    # A d.h5 here too, of other images: the run's is the one in the folder it trained in (found by review: this one was
    # taken, and refused as other images).
    assert main(["prepare", "builtin:digits", "d.h5", "--resolution", "12"]) == 0
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0  # d.h5's held-out split, from the folder the run trained in
    said = capsys.readouterr()
    assert "360 images" in said.out and "trained on" not in said.err
    # fastai's classification report (found from outside: missing): precision and F1 a class, macro F1 their mean.
    (folder,) = (run / "eval").iterdir()
    metrics = json.loads((folder / "metrics.json").read_text())
    confusion = [[int(v) for v in row[1:]] for row in list(csv.reader((folder / "confusion.csv").open()))[1:]]
    right, called = [confusion[i][i] for i in range(10)], [sum(row[j] for row in confusion) for j in range(10)]
    precision = [100 * r / c if c else None for r, c in zip(right, called)]  # (no image called the class: none)
    f1 = [200 * r / (sum(confusion[i]) + called[i]) for i, r in enumerate(right)]  # (2TP / (2TP + FP + FN))
    assert [metrics["precision"][str(j)] for j in range(10)] == pytest.approx(precision, abs=1e-3)
    assert [metrics["f1"][str(j)] for j in range(10)] == pytest.approx(f1, abs=1e-3)
    assert metrics["macro_f1"] == pytest.approx(sum(f1) / 10, abs=1e-3) and sum(map(bool, f1)) >= 2
    assert next(csv.reader((folder / "per_class.csv").open())) == ["class", "images", "accuracy", "precision", "f1"]
    assert main(["eval", str(run), str(tmp_path / "work" / "d.h5")]) == 0
    # (the 512 images of its 0.36 epochs: found from outside, all 1,437 were said)
    assert "is the data the run trained on: 512 of its 1797 images were trained on" in capsys.readouterr().err
    # The same file named from another folder is the same data: its report replaces its own (found from outside: a
    # second folder of it, as if other data of the same name).
    folders = sorted(p.name for p in (run / "eval").iterdir())
    assert main(["eval", str(run), "../work/d.h5"]) == 0
    assert sorted(p.name for p in (run / "eval").iterdir()) == folders == ["d-000000.512", "heldout-000000.512"]
    assert main(["eval", str(run), "builtin:digits"]) == 0  # the same images, known by their content
    assert "512 of its 1797 images were trained on" in capsys.readouterr().err
    # The same digits stored at 12 px are other bytes, which the content hash cannot tell for the same images: no word.
    assert main(["eval", str(run), "d.h5"]) == 0
    assert "the run trained on" not in capsys.readouterr().err
    # An empty folder is said to be one (found from outside: it "holds images", and prepare's hint then failed).
    (tmp_path / "empty").mkdir()
    assert main(["eval", str(run), str(tmp_path / "empty")]) == 2
    assert "empty is an empty folder: give a data set prepared of the images to score" in capsys.readouterr().err


def test_the_report_s_f1_and_its_macro_mean_are_sklearn_s():
    # Found from outside: a class of no image that was predicted was left out of macro_f1 (sklearn's macro average
    # counts it, at F1 0), so predicting absent classes raised the score.
    from sklearn.metrics import f1_score

    from bigbatch.tasks.classify.report import classification_report
    from bigbatch.tasks.classify.validation import Predictions

    labels = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 4])  # class 3 has no image, class 5 none and never predicted
    top1 = torch.tensor([0, 3, 1, 1, 1, 2, 3, 0, 2, 4])
    top = torch.stack([top1, (top1 + 1) % 6], 1)
    n = len(labels)
    predicted = Predictions(torch.arange(n), top, labels, torch.ones(n), torch.full((n,), 0.5))
    report = classification_report(predicted, [f"c{i}" for i in range(6)])
    want = f1_score(labels.numpy(), top1.numpy(), labels=[0, 1, 2, 3, 4], average=None) * 100
    assert [report["f1"][f"c{i}"] for i in range(5)] == pytest.approx(list(want), abs=1e-3)
    assert report["f1"]["c3"] == 0 and report["f1"]["c5"] is None and report["per_class"]["c3"] is None
    assert report["macro_f1"] == pytest.approx(100 * f1_score(labels.numpy(), top1.numpy(), average="macro"), abs=1e-3)


def test_eval_s_summary_leaves_out_what_says_nothing():
    # Found from outside: with 4 classes top-5 (always 100%) was printed, and classes all right were "hardest".
    from bigbatch.tasks.classify.report import describe

    report = {"data": "d.h5", "n": 8, "resolution": 16, "checkpoint": "c", "top1": 87.5, "top5": 100.0, "loss": 0.3}
    report |= {"per_class": {"bag": 75.0, "shoe": 100.0, "shirt": 100.0, "trouser": 100.0}, "folder": "f"}
    report |= {"most_confused": [["bag", "shoe", 1]]}
    lines = describe(report).splitlines()
    assert lines[1] == "top-1 87.50%  loss 0.3000" and lines[2] == "hardest classes: bag 75.0%"
    report["per_class"] = dict.fromkeys(["bag", "shoe", "shirt", "trouser", "coat", "dress"], 100.0)
    lines = describe(report | {"top1": 100.0}).splitlines()
    assert "top-5 100.00%" in lines[1] and lines[2] == "hardest classes: none: every image right"


def test_top_losses_captions_are_not_cut_where_a_wider_cell_holds_them():
    # Found from outside: at 64 px ImageNet's synsets read "n01484…", two of them alike.
    from PIL import Image, ImageDraw

    from bigbatch.sampling import caption_font
    from bigbatch.tasks.classify.report import top_losses_sheet

    rows = [(torch.zeros(64, 64, 3, dtype=torch.uint8), 0, 1, 0.13, 0.06, 2.9)] * 4
    sheet = top_losses_sheet(rows, ["n02085620", "n02085782"])
    line = ImageDraw.Draw(Image.new("RGB", (1, 1))).textlength("true 0.06 n02085620", font=caption_font())
    assert sheet.width >= 4 * line and sheet.width < 4 * 256 and sheet.height == 96 + 2 + 3 * 12 + 2  # (pictures kept)
