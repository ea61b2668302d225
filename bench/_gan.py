"""Shared by the benchmarks: a GAN task from a config, on synthetic images (no data set to read)."""

from __future__ import annotations

import torch

import bigbatch
from bigbatch.config import Config, parse_override
from bigbatch.data.images import ImageData
from bigbatch.tasks.gan.task import GANTask
from bigbatch.train import build_models


def config(preset: str, overrides: list[str]) -> Config:
    return bigbatch.preset(preset).override(dict(parse_override(o) for o in overrides))


def synthetic(cfg: Config, n_classes: int, n: int = 512) -> ImageData:
    g = torch.Generator().manual_seed(0)
    r = cfg.data.resolution
    images = torch.randint(0, 256, (n, r, r, 3), dtype=torch.uint8, generator=g)
    labels = torch.randint(max(n_classes, 1), (n,), generator=g)
    return ImageData(images, labels, [str(i) for i in range(max(n_classes, 1))], "synthetic")


def gan_task(cfg: Config, n_classes: int = 10, **replicator: object) -> tuple[GANTask, bigbatch.Replicator]:
    """A GANTask as `bigbatch.train` builds it, with the Replicator settings of cfg.train (overridable)."""
    t = cfg.train
    settings = dict(
        batch=t.batch,
        micro_batch=t.micro_batch,
        precision=t.precision,
        device=t.device,
        memory_budget=t.memory_budget or None,
        checkpointing=t.checkpointing,
        sn_update=cfg.model.sn_update,
    )
    settings.update(replicator)
    rep = bigbatch.Replicator(**settings)
    data = synthetic(cfg, n_classes)
    G, D = build_models(cfg, n_classes, 3)
    G_train, D_train = rep.prepare(G.train()), rep.prepare(D.train())
    opt_G = rep.wrap_optimizer(torch.optim.Adam(G.parameters(), lr=t.g_lr, betas=t.betas, eps=t.adam_eps), "G")
    opt_D = rep.wrap_optimizer(torch.optim.Adam(D.parameters(), lr=t.d_lr, betas=t.betas, eps=t.adam_eps), "D")
    task = GANTask(rep, G_train, D_train, opt_G, opt_D, data, t.seed, t.loss, cfg.model.conditional, cfg.data.xflip)
    return task, rep


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
