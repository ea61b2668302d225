"""The metrics' offline feature classifier ("classifier" extractor, fcd), trained by the classify task:
the `convnet` family on the data set's labels (or rotations, for unlabelled data) with AdamW, a 15%
warm-up and cosine decay, through the same task, Feed and Replicator as any classify run."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from bigbatch.config import Config, DataConfig, EvalConfig, ModelConfig, TrainConfig
from bigbatch.data.schedule import schedule_of
from bigbatch.engine import dist
from bigbatch.engine.replicator import Replicator
from bigbatch.metrics.classifier import FEATURE_NET, ClassifierOptions, register_trainer, uses_rotation
from bigbatch.tasks.interface import Feed, build_task


def feature_classifier_config(options: ClassifierOptions, world_size: int, device: str, rotation: bool) -> Config:
    """The classify config the feature classifier is trained with (its batch a multiple of the ranks)."""
    batch = max(options.batch // world_size, 1) * world_size
    kimg = options.steps * batch / 1000
    return Config(
        name="feature-classifier",
        task="classify",
        data=DataConfig(resolution=options.resolution),
        model=ModelConfig(name=FEATURE_NET, ch=options.width),
        train=TrainConfig(
            kimg=kimg,
            batch=batch,
            micro_batch=batch // world_size,
            optimizer="adamw",
            lr=options.lr,
            lr_batch=0,
            betas=(0.9, 0.999),
            weight_decay=0.0,
            warmup_kimg=0.15 * kimg,
            lr_decay="cosine",
            labels="rotation" if rotation else "data",
            seed=options.seed,
            device=device,
        ),
        eval=EvalConfig(every_kimg=0),
    )


def train_feature_classifier(data: Any, options: ClassifierOptions, device: torch.device) -> nn.Module:
    """Train the feature classifier on `data` (all ranks of torchrun together); the plain network."""
    ctx = dist.context(device.type)
    cfg = feature_classifier_config(options, ctx.world_size, device.type, uses_rotation(data))
    schedule = schedule_of(cfg)
    with Replicator(cfg.train.batch, cfg.train.micro_batch, device=device.type) as rep:
        task = build_task(cfg, rep, data)
        feed = Feed(data, schedule, rep, cfg, crop_scale=getattr(task, "loader_crop_scale", 0.0))
        try:
            while feed.nimg < cfg.train.batch * options.steps:
                task.step(feed)
        finally:
            feed.close()
        return task.nets()["model"].eval()


register_trainer(train_feature_classifier)
