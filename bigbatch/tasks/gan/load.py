"""A trained generator back from a run directory or checkpoint (`bigbatch.load_generator`)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from bigbatch import checkpoints
from bigbatch.config import Config
from bigbatch.errors import BigbatchError
from bigbatch.tasks.gan.task import build_models


def checkpoint_model_info(ckpt: Path) -> dict:
    meta = checkpoints.read_meta(ckpt)
    if meta is None or "n_classes" not in meta or "img_channels" not in meta:
        raise BigbatchError(
            f"checkpoint {ckpt} has no usable meta.json; it was not written by this version of bigbatch"
        )
    return meta


def load_generator(path: str | Path, device: str | torch.device = "cpu") -> nn.Module:
    """The EMA generator of a run (its latest complete checkpoint) or of a checkpoint folder, in eval mode."""
    ckpt = checkpoints.find_checkpoint(path)
    meta = checkpoint_model_info(ckpt)
    cfg = Config.load(ckpt / "config.toml")
    G, _ = build_models(cfg, meta["n_classes"], meta["img_channels"])
    weights, _ = checkpoints.load_checkpoint(ckpt, nets=("G_ema",))
    checkpoints.load_weights(G, weights["G_ema"], f"G_ema of checkpoint {ckpt}")
    G.class_names = meta.get("class_names", [])
    return G.to(device).eval().requires_grad_(False)
