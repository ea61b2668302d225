"""`bigbatch extract`: faces found in video frames or photos, landmarked, aligned and written as DeepFaceLab's
extractor writes them (mainscripts/Extractor.py), so DFL and `bigbatch prepare --masks dfl` read them as their
own: `{frame stem}_{i}.jpg` at JPEG quality 90, largest face first, with DFL's metadata (face type, the aligned
face's landmarks, the source frame's name, box and landmarks, the frame-to-face matrix) in its APP15 segment.

Per frame, as DFL: look for faces upright, then turned 90°, 270° and 180° until some are found; 68 landmarks in
each box; a second pass that aligns each face to `full` at 256 px, finds it again there and takes its
landmarks again (averaged over the box moved by a pixel each way), mapped back to the frame, which makes them
sub-pixel; the frame-to-face matrix of the face type; faces whose square is over 4x the detector's box are
dropped (face types up to full_no_align). OUT_debug/ beside OUT holds each frame with its boxes, landmarks and
squares drawn (DFL's aligned_debug beside aligned: inside OUT, `prepare` took it for a class folder). A journal
(OUT/.extract.jsonl) records each frame done, so a killed extract continues where it stopped."""

from __future__ import annotations

import concurrent.futures
import glob
import json
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import cv2
import numpy as np

from bigbatch.checkpoints import file_checksum
from bigbatch.data import align
from bigbatch.data.dfl_faces import write_metadata
from bigbatch.errors import BigbatchError, warn
from bigbatch.faces.extract_journal import JOURNAL, read_journal
from bigbatch.faces.image_file import TooLarge, check_size, imdecode
from bigbatch.faces.video import IMAGE_SUFFIXES, VIDEO_SUFFIXES, Video, frame_name, is_video, natural_key
from bigbatch.files import atomic_write


@dataclass(frozen=True)
class Settings:
    """What the aligned faces are: changing any of these needs a new OUT (a resumed extract checks them)."""

    face_type: str = "whole_face"  # DFL's name
    size: int = 512
    jpeg_quality: int = 90
    min_face: int = 40  # the smallest face side searched for, frame pixels (DFL's S3FD drops under 40)
    max_faces: int = 0  # per frame, largest first; 0: all
    second_pass: bool = True
    detector: str = "mtcnn+dlib"  # or "dfl": DFL's own S3FD and 2DFAN (extract's dfl_weights)


@dataclass
class Face:
    """A face in a frame: the detector's box (integer left, top, right, bottom) and 68 landmarks."""

    rect: tuple[int, int, int, int]
    landmarks: np.ndarray


# -- Sources: a video file, a folder of images, a glob, or one image -------------------------------------------------


class FrameSource:
    """Where the frames come from, parsed once from SRC (a video, a folder of images, a glob or one image):
    `count`, `names()` in order (numbers in names as numbers: 2.png before 10.png), `frames()`, and what
    identifies it (`identity()`, a frame's `stat`). `outputs`: what a frame's name (its stem) becomes, said where
    two frames of one name would collide (extract's faces; merge's merged frames)."""

    def __init__(self, src: str, outputs: Callable[[str], str] = lambda s: f"the faces' names ({s}_0.jpg)") -> None:
        path = Path(src)
        self.src = src
        self.video: Path | None = None
        self.files: list[Path] = []
        self.folder: Path | None = None  # a folder of images
        self.glob = False
        self._reading: str | None = None  # how its frames are read where an older bigbatch read them otherwise
        self._checksum: tuple[tuple[int, int], str] | None = None  # a video's: (its size and time, its bytes')
        if path.is_file() and is_video(path):
            self.video = path
            with Video(path) as v:
                self.count = v.count
                self._reading = v.reading()
        elif path.is_file():
            if path.suffix.lower() not in IMAGE_SUFFIXES:
                raise BigbatchError(
                    f"{src} is neither an image ({', '.join(IMAGE_SUFFIXES)}) nor a video ({', '.join(VIDEO_SUFFIXES)})"
                )
            check_size(path)  # (one image: refused in one line, before the models load)
            self.files = [path]
        elif path.is_dir():
            self.folder = path
            images = (p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
            self.files = sorted(images, key=natural_key)
            if not self.files:
                raise BigbatchError(f"{src} holds no images ({', '.join(IMAGE_SUFFIXES)}): give a folder of frames")
        elif any(c in src for c in "*?["):
            self.glob = True
            images = (Path(p) for p in glob.glob(src) if Path(p).suffix.lower() in IMAGE_SUFFIXES)
            self.files = sorted(images, key=natural_key)
            if not self.files:
                raise BigbatchError(f"{src} matches no images: check the pattern (quote it so the shell keeps it)")
        else:
            raise BigbatchError(f"{src}: no such file or folder (give a video, a folder of images, a glob or an image)")
        if self.files:
            seen: dict[str, Path] = {}
            for p in self.files:
                if (other := seen.setdefault(p.stem, p)) is not p:  # (found from outside: the pair was not named)
                    raise BigbatchError(
                        f"{src} has two images of one name, {other.name} and {p.name}: "
                        f"{outputs(p.stem)} would collide; keep one of each"
                    )
            self.count = len(self.files)
        self._by_name = {p.name: p for p in self.files}  # (an image frame's file, for `stat`)

    def identity(self) -> dict:
        """What the source is, for a journal or record to tell it from another: its path (resolved; a glob's
        pattern made absolute), and for a video its size, time and its bytes' checksum (an image's own are taken by
        `stat`): the same video touched, copied or moved is known by its bytes (see `same_source`)."""
        if self.video is not None:
            st = self.video.stat()
            if self._checksum is None or self._checksum[0] != (st.st_size, st.st_mtime_ns):
                self._checksum = (st.st_size, st.st_mtime_ns), file_checksum(self.video)
            found = {"path": str(self.video.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
            found["checksum"] = self._checksum[1]
            return found | ({"frames": self._reading} if self._reading else {})
        if self.folder is None and not self.glob:
            return {"path": str(self.files[0].resolve())}
        return {"path": str(self.folder.resolve() if self.folder is not None else Path(self.src).absolute())}

    def stat(self, name: str) -> list[int] | None:
        """[size, mtime_ns] of image frame `name` (None for a video's frames)."""
        if self.video is not None:
            return None
        st = self._by_name[name].stat()
        return [st.st_size, st.st_mtime_ns]

    def folders(self) -> set[Path]:
        """The folders (resolved) whose images are the frames; none for a video or one image."""
        if self.folder is None and not self.glob:
            return set()
        return {p.parent.resolve() for p in self.files}

    def names(self) -> list[str] | None:
        """The frames' names in order (None for a video whose container does not say its frame count)."""
        if self.video is not None:
            return [frame_name(i) for i in range(self.count)] if self.count else None
        return [p.name for p in self.files]

    def frames(self, skip: set[str]) -> Iterator[tuple[str, np.ndarray | Path]]:
        """(name, image) of each frame not in `skip`: a video's decoded frames, or images' paths (decoded where
        they are processed)."""
        if self.video is not None:
            with Video(self.video) as v:
                for i, frame in enumerate(v.frames()):
                    if frame_name(i) not in skip:
                        yield frame_name(i), frame
            return
        for p in self.files:
            if p.name not in skip:
                yield p.name, p


def read_image(path: Path, even: bool = True) -> np.ndarray | None:
    """An image file as RGB uint8 with even sides (DFL's cut_odd_image; `even` False: as it is), or None when it
    does not decode (or is too large to decode safely: said in a warning)."""
    data = np.fromfile(str(path), np.uint8)
    logs = cv2.utils.logging
    level = logs.getLogLevel()
    logs.setLogLevel(logs.LOG_LEVEL_SILENT)  # (a broken file is said once, by us: found from outside, OpenCV's lines)
    try:
        image = imdecode(data, cv2.IMREAD_UNCHANGED, str(path)) if data.size else None
    except TooLarge as e:
        warn(str(e))
        return None
    finally:
        logs.setLogLevel(level)
    if image is None:
        return None
    if image.dtype == np.uint16:  # 16-bit PNG or TIFF: its levels, scaled (found from outside: stretched to its range)
        image = np.round(image / 257).astype(np.uint8)
    elif image.dtype != np.uint8:  # float TIFF, 32-bit: its range stretched to 0..255
        image = cv2.normalize(image, None, 0, 255, cv2.NORM_MINMAX).astype(np.uint8)
    if image.ndim == 2:
        image = cv2.cvtColor(image, cv2.COLOR_GRAY2RGB)
    elif image.shape[2] == 4:
        image = cv2.cvtColor(image, cv2.COLOR_BGRA2RGB)
    else:
        image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    h, w = image.shape[:2]
    return image[: h - h % 2, : w - w % 2] if even else image


# -- Finding faces ----------------------------------------------------------------------------------------------------


def _turn(image: np.ndarray, rot: int) -> np.ndarray:
    if rot == 90:
        return image.swapaxes(0, 1)[:, ::-1]
    if rot == 180:
        return image[::-1, ::-1]
    if rot == 270:
        return image.swapaxes(0, 1)[::-1]
    return image


def _turn_back(face: Face, rot: int, w: int, h: int, dfl: bool = False) -> Face:
    """A face found in the image turned by `rot`, in the upright frame's pixels (DFL's landmarks_stage). The box's
    corners turn about the frame's edges; its landmarks, at pixels' centres, about the last pixels' (found from
    outside: a face in a turned frame was 1 px off the upright frame's). `dfl`: the landmarks as DFL's S3FD+FAN
    path turns them, as its boxes (its results are DFL's)."""
    (x0, y0, x1, y1), lm = face.rect, face.landmarks.copy()
    lw, lh = (w, h) if dfl else (w - 1, h - 1)  # (a mirror of pixel x: w - 1 - x)
    if rot == 90:
        rect, lm = (y0, h - x0, y1, h - x1), lm[:, ::-1].copy()
        lm[:, 1] = lh - lm[:, 1]
    elif rot == 180:
        rect = (w - x0, h - y0, w - x1, h - y1)
        lm[:, 0], lm[:, 1] = lw - lm[:, 0], lh - lm[:, 1]
    elif rot == 270:
        rect, lm = (w - y1, x0, w - y0, x1), lm[:, ::-1].copy()
        lm[:, 0] = lw - lm[:, 0]
    else:
        rect = face.rect
    x0, y0, x1, y1 = rect  # (DFL keeps a turned box's corners swapped; the same box, ordered)
    return Face((min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)), lm)


# MTCNN's output-net score of a face seen whole and upright is 0.99 and more; the false faces found from outside
# scored 0.73 to 0.94, sideways faces up to 0.98 (which the second pass then drops).
CONFIDENT = 0.95


def _centred(box: tuple, size: int) -> bool:
    """Whether a box's centre is within 25 px of the centre of a `size`-pixel square (of 256: a tenth)."""
    return max(abs(box[0] + box[2] - size), abs(box[1] + box[3] - size)) <= 2 * 25 * size / 256


class Extractor:
    """Detector and landmarker, and what a frame's faces become. Built once per worker process."""

    def __init__(
        self,
        settings: Settings,
        device: str = "cpu",
        landmarks_model: str | None = None,
        dfl_weights: str | Path | None = None,
    ) -> None:
        self.settings = settings
        self.kind = align.face_type(settings.face_type)
        if dfl_weights is not None:  # DFL's own S3FD and 2DFAN, from a DFL install's facelib/
            from bigbatch.faces.dfl_nets import FANLandmarks, S3FDDetector

            self.detect, self.landmarks = S3FDDetector(dfl_weights, device), FANLandmarks(dfl_weights, device)
            return
        from bigbatch.faces.detect import MTCNN
        from bigbatch.faces.landmarks import DlibLandmarks

        self.detect = MTCNN(device, min_face=settings.min_face)
        self.landmarks = DlibLandmarks(landmarks_model, say_licence=False)

    def find(self, image: np.ndarray) -> list[Face]:
        """The faces of an RGB frame, largest first, each with its 68 landmarks in the frame's pixels.

        As DFL, the frame is searched upright, then turned 90, 270 and 180 degrees, and each face found is
        aligned and found again there (the second pass). With MTCNN (not DFL's S3FD, whose results are
        DFL's), two things more, each found from outside: a face the second pass does not find again, centred
        in its own aligned square, is dropped (MTCNN took a torso, or a whole picture, for a face at 0.73 to
        0.84, larger than the real one and so face 0, and merge swapped a face onto it); and a turn ends the
        search only if a face it found scores CONFIDENT and is kept, else the turn whose kept faces score
        highest is taken (an upside-down face was taken sideways, at 0.87 to 0.98, from a 270 degree turn)."""
        h, w = image.shape[:2]
        mtcnn = self.settings.detector == "mtcnn+dlib"
        best: tuple[float, int, list[Face]] | None = None
        for rot in (0, 90, 270, 180):
            turned = np.ascontiguousarray(_turn(image, rot))
            found = self.detect(turned)  # (none with a side under min_face)
            if not found:
                continue
            kept = self._kept(turned, found, confirm=mtcnn)
            if not kept:
                continue
            top = max(score for score, _ in kept)
            if best is None or top > best[0]:
                best = (top, rot, [face for _, face in kept])
            if not mtcnn or top >= CONFIDENT:
                break
        if best is None:
            return []
        _, rot, faces = best
        return [_turn_back(face, rot, w, h, dfl=not mtcnn) for face in faces]

    def _kept(self, turned: np.ndarray, found: list, confirm: bool) -> list[tuple[float, Face]]:
        """(score, face) of the detections `found` in a turned frame that are kept, in their order, up to
        max_faces: landmarked, and with the second pass, refined (dropped where `confirm` and not found again)."""
        kept: list[tuple[float, Face]] = []
        for d in found:
            if self.settings.max_faces and len(kept) == self.settings.max_faces:
                break
            lm = self.landmarks(turned, d.box)
            if self.settings.second_pass:
                lm = self._refine(turned, lm, confirm)
                if lm is None:
                    continue
            kept.append((d.score, Face(tuple(int(v) for v in d.box), lm)))
        return kept

    def _refine(self, image: np.ndarray, lm: np.ndarray, confirm: bool = False) -> np.ndarray | None:
        """DFL's second pass: the face aligned to `full` at 256 px, found and landmarked again there (only when
        exactly one face is found: else the landmarks as they were), mapped back to the frame. With `confirm`,
        None when no face found there scores 0.9 and is centred in the square (a real face scores 0.99 there, its
        box's centre within 15 px of the square's; what MTCNN took for a face is not found, or found off centre
        and lower: a torso's square, at 0.875 and 32 px off)."""
        mat = align.transform_mat(lm, 256, align.FaceType.FULL)
        face = np.ascontiguousarray(align.warp_face(image, mat, 256))
        again = self.detect(face, min_face=96)  # the face fills most of the square: no small ones to look for
        if confirm and not any(a.score >= 0.9 and _centred(a.box, 256) for a in again):
            return None
        if len(again) != 1:
            return lm
        return align.transform_points(self.landmarks(face, again[0].box, samples=True), mat, invert=True)

    def aligned(self, image: np.ndarray, faces: list[Face], source: str) -> tuple[list[bytes], np.ndarray]:
        """Each face as DFL's aligned JPEG with its metadata, and the debug frame (RGB) with what was found drawn."""
        size, kind = self.settings.size, self.kind
        debug = image.copy()
        out = []
        for face in faces:
            mat = align.transform_mat(face.landmarks, size, kind)
            x0, y0, x1, y1 = face.rect
            square = align.square_in_frame(mat, size)
            if kind <= align.FaceType.FULL_NO_ALIGN and align.polygon_area(square) > 4 * abs((x1 - x0) * (y1 - y0)):
                continue  # DFL: a square far larger than the detector's box means the landmarks are off
            crop = align.warp_face(image, mat, size)
            ok, jpg = cv2.imencode(".jpg", crop[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, self.settings.jpeg_quality])
            meta = {
                "face_type": kind.dfl_name,
                "landmarks": align.transform_points(face.landmarks, mat).tolist(),
                "source_filename": source,
                "source_rect": [int(v) for v in face.rect],
                "source_landmarks": np.asarray(face.landmarks, np.float64).tolist(),
                "image_to_face_mat": np.asarray(mat, np.float64).tolist(),
            }
            out.append(write_metadata(jpg.tobytes(), meta))
            _draw(debug, face, square)
        return out, debug


def _draw(image: np.ndarray, face: Face, square: np.ndarray) -> None:
    """DFL's aligned_debug drawing: the detector's box in blue, landmarks in green, the face type's square in
    red with a mark at its top-left corner."""
    x0, y0, x1, y1 = face.rect
    cv2.rectangle(image, (x0, y0), (x1, y1), (0, 0, 255), 2)
    for x, y in np.round(face.landmarks).astype(int):
        cv2.circle(image, (int(x), int(y)), 1, (0, 255, 0), -1)
    cv2.polylines(image, [np.round(square).astype(np.int32)], True, (255, 0, 0), 2)
    corner = square[0] + 0.1 * (square[3] - square[0]) + 0.1 * (square[1] - square[0])
    cv2.line(image, tuple(np.round(square[0]).astype(int)), tuple(np.round(corner).astype(int)), (255, 0, 0), 2)


# -- The run: journal, workers, progress ------------------------------------------------------------------------------


_WORKER: tuple[Extractor, Path, bool] | None = None


def _start_worker(
    settings: Settings,
    device: str,
    landmarks_model: str | None,
    weights: Path | None,
    out: Path,
    debug: bool,
    one: bool,
) -> None:
    global _WORKER
    if one:
        import torch

        torch.set_num_threads(1)
        cv2.setNumThreads(1)
    _WORKER = (Extractor(settings, device, landmarks_model, weights), out, debug)


def _frame(name: str, image: np.ndarray | Path) -> tuple[str, int | None]:
    """One frame done: its faces (and debug frame) written; the count of faces, or None if it did not decode."""
    extractor, out, debug = _WORKER
    if isinstance(image, Path):
        image = read_image(image)
        if image is None:
            return name, None
    faces = extractor.find(image)
    files, drawn = extractor.aligned(image, faces, name)
    stem = Path(name).stem
    for i, data in enumerate(files):
        atomic_write(out / f"{stem}_{i}.jpg", data, sync=False)
    if debug:
        ok, jpg = cv2.imencode(".jpg", drawn[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 50])
        atomic_write(debug_folder(out) / f"{stem}.jpg", jpg.tobytes(), sync=False)
    return name, len(files)


def debug_folder(out: Path) -> Path:
    """Where extract draws each frame's faces: OUT_debug beside OUT (DFL's aligned_debug beside aligned), so that
    OUT holds the aligned faces alone, as `prepare` reads it. (Found from outside: OUT "." was a traceback, and
    ".." had its debug folder made inside the working folder.)"""
    if out.name in ("", ".."):
        out = Path(os.path.abspath(out))
    return out.with_name(f"{out.name}_debug")


def extract(
    src: str,
    out: str | Path,
    settings: Settings = Settings(),
    workers: int = 1,
    device: str = "cpu",
    landmarks_model: str | None = None,
    debug: bool = True,
    quiet: bool = False,
    dfl_weights: str | Path | None = None,
) -> dict[str, int | None]:
    """Extract every frame of `src` into `out` (see the module's docstring); returns {frame name: faces found,
    or None where the file did not decode}, frames done by an earlier, killed run included. `dfl_weights`: a
    DFL install's facelib/ folder, whose S3FD and 2DFAN find and landmark the faces (settings.detector "dfl")."""
    from tqdm import tqdm

    from bigbatch.faces.landmarks import LICENCE_NOTE

    source = FrameSource(src)
    align.face_type(settings.face_type)
    if (dfl_weights is not None) != (settings.detector == "dfl"):
        raise ValueError("settings.detector is 'dfl' exactly when dfl_weights are given")
    weights = Path(dfl_weights) if dfl_weights is not None else None
    if weights is not None:
        from bigbatch.faces.dfl_nets import FAN_FILE, S3FD_FILE

        lacking = [n for n in (S3FD_FILE, FAN_FILE) if not (weights / n).is_file()]
        if lacking:
            raise BigbatchError(
                f"--weights {weights} lacks {' and '.join(lacking)}: give a DeepFaceLab install's facelib folder"
            )
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BigbatchError(f"OUT {out} is a file: give a folder for the aligned faces (made if it does not exist)")
    for folder in source.folders():  # (a rerun would extract faces of the faces written there; a sub-folder, as
        for mine in (out, debug_folder(out)) if debug else (out,):  # DFL's data_dst/aligned, is not listed)
            if mine.resolve() == folder:
                raise BigbatchError(
                    f"{'OUT' if mine == out else 'OUT_debug'} {mine} is the folder of SRC {src}, whose images a "
                    "rerun would take for frames: give another OUT (DFL's: a folder aligned inside it)"
                )
    # The models load before anything is written: a --landmarks-model that does not is one line, OUT not made
    # (in a pool, each worker's start printed a traceback before it).
    init = (settings, device, landmarks_model, weights, out, debug, workers > 1)
    if workers <= 1:
        _start_worker(*init)
    elif weights is not None:  # (found from outside: DFL's files, read first in the pool, a traceback before)
        Extractor(settings, device, landmarks_model, weights)
    elif landmarks_model is not None:
        from bigbatch.faces.landmarks import DlibLandmarks

        DlibLandmarks(landmarks_model, say_licence=False)
    out.mkdir(parents=True, exist_ok=True)
    if debug:
        debug_folder(out).mkdir(exist_ok=True)
    done = read_journal(out, asdict(settings), source)
    if landmarks_model is None and weights is None and not quiet:
        print(f"bigbatch: {LICENCE_NOTE}", file=sys.stderr)
    total = source.count
    bar = tqdm(
        total=total, initial=len(done), unit="frame", disable=quiet or not sys.stderr.isatty(), dynamic_ncols=True
    )
    with open(out / JOURNAL, "a") as journal:

        def record(name: str, faces: int | None) -> None:
            done[name] = faces
            journal.write(json.dumps({"frame": name, "faces": faces, "file": source.stat(name)}) + "\n")
            journal.flush()
            bar.update(1)

        frames = source.frames(set(done))
        if workers <= 1:
            for name, image in frames:
                record(*_frame(name, image))
        else:
            ctx = multiprocessing.get_context("spawn")  # (torch's threads do not survive a fork)
            try:
                with concurrent.futures.ProcessPoolExecutor(workers, ctx, _start_worker, init) as pool:
                    pending: set[concurrent.futures.Future] = set()
                    for name, image in frames:
                        pending.add(pool.submit(_frame, name, image))
                        if len(pending) >= 2 * workers:  # frames in flight: bounded, a video is not read ahead
                            finished, pending = concurrent.futures.wait(pending, return_when="FIRST_COMPLETED")
                            for f in finished:
                                record(*f.result())
                    for f in concurrent.futures.as_completed(pending):
                        record(*f.result())
            except concurrent.futures.process.BrokenProcessPool:
                _start_worker(*init)  # a worker could not start: here, its error is the user's one line
                raise
    bar.close()
    return done
