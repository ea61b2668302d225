"""bench/gpu.py's data parts: JPEG decoding on the device (nvJPEG, nvImageCodec) against the CPU path, and
ResNet-50 fed from a JPEG store as `bigbatch train` feeds it, against the same step on a batch in memory."""

from __future__ import annotations

import argparse
import os
import tempfile
from contextlib import closing
from pathlib import Path
from typing import Any

import torch
from _classify import SameBatch
from _gpu_sizes import SIZES, config, timed
from _peak import opencv_decoder, stand_in_nvjpeg

import bigbatch
from bigbatch.batching import replicator_for


def resnet50_fed(args: argparse.Namespace) -> dict:
    """ResNet-50's classify step (the resnet50 part's) fed as `bigbatch train` feeds it (the Feed) from a
    whole-image JPEG store (bench/storage.py's photos): random-resized crops decoded on the CPU by data.workers =
    the machine's cores, on the GPU (data.decode gpu), and by nvImageCodec where it is installed; each rate
    against the same task's step on a batch held in memory, measured in the same process (issue 43: >= 95%)."""
    from storage import make_photos

    from bigbatch.data import device_decode, prepare
    from bigbatch.data.load import training_data
    from bigbatch.data.schedule import schedule_of
    from bigbatch.tasks import Feed, build_task

    n, side = (512, 256) if args.sizes == "full" else (16, 64)
    steps, cores, device = 4 * SIZES[args.sizes]["steps"], os.cpu_count() or 1, torch.device(args.device)
    modes = {"cpu": cores, "gpu": min(4, cores)}  # data.decode -> data.workers (on the GPU they only read bytes)
    try:
        device_decode.nvimgcodec_ready(device)  # (installed, and with nvJPEG on a GPU)
        modes["nvimgcodec"] = min(4, cores)
        missing = ""
    except bigbatch.BigbatchError as e:
        missing = f"; nvImageCodec not run: {e}"
    with tempfile.TemporaryDirectory() as tmp:
        make_photos(Path(tmp) / "photos", n)
        path = Path(tmp) / "d.h5"
        prepare(str(Path(tmp) / "photos"), str(path), side, workers=cores, codec="jpeg", crop="none")
        base = {"data.path": str(path), "data.val_path": "", "data.val_fraction": 0.0, "data.schedule": []}
        cfg = config(args, "resnet").override({**base, "train.crop_scale": 0.08, "eval.every_kimg": 0})
        batch, data = cfg.train.batch, training_data(cfg)
        rep = replicator_for(cfg)
        task = build_task(cfg, rep, data)

        def rate(feed: Any) -> float:  # (3 untimed: the loader's workers start, the allocator and kernels settle)
            return batch / timed(lambda: task.step(feed), device, [], steps, 3)[0]

        if device.type == "cpu":  # the dry run: nvJPEG stood in for (nvImageCodec has a CPU decoder of its own)
            stand_in_nvjpeg()
        rates = {}
        for decode, workers in modes.items():
            fed = cfg.override({"data.decode": decode, "data.workers": workers})
            with closing(Feed(data, schedule_of(fed), rep, fed, crop_scale=task.loader_crop_scale)) as feed:
                if decode == "cpu":
                    images, labels = feed.next()[1:3]
                rates[decode] = rate(feed)
        # held on the device: the step alone (the Feed copies CPU-decoded batches to the GPU a batch ahead)
        in_memory = rate(SameBatch(images.to(device), labels.to(device)))
    said = ", ".join(f"{d} ({modes[d]} workers) {r:.0f} img/s = {r / in_memory:.0%}" for d, r in rates.items())
    return {
        "setting": f"ResNet-50 ch {cfg.model.ch}, {cfg.data.resolution} px, batch {batch}, bf16, fed by the Feed from "
        f"a JPEG store of {n} photos (short side {side}): random-resized crops, data.decode gpu",
        "plan": f"{rep.plan.micro_batch} × {rep.plan.accumulation}",
        "img_per_s": rates["gpu"],
        "s_per_iter": batch / rates["gpu"],
        "note": f"a batch in memory {in_memory:.0f} img/s; fed, data.decode {said}{missing}",
    }


def jpeg_decode(args: argparse.Namespace, decode: str = "gpu") -> dict:
    """data.decode = `decode` ("gpu": torchvision's nvJPEG; "nvimgcodec": nvImageCodec) against the CPU path, in
    one process: a step's random-resized crops (with flips) of a whole-image JPEG store (bench/storage.py's
    photos), decoded, cut, resized and mirrored on the device from bytes read beforehand, as the Feed does with
    what the loader's workers read; the reading, and the decoder alone, timed apart."""
    from storage import make_photos

    from bigbatch.data import H5Data, device_decode, prepare
    from bigbatch.data.loader import Step, read_batch

    n, side, out = (512, 256, 224) if args.sizes == "full" else (16, 64, 32)
    setting = f"{n} random-resized crops + flips at {out} px of a JPEG store (short side {side}), data.decode {decode}"
    device = torch.device(args.device)
    if decode == "nvimgcodec":
        try:
            device_decode.nvimgcodec_ready(device)
        except bigbatch.BigbatchError as e:  # an optional package, but a part not run is no figure (found by review)
            return {"setting": setting, "error": f"not run: {e}"}
        decoder = device_decode.nvimgcodec  # (on a CPU, its libjpeg-turbo)
    else:
        decoder = device_decode.nvjpeg if device.type == "cuda" else opencv_decoder
    with tempfile.TemporaryDirectory() as tmp:
        make_photos(Path(tmp) / "photos", n)
        path = Path(tmp) / "d.h5"
        prepare(str(Path(tmp) / "photos"), str(path), side, workers=os.cpu_count() or 1, codec="jpeg", crop="none")
        data = H5Data(path, in_ram=True)
        request = Step(0, n, out, 0, torch.arange(n))
        cpu = torch.device("cpu")
        cpu_s, _ = timed(lambda: read_batch(data, request, True, 0, 0.08), cpu, [], 2, 1)
        read_s, _ = timed(lambda: read_batch(data, request, True, 0, 0.08, on_device=True), cpu, [], 2, 1)
        encoded = read_batch(data, request, True, 0, 0.08, on_device=True).images
        device_s, peak = timed(lambda: device_decode.decode(encoded, device, decoder), device, [], 3, 1)
        crops = [torch.from_numpy(d) for d in encoded.data]
        decoder_s, _ = timed(lambda: decoder(crops, device), device, [], 3, 1)
        try:
            engine = hardware_engine(encoded.data, device, n) if decode == "nvimgcodec" else ""
        except Exception as e:  # noqa: BLE001 -- a diagnostic: its failure said in the row, the figures kept
            engine = f"; the hardware JPEG engine's check failed ({type(e).__name__}: {e})"
    if decode == "gpu":
        where = "nvJPEG" if device.type == "cuda" else "OpenCV standing in for nvJPEG"
    else:
        where = "nvImageCodec" + ("" if device.type == "cuda" else "'s CPU decoder")
    return {
        "setting": setting,
        "img_per_s": n / device_s,
        "s_per_iter": device_s,
        "peak": peak,
        "note": f"{where}: the decoder alone {n / decoder_s:.0f} img/s, the cuts, resizes and flips the rest; "
        f"{cpu_s / device_s:.1f}x as fast as the CPU path (OpenCV, one thread: {n / cpu_s:.0f} img/s); reading "
        f"the crops' bytes (a loader worker's part) {n / read_s:.0f} img/s a process{engine}",
    }


def hardware_engine(data: list, device: torch.device, n: int) -> str:
    """How many of the loader's crops (each a JPEG of its MCUs, a restart marker after every one) the GPU's
    hardware JPEG engine decodes, by an nvImageCodec decoder given that backend alone, and at what rate: whether
    a batch goes through the engine or falls back to the CUDA cores (torchvision's batched nvJPEG falls back
    image by image). A note for the row; "" on a CPU, which has no such engine; raises what the decoder raises
    (a GPU without the engine)."""
    from bigbatch.data import device_decode

    if device.type != "cuda":
        return ""
    codec = device_decode.nvimgcodec_module()
    hw = codec.Decoder(device_id=device.index or 0, backends=[codec.Backend(codec.HW_GPU_ONLY)])
    import cv2

    params = codec.DecodeParams(color_spec=codec.ColorSpec.SRGB, sample_format=codec.SampleFormat.I_RGB)
    stream = torch.cuda.current_stream(device).cuda_stream

    def engine(files: list) -> str:
        decoded = hw.decode([codec.CodeStream(d) for d in files], params=params, cuda_stream=stream)
        done = sum(image is not None for image in decoded)
        seconds, _ = timed(lambda: hw.decode([codec.CodeStream(d) for d in files], params=params, cuda_stream=stream),
                           device, [], 3, 1)  # fmt: skip
        return f"{done} of {n}, {n / seconds:.0f} img/s"

    plain = [cv2.imencode(".jpg", cv2.imdecode(d, cv2.IMREAD_COLOR))[1] for d in data]  # (no restart markers)
    again = f"the same crops re-encoded without restart markers: {engine(plain)}"
    return f"; the hardware JPEG engine alone decoded {engine(data)} ({again})"
