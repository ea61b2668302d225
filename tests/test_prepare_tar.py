"""`prepare` from tar files: WebDataset's shards (a brace pattern, a folder of them) with .cls labels, and a plain
tar of class folders; damaged, compressed and missing shards; image sets (`eval`) from a tar."""

import io
import json
import os
import socket
import subprocess
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import interrupted_prepare
from PIL import Image
from test_refusals import one_line

from bigbatch.data import load_data, prepare
from bigbatch.metrics.image_sets import open_images


def _all(d) -> tuple[np.ndarray, np.ndarray]:
    images, labels = d.get(torch.arange(len(d)))
    return images.numpy(), labels.numpy()


def _png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (10, 12, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def _read(paths: list[str]) -> tuple[list, list]:
    """predict's inputs: ([(name, image)], [(name, why skipped)])."""
    from bigbatch.tasks.classify.inference import each_image

    got = list(each_image(paths))
    return [g for g in got if not isinstance(g[1], str)], [g for g in got if isinstance(g[1], str)]


def _class_folders(src: Path, per_class: int) -> Path:
    """src/cat/0.png ... and src/dog/0.png ..., each image its own."""
    for c, name in enumerate(("cat", "dog")):
        (src / name).mkdir(parents=True)
        for i in range(per_class):
            (src / name / f"{i}.png").write_bytes(_png(10 * c + i))
    return src


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _shards(root: Path, n_shards=3, per_shard=4) -> dict[str, int]:
    """WebDataset shards (KEY.png, .cls, .json a sample, as its TarWriter) in root, the images in root.flat too."""
    root.mkdir(parents=True, exist_ok=True)
    flat = root.with_suffix(".flat")
    flat.mkdir()
    labels = {}
    for s in range(n_shards):
        with tarfile.open(root / f"train-{s:06d}.tar", "w") as tar:
            for i in range(per_shard):
                key = f"s{s}_{i:03d}"
                labels[key] = (3 * s + i) % 5
                _add(tar, f"{key}.png", _png(10 * s + i))
                (flat / f"{key}.png").write_bytes(_png(10 * s + i))
                _add(tar, f"{key}.cls", f"{labels[key]}\n".encode())
                _add(tar, f"{key}.json", json.dumps({"key": key}).encode())
    return labels


def test_webdataset_shards_by_pattern_keep_each_sample_image_and_its_class_index(tmp_path):
    labels = _shards(tmp_path / "wds")
    report = prepare(str(tmp_path / "wds" / "train-{000000..000002}.tar"), "wds.h5", workers=0)
    assert report.count == 12 and not report.skipped  # (the .json and .cls fields are not files to decode)
    assert report.class_names == ["0", "1", "2", "3", "4"]  # (WebDataset's class indices, as they are)
    d = load_data("wds.h5", 4)
    images, got = _all(d)
    assert d.n_classes == 5 and got.tolist() == [labels[k] for k in sorted(labels)]
    # The same images as a folder of the files give the same pixels (one class here: labels differ).
    flat = prepare(str(tmp_path / "wds.flat"), "flat.h5", workers=0)
    assert np.array_equal(_all(load_data("flat.h5", 4))[0], images) and flat.class_names == []
    # A folder holding the shards (and no images) is the shards; in worker processes too.
    assert prepare(str(tmp_path / "wds"), "again.h5", workers=2).content_hash == report.content_hash
    prepare(str(tmp_path / "wds"), "five.h5", workers=0, limit=5)  # (found from outside: 0, 2, 3, 1, 2 of 5 classes)
    assert sorted(_all(load_data("five.h5", 4))[1].tolist()) == [0, 1, 2, 3, 4]


def _solid(value: int, kind: str = "PNG") -> bytes:
    out = io.BytesIO()
    lossless = {"lossless": True} if kind == "WEBP" else {}
    Image.fromarray(np.full((8, 8, 3), value, np.uint8)).save(out, kind, **lossless)
    return out.getvalue()


def test_samples_without_a_class_index_are_skipped_and_named_and_the_plain_image_is_taken(tmp_path):
    with tarfile.open(tmp_path / "a.tar", "w") as tar:
        _add(tar, "k0.png", _solid(10))
        _add(tar, "k0.cls", b"1")
        _add(tar, "k1.png", _solid(20))  # no .cls
        _add(tar, "k2.png", _solid(30))
        _add(tar, "k2.cls", b"cat")
        _add(tar, "k3.webp", _solid(40, "WEBP"))
        _add(tar, "k3.cls", b" 0\n")
        _add(tar, "k4.cls", b"2")  # a sample of fields only
        _add(tar, "k5.seg.png", _solid(200))  # two images: the plain field is the sample's image
        _add(tar, "k5.png", _solid(50))
        _add(tar, "k5.cls", b"1")
    report = prepare(str(tmp_path / "a.tar"), "a.h5", workers=0)
    assert report.count == 3
    reasons = dict(report.skipped)
    assert set(reasons) == {"k1.png", "k2.png", "k4", "k5.seg.png"} and "whose image is k5.png" in reasons["k5.seg.png"]
    assert "no .cls class index" in reasons["k1.png"] and "'cat'" in reasons["k2.png"] and "no image" in reasons["k4"]
    images, labels = _all(load_data("a.h5", 4))
    assert labels.tolist() == [1, 0, 1] and images.reshape(3, -1).max(1).tolist() == [10, 40, 50]
    with pytest.raises(Exception, match="k1.png: no .cls class index.*--strict"):
        prepare(str(tmp_path / "a.tar"), "s.h5", workers=0, strict=True)


def test_a_tar_of_class_folders_prepares_as_the_folder_does(tmp_path):
    src = _class_folders(tmp_path / "pets", 3)
    (src / "cat" / "._0.png").write_bytes(b"AppleDouble litter")  # (macOS tar's resource forks: not images)
    folder = prepare(str(src), "folder.h5", workers=0)
    subprocess.run(["tar", "cf", tmp_path / "dot.tar", "-C", src, "."], check=True)  # ./cat/0.png ...
    subprocess.run(["tar", "cf", tmp_path / "wrapped.tar", "-C", tmp_path, "pets"], check=True)  # pets/cat/0.png
    for tar in ("dot.tar", "wrapped.tar"):
        report = prepare(str(tmp_path / tar), f"{tar}.h5", workers=2)
        assert (report.class_names, report.count, report.skipped) == (["cat", "dog"], 6, [])
        assert report.content_hash == folder.content_hash
    # An image set (eval's A or B) from a tar: every image, sub-folders not classes.
    images = open_images(tmp_path / "wrapped.tar")
    assert images.names == ["cat/0.png", "cat/1.png", "cat/2.png", "dog/0.png", "dog/1.png", "dog/2.png"]
    # A zip of one folder: predict names its images as its members, prepare's labels without that folder (found from
    # outside: predict left the folder out; found by review: then prepare's labels named nothing)
    with zipfile.ZipFile(tmp_path / "one.zip", "w") as z:
        z.writestr("3/cat/a.png", _png(0))
    assert [name for name, _ in _read([str(tmp_path / "one.zip")])[0]] == [f"{tmp_path}/one.zip/3/cat/a.png"]
    (tmp_path / "l.csv").write_text("cat/a.png,cat\n")
    assert prepare(str(tmp_path / "one.zip"), "wl.h5", workers=0, labels=str(tmp_path / "l.csv")).count == 1


def test_classes_of_a_training_file_name_the_class_indices(tmp_path):
    _shards(tmp_path / "wds")
    prepare("builtin:digits", "digits.h5", workers=0)
    prepare(str(tmp_path / "wds"), "plain.h5", workers=0)
    report = prepare(str(tmp_path / "wds"), "named.h5", workers=0, classes="digits.h5")
    assert report.class_names == load_data("digits.h5", 4).class_names  # (all ten, though 5 to 9 have no image here)
    assert np.array_equal(_all(load_data("named.h5", 4))[1], _all(load_data("plain.h5", 4))[1])
    with tarfile.open(tmp_path / "big.tar", "w") as tar:
        _add(tar, "a.png", _png(0))
        _add(tar, "a.cls", b"12")
    said = r"indices \(.cls, ADA's dataset.json\) run to 12, and --classes digits.h5 has 10 classes"
    with pytest.raises(Exception, match=said):
        prepare(str(tmp_path / "big.tar"), "big.h5", workers=0, classes="digits.h5")


def test_a_damaged_shard_keeps_the_members_before_the_damage_and_says_so(tmp_path):
    _shards(tmp_path / "wds", n_shards=1, per_shard=6)
    whole = (tmp_path / "wds" / "train-000000.tar").read_bytes()
    cut = tmp_path / "cut" / "train-000000.tar"
    cut.parent.mkdir()
    # Cut inside the fourth sample's image: three samples whole, the fourth without its .cls.
    cut.write_bytes(whole[: whole.index(b"s0_003.png") + 512 + 100])
    report = prepare(str(cut), "cut.h5", workers=0)
    assert report.count == 3
    assert [name for name, _ in report.skipped] == [str(cut), "s0_003.png"], report.skipped
    assert "damaged tar" in report.skipped[0][1] and "no .cls" in report.skipped[1][1]
    # (where it ends, not a byte past it: found from outside)
    assert (
        f"cut short at byte {cut.stat().st_size}, within a member: what lies before it is read" in report.skipped[0][1]
    )
    # A plain tar cut inside its last image: that image is short, the others are read.
    with tarfile.open(tmp_path / "plain.tar", "w") as tar:
        for i in range(3):
            _add(tar, f"{i}.png", _png(i))
    plain = (tmp_path / "plain.tar").read_bytes()
    cut.write_bytes(plain[: plain.index(b"2.png") + 512 + 100])
    report = prepare(str(cut), "plain.h5", workers=0)
    assert report.count == 2 and [name for name, _ in report.skipped] == [str(cut), "2.png"]
    assert "truncated: 100 of its" in report.skipped[1][1]
    # A header overwritten mid-shard: the members before it are read, and the damage is listed.
    bad = bytearray(whole)
    at = whole.index(b"s0_002.png")
    bad[at : at + 512] = b"\xff" * 512
    cut.write_bytes(bytes(bad))
    report = prepare(str(cut), "bad.h5", workers=0, overwrite=True)
    assert report.count == 2 and "is not a tar header" in report.skipped[0][1]
    # Cut between two samples, as a download stops (found from outside: read as whole, even under --strict).
    cut.write_bytes(whole[: whole.index(b"s0_004.png")])
    report = prepare(str(cut), "between.h5", workers=0)
    assert report.count == 4 and [name for name, _ in report.skipped] == [str(cut)]
    assert f"a tar cut short: it ends at byte {cut.stat().st_size} without tar's end blocks" in report.skipped[0][1]
    with pytest.raises(Exception, match="tar cut short.*--strict"):
        prepare(str(cut), "strict.h5", workers=0, strict=True)


@pytest.mark.parametrize(
    "make, source, words",
    [
        ("gzip", "a.tar.gz", "a.tar.gz is a gzip-compressed tar; decompress it first"),
        (None, "wds/train-{000000..000005}.tar", "shard wds/train-000003.tar does not exist (3 of the 6 shards"),
        (None, "wds/train-{000000..000002}.png", "names files other than .tar shards"),
        (None, "wds/train-{000000,000001,000000}.tar", "names shard wds/train-000000.tar more than once"),  # (twice)
        ("junk", "junk.tar", "junk.tar is not a readable tar file"),
    ],
)
def test_tars_that_cannot_be_read_are_one_line(make, source, words, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _shards(tmp_path / "wds", per_shard=1)
    if make == "gzip":
        subprocess.run(["tar", "czf", "a.tar.gz", "wds"], check=True)
    if make == "junk":
        Path("junk.tar").write_bytes(b"not a tar at all" * 100)
    one_line(capsys, ["prepare", source, "out.h5"], words)


def test_remote_shards_are_read_in_byte_ranges_a_chunk_not_an_image(tmp_path, monkeypatch):
    import fsspec

    labels = _shards(tmp_path / "wds")
    fs = fsspec.filesystem("memory")
    for tar in sorted((tmp_path / "wds").glob("*.tar")):
        fs.pipe(f"/wds/{tar.name}", tar.read_bytes())
    ranges = []
    cat_ranges = type(fs).cat_ranges
    monkeypatch.setattr(type(fs), "cat_ranges", lambda self, paths, *a, **k: ranges.append(len(paths))
                        or cat_ranges(self, paths, *a, **k))  # fmt: skip
    local = prepare(str(tmp_path / "wds"), "local.h5", workers=0)
    for source in ("memory://wds/train-{000000..000002}.tar", "memory://wds"):
        remote = prepare(source, "remote.h5", workers=2, overwrite=True)
        assert remote.content_hash == local.content_hash and remote.class_names == local.class_names
    assert len(labels) == 12 and ranges and max(ranges) == 1  # one range a shard's chunk, not one a member


def test_an_interrupted_prepare_of_shards_resumes_unless_a_shard_changed(tmp_path, monkeypatch, capsys):
    _shards(tmp_path / "wds", n_shards=2, per_shard=300)

    def interrupted():
        interrupted_prepare(monkeypatch, str(tmp_path / "wds"), "out.h5", workers=0, overwrite=True)

    interrupted()
    again = prepare(str(tmp_path / "wds"), "out.h5", workers=0)
    whole = prepare(str(tmp_path / "wds"), "whole.h5", workers=0)
    assert again.resumed == 512 and again.content_hash == whole.content_hash
    interrupted()
    shard = tmp_path / "wds" / "train-000000.tar"
    shard.write_bytes(shard.read_bytes())  # (rewritten: its time changed, so its images may have)
    os.utime(shard, ns=(1, 1))
    capsys.readouterr()
    assert prepare(str(tmp_path / "wds"), "out.h5", workers=0, overwrite=True).resumed == 0
    said = "the 2 parts kept in .out.h5.parts by an earlier prepare were made with other source files: deleted"
    assert said in capsys.readouterr().err
    interrupted()  # (found from outside: another --codec threw the parts away unsaid; --limit said as other files)
    prepare(str(tmp_path / "wds"), "out.h5", workers=0, overwrite=True, codec="jpeg", limit=590)
    assert "were made with other --limit (so other files taken), codec: deleted" in capsys.readouterr().err


def test_classes_from_a_text_file_name_the_class_indices(tmp_path):
    _shards(tmp_path / "wds", n_shards=1)
    names = ["n01440764 tench, Tinca tinca", "n01443537 goldfish", "c2", "c3", "c4", "c5"]
    (tmp_path / "synsets.txt").write_text("\n".join(names) + "\n\n")
    report = prepare(str(tmp_path / "wds"), "named.h5", workers=0, classes=str(tmp_path / "synsets.txt"))
    assert report.class_names == names
    (tmp_path / "twice.txt").write_text("a\nb\na\n")
    with pytest.raises(Exception, match="twice.txt names 'a' twice: give one class name a line"):
        prepare(str(tmp_path / "wds"), "twice.h5", workers=0, classes=str(tmp_path / "twice.txt"))


def test_links_in_a_tar_read_as_the_files_they_name_and_a_file_added_again_counts_once(tmp_path):
    src = _class_folders(tmp_path / "t3", 2)
    os.link(src / "cat" / "0.png", src / "dog" / "dup.png")  # (GNU tar stores its second name as a link)
    os.symlink("../cat/1.png", src / "dog" / "sym.png")
    folder = prepare(str(src), "folder.h5", workers=0, strict=True)
    subprocess.run(["tar", "cf", tmp_path / "t3.tar", "-C", tmp_path, "t3"], check=True)
    tarred = prepare(str(tmp_path / "t3.tar"), "tar.h5", workers=0, strict=True)
    assert tarred.count == folder.count == 6 and tarred.content_hash == folder.content_hash
    # A file appended again (`tar rf`) is its last copy, as extracting it gives; a link to nothing is listed.
    (src / "cat" / "0.png").unlink()
    (src / "cat" / "0.png").write_bytes(_png(99))
    subprocess.run(["tar", "rf", tmp_path / "t3.tar", "-C", tmp_path, "t3/cat/0.png"], check=True)
    (src / "dog" / "dup.png").unlink()
    (src / "dog" / "dup.png").write_bytes(_png(0))
    assert prepare(str(tmp_path / "t3.tar"), "again.h5", workers=0).content_hash == prepare(
        str(src), "again_folder.h5", workers=0).content_hash  # fmt: skip
    with tarfile.open(tmp_path / "dangling.tar", "w") as tar:
        _add(tar, "a.png", _png(0))
        info = tarfile.TarInfo("b.png")
        info.type, info.linkname = tarfile.SYMTYPE, "nowhere.png"
        tar.addfile(info)
    report = prepare(str(tmp_path / "dangling.tar"), "dangling.h5", workers=0)
    assert report.count == 1 and report.skipped == [("b.png", "a link to nowhere.png, which is no file of the shard")]


def test_a_tar_of_a_folder_contents_keeps_its_one_class_folder(tmp_path):
    (tmp_path / "one" / "cat").mkdir(parents=True)
    for i in range(2):
        (tmp_path / "one" / "cat" / f"{i}.png").write_bytes(_png(i))
    subprocess.run(["tar", "cf", tmp_path / "dot.tar", "-C", tmp_path / "one", "."], check=True)  # ./cat/0.png
    report = prepare(str(tmp_path / "dot.tar"), "dot.h5", workers=0)
    assert report.class_names == ["cat"] and report.content_hash == prepare(str(tmp_path / "one"), "f.h5").content_hash


def test_eval_refuses_a_damaged_tar_and_predict_lists_the_damage_and_names_each_shard(tmp_path):
    from bigbatch.errors import BigbatchError

    _shards(tmp_path / "wds", n_shards=2, per_shard=2)
    images, skipped = _read([str(tmp_path / "wds" / "train-{000000..000001}.tar")])
    assert [name for name, _ in images] == [
        str(tmp_path / "wds" / f"train-00000{s}.tar" / f"s{s}_00{i}.png") for s in (0, 1) for i in (0, 1)
    ] and not skipped  # (WebDataset's fields are not images, and no sample of fields alone is listed here)
    whole = (tmp_path / "wds" / "train-000001.tar").read_bytes()
    bad = bytearray(whole)
    at = whole.index(b"s1_001.png")
    bad[at : at + 512] = b"\xff" * 512
    (tmp_path / "bad.tar").write_bytes(bytes(bad))
    images, skipped = _read([str(tmp_path / "bad.tar")])
    assert len(images) == 1 and "is not a tar header" in skipped[0][1]
    with pytest.raises(BigbatchError, match="bad.tar: .*is not a tar header.*a score needs every image"):
        open_images(tmp_path / "bad.tar")


def test_classes_from_a_synset_mapping_number_class_folders_and_labels_by_their_first_word(tmp_path):
    (tmp_path / "syn.txt").write_text("n01 tench, Tinca\nn02 goldfish\nn03 shark\n")
    for c in ("n01", "n03"):
        (tmp_path / "val" / c).mkdir(parents=True)
        (tmp_path / "val" / c / "a.png").write_bytes(_png(len(c)))
    report = prepare(str(tmp_path / "val"), "val.h5", workers=0, classes=str(tmp_path / "syn.txt"))
    assert report.class_names == ["n01 tench, Tinca", "n02 goldfish", "n03 shark"]
    assert report.empty_folders == []  # (found from outside: the synsets' folders were said to hold no image)
    assert _all(load_data("val.h5", 4))[1].tolist() == [0, 2]
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "x.png").write_bytes(_png(0))
    (tmp_path / "val.csv").write_text("ImageId,PredictionString\nx,n03 1 2 3 4\n")
    flat = prepare(str(tmp_path / "flat"), "flat.h5", workers=0, labels=str(tmp_path / "val.csv"),
                   classes=str(tmp_path / "syn.txt"))  # fmt: skip
    assert flat.count == 1 and _all(load_data("flat.h5", 4))[1].tolist() == [2]
    # A data file prepared with the mapping names its classes by their synsets too (found from outside: README's
    # next step, --classes train.h5, refused the labels' and the folders' synsets).
    flat = prepare(str(tmp_path / "flat"), "flat2.h5", workers=0, labels=str(tmp_path / "val.csv"), classes="val.h5")
    assert flat.class_names == report.class_names and _all(load_data("flat2.h5", 4))[1].tolist() == [2]
    again = prepare(str(tmp_path / "val"), "val2.h5", workers=0, classes="val.h5")
    assert again.class_names == report.class_names and _all(load_data("val2.h5", 4))[1].tolist() == [0, 2]


def test_webdataset_s_joined_sources_are_refused_in_one_line(tmp_path, capsys):
    one_line(capsys, ["prepare", "a-{0..1}.tar::b-{0..1}.tar", "out.h5"], "'::' joins WebDataset's sources")
    # (found from outside: "does not exist", of two more of WebDataset's habits)
    for habit in ("pipe:cat shards/train-000000.tar", "shards/*.tar"):
        one_line(capsys, ["prepare", habit, "out.h5"], "WebDataset's pipe: URLs and shell globs are not read here")


def test_an_image_set_of_webdataset_shards_is_each_sample_s_image(tmp_path):
    with tarfile.open(tmp_path / "seg.tar", "w") as tar:
        for k in range(3):
            _add(tar, f"k{k}.png", _solid(10 * k))
            _add(tar, f"k{k}.seg.png", _solid(200))
            _add(tar, f"k{k}.cls", b"0")
    images = open_images(tmp_path / "seg.tar")  # (eval's A or B: the masks beside are not images of the set)
    assert images.names == ["k0.png", "k1.png", "k2.png"] and images.skipped == []


def test_imagenet_s_class_tars_are_its_classes_and_shards_in_two_folders_are_refused(tmp_path, capsys):
    (tmp_path / "train").mkdir()
    for c, synset in enumerate(("n01443537", "n01440764")):  # ILSVRC2012_img_train.tar holds a tar a class
        with tarfile.open(tmp_path / "train" / f"{synset}.tar", "w") as tar:
            for i in range(2):
                _add(tar, f"{synset}_{i}.JPEG", _png(10 * c + i))
    report = prepare(str(tmp_path / "train"), "train.h5", workers=0)
    images, labels = _all(load_data("train.h5", 4))  # (shards in sorted order: n01440764's images first)
    assert report.class_names == ["n01440764", "n01443537"] and labels.tolist() == [0, 0, 1, 1]
    flat = np.asarray(Image.open(io.BytesIO(_png(10))).convert("RGB"))
    assert np.array_equal(images[0], flat)
    # Train and validation shards under one root are two data sets: refused, naming them.
    for part in ("train", "validation"):
        (tmp_path / "both" / part).mkdir(parents=True)
        with tarfile.open(tmp_path / "both" / part / "shard-000000.tar", "w") as tar:
            _add(tar, "a.png", _png(0))
    one_line(capsys, ["prepare", str(tmp_path / "both"), "x.h5"], "holds .tar shards in 2 folders (train, validation)")


def test_a_source_whose_every_sample_is_skipped_says_why(tmp_path, capsys):
    with tarfile.open(tmp_path / "names.tar", "w") as tar:
        for k in range(2):
            _add(tar, f"k{k}.png", _png(k))
            _add(tar, f"k{k}.cls", b"n01440764")  # (a synset where WebDataset writes a class index)
    one_line(capsys, ["prepare", str(tmp_path / "names.tar"), "x.h5"], "k0.png: its .cls holds b'n01440764', not a")


def test_skipped_files_of_several_shards_name_their_shard(tmp_path):
    for s in range(2):
        with tarfile.open(tmp_path / f"s-{s}.tar", "w") as tar:
            _add(tar, "a.png", _png(s))
            _add(tar, "a.cls", b"0")
            _add(tar, "b.png", _png(s))  # (no .cls)
    report = prepare(str(tmp_path / "s-{0..1}.tar"), "x.h5", workers=0)
    assert [name for name, _ in report.skipped] == [str(tmp_path / f"s-{s}.tar/b.png") for s in (0, 1)]
    # A member that does not decode is named with its shard too (found from outside: "c.png", of either shard).
    for s in range(2):
        with tarfile.open(tmp_path / f"t-{s}.tar", "w") as tar:
            _add(tar, "c.png", _png(s) if s == 0 else b"not a png")
            _add(tar, "c.cls", b"0")
    report = prepare(str(tmp_path / "t-{0..1}.tar"), "y.h5", workers=0)
    assert [name for name, _ in report.skipped] == [str(tmp_path / "t-1.tar/c.png")] and report.count == 1


def test_predict_reads_a_url_prefix_of_shards(tmp_path):
    import fsspec

    _shards(tmp_path / "wds", n_shards=2, per_shard=1)
    fs = fsspec.filesystem("memory")
    for tar in sorted((tmp_path / "wds").glob("*.tar")):
        fs.pipe(f"/predict_wds/{tar.name}", tar.read_bytes())
    images, skipped = _read(["memory://predict_wds"])
    assert [name for name, _ in images] == [f"memory://predict_wds/train-00000{s}.tar/s{s}_000.png" for s in (0, 1)]


def test_predict_reads_a_folder_a_chunk_at_a_time_and_says_what_it_cannot_read(tmp_path):
    from bigbatch.data.sources import FolderSource
    from bigbatch.errors import BigbatchError
    from bigbatch.tasks.classify.inference import each_image

    (tmp_path / "many").mkdir()
    for i in range(150):
        (tmp_path / "many" / f"{i:03d}.png").write_bytes(_png(i))
    asked, read = [], FolderSource.read
    FolderSource.read = lambda self, keys: asked.append(len(keys)) or read(self, keys)
    try:
        images = each_image([str(tmp_path / "many")], chunk=64)
        next(images)  # (found from outside: every image of a folder decoded before the first was predicted)
        assert asked == [64]
        assert len(list(images)) == 149 and asked == [64, 64, 22]
    finally:
        FolderSource.read = read
    # file:// names the path; a compressed tar says so; a data file points to eval.
    subprocess.run(["tar", "czf", tmp_path / "many.tar.gz", "-C", tmp_path, "many"], check=True)
    assert len(list(each_image([f"file://{tmp_path / 'many'}"]))) == 150
    with pytest.raises(BigbatchError, match="is a gzip-compressed tar; decompress it first"):
        list(each_image([str(tmp_path / "many.tar.gz")]))
    prepare(str(tmp_path / "many"), str(tmp_path / "many.h5"), workers=0)
    ((name, why),) = each_image([str(tmp_path / "many.h5")])
    assert "a data file, not an image: score a run on it with bigbatch eval RUN" in why
    # What a folder holds besides images is listed, not passed over unsaid (found from outside: a zip in it).
    (tmp_path / "few").mkdir()
    (tmp_path / "few" / "a.png").write_bytes(_png(0))
    (tmp_path / "few" / "more.zip").write_bytes(b"PK")
    (tmp_path / "few" / "noext").write_bytes(_png(1))
    for name in ("b.svg", "c.png"):
        (tmp_path / "few" / name).write_bytes(_png(2))
    got = dict(each_image([str(tmp_path / "few")]))  # each in its place (found from outside: the others first)
    assert list(got) == [str(tmp_path / "few" / n) for n in ("a.png", "b.svg", "c.png", "more.zip", "noext")]
    assert got[str(tmp_path / "few" / "more.zip")] == "not opened inside a folder: give it to predict on its own"
    assert got[str(tmp_path / "few" / "noext")].startswith("not an image file by its name (avif, bmp,")


def test_predict_lists_every_path_before_reading_an_image(tmp_path):
    from bigbatch.errors import BigbatchError
    from bigbatch.tasks.classify.inference import each_image

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.png").write_bytes(_png(0))
    (tmp_path / "empty").mkdir()
    for bad, words in (("missing", "missing does not exist"), ("empty", "holds no image files")):
        with pytest.raises(BigbatchError, match=words):  # (found by review: rows were predicted, then it failed)
            each_image([str(tmp_path / "d"), str(tmp_path / bad)])
    # An image URL whose server does not answer is said so, not called missing (found from outside).
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # (closed: nothing listens there)
    with pytest.raises(BigbatchError, match=rf"cannot reach http://127.0.0.1:{port}/x.png \(.*\): is its server up"):
        each_image([f"http://127.0.0.1:{port}/x.png"])
    with pytest.raises(BigbatchError, match="^memory://nowhere/x.png does not exist$"):
        each_image(["memory://nowhere/x.png"])
    # A server that refuses it is said so, not called missing (found by review: fsspec's HTTP raises "not found").
    import http.server
    import threading

    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):  # noqa: N802 -- http.server's name
            self.send_response(403)
            self.end_headers()

        do_GET = do_HEAD  # noqa: N815

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/x.png"
    with pytest.raises(BigbatchError, match=f"^cannot read {url}: its server answered HTTP 403$"):
        each_image([url])
    server.shutdown()


def test_a_tar_over_http_reads_its_members_by_range_or_whole_once_where_its_server_ignores_ranges(tmp_path):
    import functools
    import http.server
    import re
    import threading

    from bigbatch.errors import BigbatchError

    (tmp_path / "imgs").mkdir()
    with tarfile.open(tmp_path / "t.tar", "w") as tar:
        for i in range(3):
            _add(tar, f"d{i}.png", _png(i))
            (tmp_path / "imgs" / f"d{i}.png").write_bytes(_png(i))
    local, _ = _read([str(tmp_path / "t.tar")])

    class Ranged(http.server.SimpleHTTPRequestHandler):  # one range a request, as S3 and most servers take them
        def send_head(self):
            wanted = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
            if not wanted:
                return super().send_head()
            data = Path(self.translate_path(self.path)).read_bytes()
            start, end = int(wanted[1]), min(int(wanted[2]), len(data) - 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            self.send_header("Content-Length", str(end + 1 - start))
            self.end_headers()
            return io.BytesIO(data[start : end + 1])

        def log_message(self, *args):
            pass

    class Plain(Ranged):  # python -m http.server's: every answer the whole file
        def send_head(self):
            return http.server.SimpleHTTPRequestHandler.send_head(self)

    for handler in (Ranged, Plain):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=tmp_path))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            top = f"http://127.0.0.1:{server.server_address[1]}"
            url = f"{top}/t.tar"
            images, skipped = _read([url])
            # A folder (its URL ending in /, the server's page of links) and one image, on any server (found from
            # outside: both refused as "a single file", and the advice, a folder, too).
            folder, missed = _read([f"{top}/imgs/", f"{top}/imgs/d1.png"])
            assert [n for n, _ in folder] == [f"{top}/imgs/d{i}.png" for i in (0, 1, 2, 1)] and not missed
            assert all(torch.equal(a, b) for (_, a), (_, b) in zip(folder, [*local, local[1]]))
            with pytest.raises(BigbatchError, match=r"/imgs is a single file; .* \(over HTTP, a folder's URL ends in"):
                _read([f"{top}/imgs"])
            with pytest.raises(BigbatchError, match="imgs/d9.png does not exist$"):
                _read([f"{top}/imgs/d9.png"])
            with pytest.raises(BigbatchError, match="source .*/nothing/ is not on its server: give a folder"):
                _read([f"{top}/nothing/"])  # (no AWS_* to check over HTTP: found from outside)
        finally:
            server.shutdown()
            server.server_close()
        with pytest.raises(BigbatchError, match=r"cannot reach shard .*/t\.tar \(.*\): is its server up\?"):
            _read([url])  # (found from outside: a server down was "does not exist")
        with pytest.raises(BigbatchError, match=r"cannot reach source .*/imgs/ \(.*\): is its server up\?"):
            _read([f"{top}/imgs/"])
        # (found from outside: from a server that ignores ranges, the file's first bytes were decoded as each member,
        # then each refused; the shard comes whole now, once: tests/test_shard_sources.py counts the requests)
        assert [n for n, _ in images] == [f"{url}/d{i}.png" for i in range(3)] and not skipped
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(images, local))


def test_a_folder_over_http_is_the_same_data_set_as_on_disk_whatever_its_names(tmp_path, capsys):
    # Found from outside: over HTTP (a server's folder page of percent-encoded links) a class "dög spaced" was named
    # "d%C3%B6g%20spaced" and its images sorted by their encoded names: another data set than the same folder's.
    import functools
    import http.server
    import threading

    from bigbatch.cli import main

    for c, name in enumerate(["cat", "dög spaced"]):
        (tmp_path / "src" / name).mkdir(parents=True)
        for i, file in enumerate(["b.png", "ünï cödé 名.png", "a.png"]):
            (tmp_path / "src" / name / file).write_bytes(_png(3 * c + i))

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=tmp_path))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/src/"
        assert main(["prepare", url, str(tmp_path / "http.h5"), "--resolution", "8"]) == 0
        with zipfile.ZipFile(tmp_path / "src.zip", "w") as z:  # (found from outside: told to check its credentials)
            z.writestr("cat/a.png", _png(0) * 300)
        assert main(["prepare", url.replace("src/", "src.zip"), str(tmp_path / "zip.h5"), "--resolution", "8"]) == 2
        assert "(its server takes no HTTP range requests, which reading it in place needs" in capsys.readouterr().err
    finally:
        server.shutdown()
        server.server_close()
    assert main(["prepare", str(tmp_path / "src"), str(tmp_path / "disk.h5"), "--resolution", "8"]) == 0
    http, disk = (load_data(str(tmp_path / f"{n}.h5"), 8) for n in ("http", "disk"))
    assert http.class_names == disk.class_names == ["cat", "dög spaced"]
    assert http.content_hash == disk.content_hash
