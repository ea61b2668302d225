"""Inception Score (Salimans et al. 2016): exp E_x KL(p(y|x) || p(y)), mean and spread over splits."""

from __future__ import annotations

import numpy as np
import torch

from bigbatch.errors import BigbatchError


def inception_score(logits: torch.Tensor, splits: int = 10, shuffle_seed: int | None = 2020) -> tuple[float, float]:
    """Mean and standard deviation of the score over `splits` equal parts of the (N, C) logits.

    The Inception's logits are taken without the output bias, as in the original code. Samples are
    shuffled by numpy RandomState(shuffle_seed) first, as torch-fidelity does (None: keep the order),
    so a split never holds one run of similar images.
    """
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise BigbatchError("inception_score takes an (N, C) tensor of logits")
    n = logits.shape[0]
    if not 1 <= splits <= n:
        raise BigbatchError(f"cannot split {n} samples into {splits} parts for the Inception Score")
    x = logits.detach().cpu().double()
    if shuffle_seed is not None:
        x = x[torch.from_numpy(np.random.RandomState(shuffle_seed).permutation(n))]
    p, log_p = x.softmax(1), x.log_softmax(1)
    scores = []
    for i in range(splits):
        lo, hi = i * n // splits, (i + 1) * n // splits
        q = p[lo:hi].mean(0, keepdim=True)
        # 0 log 0 = 0: a probability that underflowed to 0 made 0 * inf, NaN (found from outside; torch-fidelity's too)
        kl = torch.where(p[lo:hi] > 0, p[lo:hi] * (log_p[lo:hi] - q.log()), 0.0)
        scores.append(float(kl.sum(1).mean().exp()))
    return float(np.mean(scores)), float(np.std(scores))
