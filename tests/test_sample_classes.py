"""`bigbatch sample --outdir` of a conditional G: a folder of each class, as StudioGAN saves its images, which
`prepare` reads back as the run's classes (found from outside: no way to train a classifier on generated images
and score it on real ones, the Classification Accuracy Score)."""

import numpy as np
import pytest
from PIL import Image

from bigbatch.cli import main
from bigbatch.data import load_data


def test_a_conditional_gs_images_go_to_a_folder_of_each_class_which_prepare_reads_as_its_classes(
    tmp_path, one_process_run
):
    fake = tmp_path / "fake"
    assert main(["sample", str(one_process_run), "--n", "30", "--seed", "3", "--outdir", str(fake)]) == 0
    assert main(["sample", str(one_process_run), "--n", "30", "--seed", "3", "--npz", "--out", "f.npz"]) == 0
    drawn = np.load("f.npz")
    folders = {p.name: sorted(q.name for q in p.iterdir()) for p in fake.iterdir()}
    assert set(folders) == {str(int(y)) for y in drawn["y"]}  # (digits' classes are named 0 to 9)
    for i, (image, y) in enumerate(zip(drawn["arr_0"], drawn["y"])):
        assert f"{i:05d}.png" in folders[str(int(y))]
        assert np.array_equal(np.asarray(Image.open(fake / str(int(y)) / f"{i:05d}.png")), image)
    assert main(["prepare", str(fake), "fake.h5", "--resolution", "16"]) == 0
    data = load_data("fake.h5", 16)
    assert data.class_names == sorted(folders) and len(data) == 30
    # A second draw into it would mix with the first (found from outside): refused, or with --overwrite replaces it.
    again = ["sample", str(one_process_run), "--n", "5", "--seed", "4", "--outdir", str(fake)]
    assert main(again) == 2 and len(list(fake.glob("*/*.png"))) == 30
    assert main([*again, "--overwrite"]) == 0 and len(list(fake.glob("*/*.png"))) == 5
    # A PNG of another name than a draw's (a user's own) is refused either way, and never removed (found by review).
    Image.fromarray(drawn["arr_0"][0]).save(fake / "mine.png")
    assert main([*again, "--overwrite"]) == 2 and (fake / "mine.png").exists()


def test_classes_are_names_first_and_an_index_where_no_class_has_its_name_is_said(capsys, monkeypatch):
    # (found from outside: of folders 10, 2 and 3, `--classes 0,2` took index 0 and the folder named 2, unsaid)
    from bigbatch.cli_sample import _parse_classes

    monkeypatch.setattr("bigbatch.errors._WARNED", set())
    assert _parse_classes("2,0", ["10", "2", "3"]) == [1, 0]
    assert (
        capsys.readouterr().err
        == "bigbatch: warning: --classes: no class is named '0': taken as the class of index 0, '10'\n"
    )
    assert _parse_classes("2,0", ["cat", "dog", "eel"]) == [2, 0] and capsys.readouterr().err == ""


def test_a_class_name_no_folder_can_hold_is_mended_and_two_in_one_folder_refused():
    from bigbatch.cli_sample import class_folders
    from bigbatch.errors import BigbatchError

    assert class_folders(["T-shirt/top", ".hidden", "", "cat"], 4) == ["T-shirt_top", "_hidden", "2", "cat"]
    assert class_folders(None, 3) == ["0", "1", "2"]
    with pytest.raises(BigbatchError, match="two classes would share the folder 'a_b'.*use --npz"):
        class_folders(["a/b", "a_b"], 2)
