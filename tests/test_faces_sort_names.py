"""bigbatch sort keeps each face's name from before its first sort: sets of two videos put together stay apart for
`oneface` after a sort renamed them, and `--by restore-names` gives them back (DFL's "recover original filename");
what goes to the trash is said, a face whose file does not decode among it; `blur` measures sharpness, not contrast."""

from __future__ import annotations

import os

import cv2
import numpy as np
import pytest

pytest.importorskip("dlib")
pytest.importorskip("skimage")

import test_faces_sort  # noqa: E402
from test_faces_sort import names, save  # noqa: E402

from bigbatch.cli import main  # noqa: E402
from bigbatch.data.dfl_faces import read_metadata  # noqa: E402
from bigbatch.faces.sort_names import NAMES  # noqa: E402

face = test_faces_sort.face  # (the astronaut's aligned face: its module's fixture)


def test_two_videos_faces_stay_apart_after_a_sort_renamed_them_and_get_their_names_back(face, tmp_path, capsys):
    # Found from outside: a_00001_0 and b_00001_0, renamed 00000.jpg on by a sort, were one crowded frame to oneface,
    # every face trashed; and a sort's renames could not be undone.
    image, meta = face
    folder = tmp_path / "combined"
    folder.mkdir()
    first = ["a_00001_0.jpg", "a_00002_0.jpg", "b_00001_0.jpg", "b_00002_0.jpg", "b_00002_1.jpg"]
    for i, name in enumerate(first):  # (b's frame 2 holds two faces, at two places)
        rect = [10 + i, 10, 60 + i, 60]
        save(folder / name, cv2.GaussianBlur(image, (0, 0), 1 + i), {**meta, "source_filename": f"{name[2:7]}.png",
                                                                       "source_rect": rect})  # fmt: skip
    assert main(["sort", str(folder), "--by", "blur"]) == 0
    assert names(folder) == [f"{i:05d}.jpg" for i in range(5)]
    assert main(["sort", str(folder), "--by", "oneface"]) == 0
    # b's frame 2 alone is crowded: its faces go, under their first names; a's and b's frame 1 stay.
    assert sorted(names(tmp_path / "combined_trash")) == ["b_00002_0.jpg", "b_00002_1.jpg"]
    assert "(2 faces of frames of several faces: b_00002_" in capsys.readouterr().out
    # Back: a face renamed by hand since (found by its frame and rectangle) too; a face the record does not hold,
    # under a sort's name, DFL's name of it, its frame's stem and an index free (not a file's that is no face).
    (folder / names(folder)[0]).rename(folder / "mine.jpg")
    save(folder / "00009.jpg", image, {**meta, "source_filename": "00007.png", "source_rect": [1, 2, 3, 4]})
    (folder / "00007_0.jpg").write_text("notes")
    assert main(["sort", str(folder), "--by", "restore-names"]) == 0
    assert names(folder) == sorted([*first[:3], "00007_0.jpg", "00007_1.jpg"])
    assert (folder / "00007_0.jpg").read_text() == "notes" and not (folder / NAMES).exists()
    said = "Gave 3 faces of {} the name sort's record held; 1 face it did not hold, DFL's name of it (FRAME_INDEX.jpg)"
    assert capsys.readouterr().out.strip() == said.format(folder)
    assert main(["sort", str(folder), "--by", "restore-names", "--target", "2"]) == 2


def test_a_sort_killed_between_its_renames_and_a_record_not_sorts(face, tmp_path, monkeypatch, capsys):
    # Found by review: a sort killed after its renames, before its record, lost every face's first name; a record
    # damaged was dropped without a word.
    import bigbatch.faces.sort_names as sort_names

    image, meta = face
    folder = tmp_path / "aligned"
    folder.mkdir()
    first = [f"{i:05d}_0.jpg" for i in range(1, 5)]
    for i, name in enumerate(first):
        save(folder / name, cv2.GaussianBlur(image, (0, 0), 1 + i), {**meta, "source_filename": f"{i + 1:05d}.png"})
    assert main(["sort", str(folder), "--by", "blur"]) == 0

    def killed(path, to):  # the process killed at its third rename
        calls.append(to)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real(path, to)

    calls, real = [], os.replace
    monkeypatch.setattr(sort_names.os, "replace", killed)
    assert main(["sort", str(folder), "--by", "face-yaw"]) == 130  # (Ctrl-C's status)
    monkeypatch.setattr(sort_names.os, "replace", real)
    assert any(p.name.startswith(".sort-") for p in folder.iterdir())
    assert main(["sort", str(folder), "--by", "restore-names"]) == 0
    assert names(folder) == first
    # A record that is not sort's: one line naming it, nothing renamed.
    assert main(["sort", str(folder), "--by", "blur"]) == 0
    (folder / NAMES).write_text("{not json")
    before = names(folder)
    assert main(["sort", str(folder), "--by", "hist"]) == 2
    assert f"{folder / NAMES} is not sort's record of the faces' first names (" in capsys.readouterr().err
    assert names(folder) == before


def test_a_face_that_does_not_decode_goes_to_the_trash_said_and_blur_ranks_sharpness_not_contrast(
    face, tmp_path, capsys
):
    image, meta = face
    folder = tmp_path / "aligned"
    folder.mkdir()
    # Found from outside: a sharp face at a third of the contrast ranked below a blurred one (DFL's CPBD: above).
    grey = image.astype(np.float64).mean()
    looks = {
        "dim": ((image - grey) * 0.35 + grey).astype(np.uint8),
        "blurred": cv2.GaussianBlur(image, (0, 0), 1.5),
        "sharp": image,
        "shadowed": np.concatenate([image[:, :128] // 2, image[:, 128:]], axis=1),  # (found by review: a doubt)
    }
    for i, (name, look) in enumerate(looks.items()):
        save(folder / f"{name}.jpg", look, {**meta, "source_filename": f"{i:05d}.png"})
    # Found from outside: one face cut short stopped the whole sort; DFL's skips it.
    whole = (folder / "sharp.jpg").read_bytes()
    (folder / "cut.jpg").write_bytes(whole[: int(len(whole) * 0.6)])
    assert read_metadata((folder / "cut.jpg").read_bytes()) is not None  # (its metadata whole: a face by its name)
    cv2.imwrite(str(folder / "notes.jpg"), image)
    assert main(["sort", str(folder), "--by", "blur"]) == 0
    said = capsys.readouterr().out
    assert "Sorted 4 faces" in said and "1 file without DeepFaceLab's metadata: notes.jpg" in said, said
    assert "1 face whose file does not decode: cut.jpg" in said, said
    sources = [read_metadata((folder / n).read_bytes())["source_filename"] for n in names(folder)]
    assert sources[-1] == "00001.png"  # the blurred face last: the dim, sharp and shadowed ones, as sharp, before it
    # None that decodes: one line, nothing moved.
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "cut.jpg").write_bytes(whole[: int(len(whole) * 0.6)])
    assert main(["sort", str(lone), "--by", "hist"]) == 2 and (lone / "cut.jpg").exists()
    assert f"no face of the 1 in {lone} could be measured (1 face whose file does not decode: cut.jpg)" in (
        capsys.readouterr().err
    )
