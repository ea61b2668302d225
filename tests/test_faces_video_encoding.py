"""A video's encoding as DFL's video_from_sequence asks it: a bit rate (16 Mbit/s by default) or lossless, for
`video make` and merge's --video; refused in one line where it is neither."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

pytest.importorskip("av")

from bigbatch.cli import main  # noqa: E402
from bigbatch.faces.video import Video  # noqa: E402


def test_lossless_keeps_the_frames_and_a_bit_rate_sets_the_size(tmp_path, capsys):
    rng = np.random.default_rng(0)
    # Grey noise (nothing for yuv420p's halved colour to lose) at 100 fps: 16 Mbit/s has a quarter of its bits a frame
    gray = rng.integers(0, 256, (5, 240, 320), dtype=np.uint8)
    (tmp_path / "frames").mkdir()
    for i, frame in enumerate(gray):
        cv2.imwrite(str(tmp_path / "frames" / f"{i + 1:05d}.png"), np.repeat(frame[..., None], 3, axis=2))
    errors, sizes = {}, {}
    for name, args in (("lossless", ["--lossless"]), ("default", []), ("low", ["--bitrate", "0.1"])):
        out = tmp_path / f"{name}.mp4"
        assert main(["video", "make", str(tmp_path / "frames"), str(out), "--fps", "100", *args]) == 0
        with Video(out) as v:
            frames = np.stack(list(v.frames()))
        errors[name] = np.abs(frames.astype(int) - gray[..., None]).max()
        sizes[name] = out.stat().st_size
    assert errors["lossless"] <= 1 < 10 < errors["default"] < errors["low"]  # (RGB to YUV and back rounds a level)
    assert sizes["lossless"] > 2 * sizes["default"] > 4 * sizes["low"]
    capsys.readouterr()
    cases = (
        (["--lossless", "--bitrate", "8"], "give --lossless or --bitrate, not both"),
        (["--bitrate", "0"], "a video's bit rate (--bitrate) must be in [0.01, 1000] Mbit/s (DFL's 16), got 0"),
    )
    for args, said in cases:
        assert main(["video", "make", str(tmp_path / "frames"), str(tmp_path / "x.mp4"), *args]) == 2
        assert said in capsys.readouterr().err
    assert not Path(tmp_path / "x.mp4").exists()
    # merge's: a setting of its --video
    assert main(["merge", "run", "frames", "aligned", str(tmp_path / "out"), "--lossless"]) == 2
    assert "--lossless needs --video (a setting of the merged video)" in capsys.readouterr().err
