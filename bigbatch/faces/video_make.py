"""`bigbatch video make`: a folder of frames as a video, at the rate and with the sound of the video they came from
(`video frames`' record, or a merge's)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import numpy as np

from bigbatch.errors import BigbatchError, counted, warn
from bigbatch.faces import merge_record
from bigbatch.faces.video import (
    FRAMES_RECORD,
    Encoding,
    another_size,
    check_fps,
    check_sound_fits,
    check_video_out,
    frame_rate,
    natural_key,
    recorded_video,
    say_speed,
    write_video,
)
from bigbatch.files import read_record


def say_gaps(names: list[Path], from_one: bool = False) -> None:
    """Warn of numbers missing between frames named by their numbers (00001.png, ...), and before the first where
    they are a video's (`from_one`: numbered from 00001): the video closes the gap, and the sound of the frames after
    it plays early (found from outside: frames deleted by hand, unsaid)."""
    numbers = [int(p.stem) for p in names if p.stem.isdigit()]
    if len(numbers) != len(names) or not numbers:
        return
    start = 1 if from_one and numbers[0] > 1 else numbers[0]
    missing = numbers[-1] - start + 1 - len(set(numbers))
    if missing > 0:
        first = start if start < numbers[0] else next(n + 1 for n, m in zip(numbers, numbers[1:]) if m > n + 1)
        warn(
            f"{counted(missing, 'frame')} missing from {names[0].parent}'s numbers ({first:05d} first): the video "
            "closes the gap: the frames after it play early (ahead of any sound)"
        )


def source_of(folder: Path, said: bool) -> tuple[Path | None, float | None]:
    """The video FOLDER's frames came from and the rate they were taken at (`recorded_video`), also for a merge's
    OUT: its FRAMES' video while it is the one merged (its bytes, as extract and merge know it), or the video those
    frames came from (found from outside: `video make` of a merge's OUT wrote 25 fps and no sound)."""
    from bigbatch.faces.extract import FrameSource
    from bigbatch.faces.extract_journal import same_source

    merged = read_record(folder / merge_record.RECORD).get("frames")
    if (folder / FRAMES_RECORD).exists() or not isinstance(merged, dict) or not isinstance(merged.get("path"), str):
        return recorded_video(folder, said)
    source = Path(merged["path"])
    if "checksum" in merged:  # (a video)
        try:
            if same_source(merged, FrameSource(str(source)).identity()):
                return source, None
        except BigbatchError:  # (gone, or no longer a video)
            pass
        if said:  # (found from outside: a clip replaced at its path gave its sound and rate)
            warn(f"{source}, the video {folder}'s frames were merged from, is gone or changed since: no sound")
        return None, None
    if source.is_dir() and source.resolve() != folder.resolve():
        return recorded_video(source, said)
    return None, None


def folder_to_video(
    folder: str | Path,
    out: str | Path,
    fps: float | None = None,
    audio_from: str | Path | None = None,
    encoding: Encoding | None = None,
    overwrite: bool = True,
) -> tuple[int, Fraction, Path | None]:
    """`bigbatch video make`: the PNG/JPEG frames of `folder` in name order (numbers as numbers) as a video; the
    frame rate is `fps`, else `audio_from`'s (a video), else 25; with neither, the rate and sound of the video
    `video frames` took them from (`recorded_video`). Returns (frames, rate, the sound's source). `overwrite`: False
    refuses an `out` that exists."""
    from bigbatch.faces.image_file import imread

    folder = Path(folder)
    if not folder.is_dir():
        raise BigbatchError(f"{folder}: no such folder of frames")
    frames = (p for p in folder.iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg") and p.is_file())
    names = sorted(frames, key=natural_key)
    if not names:
        raise BigbatchError(f"{folder} holds no frames (.png, .jpg)")
    recorded = source_of(folder, said=fps is None and audio_from is None)
    say_gaps(names, from_one=recorded != (None, None))  # (a video's frames, numbered from 00001)
    check_video_out(out, "OUT", audio_from, recorded[0])
    if not overwrite and os.path.lexists(out):  # (found from outside: replaced without a word; as export refuses)
        raise BigbatchError(f"{out} exists: give --overwrite to replace it, or another name")
    check_fps(fps)
    if audio_from is not None and not Path(audio_from).is_file():
        raise BigbatchError(f"--audio-from {audio_from}: no such file")
    given, taken = fps, None
    if audio_from is None:  # the sound of the video the frames came from (with --fps too: found from outside, dropped)
        audio_from, taken = recorded
        fps = taken if fps is None else fps
    rate = frame_rate(fps, audio_from)
    check_sound_fits(out, audio_from)
    say_speed(given, rate, audio_from, taken)
    note = None
    if audio_from is None and fps is None:  # (found from outside: 25 fps and no sound, unsaid)
        note = (
            f"{folder}: no video its frames came from is known here, and neither --fps nor --audio-from: "
            f"{float(rate):g} fps and no sound; give --audio-from SRC.mp4 (that video: its rate and its sound)"
        )
    Path(out).parent.mkdir(parents=True, exist_ok=True)

    def frames() -> Iterator[np.ndarray]:
        size = None
        for p in names:
            image = imread(p)
            if size is not None and image.shape != size:
                raise another_size(p, image.shape, size)
            size = image.shape
            yield image[:, :, ::-1]

    sound = None if audio_from is None else Path(audio_from)
    n = write_video(frames(), out, rate, audio_from, encoding or Encoding())
    if note:  # (once written: what could not be written is said alone)
        warn(note)
    return n, rate, sound
