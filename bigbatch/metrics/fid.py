"""Fréchet distance between Gaussians fitted to two feature sets (FID with Inception features, FCD
with the data set's own classifier), in float64."""

from __future__ import annotations

import numpy as np
import torch

from bigbatch.errors import BigbatchError


def _array(features: torch.Tensor | np.ndarray) -> np.ndarray:
    x = features.detach().cpu().numpy() if isinstance(features, torch.Tensor) else np.asarray(features)
    if x.ndim != 2 or x.shape[0] < 2:
        raise BigbatchError(f"need a (N >= 2, D) feature matrix, got shape {x.shape}")
    return x.astype(np.float64)


def feature_stats(features: torch.Tensor | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean (D,) and unbiased covariance (D, D) of (N, D) features, in float64."""
    x = _array(features)
    return x.mean(0), np.cov(x, rowvar=False)


def covariance_fault(sigma: np.ndarray) -> str | None:
    """Why `sigma` is not a covariance matrix (symmetric, no eigenvalue below zero beyond float32's rounding
    of one), or None. A hand-made or damaged statistics file otherwise scores a wrong FID, even a negative one:
    the factorization reads one triangle, and the eigenvalues below zero are clipped."""
    scale = float(np.abs(sigma).max(initial=0.0)) or 1.0
    if float(np.abs(sigma - sigma.T).max(initial=0.0)) > 1e-6 * scale:
        return "its sigma is not symmetric"
    eig = np.linalg.eigvalsh(sigma)
    if eig.size and eig[0] < -1e-4 * max(float(eig[-1]), scale):
        return f"its sigma is not positive semi-definite (an eigenvalue of {eig[0]:.3g})"
    return None


def trace_sqrt_product(sigma1: np.ndarray, sigma2: np.ndarray) -> float:
    """tr sqrt(sigma1 sigma2) for covariance matrices, singular ones included.

    A pivoted Cholesky factorization P' sigma1 P = L L' (L of the numerical rank r of sigma1) turns the
    product into the r x r symmetric PSD matrix L' P' sigma2 P L, which has the same non-zero
    eigenvalues; their square roots are real, so fewer samples than dimensions yields no complex
    noise or NaN (which sqrtm of the product can), and it takes a second at D = 2048 where sqrtm
    takes tens.
    """
    from scipy.linalg import lapack  # (here: importing scipy.linalg took 0.3 s of every process that scores nothing)

    c, piv, rank, info = lapack.dpstrf(np.ascontiguousarray(sigma1, np.float64), lower=1)
    if info < 0:
        raise BigbatchError("covariance matrix could not be factorized (is it symmetric and finite?)")
    p = piv - 1
    L = np.tril(c)[:, :rank]
    m = L.T @ sigma2[np.ix_(p, p)] @ L
    return float(np.sqrt(np.clip(np.linalg.eigvalsh((m + m.T) / 2), 0, None)).sum())


def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray) -> float:
    """||mu1 - mu2||^2 + tr(sigma1 + sigma2 - 2 sqrt(sigma1 sigma2))."""
    mu1, mu2 = np.asarray(mu1, np.float64), np.asarray(mu2, np.float64)
    sigma1, sigma2 = np.asarray(sigma1, np.float64), np.asarray(sigma2, np.float64)
    if mu1.shape != mu2.shape or sigma1.shape != sigma2.shape or sigma1.shape != mu1.shape * 2:
        raise BigbatchError(
            f"statistics do not match: means {mu1.shape} and {mu2.shape}, covariances {sigma1.shape} and "
            f"{sigma2.shape} (were they computed with the same feature extractor?)"
        )
    if not all(np.isfinite(a).all() for a in (mu1, mu2, sigma1, sigma2)):
        raise BigbatchError(
            "feature statistics hold NaN or infinity: the images or the extractor produced non-finite features"
        )
    diff = mu1 - mu2
    traces = float(np.trace(sigma1) + np.trace(sigma2))
    distance = float(diff @ diff + traces - 2 * trace_sqrt_product(sigma1, sigma2))
    if distance < -1e-9 * max(traces, 1.0):  # (more than the rounding of the sum: no covariances, found by review)
        raise BigbatchError(f"FID came out negative ({distance:.3g}): a statistics file's sigma is not a covariance")
    return max(distance, 0.0)  # (a distance: identical sets gave -1e-13, the rounding of the sum)


def fid(features_a: torch.Tensor | np.ndarray, features_b: torch.Tensor | np.ndarray) -> float:
    """Fréchet distance between two (N, D) feature sets."""
    return frechet_distance(*feature_stats(features_a), *feature_stats(features_b))
