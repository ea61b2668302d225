"""Random streams and data order defined by global indices, never by rank or process.

Every random draw in training comes from `generator(seed, stream, *indices)`, so the same micro-batch
gets the same images, labels, z and flips whether it runs on rank 0 of 1 or rank 3 of 8, and a
resumed run draws exactly what the uninterrupted run would have.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import torch

from bigbatch.engine.keyed import generator

# Stream tags: one per kind of draw, so that streams never overlap.
# (7 was the crops a classifier cut from decoded squares itself: the loader cuts them all now, by RRC's draws.)
ORDER, Z_D, Z_G, FLIP, SAMPLE, VAL_SPLIT, ORDER_B, WARP, LR_DROPOUT, COLOUR = 1, 2, 3, 4, 5, 6, 8, 9, 10, 11
RRC = 12  # random-resized crops of the images as stored (whole or squares), drawn before decoding
AUG_D, AUG_G = 13, 14  # a GAN's differentiable augmentation of D's inputs (D step, G step)
PATH_LENGTH = 15  # the random images of path length regularization (a salt of `row_seeds`, per image)
MIX = 16  # a classifier's mixup and CutMix draws, per pair of neighbouring images of a step
RAND_AUG = 17  # a classifier's RandAugment draws, per image of a step
ERASE = 18  # a classifier's random erasing, per image of a step
UNIFORM_YAW = 19  # the swap task's order of faces by yaw bins (swap.uniform_yaw)
XSEG_AUG = 20  # the xseg task's augmentation draws, per step (tasks/xseg/augment.py)
CR = 21  # a GAN's consistency regularization: its transforms and nearby latents, per step (tasks/gan/consistency.py)
GP = 22  # a GAN's gradient penalty: the mixes of real and fake images it is taken at, per step (train.gp)


T = TypeVar("T")
_POOLS: dict[int, ThreadPoolExecutor] = {}  # by size: torch's intra-op threads
_POOL_LOCK = threading.Lock()
ROW_THREADS_FROM = 1 << 15  # numbers a row: below, a thread's hand-over costs more than the row's draws


def per_row(seeds: list[int], draw: Callable[[int, torch.Generator], T], numbers: int) -> list[T]:
    """`draw(i, g)` for each row i, g a CPU generator seeded with seeds[i], in threads where each row draws enough
    `numbers` to pay for them: torch's samplers let go of the GIL, and each row's stream is its own, so the same
    draws as one after another (StyleGAN2's noise images, 11M numbers a batch of 64 at 256 px, took 70-90 ms
    a forward on one core of this project's CPU: bench/host_ops.py)."""
    threads = torch.get_num_threads()  # (torchrun's ranks on one node: 1 each)

    def row(i: int) -> T:
        return draw(i, torch.Generator().manual_seed(seeds[i]))

    if len(seeds) < 2 or numbers < ROW_THREADS_FROM or threads < 2:
        return [row(i) for i in range(len(seeds))]
    with _POOL_LOCK:
        if threads not in _POOLS:
            _POOLS[threads] = ThreadPoolExecutor(threads, thread_name_prefix="bigbatch-draws")
    return list(_POOLS[threads].map(row, range(len(seeds))))


def host_rows(n: int, size: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """An empty (n, *size) float32 tensor on the host for rows drawn there, in pinned memory when they go to a
    CUDA device (copied with non_blocking=True: the host does not wait for the device's queue)."""
    return torch.empty((n, *size), pin_memory=device.type == "cuda")


def row_seeds(t: torch.Tensor, salt: int = 0) -> list[int]:
    """A 63-bit seed per row of `t` from its float32 bytes (and `salt`): a sample's own randomness keyed
    by its latent, the same whatever samples share its batch, on any device."""
    rows = np.ascontiguousarray(t.detach().to("cpu", torch.float32).flatten(1).numpy())
    key = salt.to_bytes(8, "little")
    return [int.from_bytes(hashlib.blake2b(r.tobytes(), digest_size=8, key=key).digest(), "little") >> 1 for r in rows]


class GlobalOrder:
    """Endless data order: position p (counted in images shown) maps to image perm_e[p mod N],
    where e = p // N and perm_e is a seeded permutation, so resuming needs only the images seen.
    `stream` tells apart the orders of several data sets read side by side (ORDER, ORDER_B)."""

    def __init__(self, n: int, seed: int, stream: int = ORDER):
        self.n, self.seed, self.stream = n, seed, stream
        self._perms: OrderedDict[int, torch.Tensor] = OrderedDict()

    def _perm(self, epoch: int) -> torch.Tensor:
        if epoch not in self._perms:
            self._perms[epoch] = torch.randperm(self.n, generator=generator(self.seed, self.stream, epoch))
            if len(self._perms) > 2:
                self._perms.popitem(last=False)
        return self._perms[epoch]

    def indices(self, start: int, count: int) -> torch.Tensor:
        """Data indices of the images at global positions start, ..., start + count - 1."""
        pos = torch.arange(start, start + count)
        epochs = pos // self.n
        out = torch.empty(count, dtype=torch.long)
        for e in epochs.unique().tolist():
            mask = epochs == e
            out[mask] = self._perm(e)[pos[mask] % self.n]
        return out


YAW_BINS = 128  # DFL's uniform_yaw: bins of yaw over YAW_RANGE (SampleGeneratorFace's 128 "grads")
YAW_RANGE = (-1.0, 1.0)  # the yaw measure's range (bigbatch.data.dfl_faces.face_yaw: facing sideways at +-1)


class YawOrder:
    """Endless data order of faces spread evenly over their yaw, DeepFaceLab's uniform_yaw: the faces in
    YAW_BINS bins of yaw over YAW_RANGE (those past it in the end bins), each round of positions takes every
    bin that holds faces once, in a seeded order, and each bin gives its faces in seeded permutations, one
    after another (DFL's Index2DHost: a shuffled pass over the bins, then over a bin's faces). Position p is in
    round r = p // B (B bins with faces) and takes the r-th face of its bin, so, as GlobalOrder, the order
    depends only on the seed and the position (resuming needs only the images seen; any rank count)."""

    def __init__(self, yaws: np.ndarray, seed: int, stream: int = ORDER):
        yaws = np.asarray(yaws, np.float64)
        if not len(yaws) or not np.isfinite(yaws).all():
            raise ValueError("YawOrder needs a finite yaw for each of at least one face")
        edges = np.linspace(*YAW_RANGE, YAW_BINS + 1)[1:-1]
        which = np.digitize(yaws, edges)
        self.bins = [torch.from_numpy(np.flatnonzero(which == b)) for b in np.unique(which)]
        self.seed, self.stream = seed, stream
        self._perms: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()

    def _perm(self, n: int, *keys: int) -> torch.Tensor:
        if keys not in self._perms:
            self._perms[keys] = torch.randperm(n, generator=generator(self.seed, self.stream, UNIFORM_YAW, *keys))
            if len(self._perms) > 4 * len(self.bins) + 8:
                self._perms.popitem(last=False)
        return self._perms[keys]

    def indices(self, start: int, count: int) -> torch.Tensor:
        """Data indices of the faces at global positions start, ..., start + count - 1."""
        b = len(self.bins)
        out = torch.empty(count, dtype=torch.long)
        for i, p in enumerate(range(start, start + count)):
            r = p // b
            k = int(self._perm(b, 0, r)[p % b])  # the bin, then its face of round r
            n = len(self.bins[k])
            out[i] = self.bins[k][self._perm(n, 1, k, r // n)[r % n]]
        return out
