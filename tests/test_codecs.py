"""Encoded storage (`prepare --codec jpeg|png|webp`): the bytes each image takes, what comes back, the
reduced-size JPEG decode of small phases, and every guarantee of raw files (content hash, verify,
workers, S3, resume) holding for encoded ones."""

import io
import os
import socket

import numpy as np
import pytest
import torch
from PIL import Image

import bigbatch
from bigbatch.cli import main
from bigbatch.data import BatchLoader, H5Data, describe_data, jpeg_region, load_data, prepare, verify_data
from bigbatch.data.loader import Step, read_batch
from bigbatch.data.schedule import resize_batch
from bigbatch.data.streams import GlobalOrder


def photos(root, n=12, size=(150, 110), seed=0):
    """Smooth photo-like JPEGs (gradients, a disc and noise) in two class folders."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        w, h = size[0] + int(rng.integers(0, 40)), size[1] + int(rng.integers(0, 40))
        y, x = np.mgrid[0:h, 0:w]
        disc = ((x - w * rng.random()) ** 2 + (y - h * rng.random()) ** 2 < (h / 4) ** 2) * 90.0
        img = np.stack([x * 255 / w, y * 255 / h, disc + 60], -1) + rng.normal(0, 6, (h, w, 3))
        folder = root / ("cat" if i % 2 else "dog")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(folder / f"{i:02d}.jpg", quality=95)
    return root


def test_each_codec_stores_what_comes_back(tmp_path):
    src = photos(tmp_path / "src")
    reports = {c: prepare(str(src), str(tmp_path / f"{c}.h5"), 96, workers=0, codec=c) for c in ("raw", "png", "jpeg")}
    reports["webp"] = prepare(str(src), str(tmp_path / "webp.h5"), 96, workers=2, codec="webp", quality=80)
    raw = H5Data(tmp_path / "raw.h5").get(torch.arange(12))[0]
    for codec, report in reports.items():
        data = load_data(str(tmp_path / f"{codec}.h5"), 96)
        images, labels = data.get(torch.arange(12))
        assert images.shape == raw.shape and labels.tolist() == [0] * 6 + [1] * 6 and data.resolution == 96
        diff = (images.float() - raw.float()).abs().mean().item()
        assert diff == 0 if codec in ("raw", "png") else 0 < diff < 4, (codec, diff)  # png is lossless
        if codec != "raw":  # another codec, other bytes: never the raw file's content hash
            assert report.content_hash != reports["raw"].content_hash
            assert verify_data(tmp_path / f"{codec}.h5") == report.content_hash
    meta = bigbatch.data.read_meta(tmp_path / "jpeg.h5")
    assert (meta["codec"], meta["quality"]) == ("jpeg", 90)
    assert meta["encoded_bytes"] * 4 < 96 * 96 * 3 * 12  # smooth photos: a fraction of the raw pixels
    assert "12 jpeg q90 (" in describe_data(tmp_path / "jpeg.h5")
    # Workers encode as the main process does: the same bytes.
    again = prepare(str(src), str(tmp_path / "jpeg2.h5"), 96, workers=2, codec="jpeg")
    assert again.content_hash == reports["jpeg"].content_hash


def test_codec_mistakes_are_one_line(tmp_path, capsys):
    src = photos(tmp_path / "src", n=2)
    for argv, words in (
        (["--codec", "png", "--quality", "80"], "--quality is for jpeg and webp"),
        (["--codec", "jpeg", "--quality", "0"], "--quality must be 1..100, got 0"),
        (["--codec", "jpeg", "--masks", "alpha"], "need --codec raw"),
        (["--codec", "gif"], "invalid choice: 'gif'"),
        (["--codec", "jpeg", "--crop", "none", "--resolution", "0"], "--resolution must be a positive"),
    ):
        assert main(["prepare", str(src), str(tmp_path / "x.h5"), "--resolution", "32", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("bigbatch: error: ") and err.count("\n") == 1 and words in err, err
    assert not (tmp_path / "x.h5").exists()
    for argv, words in (
        ([str(src), "x.h5", "--codec", "jpeg", "--crop", "none"], "--crop none needs --resolution"),
        (["builtin:digits", "x.h5", "--codec", "jpeg", "--crop", "none", "--resolution", "8"], "take image folders"),
        (["builtin:digits", "x.h5", "--labels", "l.csv"], "take image folders"),
    ):
        assert main(["prepare", *argv]) == 2
        assert words in capsys.readouterr().err


def test_small_phases_decode_a_jpeg_store_at_reduced_size(tmp_path):
    src = photos(tmp_path / "src")
    prepare(str(src), str(tmp_path / "j.h5"), 128, workers=0, codec="jpeg", quality=95)
    data = H5Data(tmp_path / "j.h5")
    idx = torch.arange(8)
    assert data.get(idx)[0].shape == (8, 128, 128, 3)
    assert data.get(idx, 64)[0].shape == (8, 64, 64, 3)  # libjpeg's 1/2 scale, no resize needed
    assert data.get(idx, 40)[0].shape == (8, 64, 64, 3)  # the smallest scale at least as large
    assert data.get(idx, 100)[0].shape == (8, 128, 128, 3)  # more than half: a full decode
    # What a 32-px phase trains on: the reduced decode, resized; close to a full decode resized.
    step = Step(0, 8, 32, 0, idx)
    reduced = read_batch(data, step).images
    full = resize_batch(data.get(idx)[0], 32)
    assert reduced.shape == full.shape == (8, 32, 32, 3)
    assert (reduced.float() - full.float()).abs().mean() < 3


def widen_stored_jpeg(path, index: int, width: int) -> None:
    """Image `index` of the encoded data file `path` made to say `width` in its JPEG frame header (its bytes otherwise
    as stored): it decodes to that width, with libjpeg's warning, where prepare stored another."""
    import h5py

    with h5py.File(path, "r+") as f:
        start, end = (int(v) for v in f["offsets"][index : index + 2])
        image = f["encoded"][start:end]
        sof = bytes(image).index(b"\xff\xc0")  # (the frame header: marker, length, precision, height, width)
        image[sof + 7 : sof + 9] = np.frombuffer(width.to_bytes(2, "big"), np.uint8)
        f["encoded"][start:end] = image


def test_a_damaged_encoded_image_is_named(tmp_path):
    src = photos(tmp_path / "src", n=4)
    prepare(str(src), str(tmp_path / "j.h5"), 64, workers=0, codec="jpeg")
    import h5py

    with h5py.File(tmp_path / "j.h5", "r+") as f:  # overwrite image 2's bytes (past its header) with junk
        start, end = (int(v) for v in f["offsets"][2:4])
        f["encoded"][start + 2 : end] = np.full(end - start - 2, 7, np.uint8)
    with pytest.raises(bigbatch.BigbatchError, match="is damaged: its content hash"):
        verify_data(tmp_path / "j.h5")
    data = H5Data(tmp_path / "j.h5")
    assert data.get(torch.tensor([0, 1, 3]))[0].shape == (3, 64, 64, 3)
    with pytest.raises(bigbatch.BigbatchError, match=r"j.h5: image 2 does not decode .* prepare it again"):
        data.get(torch.tensor([1, 2]))
    # Bytes libjpeg decodes, with a warning of its own, to another size than stored (found from outside: trained on)
    widen_stored_jpeg(tmp_path / "j.h5", 1, 72)
    for read in (
        lambda: data.get(torch.tensor([1])),
        lambda: data.get_regions(torch.tensor([1]), [(8, 8, 40, 40)], 32),
    ):
        with pytest.raises(bigbatch.BigbatchError, match=r"image 1 does not decode \(ValueError: it decodes to 72x64,"):
            read()
    # The stored sizes (where whole images are cut) are content too; offsets out of order are damage.
    prepare(str(src), str(tmp_path / "w.h5"), 64, workers=0, codec="jpeg", crop="none")
    with h5py.File(tmp_path / "w.h5", "r+") as f:
        f["sizes"][0] = f["sizes"][0] + 1
    with pytest.raises(bigbatch.BigbatchError, match="is damaged: its content hash"):
        verify_data(tmp_path / "w.h5")
    with h5py.File(tmp_path / "w.h5", "r+") as f:
        f["offsets"][1], f["offsets"][2] = int(f["offsets"][2]), int(f["offsets"][1])
    for read in (verify_data, H5Data):
        with pytest.raises(bigbatch.BigbatchError, match="is damaged: group / has image offsets out of order"):
            read(tmp_path / "w.h5")


def test_encoded_batches_are_the_same_for_any_workers_and_in_ram(tmp_path):
    src = photos(tmp_path / "src", n=20)
    prepare(str(src), str(tmp_path / "j.h5"), 48, workers=0, codec="jpeg")
    data = H5Data(tmp_path / "j.h5")
    order = GlobalOrder(len(data), seed=3)
    steps = [Step(8 * k, 8, 24, 0, order.indices(8 * k, 8)) for k in range(4)]
    want = [read_batch(data, s, xflip=True, seed=1).images for s in steps]
    for d, workers in ((data, 2), (H5Data(tmp_path / "j.h5", in_ram=True), 0)):
        got = [b.images for b in BatchLoader(d, steps, workers=workers, xflip=True, seed=1)]
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    # Two ranks' shares of a step are the one-process step.
    halves = [read_batch(data, Step(0, 8, 24, 4 * r, order.indices(4 * r, 4)), xflip=True, seed=1) for r in (0, 1)]
    assert torch.equal(torch.cat([h.images for h in halves]), want[0])


def test_a_gan_resumes_bit_exact_on_an_encoded_file(tiny, tmp_path):
    prepare("builtin:digits", str(tmp_path / "d.h5"), 16, codec="png")  # encoded in this process
    cfg = tiny.override({"data.path": str(tmp_path / "d.h5")})
    whole = bigbatch.train(cfg, run_dir=tmp_path / "whole", quiet=True)
    half = bigbatch.train(cfg.override({"train.kimg": 0.256}), run_dir=tmp_path / "half", quiet=True)
    resumed = bigbatch.train(cfg, run_dir=half, resume=True, quiet=True)
    for name in ("G", "D", "G_ema"):
        a, b = (r / "checkpoints" / "000000.512" / f"{name}.safetensors" for r in (whole, resumed))
        assert a.read_bytes() == b.read_bytes(), name


@pytest.fixture
def s3(monkeypatch):
    from moto import server as moto_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    fs.mkdir("codecs")  # (moto's store is one per process: a bucket of this test's own)
    yield fs
    fs.rm("codecs", recursive=True)
    server.stop()
    s3fs.S3FileSystem.clear_instance_cache()  # a cached client would point later tests at this stopped server


def test_an_encoded_file_reads_straight_from_s3(s3, tmp_path):
    src = photos(tmp_path / "src", n=16)
    local = prepare(str(src), str(tmp_path / "j.h5"), 64, workers=0, codec="jpeg")
    remote = prepare(str(src), "s3://codecs/j.h5", 64, workers=0, codec="jpeg")
    assert remote.content_hash == local.content_hash
    idx = torch.tensor([15, 0, 3, 3, 4, 9])
    a, b = H5Data(tmp_path / "j.h5").get(idx, 32), load_data("s3://codecs/j.h5", 64).get(idx, 32)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert verify_data("s3://codecs/j.h5") == local.content_hash
    assert not any(".partial" in p for p in os.listdir(tmp_path))


# ---- whole images (`prepare --crop none`): crops cut from the whole image as it is read -----------
def test_whole_images_keep_their_aspect_ratio_and_read_as_center_squares(tmp_path, monkeypatch):
    src = photos(tmp_path / "src", n=6, size=(150, 110))
    Image.fromarray(np.full((40, 60, 3), 90, np.uint8)).save(src / "cat" / "small.jpg")  # smaller: kept as is
    report = prepare(str(src), str(tmp_path / "w.h5"), 64, workers=0, codec="jpeg", crop="none")
    data = H5Data(tmp_path / "w.h5")
    assert data.whole and data.resolution == 64 and len(data) == report.count == 7
    sizes = [tuple(s) for s in data.groups[0].sizes.tolist()]
    assert (40, 60) in sizes and all(min(h, w) == 64 for h, w in sizes if (h, w) != (40, 60))
    originals = sorted(p for p in src.rglob("*.jpg"))
    for (h, w), f in zip(sizes, originals):  # the aspect ratio of the source, to a pixel
        with Image.open(f) as img:
            assert abs(w / h - img.width / img.height) < 0.03, f
    assert data.get(torch.arange(7))[0].shape == (7, 64, 64, 3)  # center squares at the stored side
    assert data.get(torch.arange(7), 32)[0].shape == (7, 32, 32, 3)
    assert verify_data(tmp_path / "w.h5") == report.content_hash
    described = describe_data(tmp_path / "w.h5")
    assert "whole images, short side at most 64" in described and "a crop decodes only its own MCUs" in described
    with monkeypatch.context() as m:  # as files written before the restart markers
        m.setattr(jpeg_region, "RESTART_MCUS", 0)
        prepare(str(src), str(tmp_path / "old.h5"), 64, workers=0, codec="jpeg", crop="none")
    assert "crops decode whole images (no restart markers: prepare again" in describe_data(tmp_path / "old.h5")
    assert torch.equal(H5Data(tmp_path / "old.h5").get(torch.arange(7))[0], data.get(torch.arange(7))[0])
    for kwargs, words in (
        ({"codec": "raw"}, r"raw storage cannot: add --codec jpeg \(or png, webp\)"),
        ({"buckets": True}, "drop --buckets"),
    ):
        with pytest.raises(bigbatch.BigbatchError, match=words):
            prepare(str(src), str(tmp_path / "x.h5"), 64, workers=0, crop="none", **{"codec": "jpeg", **kwargs})


def test_random_resized_crops_follow_torchvisions_ranges():
    from bigbatch.data.crops import rrc_box, rrc_draws

    draws = rrc_draws(seed=0, nimg=0, batch=2000)
    boxes = [rrc_box(400, 300, d, 0.08) for d in draws]
    areas = np.array([w * h / (400 * 300) for _, _, w, h in boxes])
    ratios = np.array([w / h for _, _, w, h in boxes])
    assert all(0 <= x and 0 <= y and x + w <= 400 and y + h <= 300 for x, y, w, h in boxes)
    assert 0.07 < areas.min() and areas.max() <= 1 and 0.38 < areas.mean() < 0.54  # large ones are rejected more
    assert 3 / 4 - 0.02 < ratios.min() and ratios.max() < 4 / 3 + 0.02
    assert rrc_box(1000, 100, draws[0], 0.9) == (433, 0, 133, 100)  # no fit in ten tries: center, ratio 4/3


def test_the_standalone_loader_gives_the_same_bytes_for_any_workers_and_ranks(tmp_path):
    src = photos(tmp_path / "src", n=24)
    prepare(str(src), str(tmp_path / "w.h5"), 80, workers=0, codec="jpeg", crop="none")
    path = str(tmp_path / "w.h5")
    from bigbatch.data.hdf5 import read_meta

    assert read_meta(path)["resize"].startswith("whole images, the short side scaled down")  # as `info` shows it
    one = list(bigbatch.data.Loader(path, batch=8, resolution=48, augment="rrc", xflip=True, seed=3))
    assert len(one) == 3 and one[0][0].shape == (8, 48, 48, 3) and one[0][0].dtype == torch.uint8
    two = list(bigbatch.data.Loader(path, batch=8, resolution=48, augment="rrc", xflip=True, seed=3, workers=2))
    ranks = [list(bigbatch.data.Loader(path, 8, 48, "rrc", seed=3, rank=r, world_size=2, xflip=True)) for r in (0, 1)]
    # A long pass with a worker holds no file open a batch (found from outside: each request's indices, kept for the
    # whole pass, were an open file in shared memory: "Too many open files" past ~1,000 batches).
    fds = [len(os.listdir("/proc/self/fd")) for _ in bigbatch.data.Loader(path, 1, 8, steps=160, workers=1)]
    assert fds[-1] - fds[20] < 20, (fds[20], fds[-1])
    in_ram = bigbatch.data.Loader(path, 8, 48, "rrc", seed=3, xflip=True, in_ram=True)  # (found from outside)
    assert in_ram.data.in_ram and "in_ram=True" in repr(in_ram.data)
    ram = list(in_ram)
    for (x, y), (x2, y2), (x3, y3), (a, la), (b, lb) in zip(one, two, ram, *ranks, strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2) and torch.equal(x, x3) and torch.equal(y, y3)
        assert torch.equal(torch.cat([a, b]), x) and torch.equal(torch.cat([la, lb]), y)
    later = bigbatch.data.Loader(path, 8, 48, "rrc", seed=3, xflip=True, start=16)  # resumes mid-epoch
    first = list(later)
    assert len(first) == 1 and torch.equal(first[0][0], one[2][0])
    # A second pass reads the next epoch, as a DataLoader's does (found from outside: it read the first again), and
    # equals what a Loader started there reads.
    assert len(later) == 3 and later.start == 24
    again = list(later)
    assert len(again) == 3 and not torch.equal(again[0][0], one[0][0])
    there = list(bigbatch.data.Loader(path, 8, 48, "rrc", seed=3, xflip=True, start=24))
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(again, there))
    # `start` counts the batches handed over (found by review: it jumped to the pass's end at its first batch).
    broken = bigbatch.data.Loader(path, 8, 48, "rrc", seed=3, xflip=True)
    for i, _ in enumerate(broken):
        assert broken.start == 8 * (i + 1) and len(broken) == 3  # (the pass's length: it shrank, found by review)
        if i == 1:
            break
    assert broken.start == 16 and len(broken) == 1 and torch.equal(next(iter(broken))[0], one[2][0])
    assert not torch.equal(one[0][0], list(bigbatch.data.Loader(path, 8, 48, "rrc", seed=4))[0][0])
    centre = list(bigbatch.data.Loader(path, 8, 48, "center"))[0][0]
    from pathlib import Path

    assert torch.equal(list(bigbatch.data.Loader(Path(path), 8, 48, "center"))[0][0], centre)  # (a Path crashed)
    with pytest.raises(bigbatch.BigbatchError, match="min_scale is the random-resized crops'"):
        bigbatch.data.Loader(path, 8, 48, "center", min_scale=0.5)  # (taken, and nothing done with it)
    assert centre.shape == (8, 48, 48, 3)
    prepare(str(src), str(tmp_path / "sq.h5"), 48, workers=0)
    squares = list(bigbatch.data.Loader(str(tmp_path / "sq.h5"), 8, 32, augment="rrc", seed=4))  # cut as stored
    assert squares[0][0].shape == (8, 32, 32, 3) and not torch.equal(
        squares[0][0], list(bigbatch.data.Loader(str(tmp_path / "sq.h5"), 8, 32, "center", seed=4))[0][0]
    )
    with pytest.raises(bigbatch.BigbatchError, match="start must be a whole number, 0 or more, got -8"):
        bigbatch.data.Loader(path, 8, 48, start=-8)
    # Found from outside: a ZeroDivisionError, a rank called a batch problem, a string taken as True, ...
    bad = [
        ({"world_size": 0}, "world_size must be a whole number, 1 or more, got 0"),
        ({"rank": 2, "world_size": 2}, r"rank 2 is out of range for world_size 2 \(ranks 0..1\)"),
        ({"xflip": "false"}, "xflip must be True or False, got 'false'"),
        ({"batch": True}, "batch must be a whole number"),
        ({"resolution": 64.5}, "resolution must be a whole number, 1 or more, got 64.5"),  # ("the file is damaged")
        ({"resolution": None}, "resolution must be a whole number"),
        ({"seed": -1}, "seed must be a whole number, 0 or more, got -1"),  # (masked to 64 bits: another seed's data)
        ({"seed": 2**64}, "seed must be a whole number of 64 bits, below 2[*][*]64, got 18446744073709551616"),
        ({"start": 12}, "start 12 is not a multiple of batch 8: it counts the images of the batches read before"),
    ]
    for kwargs, message in bad:
        with pytest.raises(bigbatch.BigbatchError, match=message):
            bigbatch.data.Loader(**{"path": path, "batch": 8, "resolution": 48, **kwargs})
    with pytest.raises(bigbatch.BigbatchError, match="path must name a data file"):
        bigbatch.data.Loader(123, 8, 48)
    if not torch.cuda.is_available():
        with pytest.raises(bigbatch.BigbatchError, match='^decode = "gpu" decodes on a CUDA device and none is avail'):
            bigbatch.data.Loader(path, 8, 48, decode="gpu")  # (its argument's name, not the config key's)
    with pytest.raises(bigbatch.BigbatchError, match="batch 32 is more than the 24 images of .*: no whole batch"):
        bigbatch.data.Loader(path, 32, 48)  # not an empty loop
    across = list(bigbatch.data.Loader(path, 32, 48, steps=2))  # with steps, the stream goes on across epochs
    assert len(across) == 2 and across[1][0].shape == (32, 48, 48, 3)


def test_a_classifier_crops_whole_images_in_the_loader_and_resumes_bit_exact(tmp_path):
    from bigbatch.config import CheckpointConfig, Config, DataConfig, EvalConfig, ModelConfig, SampleConfig, TrainConfig

    src = photos(tmp_path / "src", n=40)
    prepare(str(src), str(tmp_path / "w.h5"), 48, workers=0, codec="jpeg", crop="none")
    cfg = Config(
        name="w",
        task="classify",
        data=DataConfig(path=str(tmp_path / "w.h5"), resolution=32, val_fraction=0.2, xflip=True),
        model=ModelConfig(name="resnet_cifar", ch=8, options={"depth": 8}),
        train=TrainConfig(kimg=0.128, batch=16, micro_batch=8, lr=0.1, lr_batch=16, crop_scale=0.25),
        checkpoint=CheckpointConfig(every_kimg=0.064),
        sample=SampleConfig(every_kimg=0.128, n=4),
        eval=EvalConfig(every_kimg=0.064, batch_size=16),
    )
    whole = bigbatch.train(cfg, run_dir=tmp_path / "whole", quiet=True)
    half = bigbatch.train(cfg.override({"train.kimg": 0.064}), run_dir=tmp_path / "half", quiet=True)
    resumed = bigbatch.train(cfg, run_dir=half, resume=True, quiet=True)
    a, b = (r / "checkpoints" / "000000.128" / "model.safetensors" for r in (whole, resumed))
    assert a.read_bytes() == b.read_bytes()
    from bigbatch.batching import replicator_for
    from bigbatch.data.load import training_data
    from bigbatch.tasks import build_task

    task = build_task(cfg, replicator_for(cfg), training_data(cfg))
    assert task.loader_crop_scale == 0.25  # the loader cuts the crops; the task does not crop again


def test_random_resized_crops_of_stored_squares_are_cut_at_the_stored_size(tmp_path):
    # Found from outside: squares were shrunk to the phase's size first and the crops enlarged from that (an 8%
    # crop of a 352 px image at 128 px: a third of its detail lost). torchvision's RandomResizedCrop cuts the image
    # it is given, then resizes.
    from bigbatch.data.codecs import resize, resized
    from bigbatch.data.crops import rrc_box, rrc_draws

    stripes = np.zeros((64, 64, 3), np.uint8)
    stripes[:, np.arange(64) % 8 < 4] = 255  # period 8 stored: 2 px at 16 px, gone when shrunk 4x first
    for i in range(8):  # (two classes, for a classifier below)
        (tmp_path / "src" / "ab"[i % 2]).mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.roll(stripes, i, axis=1)).save(tmp_path / "src" / "ab"[i % 2] / f"{i}.png")
    prepare(str(tmp_path / "src"), str(tmp_path / "s.h5"), 64, workers=0)
    data = H5Data(tmp_path / "s.h5")
    request = Step(nimg=32, batch=16, resolution=16, offset=8, indices=torch.arange(8))
    batch = read_batch(data, request, xflip=True, seed=3, crop_scale=0.08)
    stored = data.get(torch.arange(8))[0].numpy()
    for k, (image, d) in enumerate(zip(stored, rrc_draws(3, 32, 16)[8:])):
        left, top, w, h = rrc_box(64, 64, d, 0.08)
        want = resize(image[top : top + h, left : left + w], (16, 16)) if w > 16 else None
        if want is not None:  # (the mirrored ones mirrored after the cut)
            got = batch.images[k].numpy()
            assert np.array_equal(got[:, ::-1] if batch.flips[k] else got, want), k
    # The stripes' contrast across each row, which shrinking first lost (the crops cut from the shrunk squares
    # and enlarged, as before).
    shrunk = resize_batch(data.get(torch.arange(8))[0], 16).numpy()
    boxes = [rrc_box(16, 16, d, 0.08) for d in rrc_draws(3, 32, 16)[8:]]
    before = torch.from_numpy(
        np.stack([resized(x[t : t + h, x0 : x0 + w], (16, 16)) for x, (x0, t, w, h) in zip(shrunk, boxes)])
    )
    assert batch.images.float().std(dim=2).mean() > 2 * before.float().std(dim=2).mean()  # (96.6 and 40.6)
    # A store of one rectangular shape keeps it, as its resize and the batch plan do (found by review: squared).
    from bigbatch.data.loader import square_crops
    from bigbatch.data.schedule import target_shape

    wide = torch.zeros(2, 20, 40, 3, dtype=torch.uint8)
    assert square_crops(wide, rrc_draws(0, 0, 2), 0.5, 16).shape == (2, *target_shape(20, 40, 16), 3) != (2, 16, 16, 3)
    # A classifier on the squares asks the loader for its crops, which no one else cuts (on the GPU's decode too:
    # tests/test_device_decode.py).
    from bigbatch.batching import replicator_for
    from bigbatch.tasks import build_task

    cfg = bigbatch.preset("fashion_resnet").override(
        {
            "data.path": str(tmp_path / "s.h5"),
            "data.val_path": "",
            "data.resolution": 64,
            "train.crop_scale": 0.08,
            "eval.every_kimg": 0,
        }
    )
    assert build_task(cfg, replicator_for(cfg), data).loader_crop_scale == 0.08


def test_rectangular_validation_crops_each_whole_image_at_its_own_aspect_ratio(tmp_path):
    from torch import nn

    from bigbatch.data.codecs import decode
    from bigbatch.tasks.classify.validation import Validation, val_transform

    src = photos(tmp_path / "src", n=10, size=(150, 110))
    for i, (w, h) in enumerate([(90, 200), (300, 120)]):  # one portrait, one very wide
        Image.fromarray(np.full((h, w, 3), 40 * i + 60, np.uint8)).save(src / "cat" / f"z{i}.jpg")
    prepare(str(src), str(tmp_path / "w.h5"), 96, workers=0, codec="jpeg", crop="none")
    data = H5Data(tmp_path / "w.h5")
    model = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, 2))
    seen = []
    model.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape[2:])))

    def scores(rect, rank=0, world_size=1):
        v = Validation(data, lambda: 64, 4, 1.14, rect, "fp32", torch.device("cpu"), rank, world_size)
        return v(model), v

    rect, v = scores(True)
    shapes = set(seen)
    assert any(h > 64 for h, w in shapes) and any(w > 64 for h, w in shapes)  # portrait and landscape
    assert all(min(s) == 64 and max(s) % 8 == 0 for s in shapes)  # the short side 64, the long one to 8
    # Each batch is what val_transform makes of the whole stored image (decoded in full) at its shape.
    index, boxes, shape = v.whole_batches(64)[0]
    cut = data.get_regions(index, boxes, shape)[0].permute(0, 3, 1, 2).float() / 127.5 - 1
    ram = H5Data(tmp_path / "w.h5", in_ram=True).groups[0]
    for k, i in enumerate(index.tolist()):
        stored = data.stored_sizes(torch.tensor([i]))[0].tolist()
        full = decode(bytes(ram.array[ram.offsets[i] : ram.offsets[i + 1]]), stored)
        want = val_transform(torch.from_numpy(full.copy())[None], 64, 1.14, True)[0]
        # (whole pixels of the resized image from its corner, as torchvision's CenterCrop: found from outside, the
        # exact centre, half an output pixel off where the margin was odd, 0.016 apart)
        assert want.shape == cut[k].shape and (want - cut[k]).abs().mean() < 0.005
    # Squares without `rect`; the same scores whatever the number of ranks.
    seen.clear()
    square, _ = scores(False)
    assert set(seen) == {(64, 64)}
    halves = [scores(True, r, 2)[1] for r in (0, 1)]
    assert sum(len(h.whole_batches(64)) for h in halves) == len(v.whole_batches(64))


def test_a_crop_decodes_only_its_mcus_and_gets_the_full_decodes_pixels(monkeypatch):
    from bigbatch.data import codecs, jpeg_region

    rng = np.random.default_rng(3)
    whole = {}  # decode_box with every JPEG decoded whole: what it did before the restart markers
    cases = []
    for h, w in ((256, 341), (191, 257), (300, 17), (16, 16), (9, 40), (128, 128)):
        y, x = np.mgrid[0:h, 0:w]
        img = np.stack([x * 255 / w, y * 255 / h, 128 + 100 * np.sin(x / 5) * np.cos(y / 7)], -1)
        img = (img + rng.normal(0, 20, (h, w, 3))).clip(0, 255).astype(np.uint8)  # colour edges everywhere
        data = codecs.encode(img, "jpeg", 90).data
        for out in (8, 16, 32, 128):
            for _ in range(12):
                bw, bh = int(rng.integers(1, w + 1)), int(rng.integers(1, h + 1))
                left, top = int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1))
                if rng.random() < 0.5:  # crop edges on and next to MCU boundaries
                    left = min(w - bw, max(0, 16 * int(rng.integers(0, w // 16 + 1)) + int(rng.integers(-3, 4))))
                cases.append((data, (h, w), (left, top, bw, bh), out))
    # The markers cost no pixels: the image encoded without them decodes the same.
    assert jpeg_region.layout(data).interval == 1
    without = io.BytesIO()
    Image.fromarray(img).save(without, format="JPEG", quality=90, subsampling="4:2:0")
    assert jpeg_region.layout(without.getvalue()).interval == 0
    assert np.array_equal(codecs.decode(data, (h, w)), codecs.decode(without.getvalue(), (h, w)))
    with monkeypatch.context() as m:
        m.setattr(jpeg_region, "region", lambda *a: None)
        for data, size, box, out in cases:
            whole[id(box)] = codecs.decode_box(data, size, box, out)
    cut = 0
    for data, size, box, out in cases:
        got = codecs.decode_box(data, size, box, out)
        assert np.array_equal(got, whole[id(box)]), (size, box, out)
        cut += jpeg_region.region(data, (box[0], box[1], box[0] + box[2], box[1] + box[3])) is not None
    assert cut > len(cases) // 2  # most crops decode a part of their image
    # A file without restart markers (written before), or progressive, is decoded whole.
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(buffer, format="JPEG", progressive=True)
    assert jpeg_region.layout(buffer.getvalue()) is None
    assert codecs.decode_box(buffer.getvalue(), (64, 64), (3, 5, 20, 30), 16).shape == (16, 16, 3)


def _offset(profile: np.ndarray, at: np.ndarray, period: float) -> float:
    """How far (in stored pixels) a resized cosine of `period` lies from where it should: `profile` read at the
    stored positions `at` ~ cos(2 pi (at + offset) / period)."""
    fit = np.stack([np.ones_like(at), np.cos(2 * np.pi * at / period), np.sin(2 * np.pi * at / period)], 1)
    _, c, s = np.linalg.lstsq(fit, profile, rcond=None)[0]
    return float(np.arctan2(-s, c) * period / (2 * np.pi))


def test_a_crop_lands_where_its_box_lies_at_every_dct_scale():
    # Found from outside: a center crop decoded at a reduced DCT scale came 1-2 stored pixels off (the box taken as
    # ceil(width / factor) / width of the image, its edges floored). A cosine of 8 output pixels a period, across
    # then down, read back: a crop placed where its box lies (validation, center squares) sits within a hundredth
    # of a decoded pixel; a random crop's, from the decoded pixel nearest its start, within half of one.
    from bigbatch.data import codecs

    worst = {True: 0.0, False: 0.0}
    for h, w in ((375, 500), (333, 611), (257, 259)):
        for out, box in (
            (32, None),
            (48, (w * 0.13 + 0.4, h * 0.21 + 0.7, w * 0.61, h * 0.52)),
            (64, None),
            (100, None),
            (160, (w * 0.21 + 0.3, h * 0.27 + 0.6, w * 0.5, h * 0.5)),  # (enlarged, where the image is small)
        ):
            left, top, bw, bh = box or ((w - min(h, w)) // 2, (h - min(h, w)) // 2, min(h, w), min(h, w))
            factor = codecs._reduction(min(bw, bh) / out, 1, True)  # (the decoded pixel, in stored ones)
            j = (np.arange(3, out - 3) + 0.5) / out  # (away from the edges, where the filter is cut)
            for axis, (start, span, n) in enumerate(((left, bw, w), (top, bh, h))):
                period = 8 * span / out
                wave = 128 + 90 * np.cos(2 * np.pi * (np.arange(n) + 0.5) / period)
                img = np.broadcast_to((wave[None, :] if axis == 0 else wave[:, None])[..., None], (h, w, 3))
                data = codecs.encode(np.ascontiguousarray(img.round().astype(np.uint8)), "jpeg", 95).data
                for placed in (True, False):
                    got = codecs.decode_box(data, (h, w), (left, top, bw, bh), out, placed=placed)[3:-3, 3:-3, 0]
                    profile = got.astype(float).mean(axis=0 if axis == 0 else 1)
                    off = _offset(profile, start + j * span, period) / factor
                    worst[placed] = max(worst[placed], abs(off))
    assert worst[True] < 0.05 and worst[False] <= 0.52, worst


def test_a_crop_is_shrunk_as_pillows_bicubic_resize_shrinks_it():
    # decode_box shrinks with PyTorch's antialiased bicubic, Pillow's filter: a level or so from Pillow's own
    # resize of the same pixels, where OpenCV's area averaging, Pillow's bilinear or a plain bicubic are 1.5-8.
    from bigbatch.data import codecs

    rng = np.random.default_rng(5)
    h, w = 200, 260
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 255 / w, 128 + 100 * np.sin(x / 3) * np.cos(y / 4), (x // 20 + y // 20) % 2 * 200.0], -1)
    data = codecs.encode((img + rng.normal(0, 20, (h, w, 3))).clip(0, 255).astype(np.uint8), "jpeg", 90).data
    full = codecs.decode(data, (h, w))
    # (each box less than twice its output on a side: decoded at full size, as `full`; the last one enlarged
    # across, shrunk down)
    for (left, top, bw, bh), (oh, ow) in (
        ((10, 20, 190, 150), (128, 128)),
        ((0, 0, 260, 200), (120, 150)),
        ((37, 5, 101, 190), (64, 64)),
        ((3, 40, 50, 150), (64, 64)),
    ):
        got = codecs.decode_box(data, (h, w), (left, top, bw, bh), (oh, ow)).astype(int)
        crop = Image.fromarray(full[top : top + bh, left : left + bw])
        diff = np.abs(got - np.asarray(crop.resize((ow, oh), Image.Resampling.BICUBIC)))
        assert diff.mean() < 0.5 and diff.max() <= 4, ((left, top, bw, bh), diff.mean(), diff.max())


def test_crops_of_a_jpeg_file_of_squares_decode_only_what_they_need(tmp_path, monkeypatch):
    # A random-resized crop of a stored JPEG square decoded the whole square, then cut it: now only the crop's
    # MCUs, at the smallest DCT scale that keeps it as large as the phase's size, as a file of whole images does.
    import cv2

    from bigbatch.data.crops import rrc_draws
    from bigbatch.data.loader import square_crops

    prepare(str(photos(tmp_path / "src", n=8)), str(tmp_path / "j.h5"), 128, workers=0, codec="jpeg")
    data = H5Data(tmp_path / "j.h5")
    decoded, imdecode = [], cv2.imdecode
    monkeypatch.setattr(cv2, "imdecode", lambda *a: decoded.append(imdecode(*a).shape[:2]) or imdecode(*a))
    request = Step(nimg=16, batch=8, resolution=32, offset=0, indices=torch.arange(8))
    batch = read_batch(data, request, seed=1, crop_scale=0.08)
    assert batch.images.shape == (8, 32, 32, 3) and len(decoded) == 8
    assert sum(h * w for h, w in decoded) < 0.25 * 8 * 128 * 128  # (a whole decode of each: 1)
    whole = square_crops(data.get(torch.arange(8))[0], rrc_draws(1, 16, 8), 0.08, 32)
    assert (batch.images.float() - whole.float()).abs().mean() < 3  # the same crops, decoded smaller
    assert "a crop decodes only its own MCUs" in describe_data(tmp_path / "j.h5")
    none = Step(nimg=16, batch=8, resolution=32, offset=0, indices=torch.arange(0))  # (a share of none: its shape)
    assert read_batch(data, none, seed=1, crop_scale=0.08).images.shape == (0, 32, 32, 3)


def test_a_script_that_leaves_a_loader_unfinished_ends(tmp_path):
    # Found by review: the loader's workers ignore SIGTERM (a job scheduler's, to the whole process group), which
    # multiprocessing sends them at exit before it waits for them: a script that read part of a pass never ended.
    import subprocess
    import sys

    prepare(str(photos(tmp_path / "src", n=16)), str(tmp_path / "d.h5"), 48, workers=0)
    script = f"import bigbatch.data\nb = iter(bigbatch.data.Loader({str(tmp_path / 'd.h5')!r}, 8, 32, workers=2))\n"
    script += "next(b)\nprint('read')\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout == "read\n" and "Traceback" not in out.stderr, out.stderr
