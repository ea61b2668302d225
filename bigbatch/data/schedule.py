"""Data schedules counted in images seen: phases of resolution and batch size (progressive resizing,
dynamic batch size) and aspect-ratio buckets for rectangular images (batches of one shape each)."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bigbatch.config import Config, register_check
from bigbatch.config_types import MAX_RESOLUTION
from bigbatch.data.streams import ORDER, generator
from bigbatch.errors import BigbatchError

# Width / height of the buckets that `prepare(..., buckets=True)` sorts rectangular images into:
# the common photo and video shapes, portrait and landscape.
BUCKET_RATIOS = (1 / 2, 9 / 16, 2 / 3, 3 / 4, 1.0, 4 / 3, 3 / 2, 16 / 9, 2.0)


@dataclass(frozen=True)
class Phase:
    """From `start` images seen on, steps use `batch` images at `resolution` px (the side of a square
    image; for rectangular buckets, the side of the square of the same area; 0: data.resolution). `lr`: the
    learning rate at the phase's first and last step (linear between), for a task that takes it."""

    start: int
    resolution: int
    batch: int
    lr: tuple[float, float] | None = None


class Schedule:
    """Phases by images seen. A phase takes effect at the first step that starts at or after its
    `start`, so the step sequence (and a resumed run's position) depends only on images seen."""

    def __init__(self, phases: Sequence[Phase]):
        if not phases:
            raise BigbatchError("a schedule needs at least one phase")
        if phases[0].start != 0:
            later = next((i for i, p in enumerate(phases) if p.start == 0), None)
            if later is not None:  # (found from outside: "must start at 0" of a schedule that has a phase at 0)
                raise BigbatchError(
                    f"a schedule's phases go in the order they start: phase {later} starts at 0 kimg and phase 0 at "
                    f"{phases[0].start / 1000:g}; list them by kimg"
                )
            raise BigbatchError(f"the first phase of a schedule must start at 0 images, got {phases[0].start}")
        for i, p in enumerate(phases):
            if p.resolution > MAX_RESOLUTION:  # (found from outside: a typo of 100000 passed --dry-run, then ran out
                raise BigbatchError(  # of memory, exit 1, advising a smaller micro-batch)
                    f"phase {i} trains at {p.resolution} px, past the {MAX_RESOLUTION} px any resolution may be: fix "
                    "data.schedule"
                )
            if p.resolution < 0 or 0 < p.resolution < 4 or p.batch < 1:  # (found from outside: 1 px trained)
                raise BigbatchError(
                    f"phase {i} needs a resolution of at least 4 px (0: data.resolution) and a batch >= 1, got "
                    f"resolution {p.resolution} and batch {p.batch} from {p.start / 1000:g} kimg"
                )
            if i and p.start <= phases[i - 1].start:
                raise BigbatchError(f"phase {i} must start after phase {i - 1} ({p.start} <= {phases[i - 1].start})")
        if len({p.lr is None for p in phases}) > 1:
            raise BigbatchError("either every phase of a schedule gives an lr or none does")
        self.phases = tuple(phases)
        # Step starts at which each phase actually begins (the first step at or after its start).
        self._begins = [0]
        for prev, p in zip(self.phases, self.phases[1:]):
            b0 = self._begins[-1]
            self._begins.append(b0 + math.ceil((p.start - b0) / prev.batch) * prev.batch)

    def begins(self) -> list[int]:
        """The images seen at which each phase's first step starts."""
        return list(self._begins)

    @classmethod
    def constant(cls, resolution: int, batch: int) -> Schedule:
        return cls([Phase(0, resolution, batch)])

    @classmethod
    def parse(cls, spec: Sequence[Mapping] | str, name: str = "data.schedule", base_batch: int = 0) -> Schedule:
        """Phases from a list of {kimg or nimg, resolution, batch[, lr]} (TOML array of tables) or
        from a string "KIMG:RES:BATCH[:LR[:LR_END]],..." (for command-line overrides). A phase that
        leaves out resolution or batch keeps the previous phase's; lr is one rate or [start, end]. A batch
        written "2x" is that multiple of `base_batch` (train.batch), so the phases follow a batch sweep."""
        if isinstance(spec, str):
            items = []
            for part in filter(None, (s.strip() for s in spec.split(","))):
                fields = part.split(":")
                if not 3 <= len(fields) <= 5:
                    raise BigbatchError(
                        f"{name}: '{part}' is not KIMG:RESOLUTION:BATCH[:LR[:LR_END]], e.g. '0:64:512,100:128:256'"
                    )
                item: dict = dict(zip(("kimg", "resolution", "batch"), fields))
                if len(fields) > 3:
                    item["lr"] = fields[3:]
                items.append(item)
        else:
            items = list(spec)
        phases: list[Phase] = []
        for i, item in enumerate(items):
            where = f"{name}[{i}]"
            if not isinstance(item, Mapping):
                raise BigbatchError(f"{where} must be a table of kimg/nimg, resolution, batch; got {item!r}")
            unknown = set(item) - {"kimg", "nimg", "resolution", "batch", "lr"}
            if unknown:
                raise BigbatchError(
                    f"{where}: unknown keys {sorted(unknown)}; valid: kimg or nimg, resolution, batch, lr"
                )
            if ("kimg" in item) == ("nimg" in item):
                raise BigbatchError(f"{where} needs exactly one of kimg or nimg (when the phase starts)")
            start = round(_number(item.get("kimg"), where, "kimg") * 1000) if "kimg" in item else None
            start = _integer(item["nimg"], where, "nimg") if start is None else start
            prev = phases[-1] if phases else None
            values = {}
            for key in ("resolution", "batch"):
                if key == "batch" and isinstance(item.get(key), str) and item[key].strip().endswith("x"):
                    values[key] = _multiple(item[key], base_batch, where)
                elif key in item:
                    values[key] = _integer(item[key], where, key)
                elif prev is None:
                    raise BigbatchError(f"{where}: the first phase needs a {key}")
                else:
                    values[key] = getattr(prev, key)
            phases.append(Phase(start, values["resolution"], values["batch"], _lr_range(item.get("lr"), where)))
        return cls(phases)

    def to_list(self) -> list[dict]:
        """The phases as plain tables (nimg, resolution, batch[, lr]), e.g. for a saved config."""
        return [
            {"nimg": p.start, "resolution": p.resolution, "batch": p.batch} | ({"lr": list(p.lr)} if p.lr else {})
            for p in self.phases
        ]

    def phase_at(self, nimg: int) -> Phase:
        """The phase of the step that starts at `nimg` images seen."""
        i = 0
        while i + 1 < len(self.phases) and self._begins[i + 1] <= nimg:
            i += 1
        return self.phases[i]

    def align(self, nimg: int) -> int:
        """The first step start at or after `nimg` (a resumed run must be at one: `align(n) == n`)."""
        i = 0
        while i + 1 < len(self.phases) and self._begins[i + 1] <= nimg:
            i += 1
        b0, batch = self._begins[i], self.phases[i].batch
        step = b0 + math.ceil((nimg - b0) / batch) * batch
        return min(step, self._begins[i + 1]) if i + 1 < len(self.phases) else step

    def end(self, total: int, per_iteration: int = 1) -> int:
        """The images seen when a run of `total` images stops: at the end of its first iteration (of
        `per_iteration` steps: a GAN's d_steps) that reaches `total`, which may pass it by part of an iteration."""
        nimg = 0
        while nimg < total:
            if nimg >= self._begins[-1]:  # the last phase's iterations all alike
                size = self.phases[-1].batch * per_iteration
                return nimg + math.ceil((total - nimg) / size) * size
            for _ in range(per_iteration):
                nimg += self.phase_at(nimg).batch
        return nimg

    def steps(self, start: int = 0) -> Iterator[tuple[int, Phase]]:
        """Endless (nimg, phase) of each step from `start`, which must be a step start."""
        if self.align(start) != start:
            raise BigbatchError(
                f"{start} images seen is not the start of a step of this schedule (next: {self.align(start)}); "
                "resume from a checkpoint written with the same schedule"
            )
        nimg = start
        while True:
            phase = self.phase_at(nimg)
            yield nimg, phase
            nimg += phase.batch


PHASES_REPLACE = ("lr", "lr_steps", "lr_gamma")
"""The train keys a schedule whose phases give learning rates leaves unread (a classifier's)."""


def schedule_of(cfg: Config) -> Schedule:
    """The schedule a config trains with: data.schedule's phases, the first defaulting to train.batch at
    data.resolution; without data.schedule, one phase of train.batch."""
    spec = cfg.data.schedule
    if not spec:
        return Schedule.constant(cfg.data.resolution, cfg.train.batch)
    if isinstance(spec, list):
        first = {"resolution": cfg.data.resolution, "batch": cfg.train.batch, **spec[0]}
        if "kimg" not in first and "nimg" not in first:
            first["nimg"] = 0
        spec = [first, *spec[1:]]
    try:
        return Schedule.parse(spec, base_batch=cfg.train.batch)
    except BigbatchError as e:
        key, sep, rest = str(e).partition(": ")
        if not (sep and key.startswith("data.schedule")):
            key, rest = "data.schedule", str(e)
        raise BigbatchError(f"config key '{key}': {rest}") from None


def phase_trained(cfg: Config, nimg: int) -> Phase:
    """The phase of the last step before `nimg` images seen: what a checkpoint at `nimg` last trained at."""
    return schedule_of(cfg).phase_at(max(0, nimg - 1))


def phase_sides(cfg: Config) -> list[int]:
    """The sides the run's phases train at, smallest first (a phase of resolution 0: data.resolution's)."""
    return sorted({p.resolution or cfg.data.resolution for p in schedule_of(cfg).phases})


def resolution_trained(cfg: Config, nimg: int) -> int:
    """The resolution a checkpoint at `nimg` images seen last trained at."""
    return phase_trained(cfg, nimg).resolution or cfg.data.resolution


def resolution_scored(cfg: Config, nimg: int) -> int:
    """The side a classifier's checkpoint at `nimg` images seen is scored, and predicts, at: eval.resolution, else
    the resolution it last trained at."""
    return cfg.eval.resolution or resolution_trained(cfg, nimg)


@register_check("")
def _check_phases(cfg: Config) -> None:
    """Every phase parses. How each phase's batch splits into micro-batches depends on the number of
    processes (a micro_batch above a process's share is the share): batching.check_schedule checks it
    at start-up, before anything is written."""
    schedule_of(cfg)


def _number(value: object, where: str, key: str) -> float:
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise BigbatchError(f"{where}: {key} must be a number, got {value!r}") from None
    if not math.isfinite(out) or out < 0:
        raise BigbatchError(f"{where}: {key} must be a finite number >= 0, got {value!r}")
    return out


def _lr_range(value: object, where: str) -> tuple[float, float] | None:
    """A phase's lr: one rate (constant) or [start, end]."""
    if value is None:
        return None
    rates = list(value) if isinstance(value, (list, tuple)) else [value]
    if not 1 <= len(rates) <= 2:
        raise BigbatchError(f"{where}: lr must be one rate or [start, end], got {value!r}")
    start, end = (_number(r, where, "lr") for r in (rates * 2)[:2])
    return start, end


def _multiple(value: str, base_batch: int, where: str) -> int:
    """A phase's batch written as a multiple of train.batch ("2x", "1.75x")."""
    try:
        factor = float(value.strip()[:-1])
    except ValueError:
        raise BigbatchError(
            f"{where}: batch must be a whole number or a multiple of train.batch like '2x', got {value!r}"
        ) from None
    if not base_batch:
        raise BigbatchError(f"{where}: batch {value!r} is a multiple of train.batch, which is not known here")
    batch = factor * base_batch
    if not (math.isfinite(batch) and batch >= 1 and batch.is_integer()):
        raise BigbatchError(
            f"{where}: batch {value!r} of train.batch={base_batch} is {batch:g} images, not a whole number >= 1; "
            "choose a train.batch that it multiplies to a whole number"
        )
    return int(batch)


def _integer(value: object, where: str, key: str) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise BigbatchError(f"{where}: {key} must be a whole number, got {value!r}")
    try:
        out = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise BigbatchError(f"{where}: {key} must be a whole number, got {value!r}") from None
    if out < 0:
        raise BigbatchError(f"{where}: {key} must be >= 0, got {value!r}")
    return out


def target_shape(height: int, width: int, resolution: int, multiple: int = 1) -> tuple[int, int]:
    """(h, w) with the aspect ratio of height x width and about resolution**2 pixels, each a multiple of
    `multiple`; a square image gives (resolution, resolution)."""
    if height == width:
        return resolution, resolution
    ratio = width / height
    h = max(multiple, round(resolution / math.sqrt(ratio) / multiple) * multiple)
    w = max(multiple, round(resolution * math.sqrt(ratio) / multiple) * multiple)
    return h, w


def resize_batch(images: torch.Tensor, resolution: int) -> torch.Tensor:
    """uint8 NHWC images resized to `resolution` (rectangular ones keep their aspect ratio, about the
    same area), bicubic with antialiasing as in the built-in data sets; unchanged if already there."""
    n, h, w, c = images.shape
    size = target_shape(h, w, resolution)
    if size == (h, w):
        return images
    x = images.permute(0, 3, 1, 2).float()
    x = F.interpolate(x, size=size, mode="bicubic", align_corners=False, antialias=True)
    return x.clamp(0, 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def resize_stored(images: torch.Tensor, resolution: int) -> torch.Tensor:
    """resize_batch's resize of uint8 NHWC images on the CPU, as the loader reads a store below its size, in
    PyTorch's uint8 kernel, as the loader's crops of encoded images are (codecs.resize): each pass in fixed point,
    rounded and clamped between them, as Pillow computes it. 19x the float kernel's speed (found from outside: a
    raw store read at half its size, as a progressive resize's early phases read it, ran 1.4 ms an image from 256
    px, slower than a JPEG store's reduced decode); within a level of resize_batch's but at rare hard edges."""
    n, h, w, c = images.shape
    size = target_shape(h, w, resolution)
    if size == (h, w):
        return images
    x = F.interpolate(images.permute(0, 3, 1, 2), size=size, mode="bicubic", align_corners=False, antialias=True)
    return x.permute(0, 2, 3, 1).contiguous()  # (a channels-last view in: the kernel's fast path)


def bucket_shapes(
    resolution: int, ratios: Sequence[float] = BUCKET_RATIOS, multiple: int | None = None
) -> list[tuple[int, int]]:
    """Distinct (h, w) of the aspect-ratio buckets at `resolution`, portrait to landscape: about
    resolution**2 pixels, sides multiples of `multiple` (default 8, less below 64 px so that small
    buckets keep their shape). Images are cropped to a bucket's own h:w, never stretched."""
    multiple = multiple or max(1, min(8, resolution // 8))
    shapes = {target_shape(1000, round(1000 * r), resolution, multiple) for r in ratios}
    return sorted(shapes, key=lambda s: s[1] / s[0])


def nearest_bucket(width: int, height: int, ratios: Sequence[float] = BUCKET_RATIOS) -> int:
    """Index of the bucket whose aspect ratio is nearest to width / height (on a log scale, so that
    portrait and landscape are treated alike)."""
    r = math.log(width / height)
    return min(range(len(ratios)), key=lambda i: abs(math.log(ratios[i]) - r))


class BucketOrder:
    """Endless data order for a data set stored as buckets (global indices bucket by bucket, `counts`
    each) in which every batch of `batch` images comes from one bucket.

    Epoch e shuffles each bucket, cuts it into batches (the last one topped up from the bucket's
    start) and shuffles the batches, all from `seed` and e. The same `indices(start, count)` call as
    GlobalOrder: position p lies in batch p // batch, so a rank's share comes from one batch and
    resuming needs only the images seen. The batch size is fixed for the whole order."""

    def __init__(self, counts: Sequence[int], batch: int, seed: int):
        if batch < 1 or not counts or min(counts) < 0 or sum(counts) == 0:
            raise BigbatchError(f"a bucketed order needs batch >= 1 and non-empty buckets, got {batch}, {counts}")
        self.counts, self.batch, self.seed = list(counts), batch, seed
        self.starts = [sum(self.counts[:i]) for i in range(len(self.counts))]
        self.per_epoch = sum(math.ceil(n / batch) for n in self.counts)
        self._epochs: OrderedDict[int, torch.Tensor] = OrderedDict()

    def _epoch(self, e: int) -> torch.Tensor:
        if e not in self._epochs:
            batches = []
            for b, (start, n) in enumerate(zip(self.starts, self.counts)):
                if n == 0:
                    continue
                perm = torch.randperm(n, generator=generator(self.seed, ORDER, e, b + 1)) + start
                k = math.ceil(n / self.batch)
                batches.append(perm.repeat(math.ceil(k * self.batch / n))[: k * self.batch].view(k, self.batch))
            all_batches = torch.cat(batches)
            self._epochs[e] = all_batches[torch.randperm(len(all_batches), generator=generator(self.seed, ORDER, e, 0))]
            if len(self._epochs) > 2:
                self._epochs.popitem(last=False)
        return self._epochs[e]

    def indices(self, start: int, count: int) -> torch.Tensor:
        """Data indices of the images at global positions start .. start + count - 1 (within one batch)."""
        k, offset = divmod(start, self.batch)
        if offset + count > self.batch:
            raise BigbatchError(
                f"positions {start}..{start + count - 1} span two batches of {self.batch}: a bucketed order is read "
                "one batch (or one rank's share of it) at a time"
            )
        e, j = divmod(k, self.per_epoch)
        return self._epoch(e)[j, offset : offset + count].clone()
