"""data.decode = "gpu": the loader hands over a step's JPEG bytes with the regions and flips the CPU path
would cut, and they are decoded, cut, resized and mirrored on the device. Here the device decoder is
stood in for by OpenCV's (the CPU has no nvJPEG): what is checked is everything around the decoder;
tests/test_cuda.py checks nvJPEG itself where a GPU is lent."""

import threading

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from test_codecs import photos, widen_stored_jpeg

import bigbatch
from bigbatch.cli import main
from bigbatch.config import CheckpointConfig, Config, DataConfig, EvalConfig, ModelConfig, SampleConfig, TrainConfig
from bigbatch.data import H5Data, device_decode, jpeg_region, prepare
from bigbatch.data.loader import Step, read_batch


def opencv(data, device):
    """The stand-in for nvJPEG: each JPEG decoded by OpenCV, RGB CHW uint8 on `device`."""
    import cv2

    return [torch.from_numpy(cv2.imdecode(d.numpy(), cv2.IMREAD_COLOR)[:, :, ::-1].copy()).permute(2, 0, 1).to(device)
            for d in data]  # fmt: skip


@pytest.mark.parametrize("crop", ["none", "center"])
def test_the_device_cuts_the_regions_and_flips_the_cpu_path_cuts(tmp_path, crop, monkeypatch):
    prepare(str(photos(tmp_path / "src")), str(tmp_path / "d.h5"), 96, workers=0, codec="jpeg", crop=crop)
    data = H5Data(tmp_path / "d.h5")
    request = Step(nimg=64, batch=16, resolution=48, offset=8, indices=torch.tensor([3, 1, 4, 1, 5, 9, 2, 6]))
    scale = 0.3  # (stored squares are cut as stored too, before decoding: found from outside, the task cut them after)
    cpu = read_batch(data, request, xflip=True, seed=2, crop_scale=scale)
    encoded = read_batch(data, request, xflip=True, seed=2, crop_scale=scale, on_device=True)
    assert isinstance(encoded.images, device_decode.Encoded) and torch.equal(encoded.labels, cpu.labels)
    assert torch.equal(encoded.flips, cpu.flips) and encoded.flips.any() and not encoded.flips.all()
    images = device_decode.decode(encoded.images, torch.device("cpu"), opencv)
    assert images.shape == cpu.images.shape == (8, 48, 48, 3) and images.dtype == torch.uint8
    diff = (images.float() - cpu.images.float()).abs()
    assert diff.mean() < 2.5 and diff.max() < 64  # another resize filter on the same regions, same flips
    unflipped = device_decode.decode(encoded.images._replace(flips=None), torch.device("cpu"), opencv)
    assert (images.float() - unflipped.flip(2).float()).abs()[encoded.flips].mean() < 1e-6
    # The device gets only each crop's MCUs (fewer bytes than stored), with the same pixels.
    stored = H5Data(tmp_path / "d.h5", in_ram=True)
    monkeypatch.setattr(jpeg_region, "region", lambda *a: None)
    whole = read_batch(stored, request, xflip=True, seed=2, crop_scale=scale, on_device=True)
    fewer = sum(map(len, encoded.images.data)) / sum(map(len, whole.images.data))
    assert fewer < 0.9
    assert torch.equal(images, device_decode.decode(whole.images, torch.device("cpu"), opencv))


def config(path, **overrides) -> Config:
    cfg = Config(
        name="gpu-decode",
        task="classify",
        data=DataConfig(path=str(path), resolution=48, decode="gpu", xflip=True),
        model=ModelConfig(name="resnet_cifar", ch=4, options={"depth": 8}),
        train=TrainConfig(kimg=0.032, batch=8, micro_batch=8, lr=0.1, lr_batch=8, crop_scale=0.35),
        checkpoint=CheckpointConfig(every_kimg=0.032),
        sample=SampleConfig(every_kimg=0.032, n=4),
        eval=EvalConfig(every_kimg=0.0),
    )
    return cfg.override(overrides)


def test_a_run_decoding_on_the_device_is_reproducible_for_any_workers(tmp_path, monkeypatch):
    prepare(str(photos(tmp_path / "src", n=16)), str(tmp_path / "d.h5"), 96, workers=0, codec="jpeg", crop="none")
    decoded, threads = [], set()  # the CPU stands in for the GPU here

    def nvjpeg(data, device):
        decoded.append(len(data))
        threads.add(threading.current_thread().name)
        return opencv(data, device)

    monkeypatch.setattr(device_decode, "nvjpeg", nvjpeg)
    monkeypatch.setattr(device_decode, "check", lambda *args, **kwargs: None)
    weights = []
    for workers in (0, 2):
        run = bigbatch.train(
            config(tmp_path / "d.h5", **{"data.workers": workers}), tmp_path / f"w{workers}", quiet=True
        )
        weights.append(load_file(run / "checkpoints" / "000000.032" / "model.safetensors"))
    # 4 steps of 8 images a run, each decoded on the device, in a thread beside the step (none past the last)
    assert decoded == [8] * 8 and {t.split("_")[0] for t in threads} == {"bigbatch-decode"}
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    # data.decode = "nvimgcodec" (here its libjpeg-turbo, as OpenCV's) decodes the same pixels: the same weights.
    cfg = config(tmp_path / "d.h5", **{"data.workers": 2, "data.decode": "nvimgcodec"})
    run = bigbatch.train(cfg, tmp_path / "nvimgcodec", quiet=True)
    assert decoded == [8] * 8  # (not through the stand-in)
    nvimgcodec = load_file(run / "checkpoints" / "000000.032" / "model.safetensors")
    assert all(torch.equal(weights[0][k], nvimgcodec[k]) for k in weights[0])


def test_nvimgcodec_decodes_the_crops_the_loader_cuts_as_libjpeg_turbo_does(tmp_path):
    # The loader hands the device each crop's MCUs as a JPEG of their own: nvImageCodec reads them.
    prepare(str(photos(tmp_path / "src")), str(tmp_path / "d.h5"), 96, workers=0, codec="jpeg", crop="none")
    request = Step(nimg=0, batch=8, resolution=48, offset=0, indices=torch.arange(8))
    encoded = read_batch(H5Data(tmp_path / "d.h5"), request, xflip=True, seed=1, crop_scale=0.3, on_device=True)
    cpu = torch.device("cpu")
    images = device_decode.decode(encoded.images, cpu, device_decode.decoder_of("nvimgcodec"))
    assert torch.equal(images, device_decode.decode(encoded.images, cpu, opencv))


def test_nvimgcodec_missing_or_without_nvjpeg_is_one_line_naming_the_install(monkeypatch):
    monkeypatch.setattr(device_decode, "_NVIMGCODEC", {"module": None, "said": ""})
    with pytest.raises(bigbatch.BigbatchError, match=r'nvImageCodec: pip install "nvidia-nvimgcodec-cu13\[nvjpeg\]"'):
        device_decode.nvimgcodec_module()
    said = "Failed to load nvjpeg library!\n[ERROR] [nvjpeg-ext] Failed to load nvJPEG library or retrieve version."
    monkeypatch.setattr(device_decode, "_NVIMGCODEC", {"module": object(), "said": said})
    with pytest.raises(bigbatch.BigbatchError, match=r"could not load NVIDIA's nvJPEG library.*pip install"):
        device_decode.nvimgcodec([], torch.device("cuda"))  # (said before any CUDA call)


def test_decoding_on_the_device_needs_a_jpeg_file_and_a_gpu(tmp_path, capsys):
    prepare(str(photos(tmp_path / "src", n=4)), str(tmp_path / "j.h5"), 64, workers=0, codec="jpeg", crop="none")
    prepare(str(photos(tmp_path / "src", n=4)), str(tmp_path / "r.h5"), 64, workers=0)
    base = ["train", "--preset", "fashion_resnet", "data.val_path=", "eval.every_kimg=0", "data.decode=gpu"]
    base += ["train.device=cpu"]
    for path, words in (("j.h5", "decodes on a CUDA device and this run trains on cpu"), ("r.h5", "is raw with 3")):
        assert main([*base, f"data.path={tmp_path / path}", "--run-dir", str(tmp_path / "run")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
        assert not (tmp_path / "run").exists()
    assert main(["train", "data.decode=nvjpeg", "--dry-run"]) == 2
    assert "'data.decode' must be 'cpu' | 'gpu' | 'nvimgcodec'" in capsys.readouterr().err


def test_the_standalone_loader_decodes_on_the_device_what_it_reads_on_the_cpu(tmp_path, monkeypatch):
    from bigbatch.data import Loader

    prepare(str(photos(tmp_path / "src", n=16)), str(tmp_path / "d.h5"), 96, workers=0, codec="jpeg", crop="none")
    monkeypatch.setattr(device_decode, "nvjpeg", opencv)
    monkeypatch.setattr(device_decode, "check", lambda *args, **kwargs: None)
    args = dict(batch=8, resolution=48, augment="rrc", xflip=True, seed=3)
    cpu = list(Loader(str(tmp_path / "d.h5"), **args))
    gpu = list(Loader(str(tmp_path / "d.h5"), **args, workers=2, decode="gpu", device="cpu"))
    assert len(cpu) == len(gpu) == 2
    for (a, y), (b, z) in zip(cpu, gpu):
        assert torch.equal(y, z) and a.shape == b.shape and (a.float() - b.float()).abs().mean() < 2.5


def test_the_loader_decodes_on_the_gpu_its_rank_works_on(monkeypatch):
    """Found by review: "cuda" reached the decode thread as it was, and a new thread's GPU is the first, so
    every rank of a torchrun decoded onto cuda:0."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)  # (torch.cuda.set_device(3) on rank 3)
    assert device_decode.indexed(torch.device("cuda")) == torch.device("cuda", 3)
    assert device_decode.indexed(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert device_decode.indexed(torch.device("cpu")) == torch.device("cpu")


def test_batches_copied_ahead_come_in_order_and_none_past_the_last_step():
    # The Feed's CopyAhead (CPU-decoded batches on a GPU): the next batch is taken from the loader as one is
    # handed over, only while a later step takes one; on a CPU it hands the loader's batches over as they are.
    from bigbatch.data import Batch

    read = []

    def loader():
        for i in range(10):
            read.append(i)
            yield Batch(i, torch.full((2, 4, 4, 3), i, dtype=torch.uint8), torch.tensor([i, i]), None)

    steps, taken = 3, 0
    ahead = device_decode.CopyAhead(loader(), torch.device("cpu"), lambda: taken < steps)
    for i in range(steps):
        taken += 1
        batch = next(ahead)
        assert batch.nimg == i and int(batch.images[0, 0, 0, 0]) == i and batch.labels.tolist() == [i, i]
        assert read == list(range(i + 1 + (taken < steps)))  # the next one read ahead, but after the last
    ahead.close()


def test_regions_of_any_sizes_are_resized_as_torch_resizes_each_in_kernels_that_do_not_grow_with_the_batch(
    monkeypatch,
):
    # Each region resized as F.interpolate (bilinear, antialiased) resizes it alone, up or down, mirrored where
    # drawn, from images of any size, 3 channels or 4, CHW or HWC in memory (nvImageCodec's); within a level of
    # rounding. The device work is a fixed number of ops (each a kernel launch on a GPU) whatever the batch: it
    # was two an image, launched from the decode thread beside the step's own.
    import torch.nn.functional as F
    from op_count import Ops

    from bigbatch.data import device_resize

    rng = np.random.default_rng(0)
    g = torch.Generator().manual_seed(0)

    def batch(n):
        images, regions = [], []
        for i in range(n):
            h, w = int(rng.integers(20, 90)), int(rng.integers(20, 90))
            image = torch.randint(0, 256, (3 + (i % 5 == 0), h, w), dtype=torch.uint8, generator=g)
            images.append(image.permute(1, 2, 0).contiguous().permute(2, 0, 1) if i % 3 == 0 else image)
            y0, x0 = int(rng.integers(0, h - 1)), int(rng.integers(0, w - 1))
            regions.append((y0, int(rng.integers(y0 + 1, h + 1)), x0, int(rng.integers(x0 + 1, w + 1))))
        return images, np.array(regions), torch.from_numpy(rng.random(n) < 0.5)

    out = (24, 32)
    images, regions, flips = batch(40)
    want = torch.cat([
        F.interpolate(image[None, :3, y0:y1, x0:x1].float(), size=out, mode="bilinear", antialias=True)
        for image, (y0, y1, x0, x1) in zip(images, regions)
    ]).round_().clamp_(0, 255).to(torch.uint8)  # fmt: skip
    want = torch.where(flips[:, None, None, None], want.flip(3), want).permute(0, 2, 3, 1)
    for group in (device_resize.GROUP, 5000):  # (one group; several, the largest regions first)
        monkeypatch.setattr(device_resize, "GROUP", group)
        got = device_resize.resized(images, regions, out, flips, torch.device("cpu"))
        assert got.shape == (40, 24, 32, 3) and got.dtype == torch.uint8 and got.is_contiguous()
        assert (got.int() - want.int()).abs().max() <= 1
        assert (got != want).float().mean() < 0.01
    monkeypatch.undo()
    assert device_resize.resized([], np.zeros((0, 4), np.int64), out, None, torch.device("cpu")).shape == (0, 24, 32, 3)
    gray = torch.zeros(1, 30, 30, dtype=torch.uint8)  # (its channels 1 and 2 would be the next image's pixels)
    with pytest.raises(bigbatch.BigbatchError, match="fewer than 3 channels"):
        device_resize.resized([gray, images[1]], regions[:2], out, None, torch.device("cpu"))
    counts = []
    for n in (8, 64):
        images, regions, flips = batch(n)
        with Ops() as ops:
            device_resize.resized(images, regions, out, flips, torch.device("cpu"))
        counts.append(ops.count)
    assert counts[0] == counts[1] < 100, counts


def test_an_image_that_does_not_decode_as_stored_is_refused_on_the_device_too(tmp_path):
    # Found by review: the CPU's decode refused a JPEG whose bytes decode to another size than stored (found from
    # outside: libjpeg's warning alone, and it was trained on); the device's took it for one the decoder scaled.
    prepare(str(photos(tmp_path / "src", n=4)), str(tmp_path / "d.h5"), 64, workers=0, codec="jpeg")
    widen_stored_jpeg(tmp_path / "d.h5", 1, 72)  # (64 px wide)
    request = Step(nimg=0, batch=2, resolution=32, offset=0, indices=torch.tensor([0, 1]))
    encoded = read_batch(H5Data(tmp_path / "d.h5"), request, on_device=True)
    with pytest.raises(bigbatch.BigbatchError, match=r"does not decode as stored \(it decodes to 72x64, not the"):
        device_decode.decode(encoded.images, torch.device("cpu"), opencv)
