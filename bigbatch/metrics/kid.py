"""Kernel Inception Distance (Bińkowski et al. 2018): the unbiased MMD^2 with the cubic polynomial
kernel k(x, y) = (x.y / D + 1)^3, averaged over random subsets. Subsets are drawn as in the reference
code (numpy RandomState(seed), one choice per side per subset), so equal seeds give torch-fidelity's
subsets; sums are in float64."""

from __future__ import annotations

import numpy as np
import torch

from bigbatch.errors import BigbatchError, warn


def polynomial_kernel(
    x: np.ndarray, y: np.ndarray, degree: int = 3, gamma: float | None = None, coef0: float = 1.0
) -> np.ndarray:
    gamma = 1.0 / x.shape[1] if gamma is None else gamma
    return (x @ y.T * gamma + coef0) ** degree


def mmd2_unbiased(k_xx: np.ndarray, k_xy: np.ndarray, k_yy: np.ndarray) -> float:
    """Unbiased MMD^2 of two equal-size samples from their kernel matrices."""
    m = k_xx.shape[0]
    within = (k_xx.sum() - np.trace(k_xx) + k_yy.sum() - np.trace(k_yy)) / (m * (m - 1))
    return float(within - 2 * k_xy.sum() / (m * m))


def _numpy(f: torch.Tensor | np.ndarray) -> np.ndarray:
    return f.detach().cpu().numpy() if isinstance(f, torch.Tensor) else np.asarray(f)


def kid(
    features_a: torch.Tensor | np.ndarray,
    features_b: torch.Tensor | np.ndarray,
    subsets: int = 100,
    subset_size: int = 1000,
    degree: int = 3,
    gamma: float | None = None,
    coef0: float = 1.0,
    seed: int = 2020,
    name: str = "kid",
) -> tuple[float, float]:
    """Mean and standard deviation of MMD^2 over `subsets` random subsets of `subset_size` (capped at
    the smaller set's size) drawn without replacement from each side. Two sets no larger than a subset
    make one subset, computed once: its standard deviation is 0, said in a warning (torch-fidelity
    refuses such sets). `name`: the score's, in that warning (kcd of the classifier extractor's features)."""
    a, b = _numpy(features_a), _numpy(features_b)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise BigbatchError(f"KID needs two (N, D) feature sets of the same D, got {a.shape} and {b.shape}")
    size = min(subset_size, len(a), len(b))
    if size < 2 or subsets < 1:
        raise BigbatchError(f"KID needs subsets >= 1 of at least 2 samples, got {subsets} of {size}")
    a, b = a.astype(np.float64), b.astype(np.float64)
    if size == len(a) == len(b):
        warn(
            f"{name.upper()}: both sets hold {size} images, not more than a subset of {subset_size}: every subset "
            f"is the whole of both, so {name}_std is 0, not a measured spread (give more images for one)",
            once=True,
        )
        subsets = 1
    rng = np.random.RandomState(seed)
    mmds = np.empty(subsets)
    for i in range(subsets):
        x = a[rng.choice(len(a), size, replace=False)]
        y = b[rng.choice(len(b), size, replace=False)]
        k = lambda p, q: polynomial_kernel(p, q, degree, gamma, coef0)
        mmds[i] = mmd2_unbiased(k(x, x), k(x, y), k(y, y))
    return float(mmds.mean()), float(mmds.std())
