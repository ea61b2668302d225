"""Shared by the benchmarks: a classify task from a config on synthetic images held in memory, built as
`bigbatch.train` builds it (`build_task`), and a feed that hands it the same batch at every step (the
model's rate, no data reading)."""

from __future__ import annotations

import torch
from _gan import as_trained, synthetic

import bigbatch
from bigbatch.batching import replicator_for
from bigbatch.config import Config
from bigbatch.data.loader import Batch
from bigbatch.tasks import build_task
from bigbatch.tasks.classify.task import ClassifyTask


class SameBatch:
    """A stand-in for the Feed that hands out one batch again and again: the model's rate, no data reading."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.images, self.labels, self.nimg = images, labels, 0

    def next(self) -> Batch:
        self.nimg += len(self.images)
        return Batch(self.nimg - len(self.images), self.images, self.labels, None)


def classify_task(cfg: Config, n_classes: int, **train: object) -> tuple[ClassifyTask, bigbatch.Replicator, SameBatch]:
    """The classify task of `cfg` with these train.* settings changed (e.g. precision="bf16"), its
    Replicator, and a feed of one synthetic batch of train.batch images at data.resolution. The preset's
    data.schedule is set aside (one phase: data.resolution at train.batch) and so are its held-out split
    and evaluation (no data files are read)."""
    cfg = as_trained(
        cfg.override(
            {
                **{f"train.{k}": v for k, v in train.items()},
                "data.schedule": [],
                "data.val_path": "",
                "data.val_fraction": 0.0,
                "eval.every_kimg": 0,
            }
        )
    )
    batch = cfg.train.batch
    data = synthetic(cfg, n_classes, n=batch)
    rep = replicator_for(cfg)
    task = build_task(cfg, rep, data)
    images, labels = data.get(torch.arange(batch))
    if rep.device.type == "cuda":  # as the Feed hands them over (copied to the GPU a batch ahead)
        images, labels = images.to(rep.device), labels.to(rep.device)
    return task, rep, SameBatch(images, labels)
