"""Process and device from the torchrun environment (RANK, LOCAL_RANK, WORLD_SIZE), or one process."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from bigbatch.errors import BigbatchError


@dataclass(frozen=True)
class Context:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, str(default))
    try:
        return int(raw)
    except ValueError:
        raise BigbatchError(f"environment variable {name}={raw!r} must be an integer") from None


def context(device: str = "auto") -> Context:
    """Read rank and world size from the environment and pick the device ("auto", "cpu" or "cuda")."""
    rank, local_rank, world = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0), _env_int("WORLD_SIZE", 1)
    if world < 1 or not 0 <= rank < world or local_rank < 0:
        raise BigbatchError(
            f"RANK={rank}, LOCAL_RANK={local_rank}, WORLD_SIZE={world} are inconsistent; need 0 <= RANK < WORLD_SIZE"
        )
    if device == "cuda" and not torch.cuda.is_available():
        raise BigbatchError("train.device is 'cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    return Context(rank, local_rank, world, dev)
