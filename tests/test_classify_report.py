"""`bigbatch eval`'s report files read by other programs: its CSVs in a spreadsheet."""

import csv

import numpy as np
from PIL import Image
from test_classify import tiny

import bigbatch
from bigbatch.cli import main


def test_class_names_a_spreadsheet_would_run_as_formulas_are_quoted_in_the_csvs(tmp_path, capsys):
    # Found from outside: class folders named "=HYPERLINK(...)" or "+cmd|..." went into per_class.csv and
    # confusion.csv as they are, formulas to a spreadsheet (OWASP's CSV injection); a number stays a number.
    names = ['=HYPERLINK("evil.example","y")', "+cmd|' -C calc'!A0", "-1", "cat"]
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
    assert main(["eval", str(run)]) == 0
    (folder,) = (run / "eval").iterdir()
    per_class = [row[0] for row in csv.reader((folder / "per_class.csv").open())][1:]
    confusion = next(csv.reader((folder / "confusion.csv").open()))[1:]
    quoted = ["'" + names[0], "'" + names[1], "-1", "cat"]
    assert sorted(per_class) == sorted(confusion) == sorted(quoted)
