"""`bigbatch sort`: DFL's sort tool for a folder of aligned faces, to find the bad ones (blurry, turned away,
false detections) or to keep the best N. As DFL's: the faces are renamed 00000.jpg, 00001.jpg, ... in the
order asked for, and what a method leaves out (files that are not aligned faces; with `oneface`, the faces of
frames of several; with `final`, the faces
past the target) is moved to FOLDER_trash beside the folder. Merge finds a face's frame by its metadata,
not its name, so a sorted dst set still merges.

Methods, each DFL's (mainscripts/Sorter.py):
- blur: sharpest first, by the variance of the Laplacian of the grey face over the inside of its landmarks'
  hull, over the grey face's variance there (DFL scores CPBD, Narvekar & Karam's sharpness metric; the
  Laplacian's variance is the common measure, and DFL's own motion-blur);
- motion-blur: DFL's: the variance of an 11-pixel Laplacian of the face inside its hull, highest first;
- face-yaw, face-pitch: turned most one way first, from the face's landmarks (yaw: the jaw line's distances
  to the nose bridge, as DFL's head alignment measures it; pitch: where the nose tip falls between the eyes
  and the mouth; DFL solves a 3D head pose for both: yaw's order is nearly the same, rank correlation 0.99 on
  test faces; pitch's the same over heads of its 3D model, compared from outside);
- face-source-rect-size: the largest face in its frame first;
- hist: DFL's chain of histogram similarity (each next face the nearest by Bhattacharyya distance of the
  three channels' histograms), which brings faces of one person, light and scene together;
- hist-dissim: DFL's: the face (its grey pixels inside the landmarks' hull) least like all the others first, by
  its summed Bhattacharyya distance to every other face's histogram: outliers, false faces and other people;
- oneface: DFL's clean-up of a dst set: the faces of every frame that holds more than one face go to the trash
  (DFL reads the frame and face index from the names `extract` gives; here the frame is each face's own
  source_filename, so a set already sorted or renamed is cleaned too);
- brightness, hue: by the mean V or H of HSV, highest first; black: fewest black pixels first;
- origname: by the frame the face came from, then its name before the first sort (`first_names`);
- restore-names: DFL's util "recover original filename", each face back under its name before the first sort;
- final: the best `target` faces: yaw in 128 bins over -1..1 (DFL's: over its -1.2..1.2 radians), as many
  from each as the target allows (bins with fewer give their share to the rest), the sharpest of each bin,
  the sharpest of the rest where that leaves the target short; the others to the trash (DFL's `final` also
  spreads pitch and histogram dissimilarity within a bin); final-fast is the same here (DFL's skips that
  spreading).
"""

from __future__ import annotations

import itertools
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import cv2
import numpy as np

from bigbatch.data.dfl_faces import LANDMARK_RANGE, NoFaceData, face_yaw, hull_mask, landmarks_of, read_metadata
from bigbatch.errors import BigbatchError, counted, named_few, warn
from bigbatch.faces.image_file import imread
from bigbatch.faces.sort_names import (
    NAMES,
    SUFFIXES,
    Entry,
    first_names,
    numbered,
    plain_name,
    read_record,
    recover,
    renamed,
    write_record,
)
from bigbatch.faces.video import natural_key

SORTED_NAME = re.compile(r"\d{5,}|sorted_\d{5,}")  # (the names a sort gives, and a killed one's faces')
YAW_BINS = 128


def _blur(face: np.ndarray, meta: dict) -> float:
    """The variance of the grey face's Laplacian over the inside of its hull (away from its rim: the rim of a
    masked face is an edge of its own, as sharp in a blurred face), over the variance of the grey face there: a
    face's sharpness, not its contrast (found from outside: a sharp face at a third of the contrast ranked below
    a blurred one, where DFL's CPBD ranks it above every blurred one)."""
    mask = cv2.erode(hull_mask(face.shape[:2], landmarks_of(meta)).astype(np.uint8), np.ones((5, 5), np.uint8)) > 0
    grey = cv2.cvtColor(face, cv2.COLOR_BGR2GRAY).astype(np.float64)
    laplacian, inside = cv2.Laplacian(grey, cv2.CV_64F)[mask], grey[mask]
    return float(laplacian.var() / max(inside.var(), 1.0)) if inside.size else 0.0


def _motion_blur(face: np.ndarray, meta: dict) -> float:
    mask = hull_mask(face.shape[:2], landmarks_of(meta))[..., None]
    return float(cv2.Laplacian((face * mask).astype(np.uint8), cv2.CV_64F, ksize=11).var())


def yaw(meta: dict) -> float:
    """The face's yaw from its landmarks (`face_yaw`: in units of its width, 0 facing the camera)."""
    return face_yaw(landmarks_of(meta))


def pitch(meta: dict) -> float:
    """The face's pitch: 0.5 less where the nose tip falls between the eyes' line (0) and the mouth's (1);
    higher when the face turns up (the nose, nearer the camera, rises past the eyes in the picture)."""
    p = landmarks_of(meta)
    eyes, mouth, tip = p[36:48, 1].mean(), p[48:68, 1].mean(), p[30, 1]
    return float(0.5 - (tip - eyes) / max(mouth - eyes, 1e-6))


def _rect_area(face: np.ndarray, meta: dict) -> float:
    try:
        x0, y0, x1, y1 = np.asarray(meta.get("source_rect", (0, 0, 0, 0)), np.float64).reshape(4)
    except (TypeError, ValueError, OverflowError):
        raise NoFaceData("its DeepFaceLab metadata's source_rect is not 4 numbers") from None
    area = abs((x1 - x0) * (y1 - y0))
    if not area < LANDMARK_RANGE**2:
        raise NoFaceData("its DeepFaceLab metadata's source_rect is not within any image")
    return float(area)


def _hsv_mean(channel: int) -> Callable[[np.ndarray, dict], float]:
    return lambda face, _: float(cv2.cvtColor(face, cv2.COLOR_BGR2HSV)[..., channel].mean())


def _black(face: np.ndarray, _: dict) -> float:
    return -float((face == 0).sum())  # (fewest first: the highest first, as the others)


# method: (what it measures, highest first, of each face's pixels (BGR) and metadata)
MEASURES: dict[str, Callable[[np.ndarray, dict], float]] = {
    "blur": _blur,
    "motion-blur": _motion_blur,
    "face-yaw": lambda face, meta: yaw(meta),
    "face-pitch": lambda face, meta: pitch(meta),
    "face-source-rect-size": _rect_area,
    "brightness": _hsv_mean(2),
    "hue": _hsv_mean(0),
    "black": _black,
}
METHODS = (*MEASURES, "hist", "hist-dissim", "origname", "oneface", "final", "final-fast", "restore-names")
NEEDS_PIXELS = {"blur", "motion-blur", "brightness", "hue", "black"}  # (the other measures read metadata alone)


def _faces(folder: Path) -> tuple[list[tuple[Path, dict]], list[Path]]:
    """The aligned faces of `folder` in name order, with their metadata, and the JPEGs that are not ones. PNGs
    are left as they are (DFL 1's aligned faces were PNGs, with their metadata in a chunk of their own: found
    from outside, moved to the trash as if they had none), said in a warning."""
    faces, other, pngs = [], [], 0
    for path in sorted((p for p in folder.iterdir() if p.is_file()), key=natural_key):
        pngs += path.suffix.lower() == ".png"
        if path.suffix.lower() not in SUFFIXES:
            continue
        try:
            meta = read_metadata(path.read_bytes(), str(path))
            if meta is None:
                raise NoFaceData("no DeepFaceLab metadata")
            landmarks_of(meta)
        except (NoFaceData, BigbatchError, OSError):
            other.append(path)
            continue
        faces.append((path, meta))
    if pngs:
        warn(
            f"{pngs} PNG files in {folder} left as they are, unsorted: the aligned faces sorted are JPEGs (DFL 2's; "
            "DFL's util converts DFL 1's PNG faces)"
        )
    return faces, other


def _histograms(image: np.ndarray, _: dict) -> list[np.ndarray]:
    return [cv2.calcHist([image], [c], None, [256], [0, 256]) for c in range(3)]


def _hist_chain(hists: list[list[np.ndarray]]) -> list[int]:
    """DFL's sort by histogram similarity (of each face's `_histograms`): from the first face, each next the nearest
    of those left."""
    order = list(range(len(hists)))
    for i in range(len(order) - 1):
        a = hists[order[i]]
        scores = [
            sum(cv2.compareHist(a[c], hists[order[j]][c], cv2.HISTCMP_BHATTACHARYYA) for c in range(3))
            for j in range(i + 1, len(order))
        ]
        j = i + 1 + int(np.argmin(scores))
        order[i + 1], order[j] = order[j], order[i + 1]
    return order


def _grey_root(image: np.ndarray, meta: dict) -> np.ndarray:
    """The square root of the face's grey histogram inside its landmarks' hull, normalised."""
    grey = cv2.cvtColor((image * hull_mask(image.shape[:2], landmarks_of(meta))[..., None]).astype(np.uint8),
                        cv2.COLOR_BGR2GRAY)  # fmt: skip
    h = cv2.calcHist([grey], [0], None, [256], [0, 256]).reshape(-1).astype(np.float64)
    return np.sqrt(h / max(h.sum(), 1e-12))


def _hist_dissim(roots: list[np.ndarray], block: int = 1024) -> list[int]:
    """DFL's sort by histogram dissimilarity: each face's summed Bhattacharyya distance (OpenCV's) of its grey
    histogram inside the landmarks' hull to every other face's, highest first. As a product of the histograms'
    square roots (`_grey_root`), a block of rows at a time (DFL's pairs of compareHist calls: 10^8 of them for
    10,000 faces)."""
    r = np.stack(roots)
    score = np.zeros(len(r))
    for start in range(0, len(r), block):
        near = r[start : start + block] @ r.T  # (the Bhattacharyya coefficients)
        distance = np.sqrt(np.clip(1 - near, 0, None))
        distance[np.arange(len(near)), np.arange(start, start + len(near))] = 0  # (not against itself)
        score[start : start + block] = distance.sum(1)
    return [int(i) for i in np.argsort(-score, kind="stable")]


def _one_face(faces: list[tuple[Path, dict]], firsts: list[str]) -> tuple[list[int], list[int]]:
    """DFL's oneface: (the faces kept, in name order; those of frames that hold more than one face)."""
    # A frame by its name, and by what the face's first name (`first_names`) puts before it: frames of two videos
    # share their names (found from outside: sets combined as a_00001_0 and b_00001_0 trashed every face of both,
    # and after a sort had renamed them too).
    frames: dict[tuple[str, str], list[int]] = {}
    for i, ((_, meta), first) in enumerate(zip(faces, firsts)):
        source = str(meta.get("source_filename", ""))
        stem, first = Path(source).stem, Path(first).stem
        before = first.partition(stem)[0] if stem and stem in first else ""
        frames.setdefault((source, before), []).append(i)
    crowded = {i for frame, members in frames.items() if frame[0] and len(members) > 1 for i in members}
    return [i for i in range(len(faces)) if i not in crowded], sorted(crowded)


def _final(yaws: np.ndarray, sharp: np.ndarray, target: int) -> tuple[list[int], list[int]]:
    """DFL's best faces, by yaw bins and sharpness (see the module): (those kept, in order; the others)."""
    # Bins over a fixed range, as DFL's (-1.2..1.2 of its radians; face_yaw is near +-1 in profile). Found from
    # outside: bins over the set's own yaws spread frontal faces over their landmarks' noise, a face a bin, and
    # kept the blurred one whose landmarks had strayed (an end) over the sharpest.
    edges = np.linspace(-1.0, 1.0, YAW_BINS + 1)[1:-1]
    bins = [np.flatnonzero(np.digitize(yaws, edges) == b) for b in range(YAW_BINS)]
    filled = [b for b in bins if len(b)]
    if target < len(filled):  # fewer faces than bins with faces: bins spread evenly over the yaws, the sharpest of
        # each (found from outside: the sharpest of all bins were kept, the frontal ones, and the side views lost)
        # (both ends included, the side views being the scarce ones; --target 1 keeps the middle one, not a profile)
        picks = np.linspace(0, len(filled) - 1, target) if target > 1 else [(len(filled) - 1) / 2]
        bins = [filled[k] for k in sorted(set(np.round(picks).astype(int)))]
        share = 1
    else:
        share = max(1, round(target / YAW_BINS))
        share += sum(max(share - len(b), 0) for b in bins) // YAW_BINS  # (what thin bins lack, to the others)
    kept = [int(i) for b in bins for i in b[np.argsort(-sharp[b], kind="stable")][:share]]
    kept = sorted(kept, key=lambda i: -sharp[i])[:target]
    chosen = set(kept)
    rest = [int(i) for i in np.argsort(-sharp, kind="stable") if i not in chosen]
    kept += rest[: target - len(kept)]  # (bins of one yaw, or a target short of a face a bin: the sharpest fill it)
    kept = sorted(kept, key=lambda i: (-yaws[i], -sharp[i]))
    return kept, sorted(set(range(len(yaws))) - set(kept))


# Why sort moved a file to the trash, as its line says it (found from outside: the trash's files were unsaid).
NOT_FACES = ("file", "without DeepFaceLab's metadata")
UNREAD = ("face", "whose file does not decode")
UNMEASURED = ("face", "whose metadata it cannot measure")
CROWDED = ("face", "of frames of several faces")
PAST = ("face", "past the target")
Why = tuple[str, str]  # (what it is, counted; and why it went)


def _each(
    faces: list[tuple[Path, dict]], of: Callable[[Any, dict], Any], pixels: bool
) -> tuple[list[Any], dict[int, Why]]:
    """`of` each face's pixels (BGR; None unless `pixels`) and metadata, None for a face it cannot measure; and why
    not, by the face's index: its file does not decode (found from outside: one cut short stopped the whole sort,
    where DFL's skips it), or its metadata is not what the measure reads (found from outside: a traceback)."""
    values: list[Any] = []
    whys: dict[int, Why] = {}
    for i, (path, meta) in enumerate(faces):
        try:
            image = imread(path) if pixels else None
        except BigbatchError:
            values.append(None)
            whys[i] = UNREAD
            continue
        try:
            values.append(of(image, meta))
        except NoFaceData:
            values.append(None)
            whys[i] = UNMEASURED
    return values, whys


class Sorted(NamedTuple):
    """A sort's result: the faces in order, what goes to the trash with why (`NOT_FACES`, ...), each face's
    metadata and first name, and the folder's record of first names they came from (sort_names)."""

    order: list[Path]
    trash: list[tuple[Path, Why]]
    marks: dict[Path, tuple[dict, str]]
    record: list[Entry]


def sort_order(folder: Path, method: str, target: int | None = None) -> Sorted:
    """The faces of `folder` in `method`'s order, what goes to the trash, and what the record keeps (`Sorted`).
    `target`: final's (2000)."""
    if method not in METHODS:
        raise BigbatchError(f"--by {method!r} is not a sort method; valid: {', '.join(METHODS)}")
    if target is not None and not method.startswith("final"):  # (found from outside: taken silently)
        raise BigbatchError(f"--target is the number of faces `--by final` keeps; --by {method} keeps them all")
    if method == "restore-names":
        raise BigbatchError("restore-names renames the faces back, in no order: bigbatch.faces.sort.restore_names")
    target = 2000 if target is None else target
    if method.startswith("final") and target < 1:
        raise BigbatchError(f"--target must be at least 1 face, got {target}")
    faces, other = _faces(folder)
    if not faces:
        raise BigbatchError(f"{folder} holds no aligned faces (JPEGs with DeepFaceLab's metadata)")
    trash = [(path, NOT_FACES) for path in other]
    record = read_record(folder)
    firsts = first_names(record, faces)
    if method in ("hist", "hist-dissim") or method.startswith("final") or method in MEASURES:
        of = {"hist": _histograms, "hist-dissim": _grey_root}.get(method, MEASURES.get(method, _blur))
        values, whys = _each(faces, of, pixels=method not in MEASURES or method in NEEDS_PIXELS)
        trash += [(faces[i][0], why) for i, why in whys.items()]
    else:  # (oneface, origname: metadata alone)
        values = [0.0] * len(faces)
    read = [i for i, v in enumerate(values) if v is not None]
    if not read:  # (nothing moved: a folder none of whose faces decodes is no sort's to empty)
        said = trash_said([(path.name, why) for path, why in trash if why[0] == "face"])
        raise BigbatchError(f"no face of the {len(faces)} in {folder} could be measured ({said}): nothing was moved")
    if method == "hist":
        order = [read[j] for j in _hist_chain([values[i] for i in read])]
    elif method == "hist-dissim":
        order = [read[j] for j in _hist_dissim([values[i] for i in read])]
    elif method == "oneface":
        order, dropped = _one_face(faces, firsts)
        trash += [(faces[i][0], CROWDED) for i in dropped]
    elif method == "origname":
        # (the faces of one frame by their index, in their first names)
        order = sorted(range(len(faces)), key=lambda i: (natural_key(str(faces[i][1].get("source_filename", ""))),
                                                         natural_key(firsts[i])))  # fmt: skip
    elif method.startswith("final"):
        yaws, sharp = np.array([yaw(faces[i][1]) for i in read]), np.array([values[i] for i in read], np.float64)
        kept, dropped = _final(yaws, sharp, target)
        order = [read[j] for j in kept]
        trash += [(faces[read[j]][0], PAST) for j in dropped]
    else:
        order = sorted(read, key=lambda i: -values[i])
    marks = {path: (meta, first) for (path, meta), first in zip(faces, firsts)}
    return Sorted([faces[i][0] for i in order], trash, marks, record)


def trash_said(moved: list[tuple[str, Why]]) -> str:
    """What went to the trash, by its name there, and why, for sort's line: '3 files without DeepFaceLab's
    metadata: a.jpg, b.jpg, c.jpg; 1 face ...'."""
    by_why: dict[Why, list[str]] = {}
    for name, why in moved:
        by_why.setdefault(why, []).append(name)
    return "; ".join(f"{counted(len(names), why[0])} {why[1]}: {named_few(names)}" for why, names in by_why.items())


def apply_order(folder: Path, done: Sorted) -> tuple[Path | None, list[tuple[str, Why]]]:
    """DFL's final step: what goes to the trash moved to FOLDER_trash under its first name (beside what an earlier
    sort put there: DFL empties it first, which loses them), the faces' first names recorded (sort_names), then
    the faces renamed 00000.jpg, ... in order. Returns the trash folder if anything went there, and what went
    there: its name there, and why."""
    order, trash, marks, record = done
    bin_, moved = None, []
    if trash:
        bin_ = folder.parent / f"{folder.name}_trash"
        if bin_.exists() and not bin_.is_dir():  # (found from outside: "File exists", the fix unsaid)
            raise BigbatchError(f"{bin_} is a file, where sort puts what it leaves out: move it away and sort again")
        bin_.mkdir(exist_ok=True)
        for path, why in trash:
            to = next(n for n in numbered(marks[path][1] if path in marks else path.name) if not (bin_ / n).exists())
            shutil.move(str(path), str(bin_ / to))
            moved.append((to, why))
    names = [f"{i:05d}{path.suffix.lower()}" for i, path in enumerate(order)]
    write_record(folder, record, [(marks[path][0], name, marks[path][1]) for path, name in zip(order, names)])
    renamed(folder, list(zip(order, names)))
    return bin_, moved


def restore_names(folder: Path) -> tuple[int, int]:
    """`--by restore-names`, DFL's util "recover original filename": each face the folder's record holds under its
    first name (sort_names); one it does not hold and whose name is a sort's (00000.jpg) under DFL's name of it,
    its frame's stem and the first index free among its frame's faces (one whose frame's name is no file name's
    keeps its own). Only the faces whose names change are renamed; the record goes once all are. Returns (faces
    given their first names back, faces given DFL's)."""
    if not folder.is_dir():
        raise BigbatchError(f"{folder} is not a folder of aligned faces")
    recover(folder)
    faces, _ = _faces(folder)
    if not faces:
        raise BigbatchError(f"{folder} holds no aligned faces (JPEGs with DeepFaceLab's metadata)")
    firsts = first_names(read_record(folder), faces)
    stems = [Path(str(meta.get("source_filename", ""))).stem for _, meta in faces]
    dfl = [  # (no name of its own from before: DFL's, where its frame's stem makes one)
        f == p.name and bool(SORTED_NAME.fullmatch(p.stem)) and bool(s) and plain_name(f"{s}_0.jpg")
        for (p, _), f, s in zip(faces, firsts, stems)
    ]
    # The names that stay first (the folder's other files', the faces' that keep theirs): none is renamed over.
    own = {p.name.lower() for p, _ in faces}
    kept = {p.name.lower() for (p, _), f, d in zip(faces, firsts, dfl) if f == p.name and not d}
    taken = {p.name.lower() for p in folder.iterdir()} - own | kept

    def claim(names: Iterator[str]) -> str:
        name = next(n for n in names if n.lower() not in taken)
        taken.add(name.lower())
        return name

    names = []
    for (path, _), first, stem, by_dfl in zip(faces, firsts, stems, dfl):
        if first != path.name:  # (a first name held twice, of two folders put together: name.1.jpg)
            first = claim(numbered(first))
        elif by_dfl:
            first = claim(f"{stem}_{n}{path.suffix}" for n in itertools.count())
        names.append(first)
    moves = [(path, name) for (path, _), name in zip(faces, names) if name != path.name]
    renamed(folder, moves)
    (folder / NAMES).unlink(missing_ok=True)
    return len(moves) - sum(dfl), sum(dfl)


def sort_folder(
    folder: str | Path, method: str, target: int | None = None
) -> tuple[int, Path | None, list[tuple[str, Why]]]:
    """`bigbatch sort`: sort `folder`'s faces by `method` in place; (faces kept, the trash folder or None, what went
    there: its name there, and why)."""
    folder = Path(folder).absolute()  # (found from outside: "." put its trash inside itself, as "_trash")
    if not folder.is_dir():
        raise BigbatchError(f"{folder} is not a folder of aligned faces")
    recover(folder)
    done = sort_order(folder, method, target)
    return len(done.order), *apply_order(folder, done)
