"""Batches for training: the per-rank endless sampler (steps by images seen, phases applied at their
boundaries) and a loader that reads its batches in DataLoader worker processes, in order."""

from __future__ import annotations

import atexit
import functools
import itertools
import os
import signal
import weakref
from collections.abc import Iterable, Iterator
from contextlib import closing, suppress
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from bigbatch.data import device_decode
from bigbatch.data.codecs import resized
from bigbatch.data.crops import rrc_box, rrc_draws
from bigbatch.data.schedule import Schedule, resize_stored, target_shape
from bigbatch.data.streams import FLIP, generator
from bigbatch.errors import BigbatchError, first_line, warn, whole_number
from bigbatch.signals import forking


class Order(Protocol):
    def indices(self, start: int, count: int) -> torch.Tensor: ...


class Step(NamedTuple):
    """One optimizer step's data request for one rank."""

    nimg: int
    """Images seen (all ranks) before this step: its global position."""
    batch: int
    """Images in the whole step, all ranks together."""
    resolution: int
    """Resize to this side (0: as stored)."""
    offset: int
    """Where this rank's share starts within the step (rank * share)."""
    indices: torch.Tensor
    """Data indices of this rank's share."""


class Batch(NamedTuple):
    nimg: int
    """The step's position in images seen (-1 for a bare index request)."""
    images: torch.Tensor
    """uint8 NHWC, already resized to the phase's resolution and x-flipped if asked."""
    labels: torch.Tensor
    """int64"""
    flips: torch.Tensor | None
    """Which images were mirrored (None without x-flip)."""


class RankSampler:
    """The per-rank endless sampler: step after step from `start` images seen, each taking this rank's
    share (positions nimg + rank * share ..) of `order`, with the batch and resolution of the phase
    in force. The data each step sees depends only on the seed and images seen, never on the rank
    count, and resuming needs only `start`."""

    def __init__(self, order: Order, batch: int | Schedule, rank: int = 0, world_size: int = 1, start: int = 0) -> None:
        self.order, self.rank, self.world_size, self.start = order, rank, world_size, start
        self.schedule = Schedule.constant(0, batch) if isinstance(batch, int) else batch
        for p in self.schedule.phases:
            if p.batch % world_size:
                raise BigbatchError(f"batch {p.batch} (from {p.start} images) is not divisible by {world_size} ranks")
        self.schedule.align(start)

    def __iter__(self) -> Iterator[Step]:
        for nimg, phase in self.schedule.steps(self.start):
            share = phase.batch // self.world_size
            offset = self.rank * share
            yield Step(nimg, phase.batch, phase.resolution, offset, self.order.indices(nimg + offset, share))


def read_batch(
    data: Any,
    request: Step | torch.Tensor,
    xflip: bool = False,
    seed: int = 0,
    crop_scale: float = 0.0,
    on_device: bool = False,
) -> Batch:
    """The batch a request names, read from `data`: resized to the step's resolution and, with
    `xflip`, mirrored by a draw keyed by (seed, step) over the whole step, of which this rank takes
    its share, so the flips of an image do not depend on the rank count. `crop_scale` > 0: random-resized
    crops of at least that area fraction, drawn the same way, cut from the images as stored, then resized to
    the phase's size: of an encoded file (whole images, `prepare --crop none`, or squares), cut before decoding,
    a JPEG's crop decoding only its own MCUs. `on_device` (data.decode = "gpu"): the images stay encoded, with the
    regions to cut and the flips (device_decode.Encoded), for the Feed to decode. What BatchLoader's workers run."""
    if isinstance(request, torch.Tensor):
        images, labels = data.get(request)
        return Batch(-1, images, labels, None)
    flips = None
    if xflip:
        draw = torch.rand(request.batch, generator=generator(seed, FLIP, request.nimg))
        flips = draw[request.offset : request.offset + len(request.indices)] < 0.5
    out: int | tuple[int, int] = request.resolution or data.resolution
    is_encoded = getattr(data, "encoded", False)
    if (on_device or crop_scale and is_encoded) and not getattr(data, "whole", False) and len(request.indices):
        out = target_shape(*data.stored_sizes(request.indices[:1])[0].tolist(), out)  # (a rectangle keeps its shape)
    if crop_scale:
        share = slice(request.offset, request.offset + len(request.indices))
        draws = rrc_draws(seed, request.nimg, request.batch)[share]
    boxes = data.crop_boxes(request.indices, draws, crop_scale) if crop_scale and is_encoded else None
    if on_device:
        encoded, labels = data.get_encoded(request.indices, boxes, out)
        return Batch(request.nimg, encoded._replace(flips=flips), labels, flips)
    if boxes is not None:
        images, labels = data.get_regions(request.indices, boxes, out, placed=False)  # (random: snapped, faster)
    elif crop_scale:  # raw squares: cut as stored, then resized to the phase's size
        images, labels = data.get(request.indices)
        images = square_crops(images, draws, crop_scale, request.resolution or data.resolution)
    elif request.resolution and is_encoded:  # decode no larger than needed
        images, labels = data.get(request.indices, request.resolution)
    else:
        images, labels = data.get(request.indices)
    if request.resolution and not crop_scale:  # (crops come at the phase's size)
        images = resize_stored(images, request.resolution)
    if flips is not None and flips.any():
        images = mirrored(images, flips)
    return Batch(request.nimg, images, labels, flips)


def square_crops(images: torch.Tensor, draws: torch.Tensor, min_scale: float, out: int) -> torch.Tensor:
    """uint8 NHWC stored `images`: the random-resized crops their `draws` (n, TRIES, 4: crops.rrc_draws) make, each
    cut at the stored size and then resized to out x out (one rectangular shape: its shape at `out`), as
    torchvision's RandomResizedCrop cuts the image it is given (found from outside: the images were shrunk to the
    phase's size first and the crops enlarged from that, a third of the detail of an 8% crop lost)."""
    h, w = images.shape[1:3]
    shape = target_shape(h, w, out)  # (a store of one rectangular shape keeps it, as resize_batch and the plan do)
    stored = images.numpy()
    cut = []
    for image, d in zip(stored, draws):
        left, top, cw, ch = rrc_box(w, h, d, min_scale)
        cut.append(resized(image[top : top + ch, left : left + cw], shape))
    return torch.from_numpy(np.stack(cut)) if cut else images.new_zeros((0, *shape, images.shape[3]))


def mirrored(images: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
    """uint8 NHWC `images` with those where `flips` is set mirrored left-right, as a new tensor: image by
    image (about a quarter of the time of torch.where over the batch, which mirrors all, then picks)."""
    out = images.clone()
    for k in flips.nonzero()[:, 0].tolist():
        out[k] = images[k].flip(1)
    return out


class _Reader(Dataset):
    """A map-style Dataset whose keys are whole requests (Step or index tensor) and items whole batches."""

    def __init__(self, data: Any, xflip: bool, seed: int, crop_scale: float = 0.0, on_device: bool = False):
        self.data, self.xflip, self.seed, self.crop_scale, self.on_device = data, xflip, seed, crop_scale, on_device

    def __getitem__(self, request: Step | torch.Tensor | np.ndarray) -> Batch:
        request = _from_value(request)
        try:
            return read_batch(self.data, request, self.xflip, self.seed, self.crop_scale, self.on_device)
        except BigbatchError as e:
            raise DataReadError(str(e)) from None
        except Exception as e:  # noqa: BLE001 -- OS, HDF5 and remote-store errors: name the data, not the worker
            raise DataReadError(f"cannot read the data {getattr(self.data, 'source', '')}: {first_line(e)}") from None


class DataReadError(BigbatchError):
    """Reading a batch failed; raised in a DataLoader worker, it reaches the training process as one line."""

    def __init__(self, message: str) -> None:
        # A worker's error comes back as "Caught DataReadError in DataLoader worker process 0.\nOriginal
        # Traceback ...\nbigbatch.data.loader.DataReadError: <the message>": keep the message only.
        if "\nOriginal Traceback" in message:
            message = message.rstrip().splitlines()[-1].partition(": ")[2]
        super().__init__(message)


class _Requests:
    """The requests as the workers get them: each index tensor a NumPy array, pickled by value. A tensor goes to a
    worker by a file descriptor this process serves from a thread of its own, one connection a step; a worker
    killed at exit while it fetched one left that thread's traceback on stderr (found in the test suite)."""

    def __init__(self, requests: Iterable):
        self.requests = requests

    def __iter__(self) -> Iterator:
        for request in self.requests:
            if isinstance(request, torch.Tensor):
                yield request.numpy(force=True)
            else:  # (a Step of a user's Order may hold its indices as a list or an array)
                indices = request.indices
                yield request._replace(
                    indices=indices.numpy(force=True) if isinstance(indices, torch.Tensor) else np.asarray(indices)
                )


def _from_value(request: Step | torch.Tensor | np.ndarray) -> Step | torch.Tensor:
    """A request of _Requests with its index tensor again."""
    if isinstance(request, np.ndarray):
        return torch.from_numpy(request)
    if isinstance(request.indices, np.ndarray):
        return request._replace(indices=torch.from_numpy(request.indices))
    return request


def _identity(batch: Batch) -> Batch:
    return batch


def _worker(decoding: bool, _: int) -> None:
    """A DataLoader worker: deaf to SIGTERM, which a job scheduler sends the whole process group (found from
    outside: a worker died of it, and the run of a traceback, with no checkpoint saved, where the training
    process saves one and stops them); the main process ends it, and PyTorch's watchdog should the main process
    die. One that decodes runs OpenCV in its own thread (the workers are the parallelism; its thread pool in each
    would oversubscribe the cores)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if decoding:
        import cv2

        cv2.setNumThreads(0)


class BatchLoader:
    """Reads the batches of `requests` (Steps from a RankSampler, or plain index tensors) from `data`
    (anything with `get(index) -> (images, labels)`: H5Data, ImageData) in `workers` DataLoader
    processes (0: in this one), `prefetch` batches ahead per worker, yielding them in request order.

    Phase switches need no restart: each request carries its batch and resolution, and resizing
    happens in the workers. A data file is opened lazily in each worker, so fork and spawn both work."""

    def __init__(
        self,
        data: Any,
        requests: Iterable[Step] | Iterable[torch.Tensor],
        workers: int = 0,
        xflip: bool = False,
        seed: int = 0,
        prefetch: int = 2,
        context: str | None = None,
        pin_memory: bool = False,
        crop_scale: float = 0.0,
        on_device: bool = False,
    ) -> None:
        if workers < 0:
            raise BigbatchError(f"data.workers must be >= 0, got {workers}")
        self.loader = DataLoader(
            _Reader(data, xflip, seed, crop_scale, on_device),
            batch_size=None,
            sampler=_Requests(requests),  # type: ignore[arg-type]
            num_workers=workers,
            collate_fn=_identity,
            prefetch_factor=prefetch if workers else None,
            multiprocessing_context=context if workers else None,
            pin_memory=pin_memory,
            generator=torch.Generator(),  # its base seed is unused here: leave the global RNG alone
            worker_init_fn=functools.partial(_worker, bool(getattr(data, "encoded", False))) if workers else None,
        )
        self._it: Iterator[Batch] | None = None

    def __iter__(self) -> Iterator[Batch]:
        return _reading(self.loader)

    def __next__(self) -> Batch:
        if self._it is None:
            self._it = _reading(self.loader)
        return next(self._it)

    def close(self) -> None:
        """Stop the worker processes (they also stop when the loader is garbage collected)."""
        it, self._it = self._it, None
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
            _end_workers(it)


# The iterators of loaders with workers. Their workers ignore SIGTERM (_worker), which DataLoader's shutdown of a
# stuck worker and multiprocessing's at exit send: those still alive then are killed, as at the process's exit,
# before multiprocessing waits on them (found by review: a script that left an iterator unfinished never ended).
_READING: weakref.WeakSet = weakref.WeakSet()


def _reading(loader: DataLoader) -> Iterator[Batch]:
    if not loader.num_workers:
        return iter(loader)
    with forking():  # (the workers start here)
        it = iter(loader)
    _READING.add(it)
    return it


def _end_workers(it: Any) -> None:
    alive = [w for w in getattr(it, "_workers", ()) if w.is_alive()]
    if alive and getattr(it, "_worker_pids_set", False):  # (else PyTorch's SIGCHLD handler calls it a failure)
        with suppress(Exception):
            torch.utils.data._utils.signal_handling._remove_worker_pids(id(it))
            it._worker_pids_set = False
    for w in alive:
        with suppress(OSError, TypeError):  # (gone meanwhile; a pid None)
            os.kill(w.pid, getattr(signal, "SIGKILL", signal.SIGTERM))


@atexit.register  # (registered after multiprocessing's own, so run before it)
def _end_all_workers() -> None:
    for it in list(_READING):
        _end_workers(it)


class Loader:
    """bigbatch's data files in anyone's training loop (as FFCV's Loader): `(images, labels)` batches,
    uint8 NHWC and int64, of this rank's share of each step, read and decoded in `workers` processes.

        for images, labels in bigbatch.data.Loader("train.h5", batch=256, resolution=224, augment="rrc"):
            ...

    The batches are the bytes bigbatch's own training loop reads for the same seed and position: the
    order (a seeded permutation per epoch), the crops and flips are keyed by global position, so any
    `workers` and any `world_size` give the same images (the ranks' shares together are the
    one-process batch), and `start` (images seen, a multiple of `batch`) resumes mid-epoch; each batch
    handed over moves `start` past it, so that the next pass reads on (the next epoch) and `start` is what a
    resume takes. `augment`:
    "rrc" random-resized crops of at least `min_scale` of the image's area, cut from each image as stored (whole,
    `prepare --crop none`, or a square), then resized to `resolution`; an encoded file's before decoding, on the
    CPU or the GPU; "center": the center square. `xflip`
    mirrors half of them. `steps`: how many batches (default: up to the next multiple of
    E = len(data) // batch x batch images seen; E is not the data's epoch, len(data): positions run on
    across the data's epochs, each image once per len(data) positions). `decode` = "gpu" (a JPEG file;
    data.decode's): the workers only read the bytes, and the Loader decodes, crops, resizes and mirrors
    on `device` (nvJPEG), yielding images there; "nvimgcodec" the same, decoded by nvImageCodec. `in_ram`: the
    file's stored images read into memory once (FFCV's os_cache; data.in_ram), the same batches. `order` =
    "sequential" (an evaluation's, FFCV's OrderOption.SEQUENTIAL): a pass is every image once, in the file's order,
    from `start` on, the last batch what is left; each rank takes its part of each batch (np.array_split's, none
    where fewer images than ranks are left: every rank reads as many batches), and the next pass starts over."""

    def __init__(
        self,
        path: str,
        batch: int,
        resolution: int,
        augment: str = "center",
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        workers: int = 0,
        start: int = 0,
        xflip: bool = False,
        min_scale: float = 0.08,
        steps: int | None = None,
        storage_options: dict | None = None,
        decode: str = "cpu",
        device: str | torch.device = "cuda",
        in_ram: bool = False,
        order: str = "random",
    ) -> None:
        from bigbatch.data.load import load_data, rectangles, stored_images, stored_side
        from bigbatch.data.streams import GlobalOrder

        if augment not in ("rrc", "center"):
            raise BigbatchError(f"augment must be 'rrc' or 'center', got {augment!r}")
        if not isinstance(path, (str, os.PathLike)):
            raise BigbatchError(f"path must name a data file (a path or URL), got {type(path).__name__}")
        counts = {"world_size": (world_size, 1), "rank": (rank, 0), "batch": (batch, 1), "start": (start, 0)}
        counts |= {"workers": (workers, 0), "steps": (steps, 0), "resolution": (resolution, 1), "seed": (seed, 0)}
        for name, (value, least) in counts.items():
            if value is not None or name != "steps":
                whole_number(name, value, least)
        if seed >= 2**64:  # (found from outside: masked to 64 bits, another seed's data; as train.seed, refused)
            raise BigbatchError(f"seed must be a whole number of 64 bits, below 2**64, got {seed}")
        if rank >= world_size:
            raise BigbatchError(f"rank {rank} is out of range for world_size {world_size} (ranks 0..{world_size - 1})")
        if order not in ("random", "sequential"):
            raise BigbatchError(f"order must be 'random' or 'sequential' (every image once, in order), got {order!r}")
        self._sequential = order == "sequential"  # (found from outside: no way to read a file once, as FFCV's)
        if batch % world_size and not self._sequential:  # (sequential: each rank its np.array_split part)
            raise BigbatchError(f"batch {batch} must be a multiple of world_size {world_size}: each rank reads a share")
        if start % batch:
            raise BigbatchError(
                f"start {start} is not a multiple of batch {batch}: it counts the images of the batches read before "
                f"(e.g. {start // batch * batch} or {(start // batch + 1) * batch})"
            )
        for name, flag in (("xflip", xflip), ("in_ram", in_ram)):
            if not isinstance(flag, bool):
                raise BigbatchError(f"{name} must be True or False, got {flag!r}")
        self.data = load_data(path, resolution, in_ram, storage_options)
        if rank == 0 and (stored := stored_side(self.data)) and resolution > stored:  # (as train says it: found
            warn(  # from outside)
                f"{self.data.source} holds {stored_images(self.data, stored)}, read at {resolution}px: upscaled, no "
                "sharper than at their own size",
                once=True,
            )
        if len(getattr(self.data, "bucket_counts", [])) > 1:  # (said here, not at the first batch)
            raise BigbatchError(
                f"{self.data.source} holds images of several shapes (prepare --buckets), and a Loader's batch is one "
                "shape: prepare the images without --buckets (a bucketed file reads in bigbatch.data.BucketOrder)"
            )
        if augment == "center" and (rect := rectangles(getattr(self.data, "meta", {}))):
            raise BigbatchError(  # (found from outside: read as one bucket of another shape, neither square nor said)
                f"{self.data.source} holds {rect}, which augment='center' reads: prepare them with "
                f"--resolution {resolution} (their center squares), or with --crop none for augment='rrc'"
            )
        if not 0 < min_scale <= 1:
            raise BigbatchError(f"min_scale must be an area fraction in (0, 1], got {min_scale}")
        if augment == "center" and min_scale != 0.08:  # (found from outside: taken, and nothing done with it)
            raise BigbatchError("min_scale is the random-resized crops' (augment='rrc'); augment='center' cuts none")
        if self._sequential and start and start >= len(self.data):
            raise BigbatchError(f"start {start} is past the {len(self.data)} images of {self.data.source}")
        epoch = -(-len(self.data) // batch) * batch if self._sequential else len(self.data) // batch * batch
        if steps is None and not epoch:
            raise BigbatchError(
                f"batch {batch} is more than the {len(self.data)} images of {self.data.source}: no whole batch in an "
                "epoch; give a smaller batch, or steps=N (the stream then goes on across epochs)"
            )
        self.batch, self.start, self._steps, self._epoch = batch, start, steps, epoch
        self._passing: int | None = None  # the steps of the pass under way (len stays put while `start` moves)
        self._order = (GlobalOrder(len(self.data), seed), Schedule.constant(resolution, batch), rank, world_size)
        self._reading = (workers, xflip, seed, min_scale if augment == "rrc" else 0.0)
        if decode not in ("cpu", "gpu", "nvimgcodec"):
            raise BigbatchError(f"decode must be 'cpu', 'gpu' or 'nvimgcodec', got {decode!r}")
        self.device = device_decode.indexed(torch.device(device)) if decode != "cpu" else None
        self.decoder = device_decode.decoder_of(decode) if decode != "cpu" else None
        if self.device is not None:
            device_decode.check(self.data, self.device, decode, key="decode")

    @property
    def steps(self) -> int:
        """The batches of a pass: `steps`, or those up to the next multiple of E images seen; during a pass, that
        pass's (found by review: it shrank as batches were handed over, and a progress bar's total with it)."""
        if self._passing is not None:
            return self._passing
        if self._sequential:  # (to the file's end)
            left = -(-(len(self.data) - self.start) // self.batch)
            return left if self._steps is None else min(self._steps, left)
        return self._steps if self._steps is not None else (self._epoch - self.start % self._epoch) // self.batch

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """A pass: `steps` batches from `start`, which moves past each batch as it is handed over, so that the next
        pass reads on (the next epoch, as a DataLoader's and FFCV's passes do; found from outside: every pass read
        the first again), and `start` is always the images read: what a resume starts from."""
        steps = self.steps
        self._passing = steps
        try:
            yield from self._pass(steps)
        finally:
            self._passing = None

    def _in_order(self, steps: int) -> Iterator[Step]:
        """order="sequential"'s requests: `steps` batches of images in the file's order from `start`."""
        n, (_, schedule, rank, world) = len(self.data), self._order
        for lo in range(self.start, min(n, self.start + steps * self.batch), self.batch):
            hi = min(n, lo + self.batch)
            share = np.array_split(np.arange(lo, hi), world)[rank]
            offset = int(share[0]) - lo if len(share) else 0
            yield Step(lo, hi - lo, schedule.phase_at(lo).resolution, offset, torch.from_numpy(share))

    def _past(self, nimg: int) -> None:
        """`start` past the batch handed over from `nimg` (sequential: past the last, 0: the next pass reads all)."""
        self.start = nimg + self.batch
        if self._sequential and self.start >= len(self.data):
            self.start = 0

    def _pass(self, steps: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # Drawn as the workers ask (found from outside: a list of the pass's Steps kept each one's indices alive,
        # each then in shared memory with an open file, "Too many open files" after ~1,000 batches; now they go by
        # value, but the pass's requests are still not all held at once).
        requests = (
            self._in_order(steps)
            if self._sequential
            else itertools.islice(RankSampler(*self._order, start=self.start), steps)
        )
        workers, xflip, seed, crop_scale = self._reading
        loader = BatchLoader(
            self.data, requests, workers, xflip, seed, crop_scale=crop_scale, on_device=self.device is not None
        )
        if self.device is None:
            for b in loader:
                self._past(b.nimg)
                yield b.images, b.labels
            return
        taken = 0  # decoded on the device in a thread, the next batch while the caller's step runs

        def more() -> bool:
            return taken < steps

        with closing(device_decode.DecodeAhead(loader, self.device, self.decoder, more)) as batches:
            for _ in range(steps):
                taken += 1
                b = next(batches)
                self._past(b.nimg)
                yield b.images, b.labels.to(self.device, non_blocking=True)  # (blocking drained the caller's step)
