"""What prepare says while it goes, off a terminal too (a log under nohup, a batch system or CI), and the rate it
reports of a resumed run: of the images it decoded, not those read back from the interrupted run's parts."""

import re

import numpy as np
from conftest import interrupted_prepare
from PIL import Image

from bigbatch.cli import main


def test_prepare_off_a_terminal_says_how_far_it_has_come_and_a_resumed_ones_rate_is_of_what_it_decoded(
    tmp_path, monkeypatch, capsys
):
    rng = np.random.default_rng(0)
    (tmp_path / "src").mkdir()
    for i in range(700):
        Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(tmp_path / "src" / f"{i:04d}.png")
    interrupted_prepare(monkeypatch, str(tmp_path / "src"), str(tmp_path / "out.h5"), 16, workers=0)  # 512 kept
    capsys.readouterr()
    monkeypatch.setattr("bigbatch.images_done.LINE_EVERY_S", 0.0)  # (a line each image here, not each 30 s)
    assert (
        main(["prepare", str(tmp_path / "src"), str(tmp_path / "out.h5"), "--resolution", "16", "--workers", "0"]) == 0
    )
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert lines[0] == "prepare: 1/700 images, 0.0 img/s" and len(lines) == 699, lines[:3]  # (read back: no rate)
    assert re.fullmatch(r"prepare: 699/700 images, [\d.]+ img/s, about \d+ s left", lines[-1]), lines[-1]
    assert "resumed: 512 files as an interrupted prepare of this command had decoded them (the rate is" in out
    seconds, rate = (float(x) for x in re.search(r" in ([\d.]+) s \((\d+) img/s", out).groups())
    assert 188 / (seconds + 0.05) - 1 <= rate <= 188 / max(seconds - 0.05, 1e-3) + 1, out  # (700 - 512 decoded)
