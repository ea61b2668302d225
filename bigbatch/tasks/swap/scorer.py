"""The swap task's held-out score: how well the autoencoder reconstructs faces it never trained on
(data.val_fraction of src and of dst), as SSIM in SAEHD's own window (res / 11.6), unwarped, over the
whole image: src_ssim, dst_ssim and their mean ssim, which keeps RUN/checkpoints/best/."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bigbatch.data.schedule import resize_batch
from bigbatch.engine import dist
from bigbatch.metrics.features import Progress
from bigbatch.signals import check_stop
from bigbatch.tasks.best import Best
from bigbatch.tasks.swap.losses import ssim


@torch.no_grad()
def reconstruction_ssim(
    model: nn.Module, data: Any, side: str, batch: int = 16, rank: int = 0, world: int = 1
) -> float:
    """Mean SSIM of `side` ("src" or "dst") faces of `data` and their reconstructions; with `world`
    ranks each scores every world-th batch and the means are combined."""
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    total, count = torch.zeros((), dtype=torch.float64), 0
    starts = range(rank * batch, len(data), batch * world)
    shown = Progress(sum(min(batch, len(data) - s) for s in starts), f"{side} faces")
    try:
        for start in starts:
            check_stop()  # (a stop asked of training ends it: found from outside, it waited for the whole score)
            images, _ = data.get(torch.arange(start, min(start + batch, len(data))))
            x = resize_batch(images, model.resolution)[..., :3].to(device).permute(0, 3, 1, 2).float() / 255
            pred, _ = getattr(model, side)(x)
            total += ssim(x, pred.float(), model.resolution).double().sum().cpu()
            count += len(x)
            shown.add(len(x))
    finally:
        shown.close()
        model.train(was)
    sums = dist.sum(torch.tensor([float(total), float(count)], dtype=torch.float64, device=device)).cpu()
    return float(sums[0]) / max(1.0, float(sums[1]))


class SwapScorer:
    def __init__(self, task: Any, run: Path, resumed_at: int | None, quiet: bool):
        self.task = task
        cfg = task.cfg
        metric = cfg.eval.best or "ssim"
        settings = {"metric": metric, "val_fraction": cfg.data.val_fraction}
        self.tracker = Best(metric, True, settings, run, resumed_at, quiet)

    def __call__(self) -> dict[str, float]:
        began = time.perf_counter()
        rep, model = self.task.rep, self.task.plain()
        src, dst = self.task.val
        scores = {
            side: reconstruction_ssim(model, data, side, self.task.cfg.eval.batch_size, rep.rank, rep.world_size)
            for side, data in (("src", src), ("dst", dst))
        }
        ssim = (scores["src"] + scores["dst"]) / 2
        return {
            "src_ssim": scores["src"],
            "dst_ssim": scores["dst"],
            "ssim": ssim,
            "eval_seconds": time.perf_counter() - began,
        }

    def improved(self, scores: dict[str, float]) -> bool:
        return self.tracker.improved(scores)

    def best_record(self) -> dict[str, Any]:
        return self.tracker.record()
