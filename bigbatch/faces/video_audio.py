"""A written video's sound with PyAV: whether a file has one, what the video says of it, and the copy of it into the
video, in step with its frames (bigbatch.faces.video's writer)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

from bigbatch.errors import BigbatchError

if TYPE_CHECKING:
    import numpy as np


def _av():  # noqa: ANN202 - PyAV's module
    try:
        import av
    except ImportError:
        raise BigbatchError("video needs PyAV: pip install av") from None
    return av


def has_sound(path: str | Path) -> bool:
    """Whether the file `path` holds an audio stream (FFmpeg's reading of it)."""
    av = _av()
    try:
        with av.open(str(path)) as c:
            return bool(c.streams.audio)
    except (av.FFmpegError, OSError):
        return False


def audio_said(source: str | Path | None) -> str:
    """What a written video says of its sound: " with the audio of SOURCE", or that SOURCE had none to copy."""
    if source is None:
        return ""
    return f" with the audio of {source}" if has_sound(source) else f" (no audio: {source} has none)"


AUDIO_RATE = 48000
AAC_LAYOUTS = ("mono", "stereo", "2.1", "3.0", "quad", "5.0", "5.1", "5.1(side)", "6.1")  # (kept; others as stereo)


def copy_audio(av, source: Path, container) -> None:  # noqa: ANN001 - PyAV objects
    """The first audio stream of `source`, re-encoded to AAC 192 kbit/s 48 kHz in its channel layout (up to 6.1) into
    `container`, in step with the frames: the written video starts at `source`'s first video frame, so an audio that
    began later starts as late (silence before it) and one that began earlier loses what came before that frame
    (DFL's ffmpeg keeps the streams' timestamps alike; found from outside: a track 0.48 s late came out 0.46 s
    early). Each piece is timestamped by its samples, so the muxer drops the AAC encoder's priming (21 ms late
    before); a gap in the source's sound is silence as long as its timestamps say. A source without video: its audio
    from its first sample."""
    import numpy as np

    try:
        src = av.open(str(source))
    except av.FFmpegError as e:
        raise BigbatchError(f"--audio-from {source}: not a file this FFmpeg can read ({e})") from None
    with src:
        if not src.streams.audio:
            if not src.streams.video:
                raise BigbatchError(f"--audio-from {source}: holds neither audio nor video")
            return  # a silent source: a silent video
        start = _first_frame_time(av, source)
        # (found from outside: mono came out stereo, 3 dB lower a channel; layouts AAC's encoder is tested with here)
        layout = src.streams.audio[0].layout.name
        stream = container.add_stream("aac", rate=AUDIO_RATE, layout=layout if layout in AAC_LAYOUTS else "stereo")
        stream.bit_rate = 192_000
        fmt, layout = stream.format.name, stream.layout.name
        resampler = av.AudioResampler(format=fmt, layout=layout, rate=AUDIO_RATE)
        written, skip = 0, None
        began, heard = None, 0.0  # (the first audio frame's time; the seconds of sound read since, gaps filled)

        def put(piece) -> None:  # noqa: ANN001
            nonlocal written, skip
            if skip:  # (the audio before the first frame)
                cut = min(skip, piece.samples)
                skip -= cut
                if cut == piece.samples:
                    return
                piece = _frame_of(av, piece.to_ndarray()[:, cut:], fmt, layout)
            piece.pts, piece.time_base = written, Fraction(1, AUDIO_RATE)
            written += piece.samples
            for packet in stream.encode(piece):
                container.mux(packet)

        for frame in src.decode(src.streams.audio[0]):
            if skip is None:  # the first: where it falls against the first frame, in samples
                late = 0 if start is None or frame.time is None else round((frame.time - start) * AUDIO_RATE)
                if abs(late) > 3600 * AUDIO_RATE:  # (broken timestamps: not hours of silence)
                    raise BigbatchError(
                        f"--audio-from {source}: its audio starts {late / AUDIO_RATE:+.0f} s from its first frame, "
                        "more than an hour: its timestamps look broken; give another file for the sound"
                    )
                for n in range(late, 0, -AUDIO_RATE):  # (a second of silence at a time)
                    put(
                        _frame_of(
                            av, np.zeros((len(stream.layout.channels), min(n, AUDIO_RATE)), np.float32), fmt, layout
                        )
                    )
                skip = max(-late, 0)
            began = frame.time if began is None else began
            # A gap in the source's sound (packets lost, a cut stream) filled with silence where its timestamps say,
            # not closed up (found from outside: a 0.2 s gap put all the sound after it 0.2 s early)
            rate = frame.sample_rate
            gap = 0 if frame.time is None or began is None else round((frame.time - began - heard) * rate)
            if gap > 3600 * rate:  # (broken timestamps: not hours of silence)
                raise BigbatchError(
                    f"--audio-from {source}: its audio jumps {gap / rate:.0f} s ahead at {frame.time:.1f} s, more than "
                    "an hour: its timestamps look broken; give another file for the sound"
                )
            gap = gap if gap > rate // GAP_FROM else 0
            pieces = [_silence(av, frame, min(n, rate)) for n in range(gap, 0, -rate)]  # (a second at a time)
            heard += (gap + frame.samples) / rate
            for piece in (*pieces, frame):
                piece.pts = None
                for resampled in resampler.resample(piece):
                    put(resampled)
        for piece in resampler.resample(None):
            put(piece)
        for packet in stream.encode():
            container.mux(packet)


GAP_FROM = 200  # a gap in the sound longer than 1/200 s (5 ms: under a 1024-sample AAC frame) is filled


def _silence(av, like, samples: int):  # noqa: ANN001, ANN202 - PyAV's
    """An audio frame of `samples` of silence in the format, layout and rate of the frame `like`."""
    frame = av.AudioFrame(format=like.format.name, layout=like.layout.name, samples=samples)
    for plane in frame.planes:  # (unsigned 8-bit samples are silent at 128)
        plane.update(bytes([128 if like.format.name.startswith("u8") else 0]) * plane.buffer_size)
    frame.sample_rate = like.sample_rate
    return frame


def _first_frame_time(av, source: Path) -> float | None:  # noqa: ANN001 - PyAV's module
    """When `source`'s first video frame shows, in seconds (where `Video.frames` starts), or None: no video, or
    no timestamps."""
    try:
        with av.open(str(source)) as c:
            for frame in c.decode(c.streams.video[0]) if c.streams.video else ():
                return frame.time
    except av.FFmpegError:
        pass
    return None


def _frame_of(av, samples: np.ndarray, fmt: str, layout: str):  # noqa: ANN001, ANN202 - PyAV's
    """An audio frame of planar `samples` (channels, n) at AUDIO_RATE."""
    import numpy as np

    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples), format=fmt, layout=layout)
    frame.sample_rate = AUDIO_RATE
    return frame
