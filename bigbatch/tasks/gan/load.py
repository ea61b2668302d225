"""A trained generator back from a run directory or checkpoint (`bigbatch.load_generator`)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from bigbatch import checkpoint_find, checkpoints
from bigbatch.batching import channels_last_of
from bigbatch.engine.wrap import to_channels_last
from bigbatch.errors import BigbatchError
from bigbatch.run_data import run_config
from bigbatch.tasks.gan.task import build_models


def load_generator(path: str | Path, device: str | torch.device = "cpu", as_trained: bool = True) -> nn.Module:
    """The EMA generator of a run (its latest complete checkpoint) or of a checkpoint folder, in eval mode,
    with `class_names`, `checkpoint` (the folder read) and `config` (the run's). `as_trained`: in the memory order
    the run trained it in (channels-last convolutions round apart from NCHW ones: found from outside, `bigbatch
    eval` scored a run's G_ema 7.6e-7 apart from the score logged in training); False: NCHW."""
    device = _device(device)
    return checkpoint_find.read_newest(path, lambda ckpt: _load_generator(ckpt, device, as_trained))


def _device(device: str | torch.device) -> torch.device:
    """`device` as torch's, or one line (found from outside: "cuda" on a machine without one was torch's
    AssertionError, "gpu" its list of every device type)."""
    try:
        found = torch.device(device)
    except (RuntimeError, TypeError):
        raise BigbatchError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}") from None
    if found.type == "cuda" and not torch.cuda.is_available():
        raise BigbatchError(f"device {device!r}: this machine has no CUDA GPU that torch can use; give device='cpu'")
    return found


def _load_generator(ckpt: Path, device: str | torch.device, as_trained: bool) -> nn.Module:
    meta = checkpoints.model_info(ckpt)
    cfg = run_config(ckpt)
    if cfg.task != "gan":
        instead = {
            "swap": "swap faces with `bigbatch swap RUN IN OUT`, or merge them into frames with `bigbatch merge`",
            "classify": "predict with `bigbatch predict RUN IMAGES`",
            "xseg": "its held-out scores (data.val_fraction) are the iou and val_loss rows of its metrics.jsonl; "
            "mask faces with `bigbatch xseg apply RUN FACES`",
        }.get(cfg.task, "")
        raise BigbatchError(
            f"{ckpt} is a {cfg.task} run, not a GAN: it has no generator to load or sample"
            + (f"; {instead}" if instead else "")
        )
    G, _ = build_models(cfg, meta["n_classes"], meta["img_channels"])
    weights, _ = checkpoints.load_checkpoint(ckpt, nets=("G_ema",), state=False)
    checkpoints.load_weights(G, weights["G_ema"], f"G_ema of checkpoint {ckpt}")
    G.class_names, G.checkpoint, G.config = meta.get("class_names", []), ckpt, cfg
    G = G.to(device).eval().requires_grad_(False)
    if as_trained and channels_last_of(cfg):
        to_channels_last(G, torch.device(device))
    return G
