"""bigbatch video frames: a video's frames to a folder, refused over other images, going on where an interrupted one
stopped."""

from __future__ import annotations

import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

pytest.importorskip("av")
pytest.importorskip("skimage")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import _faces  # noqa: E402

from bigbatch.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    """The folder of a made clip, clip.mp4 (4 frames)."""
    root = tmp_path_factory.mktemp("video")
    _faces.write_video(root / "clip.mp4", 4, 320, 240)
    return root


def test_video_frames_refuses_a_folder_holding_images_and_make_a_non_video_name(clip, capsys):
    # Found from outside: frames of a 12-frame clip written over an 80-frame one's left 80 files; DIR a file said
    # only "File exists"; `video make FRAMES x.png` raised PyAV's ValueError.
    root = clip
    Path("old").mkdir()
    cv2.imwrite("old/00080.png", np.zeros((8, 8, 3), np.uint8))
    Path("afile").write_text("x")
    Path("frames").mkdir()
    cv2.imwrite("frames/1.png", np.zeros((8, 8, 3), np.uint8))
    cases = [
        (["video", "frames", str(root / "clip.mp4"), "old"], "DIR old already holds images: give a new or empty"),
        (["video", "frames", str(root / "clip.mp4"), "afile"], "DIR afile is a file: give a new or empty folder"),
        (["video", "make", "frames", "x.png"], "OUT x.png: give a video file name"),
    ]
    # Found from outside: --fps nan was ignored by frames and a traceback in make, as were inf and 1e12.
    fps = "--fps must be a frame rate of 0.001 to 1000, got"
    cases += [(["video", "frames", str(root / "clip.mp4"), "new", "--fps", "nan"], f"{fps} nan")]
    cases += [(["video", "make", "frames", "x.mp4", "--fps", v], f"{fps} {float(v)}") for v in ("inf", "1e12", "0")]
    for args, says in cases:
        capsys.readouterr()
        assert main(args) == 2, args
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1 and "Traceback" not in err, (args, err)
    assert [p.name for p in Path("old").iterdir()] == ["00080.png"] and not Path("new").exists()


def test_video_frames_interrupted_goes_on_when_run_again(clip, capsys):
    # Found from outside: the rerun of an interrupted `video frames` was refused ("already holds images").
    root = clip
    assert main(["video", "frames", str(root / "clip.mp4"), "whole"]) == 0
    assert main(["video", "frames", str(root / "clip.mp4"), "cut"]) == 0
    names = sorted(p.name for p in Path("cut").glob("*.png"))
    for name in names[len(names) // 2 :]:  # (stopped half way: each PNG is whole or absent)
        Path("cut", name).unlink()
    capsys.readouterr()
    assert main(["video", "frames", str(root / "clip.mp4"), "cut"]) == 0
    assert f"going on from the {len(names) // 2} frames" in capsys.readouterr().err
    assert {n: Path("cut", n).read_bytes() for n in names} == {n: Path("whole", n).read_bytes() for n in names}
    assert main(["video", "frames", str(root / "clip.mp4"), "cut", "--fps", "5"]) == 2  # (another --fps: not mixed)


def test_video_make_of_frames_video_frames_took_has_that_videos_rate_and_sound(clip, capsys):
    # Found from outside: DFL's workspace/data_dst made into a video came out at 25 fps and silent, its video beside.
    assert main(["video", "frames", str(clip / "clip.mp4"), "all", "--fps", "10"]) == 0
    capsys.readouterr()
    assert main(["video", "make", "all", "made.mp4", "--preset", "ultrafast"]) == 0
    assert f"made.mp4: 2 frames at 10 fps with the audio of {clip / 'clip.mp4'}" in capsys.readouterr().out
    assert main(["video", "make", "all", str(clip / "clip.mp4")]) == 2  # (its own source: refused)
    assert "is the video it is made from" in capsys.readouterr().err


def test_frames_above_the_videos_rate_repeat_and_a_frames_rate_outlives_its_video(clip, capsys):
    # Found from outside: --fps 40 of a 25 fps video wrote its frames once (a video 1.6x fast against its sound),
    # and frames whose video was moved were made into a 25 fps video without a word.
    import shutil

    from bigbatch.faces.video import Video

    assert main(["video", "frames", str(clip / "clip.mp4"), "fast", "--fps", "40"]) == 0
    assert len(list(Path("fast").glob("*.png"))) == 7  # 4 frames, 0.16 s: 40 fps slots at 0, 0.025, ... 0.15 s
    shutil.copy(clip / "clip.mp4", "moved.mp4")
    assert main(["video", "frames", "moved.mp4", "ntsc", "--fps", "29.97"]) == 0
    Path("moved.mp4").unlink()
    capsys.readouterr()
    assert main(["video", "make", "ntsc", "n.mp4", "--preset", "ultrafast"]) == 0
    out, err = capsys.readouterr()
    assert "ntsc's frames came from, is gone or changed since: their rate (29.97 fps) kept, no sound" in err, err
    with Video("n.mp4") as v:
        assert abs(float(v.rate) - 29.97) < 1e-3


def test_a_video_cut_short_or_damaged_inside_is_read_and_said(clip, capsys):
    # Found from outside: a cut file gave a third of its frames without a word, and one damaged packet in the middle
    # stopped video frames, extract and merge of the whole video.
    _faces.write_video(Path("long.mp4"), 50, 160, 120, audio=False, faststart=True)  # (its index first)
    data = Path("long.mp4").read_bytes()
    Path("cut.mp4").write_bytes(data[: len(data) // 2])
    damaged = bytearray(data)
    damaged[len(data) // 2 : len(data) // 2 + 3000] = bytes(3000)
    Path("damaged.mp4").write_bytes(bytes(damaged))
    capsys.readouterr()
    assert main(["video", "frames", "cut.mp4", "c"]) == 0
    n = len(list(Path("c").glob("*.png")))
    assert f"cut.mp4: {n} frames decode of the 50 its container says: is it cut short?" in capsys.readouterr().err
    assert main(["video", "frames", "damaged.mp4", "d"]) == 0
    assert "damaged.mp4: 1 packet(s) of its video do not decode" in capsys.readouterr().err
    assert len(list(Path("d").glob("*.png"))) == 50  # (the frames before fill the damaged ones' slots)
    # A camcorder's or a phone's file is a video to extract (found from outside: refused as "neither an image nor a
    # video"): an empty one is read as one, and said not to decode.
    for suffix in ("MTS", "m2ts", "3gp", "mxf"):
        Path(f"camera.{suffix}").touch()
        assert main(["extract", f"camera.{suffix}", "out"]) == 2
        assert f"camera.{suffix} is not a video this FFmpeg can read" in capsys.readouterr().err
