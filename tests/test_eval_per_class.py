"""Intra-class FID as a StudioGAN user reports it (found from outside: a recipe by hand, each class scored by a
classifier trained on that class alone, whose scores compared with nothing): `bigbatch eval RUN --per-class`; and
what else a run's eval says of the reference and of KID's subsets."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from bigbatch.cli import main

TINY = ["--preset", "digits", "data.resolution=16", "model.ch=8", "model.dim_z=16", "train.kimg=0.064"]
TINY += ["train.batch=32", "eval.every_kimg=0", "sample.every_kimg=0", "eval.extractor=classifier"]
TINY += ["eval.classifier={steps=5,width=8,resolution=16}"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = tmp_path_factory.mktemp("per_class") / "r"
    assert main(["train", *TINY, "--run-dir", str(run), "--quiet"]) == 0
    return run


def test_per_class_scores_each_class_against_its_own_images_with_the_runs_extractor(run, capsys):
    capsys.readouterr()
    assert main(["eval", str(run), "--per-class", "--n", "20"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    per = row["per_class"]
    assert sorted(per) == [str(c) for c in range(10)] and row["n"] == 20 and row["network"] == "G_ema"
    assert row["ifcd"] == pytest.approx(sum(per.values()) / 10) and all(v > 0 for v in per.values())
    assert row["per_class_n"]["0"] == 178  # (sklearn's digits: 178 zeros)
    assert main(["eval", str(run), "--metrics", "fid", "--n", "20"]) == 0
    whole = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert whole["features"] == row["features"] and whole["classes"] == "uniform"  # (one extractor for all)
    # Class 3's score: G's samples of class 3 against the data's threes alone, under the run's extractor.
    from bigbatch.data import load_data
    from bigbatch.data.split import Subset
    from bigbatch.metrics.evaluate import generated_features
    from bigbatch.metrics.fid import feature_stats, frechet_distance
    from bigbatch.metrics.stats import reference_stats
    from bigbatch.tasks.classify.features import feature_extractor
    from bigbatch.tasks.gan.load import load_generator
    from bigbatch.tasks.gan.scorer import classifier_options

    G, data = load_generator(run), load_data("builtin:digits", 16)
    ext = feature_extractor("classifier", data, None, "cpu", options=classifier_options(G.config.eval))
    assert ext.digest[:16] == row["features"]
    fakes = generated_features(G, ext, 20, 0, None, 64, label=3)["pool"]
    real = reference_stats(Subset(data, (data.labels == 3).nonzero()[:, 0], "class 3"), ext, features=False)
    assert frechet_distance(*feature_stats(fakes), real.mu, real.sigma) == pytest.approx(per["3"])


def test_per_class_is_refused_where_it_cannot_score(run, tmp_path, capsys):
    cases = [
        (["eval", str(run), "--per-class", "--metrics", "kid"], "--per-class scores FID per class"),
        (["eval", str(run), "--per-class", "--reference-n", "50"], "drop --reference-n"),
    ]
    for argv, said in cases:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert said in err and len(err.splitlines()) == 1, err
    # B of the run's count of classes, named otherwise (found by review: digits were scored against shirts)
    for c in range(10):
        (tmp_path / "other" / f"k{c}").mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (16, 16), (20 * c, 10 * i, 0)).save(tmp_path / "other" / f"k{c}" / f"{i}.png")
    assert main(["prepare", str(tmp_path / "other"), str(tmp_path / "other.h5"), "--resolution", "16"]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), str(tmp_path / "other.h5"), "--per-class"]) == 2
    assert "is of the classes k0, k1, k2, k3, ..." in capsys.readouterr().err
    assert main(["eval", str(run), "--per-class", "--metrics", "fid", "--n", "4"]) == 0  # (what it scores, named)
    capsys.readouterr()
    folder = tmp_path / "imgs"
    folder.mkdir()
    import numpy as np

    for i in range(3):
        Image.fromarray(np.full((16, 16, 3), 40 * i, np.uint8)).save(folder / f"{i}.png")
    assert main(["eval", str(folder), "builtin:digits", "--per-class"]) == 2
    assert "--per-class applies to a run's generator" in capsys.readouterr().err


def test_the_runs_own_data_of_fewer_images_than_features_is_said_as_b_is(run, capsys):
    # Found from outside: --reference-n 10 against the run's own data set was scored without a word, B's was said.
    capsys.readouterr()
    assert main(["eval", str(run), "--metrics", "fid", "--n", "20", "--reference-n", "10"]) == 0
    err = capsys.readouterr().err
    assert "builtin:digits: reference statistics of 10 images, fewer than their 32 feature dimensions" in err, err


def test_a_kid_subset_asked_larger_than_the_images_is_said(run, capsys):
    # Found from outside: --kid-subset-size 5000 of 20 samples was cut to 20 without a word (torch-fidelity refuses).
    capsys.readouterr()
    assert main(["eval", str(run), "--metrics", "kid", "--n", "20", "--kid-subset-size", "5000"]) == 0
    said = capsys.readouterr()
    assert "--kid-subset-size 5000: 20 taken, as many as the images scored" in said.err, said.err
    assert json.loads(said.out.strip().splitlines()[-1])["kid_subset_size"] == 20
