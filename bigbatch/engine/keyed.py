"""Random streams keyed by numbers, not by the process or its history: the same draws for the same keys on any rank,
after any resume (bigbatch.data.streams' streams, an input function's per-step generator)."""

from __future__ import annotations

import numpy as np
import torch


def generator(seed: int, *keys: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch.Generator whose stream depends only on `seed` and the non-negative integer `keys`."""
    state = np.random.SeedSequence([seed & 0xFFFFFFFFFFFFFFFF, *keys]).generate_state(1, np.uint64)[0]
    return torch.Generator(device=device).manual_seed(int(state))
