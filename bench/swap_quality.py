"""Held-out reconstruction SSIM of a swap run (e.g. `bigbatch train --preset saehd_cpu`), against two
baselines that know nothing of each face: the untrained model (train.seed's initialisation) and the
mean training face of each side. One table.

    python bench/swap_quality.py runs/saehd_cpu-00000

SSIM is SAEHD's (DFL's window, res / 11.6), over the whole image, on data.val_fraction of src and of
dst (the faces the run never trained on, the same split its eval rows score).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from bigbatch.config import Config
from bigbatch.data.load import load_data
from bigbatch.data.split import holdout
from bigbatch.tasks.swap.load import build_model, load_autoencoder
from bigbatch.tasks.swap.losses import ssim
from bigbatch.tasks.swap.scorer import reconstruction_ssim

sys.path.insert(0, str(Path(__file__).parent))
from _args import one_line_errors  # noqa: E402


def mean_face_ssim(train: object, val: object, resolution: int, batch: int = 256) -> float:
    """SSIM of each held-out face against the mean training face (a predictor that ignores its input)."""
    total = torch.zeros(resolution, resolution, 3, dtype=torch.float64)
    for start in range(0, len(train), batch):
        images, _ = train.get(torch.arange(start, min(start + batch, len(train))))
        total += images[..., :3].double().sum(0)
    mean = (total / len(train)).float().permute(2, 0, 1)[None] / 255
    scores = []
    for start in range(0, len(val), batch):
        images, _ = val.get(torch.arange(start, min(start + batch, len(val))))
        x = images[..., :3].permute(0, 3, 1, 2).float() / 255
        scores.append(ssim(x, mean.expand_as(x), resolution))
    return float(torch.cat(scores).mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="a swap run directory (or checkpoint) trained with data.val_fraction > 0")
    args = p.parse_args()
    with one_line_errors():  # (no run there, or not a swap run's)
        model = load_autoencoder(args.run)
    cfg: Config = model.config
    fraction = cfg.data.val_fraction
    if not fraction:
        raise SystemExit(f"{args.run} holds out nothing (data.val_fraction = 0): no held-out faces to score")
    untrained = build_model(cfg).eval()
    rows = []
    for side, path in (("src", cfg.data.path), ("dst", cfg.data.dst_path)):
        train, val = holdout(load_data(path, cfg.data.resolution), fraction)
        rows.append(
            (
                side,
                path,
                len(val),
                reconstruction_ssim(model, val, side),
                reconstruction_ssim(untrained, val, side),
                mean_face_ssim(train, val, cfg.data.resolution),
            )
        )
    print(f"held-out SSIM of {args.run} ({model.checkpoint.name}, {cfg.data.resolution} px)\n")
    print("| side | data | held-out faces | trained | untrained | mean face |")
    print("|---|---|---|---|---|---|")
    for side, path, n, trained, init, mean in rows:
        print(f"| {side} | {path} | {n} | {trained:.3f} | {init:.3f} | {mean:.3f} |")


if __name__ == "__main__":
    main()
