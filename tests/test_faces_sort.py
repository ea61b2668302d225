"""bigbatch sort: DFL's sort tool on a folder of aligned faces. The faces are the astronaut's, aligned by
extract and then blurred, darkened or turned (their landmarks moved as a turned head's move), so each
method's order is known."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

pytest.importorskip("dlib")
pytest.importorskip("skimage")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import _faces  # noqa: E402

from bigbatch.cli import main  # noqa: E402
from bigbatch.data import align  # noqa: E402
from bigbatch.data.dfl_faces import read_metadata, write_metadata  # noqa: E402
from bigbatch.faces.extract import Extractor, Settings  # noqa: E402
from bigbatch.faces.sort import pitch, yaw  # noqa: E402
from bigbatch.faces.sort_names import NAMES  # noqa: E402


@pytest.fixture(scope="module")
def face():
    """The astronaut's aligned whole face (BGR, 256 px) and its metadata, as extract writes them."""
    image = _faces.photo()
    (found,) = Extractor(Settings()).find(image)
    ex = Extractor(Settings(size=256))
    (data,), _ = ex.aligned(image, [found], "00001.png")
    meta = read_metadata(data)
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR), meta


def save(path, image, meta):
    ok, jpg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 95])
    path.write_bytes(write_metadata(jpg.tobytes(), meta))


def names(folder):
    return sorted(p.name for p in folder.iterdir() if p.name != NAMES)  # (the faces: not their first names' record)


def test_blur_brightness_and_final_order_the_faces_and_trash_what_is_not_one(face, tmp_path, capsys):
    image, meta = face
    folder = tmp_path / "aligned"
    folder.mkdir()
    sigmas = [3.0, 0.0, 6.0, 1.5]  # saved in this order; sharpest first is 1, 3, 0, 2
    for i, s in enumerate(sigmas):
        blurred = cv2.GaussianBlur(image, (0, 0), s) if s else image
        save(folder / f"{i:05d}_0.jpg", blurred, {**meta, "source_filename": f"{i + 1:05d}.png"})
    cv2.imwrite(str(folder / "notes.jpg"), image)  # no metadata: not an aligned face
    cv2.imwrite(str(folder / "dfl1.png"), image)  # DFL 1's PNG face (its metadata not read): left where it is
    assert main(["sort", str(folder), "--by", "blur"]) == 0
    said = capsys.readouterr()
    assert "Sorted 4 faces" in said.out and "1 PNG files in" in said.err
    (folder / "dfl1.png").unlink()
    assert names(folder) == ["00000.jpg", "00001.jpg", "00002.jpg", "00003.jpg"]
    assert names(tmp_path / "aligned_trash") == ["notes.jpg"]  # (moved, as DFL's sort moves what it cannot read)
    frames = [read_metadata((folder / f"{i:05d}.jpg").read_bytes())["source_filename"] for i in range(4)]
    assert frames == ["00002.png", "00004.png", "00001.png", "00003.png"]  # sharpest first; metadata kept
    assert main(["sort", str(folder), "--by", "origname"]) == 0  # back in frame order
    frames = [read_metadata((folder / f"{i:05d}.jpg").read_bytes())["source_filename"] for i in range(4)]
    assert frames == ["00001.png", "00002.png", "00003.png", "00004.png"]
    # final: the sharpest of the target, the others to the trash beside what is there (DFL empties it first)
    assert main(["sort", str(folder), "--by", "final", "--target", "2"]) == 0
    kept = sorted(read_metadata((folder / n).read_bytes())["source_filename"] for n in names(folder))
    assert kept == ["00002.png", "00004.png"] and len(names(tmp_path / "aligned_trash")) == 3
    # brightness: a darkened copy last
    save(folder / "dark.jpg", (image * 0.5).astype(np.uint8), {**meta, "source_filename": "dark.png"})
    assert main(["sort", str(folder), "--by", "brightness"]) == 0
    assert read_metadata((folder / "00002.jpg").read_bytes())["source_filename"] == "dark.png"
    for args, says in [
        (["--by", "x"], "--by 'x' is not a sort method; valid: blur"),
        (["--by", "final", "--target", "0"], "--target must be at least 1 face"),
        (["--by", "blur", "--target", "3"], "--target is the number of faces `--by final` keeps"),
    ]:
        assert main(["sort", str(folder), *args]) == 2
        assert says in capsys.readouterr().err
    assert main(["sort", str(tmp_path / "aligned_trash" / "notes.jpg"), "--by", "blur"]) == 2
    assert "is not a folder of aligned faces" in capsys.readouterr().err
    # The trash's name taken by a file: one line naming it, nothing moved (found from outside: "File exists").
    (tmp_path / "other").mkdir()
    save(tmp_path / "other" / "a.jpg", image, meta)
    (tmp_path / "other" / "b.jpg").write_bytes(b"not a face")
    (tmp_path / "other_trash").write_text("")
    assert main(["sort", str(tmp_path / "other"), "--by", "blur"]) == 2
    assert "other_trash is a file, where sort puts what it leaves out: move it away" in capsys.readouterr().err
    assert names(tmp_path / "other") == ["a.jpg", "b.jpg"]


def test_a_killed_sorts_faces_come_back_and_yaw_and_pitch_follow_the_head(face, tmp_path):
    image, meta = face
    folder = tmp_path / "aligned"
    folder.mkdir()
    lm = np.asarray(meta["landmarks"])
    # A head turned to its left: the nose (27..35) moves right of the jaw's middle; turned up: the nose tip
    # rises towards the eyes.
    for i, shift in enumerate([0.0, 12.0, -12.0]):
        moved = lm.copy()
        moved[27:36, 0] += shift
        save(folder / f"yaw{i}.jpg", image, {**meta, "landmarks": moved.tolist(), "source_filename": f"{i}.png"})
    assert yaw({"landmarks": lm.tolist()}) == pytest.approx(0, abs=0.08)
    assert main(["sort", str(folder), "--by", "face-yaw"]) == 0
    order = [read_metadata((folder / f"{i:05d}.jpg").read_bytes())["source_filename"] for i in range(3)]
    assert order == ["2.png", "0.png", "1.png"]  # the jaw's right side longest first, as DFL's descending yaw
    up = lm.copy()
    up[30, 1] -= 10
    assert pitch({"landmarks": up.tolist()}) > pitch({"landmarks": lm.tolist()})
    # A sort killed between its two renames leaves faces under temporary names: the next one takes them in.
    (folder / "00000.jpg").rename(folder / ".sort-999999-00000.jpg")
    assert main(["sort", str(folder), "--by", "origname"]) == 0
    assert names(folder) == ["00000.jpg", "00001.jpg", "00002.jpg"]
    assert align.face_type(meta["face_type"]).dfl_name == "whole_face"


def test_final_below_the_bins_spreads_over_yaw_and_unreadable_landmarks_go_to_the_trash(face, tmp_path, capsys):
    """Found from outside: --target below the bins that hold faces kept the sharpest (the frontal ones) and lost
    every side view; a face whose landmarks are not numbers stopped sort with a traceback."""
    image, meta = face
    folder = tmp_path / "aligned"
    folder.mkdir()
    lm = np.asarray(meta["landmarks"])
    for i, shift in enumerate([-16.0, -8.0, 0.0, 8.0, 16.0]):  # the side views blurred, as they usually are
        moved = lm.copy()
        moved[27:36, 0] += shift
        shown = cv2.GaussianBlur(image, (0, 0), 3.0) if shift else image
        save(folder / f"{i}.jpg", shown, {**meta, "landmarks": moved.tolist(), "source_filename": f"{i}.png"})
    save(folder / "bad.jpg", image, {**meta, "landmarks": [["a", "b"]] * 68})
    save(folder / "huge.jpg", image, {**meta, "landmarks": [[10**400, 0]] * 68})  # (past float64: OverflowError)
    far = np.zeros((68, 2))
    far[:, 0] = np.where(np.arange(68) % 2, 1.5e308, -1.5e308)  # (finite, but a yaw of NaN)
    save(folder / "far.jpg", image, {**meta, "landmarks": far.tolist()})
    assert main(["sort", str(folder), "--by", "final", "--target", "2"]) == 0
    kept = sorted(read_metadata((folder / n).read_bytes())["source_filename"] for n in names(folder))
    assert kept == ["0.png", "4.png"]  # the two ends of the yaws, not the sharp frontal face
    assert {"bad.jpg", "huge.jpg", "far.jpg"} <= set(names(tmp_path / "aligned_trash"))
    # one face to keep: the middle of the yaws (it kept a profile)
    for path in (tmp_path / "aligned_trash").glob("[0-9]*.jpg"):
        path.rename(folder / f"back_{path.name}")
    assert main(["sort", str(folder), "--by", "final", "--target", "1"]) == 0
    assert [read_metadata((folder / n).read_bytes())["source_filename"] for n in names(folder)] == ["2.png"]


def test_final_keeps_the_sharpest_of_faces_of_one_yaw_not_the_one_whose_landmarks_strayed(face, tmp_path):
    """Found from outside: bins over the set's own yaws spread frontal faces over their landmarks' noise, a face
    a bin, and `final` kept a blurred face whose yaw was an end of that noise over the sharpest ones."""
    image, meta = face
    folder = tmp_path / "aligned"
    folder.mkdir()
    lm = np.asarray(meta["landmarks"])
    shifts = [-0.4, -0.3, -0.2, -0.1, 0.0, 0.1, 0.2, 0.3, 0.4]  # a tenth of a pixel apart: noise, one yaw
    for i, shift in enumerate(shifts):
        moved = lm.copy()
        moved[27:36, 0] += shift
        sigma = 4.0 if i == len(shifts) - 1 else 0.2 * i  # the last (an end of the yaws) blurred the most
        shown = cv2.GaussianBlur(image, (0, 0), sigma) if sigma else image
        save(folder / f"{i}.jpg", shown, {**meta, "landmarks": moved.tolist(), "source_filename": f"{i}.png"})
    assert main(["sort", str(folder), "--by", "final", "--target", "5"]) == 0
    kept = sorted(read_metadata((folder / n).read_bytes())["source_filename"] for n in names(folder))
    assert kept == ["0.png", "1.png", "2.png", "3.png", "4.png"]  # the five sharpest


def test_hist_dissim_puts_the_outlier_first_by_dfls_sums_and_oneface_trashes_frames_of_several(face, tmp_path, capsys):
    # Found from outside: DFL's hist-dissim and oneface (a dst set's usual clean-up) were not methods.
    from bigbatch.data.dfl_faces import hull_mask, landmarks_of
    from bigbatch.faces.sort import sort_order

    image, meta = face
    folder = tmp_path / "aligned"
    folder.mkdir()
    looks = [image, cv2.GaussianBlur(image, (0, 0), 1), (image * 0.3).astype(np.uint8), image[:, :, ::-1].copy()]
    for i, look in enumerate(looks):
        save(folder / f"{i:05d}_0.jpg", look, {**meta, "source_filename": f"{i:05d}.png"})
    done = sort_order(folder, "hist-dissim")
    order, trash = done.order, done.trash
    # DFL's score: the sum of OpenCV's Bhattacharyya distances of the grey hull histograms to every other face
    hists = []
    for path in sorted(folder.iterdir()):
        img = cv2.imread(str(path))
        grey = cv2.cvtColor((img * hull_mask(img.shape[:2], landmarks_of(meta))[..., None]).astype(np.uint8), 6)
        hists.append(cv2.calcHist([grey], [0], None, [256], [0, 256]))
    dfl = [sum(cv2.compareHist(a, b, cv2.HISTCMP_BHATTACHARYYA) for b in hists if b is not a) for a in hists]
    assert [p.name for p in order] == [f"{i:05d}_0.jpg" for i in np.argsort(dfl)[::-1]] and not trash
    assert order[0].name == "00002_0.jpg"  # (the darkened face)
    # oneface: frames 1 and 3 hold two faces each (by their metadata, whatever the names): all four to the trash.
    save(folder / "x.jpg", image, {**meta, "source_filename": "00001.png"})
    save(folder / "y.jpg", image, {**meta, "source_filename": "00003.png"})
    assert main(["sort", str(folder), "--by", "oneface"]) == 0
    kept = sorted(read_metadata((folder / n).read_bytes())["source_filename"] for n in names(folder))
    assert kept == ["00000.png", "00002.png"] and len(names(tmp_path / "aligned_trash")) == 4
    # every frame of two faces: none kept, and said so (found from outside: "Sorted 0 faces ...: 00000.jpg on")
    save(folder / "z.jpg", image, {**meta, "source_filename": "00000.png"})
    save(folder / "w.jpg", image, {**meta, "source_filename": "00002.png"})
    capsys.readouterr()
    assert main(["sort", str(folder), "--by", "oneface"]) == 0 and not names(folder)
    # (the trash's files by their names there, their names before the first sort: found from outside, unsaid)
    said = f"no face kept; all moved to {folder}_trash (4 faces of frames of several faces: 00000_0.jpg, 00002_0.jpg,"
    assert capsys.readouterr().out == f"Sorted {folder} by oneface: {said} w.jpg, z.jpg)\n"
    # Frames of two videos share names: sets combined under prefixes are told apart (found from outside: all trashed);
    # "." sorted puts its trash beside it (found from outside: inside it, as "_trash").
    trashed = len(names(tmp_path / "aligned_trash"))
    for name, source in (("a_00005_0.jpg", "00005.png"), ("b_00005_0.jpg", "00005.png"), ("c.jpg", "00000.png")):
        save(folder / name, image, {**meta, "source_filename": source})
    save(folder / "d.jpg", image, {**meta, "source_filename": "00000.png"})
    os.chdir(folder)
    assert main(["sort", ".", "--by", "oneface"]) == 0 and len(names(folder)) == 2 and not Path("_trash").exists()
    assert len(names(tmp_path / "aligned_trash")) == trashed + 2
