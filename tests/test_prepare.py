"""`prepare`: folders, zips and built-in sources into DATA.h5; bad files; metadata; reading it back."""

import gzip
import os
import warnings
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from PIL import Image

import bigbatch
from bigbatch.cli import main
from bigbatch.data import BatchLoader, H5Data, describe_data, load_data, prepare, read_meta, verify_data
from bigbatch.data.h5write import hash_arrays
from bigbatch.data.schedule import BucketOrder, bucket_shapes
from bigbatch.data.streams import GlobalOrder
from bigbatch.urls import public_name


def _image(seed: int, size=(12, 10)) -> np.ndarray:
    """A random RGB image, size (w, h) as Pillow has it."""
    return np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)


def _folder(root: Path, classes=("cat", "dog house"), per_class=5, size=(12, 10)) -> dict[str, np.ndarray]:
    """PNG files under root/<class>/ (or flat with classes=()); returns relative path -> pixels."""
    out = {}
    for c, name in enumerate(classes or [""]):
        for i in range(per_class):
            rel = f"{name}/{i:02d}.png" if name else f"{i:02d}.png"
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            out[rel] = _image(100 * c + i, size)
            Image.fromarray(out[rel]).save(root / rel)
    return out


def _all(d: H5Data) -> tuple[np.ndarray, np.ndarray]:
    images, labels = d.get(torch.arange(len(d)))
    return images.numpy(), labels.numpy()


def test_class_folders_become_labels_with_their_names(tmp_path):
    pixels = _folder(tmp_path / "src")
    report = prepare(str(tmp_path / "src"), str(tmp_path / "out.h5"), workers=0)
    assert report.count == 10 and report.class_names == ["cat", "dog house"] and not report.skipped
    d = load_data(str(tmp_path / "out.h5"), 32)
    assert (len(d), d.n_classes, d.class_names, d.channels) == (10, 2, ["cat", "dog house"], 3)
    assert d.resolution == 0  # 12x10 images are not square: kept as they are without --resolution
    images, labels = _all(d)
    assert images.dtype == np.uint8 and images.shape == (10, 10, 12, 3)
    # Sorted order, label from the folder, pixels untouched.
    for i, rel in enumerate(sorted(pixels)):
        np.testing.assert_array_equal(images[i], pixels[rel])
        assert labels[i] == (0 if rel.startswith("cat/") else 1)
    # `bigbatch info` lists the classes; a name holding a comma is quoted (it read as two classes).
    _folder(tmp_path / "commas", classes=("a,b", "c"), per_class=1)
    prepare(str(tmp_path / "commas"), str(tmp_path / "commas.h5"), workers=0)
    assert "classes     2: 'a,b', c\n" in describe_data(tmp_path / "commas.h5")


def test_flat_folder_is_unconditional_and_resolution_center_crops(tmp_path):
    src = tmp_path / "flat"
    src.mkdir()
    # 40x20 (w x h): red left and right quarters, green middle: a center crop keeps only green.
    a = np.zeros((20, 40, 3), np.uint8)
    a[:, :10, 0] = a[:, 30:, 0] = 255
    a[:, 10:30, 1] = 255
    for i in range(3):
        Image.fromarray(a).save(src / f"{i}.png")
    report = prepare(str(src), str(tmp_path / "flat.h5"), resolution=8, workers=0)
    d = load_data(str(tmp_path / "flat.h5"), 8)
    assert report.class_names == [] and d.n_classes == 0 and d.resolution == 8
    images, labels = _all(d)
    assert images.shape == (3, 8, 8, 3) and labels.tolist() == [0, 0, 0]
    assert images[..., 0].max() <= 2 and images[..., 1].min() >= 253
    assert "LANCZOS" in read_meta(tmp_path / "flat.h5")["resize"]


def test_zip_gives_the_same_data_as_the_folder(tmp_path):
    pixels = _folder(tmp_path / "photos")
    archive = tmp_path / "photos.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for rel in pixels:  # zipped with its top folder, as zips of folders usually are
            z.write(tmp_path / "photos" / rel, f"photos/{rel}")
        z.writestr("__MACOSX/photos/._00.png", b"resource fork")
    from_zip = prepare(str(archive), str(tmp_path / "z.h5"), resolution=8, workers=0)
    from_folder = prepare(str(tmp_path / "photos"), str(tmp_path / "f.h5"), resolution=8, workers=0)
    assert from_zip.class_names == ["cat", "dog house"] and not from_zip.skipped
    assert from_zip.content_hash == from_folder.content_hash
    # A name added again counts once, as its last copy, as a tar's (found from outside: the last copy twice, the
    # first lost)
    (tmp_path / "photos" / "cat" / "00.png").unlink()
    Image.fromarray(_image(999, (12, 10))).save(tmp_path / "photos" / "cat" / "00.png")
    with warnings.catch_warnings(), zipfile.ZipFile(archive, "a") as z:
        warnings.simplefilter("ignore")  # (zipfile's "Duplicate name")
        z.write(tmp_path / "photos" / "cat" / "00.png", "photos/cat/00.png")
    again = prepare(str(archive), str(tmp_path / "again.h5"), resolution=8, workers=0)
    changed = prepare(str(tmp_path / "photos"), str(tmp_path / "changed.h5"), resolution=8, workers=0)
    assert again.count == 10 and again.content_hash == changed.content_hash


def test_a_file_url_is_the_local_path_it_names_for_every_end(tmp_path, monkeypatch, capsys):
    # fsspec's file:// names a local path: the source, the output and data.path alike (the output was once
    # written under a folder named "file:" in the working directory, and said not to exist when it did).
    _folder(tmp_path / "src")
    monkeypatch.chdir(tmp_path)
    url = f"file://{tmp_path / 'out.h5'}"
    report = prepare(f"file://{tmp_path / 'src'}", url, workers=0)
    assert (tmp_path / "out.h5").is_file() and not (tmp_path / "file:").exists()
    assert load_data(url, 10).content_hash == report.content_hash == read_meta(tmp_path / "out.h5")["content_hash"]
    with pytest.raises(bigbatch.BigbatchError, match="exists: give --overwrite"):
        prepare(str(tmp_path / "src"), url, workers=0)
    main(["train", "--preset", "digits", f"data.path={url}", "--dry-run"])  # (its plan: whatever it says)
    assert "does not exist" not in capsys.readouterr().err


def test_a_zip_of_utf8_names_without_the_utf8_flag_reads_them_as_utf8(tmp_path):
    # Info-ZIP's zip (Linux, macOS) writes UTF-8 names without the flag that says so; zipfile reads them as
    # CP437. Made here by clearing the flag of a zip Python wrote (its names are UTF-8, flagged).
    pixels = _folder(tmp_path / "photos")
    (tmp_path / "photos" / "dog house").rename(tmp_path / "photos" / "chïen")
    archive = tmp_path / "photos.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for rel in pixels:
            rel = rel.replace("dog house", "chïen")
            z.write(tmp_path / "photos" / rel, rel)
    data = bytearray(archive.read_bytes())
    for signature, at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):  # local and central headers' flags
        i = data.find(signature)
        while i >= 0:
            data[i + at + 1] &= ~0x08 & 0xFF  # bit 11 of the little-endian flag field
            i = data.find(signature, i + 4)
    archive.write_bytes(bytes(data))
    assert "├" in "".join(zipfile.ZipFile(archive).namelist())  # zipfile's reading: CP437
    from_zip = prepare(str(archive), str(tmp_path / "z.h5"), resolution=8, workers=0)
    from_folder = prepare(str(tmp_path / "photos"), str(tmp_path / "f.h5"), resolution=8, workers=0)
    assert from_zip.class_names == ["cat", "chïen"] and not from_zip.skipped
    assert from_zip.content_hash == from_folder.content_hash


def test_workers_give_identical_files(tmp_path):
    _folder(tmp_path / "src", per_class=40)
    one = prepare(str(tmp_path / "src"), str(tmp_path / "a.h5"), resolution=8, workers=0)
    two = prepare(str(tmp_path / "src"), str(tmp_path / "b.h5"), resolution=8, workers=2)
    assert two.workers == 2 and one.count == two.count == 80
    assert one.content_hash == two.content_hash
    np.testing.assert_array_equal(_all(H5Data(tmp_path / "a.h5"))[0], _all(H5Data(tmp_path / "b.h5"))[0])
    many = prepare(str(tmp_path / "src"), str(tmp_path / "c.h5"), resolution=8, workers=64)  # (found from outside:
    assert many.workers == 3 and many.content_hash == one.content_hash  # 64 processes for 80 files, 3 tasks of them)


def _bad_files(root: Path) -> set[str]:
    good = root / "cat" / "00.png"
    data = good.read_bytes()
    (root / "cat" / "truncated.png").write_bytes(data[: len(data) // 2])
    (root / "cat" / "junk.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (root / "dog house" / "empty.png").write_bytes(b"")
    (root / "dog house" / "notes.txt").write_text("not an image")  # no image by its ending: left out, counted
    (root / "stray.png").write_bytes(data)  # beside the class folders: no class
    (root / ".DS_Store").write_bytes(b"\0")  # operating-system litter: ignored silently
    return {"cat/truncated.png", "cat/junk.jpg", "dog house/empty.png", "stray.png"}


def test_bad_files_are_skipped_and_reported(tmp_path):
    _folder(tmp_path / "src")
    bad = _bad_files(tmp_path / "src")
    report = prepare(str(tmp_path / "src"), str(tmp_path / "out.h5"), resolution=8, workers=2)
    assert report.count == 10
    assert {name for name, _ in report.skipped} == bad
    reasons = dict(report.skipped)
    assert "truncated" in reasons["cat/truncated.png"] and reasons["cat/junk.jpg"].startswith("corrupt or truncated")
    assert reasons["dog house/empty.png"] == "an empty file"  # (found from outside: "not an image Pillow can read")
    text = report.summary()
    assert "skipped 4 files" in text and "and 0 more" not in text
    assert "left out 1 file that is no image by its ending (.txt 1)" in text and report.left_out == {".txt": 1}
    assert read_meta(tmp_path / "out.h5")["skipped"] == 4
    assert "cat/junk.jpg: corrupt or truncated" in describe_data(tmp_path / "out.h5")
    # A file whose ending is an image's but whose bytes are a data file is no image, not a corrupt one (found from
    # outside: "corrupt or truncated").
    (tmp_path / "two" / "a").mkdir(parents=True)
    (tmp_path / "two" / "a" / "00.png").write_bytes((tmp_path / "src" / "cat" / "00.png").read_bytes())
    (tmp_path / "two" / "a" / "out.png").write_bytes((tmp_path / "out.h5").read_bytes())
    report = prepare(str(tmp_path / "two"), str(tmp_path / "two.h5"), resolution=8, workers=0)
    assert report.skipped == [("a/out.png", "not an image Pillow can read (its format: HDF5)")]


def test_strict_makes_a_bad_file_an_error_and_leaves_the_old_file(tmp_path):
    _folder(tmp_path / "src")
    out = tmp_path / "out.h5"
    old = prepare(str(tmp_path / "src"), str(out), resolution=8, workers=0).content_hash
    (tmp_path / "src" / "dog house" / "zz-junk.png").write_bytes(b"junk")
    with pytest.raises(bigbatch.BigbatchError, match="out.h5 exists: give --overwrite to replace it"):
        prepare(str(tmp_path / "src"), str(out), resolution=8, workers=0)  # never replaced unasked
    with pytest.raises(bigbatch.BigbatchError, match="zz-junk.png.*--strict") as e:
        prepare(str(tmp_path / "src"), str(out), resolution=8, workers=2, strict=True, overwrite=True)
    assert "\n" not in str(e.value)
    assert read_meta(out)["content_hash"] == old  # the interrupted prepare replaced nothing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.h5", "src"]  # and left no partial file


def _source(root: Path, kind: str) -> str:
    if kind == "missing":
        return str(root / "missing")
    if kind == "single file":
        (root / "one.png").write_bytes(b"x")
        return str(root / "one.png")
    (root / kind).mkdir()
    if kind == "text only":
        (root / kind / "a.txt").write_text("x")
    return str(root / kind)


@pytest.mark.parametrize(
    "kind, words",
    [
        ("missing", "does not exist"),
        ("empty", "holds no files"),
        ("text only", "holds no image files, only 1 file that is no image by its ending \\(.txt 1\\)"),
        ("single file", "single file"),
    ],
)
def test_no_images_is_a_one_line_error(tmp_path, kind, words):
    with pytest.raises(bigbatch.BigbatchError, match=words) as e:
        prepare(_source(tmp_path, kind), str(tmp_path / "out.h5"))
    assert "\n" not in str(e.value) and not (tmp_path / "out.h5").exists()


def test_sizes_must_match_without_resolution(tmp_path):
    _folder(tmp_path / "src", classes=(), per_class=2)
    Image.fromarray(_image(9, (7, 7))).save(tmp_path / "src" / "zz.png")
    with pytest.raises(bigbatch.BigbatchError, match="--resolution"):
        prepare(str(tmp_path / "src"), str(tmp_path / "out.h5"), workers=0)
    with pytest.raises(bigbatch.BigbatchError, match=r"must end in \.h5"):
        prepare(str(tmp_path / "src"), str(tmp_path / "out.hdf"), workers=0)


def test_pillows_warnings_of_damaged_metadata_are_one_line_of_bigbatch_s(tmp_path, capsys):
    # Found from outside: a photo with corrupt EXIF made Pillow print two lines of its own source (a UserWarning),
    # from each worker; now one line, once, in bigbatch's words, and the file is decoded.
    (tmp_path / "src" / "a").mkdir(parents=True)
    broken = b"Exif\x00\x00II*\x00\x08\x00\x00\x00\x20\x00" + b"\x12\x01\x03\x00\x01\x00\x00\x00\x06\x00\x00\x00"
    for i in range(3):
        Image.new("RGB", (40, 30), (200, 10, 10)).save(tmp_path / "src" / "a" / f"{i}.jpg", exif=broken)
    assert main(["prepare", str(tmp_path / "src"), str(tmp_path / "out.h5"), "--workers", "0"]) == 0
    said = capsys.readouterr()
    assert said.err.count("bigbatch: warning: Pillow: Corrupt EXIF data.") == 1 and "UserWarning" not in said.err
    assert ": 3 images" in said.out


def test_image_modes_are_converted_consistently(tmp_path):
    src = tmp_path / "modes"
    src.mkdir()
    grey = np.full((4, 4), 200, np.uint8)
    Image.fromarray(grey, "L").save(src / "a_grey.png")
    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[..., 0] = 255
    rgba[:, :2, 3] = 255  # left half opaque red, right half transparent
    Image.fromarray(rgba, "RGBA").save(src / "b_rgba.png")
    Image.fromarray(np.full((4, 4), 32896, np.uint16)).save(src / "c_16bit.png")  # 32896 = 128 * 257
    Image.new("CMYK", (4, 4), (0, 255, 255, 0)).save(src / "d_cmyk.jpg", quality=100)
    Image.fromarray(grey, "L").convert("P").save(src / "e_palette.png")
    Image.fromarray(rgba, "RGBA").save(src / "f_rgba.tiff")
    Image.fromarray(np.full((4, 4), 200, np.int32)).save(src / "g_32bit.tiff")  # (levels, as Pillow reads them)
    (src / "h_12bit.pgm").write_bytes(b"P5 4 4 4095\n" + np.full(16, 2056, ">u2").tobytes())  # 2056/4095 of 255: 128
    report = prepare(str(src), str(tmp_path / "m.h5"), workers=0)
    assert report.count == 8 and not report.skipped
    images, _ = _all(load_data(str(tmp_path / "m.h5"), 4))
    assert images.shape == (8, 4, 4, 3) and (images[6] == 200).all() and (images[7] == 128).all()
    assert (images[0] == 200).all() and (images[4] == 200).all()
    for i in (1, 5):  # transparency composited onto white, the same for PNG and TIFF
        assert (images[i, :, :2] == [255, 0, 0]).all() and (images[i, :, 2:] == 255).all()
    assert (images[2] == 128).all()  # 16-bit scaled, not clipped at 255
    assert (np.abs(images[3].astype(int) - [255, 0, 0]) <= 2).all()


def test_exif_orientation_is_applied(tmp_path):
    src = tmp_path / "exif"
    src.mkdir()
    a = np.zeros((2, 4, 3), np.uint8)  # 4 wide, 2 high
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    Image.fromarray(a).save(src / "a.png", exif=exif)
    prepare(str(src), str(tmp_path / "e.h5"), workers=0)
    assert _all(H5Data(tmp_path / "e.h5"))[0].shape == (1, 4, 2, 3)


def test_metadata_and_content_hash(tmp_path):
    _folder(tmp_path / "src")
    report = prepare(str(tmp_path / "src"), str(tmp_path / "out.h5"), resolution=8, workers=0, limit=4)
    meta = read_meta(tmp_path / "out.h5")
    assert meta["count"] == report.count == 4 and meta["resolution"] == 8
    assert meta["class_names"] == ["cat", "dog house"] and meta["bigbatch_version"] == bigbatch.__version__
    assert meta["source"] == str(tmp_path / "src") and meta["content_hash"] == report.content_hash
    d = H5Data(tmp_path / "out.h5")
    images, labels = _all(d)
    assert sorted(labels.tolist()) == [0, 0, 1, 1]  # --limit keeps every class's share
    assert hash_arrays(d.class_names, images, labels) == d.content_hash  # the hash covers what is stored
    text = describe_data(tmp_path / "out.h5")
    assert all(w in text for w in ("4 uint8 NHWC", "8px", "cat, dog house", report.content_hash, "LANCZOS"))
    with h5py.File(tmp_path / "out.h5") as f:  # plain HDF5, readable by any tool
        assert f["images"].shape == (4, 8, 8, 3) and f["images"].dtype == np.uint8 and f["labels"].dtype == np.int64
        offsets: list[int] = []
        f["images"].id.chunk_iter(lambda info: offsets.append(info.byte_offset))
    assert verify_data(tmp_path / "out.h5") == report.content_hash
    with open(tmp_path / "out.h5", "r+b") as f:  # one pixel changed on disk
        f.seek(offsets[0] + 5)
        byte = f.read(1)[0]
        f.seek(offsets[0] + 5)
        f.write(bytes([byte ^ 1]))
    with pytest.raises(bigbatch.BigbatchError, match="is damaged"):
        verify_data(tmp_path / "out.h5")


def test_builtin_sources_match_load_data(tmp_path, monkeypatch):
    report = prepare("builtin:digits", str(tmp_path / "digits.h5"), resolution=16)
    d, ref = load_data(str(tmp_path / "digits.h5"), 16), load_data("builtin:digits", 16)
    assert report.count == len(ref) == len(d) and d.class_names == ref.class_names
    idx = torch.tensor([0, 1796, 5, 5])
    for a, b in zip(d.get(idx), ref.get(idx)):
        assert torch.equal(a, b)
    assert d.content_hash == ref.content_hash
    assert read_meta(tmp_path / "digits.h5")["source"] == "builtin:digits"
    # Fashion-MNIST from any folder of IDX files.
    rng = np.random.default_rng(0)
    for name, array in (
        ("train-images-idx3-ubyte", rng.integers(0, 256, (6, 28, 28))),
        ("train-labels-idx1-ubyte", np.arange(6)),
    ):
        header = b"\0\0\x08" + bytes([array.ndim]) + b"".join(int(s).to_bytes(4, "big") for s in array.shape)
        with gzip.open(tmp_path / f"{name}.gz", "wb") as f:
            f.write(header + array.astype(np.uint8).tobytes())
    monkeypatch.setenv("BIGBATCH_FASHION_MNIST", str(tmp_path))
    report = prepare("builtin:fashion-mnist", str(tmp_path / "fm.h5"))
    fm = H5Data(tmp_path / "fm.h5")
    assert (report.count, fm.resolution, fm.n_classes) == (6, 28, 10) and fm.labels.tolist() == list(range(6))


def test_reader_is_lazy_per_worker_and_in_ram_agrees(tmp_path):
    _folder(tmp_path / "src", per_class=20)
    prepare(str(tmp_path / "src"), str(tmp_path / "out.h5"), resolution=8, workers=0)
    lazy, ram = H5Data(tmp_path / "out.h5"), H5Data(tmp_path / "out.h5", in_ram=True)
    idx = torch.tensor([39, 0, 7, 7, 8, 9, 10, 3])  # out of order, repeated, with runs
    images, labels = lazy.get(idx)
    assert torch.equal(images, ram.get(idx)[0]) and torch.equal(labels, ram.get(idx)[1])
    whole = _all(lazy)[0]
    np.testing.assert_array_equal(images.numpy(), whole[idx.numpy()])
    requests = [GlobalOrder(len(lazy), seed=1).indices(8 * k, 8) for k in range(6)]
    want = [lazy.get(r)[0] for r in requests]
    for data, workers, context in ((lazy, 2, "fork"), (lazy, 1, "spawn"), (ram, 2, "fork")):
        got = [b.images for b in BatchLoader(data, requests, workers=workers, context=context)]
        assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))


def test_open_errors_are_one_line(tmp_path):
    with pytest.raises(bigbatch.BigbatchError, match="cannot open data set .*does not exist \\("):
        load_data(str(tmp_path / "nothere.h5"), 32)
    # A run's relative data.path read from another folder: where it was looked for is said.
    with pytest.raises(bigbatch.BigbatchError, match=f"does not exist in the current folder {os.getcwd()} "):
        load_data("data/nothere.h5", 32)
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["x"] = np.zeros(3)
    with pytest.raises(bigbatch.BigbatchError, match="not a data file written by `bigbatch prepare`"):
        load_data(str(tmp_path / "other.h5"), 32)
    (tmp_path / "text.h5").write_text("no")
    with pytest.raises(bigbatch.BigbatchError, match="cannot open data set"):
        load_data(str(tmp_path / "text.h5"), 32)
    assert "secret" not in public_name("s3://key:secret@bucket/data.h5?token=secret")
    # Found from outside: a chained fsspec URL's later parts were neither checked nor cleaned (the password was
    # printed, and written into the data file as its source).
    chained = "zip://a.png::https://user:secret@host/f.zip"
    assert public_name(chained) == "zip://a.png::https://host/f.zip"
    with pytest.raises(bigbatch.BigbatchError, match=r"the source carries credentials in its URL \(user info"):
        prepare(chained, str(tmp_path / "chained.h5"))


def test_a_data_file_that_reads_bytes_from_outside_itself_is_refused(tmp_path):
    # Found from outside: images stored "externally" in /etc/passwd trained, and were drawn into the sample sheets.
    _folder(tmp_path / "src", per_class=2)
    for codec in ("raw", "jpeg"):
        prepare(str(tmp_path / "src"), str(tmp_path / f"{codec}.h5"), resolution=8, workers=0, codec=codec)
        (tmp_path / "secret.txt").write_bytes(bytes(range(256)) * 8)
        name = "images" if codec == "raw" else "encoded"
        with h5py.File(tmp_path / f"{codec}.h5", "r+") as f:
            old = f[name]
            shape, dtype = old.shape, old.dtype
            del f[name]
            f.create_dataset(
                name, shape=shape, dtype=dtype, external=[(str(tmp_path / "secret.txt"), 0, h5py.h5f.UNLIMITED)]
            )
        with pytest.raises(bigbatch.BigbatchError, match=f"{name} keeps its bytes outside the file"):
            load_data(str(tmp_path / f"{codec}.h5"), 8)
    with h5py.File(tmp_path / "raw.h5", "r+") as f:
        del f["images"]
        f["images"] = h5py.ExternalLink(str(tmp_path / "jpeg.h5"), "/encoded")
    with pytest.raises(bigbatch.BigbatchError, match="images is a link .ExternalLink., which bigbatch does not follow"):
        load_data(str(tmp_path / "raw.h5"), 8)


def test_a_data_file_replaced_after_it_was_opened_is_not_read_under_the_old_hash(tmp_path):
    # Found from outside: prepare --overwrite onto data.path as a run started had it train on the new images while
    # its checkpoints recorded the old ones' content hash (each process opens the file by name at its first read).
    _folder(tmp_path / "a", per_class=2)
    _folder(tmp_path / "b", classes=("cat", "dog house"), per_class=3)
    prepare(str(tmp_path / "a"), str(tmp_path / "data.h5"), resolution=8, workers=0)
    prepare(str(tmp_path / "b"), str(tmp_path / "new.h5"), resolution=8, workers=0)
    opened = load_data(str(tmp_path / "data.h5"), 8)
    os.replace(tmp_path / "new.h5", tmp_path / "data.h5")
    with pytest.raises(bigbatch.BigbatchError, match="data.h5 was replaced since it was opened .prepare --overwrite"):
        opened.get(torch.arange(2))
    assert len(load_data(str(tmp_path / "data.h5"), 8)) == 6  # (opened again: the new file)


def test_aspect_ratio_buckets(tmp_path):
    src = tmp_path / "rect"
    src.mkdir()
    for i, size in enumerate([(40, 20), (20, 40), (30, 30), (41, 19), (30, 31), (40, 30)]):
        Image.fromarray(_image(i, size)).save(src / f"{i}.png")
    report = prepare(str(src), str(tmp_path / "b.h5"), resolution=16, buckets=True, workers=0)
    d = H5Data(tmp_path / "b.h5")
    assert report.count == 6 and d.resolution == 0 and d.bucket_counts == [1, 2, 1, 2]
    shapes = [(g["height"], g["width"]) for g in read_meta(tmp_path / "b.h5")["groups"]]
    assert shapes == [(22, 12), (16, 16), (14, 18), (12, 22)]  # portrait to landscape, about 16 x 16 pixels
    assert all(s in bucket_shapes(16) for s in shapes)
    order = BucketOrder(d.bucket_counts, batch=2, seed=0)
    for k in range(8):
        images, _ = d.get(order.indices(2 * k, 2))
        assert images.shape[0] == 2
    with pytest.raises(bigbatch.BigbatchError, match="mixes images of different shapes"):
        d.get(torch.arange(6))
    # A Loader's batches are one shape: said when it is made (found from outside: at the first batch, with advice
    # to read in BucketOrder, which a Loader cannot).
    with pytest.raises(bigbatch.BigbatchError, match="holds images of several shapes .*prepare the images without"):
        bigbatch.data.Loader(str(tmp_path / "b.h5"), batch=2, resolution=16)


@pytest.mark.slow
def test_training_reads_a_prepared_file(tiny, tmp_path):
    _folder(tmp_path / "src", per_class=20)
    prepare(str(tmp_path / "src"), "pets.h5", resolution=16, workers=0)
    run = bigbatch.train(tiny.override({"data.path": "pets.h5", "train.kimg": 0.064}), run_dir="run", quiet=True)
    G = bigbatch.load_generator(run)  # built for the file's classes, which the run recorded
    assert (G.n_classes, G.class_names, G.resolution) == (2, ["cat", "dog house"], 16)
    assert G(torch.randn(2, G.dim_z), torch.tensor([0, 1])).shape == (2, 3, 16, 16)


def test_the_list_of_faceless_frames_extract_writes_is_not_a_file_to_prepare(tmp_path):
    # Found from outside: prepare --strict refused extract's own output ("no_face.txt: not an image"), and without
    # --strict every prepare of aligned faces listed it as skipped.
    _folder(tmp_path / "aligned", classes=(), per_class=3)
    (tmp_path / "aligned" / "no_face.txt").write_text("00009.png\n")
    report = prepare(str(tmp_path / "aligned"), str(tmp_path / "faces.h5"), strict=True)
    assert report.count == 3 and read_meta(tmp_path / "faces.h5")["skipped"] == 0


def test_a_zip_member_that_inflates_past_any_image_is_skipped_unread(tmp_path, monkeypatch):
    # Found from outside: a 1 MB zip whose member inflates to 1 GiB was read whole into memory (in each worker).
    from bigbatch.data import sources

    _folder(tmp_path / "src", classes=(), per_class=2)
    big = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(big).save(tmp_path / "src" / "big.png")
    with zipfile.ZipFile(tmp_path / "z.zip", "w") as z:
        for f in sorted((tmp_path / "src").iterdir()):
            z.write(f, f.name)
    monkeypatch.setattr(sources, "MAX_MEMBER", 4000)  # (the big PNG is over 12 KB; the others a few hundred bytes)
    report = prepare(str(tmp_path / "z.zip"), str(tmp_path / "z.h5"), resolution=8, workers=0)
    assert report.count == 2 and report.skipped[0][0] == "big.png" and "more than any image" in report.skipped[0][1]


def test_a_data_file_inside_a_zip_reads_through_a_chained_url(tmp_path):
    # Found from outside: zip://DATA.h5::ARCHIVE.zip failed with "seek of closed file" (a traceback): the chained
    # file system, collected, closed the archive under the open data file.
    _folder(tmp_path / "src", classes=("a", "b"), per_class=2)
    prepare(str(tmp_path / "src"), str(tmp_path / "d.h5"), resolution=8)
    with zipfile.ZipFile(tmp_path / "d.zip", "w") as z:
        z.write(tmp_path / "d.h5", "d.h5")
    data = load_data(f"zip://d.h5::{tmp_path / 'd.zip'}", 8)
    local = load_data(str(tmp_path / "d.h5"), 8)
    assert len(data) == 4 and torch.equal(data.get(torch.arange(4))[0], local.get(torch.arange(4))[0])


def test_pipes_links_above_the_source_and_names_that_are_not_utf8(tmp_path):
    # Found from outside: a named pipe in the source hung prepare (SIGTERM ignored with workers); a link to a folder
    # above the source was walked as a class (a link to / would crawl the whole tree); a file name that is not
    # UTF-8 crashed every local prepare with a traceback.
    _folder(tmp_path / "src", classes=("c1",), per_class=2)
    _folder(tmp_path / "other", classes=(), per_class=2)
    (tmp_path / "src" / "up").symlink_to("..")
    os.mkfifo(tmp_path / "src" / "c1" / "pipe.png")
    Image.new("RGB", (12, 10)).save(os.fsencode(tmp_path / "src" / "c1") + b"/caf\xe9.png")
    report = prepare(str(tmp_path / "src"), str(tmp_path / "out.h5"), workers=2)
    assert report.count == 3 and report.class_names == ["c1"]
    # The pipe listed, unread (found from outside: left out without a word, where other files not read are listed).
    assert report.skipped == [("c1/pipe.png", "not a regular file (a named pipe, socket or device): not read")]
    from bigbatch.metrics.image_sets import open_images  # (a score takes the folder: found by review, it refused it)

    assert len(open_images(str(tmp_path / "src" / "c1"))) == 3


def test_running_out_of_memory_decoding_is_said_not_called_corruption(monkeypatch):
    """Found from outside: a MemoryError (a huge --resolution) skipped good files as "corrupt or truncated"."""
    from bigbatch.data import sources

    def short_of_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(sources, "decode", short_of_memory)
    with pytest.raises(bigbatch.BigbatchError, match="out of memory decoding an image"):
        sources.decode_or_reason(b"\x89PNG", 16, None)


def test_a_file_of_rectangles_is_refused_where_squares_are_read_naming_its_shape(tmp_path, capsys):
    """Found from outside: a GAN said the file held "images of 0 px", and the Loader read it as neither squares
    nor refused."""
    (tmp_path / "rect").mkdir()
    for i in range(4):
        Image.fromarray(_image(i, (40, 30))).save(tmp_path / "rect" / f"{i}.png")  # 40 wide, 30 high
    prepare(str(tmp_path / "rect"), str(tmp_path / "rect.h5"), workers=0)
    with pytest.raises(bigbatch.BigbatchError, match="holds 40x30 images, not squares, which augment='center' reads"):
        bigbatch.data.Loader(str(tmp_path / "rect.h5"), batch=2, resolution=16)
    argv = ["train", "--preset", "digits", f"data.path={tmp_path / 'rect.h5'}", "data.resolution=16", "--dry-run"]
    for run in (argv, argv[:-1] + ["--run-dir", str(tmp_path / "run")]):
        assert main(run) == 2
        assert "holds 40x30 images, not squares" in capsys.readouterr().err
    # The swap task's faces too (found by review: "are 0 px", and its dry run passed them).
    rect = str(tmp_path / "rect.h5")
    argv = ["train", "--preset", "saehd_cpu", f"data.path={rect}", f"data.dst_path={rect}", "--dry-run"]
    assert main(argv) == 2
    assert "the src faces" in (err := capsys.readouterr().err) and "are 40x30 images, not squares" in err


def test_a_labels_file_naming_a_file_by_two_longer_paths_is_refused(tmp_path):
    # Found by review: rows of two longer paths ending in the same file took the first one's label without a word.
    (tmp_path / "val").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "val" / "a.png")
    (tmp_path / "l.csv").write_text("/x/val/a.png,cat\n/y/val/a.png,dog\n")
    with pytest.raises(bigbatch.BigbatchError, match=r"names a.png by two paths \(/x/val/a.png, /y/val/a.png\)"):
        prepare(str(tmp_path / "val"), str(tmp_path / "v.h5"), 8, workers=0, labels=str(tmp_path / "l.csv"))


def test_a_labels_file_of_old_mac_line_ends_is_read(tmp_path):
    # Found from outside: a bare carriage return between rows (old Mac line ends, a file edited across systems) was a
    # traceback from Python's csv module.
    (tmp_path / "val").mkdir()
    for name in ("a", "b"):
        Image.new("RGB", (8, 8)).save(tmp_path / "val" / f"{name}.png")
    (tmp_path / "l.csv").write_bytes(b"file,label\ra.png,cat\rb.png,dog\r")
    report = prepare(str(tmp_path / "val"), str(tmp_path / "v.h5"), 8, workers=0, labels=str(tmp_path / "l.csv"))
    assert report.count == 2 and report.class_names == ["cat", "dog"]


def test_a_small_set_is_stored_in_about_its_own_size(tmp_path):
    # Found from outside: HDF5 allocates a chunk whole, and chunks of 16,384 labels and a 256 KiB byte stream made a
    # JPEG store of 26 small images 2.5 times the raw store's size, and 14 times the source folder's.
    _folder(tmp_path / "src", per_class=13, size=(32, 32))
    raw = prepare(str(tmp_path / "src"), str(tmp_path / "raw.h5"), 32, workers=0)
    jpeg = prepare(str(tmp_path / "src"), str(tmp_path / "jpeg.h5"), 32, workers=0, codec="jpeg")
    pixels = 26 * 32 * 32 * 3
    assert raw.count == jpeg.count == 26
    assert (tmp_path / "raw.h5").stat().st_size < pixels + (64 << 10)  # (at most one images chunk and metadata)
    assert (tmp_path / "jpeg.h5").stat().st_size < (tmp_path / "raw.h5").stat().st_size
    assert np.array_equal(
        _all(load_data(str(tmp_path / "raw.h5"), 32))[1], _all(load_data(str(tmp_path / "jpeg.h5"), 32))[1]
    )
    # Whole images (--crop none) are of sizes unknown ahead: their stream keeps its full chunks (found by review: sized
    # as of 0 pixels, 4 KiB chunks, millions of them at ImageNet's count)
    prepare(str(tmp_path / "src"), str(tmp_path / "whole.h5"), 32, workers=0, codec="jpeg", crop="none")
    with h5py.File(tmp_path / "whole.h5") as f:
        assert f["encoded"].chunks == (256 << 10,)


def test_images_smaller_than_the_resolution_are_counted_as_enlarged(tmp_path):
    # Found from outside: a 5x7 image was stored blurred at 32x32, and neither the report nor info said so.
    _folder(tmp_path / "src", per_class=3, size=(20, 24))
    Image.fromarray(_image(9, (5, 7))).save(tmp_path / "src" / "cat" / "tiny.png")
    report = prepare(str(tmp_path / "src"), str(tmp_path / "a.h5"), 5, workers=0)
    assert report.enlarged == 0 and "enlarged" not in report.summary() + describe_data(tmp_path / "a.h5")
    assert prepare(str(tmp_path / "src"), str(tmp_path / "b.h5"), 16, workers=0).enlarged == 1
    report = prepare(str(tmp_path / "src"), str(tmp_path / "c.h5"), 22, workers=0)
    assert report.enlarged == 7  # (the 20-px short sides too)
    assert "enlarged 7 of them: smaller than the resolution, scaled up to it" in report.summary()
    assert "enlarged    7 images smaller than the resolution" in describe_data(tmp_path / "c.h5")


def test_shards_named_by_a_text_file_of_classes_are_not_taken_for_a_held_out_split(tmp_path, capsys, monkeypatch):
    # Found from outside: prepare's closing hint scored a classifier on ImageNet's training shards named with
    # --classes LOC_synset_mapping.txt ("data.val_path="); a training file's classes (DATA.h5) still mean one.
    from test_prepare_tar import _shards

    monkeypatch.chdir(tmp_path)
    _shards(tmp_path / "wds", n_shards=1) and Path("names.txt").write_text("".join(f"n0{i} c{i}\n" for i in range(6)))
    assert main(["prepare", "wds", "named.h5", "--workers", "0", "--classes", "names.txt"]) == 0
    assert "score a classifier" not in (said := capsys.readouterr().out) and "train a classifier on it with" in said
    assert main(["prepare", "wds", "held.h5", "--workers", "0", "--classes", "named.h5"]) == 0
    assert "score a classifier on it with: data.val_path=held.h5" in capsys.readouterr().out
