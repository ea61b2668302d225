"""The kernels a training run asks for, for its length, the caller's own settings back after it (a library
call leaves the process's global state as it found it): PyTorch's deterministic ones (train.deterministic),
or else cuDNN's autotuned ones."""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from bigbatch.errors import warn

# cuBLAS's setting for reproducible results (CUDA >= 10.2): a fixed workspace per handle. PyTorch reads it
# when it makes its first cuBLAS workspace, and refuses cuBLAS calls in deterministic mode without it.
CUBLAS_WORKSPACE = ":4096:8"
REPRODUCIBLE_WORKSPACES = (":4096:8", ":16:8")


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """The host's global generator seeded with `seed` inside (models are built and initialised there), and put
    back after. Not torch.manual_seed: it seeds every GPU's generator too, for good (or at CUDA's start, where it
    has not started yet), which fork_rng(devices=[]) does not undo (found from outside: load_generator, sample and
    eval reset a user's CUDA draws to the run's train.seed)."""
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(seed)
        yield


def seed_micro_batches(rep: Any, seed: int) -> None:
    """Before each micro-batch's forward of a training step on Replicator `rep`, the global generators (torch's, the
    host's and the step's GPU's; NumPy's and Python's) seeded from `seed`, the steps each optimizer has taken and
    the micro-batch's place in the step over every rank: what a model draws from them (nn.Dropout, drop path, a
    user's family) is the same on a rerun, after a resume, and on any number of processes that keeps the
    micro-batch (found from outside: a user's family with dropout trained other weights on every run, each
    process's generator seeded at random; its NumPy and Python draws, unseeded)."""

    def seed_before(index: int) -> None:
        plan = None if rep.micro_batch_pending else rep.plan  # (a probe: micro-batch 0 of its size)
        place = index if plan is None else rep.rank * plan.accumulation + index
        keys = (seed, *(state.steps for state in rep.optimizers.values()), place)
        drawn = _keyed(*keys)
        torch.random.default_generator.manual_seed(drawn)
        # A family's NumPy and Python draws too (found from outside: left unseeded), each of its own seed (found by
        # review: NumPy's Mersenne Twister seeded as torch's CPU one drew the same bits).
        np.random.seed(_keyed(*keys, "numpy") & 0xFFFFFFFF)
        random.seed(_keyed(*keys, "python"))
        if rep.device.type == "cuda":
            torch.cuda.default_generators[torch.cuda._utils._get_device_index(rep.device, True)].manual_seed(drawn)

    rep.on_micro_batch(seed_before)


def _keyed(*keys: object) -> int:
    """A seed of 63 bits decided by `keys` alone."""
    return int.from_bytes(hashlib.blake2b(repr(keys).encode(), digest_size=8).digest(), "little") >> 1


@contextmanager
def global_rngs_kept(device: torch.device) -> Iterator[None]:
    """The global generators (torch's, the host's and `device`'s; Python's and NumPy's, which a resume sets from its
    checkpoint) as they were before, once left: what a library call that trains (which seeds them before each
    micro-batch, `seed_micro_batches`) or evaluates owes its caller."""
    python, numpy = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)


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


@contextmanager
def run_kernels(deterministic: bool, autotune: bool) -> Iterator[None]:
    """While it is entered: `deterministic_kernels` (train.deterministic); else, if `autotune`, cuDNN's
    autotuning (cudnn.benchmark): for each new input shape cuDNN times its convolution algorithms once and
    keeps the fastest, as timm's, StyleGAN2-ADA's and NVIDIA's training scripts have it (PyTorch's default is
    off: a heuristic pick). Results then differ in the last bits from run to run, as the atomics of CUDA's
    backward kernels already make them. Not under a memory budget (`autotune` False): the trials' workspaces
    would go past the memory the batch plan was made for."""
    if deterministic or not autotune:
        with deterministic_kernels(deterministic):
            yield
        return
    with cudnn_autotuning(True):
        yield


@contextmanager
def cudnn_autotuning(on: bool) -> Iterator[None]:
    """cudnn.benchmark set to `on` while it is entered, the caller's setting back after."""
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = on
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = saved
