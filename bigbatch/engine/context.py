"""What an input function is given (`Replicator.batches(input_fn)`): this rank's place in each step."""

from __future__ import annotations

from typing import Any

import torch

from bigbatch.engine import keyed
from bigbatch.errors import whole_number


class InputContext:
    """What an input function needs to produce this rank's share of each step. `batch` and `share` are
    read when asked, so after `Replicator.set_batch` (a dynamic-batch schedule) they are the new ones."""

    def __init__(self, rep: Any):  # (the Replicator)
        self._rep = rep

    @property
    def rank(self) -> int:
        return self._rep.rank

    @property
    def world_size(self) -> int:
        return self._rep.world_size

    @property
    def batch(self) -> int:
        """Examples per optimizer step, over all ranks."""
        return self._rep.batch

    @property
    def share(self) -> int:
        """Examples per optimizer step on this rank: batch / world_size, the global positions
        rank * share .. (rank + 1) * share - 1 of each step."""
        return self._rep.share

    @property
    def device(self) -> torch.device:
        return self._rep.device

    @property
    def rows(self) -> slice:
        """This rank's rows of a step's whole batch (`batch` rows): rank * share .. (rank + 1) * share - 1."""
        return slice(self.rank * self.share, (self.rank + 1) * self.share)

    def generator(self, step: int, seed: int = 0) -> torch.Generator:
        """A generator on this rank's device whose draws depend on `seed` and `step` alone, the same on every rank.
        Draw a step's random numbers for its whole batch and keep this rank's `rows` of them, and each example
        gets the same ones whatever the world size and micro-batch, on a rerun and after a resume (what a step
        function draws from torch's global generator changes with the micro-batch and the world size):

            g = ctx.generator(step)
            noise = torch.randn(ctx.batch, *x.shape[1:], generator=g, device=ctx.device)[ctx.rows]

        (Each rank draws the whole batch's numbers: cheap beside a step on a GPU; a CPU and a GPU draw others.)"""
        step = whole_number("ctx.generator takes a step number: its step", step)
        return keyed.generator(whole_number("ctx.generator's seed", seed, -(1 << 63)), step, device=self.device)
