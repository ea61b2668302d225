"""A scraped folder full of what is not an image (found from outside, as an FFCV/WebDataset user): files taken by
their endings, every skipped file kept and listed, the images each class got, links in zips, broken links and
names that would break a line said as such."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_refusals import one_line

import bigbatch
from bigbatch.cli import main
from bigbatch.data import prepare
from bigbatch.errors import BigbatchError


def _png(value: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((12, 12, 3), value, np.uint8)).save(out, "PNG")
    return out.getvalue()


def _img2dataset(root: Path, n: int = 3) -> None:
    """img2dataset's "files" layout: each image with its caption and its .json beside it, in class folders."""
    for c, cls in enumerate(("cat", "dog")):
        (root / cls).mkdir(parents=True)
        for i in range(n):
            (root / cls / f"{i:09d}.jpg").write_bytes(_png(40 * c + i))  # (a PNG named .jpg: decoded all the same)
            (root / cls / f"{i:09d}.txt").write_text("a caption")
            (root / cls / f"{i:09d}.json").write_text("{}")


def test_side_files_are_left_out_by_their_endings_and_every_skipped_file_is_kept(tmp_path, capsys):
    _img2dataset(tmp_path / "src")
    for i in range(7):
        (tmp_path / "src" / "cat" / f"bad{i}.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    (tmp_path / "src" / "cat" / "bad0.jpg").write_bytes(b"")
    (tmp_path / "src" / "LICENSE").write_text("beside the class folders, no image")
    assert main(["prepare", "src", "out.h5", "--resolution", "8"]) == 0
    out = capsys.readouterr().out
    assert "wrote out.h5: 6 images 8x8x3, 2 classes" in out and "per class: cat 3, dog 3" in out
    said = "left out 13 files that are no images by their ending (.json 6, .txt 6, no ending 1)"
    assert said in out, out
    # Five named, the rest counted by reason, and where every one is.
    assert (
        "skipped 7 files" in out and "... and 2 more; by reason: not an image Pillow can read 6; an empty file 1" in out
    )
    assert "every one: bigbatch info out.h5 --skipped" in out
    assert main(["info", "out.h5", "--skipped"]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert rows[0] == ["cat/bad0.jpg", "an empty file"] and len(rows) == 7
    assert {name for name, _ in rows} == {f"cat/bad{i}.jpg" for i in range(7)}
    assert main(["info", "out.h5"]) == 0
    info = capsys.readouterr().out
    assert "per class   cat 3, dog 3" in info and f"left out    {said.removeprefix('left out ')}" in info
    assert "every one: bigbatch info out.h5 --skipped" in info
    # --strict holds the images to account, not the captions beside them.
    for i in range(7):
        (tmp_path / "src" / "cat" / f"bad{i}.jpg").unlink()
    assert prepare("src", "strict.h5", resolution=8, strict=True).count == 6
    one_line(capsys, ["info", str(tmp_path), "--skipped"], "--skipped lists the files a data file's prepare skipped")


def test_a_webdataset_shards_fields_are_left_out_as_a_folders_side_files_are_but_the_cls_it_reads(tmp_path, capsys):
    import tarfile

    from test_prepare_tar import _add

    with tarfile.open(tmp_path / "a.tar", "w") as tar:  # (img2dataset's WebDataset: KEY.jpg, .txt, .json, .cls)
        for i in range(3):
            for ending, data in ((".jpg", _png(i)), (".txt", b"a caption"), (".json", b"{}"), (".cls", b"1")):
                _add(tar, f"{i:09d}{ending}", data)
        _add(tar, "lone.json", b"{}")  # (a sample of fields alone: skipped as no image, not counted again)
    assert main(["prepare", "a.tar", "classes.h5", "--resolution", "8"]) == 0
    out = capsys.readouterr().out
    assert "left out 6 files that are no images by their ending (.json 3, .txt 3)" in out and "skipped 1 file" in out
    assert main(["info", "classes.h5"]) == 0
    assert "left out    6 files that are no images by their ending (.json 3, .txt 3)" in capsys.readouterr().out


def test_a_class_folder_of_no_image_files_is_refused_as_one_of_unreadable_images_is(tmp_path, capsys):
    _img2dataset(tmp_path / "src")
    (tmp_path / "src" / "notes").mkdir()
    (tmp_path / "src" / "notes" / "todo.txt").write_text("a folder of notes would be a class of no images")
    one_line(capsys, ["prepare", "src", "out.h5"], "class folder notes of src holds no image file (e.g. notes/todo.txt")
    assert not (tmp_path / "out.h5").exists()
    (tmp_path / "only").mkdir()
    (tmp_path / "only" / "a.txt").write_text("x")
    one_line(capsys, ["prepare", "only", "o.h5"], "holds no image files, only 1 file that is no image by its ending")


def test_many_classes_are_said_by_their_range_and_the_fewest(tmp_path):
    from bigbatch.data.h5describe import describe_data

    for c in range(12):
        (tmp_path / "src" / f"c{c:02d}").mkdir(parents=True)
        for i in range(2 + (c != 5)):
            (tmp_path / "src" / f"c{c:02d}" / f"{i}.png").write_bytes(_png(c))
    report = prepare("src", "out.h5", resolution=8, workers=0)
    assert report.class_counts == [3] * 5 + [2] + [3] * 6
    assert "per class: 2 to 3 images (median 3); fewest: c05 2, c00 3, c01 3" in report.summary()
    assert "per class   2 to 3 images (median 3); fewest: c05 2" in describe_data("out.h5")


def test_links_in_a_zip_and_broken_links_in_a_folder_are_said_to_be_links(tmp_path):
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "0.png").write_bytes(_png(1))
    os.symlink("/nowhere/x.png", tmp_path / "src" / "a" / "gone.png")
    report = prepare("src", "f.h5", resolution=8, workers=0)
    assert report.skipped == [("a/gone.png", "a broken link to /nowhere/x.png")]
    with zipfile.ZipFile(tmp_path / "src.zip", "w") as z:
        z.writestr("a/0.png", _png(1))
        link = zipfile.ZipInfo("a/link.png")
        link.external_attr = (0o120777 << 16) | 0x20  # as `zip -y` stores a link: its target's path as its bytes
        z.writestr(link, "0.png")
    report = prepare("src.zip", "z.h5", resolution=8, workers=0)
    assert report.count == 1
    assert report.skipped == [("a/link.png", "a link to 0.png, which is no file of the zip (zip it without -y)")]


@pytest.mark.skipif(os.uname().sysname == "Darwin", reason="macOS file names hold no newline")
def test_a_name_with_a_newline_or_an_escape_code_stays_on_its_line(tmp_path, capsys):
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "0.png").write_bytes(_png(1))
    (tmp_path / "src" / "a" / "bad\nname\x1b[31m.png").write_bytes(b"")
    one_line(capsys, ["prepare", "src", "s.h5", "--strict"], "a/bad\\nname\\x1b[31m.png: an empty file (--strict")
    assert main(["prepare", "src", "out.h5"]) == 0
    assert "  a/bad\\nname\\x1b[31m.png: an empty file\n" in capsys.readouterr().out
    assert main(["info", "out.h5", "--skipped"]) == 0
    assert capsys.readouterr().out == "a/bad\\nname\\x1b[31m.png\tan empty file\n"


def test_a_class_folder_without_images_is_named_not_dropped_in_silence(tmp_path, capsys):
    # Found from outside: an empty class folder left the file one class short, and prepare said nothing.
    for cls in ("cats", "dogs", "birds", "__MACOSX/cats"):  # (macOS's litter neither a class nor named: from outside)
        (tmp_path / "src" / cls).mkdir(parents=True)
    for i in range(3):
        for cls in ("cats", "dogs"):
            Image.new("RGB", (12, 12), (80 * i, 0, 0)).save(tmp_path / "src" / cls / f"{i}.png")
    report = bigbatch.data.prepare(str(tmp_path / "src"), str(tmp_path / "out.h5"), 8, workers=0)
    assert report.class_names == ["cats", "dogs"] and report.empty_folders == ["birds"]
    assert "1 folder holds no image files, so they are not classes: birds" in report.summary()
    # A class folder whose every file is skipped (not an image, unreadable) would be a class of no images,
    # shifting the classes after it: refused, naming it and a skipped file, and nothing written.
    (tmp_path / "src" / "birds" / "notes.txt").write_text("not an image")  # (no image by its ending)
    with pytest.raises(BigbatchError, match=r"class folder birds of .* holds no image file \(e.g. birds/notes.txt;"):
        bigbatch.data.prepare(str(tmp_path / "src"), str(tmp_path / "again.h5"), 8, workers=0)
    (tmp_path / "src" / "birds" / "notes.txt").rename(tmp_path / "src" / "birds" / "notes.png")  # (unreadable)
    refused = (
        r"class folder birds holds no usable image \(every file skipped, e.g. birds/notes.png: .*\): a class of no"
    )
    with pytest.raises(BigbatchError, match=refused):
        bigbatch.data.prepare(str(tmp_path / "src"), str(tmp_path / "again.h5"), 8, workers=0)
    assert not (tmp_path / "again.h5").exists()
    # Under --limit, the one file taken of a class that holds usable images may be a skipped one: warned of, not
    # refused as a folder of no image (found from outside).
    (tmp_path / "src" / "birds" / "notes.png").rename(tmp_path / "src" / "birds" / "0.png")
    for i in (1, 2):
        Image.new("RGB", (12, 12), (0, 80 * i, 0)).save(tmp_path / "src" / "birds" / f"{i}.png")
    capsys.readouterr()
    limited = bigbatch.data.prepare(str(tmp_path / "src"), str(tmp_path / "limited.h5"), 8, workers=0, limit=3)
    assert limited.count == 2 and limited.class_names == ["birds", "cats", "dogs"]
    assert "--limit 3: the files taken of class folder birds were all skipped (e.g. birds/0.png:" in (
        capsys.readouterr().err
    )
    for i in (1, 2):  # a --limit that leaves nothing out refuses as prepare does (found by review: it warned)
        (tmp_path / "src" / "birds" / f"{i}.png").unlink()
    with pytest.raises(BigbatchError, match=refused.replace("notes.png", "0.png")):
        bigbatch.data.prepare(str(tmp_path / "src"), str(tmp_path / "all.h5"), 8, workers=0, limit=100)


def test_class_tars_of_no_image_a_validation_folder_by_classes_odd_bytes_and_labelled_side_files(tmp_path, capsys):
    import tarfile

    from test_prepare_tar import _add

    # ImageNet's class tars, one holding no image: one line (found by review: a StopIteration's traceback).
    for name, member, data in (("n01", "n01_0.png", _png(1)), ("n02", "n02_0.txt", b"caption")):
        with tarfile.open(tmp_path / f"{name}.tar", "w") as tar:
            _add(tar, member, data)
    (tmp_path / "tars").mkdir()
    for name in ("n01", "n02"):
        (tmp_path / f"{name}.tar").rename(tmp_path / "tars" / f"{name}.tar")
    one_line(capsys, ["prepare", "tars", "t.h5"], "class folder n02 holds no usable image: a class of no images")
    # A validation folder numbered by --classes keeps a class of no image, as one missing: not refused.
    _img2dataset(tmp_path / "train")
    _img2dataset(tmp_path / "val", n=1)
    for f in (tmp_path / "val" / "dog").glob("*.jpg"):
        f.unlink()
    assert prepare("train", "train.h5", resolution=8, workers=0).count == 6
    val = prepare("val", "val.h5", resolution=8, workers=0, classes="train.h5")
    assert val.class_names == ["cat", "dog"] and val.class_counts == [1, 0]
    # A name that is not UTF-8 (a file system's bytes) is kept, written as its escapes (found by review: the data
    # file's end failed on it).
    (tmp_path / "bytes" / "a").mkdir(parents=True)
    (tmp_path / "bytes" / "a" / "0.png").write_bytes(_png(3))
    with open(os.fsencode(tmp_path / "bytes" / "a") + b"/caf\xe9.png", "wb") as f:
        f.write(b"junk")
    assert main(["prepare", "bytes", "b.h5"]) == 0
    capsys.readouterr()
    assert main(["info", "b.h5", "--skipped"]) == 0
    assert capsys.readouterr().out == "a/caf\\udce9.png\tnot an image Pillow can read\n"
    # A labelled file left out by its ending is said to be, not "not in the source" (found from outside).
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.png").write_bytes(_png(4))
    (tmp_path / "flat" / "c").write_bytes(_png(5))
    (tmp_path / "labels.csv").write_text("file,label\na.png,x\nc,y\n")
    report = prepare("flat", "f.h5", resolution=8, workers=0, labels="labels.csv")
    (name, why), *others = report.skipped
    assert not others and name == "c (in labels file labels.csv)"
    assert why.startswith("in the source, but no image by its ending (avif, bmp,") and why.endswith("): rename it")
