"""Precision, recall, density and coverage decide a sample at a ball's edge as exact arithmetic does: a set against
itself, duplicates in it, at any block size (found from outside: a density of 1.0067 by the matrix product's
rounding of the distances to duplicates, and 0.9933 at another batch size)."""

import torch

from bigbatch.metrics import manifold as M


def test_a_set_against_itself_is_as_exact_arithmetic_scores_it_at_any_block_size():
    inception_like = torch.rand(300, 2048, generator=torch.Generator().manual_seed(1)) * 3
    for block in (64, 4096):
        assert M.density_coverage(inception_like, inception_like, block=block) == {"density": 1.0, "coverage": 1.0}
        assert M.precision_recall(inception_like, inception_like, block=block) == {"precision": 1.0, "recall": 1.0}


def test_duplicates_whose_radius_is_0_hold_nothing_as_naeems_strict_inequality_says():
    # 7 copies of one image: its 5th neighbour is a copy, at 0, and "distance < 0" holds nothing (prdc's answer),
    # whatever the matrix product's rounding of the copies' distances (found by review: ~1e-3, not refined at r 0).
    x = torch.rand(100, 2048, generator=torch.Generator().manual_seed(0)) * 3
    real = torch.cat([x[:1].repeat(7, 1), x[1:]])
    d = torch.cdist(real.double(), real.double(), compute_mode="donot_use_mm_for_euclid_dist")  # exact: no product
    inside = d < d.sort(dim=1).values[:, 5][None]  # fake j in real i's ball
    exact = {"density": inside.sum().item() / (5 * len(real)), "coverage": inside.any(0).double().mean().item()}
    assert M.density_coverage(real.clone(), real, block=64) == exact and exact["coverage"] == 99 / 106
