"""How recognisable a digits run's samples are: an SVM trained on the real 8x8 digits classifies
EMA samples of each requested class (downsampled back to 8x8). Prints one table.

    python bench/digits_quality.py RUN [--n-per-class 100] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.svm import SVC

import bigbatch

sys.path.insert(0, str(Path(__file__).parent))
from _args import one_line_errors, positive_int  # noqa: E402


def to_digits_scale(images: torch.Tensor) -> np.ndarray:
    """uint8 NHWC samples at any size -> (N, 64) on the 0..16 scale of load_digits."""
    x = images.float().mean(dim=3, keepdim=True).permute(0, 3, 1, 2) / 255 * 16
    return F.adaptive_avg_pool2d(x, 8).flatten(1).numpy()


def recognised(G: torch.nn.Module, clf: SVC, n_per_class: int, seed: int) -> list[tuple[int, float]]:
    """(class, the fraction of G's samples of it that `clf` calls that class), for every class."""
    rows = []
    for c in range(G.n_classes):
        images = bigbatch.sample(G, n=n_per_class, seed=seed + 1000 * c, classes=[c])
        rows.append((c, float((clf.predict(to_digits_scale(images)) == c).mean())))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run")
    p.add_argument("--n-per-class", type=positive_int, default=100)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    with one_line_errors():  # (no run there, or not a GAN's)
        G = bigbatch.load_generator(args.run)
    if not G.n_classes:
        p.error(f"{args.run} is an unconditional GAN's run: give a class-conditional digits run")
    d = load_digits()
    clf = SVC(gamma=0.001).fit(d.data[::2], d.target[::2])
    held_out = clf.score(d.data[1::2], d.target[1::2])
    rows = recognised(G, clf, args.n_per_class, args.seed)
    print(f"{'class':>5}  {'accuracy':>8}")
    for c, acc in rows:
        print(f"{c:>5}  {acc:>8.1%}")
    print(f"{'all':>5}  {np.mean([a for _, a in rows]):>8.1%}   (SVM on held-out real digits: {held_out:.1%})")


if __name__ == "__main__":
    main()
