"""Shared by the benchmarks: a GAN task from a config, on synthetic images (no data set to read), built
as `bigbatch.train` builds it (`build_task`), so the benchmarks measure what training runs."""

from __future__ import annotations

import torch

import bigbatch
from bigbatch.batching import replicator_for
from bigbatch.config import Config, parse_override
from bigbatch.data.images import ImageData
from bigbatch.tasks import build_task
from bigbatch.tasks.gan.task import GANTask


def config(preset: str, overrides: list[str]) -> Config:
    return bigbatch.preset(preset).override(dict(parse_override(o) for o in overrides))


def synthetic(cfg: Config, n_classes: int, n: int = 512) -> ImageData:
    g = torch.Generator().manual_seed(0)
    r = cfg.data.resolution
    images = torch.randint(0, 256, (n, r, r, 3), dtype=torch.uint8, generator=g)
    labels = torch.randint(max(n_classes, 1), (n,), generator=g)
    return ImageData(images, labels, [str(i) for i in range(max(n_classes, 1))], "synthetic")


# bench/gpu.py's dry run on a CPU without native bf16 kernels trains its parts' bf16 in fp32: the same code at another
# dtype (bf16 is emulated there: its compiles took five times fp32's, 120 of the dry run's 190 CPU seconds).
BF16_AS_FP32 = [False]


def as_trained(cfg: Config) -> Config:
    """`cfg` as this process trains it (BF16_AS_FP32)."""
    return cfg.override({"train.precision": "fp32"}) if BF16_AS_FP32[0] and cfg.train.precision == "bf16" else cfg


def gan_task(cfg: Config, n_classes: int = 10, **train: object) -> tuple[GANTask, bigbatch.Replicator]:
    """The GAN task of `cfg` with these train.* settings changed (e.g. precision="bf16"), and its Replicator."""
    cfg = as_trained(cfg.override({f"train.{k}": v for k, v in train.items()}))
    rep = replicator_for(cfg)
    return build_task(cfg, rep, synthetic(cfg, n_classes)), rep


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
