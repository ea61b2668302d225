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


def test_a_duplicate_at_a_radius_of_0_is_inside_whatever_the_products_rounding(monkeypatch):
    # 4 copies of one real image: its 3rd neighbour is a copy, at 0, and a generated copy is inside that ball
    # (distance <= 0) exactly; the matrix product may put it 1e-3 away (found by review: not refined where r is 0).
    g = torch.Generator().manual_seed(0)
    x = torch.rand(100, 2048, generator=g) * 3
    x[0] += 50  # (far from the others: no other real ball reaches it)
    real = torch.cat([x[:1].repeat(4, 1), x[4:]])
    fake = torch.cat([x[:1], torch.rand(99, 2048, generator=g) * 3 + 100])  # the copy, and images far from any
    cdist = torch.cdist
    monkeypatch.setattr(torch, "cdist", lambda a, b, **kw: cdist(a, b, **kw) + 1e-3)  # (the product's rounding)
    assert M.precision_recall(fake, real)["precision"] == 1 / 100
