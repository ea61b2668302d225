"""The feature-extractor interface (uint8 images in, float32 features out) and running any extractor over
many images: in batches, or split across ranks (every rank gets all rows, or only their sums)."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path

import numpy as np
import torch
import torch.distributed as td

from bigbatch.engine import dist
from bigbatch.errors import BigbatchError, warn
from bigbatch.files import atomic_write
from bigbatch.images_done import ImagesDone
from bigbatch.signals import EvaluationStopped, check_stop

_PROGRESS: ContextVar[str | None] = ContextVar("bigbatch_feature_progress", default=None)
KEEP_EVERY_S = 60.0  # moments_sharded's sums under way kept this often (and when a stop is asked for)


@contextlib.contextmanager
def progress(label: str) -> Iterator[None]:
    """Within it, rank 0 shows on stderr how far each pass over images has come (feature extraction, a
    classifier's predictions, a swap model's faces), `label` first: a bar on a terminal, else a line every
    LINE_EVERY_S (ImagesDone). For `bigbatch eval` and `stats`: Inception on a CPU takes about 0.35 s an image.
    Training's evaluations stay quiet: its own progress line runs."""
    token = _PROGRESS.set(label)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


class Progress(ImagesDone):
    """Images done out of `total` (this rank's share), shown as `progress` says; silent outside it."""

    def __init__(self, total: int, what: str) -> None:
        label = _PROGRESS.get()
        super().__init__(total, f"{label}: {what}", on=label is not None and dist.first())


def to_nchw(images: torch.Tensor) -> torch.Tensor:
    """uint8 NHWC or NCHW images, 1 or 3 channels -> uint8 (N, 3, H, W)."""
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or images.dim() != 4:
        got = f"{images.dtype} {tuple(images.shape)}" if isinstance(images, torch.Tensor) else type(images).__name__
        raise BigbatchError(f"feature extractors take uint8 image batches (N, H, W, C) or (N, C, H, W), got {got}")
    if images.shape[-1] in (1, 3):
        images = images.permute(0, 3, 1, 2)
    elif images.shape[1] not in (1, 3):
        raise BigbatchError(f"images must have 1 or 3 channels, got shape {tuple(images.shape)}")
    return images.expand(-1, 3, -1, -1) if images.shape[1] == 1 else images


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """Full float32 convolutions and matmuls (no TF32 on Ampere and later), restored afterwards. Through
    PyTorch's fp32_precision switches, which read either API's setting (the legacy allow_tf32 raises where a
    user set the new one)."""
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    saved = matmul.fp32_precision, conv.fp32_precision
    matmul.fp32_precision = conv.fp32_precision = "ieee"
    try:
        yield
    finally:
        matmul.fp32_precision, conv.fp32_precision = saved


class Extractor:
    """uint8 images -> {"pool": (N, dims) features, "logits": (N, classes) if available}, float32 on the CPU.

    `name` says what the features are ("inception" or "classifier" family); `digest` identifies the
    weights and the input pipeline, and keys the reference-statistics cache.
    """

    name: str = "extractor"
    family: str = "inception"
    digest: str = ""
    dims: int = 0
    has_logits: bool = False
    device: torch.device = torch.device("cpu")

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        with exact_float32():
            out = self.forward(images)
        return {k: v.float().cpu() for k, v in out.items()}


def resolve_device(device: torch.device | str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def extract(extractor: Extractor, images: torch.Tensor, batch_size: int = 64) -> dict[str, torch.Tensor]:
    """Features of uint8 `images`, `batch_size` at a time."""
    if batch_size < 1:
        raise BigbatchError(f"batch_size must be positive, got {batch_size}")
    parts = [extractor(images[i : i + batch_size]) for i in range(0, images.shape[0], batch_size)]
    if not parts:
        raise BigbatchError("no images to extract features from")
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def extract_sharded(
    extractor: Extractor, n: int, images_at: Callable[[int, int], torch.Tensor], batch_size: int = 64
) -> dict[str, torch.Tensor]:
    """Features of images 0 .. n-1 split across ranks: `images_at(start, count)` returns the uint8
    images start .. start+count-1; each rank extracts one contiguous shard and every rank gets all n
    rows, in order. Ranks whose shard runs past n extract copies of image n-1 so that all gathers have
    one shape; those rows are dropped."""
    if n < 1:
        raise BigbatchError(f"need at least one image to extract features from, got n={n}")
    world, lo, hi, per = _shard(n, batch_size)
    real = hi - lo
    parts, shown = [], Progress(real, "features")
    for s in range(lo, lo + real, batch_size):
        check_stop(starting=False)  # (features of every image are not kept: at start-up, taken to their end)
        count = min(batch_size, lo + real - s)
        parts.append(extractor(images_at(s, count)))
        shown.add(count)
    shown.close()
    if real < per and world > 1:  # (for all_gather's one shape)
        last = extractor(images_at(n - 1, 1))
        parts.append({k: v.expand(per - real, -1) for k, v in last.items()})
    local = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    if world == 1:
        return local
    device = _collective_device()
    out = {}
    for key in sorted(local):
        shard = local[key].to(device).contiguous()
        gathered = [torch.empty_like(shard) for _ in range(world)]
        td.all_gather(gathered, shard)
        out[key] = torch.cat(gathered)[:n].cpu()
    return out


def moments_sharded(
    extractor: Extractor,
    n: int,
    images_at: Callable[[int, int], torch.Tensor],
    batch_size: int = 64,
    keep: Path | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Mean (D,) and unbiased covariance (D, D), float64, of the "pool" features of images 0 .. n-1,
    each rank summing its contiguous shard: only the sums (D + D^2 numbers) cross ranks, never the
    features, so FID statistics of a million images need no (N, D) matrix anywhere. Sums are taken
    around the first image's features, which keeps the float64 covariance accurate for any N.
    `keep`: the sums under way are kept in a file of this rank's beside it (`kept_file`) every KEEP_EVERY_S and
    when a stop is asked for, and a call that finds one goes on from there, to the same bits (a stop while
    `bigbatch train` starts ends it there: StartupStopped; found from outside, ImageNet's reference statistics
    were taken to their end first, past a scheduler's grace period, and began again at the next start)."""
    if n < 2:
        raise BigbatchError(f"need at least two images for a covariance, got n={n}")
    world, lo, hi, _ = _shard(n, batch_size)
    shift = extractor(images_at(0, 1))["pool"].double().reshape(-1)  # the same on every rank
    total = torch.zeros(shift.numel(), dtype=torch.float64)
    outer = torch.zeros(shift.numel(), shift.numel(), dtype=torch.float64)
    kept = kept_file(keep) if keep is not None else None
    done, batch = _restore(kept, shift, total, outer, lo, hi, batch_size) if kept is not None else (0, None)
    batch_size = batch or batch_size
    shown, last, began = Progress(hi - lo - done, "features"), time.monotonic(), done
    # The sums and their count as one object, replaced whole after each batch: an exception a signal raises
    # between two statements (Ctrl-C, a command's SIGTERM) finds them of the same batches, and they are kept.
    acc = (total, outer, done)
    try:  # (the reduce too: a rank done first waits in it, and is stopped there)
        for start in range(lo + done, hi, batch_size):
            try:
                check_stop()
            except EvaluationStopped as e:
                if kept is None or not acc[2]:
                    raise
                _keep(kept, shift, *acc, batch_size, lo)  # (where a batch begins: of whole batches)
                raise type(e)(f"{acc[2]:,} of {hi - lo:,} images done, kept in {kept} for the next start") from None
            x = extractor(images_at(start, min(batch_size, hi - start)))["pool"].double() - shift
            acc = (acc[0] + x.sum(0), acc[1] + x.T @ x, acc[2] + x.shape[0])
            shown.add(x.shape[0])
            if kept is not None and time.monotonic() - last >= KEEP_EVERY_S and acc[2] < hi - lo:
                _keep(kept, shift, *acc, batch_size, lo)
                last = time.monotonic()
        total, outer, _ = acc
        shown.close()
        if world > 1:
            flat = torch.cat([total, outer.reshape(-1)]).to(_collective_device())
            td.all_reduce(flat)
            flat = flat.cpu()
            total, outer = flat[: total.numel()], flat[total.numel() :].view_as(outer)
    except EvaluationStopped:
        raise
    except BaseException:  # (found from outside: `bigbatch stats` stopped by SIGTERM or Ctrl-C kept nothing)
        if kept is not None and began < acc[2]:
            try:  # (an error of its own, or a second signal, must not hide the first: review)
                _keep(kept, shift, *acc, batch_size, lo)
                print(f"reference statistics: {acc[2]:,} of {hi - lo:,} images done, kept in {kept}", file=sys.stderr)
            except Exception as e:  # noqa: BLE001
                warn(f"the reference statistics' sums so far could not be kept in {kept}: {e}")
        raise
    mean = total / n
    cov = (outer - n * torch.outer(mean, mean)) / (n - 1)
    return (mean + shift).numpy(), ((cov + cov.T) / 2).numpy()


def kept_file(keep: Path) -> Path:
    """Where this rank keeps moments_sharded's sums under way for `keep`: beside it, one file a rank and world size."""
    world, rank = (td.get_world_size(), td.get_rank()) if dist.active() else (1, 0)
    return keep.with_name(f"{keep.name.removesuffix('.safetensors')}.partial-{rank}of{world}.safetensors")


def drop_kept(keep: Path) -> None:
    """The sums kept for `keep` by every rank of any world size, gone (once its statistics are saved); one that may
    not go (another user's, in a shared cache) stays: review."""
    for f in keep.parent.glob(f"{keep.name.removesuffix('.safetensors')}.partial-*of*.safetensors"):
        with contextlib.suppress(OSError):
            f.unlink(missing_ok=True)


def _keep(
    kept: Path, shift: torch.Tensor, total: torch.Tensor, outer: torch.Tensor, done: int, batch: int, first: int
) -> None:
    from safetensors.torch import save

    kept.parent.mkdir(parents=True, exist_ok=True)
    numbers = torch.tensor([done, batch, first])  # (first: the shard's first image, which the batch size moves)
    # (atomic_write: cut short, nothing is left in the cache, where nothing sweeps it; found by review)
    atomic_write(kept, save({"shift": shift, "total": total, "outer": outer, "done_batch": numbers}))


def _restore(
    kept: Path, shift: torch.Tensor, total: torch.Tensor, outer: torch.Tensor, lo: int, hi: int, batch_size: int
) -> tuple[int, int | None]:
    """The images of its share a kept file says were summed, its sums put in `total` and `outer`, and the batch
    they were summed in (the rest is, so that the sums are the same bits: found by review); (0, None) when there is
    none, none of these images' (another first image: another data set or extractor), or of batches larger than
    `batch_size` (which may not fit where it is asked smaller: found by review)."""
    from safetensors.torch import load_file

    if not kept.is_file():
        return 0, None
    try:
        saved = load_file(str(kept))
        done, batch, *first = (int(v) for v in saved["done_batch"])
        begun = first[0] if first else 0  # (files kept before the shard's first image was: begun at 0)
        share = hi - lo
        if not (0 < done <= share and batch > 0 and torch.equal(saved["shift"], shift)):
            raise ValueError("not of these images")
        if begun != lo:  # (a shard begun elsewhere: another batch size's, or before whole batches; review)
            raise ValueError(f"its images begin at {begun}, this shard's at {lo}")
        if batch > batch_size:
            raise ValueError(f"summed in batches of {batch}, more than the {batch_size} asked")
        total.copy_(saved["total"])
        outer.copy_(saved["outer"])
    except Exception as e:  # noqa: BLE001 (a damaged or foreign file: begun again)
        warn(f"{kept} holds no sums of these images ({e}); computing them anew")
        return 0, None
    print(f"reference statistics: {done:,} of {share:,} images were done before (in batches of {batch}); going on "
          "from there", file=sys.stderr)  # fmt: skip
    return done, batch


def _shard(n: int, batch_size: int) -> tuple[int, int, int, int]:
    """(world size, first image, end, images per rank) of this rank's contiguous shard of images 0 .. n-1: whole
    batches of one process's, so that every image is generated and extracted in the batch it is in one process (found
    from outside: a score logged under torchrun differed in the last digits from one process's, and from `eval`'s)."""
    if batch_size < 1:
        raise BigbatchError(f"batch_size must be positive, got {batch_size}")
    world = td.get_world_size() if dist.active() else 1
    rank = td.get_rank() if dist.active() else 0
    batches = -(-n // batch_size)
    per = -(-batches // world) * batch_size
    return world, min(rank * per, n), min((rank + 1) * per, n), per


def _collective_device() -> torch.device:
    """Where tensors must be for a collective: NCCL takes only CUDA tensors, gloo CPU ones."""
    return torch.device("cuda", torch.cuda.current_device()) if td.get_backend() == "nccl" else torch.device("cpu")
