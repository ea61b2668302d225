"""A trained generator back from a run directory or checkpoint (`bigbatch.load_generator`)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from bigbatch import checkpoints
from bigbatch.config import Config
from bigbatch.errors import BigbatchError
from bigbatch.tasks.gan.task import build_models


def load_generator(path: str | Path, device: str | torch.device = "cpu") -> nn.Module:
    """The EMA generator of a run (its latest complete checkpoint) or of a checkpoint folder, in eval mode,
    with `class_names`, `checkpoint` (the folder read) and `config` (the run's)."""
    return checkpoints.read_newest(path, lambda ckpt: _load_generator(ckpt, device))


def _load_generator(ckpt: Path, device: str | torch.device) -> nn.Module:
    meta = checkpoints.model_info(ckpt)
    cfg = Config.load(ckpt / "config.toml")
    if cfg.task != "gan":
        instead = {
            "swap": "swap faces with `bigbatch swap RUN IN OUT`, or merge them into frames with `bigbatch merge`",
            "classify": "predict with `bigbatch predict RUN IMAGES`",
        }.get(cfg.task, "")
        raise BigbatchError(
            f"{ckpt} is a {cfg.task} run, not a GAN: it has no generator to load or sample"
            + (f"; {instead}" if instead else "")
        )
    G, _ = build_models(cfg, meta["n_classes"], meta["img_channels"])
    weights, _ = checkpoints.load_checkpoint(ckpt, nets=("G_ema",), state=False)
    checkpoints.load_weights(G, weights["G_ema"], f"G_ema of checkpoint {ckpt}")
    G.class_names, G.checkpoint, G.config = meta.get("class_names", []), ckpt, cfg
    return G.to(device).eval().requires_grad_(False)
