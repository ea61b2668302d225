import gzip
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from test_faults import one_error_line

import bigbatch
from bigbatch.cli import main
from bigbatch.data import load_data
from bigbatch.data.builtin import FASHION_DIR, fashion_mnist, read_idx
from bigbatch.data.prepare import prepare
from bigbatch.data.streams import GlobalOrder


def test_digits_upscaled_uint8_nhwc():
    d = load_data("builtin:digits", 32)
    assert d.images.shape == (1797, 32, 32, 3) and d.images.dtype == torch.uint8
    assert d.n_classes == 10 and sorted(d.labels.unique().tolist()) == list(range(10))
    assert d.images.max() > 200 and d.images.min() == 0
    # Read from scikit-learn's CSV without importing it: the images and labels its load_digits gives.
    from sklearn.datasets import load_digits

    ref = load_digits()
    assert torch.equal(
        load_data("builtin:digits", 8).images[..., 0], torch.from_numpy(ref.images * 255 / 16).round().byte()
    )
    assert torch.equal(d.labels, torch.from_numpy(ref.target).long())


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = b"\0\0\x08" + bytes([array.ndim]) + b"".join(int(s).to_bytes(4, "big") for s in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_fashion_mnist_from_any_idx_folder(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (12, 28, 28))
    labels = np.arange(12) % 10
    _write_idx(tmp_path / "train-images-idx3-ubyte.gz", images)
    _write_idx(tmp_path / "train-labels-idx1-ubyte.gz", labels)
    np.testing.assert_array_equal(read_idx(tmp_path / "train-images-idx3-ubyte.gz"), images)
    d = fashion_mnist(28, str(tmp_path))
    assert d.images.shape == (12, 28, 28, 3)
    np.testing.assert_array_equal(d.images[..., 0].numpy(), images)
    assert d.labels.tolist() == labels.tolist()


def test_a_builtin_set_is_resized_in_parts_and_one_too_large_for_memory_is_one_line(tmp_path, monkeypatch, capsys):
    import torch.nn.functional as F

    from bigbatch.data import builtin

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (12, 28, 28))
    _write_idx(tmp_path / "train-images-idx3-ubyte.gz", images)
    _write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.arange(12) % 10)
    monkeypatch.setattr(builtin, "RESIZE_PART", 5)  # (parts of 5, 5 and 2 images)
    whole = F.interpolate(torch.from_numpy(images.astype(np.float32) / 255)[:, None], size=(40, 40), mode="bicubic",
                          antialias=True)  # fmt: skip
    expected = (whole.clamp(0, 1) * 255).round().to(torch.uint8)[:, 0]
    d = fashion_mnist(40, str(tmp_path))
    assert d.images.shape == (12, 40, 40, 3) and all(torch.equal(d.images[..., c], expected) for c in range(3))
    # Found from outside: Fashion-MNIST at 512 px was an out-of-memory error (63 GB) blamed on the training step.
    with pytest.raises(bigbatch.BigbatchError, match=r"^builtin:digits at 16384 px takes 1347.75 GiB in memory, more"):
        load_data("builtin:digits", 16384)
    assert main(["prepare", "builtin:digits", "d.h5", "--resolution", "16384"]) == 2
    assert "give a smaller data.resolution (its images are 8 px, enlarged to it)" in one_error_line(capsys)


def test_missing_or_corrupt_idx_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("BIGBATCH_FASHION_MNIST", str(tmp_path))
    with pytest.raises(bigbatch.BigbatchError, match="dataset-fashion-mnist"):
        load_data("builtin:fashion-mnist", 32)
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"junk")
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(b"junk")
    with pytest.raises(bigbatch.BigbatchError, match="cannot read IDX"):
        load_data("builtin:fashion-mnist", 32)


@pytest.mark.skipif(not os.path.isdir(FASHION_DIR), reason="Debian's dataset-fashion-mnist is not installed")
def test_debian_fashion_mnist():
    d = load_data("builtin:fashion-mnist", 32)
    assert d.images.shape == (60000, 32, 32, 3) and d.n_classes == 10


def test_unknown_sources():
    with pytest.raises(bigbatch.BigbatchError, match="builtin:digits"):
        load_data("builtin:cifar", 32)
    with pytest.raises(bigbatch.BigbatchError, match="cannot open data set"):
        load_data("nothere.h5", 32)
    # Images not prepared yet: the command that makes a data set of them (found from outside: left to guess).
    with pytest.raises(bigbatch.BigbatchError, match=r"`bigbatch prepare 'shards/train-\{0..2\}.tar' DATA.h5` makes"):
        load_data("shards/train-{0..2}.tar", 32)


def test_global_order_is_a_permutation_per_epoch_and_split_invariant():
    order = GlobalOrder(10, seed=3)
    whole = order.indices(0, 30)
    for e in range(3):
        assert sorted(whole[e * 10 : (e + 1) * 10].tolist()) == list(range(10))
    assert not torch.equal(whole[:10], whole[10:20])
    parts = torch.cat([GlobalOrder(10, seed=3).indices(s, 7) for s in range(0, 28, 7)])
    assert torch.equal(parts, whole[:28])
    assert not torch.equal(GlobalOrder(10, seed=4).indices(0, 10), whole[:10])


def test_an_image_too_large_to_decode_safely_is_said_so_not_corrupt():
    # Found from outside: a 200-megapixel PNG was skipped as "corrupt or truncated (DecompressionBombError...)".
    import struct
    import zlib

    from bigbatch.data.sources import decode_or_reason

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = chunk(b"IHDR", struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0, 0, 0))
    png = b"\x89PNG\r\n\x1a\n" + header + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    assert decode_or_reason(png, None, None).startswith("too large to decode safely (Image size (400000000 pixels)")


def edit_attribute(path, key, value):
    import h5py

    with h5py.File(path, "r+") as f:
        f.attrs[key] = value


def test_data_files_with_damaged_metadata_are_one_line(tiny, tmp_path, capsys):
    good = tmp_path / "good.h5"
    prepare("builtin:digits", str(good), resolution=16, workers=0, limit=300)
    cases = {
        "count": lambda p: edit_attribute(p, "count", 299),
        "groups": lambda p: edit_attribute(p, "groups", '[{"name": "/", "count": 300, "height": 16, "width": 9}]'),
        "class_names": lambda p: edit_attribute(p, "class_names", "not json ["),
        "labels": lambda p: _set_label(p, 0, 10),
        # Bytes overwritten where HDF5 keeps its own records (found from outside: a traceback, or a line naming
        # neither the file nor a fix).
        "objects": lambda p: _zero(p, 96, 30_000),
        "attributes": lambda p: _zero(p, 512, 30_000),
    }
    for name, damage in cases.items():
        bad = tmp_path / f"{name}.h5"
        shutil.copy(good, bad)
        damage(bad)
        capsys.readouterr()
        assert main(["train", f"data.path={bad}", "data.resolution=16", "--run-dir", str(tmp_path / name)]) == 2
        err = one_error_line(capsys)
        assert f"data file {bad} is damaged" in err and "prepare it again" in err, name
        assert not (tmp_path / name).exists()
        if name != "labels":  # the labels' range is checked by training; their hash by --verify
            assert main(["info", str(bad), "--verify"]) == 2
            assert "is damaged" in one_error_line(capsys)


def _zero(path, start, end):
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(bytes(end - start))


def _set_label(path, index, value):
    import h5py

    with h5py.File(path, "r+") as f:
        f["labels"][index] = value
