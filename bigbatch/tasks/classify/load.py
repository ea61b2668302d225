"""A trained classifier back from a run directory or checkpoint (`bigbatch.load_classifier`)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from bigbatch import checkpoints, models
from bigbatch.config import Config
from bigbatch.errors import BigbatchError


def load_classifier(path: str | Path, device: str | torch.device = "cpu", best: bool = False) -> nn.Module:
    """The classifier of a classify run (its latest complete checkpoint, or checkpoints/best/ with
    `best`) or of a checkpoint folder, in eval mode, with `class_names`. It takes float NCHW images in
    [-1, 1] (uint8 / 127.5 - 1) of any size; `features(x)` gives its penultimate features."""
    path = Path(path)
    ckpt = checkpoints.best_checkpoint(path) if best else None
    ckpt = ckpt or checkpoints.find_checkpoint(path)
    meta = checkpoints.model_info(ckpt)
    cfg = Config.load(ckpt / "config.toml")
    if cfg.task != "classify":
        raise BigbatchError(f'{ckpt} is a {cfg.task} run, not a classifier (task = "classify")')
    m = cfg.model
    with torch.random.fork_rng(devices=[]):  # the random init is overwritten: leave the caller's RNG alone
        net = models.create_classifier(
            m.name, meta["n_classes"], ch=m.ch, img_channels=meta["img_channels"], **m.options
        )
    weights, _ = checkpoints.load_checkpoint(ckpt, nets=("model",))
    checkpoints.load_weights(net, weights["model"], f"the classifier of checkpoint {ckpt}")
    net.class_names = meta.get("class_names", [])
    return net.to(device).eval().requires_grad_(False)
