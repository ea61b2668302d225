"""train.deterministic: PyTorch's deterministic kernels for the length of a training run, the caller's own
settings back after it (a library call leaves the process's global state as it found it)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from bigbatch.errors import warn

# cuBLAS's setting for reproducible results (CUDA >= 10.2): a fixed workspace per handle. PyTorch reads it
# when it makes its first cuBLAS workspace, and refuses cuBLAS calls in deterministic mode without it.
CUBLAS_WORKSPACE = ":4096:8"
REPRODUCIBLE_WORKSPACES = (":4096:8", ":16:8")


@contextmanager
def deterministic_kernels(on: bool) -> Iterator[None]:
    """While it is entered (`on`): torch.use_deterministic_algorithms(True), cuDNN's deterministic
    algorithms without autotuning (cudnn.benchmark off), and CUBLAS_WORKSPACE_CONFIG set, unless the
    environment sets a reproducible one already. Entered before the training process touches its device."""
    if not on:
        yield
        return
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
    )
    workspace = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if workspace not in REPRODUCIBLE_WORKSPACES:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            # (this process used CUDA before: cuBLAS may have sized its workspace already)
            warn(
                f"train.deterministic: CUDA was in use before the run set CUBLAS_WORKSPACE_CONFIG={CUBLAS_WORKSPACE}; "
                "for matrix products to the bit, set it in the environment before the process starts"
            )
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[2:]
        if workspace is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = workspace
