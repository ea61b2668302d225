"""What prepare says while it goes, off a terminal too (a log under nohup, a batch system or CI), the rate it
reports of a resumed run (of the images it decoded, not those read back from the interrupted run's parts), and why it
decodes again what an interrupted one kept."""

import re

import numpy as np
from conftest import interrupted_prepare
from PIL import Image

from bigbatch.cli import main
from bigbatch.data.prepare import prepare


def _images(folder, n=700):
    rng = np.random.default_rng(0)
    folder.mkdir()
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(folder / f"{i:04d}.png")


def test_prepare_off_a_terminal_says_how_far_it_has_come_and_a_resumed_ones_rate_is_of_what_it_decoded(
    tmp_path, monkeypatch, capsys
):
    _images(tmp_path / "src")
    interrupted_prepare(monkeypatch, str(tmp_path / "src"), str(tmp_path / "out.h5"), 16, workers=0)  # 512 kept
    capsys.readouterr()
    monkeypatch.setattr("bigbatch.images_done.LINE_EVERY_S", 0.0)  # (a line each image here, not each 30 s)
    assert (
        main(["prepare", str(tmp_path / "src"), str(tmp_path / "out.h5"), "--resolution", "16", "--workers", "0"]) == 0
    )
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("prepare: ")]
    assert lines[0] == "prepare: 1/700 images, 0.0 img/s" and len(lines) == 699, lines[:3]  # (read back: no rate)
    assert re.fullmatch(r"prepare: 699/700 images, [\d.]+ img/s, about \d+ s left", lines[-1]), lines[-1]
    assert "resumed: 512 files as an interrupted prepare of this command had decoded them (the rate is" in out
    seconds, rate = (float(x) for x in re.search(r" in ([\d.]+) s \((\d+) img/s", out).groups())
    assert 188 / (seconds + 0.05) - 1 <= rate <= 188 / max(seconds - 0.05, 1e-3) + 1, out  # (700 - 512 decoded)


def test_parts_kept_of_another_quality_are_said_to_be(tmp_path, monkeypatch, capsys):
    # Found from outside: "made with other codec" where the codec was the same and the quality not.
    _images(tmp_path / "src", 300)
    src, out = str(tmp_path / "src"), str(tmp_path / "out.h5")
    interrupted_prepare(monkeypatch, src, out, 16, workers=0, codec="jpeg")
    capsys.readouterr()
    assert prepare(src, out, 16, workers=0, codec="jpeg", quality=80).resumed == 0
    assert "by an earlier prepare were made with other --quality: deleted, decoding again" in capsys.readouterr().err
