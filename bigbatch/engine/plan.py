"""The batch plan: how `train.batch` images per optimizer step are split over processes and micro-batches."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from bigbatch.engine.dist import Context
from bigbatch.errors import BigbatchError


@dataclass(frozen=True)
class Plan:
    batch: int
    micro_batch: int
    accumulation: int
    world_size: int
    rank: int
    precision: str
    device: str

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("rank")
        return d

    def describe(self) -> str:
        return (
            f"batch {self.batch} = micro_batch {self.micro_batch} x accumulation {self.accumulation}"
            f" x world_size {self.world_size}; precision {self.precision}; device {self.device}"
        )


def make_plan(batch: int, micro_batch: int, precision: str, ctx: Context) -> Plan:
    """Check batch = micro_batch x accumulation x world_size and derive the accumulation."""
    per_step = micro_batch * ctx.world_size
    if batch % per_step:
        raise BigbatchError(
            f"train.batch={batch} is not a multiple of train.micro_batch x world_size = "
            f"{micro_batch} x {ctx.world_size}; choose a train.batch divisible by {per_step} or another micro_batch"
        )
    return Plan(batch, micro_batch, batch // per_step, ctx.world_size, ctx.rank, precision, str(ctx.device))
