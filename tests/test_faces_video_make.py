"""`bigbatch video make` as a DFL user meets it: the sound of the video the frames came from kept with --fps too, and
what it cannot write (an empty frame, frames of one pixel, a container that takes no H.264 or no AAC, a rate that
rounds to none) refused in one line before any encoding."""

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
from bigbatch.faces.video_audio import has_sound  # noqa: E402


def frames(folder: str, n: int, side: int = 16) -> None:
    Path(folder).mkdir()
    for i in range(n):
        cv2.imwrite(f"{folder}/{i + 1:05d}.png", np.full((side, side, 3), 40 * i, np.uint8))


def test_make_with_fps_keeps_the_sound_of_the_video_the_frames_came_from_and_says_the_speed(tmp_path, capsys):
    # (found from outside: --fps dropped the sound without a word, where merge --video kept it)
    _faces.write_video(tmp_path / "clip.mp4", 4, 64, 48)
    assert main(["video", "frames", str(tmp_path / "clip.mp4"), "taken"]) == 0
    capsys.readouterr()
    assert main(["video", "make", "taken", "same.mp4", "--fps", "25", "--preset", "ultrafast"]) == 0
    said = capsys.readouterr()
    assert f"with the audio of {tmp_path / 'clip.mp4'}" in said.out and has_sound("same.mp4")
    assert "another speed" not in said.err, said.err
    assert main(["video", "make", "taken", "fast.mp4", "--fps", "50", "--preset", "ultrafast"]) == 0
    assert "--fps 50 with the sound of" in capsys.readouterr().err and has_sound("fast.mp4")


def test_what_make_cannot_write_is_one_line_before_any_encoding(tmp_path, capsys):
    _faces.write_video(tmp_path / "clip.mp4", 2, 64, 48)
    frames("ok", 3)
    frames("empty", 3)
    Path("empty/00002.png").write_bytes(b"")  # (found from outside: OpenCV's assertion, a traceback)
    Path("dot").mkdir()
    cv2.imwrite("dot/00001.png", np.zeros((1, 1, 3), np.uint8))  # (the encoder's IndexError)
    cases = [
        (["empty", "e.mp4"], "empty/00002.png does not decode as an image"),
        (["dot", "d.mp4"], "frames of 1x1 pixels: a video's frames are at least 2x2"),
        (["ok", "o.dv"], "OUT o.dv: give a video file name"),  # (DV and Ogg take no H.264)
        (["ok", "o.ogv"], "OUT o.ogv: give a video file name"),
        (["ok", "o.mpg", "--audio-from", str(tmp_path / "clip.mp4")], "o.mpg: an MPEG program stream (.mpg) takes no"),
        (["ok", "o.mp4", "--fps", "0.0001"], "--fps must be a frame rate of 0.001 to 1000, got 0.0001"),
    ]
    for args, says in cases:
        assert main(["video", "make", *args]) == 2, args
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1, (args, err)
    assert not [p for p in Path().iterdir() if p.suffix in (".mp4", ".dv", ".ogv", ".mpg") and p.name != "clip.mp4"]
    assert main(["video", "make", "ok", "silent.mpg", "--preset", "ultrafast"]) == 0  # (without sound it takes them)


def test_a_gap_in_the_sources_sound_is_silence_in_the_videos_not_closed_up(tmp_path):
    # (found from outside: 0.2 s of lost audio packets put a click at frame 25 0.2 s early, and all after it)
    import av

    with av.open("gap.mkv", "w") as c:
        video = c.add_stream("libx264", rate=25)
        video.width = video.height = 64
        video.pix_fmt, video.options = "yuv420p", {"preset": "ultrafast"}
        sound = c.add_stream("aac", rate=44100, layout="stereo")
        for i in range(50):
            frame = av.VideoFrame.from_ndarray(np.full((64, 64, 3), 255 * (i == 25), np.uint8), format="rgb24")
            frame.pts = i
            c.mux(video.encode(frame))
        c.mux(video.encode())
        samples = np.zeros(2 * 44100, np.float32)
        samples[44100 : 44100 + 441] = 0.8  # a click at 1 s, frame 25's time
        for k in range(0, len(samples), 1024):
            if 0.3 * 44100 <= k < 0.5 * 44100:  # (0.2 s of packets lost)
                continue
            piece = av.AudioFrame.from_ndarray(np.stack([samples[k : k + 1024]] * 2), format="fltp", layout="stereo")
            piece.sample_rate, piece.pts = 44100, k
            c.mux(sound.encode(piece))
        c.mux(sound.encode())
    assert main(["video", "frames", "gap.mkv", "taken"]) == 0
    assert main(["video", "make", "taken", "out.mp4", "--preset", "ultrafast"]) == 0
    with av.open("out.mp4") as c:
        heard = np.concatenate([f.to_ndarray()[0] for f in c.decode(c.streams.audio[0])])
        rate = c.streams.audio[0].rate
    onset = np.argmax(np.abs(heard) > 0.4) / rate  # (the click's start)
    assert abs(onset - 1.0) < 0.005, onset  # (on its frame, within 5 ms)


def test_a_video_says_how_its_colours_were_made(tmp_path):
    # (found from outside: untagged, an HD video's BT.601 colours were a player's to guess, BT.709 shifting green)
    import av

    from bigbatch.faces.video import Video

    Path("hd").mkdir()
    cv2.imwrite("hd/00001.png", np.full((720, 1280, 3), (0, 255, 0), np.uint8))  # (BGR: pure green)
    assert main(["video", "make", "hd", "hd.mp4", "--preset", "ultrafast"]) == 0
    with av.open("hd.mp4") as c:
        context = c.streams.video[0].codec_context
        tags = context.colorspace, context.color_range, context.color_primaries, context.color_trc
    assert tags == (6, 1, 1, 13)  # BT.601's matrix, limited range, BT.709's primaries, sRGB's transfer
    with Video("hd.mp4") as v:
        (frame,) = list(v.frames())
    assert np.abs(frame[360, 640].astype(int) - (0, 255, 0)).max() <= 2


def test_frames_missing_from_the_numbers_are_said(tmp_path, capsys):
    # Found from outside: 00001-00005 and 00009 made a video of 6 frames without a word (its sound then out of step).
    frames("gap", 6)
    Path("gap/00006.png").rename("gap/00009.png")
    assert main(["video", "make", "gap", "gap.mp4", "--fps", "25", "--preset", "ultrafast"]) == 0
    assert "3 frames missing from gap's numbers (00006 first): the video closes the gap" in capsys.readouterr().err
    frames("whole", 3)
    assert main(["video", "make", "whole", "whole.mp4", "--fps", "25", "--preset", "ultrafast"]) == 0
    assert "missing" not in capsys.readouterr().err


def test_the_sound_of_a_video_replaced_since_is_not_taken_and_frames_missing_at_the_start_are_said(tmp_path, capsys):
    # Found from outside: a clip replaced at the frames' video's path gave its sound and rate; frames deleted from the
    # start of a video's frames were unsaid (the picture then behind its sound).
    clip = tmp_path / "clip.mp4"
    _faces.write_video(clip, 4, 64, 48)
    assert main(["video", "frames", str(clip), "taken"]) == 0
    Path("taken/00001.png").unlink()
    capsys.readouterr()
    assert main(["video", "make", "taken", "a.mp4", "--preset", "ultrafast"]) == 0
    said = capsys.readouterr()
    assert "1 frame missing from taken's numbers (00001 first)" in said.err and has_sound("a.mp4"), said
    _faces.write_video(clip, 2, 64, 48, fps=12, seed=1)  # (another clip at its path)
    assert main(["video", "make", "taken", "b.mp4", "--preset", "ultrafast"]) == 0
    said = capsys.readouterr()
    assert f"{clip}, the video taken's frames came from, is gone or changed since: their rate (25 fps)" in said.err
    assert "with the audio" not in said.out and not has_sound("b.mp4"), said
