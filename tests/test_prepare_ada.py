"""A StyleGAN2-ADA data set (what its dataset_tool.py writes: images in folders of 1,000 and their labels in
dataset.json) prepares with its labels, its folders no classes."""

import json
import zipfile

import numpy as np
import pytest
from PIL import Image

import bigbatch
from bigbatch.cli import main


def ada_zip(path, labels, n=12, extra=()):
    """A zip as ADA's dataset_tool.py writes one: 00000/img00000000.png ..., dataset.json (folders of 5 here)."""
    rng = np.random.default_rng(0)
    with zipfile.ZipFile(path, "w") as z:
        for i in range(n):
            png = path.parent / "x.png"
            Image.fromarray(rng.integers(0, 255, (8, 8, 3), np.uint8)).save(png)
            z.write(png, f"{i // 5:05d}/img{i:08d}.png")
        rows = None if labels is None else [[f"{i // 5:05d}/img{i:08d}.png", labels[i]] for i in range(len(labels))]
        rows = rows if rows is None else [*rows, *extra]
        z.writestr("dataset.json", json.dumps({"labels": rows}))


def test_an_ada_zip_prepares_with_its_labels_and_its_folders_are_no_classes(tmp_path, capsys):
    # Found from outside: its folders of 1,000 were classes ("00000", "00001") and dataset.json's labels dropped.
    labels = [i % 3 for i in range(11)]  # (the last image unlabelled: skipped, said)
    ada_zip(tmp_path / "ada.zip", labels)
    assert main(["prepare", str(tmp_path / "ada.zip"), str(tmp_path / "a.h5"), "--resolution", "8"]) == 0
    assert "img00000011.png: no label in dataset.json" in capsys.readouterr().out
    data = bigbatch.data.load_data(str(tmp_path / "a.h5"), 8)
    assert data.class_names == ["0", "1", "2"] and len(data) == 11
    names = bigbatch.data.image_names(data)
    got = {name: int(data.get(np.array([i]))[1]) for i, name in enumerate(names)}
    assert got == {f"{i // 5:05d}/img{i:08d}.png": labels[i] for i in range(11)}
    # Unlabelled (null): one class of every image, no folder a class.
    ada_zip(tmp_path / "plain.zip", None)
    assert main(["prepare", str(tmp_path / "plain.zip"), str(tmp_path / "p.h5"), "--resolution", "8"]) == 0
    plain = bigbatch.data.load_data(str(tmp_path / "p.h5"), 8)
    assert len(plain) == 12 and plain.class_names == []  # (unconditional, as a flat folder)
    # Class indices with a gap (ADA counts classes to the largest), a label of no image: said, not refused.
    ada_zip(tmp_path / "gap.zip", [0, 2] * 6, extra=[["gone.png", 1]])
    assert main(["prepare", str(tmp_path / "gap.zip"), str(tmp_path / "g.h5"), "--resolution", "8"]) == 0
    assert "gone.png (in dataset.json): labelled, but not in the source" in capsys.readouterr().out
    assert bigbatch.data.load_data(str(tmp_path / "g.h5"), 8).class_names == ["0", "1", "2"]
    # --classes names its indices by the training file's classes, as WebDataset's .cls.
    assert main(["prepare", str(tmp_path / "ada.zip"), "v.h5", "--resolution", "8", "--classes", "g.h5"]) == 0
    assert bigbatch.data.load_data("v.h5", 8).class_names == ["0", "1", "2"]
    # Another tool's dataset.json beside class folders: the folders are the classes, as before.
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as z:
        for c in ("cat", "dog"):
            z.writestr(f"{c}/a.png", (tmp_path / "x.png").read_bytes())
        z.writestr("dataset.json", '{"name": "pets", "license": "cc"}')
    assert main(["prepare", str(tmp_path / "other.zip"), str(tmp_path / "o.h5"), "--resolution", "8"]) == 0
    assert bigbatch.data.load_data(str(tmp_path / "o.h5"), 8).class_names == ["cat", "dog"]
    # Labels not ADA's: one line.
    with zipfile.ZipFile(tmp_path / "bad.zip", "w") as z:
        z.writestr("00000/img00000000.png", (tmp_path / "x.png").read_bytes())
        z.writestr("dataset.json", '{"labels": [["00000/img00000000.png", "cat"]]}')
    assert main(["prepare", str(tmp_path / "bad.zip"), str(tmp_path / "b.h5"), "--resolution", "8"]) == 2
    assert "dataset.json of the source is not StyleGAN2-ADA's labels" in capsys.readouterr().err
    with pytest.raises(bigbatch.BigbatchError):
        bigbatch.data.prepare(str(tmp_path / "bad.zip"), str(tmp_path / "b.h5"), 8)
