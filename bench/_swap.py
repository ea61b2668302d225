"""Shared by the benchmarks: a swap task (DeepFaceLab's SAEHD) from a preset, on a small synthetic data
file of faces (random RGB and an elliptic face mask, 4 channels) written to a temporary folder, built
as `bigbatch.train` builds it (`build_task`), so the benchmarks measure what training runs.

    with synthetic_faces(cfg) as cfg:        # data.path and data.dst_path point at the file
        task, rep = swap_task(cfg, precision="bf16", checkpointing=True)
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from _gan import as_trained
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

import bigbatch
from bigbatch.batching import replicator_for
from bigbatch.config import Config
from bigbatch.data.h5write import H5Writer
from bigbatch.data.load import load_data
from bigbatch.data.schedule import schedule_of
from bigbatch.tasks import Feed, build_task
from bigbatch.tasks.swap.task import SwapTask


def write_faces(path: Path, resolution: int, n: int = 16, channels: int = 4, seed: int = 0) -> Path:
    """`n` random faces of `resolution` px as a DATA.h5: RGB noise, then (channels >= 4) a face mask
    (an ellipse, 255 inside) and (channels 5) an eyes-and-mouth region (a band across it)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[:resolution, :resolution] / resolution - 0.5
    mask = ((x / 0.35) ** 2 + (y / 0.45) ** 2 <= 1).astype(np.uint8) * 255
    eyes_mouth = (((np.abs(y + 0.1) < 0.06) | (np.abs(y - 0.2) < 0.05)) & (np.abs(x) < 0.25)).astype(np.uint8) * 255
    extra = [mask, eyes_mouth][: max(0, channels - 3)]
    with H5Writer(str(path), ["face"], {"source": "synthetic faces", "bigbatch_version": bigbatch.__version__}) as w:
        for _ in range(n):
            rgb = rng.integers(0, 256, (resolution, resolution, 3), dtype=np.uint8)
            w.add(np.concatenate([rgb, *(e[..., None] for e in extra)], axis=-1), 0)
        w.commit()
    return path


@contextmanager
def synthetic_faces(cfg: Config, n: int = 16, channels: int = 4) -> Iterator[Config]:
    """`cfg` with data.path and data.dst_path at synthetic faces of its resolution (src and dst drawn
    apart), no held-out split and no data workers; the files are removed on exit."""
    with tempfile.TemporaryDirectory(prefix="bigbatch-bench-swap-") as tmp:
        res = cfg.data.resolution
        src = write_faces(Path(tmp) / "src.h5", res, n, channels, seed=0)
        dst = write_faces(Path(tmp) / "dst.h5", res, n, channels, seed=1)
        yield cfg.override(
            {  # (nothing held out, so nothing scored: saehd_cpu's evaluations refused the faces)
                "data.path": str(src),
                "data.dst_path": str(dst),
                "data.val_fraction": 0.0,
                "data.workers": 0,
                "eval.every_kimg": 0.0,
            }
        )


def swap_task(cfg: Config, **train: object) -> tuple[SwapTask, bigbatch.Replicator]:
    """The swap task of `cfg` (data at synthetic faces) with these train.* settings changed (e.g.
    precision="bf16", checkpointing=True, micro_batch=8), and its Replicator."""
    cfg = as_trained(cfg.override({f"train.{k}": v for k, v in train.items()}))
    rep = replicator_for(cfg)
    data = load_data(cfg.data.path, cfg.data.resolution)
    return build_task(cfg, rep, data), rep


def swap_feed(task: SwapTask, rep: bigbatch.Replicator) -> Feed:
    """The real images, step after step, as the training loop reads them (src, and dst beside it)."""
    return Feed(task.src, schedule_of(task.cfg), rep, task.cfg)


def optimizers(task: SwapTask) -> list[torch.optim.Optimizer]:
    """Every optimizer the swap task steps: the autoencoder's, then each discriminator's that is on."""
    return [task.opt, *(d[2] for d in task.discs.values())]


def is_swap(cfg: Config) -> bool:
    return cfg.task == "swap"


# The kernels CPUs without native bf16 run orders of magnitude slower in bf16 than in fp32 (AVX2: torch
# falls back to scalar code, 0.1-3 GFLOP/s against 25 in fp32 on one core).
HEAVY = {
    torch.ops.aten.convolution.default,
    torch.ops.aten.convolution_backward.default,
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
}


class Fp32Kernels(TorchDispatchMode):
    """Runs the heavy bf16 kernels (convolutions, matmuls, their backward) in fp32 and rounds their
    outputs to bf16: the same ops, the same bf16 outputs, only the arithmetic in between differs. For
    counting a bf16 probe's peak (CPUPeak) on a CPU without native bf16: entered outside the counter,
    so the counter sees each op and its bf16 output as with native kernels, and not the fp32 copies
    made here. Not for timing."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if func not in HEAVY or not any(t.dtype == torch.bfloat16 for t in leaves):
            return func(*args, **kwargs)

        def up(t: object) -> object:
            return t.float() if isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 else t

        def down(t: object) -> object:
            return t.to(torch.bfloat16) if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t

        return tree_map(down, func(*tree_map(up, args), **tree_map(up, kwargs)))
