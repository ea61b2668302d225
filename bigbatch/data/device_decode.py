"""data.decode = "gpu": the JPEGs of an encoded data file decoded on the training device in batches
(torchvision.io.decode_jpeg: nvJPEG on CUDA) and cropped, resized and mirrored there, so that a few
CPU cores feed a fast GPU, as DALI and torchvision's GPU decode do.

data.decode = "nvimgcodec" decodes with NVIDIA's nvImageCodec instead (an optional package): batched on the
GPU's hardware JPEG engine where it has one, with a pool of CPU threads for what the GPU does not do.

The loader's workers read each step's encoded bytes and draw its crops and flips exactly as for the
CPU path (keyed by seed and global position: the same regions of the same images); the Feed decodes
them on the device. The pixels differ from the CPU path's in the last bits: nvJPEG's IDCT is not
libjpeg-turbo's, and the resize is bilinear with antialiasing (torch) where the CPU path uses
OpenCV's area averaging. Runs with data.decode = "gpu" are reproducible among themselves (resume, any
number of workers and ranks), not bit-equal to CPU-decoded ones."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

from bigbatch.data.codecs import not_as_stored
from bigbatch.data.device_resize import resized
from bigbatch.engine import batch_parts
from bigbatch.errors import BigbatchError


class Encoded(NamedTuple):
    """A batch still encoded: what the loader hands the Feed with data.decode = "gpu"."""

    data: list[np.ndarray]
    """Each image's encoded bytes (uint8)."""
    sizes: np.ndarray
    """(n, 2): each image's stored (h, w)."""
    boxes: list[tuple[float, float, float, float]]
    """The region of each image to keep: (left, top, w, h) in stored pixels."""
    out: tuple[int, int]
    """The (h, w) every region is resized to."""
    flips: torch.Tensor | None
    """Which images to mirror (None: none)."""


Decoder = Callable[[list[torch.Tensor], torch.device], list[torch.Tensor]]


def nvjpeg(data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """JPEG bytes (uint8 CPU tensors) -> RGB images (uint8 CHW) on `device`, decoded in one batch."""
    from torchvision.io import ImageReadMode, decode_jpeg

    return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)


def nvimgcodec(data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """JPEG bytes -> RGB images (uint8 CHW) on `device`, decoded in one batch by NVIDIA's nvImageCodec: on
    the GPU's hardware JPEG engine where it has one (A100, H100, H200), else on its CUDA cores with Huffman
    decoding on a pool of CPU threads; ordered on the current stream. On a CPU (tests), by its libjpeg-turbo."""
    codec = nvimgcodec_module()
    decoder = _nvimgcodec_decoder(device)
    params = codec.DecodeParams(color_spec=codec.ColorSpec.SRGB, sample_format=codec.SampleFormat.I_RGB)
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    images = decoder.decode([codec.CodeStream(d.numpy()) for d in data], params=params, cuda_stream=stream)
    if any(image is None for image in images):
        bad = [i for i, image in enumerate(images) if image is None]
        raise BigbatchError(f"nvImageCodec could not decode {len(bad)} of {len(images)} JPEGs (the first: #{bad[0]})")
    if device.type != "cuda":
        return [torch.from_numpy(np.asarray(image)).permute(2, 0, 1) for image in images]
    return [torch.from_dlpack(image).permute(2, 0, 1) for image in images]  # (DLPack: waits on its stream)


NVIMGCODEC_INSTALL = (
    'pip install "nvidia-nvimgcodec-cu13[nvjpeg]" (CUDA 13; -cu12 for CUDA 12), or set data.decode = "gpu"'
)
_NVIMGCODEC: dict[str, Any] = {}  # the module, and what its import printed
_NVIMGCODEC_DECODERS: dict[str | int, Any] = {}  # a decoder per GPU index ("cpu": its CPU decoder)


def nvimgcodec_module() -> Any:
    """nvidia.nvimgcodec, imported once with what it prints kept (it names each codec library it could not
    load, nvJPEG 2000's and nvTIFF's included, which JPEG decoding does not need); one line if missing, or if
    nvJPEG itself could not be loaded."""
    if "module" not in _NVIMGCODEC:
        import os
        import sys
        import tempfile

        sys.stderr.flush()
        saved = os.dup(2)
        with tempfile.TemporaryFile() as said:
            os.dup2(said.fileno(), 2)
            try:
                from nvidia import nvimgcodec as module
            except ImportError:
                module = None
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            said.seek(0)
            _NVIMGCODEC.update(module=module, said=said.read().decode(errors="replace"))
    if _NVIMGCODEC["module"] is None:
        raise BigbatchError(f'data.decode = "nvimgcodec" needs NVIDIA\'s nvImageCodec: {NVIMGCODEC_INSTALL}')
    return _NVIMGCODEC["module"]


def nvimgcodec_ready(device: torch.device) -> None:
    """Raise a BigbatchError (one line saying why) unless nvImageCodec can decode JPEGs on `device`: installed,
    and on a GPU with nvJPEG loaded. Its decoder for `device` is made here, once."""
    _nvimgcodec_decoder(device)


def _nvimgcodec_decoder(device: torch.device) -> Any:
    codec = nvimgcodec_module()
    if device.type == "cuda" and "[nvjpeg-ext] Failed" in _NVIMGCODEC["said"]:
        raise BigbatchError(
            f"nvImageCodec could not load NVIDIA's nvJPEG library, and decodes JPEGs on the CPU without it: "
            f"{NVIMGCODEC_INSTALL}"
        )
    key = "cpu" if device.type != "cuda" else device.index if device.index is not None else torch.cuda.current_device()
    if key not in _NVIMGCODEC_DECODERS:
        if key == "cpu":
            cpu_only = [codec.Backend(codec.CPU_ONLY)]
            made = codec.Decoder(device_id=codec.NVIMGCODEC_DEVICE_CPU_ONLY, backends=cpu_only)
        else:
            made = codec.Decoder(device_id=key)  # (every backend, the hardware engine's first)
        _NVIMGCODEC_DECODERS[key] = made
    return _NVIMGCODEC_DECODERS[key]


def decoder_of(decode: str) -> Decoder:
    """data.decode's device decoder: "gpu" torchvision's nvJPEG, "nvimgcodec" NVIDIA's nvImageCodec."""
    return {"gpu": nvjpeg, "nvimgcodec": nvimgcodec}[decode]


def decode(batch: Encoded, device: torch.device, decoder: Decoder | None = None) -> torch.Tensor:
    """The batch's regions decoded on `device` (by `decoder`, default nvjpeg), each resized to
    `batch.out` (bilinear, antialiased) and mirrored where drawn: uint8 NHWC on `device`, ready for the
    caller's current stream.

    On CUDA the batch is decoded on a stream of the decoder's own, so that nvJPEG never writes memory another
    stream still uses: torchvision's CUDA decode_jpeg allocates its outputs on the caller's current stream,
    then decodes on another stream without waiting for the caller's (pytorch/vision PR #9606), and nvJPEG's
    hardware engine does not wait even for the stream it is given (meta-pytorch/torchcodec PR #1634). The
    caching allocator hands a block back as soon as it is freed on its stream: on the training stream the
    decoder could be given a block that queued training kernels have yet to read, and overwrite it. So:
    the decode stream is waited for first (no queued work on it can still read a block it reuses: it holds
    the last batch's resizes); the batch is decoded with it current (its blocks from its pool); the caller's
    stream waits for it, and the result is recorded on the caller's stream (its block returns to the decode
    stream's pool only once the caller's work that reads it has run)."""
    return _handed_over(*_decoded(batch, device, decoder), device)


def indexed(device: torch.device) -> torch.device:
    """ "cuda" as the GPU this thread works on now, cuda:N (found by review: the decode thread read "cuda" as its
    own first GPU, cuda:0 on every rank of a torchrun); other devices as they are."""
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _decoded(batch: Encoded, device: torch.device, decoder: Decoder | None) -> tuple[torch.Tensor, Any]:
    """The batch decoded on the device's decode stream (waited for first), and the event that ends it."""
    if device.type != "cuda":
        return _decode(batch, device, decoder), None
    stream = _side_stream(device, "decode")
    stream.synchronize()
    with torch.cuda.device(device), torch.cuda.stream(stream):  # (a decode thread's own device is the first)
        x = _decode(batch, device, decoder)
        done = torch.cuda.Event()
        done.record(stream)
    return x, done


def _handed_over(x: Any, done: Any, device: torch.device) -> Any:
    """`x` (a tensor, or a Batch of them) for the caller's current stream: it waits for the work `done` ends (not
    the host), and x's blocks are not reused before the caller's work that reads them has run."""
    if done is not None:
        caller = torch.cuda.current_stream(device)
        caller.wait_event(done)
        for t in x if isinstance(x, tuple) else (x,):
            if isinstance(t, torch.Tensor):
                t.record_stream(caller)
    return x


class _Ahead:
    """The batches of `batches` (a loader, with next() and close()) each prepared a batch ahead, while the caller
    trains on the one before: the next one as a batch is taken, if `more()`, so none is prepared that no step
    takes (a run's last). `_submit()` starts the next one; `_taken(batch, pending)` finishes one for the caller."""

    def __init__(self, batches: Any, device: torch.device, more: Callable[[], bool]):
        self.batches, self.device, self.more = batches, device, more
        self.ahead: tuple[Any, Any] | None = None

    def _submit(self) -> tuple[Any, Any]:
        raise NotImplementedError

    def _taken(self, batch: Any, pending: Any) -> Any:
        raise NotImplementedError

    def __iter__(self) -> _Ahead:
        return self

    def __next__(self) -> Any:
        ahead, self.ahead = self.ahead if self.ahead is not None else self._submit(), None
        batch = self._taken(*ahead)
        if self.more():
            self.ahead = self._submit()
        return batch

    def close(self) -> None:
        self.batches.close()


class DecodeAhead(_Ahead):
    """The batches of `batches` (their images Encoded) decoded on `device`, each in a thread of its own: the
    host's part of decoding (nvJPEG's Huffman decoding, unless its hardware engine does it; the crops' kernel
    launches) runs beside the step's instead of before it. The pixels are `decode`'s: the same with or without
    the thread."""

    def __init__(self, batches: Any, device: torch.device, decoder: Decoder, more: Callable[[], bool]):
        device = indexed(device)
        from concurrent.futures import ThreadPoolExecutor

        super().__init__(batches, device, more)
        self.decoder = decoder
        if device.type == "cuda":
            _side_stream(device, "decode")  # (made here, not raced for by the thread)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="bigbatch-decode")

    def _submit(self) -> tuple[Any, Any]:
        batch = next(self.batches)
        return batch, self.pool.submit(_decoded, batch.images, self.device, self.decoder)

    def _taken(self, batch: Any, pending: Any) -> Any:
        return batch._replace(images=_handed_over(*pending.result(), self.device))

    def close(self) -> None:
        """The thread, then the source it may still have been reading from."""
        self.pool.shutdown(wait=True, cancel_futures=True)
        super().close()


class CopyAhead(_Ahead):
    """The batches of `batches` (a loader's: Batches with their tensors in pinned host memory) copied to `device`
    on a stream of their own: the next batch's copy runs beside the step on the one before (the GPU's copy
    engines beside its compute), where the step's own copy at its start had the GPU wait for it (ResNet-50's
    256 crops at 224 px are 38 MB a step). The same tensors, on the device; on a CPU, as they are."""

    def _submit(self) -> tuple[Any, Any]:
        batch = next(self.batches)
        if self.device.type != "cuda":
            return batch, None
        stream = _side_stream(self.device, "copy")
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            moved = batch._make(batch_parts.to_device(list(batch), self.device))
            done = torch.cuda.Event()
            done.record(stream)
        return moved, done

    def _taken(self, batch: Any, pending: Any) -> Any:
        return _handed_over(batch, pending, self.device)


_STREAMS: dict[tuple[str, int], torch.cuda.Stream] = {}


def _side_stream(device: torch.device, purpose: str) -> torch.cuda.Stream:
    """The device's stream for `purpose`, "decode" (decoding ahead) or "copy" (copying ahead): each its own, so
    that a decode, which first waits for its stream's last work, never waits for a copy (the swap task's two
    feeds)."""
    key = (purpose, device.index if device.index is not None else torch.cuda.current_device())
    if key not in _STREAMS:
        _STREAMS[key] = torch.cuda.Stream(device=key[1])
    return _STREAMS[key]


def _decode(batch: Encoded, device: torch.device, decoder: Decoder | None) -> torch.Tensor:
    if not batch.data:
        return torch.zeros((0, *batch.out, 3), dtype=torch.uint8, device=device)
    images = (decoder or nvjpeg)([torch.from_numpy(d) for d in batch.data], device)
    regions = []
    for image, (h, w), (left, top, bw, bh) in zip(images, batch.sizes.tolist(), batch.boxes):
        if (wrong := not_as_stored(image.shape[1:3], (h, w))) is not None:  # (as the CPU's decode refuses it)
            raise BigbatchError(
                f"an image of the batch does not decode as stored ({wrong}): the data file is damaged (bigbatch info "
                "--verify says more); prepare it again"
            )
        fy, fx = image.shape[1] / h, image.shape[2] / w  # 1 unless the decoder scaled
        x0, y0 = min(int(left * fx), image.shape[2] - 1), min(int(top * fy), image.shape[1] - 1)
        x1, y1 = min(round((left + bw) * fx), image.shape[2]), min(round((top + bh) * fy), image.shape[1])
        regions.append((y0, max(y0 + 1, y1), x0, max(x0 + 1, x1)))  # (within the image, a pixel at least)
    return resized(images, np.array(regions, dtype=np.int64), batch.out, batch.flips, device)


def check_device(device: torch.device, decode: str, key: str = "data.decode") -> None:
    """data.decode = "gpu" or "nvimgcodec" needs the run on a CUDA device (the dry run checks this alone). `key`:
    what the caller gave it as (Loader's: its `decode` argument; found from outside, named as a config key)."""
    said = f'{key} = "{decode}"'
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BigbatchError(f'{said} decodes on a CUDA device and none is available here: use "cpu"')
    if device.type != "cuda":
        raise BigbatchError(
            f'{said} decodes on a CUDA device and this run trains on {device.type}: set {key} = "cpu" (the default)'
        )


def check(data: Any, device: torch.device, decode: str = "gpu", key: str = "data.decode") -> None:
    """data.decode = "gpu" or "nvimgcodec" needs a JPEG data file of RGB images and a CUDA device (and
    "nvimgcodec" the package, with nvJPEG); one line otherwise. `key`: as check_device's."""
    said = f'{key} = "{decode}"'
    codec = getattr(data, "meta", {}).get("codec", "raw") if getattr(data, "encoded", False) else "raw"
    if codec != "jpeg" or getattr(data, "channels", 3) != 3:
        raise BigbatchError(
            f"{said} decodes JPEG files of RGB images; {data.source} is {codec} with "
            f'{getattr(data, "channels", "?")} channels: prepare it with --codec jpeg, or set {key} = "cpu"'
        )
    check_device(device, decode, key)
    if decode == "nvimgcodec":
        nvimgcodec_ready(device)
