"""S3 through s3fs against a local moto server: prepare from and to s3://, and training reads."""

import os
import socket
import zipfile

import numpy as np
import pytest
import torch
from PIL import Image

import bigbatch
from bigbatch.data import BatchLoader, H5Data, describe_data, load_data, prepare, read_meta
from bigbatch.data.streams import GlobalOrder

moto_server = pytest.importorskip("moto.server")
pytest.importorskip("s3fs")

KEY, SECRET = "bigbatch-test-key", "sEcReT-never-logged"


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on a free local port; credentials and endpoint in the environment."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            mp.setenv(name, value)
        import s3fs

        fs = s3fs.S3FileSystem()
        fs.mkdir("bkt")
        yield fs, endpoint
    server.stop()


@pytest.fixture(scope="module")
def photos(s3, tmp_path_factory):
    """The same class folder locally and under s3://bkt/photos, with one corrupt file."""
    fs, _ = s3
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    for c in ("cat", "dog"):
        (root / c).mkdir()
        for i in range(12):
            Image.fromarray(rng.integers(0, 256, (10, 14, 3), dtype=np.uint8)).save(root / c / f"{i:02d}.png")
    (root / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    fs.put(str(root), "bkt/photos", recursive=True)
    return root


def test_prepare_from_s3_matches_the_local_folder(s3, photos, tmp_path):
    remote = prepare("s3://bkt/photos", str(tmp_path / "remote.h5"), resolution=8, workers=2)
    local = prepare(str(photos), str(tmp_path / "local.h5"), resolution=8, workers=0)
    assert remote.count == local.count == 24 and remote.class_names == ["cat", "dog"]
    assert remote.content_hash == local.content_hash
    assert [name for name, _ in remote.skipped] == ["dog/broken.png"]
    assert read_meta(tmp_path / "remote.h5")["source"] == "s3://bkt/photos"


def test_zip_on_s3(s3, photos, tmp_path):
    fs, _ = s3
    with zipfile.ZipFile(tmp_path / "p.zip", "w") as z:
        for p in sorted(photos.rglob("*.png")):
            z.write(p, p.relative_to(photos).as_posix())
    fs.put(str(tmp_path / "p.zip"), "bkt/zips/p.zip")
    report = prepare("s3://bkt/zips/p.zip", str(tmp_path / "z.h5"), resolution=8, workers=0)
    assert report.count == 24 and report.content_hash == prepare(str(photos), str(tmp_path / "l.h5"), 8).content_hash


def test_training_reads_straight_from_s3(s3, photos, tmp_path):
    fs, _ = s3
    url = "s3://bkt/data/photos.h5"
    report = prepare(str(photos), url, resolution=8, workers=0)
    assert fs.exists("bkt/data/photos.h5") and report.out == url
    assert not any(".partial" in p for p in os.listdir(tmp_path))
    prepare(str(photos), str(tmp_path / "local.h5"), resolution=8, workers=0)
    local, remote = H5Data(tmp_path / "local.h5"), load_data(url, 8)
    assert (len(remote), remote.resolution, remote.class_names) == (24, 8, ["cat", "dog"])
    assert remote.content_hash == local.content_hash
    idx = torch.tensor([23, 0, 5, 5, 6, 7, 11])
    for a, b in zip(remote.get(idx), local.get(idx)):
        assert torch.equal(a, b)
    requests = [GlobalOrder(24, seed=2).indices(8 * k, 8) for k in range(5)]
    want = [local.get(r)[0] for r in requests]
    for data, workers in ((remote, 2), (load_data(url, 8, in_ram=True), 0)):
        got = [b.images for b in BatchLoader(data, requests, workers=workers)]
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert "24 uint8 NHWC" in describe_data(url)


def test_explicit_storage_options_and_errors(s3, photos, tmp_path, monkeypatch, capfd):
    _, endpoint = s3
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name)
    options = {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": endpoint}}
    report = prepare("s3://bkt/photos", str(tmp_path / "o.h5"), resolution=8, workers=0, storage_options=options)
    data = H5Data(tmp_path / "o.h5")
    with pytest.raises(bigbatch.BigbatchError, match="does not exist") as e:
        prepare("s3://bkt/nothing-here", str(tmp_path / "n.h5"), storage_options=options)
    with pytest.raises(bigbatch.BigbatchError, match="cannot open data set 's3://bkt/nope.h5'") as e2:
        load_data("s3://bkt/nope.h5", 8, storage_options=options)
    remote = prepare(str(photos), "s3://bkt/o.h5", resolution=8, storage_options=options)
    shown = [report.summary(), remote.summary(), describe_data(tmp_path / "o.h5"), repr(data), str(e.value)]
    shown += [str(e2.value), repr(H5Data("s3://bkt/o.h5", storage_options=options)), str(read_meta(tmp_path / "o.h5"))]
    out, err = capfd.readouterr()
    assert report.count == 24 and SECRET not in "\n".join([*shown, out, err])


def test_training_from_s3_with_the_endpoint_in_the_config(s3, photos, tmp_path, monkeypatch, tiny):
    # Credentials stay in the environment; the endpoint comes from data.storage_options; two workers
    # read byte ranges of the remote file, and the weights equal those trained on a local copy.
    _, endpoint = s3
    prepare(str(photos), "s3://bkt/train/photos.h5", resolution=16, workers=0)
    prepare(str(photos), str(tmp_path / "photos.h5"), resolution=16, workers=0)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    cfg = tiny.override({"train.kimg": 0.064, "train.batch": 16, "data.xflip": True})
    remote = cfg.override(
        {"data.path": "s3://bkt/train/photos.h5", "data.storage_options": {"endpoint_url": endpoint}, "data.workers": 2}
    )
    a = bigbatch.train(remote, run_dir=tmp_path / "remote", quiet=True)
    b = bigbatch.train(cfg.override({"data.path": str(tmp_path / "photos.h5")}), run_dir=tmp_path / "local", quiet=True)
    for net in ("G", "D"):
        ckpt = "checkpoints/000000.064"
        assert (a / ckpt / f"{net}.safetensors").read_bytes() == (b / ckpt / f"{net}.safetensors").read_bytes()
    assert SECRET not in (a / "config.toml").read_text()
