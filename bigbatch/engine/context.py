"""What an input function is given (`Replicator.batches(input_fn)`): this rank's place in each step."""

from __future__ import annotations

from typing import Any

import torch


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
