"""Precision and recall (Kynkäänniemi et al. 2019, "Improved precision and recall metric for assessing
generative models") and density and coverage (Naeem et al. 2020, "Reliable fidelity and diversity
metrics for generative models"): each set's manifold is the union of balls around its samples, each
reaching its k-th nearest neighbour in the same set.

- precision: the fraction of generated samples inside the real manifold (fidelity);
- recall: the fraction of real samples inside the generated manifold (diversity);
- density: how many real balls hold each generated sample, over k, averaged (1 for matching sets; more
  than 1 where samples crowd the real modes);
- coverage: the fraction of real samples whose ball holds a generated sample.

Precision and recall take k = 3 with "inside" as distance <= radius (StyleGAN2-ADA's pr50k3 and
torch-fidelity's prc), density and coverage k = 5 with distance < radius (the authors' prdc package and
StudioGAN). Distances are Euclidean in full float32 (no TF32), computed in blocks of 4096 x 4096 on
the features' device, never the whole matrix; the radii (of the k + 1 nearest the product picks), and a
distance within EDGE of the radius it is compared with, are computed again exactly (float64 differences, no
matrix product), so a sample that duplicates a real image is inside or outside a ball as exact arithmetic says
(found from outside: a set against itself had a density of 1.0067 by the matrix product's rounding, and another
at another batch size).
This is written here because torch-fidelity (which the tests compare with) extracts its own features and has
no density or coverage, and prdc holds the whole N x N matrix in memory.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from bigbatch.errors import BigbatchError
from bigbatch.metrics.features import exact_float32

PR_K = 3
DC_K = 5
BLOCK = 4096
EDGE = 1e-4  # relative: a distance this near a radius is computed again exactly (float32's product errs ~1e-6)


def _tensor(f: torch.Tensor | np.ndarray, device: torch.device) -> torch.Tensor:
    t = f if isinstance(f, torch.Tensor) else torch.from_numpy(np.asarray(f))
    return t.detach().to(device=device, dtype=torch.float32)


def _pairs(a: torch.Tensor, b: torch.Tensor, block: int) -> Iterator[tuple[slice, slice, torch.Tensor]]:
    """(rows of a, rows of b, their distances) for each block of each: block x block floats at a time (at 50,000
    of each, never the whole 10 GB matrix)."""
    for i in range(0, len(a), block):
        rows = slice(i, i + block)
        for j in range(0, len(b), block):
            cols = slice(j, j + block)
            yield rows, cols, torch.cdist(a[rows], b[cols])


def _exact(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The distances of a's rows to b's rows, pair by pair, exactly: float64 differences (symmetric, 0 to itself)."""
    return (a.double() - b.double()).square().sum(1).sqrt()


def _refined(d: torch.Tensor, a: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Distances `d` between a's rows and b's, those within EDGE of the radius `r` (broadcast to d) exact; or within
    the matrix product's own error, where r is 0 (k + 1 duplicates): |d² error| ~ eps·(|a|² + |b|²)."""
    slack = (torch.finfo(torch.float32).eps * (a.square().sum(1)[:, None] + b.square().sum(1)[None])).sqrt()
    near = ((d - r).abs() <= EDGE * r + 4 * slack).nonzero()
    if len(near):
        d = d.double()
        d[near[:, 0], near[:, 1]] = _exact(a[near[:, 0]], b[near[:, 1]])
    return d


def radii(features: torch.Tensor, k: int, block: int = BLOCK) -> torch.Tensor:
    """Each sample's distance to its k-th nearest neighbour in the same set (itself, at 0, not counted): the
    k + 1 nearest of each row kept as the column blocks pass, their distances then computed exactly (float64)."""
    out = torch.empty(len(features), dtype=torch.float64, device=features.device)
    for i in range(0, len(features), block):
        rows, nearest, index = features[i : i + block], None, None
        for j in range(0, len(features), block):
            d = torch.cdist(rows, features[j : j + block])
            columns = torch.arange(j, j + d.shape[1], device=d.device).expand_as(d)
            if nearest is not None:
                d, columns = torch.cat([nearest, d], 1), torch.cat([index, columns], 1)
            nearest, at = d.topk(min(k + 1, d.shape[1]), dim=1, largest=False)
            index = columns.gather(1, at)
        exact = torch.stack([_exact(rows, features[index[:, c]]) for c in range(index.shape[1])], 1)
        out[i : i + block] = exact.sort(dim=1).values[:, k]
    return out


def _sets(
    fake: torch.Tensor | np.ndarray, real: torch.Tensor | np.ndarray, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.device]:
    """Both sets as float32 on fake's device (the host for NumPy), checked: (fake, real, device)."""
    device = fake.device if isinstance(fake, torch.Tensor) else torch.device("cpu")
    fake, real = _tensor(fake, device), _tensor(real, device)
    if fake.ndim != 2 or real.ndim != 2 or fake.shape[1] != real.shape[1]:
        raise BigbatchError(
            f"precision and recall need two (N, D) feature sets of the same D, got {fake.shape} and {real.shape}"
        )
    check_sizes(len(fake), len(real), k)
    return fake, real, device


def check_sizes(fake: int, real: int, k: int) -> None:
    """Refuse, in one line, sets too small for k-th neighbour balls (said before extraction where the sizes are
    known: found from outside, after minutes of it)."""
    if min(fake, real) <= k:
        raise BigbatchError(
            f"precision, recall, density and coverage need more than k = {k} images on each side, got "
            f"{fake} generated and {real} real: give more (the papers use 10,000 to 50,000 of each)"
        )


def precision_recall(
    fake: torch.Tensor | np.ndarray, real: torch.Tensor | np.ndarray, k: int = PR_K, block: int = BLOCK
) -> dict[str, float]:
    """{"precision", "recall"} of generated features `fake` against `real` (both (N, D)), in full float32
    (TF32 distances would move samples across the balls' edges)."""
    fake, real, device = _sets(fake, real, k)
    with exact_float32():
        r_fake, r_real = radii(fake, k, block), radii(real, k, block)
        inside_real = torch.zeros(len(fake), dtype=torch.bool, device=device)
        inside_fake = torch.zeros(len(real), dtype=torch.bool, device=device)
        for rows, cols, d in _pairs(fake, real, block):  # d: fake rows x real columns
            inside_real[rows] |= (_refined(d, fake[rows], real[cols], r_real[cols]) <= r_real[cols]).any(dim=1)
            near_fake = _refined(d, fake[rows], real[cols], r_fake[rows, None])
            inside_fake[cols] |= (near_fake <= r_fake[rows, None]).any(dim=0)
    return {"precision": _share(inside_real), "recall": _share(inside_fake)}


def _share(flags: torch.Tensor) -> float:
    return flags.sum().item() / len(flags)


def density_coverage(
    fake: torch.Tensor | np.ndarray, real: torch.Tensor | np.ndarray, k: int = DC_K, block: int = BLOCK
) -> dict[str, float]:
    """{"density", "coverage"} of generated features `fake` against `real` (both (N, D)), in full float32."""
    fake, real, device = _sets(fake, real, k)
    with exact_float32():
        r_real = radii(real, k, block)
        held = torch.zeros(len(fake), dtype=torch.int64, device=device)  # real balls holding each fake
        covered = torch.zeros(len(real), dtype=torch.bool, device=device)
        for rows, cols, d in _pairs(fake, real, block):
            inside = _refined(d, fake[rows], real[cols], r_real[cols]) < r_real[cols]
            held[rows] += inside.sum(dim=1)
            covered[cols] |= inside.any(dim=0)
    return {"density": held.sum().item() / (k * len(fake)), "coverage": _share(covered)}
