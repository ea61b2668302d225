"""`prepare --crop none` (whole images, ImageNet's layout) says what its store holds: images below the short side,
classes of --classes with no image here, a validation folder labelled by its CSV (found from outside)."""

import shutil

from PIL import Image
from test_codecs import photos

from bigbatch.cli import main


def test_a_whole_image_store_says_what_lies_below_its_side_and_what_its_classes_and_labels_make_it(tmp_path, capsys):
    # Found from outside (ImageNet's layout): whole images below --resolution were neither enlarged nor counted, though
    # README said counted; a class list longer than the folders added an empty class unsaid; a validation folder
    # labelled by its CSV got the training hint alone; a CSV given as --classes was "not an HDF5 file".
    src = photos(tmp_path / "src", n=8)
    below = sum(min(Image.open(f).size) < 128 for f in src.rglob("*.jpg"))
    assert 0 < below < 8
    (tmp_path / "names.txt").write_text("cat\ndog\nfox\n")
    argv = ["prepare", str(src), str(tmp_path / "w.h5"), "--resolution", "128", "--codec", "jpeg", "--crop", "none"]
    assert main([*argv, "--classes", str(tmp_path / "names.txt")]) == 0
    out, err = capsys.readouterr()
    assert f"{below} of them below the short side asked for: kept at their own size, not enlarged" in out
    assert ": 8 images whole, 3 classes, from" in out  # (found from outside: "of several shapes", all of one)
    assert "1 class of the 3 --classes names has no image here (fox): kept, numbered as given" in err
    assert main(["info", str(tmp_path / "w.h5")]) == 0
    assert f"smaller     {below} image" in capsys.readouterr().out
    (tmp_path / "flat").mkdir()
    rows = []
    for f in sorted(src.rglob("*.jpg")):
        shutil.copy(f, tmp_path / "flat" / f.name)
        rows.append(f"{f.stem},{f.parent.name}")
    (tmp_path / "val.csv").write_text("\n".join(rows) + "\n")
    argv = ["prepare", str(tmp_path / "flat"), str(tmp_path / "v.h5"), "--resolution", "64", "--crop", "none"]
    assert main([*argv, "--codec", "jpeg", "--labels", str(tmp_path / "val.csv")]) == 0
    assert f"or, held-out images, score a classifier on it with: data.val_path={tmp_path / 'v.h5'}" in (
        capsys.readouterr().out
    )
    labelled = [*argv, "--codec", "jpeg", "--overwrite", "--labels", str(tmp_path / "val.csv")]
    assert main([*labelled, "--classes", str(tmp_path / "val.csv")]) == 2
    assert "is neither a data file (DATA.h5) nor a text file of class names (.txt" in capsys.readouterr().err
