"""`bigbatch predict --out`: the predictions written to a file, as timm's inference.py writes its results (found
from outside: predict only printed them, and a redirected --json list was no JSON when cut short)."""

import csv
import json

from PIL import Image
from test_classify import tiny

import bigbatch
from bigbatch.cli import main


def test_predict_writes_its_predictions_to_a_csv_or_json_file(tmp_path, capsys):
    run = bigbatch.train(tiny(**{"train.kimg": 0.064}), run_dir=tmp_path / "run", quiet=True)
    (tmp_path / "imgs").mkdir()
    for i in range(3):
        Image.new("RGB", (16, 16), (80 * i, 40, 0)).save(tmp_path / "imgs" / f"{i}.png")
    (tmp_path / "=cmd.png").write_bytes(b"not a png")  # (skipped; its name, a formula to a spreadsheet, quoted)
    capsys.readouterr()
    assert main(["predict", str(run), str(tmp_path / "imgs"), "=cmd.png", "--topk", "2", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert main(["predict", str(run), str(tmp_path / "imgs"), "=cmd.png", "--topk", "2", "--out", "p.json"]) == 0
    assert json.loads(open("p.json").read()) == printed and "0.png: " in capsys.readouterr().out
    assert main(["predict", str(run), str(tmp_path / "imgs"), "=cmd.png", "--topk", "2", "--out", "p.csv"]) == 0
    rows = list(csv.reader(open("p.csv")))
    assert rows[0] == ["file", "class_1", "p_1", "class_2", "p_2", "error"] and len(rows) == 5
    by_file = {r[0]: r for r in rows[1:]}
    for row in printed:
        cells = by_file.pop(row["file"] if "top" in row else "'" + row["file"])
        if "top" in row:
            assert cells[1::2][:2] == [t["class"] for t in row["top"]] and cells[-1] == ""
            assert [float(p) for p in cells[2:5:2]] == [round(t["p"], 6) for t in row["top"]]
        else:
            assert cells[1:5] == [""] * 4 and cells[-1] == row["error"]
    assert not by_file
    # A folder --out names is made (found from outside: a missing one failed once every image was predicted)
    assert main(["predict", str(run), str(tmp_path / "imgs"), "--topk", "2", "--out", "new/p.csv"]) == 0
    assert list(csv.reader(open("new/p.csv"))) == [r for r in rows if not r[0].startswith("'")]
    assert main(["predict", str(run), str(tmp_path / "imgs"), "--out", "p.txt"]) == 2
    assert "--out 'p.txt': give a .csv or a .json file" in capsys.readouterr().err
