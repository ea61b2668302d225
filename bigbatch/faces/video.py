"""Video in and out with PyAV (its wheels bundle FFmpeg: no system ffmpeg needed). Frames are numbered as
DFL's VideoEd numbers them (`00001.png` on: ffmpeg's `%5d`), so a face extracted straight from a video and
one extracted from its frames folder name the same source frame."""

from __future__ import annotations

import contextlib
import glob
import json
import math
import os
import queue
import re
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bigbatch.errors import BigbatchError, warn
from bigbatch.faces.video_audio import _av, copy_audio, has_sound
from bigbatch.files import atomic_write, create_new, pid_alive, read_record

if TYPE_CHECKING:  # (numpy is imported where frames are written: the CLI's parser reads PRESETS from here)
    import numpy as np

# x264's speed presets, fastest first; "medium" is FFmpeg's default and so DFL's (its video_from_sequence sets none).
PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow")
VIDEO_SUFFIXES = (".mp4", ".mov", ".mkv", ".avi", ".webm", ".m4v", ".mpg", ".mpeg", ".wmv", ".flv", ".ts", ".mts")
VIDEO_SUFFIXES += (".m2ts", ".3gp", ".3g2", ".mxf", ".ogv", ".vob", ".dv", ".asf", ".f4v")  # (camcorders', phones')


@dataclass(frozen=True)
class Encoding:
    """How a video is encoded (libx264, yuv420p, as DFL's video_from_sequence): x264's speed `preset` (one of
    PRESETS: at 16 Mbit/s a faster one costs little quality, bench/RESULTS.md), at `mbit` Mbit/s (DFL asks, 16 by
    default), or `lossless`: DFL's lossless, x264 at quantizer 0 (DFL's crf 0, the same for 8-bit x264: the pixels
    as yuv420p keeps them, colour at half the resolution; a file several times larger). Refused in one line where
    it is none of those."""

    preset: str = "medium"
    mbit: float = 16.0
    lossless: bool = False

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise BigbatchError(f"x264 preset {self.preset!r} is not one of {', '.join(PRESETS)}")
        if not (math.isfinite(self.mbit) and 0.01 <= self.mbit <= 1000):
            said = f"a video's bit rate (--bitrate) must be in [0.01, 1000] Mbit/s (DFL's 16), got {self.mbit:g}"
            raise BigbatchError(said)

    def options(self, threads: int) -> dict[str, str]:
        """x264's options (FFmpeg's names) on `threads` threads (0: x264's choice)."""
        quality = {"qp": "0"} if self.lossless else {}
        return {"preset": self.preset, **quality, **({"threads": str(threads)} if threads else {})}


def natural_key(path: str | Path) -> tuple:
    """A sort key for frame names that compares runs of digits as numbers: 2.png before 10.png (string order put
    10.png, 11.png before 2.png); stem first, then the suffix (gray.png before gray16.png, a.png before a.b.png:
    found from outside, gray16.png came first, its '.' compared with the other's digits)."""
    name = Path(path)
    parts = re.split(r"([0-9]+)", name.stem)
    return [(0, int(p), p) if p.isdecimal() and p.isascii() else (1, 0, p) for p in parts], name.suffix


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")


def frame_name(index: int) -> str:
    """The file name of frame `index` (0-based) as DFL's VideoEd writes it: 00001.png for the first."""
    return f"{index + 1:05d}.png"


class Video:
    """A video file opened for reading: its frame rate, frame count (as the container says it, or None) and
    frames as RGB uint8 arrays. Raises one line when the file is not a video PyAV can decode."""

    def __init__(self, path: str | Path) -> None:
        av = _av()
        self.path = Path(path)
        if not self.path.is_file():  # (found from outside: said as FFmpeg's error, or a still image read as a video)
            what = "is a folder" if self.path.is_dir() else "does not exist"
            raise BigbatchError(f"{self.path} {what}: give a video file ({', '.join(VIDEO_SUFFIXES)})")
        if self.path.suffix.lower() in IMAGE_SUFFIXES:
            raise BigbatchError(f"{self.path} is an image, not a video: give a video ({', '.join(VIDEO_SUFFIXES)})")
        try:
            self.container = av.open(str(self.path))
        except (av.FFmpegError, UnicodeDecodeError) as e:
            raise BigbatchError(f"{self.path} is not a video this FFmpeg can read ({e})") from None
        if not self.container.streams.video:
            self.container.close()
            raise BigbatchError(f"{self.path} has no video stream")
        self.stream = self.container.streams.video[0]
        self.stream.thread_type = "AUTO"
        self.rate = self.stream.average_rate or self.stream.guessed_rate or Fraction(25)
        self.count = self.stream.frames or None

    def frames(self) -> Iterator[np.ndarray]:
        """Every frame, in order, as RGB uint8 (h, w, 3), at a constant rate: `rate` frames a second of the
        video's time, a frame shown longer repeated and one shown for less than a frame's time left out (a
        phone's variable-rate video, whose frames written at the average rate drifted from its sound: found
        from outside), as FFmpeg writes an image sequence; upright: turned by the rotation the container says
        it is displayed at (a phone's portrait video is stored on its side), as FFmpeg's autorotate does."""
        import numpy

        n, slot, start, last = 0, 0, None, None
        for frame in self._decoded():
            n += 1
            image = frame.to_ndarray(format="rgb24")
            turns = round(getattr(frame, "rotation", 0) / 90) % 4  # (counter-clockwise, as np.rot90)
            image = numpy.ascontiguousarray(numpy.rot90(image, turns)) if turns else image
            if frame.time is None:  # (no timestamps: every frame, in order)
                yield image
                continue
            start = frame.time if start is None else start
            at = round((frame.time - start) * self.rate)  # the slot of the frame's time
            if at < slot:  # shown for less than a slot: the frame before it has that slot, and this one is
                last = image  # what shows until the next frame, repeated in the slots before it (FFmpeg's)
                continue
            while last is not None and slot < at:  # the frame before shown until now
                yield last
                slot += 1
            yield image
            slot, last = at + 1, image
        if n == 0:
            raise BigbatchError(f"{self.path}: no frame decodes")
        if self.count and n < self.count - max(2, self.count // 100):  # (found from outside: a cut file, unsaid)
            warn(f"{self.path}: {n} frames decode of the {self.count} its container says: is it cut short?")

    def _decoded(self) -> Iterator[Any]:
        """The stream's frames, decoded packet by packet: a packet that does not decode is passed over (its frame's
        slot then holds the frame before, as FFmpeg conceals it), said once the video is read; found from outside,
        one damaged packet stopped a whole video."""
        av = _av()
        bad, first = 0, None
        packets = self.container.demux(self.stream)
        while True:
            try:
                packet = next(packets)
            except StopIteration:
                break
            except av.FFmpegError as e:  # (the container itself damaged there: found by review, a traceback)
                warn(f"{self.path}: its container cannot be read past here ({e}): the frames before it taken")
                break
            try:
                yield from packet.decode()
            except av.FFmpegError as e:
                bad, first = bad + 1, first or str(e)
        if bad:
            warn(f"{self.path}: {bad} packet(s) of its video do not decode ({first}): their frames are the ones before")

    def reading(self) -> str | None:
        """How `frames` reads this video where an older bigbatch read it otherwise: "upright" (it has a display
        rotation), "constant-rate" (its frame rate varies: the stream's nominal rate is not its average), both,
        or None. Read from the stream and its first frame."""
        av, said = _av(), []
        try:  # (a first frame that does not decode is said by `frames`, in one line, where it is read)
            first = next(self.container.decode(self.stream), None)
            self.container.seek(0)
        except av.FFmpegError:
            first = None
        if first is not None and round(getattr(first, "rotation", 0) / 90) % 4:
            said.append("upright")
        nominal, average = self.stream.guessed_rate, self.stream.average_rate
        if nominal and average and abs(float(nominal) - float(average)) > 1e-3 * float(average):
            said.append("constant-rate")
        return ", ".join(said) or None

    def close(self) -> None:
        self.container.close()

    def __enter__(self) -> Video:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def is_video(path: Path) -> bool:
    return path.suffix.lower() in VIDEO_SUFFIXES


# The containers that take H.264 (WebM holds VP8/VP9/AV1 only, Ogg Theora, DV its own), and of those the MPEG program
# streams, which take no AAC sound (found from outside: FFmpeg's error, a traceback, after the frames were encoded).
WRITE_SUFFIXES = tuple(s for s in VIDEO_SUFFIXES if s not in (".webm", ".ogv", ".dv"))
NO_AAC = (".mpg", ".mpeg", ".vob", ".mxf")


def check_sound_fits(out: str | Path, audio: str | Path | None) -> None:
    """Refuse, in one line and before any work, sound for a video `out` whose container takes no AAC."""
    if audio is not None and Path(out).suffix.lower() in NO_AAC and has_sound(audio):
        raise BigbatchError(
            f"{out}: an MPEG program stream ({Path(out).suffix}) takes no AAC sound, and {audio} has sound: give "
            ".mp4, .mkv or .mov"
        )


def video_rate(path: str | Path) -> Fraction | None:
    """The frame rate of the video `path`, or None (a sound file, or no video)."""
    try:
        with Video(path) as v:
            return v.rate
    except BigbatchError:
        return None


def say_speed(fps: float | None, rate: Fraction, audio: str | Path | None, taken: float | None) -> None:
    """Warn where a rate given (`fps`, made `rate`) makes a video play at another speed than its sound `audio`,
    whose frames are `taken` a second (`video frames`' --fps), else its video's (found from outside: 2.5 s of video
    with 1.3 s of sound; `video make` unsaid where `merge --video` said it)."""
    if fps is None or audio is None or not has_sound(audio):
        return
    own = frame_rate(taken) if taken else video_rate(audio)  # (the frames' own rate)
    if own is not None and own != rate:  # (the rate `video frames` took them at, said as such: found from outside)
        whose = f"its frames taken {float(own):g} a second" if taken else f"whose frames are {float(own):g} a second"
        warn(
            f"--fps {fps:g} with the sound of {audio}, {whose}: the video plays at another speed than its sound; "
            "leave out --fps to keep their rate"
        )


COLOUR = (6, 1, 1, 13)  # AVCOL_SPC_SMPTE170M (BT.601), AVCOL_RANGE_MPEG, AVCOL_PRI_BT709, AVCOL_TRC_IEC61966_2_1


def check_video_out(out: str | Path, name: str, *sources: str | Path | None) -> None:
    """Refuse, in one line, a video to write that could not be written: a name no H.264 container has, an
    existing folder, or a place under a file (said before any work, not by the encoder after it); or one of the
    `sources` it is made from (found from outside: the dst video was replaced by its merge)."""
    path = Path(out)
    for source in sources:
        if source is not None and Path(source).is_file() and Path(source).resolve() == path.resolve():
            raise BigbatchError(f"{name} {out} is the video it is made from: give another name for the video")
    if path.suffix.lower() not in WRITE_SUFFIXES:
        raise BigbatchError(f"{name} {out}: give a video file name ({', '.join(WRITE_SUFFIXES)})")
    if path.is_dir():
        raise BigbatchError(f"{name} {out} is a folder: give a video file name such as {path / 'out.mp4'}")
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise BigbatchError(f"{name} {out}: {parent} is a file, not a folder; give another path for the video")


def check_one_size(paths: list[Path]) -> None:
    """Refuse images of more than one size in one line, before a video is made of them, as `video make` refuses
    them: sizes read from the files' headers (image_file.header_size: no pixels decoded), so said before hours of
    merging. A file whose header does not read is left to its decoder to say."""
    from bigbatch.faces.image_file import header_size

    size = None
    for p in paths:
        if (got := header_size(p)) is None:
            continue
        if size is not None and got != size:
            raise another_size(p, got, size)
        size = got


def another_size(what: object, got: tuple[int, ...], size: tuple[int, ...]) -> BigbatchError:
    """The one line refusing a frame (`what`) of (height, width) `got` after frames of `size`: a video has one size."""
    return BigbatchError(
        f"{what} is {got[1]}x{got[0]}, the frames before it {size[1]}x{size[0]}: give frames of one size"
    )


MAX_FPS = 1000  # (found from outside: 1e12 fps died half way through a merge; NaN was taken, or ignored)
MIN_FPS = 0.001  # (a frame in 1000 s, 1/1000 as a rate of denominator 1001; found from outside: 0.0001 wrote 24 fps)


def check_fps(fps: float | None) -> None:
    """A frame rate given (--fps): a finite number above 0, at most MAX_FPS (the fastest cameras' slow-motion
    files play far slower), or None."""
    if fps is not None and not MIN_FPS <= fps <= MAX_FPS:  # (NaN fails both)
        raise BigbatchError(f"--fps must be a frame rate of {MIN_FPS} to {MAX_FPS}, got {fps}")


FRAMES_RECORD = ".frames.json"  # in `video frames`' DIR: the video and --fps its frames are of, for a rerun


def frames_to_folder(video: str | Path, out: str | Path, fps: float | None = None) -> int:
    """`bigbatch video frames`: every frame of `video` (or `fps` of them a second) as out/00001.png, ...;
    returns how many. Each PNG is written whole (temporary name, then renamed); a rerun of the same video and fps
    goes on where an interrupted one stopped (DIR/.frames.json)."""
    import cv2

    check_fps(fps)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BigbatchError(f"DIR {out} is a file: give a new or empty folder for the frames")
    with Video(video) as v:
        st = Path(video).stat()
        record = {"video": str(Path(video).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "fps": fps}
        record["rate"] = str(frame_rate(fps) if fps else v.rate)  # (the frames': theirs)
        before = out.is_dir() and sum(1 for p in out.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if before and {**read_record(out / FRAMES_RECORD), "rate": record["rate"]} != record:  # (older ones': no rate)
            # (older frames left there would be mixed with these by extract, merge and video make)
            raise BigbatchError(f"DIR {out} already holds images: give a new or empty folder for the frames")
        if before:  # (found from outside: an interrupted run's rerun was refused, its folder to delete by hand)
            print(f"going on from the {before} frames of {video} written to {out} before", file=sys.stderr)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / FRAMES_RECORD, json.dumps(record))
        # Slot k (of --fps) is at k x step in the video's frames: below the video's rate it takes the first frame at
        # or after that, above it the frame showing then, each frame filling the slots of its time, as FFmpeg's -r
        # does (found from outside: 40 fps of a 25 fps video wrote its 75 frames, 1.6x fast against its sound).
        written, due = 0, 0.0
        step = float(v.rate / frame_rate(fps)) if fps else 1.0
        for i, frame in enumerate(v.frames()):
            png = None  # (encoded once for the slots it fills)
            while due < i + 1 - 1e-9 if step < 1 else due <= i + 1e-9:
                due += step
                path = out / frame_name(written)
                if not path.exists():
                    png = png if png is not None else cv2.imencode(".png", frame[:, :, ::-1])[1].tobytes()
                    atomic_write(path, png, sync=False)
                written += 1
    return written


def recorded_video(folder: str | Path, said: bool = True) -> tuple[Path | None, float | None]:
    """The video `video frames` took FOLDER's frames from, where it is still there, and the --fps it took them at
    (FOLDER/.frames.json; None, None for another folder). Found from outside: `merge --video` of DFL's
    workspace/data_dst wrote 25 fps and no sound, its own video beside it. A video gone since: None, and the frames'
    rate, `said` (found from outside: 29.97 fps frames made into a 25 fps video, without a word)."""
    record = read_record(Path(folder) / FRAMES_RECORD)
    video, fps = record.get("video"), record.get("fps")
    fps = fps if isinstance(fps, (int, float)) and not isinstance(fps, bool) else None
    if isinstance(video, str) and not _unchanged(Path(video), record):
        try:
            rate = float(Fraction(record.get("rate")))  # (written by `video frames` since it kept the rate)
        except (TypeError, ValueError, ZeroDivisionError):
            rate = None
        rate = rate if rate and 0 < rate <= MAX_FPS else fps
        if rate is not None and said:
            warn(
                f"{video}, the video {folder}'s frames came from, is gone or changed since: their rate ({rate:g} fps) "
                "kept, no sound"
            )
        return None, rate
    if not isinstance(video, str):
        return None, None
    return Path(video), fps


def _unchanged(video: Path, record: dict) -> bool:
    """Whether `video` is there with the size and time `record` holds, where it holds them (found from outside: a
    video replaced at its path gave another clip's sound)."""
    try:
        st = video.stat()
    except OSError:
        return False
    return all(record.get(k) in (None, v) for k, v in (("size", st.st_size), ("mtime_ns", st.st_mtime_ns)))


def write_video(
    frames: Iterator[np.ndarray],
    out: str | Path,
    fps: float | Fraction,
    audio_from: str | Path | None = None,
    encoding: Encoding = Encoding(),
    threads: int = 0,
) -> int:
    """Frames (RGB uint8, all one size, else refused; odd sides cut even) into `out` as `encoding` says, on
    `threads` threads (0: x264's choice, 1.5 a core; one thread spends 13-20% less CPU time, for when other work has
    the cores), and, from `audio_from`, its first audio stream re-encoded to AAC 192 kbit/s. Written to a temporary
    file and renamed, so `out` is a whole video or absent. Returns the frame count."""
    av = _av()
    out = Path(out)
    _remove_stale(out)
    tmp = out.with_name(f".{out.stem}.tmp-{os.getpid()}{out.suffix}")
    rate = Fraction(fps).limit_denominator(1001) if not isinstance(fps, Fraction) else fps
    count = 0
    with _said_of(out, tmp):
        create_new(tmp).close()  # (ours before FFmpeg opens it, which would follow a link planted there)
    try:
        with _said_of(out, tmp):
            with av.open(str(tmp), "w") as container:
                stream = None
                for frame in frames:
                    if stream is None:
                        size = h, w = frame.shape[:2]
                        if min(h, w) < 2:  # (found from outside: IndexError from the encoder)
                            raise BigbatchError(f"frames of {w}x{h} pixels: a video's frames are at least 2x2")
                        stream = container.add_stream("libx264", rate=rate)
                        stream.width, stream.height = w - w % 2, h - h % 2  # yuv420p needs even sides
                        if (stream.width, stream.height) != (w, h):  # (found from outside: unsaid)
                            warn(
                                f"frames of {w}x{h}: {out} is {stream.width}x{stream.height}, its last "
                                f"{'column' if w % 2 else 'row'}{' and row' if w % 2 and h % 2 else ''} cut "
                                "(H.264's yuv420p takes even sides)"
                            )
                        stream.pix_fmt = "yuv420p"
                        # What the frames are and how they were made YUV (FFmpeg's RGB-to-YUV: BT.601's matrix, limited
                        # range), said in the stream, so that a player decodes them so (found from outside: untagged HD
                        # shifted green in a player taking BT.709's); FFmpeg's numbers: matrix, range, primaries, sRGB
                        context = stream.codec_context
                        context.colorspace, context.color_range, context.color_primaries, context.color_trc = COLOUR
                        if not encoding.lossless:
                            stream.bit_rate = round(encoding.mbit * 1e6)
                        stream.options = encoding.options(threads)
                        if audio_from is not None:
                            # Every stream is added before the first packet; the audio goes first, as it is small
                            # enough for the muxer to hold while it interleaves the video after it.
                            copy_audio(av, Path(audio_from), container)
                    if frame.shape[:2] != size:  # (found from outside: merge --video cropped or stretched them)
                        raise another_size(f"frame {count + 1}", frame.shape, size)
                    frame = frame[: stream.height, : stream.width]
                    frame = frame if frame.flags.c_contiguous else frame.copy()
                    for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                        container.mux(packet)
                    count += 1
                if stream is None:
                    raise BigbatchError("no frames to make a video of")
                for packet in stream.encode():
                    container.mux(packet)
            os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return count


@contextlib.contextmanager
def _said_of(out: Path, tmp: Path) -> Iterator[None]:
    """An OSError of the temporary file `tmp` said of `out`, the video the user named, as bigbatch.files.atomic_write
    says its own (found from outside: "rodir/.v.tmp-20322.mp4: Operation not permitted")."""
    try:
        yield
    except OSError as e:
        if e.filename is None or os.fsdecode(e.filename) != str(tmp):
            raise
        raise OSError(e.errno, e.strerror, str(out)) from None


def _remove_stale(out: Path) -> None:
    """The temporary files of writes of `out` by processes killed while writing it (found from outside: one
    was left beside the video, a rerun did not remove it)."""
    prefix = f".{out.stem}.tmp-"
    for path in out.parent.glob(f"{glob.escape(prefix)}*{glob.escape(out.suffix)}"):
        pid = path.name[len(prefix) : len(path.name) - len(out.suffix)]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            path.unlink(missing_ok=True)


class VideoWriter:
    """`write_video` on a thread of its own, given its frames one at a time by `add`, so that the encoding runs
    while the caller makes the next frames (x264 and the muxer let go of the GIL). `close` finishes the file
    and returns its frame count; `abort` (or leaving a `with` block on an exception) leaves no file."""

    _END, _ABORT = object(), object()

    def __init__(
        self,
        out: str | Path,
        fps: float | Fraction,
        audio_from: str | Path | None = None,
        encoding: Encoding = Encoding(),
        threads: int = 0,
    ) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=16)
        self._error: BaseException | None = None
        self.count = 0
        self._thread = threading.Thread(target=self._run, args=(out, fps, audio_from, encoding, threads), daemon=True)
        self._thread.start()

    def _frames(self) -> Iterator[np.ndarray]:
        while (frame := self._queue.get()) is not self._END:
            if frame is self._ABORT:
                raise _Aborted
            yield frame

    def _run(
        self, out: str | Path, fps: float | Fraction, audio: str | Path | None, how: Encoding, threads: int
    ) -> None:
        try:
            self.count = write_video(self._frames(), out, fps, audio, how, threads)
        except _Aborted:
            pass
        except BaseException as e:  # (given to the caller at its next add or close)
            self._error = e

    def _put(self, item: object) -> None:
        while True:
            if self._error is not None:
                raise self._error
            if not self._thread.is_alive():
                return
            try:
                self._queue.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def add(self, frame: np.ndarray) -> None:
        """The next frame (RGB uint8; every frame one size)."""
        self._put(frame)

    def close(self) -> int:
        self._put(self._END)
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.count

    def abort(self) -> None:
        if self._thread.is_alive() and self._error is None:
            self._put(self._ABORT)
        self._thread.join()

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, kind: type | None, *exc: object) -> None:
        if kind is not None:
            with contextlib.suppress(Exception):  # (the exception that ends the block is the one to say)
                self.abort()


class _Aborted(Exception):
    pass


def frame_rate(fps: float | None, like: str | Path | None = None) -> Fraction:
    """A video's frame rate: `fps` if given, else the video `like`'s, else 25 (a `like` of audio only too)."""
    if fps:  # (29.97 typed: NTSC's 30000/1001, as cameras write it; found from outside, 2997/100 drifted)
        ntsc = [Fraction(n, 1001) for n in (24000, 30000, 48000, 60000, 120000) if abs(fps - n / 1001) < 0.006]
        return ntsc[0] if ntsc else Fraction(fps).limit_denominator(1001)
    if like is not None:
        try:
            with Video(like) as v:
                return v.rate
        except BigbatchError:
            pass
    return Fraction(25)
