"""bigbatch sort keeps each face's name from before its first sort: sets of two videos put together stay apart for
`oneface` after a sort renamed them, and `--by restore-names` gives them back (DFL's "recover original filename");
what goes to the trash is said, a face whose file does not decode among it; `blur` measures sharpness, not contrast."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

pytest.importorskip("dlib")
pytest.importorskip("skimage")

import test_faces_sort  # noqa: E402
from test_faces_sort import names, save  # noqa: E402

from bigbatch.cli import main  # noqa: E402
from bigbatch.data.dfl_faces import read_metadata  # noqa: E402

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
    assert main(["sort", str(folder), "--by", "restore-names"]) == 0
    assert names(folder) == first[:3] and "Gave 3 faces of" in capsys.readouterr().out
    # A face the record does not hold (a face renamed by hand): DFL's name, its frame's stem and a free index, not
    # that of a file of the folder's that is no face.
    (folder / "a_00001_0.jpg").rename(folder / "mine.jpg")
    (folder / "00001_0.jpg").write_text("notes")
    assert main(["sort", str(folder), "--by", "restore-names"]) == 0
    assert names(folder) == ["00001_0.jpg", "00001_1.jpg", "a_00002_0.jpg", "b_00001_0.jpg"]
    assert (folder / "00001_0.jpg").read_text() == "notes"
    assert read_metadata((folder / "00001_1.jpg").read_bytes())["source_filename"] == "00001.png"
    assert main(["sort", str(folder), "--by", "restore-names", "--target", "2"]) == 2


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
    assert "Sorted 3 faces" in said and "1 file without DeepFaceLab's metadata: notes.jpg" in said, said
    assert "1 face whose file does not decode: cut.jpg" in said, said
    sources = [read_metadata((folder / n).read_bytes())["source_filename"] for n in names(folder)]
    assert sources[-1] == "00001.png"  # the blurred face last: the dim and the sharp one, as sharp, before it
