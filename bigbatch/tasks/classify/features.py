"""The metrics' offline feature classifier ("classifier" extractor, fcd), trained by the classify task
and handed to the metrics as a finished extractor: the `convnet` family on the data set's labels (or
rotations, for unlabelled data) with AdamW, a 15% warm-up and cosine decay, through the same task,
Feed and Replicator as any classify run; cached by the data's hash and the options."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from bigbatch.config import Config, DataConfig, EvalConfig, ModelConfig, TrainConfig
from bigbatch.data.schedule import schedule_of
from bigbatch.engine import dist
from bigbatch.engine.determinism import global_rngs_kept
from bigbatch.engine.replicator import Replicator
from bigbatch.errors import BigbatchError
from bigbatch.metrics.classifier import (
    FEATURE_NET,
    ClassifierExtractor,
    ClassifierOptions,
    classifier_file,
    read_classifier,
    trained_classifier,
    uses_rotation,
)
from bigbatch.metrics.evaluate import extractor_for
from bigbatch.metrics.extractors import resolve_name
from bigbatch.metrics.features import Extractor, resolve_device
from bigbatch.metrics.stats import ReferenceStats
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


def train_feature_classifier(data: Any, options: ClassifierOptions, device: torch.device | str = "auto") -> nn.Module:
    """Train the feature classifier on `data` (one process or all ranks of torchrun together: the
    weights do not depend on the number of ranks); the plain network."""
    if len(data) < 2:
        raise BigbatchError(f"cannot train the feature classifier on {len(data)} images")
    device = resolve_device(device)
    ctx = dist.context(device.type)
    cfg = feature_classifier_config(options, ctx.world_size, device.type, uses_rotation(data))
    schedule = schedule_of(cfg)
    with Replicator(cfg.train.batch, cfg.train.micro_batch, device=device.type) as rep, global_rngs_kept(rep.device):
        task = build_task(cfg, rep, data)  # (whose steps seed the global generators: the caller's put back after)
        feed = Feed(data, schedule, rep, cfg, crop_scale=getattr(task, "loader_crop_scale", 0.0))
        try:
            while feed.nimg < cfg.train.batch * options.steps:
                task.step(feed)
        finally:
            feed.close()
        return task.nets()["model"].eval()


def classifier_extractor(
    data: object,
    device: torch.device | str = "auto",
    options: ClassifierOptions | None = None,
    cache: bool = True,
    folder: str | Path | None = None,
) -> ClassifierExtractor:
    """The classifier for `data` (the "classifier" extractor): loaded from the cache
    (BIGBATCH_CACHE/classifiers/, or `folder`), or trained by the classify task and saved there
    (safetensors) first; with `cache` False, trained and not saved."""
    options = options or ClassifierOptions()
    dev = resolve_device(device)
    file = classifier_file(data, options, folder)
    found = read_classifier(file, data, options, dev) if cache else None
    if found is not None:
        return found
    net = train_feature_classifier(data, options, dev).cpu()
    return trained_classifier(net, file, data, options, dev, save=cache)


def feature_extractor(
    name: str | Extractor,
    reference: object,
    path: str | Path | None = None,
    device: torch.device | str | None = "auto",
    **classifier_options: Any,
) -> Extractor:
    """`bigbatch.metrics.extractor_for(reference, name, ...)`, with the reference's own classifier trained
    here when it is not cached: when `name` is "classifier", or "auto" without Inception weights.
    classifier_options: `classifier_extractor`'s options, cache, folder."""
    if not isinstance(name, Extractor) and reference is not None and not isinstance(reference, ReferenceStats):
        name = resolve_name(name, path)
        if name == "classifier":
            name = classifier_extractor(reference, device, **classifier_options)
    return extractor_for(reference, name, path, device, **classifier_options)
