"""The batch plan: how `train.batch` images per optimizer step are split over processes and micro-batches."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from bigbatch.engine.dist import Context
from bigbatch.errors import BigbatchError, whole_number


@dataclass(frozen=True)
class Plan:
    batch: int
    micro_batch: int
    accumulation: int
    world_size: int
    rank: int
    precision: str
    device: str
    micro_batch_asked: int | None = None  # a micro_batch above a process's share, which was used instead

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("rank")
        if d["micro_batch_asked"] is None:
            d.pop("micro_batch_asked")
        return d

    def describe(self) -> str:
        capped = (
            ""
            if self.micro_batch_asked is None
            else f" (micro_batch {self.micro_batch_asked} asked is more than a process's share: no accumulation)"
        )
        return (
            f"batch {self.batch} = micro_batch {self.micro_batch}{capped} x accumulation {self.accumulation}"
            f" x world_size {self.world_size}; precision {self.precision}; device {self.device}"
        )


def check_batch(batch: object, world_size: int) -> int:
    """A batch is a positive whole number (a NumPy or torch integer too: found from outside, a batch computed with
    NumPy was refused) that the processes share equally: it, as an int; else one line naming what would do."""
    try:
        number: int | None = whole_number("batch", batch, 1)
    except BigbatchError:
        number = None
    if number is not None and number % world_size == 0:
        return number
    fits = ""
    if number is not None:  # (a fresh run takes another batch; a resumed one, whose batch is fixed, another world size)
        divisors = [d for d in range(1, min(number, 64) + 1) if number % d == 0]
        fits = f" (train.batch={-(-number // world_size) * world_size}, or {', '.join(map(str, divisors))} processes)"
    what = "a whole number, " if number is None else ""  # (found from outside: "must be an int" of 63)
    raise BigbatchError(f"batch={batch!r} must be {what}a positive multiple of the world size {world_size}{fits}")


def make_plan(batch: int, micro_batch: int, precision: str, ctx: Context, multiple: int = 1) -> Plan:
    """Check batch = micro_batch x accumulation x world_size and derive the accumulation.

    A micro-batch larger than a process's share of the batch means no accumulation: the share is the
    micro-batch (a micro_batch is a memory cap, so a smaller batch just works). A smaller micro-batch
    must divide the share. `multiple`: what the micro-batch a refusal suggests must be a multiple of (a task's
    pairs of images), where one divides the share."""
    if batch % ctx.world_size:
        raise BigbatchError(
            f"train.batch={batch} is not a multiple of the world size {ctx.world_size}; "
            f"choose a train.batch divisible by {ctx.world_size}"
        )
    share = batch // ctx.world_size
    asked = None
    if micro_batch > share:
        asked, micro_batch = micro_batch, share
    if share % micro_batch:
        per_step = micro_batch * ctx.world_size
        fits = [d for d in range(multiple, micro_batch + 1, multiple) if share % d == 0]  # (the largest is said)
        micro = f"train.micro_batch={fits[-1]}" if fits else f"each process a multiple of {multiple} images"
        raise BigbatchError(
            f"train.batch={batch} is not a multiple of train.micro_batch x world_size = "
            f"{micro_batch} x {ctx.world_size}; give {micro} (a resumed run keeps its batch), or a "
            f"train.batch divisible by {per_step}"
        )
    return Plan(batch, micro_batch, share // micro_batch, ctx.world_size, ctx.rank, precision, str(ctx.device), asked)
