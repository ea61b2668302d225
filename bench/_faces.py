"""Made face video for the face pipeline's tests and bench/faces.py: scikit-image's astronaut photo moved,
turned and scaled across frames by known similarities, so each frame's true face geometry is the photo's
mapped through its frame's matrix. One builder for both, so the benchmark measures what the tests check."""

from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np

BACKGROUND = 96  # grey where the photo does not reach: no mirrored second face at the borders


def photo() -> np.ndarray:
    """The astronaut (512x512 RGB uint8; its face near (225, 115))."""
    from skimage import data

    return np.ascontiguousarray(data.astronaut())


def frame_matrices(n: int, width: int, height: int, seed: int = 0, turn: float = 20.0) -> list[np.ndarray]:
    """n 2x3 matrices photo -> frame: the face drifts over the frame, turns up to `turn` degrees and is
    40-55% of the frame's height (a close shot) on a smooth path, as a handheld clip's face moves."""
    rng = np.random.default_rng(seed)
    phase = rng.uniform(0, 2 * math.pi, 4)
    out = []
    for i in range(n):
        t = i / max(n - 1, 1)
        angle = turn * math.sin(2 * math.pi * t + phase[0])
        scale = height / 512 * (1.05 + 0.15 * math.sin(2 * math.pi * t + phase[1]))
        cx = width * (0.5 + 0.2 * math.sin(2 * math.pi * t + phase[2]))
        cy = height * (0.55 + 0.05 * math.sin(2 * math.pi * t + phase[3]))
        m = cv2.getRotationMatrix2D((225.0, 115.0), angle, scale)  # about the face's centre
        m[:, 2] += (cx - 225.0, cy - 115.0 * 1.0)
        out.append(m)
    return out


def frames(n: int, width: int, height: int, seed: int = 0, turn: float = 20.0):  # noqa: ANN201 - generator
    """(frame RGB uint8 (height, width, 3), matrix photo -> frame) for each of n frames."""
    image = photo()
    for m in frame_matrices(n, width, height, seed, turn):
        frame = cv2.warpAffine(
            image,
            m,
            (width, height),
            flags=cv2.INTER_LINEAR,
            borderMode=cv2.BORDER_CONSTANT,
            borderValue=(BACKGROUND,) * 3,
        )
        yield frame, m


def write_video(
    path: Path, n: int, width: int, height: int, fps: int = 25, seed: int = 0, audio: bool = True, faststart=False
) -> list:
    """A face clip as H.264 (with a 440 Hz tone as its audio track; `faststart`: its index before the frames, as
    a phone's or a web video's); returns the frames' matrices."""
    import av

    mats = []
    with av.open(str(path), "w", options={"movflags": "faststart"} if faststart else {}) as c:
        v = c.add_stream("libx264", rate=fps)
        v.width, v.height, v.pix_fmt = width, height, "yuv420p"
        v.options = {"crf": "12"}
        a = c.add_stream("aac", rate=48000) if audio else None
        if a is not None:  # the audio first: small enough for the muxer to hold while it interleaves
            t = np.arange(int(48000 * n / fps)) / 48000
            tone = (0.2 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[None]
            for k in range(0, tone.shape[1], 1024):
                f = av.AudioFrame.from_ndarray(
                    np.ascontiguousarray(tone[:, k : k + 1024]), format="fltp", layout="mono"
                )
                f.sample_rate, f.pts = 48000, k
                for p in a.encode(f):
                    c.mux(p)
            for p in a.encode():
                c.mux(p)
        for frame, m in frames(n, width, height, seed):
            mats.append(m)
            for p in v.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                c.mux(p)
        for p in v.encode():
            c.mux(p)
    return mats


def write_frames(folder: Path, n: int, width: int, height: int, seed: int = 0) -> list:
    """The same frames as PNGs named as DFL names a video's frames (00001.png, ...); returns the matrices."""
    folder.mkdir(parents=True, exist_ok=True)
    mats = []
    for i, (frame, m) in enumerate(frames(n, width, height, seed)):
        cv2.imwrite(str(folder / f"{i + 1:05d}.png"), frame[:, :, ::-1])
        mats.append(m)
    return mats
