"""`bigbatch prepare` and `bigbatch info DATA.h5` from the command line, then training on the file."""

import numpy as np
import pytest
from PIL import Image

from bigbatch.cli import main


def make_folder(root):
    rng = np.random.default_rng(0)
    for cls in ("cats", "dogs"):
        (root / cls).mkdir(parents=True)
        for i in range(12):
            Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(root / cls / f"{i}.png")
    (root / "dogs" / "broken.png").write_bytes(b"\x89PNG not really")


def test_prepare_info_train(tmp_path, capsys):
    make_folder(tmp_path / "pets")
    assert main(["prepare", str(tmp_path / "pets"), "pets.h5", "--resolution", "16", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "24 images" in out and "2 classes" in out and "skipped 1" in out and "broken.png" in out
    assert main(["info", "pets.h5", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "cats" in out and "dogs" in out and "content hash verified" in out
    run = ["data.path=pets.h5", "data.resolution=16", "model.ch=8", "train.batch=8", "train.micro_batch=8"]
    assert main(["train", *run, "train.kimg=0.016", "--run-dir", "r", "--quiet"]) == 0


def test_prepare_bad_input_is_one_line(tmp_path, capsys):
    make_folder(tmp_path / "pets")
    for argv, words in [
        (["prepare", "nowhere", "x.h5"], "nowhere"),
        (["prepare", str(tmp_path / "pets"), "x.h5", "--resolution", "16", "--strict"], "broken.png"),
        (["info", "missing.h5"], "missing.h5"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("bigbatch: error: ") and err.count("\n") == 1 and words in err, err


@pytest.mark.slow
def test_stats_and_eval_with_the_offline_classifier(tiny, tmp_path, monkeypatch, capsys):
    import json

    import bigbatch

    monkeypatch.setenv("BIGBATCH_CACHE", str(tmp_path / "cache"))
    run = bigbatch.train(tiny, run_dir="run", quiet=True)
    assert main(["stats", "builtin:digits", "--extractor", "classifier", "--resolution", "16"]) == 0
    assert "reference statistics of builtin:digits" in capsys.readouterr().out
    assert any((tmp_path / "cache").rglob("*.safetensors"))  # cached for the next call
    assert main(["eval", str(run), "--metrics", "fid,kid", "--n", "64", "--extractor", "classifier"]) == 0
    scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scores["fcd"] > 0 and "kcd" in scores and "fid" not in scores  # never labelled FID
    assert main(["eval", str(run), "--metrics", "bogus"]) == 2
    assert "unknown metric 'bogus'" in capsys.readouterr().err
