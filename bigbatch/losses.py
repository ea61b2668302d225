"""GAN losses as pure functions of D's logits; each returns the mean over the batch given."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def d_hinge(real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    return F.relu(1 - real).mean() + F.relu(1 + fake).mean()


def g_hinge(fake: torch.Tensor) -> torch.Tensor:
    return -fake.mean()


def d_nonsaturating(real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    return F.softplus(-real).mean() + F.softplus(fake).mean()


def g_nonsaturating(fake: torch.Tensor) -> torch.Tensor:
    return F.softplus(-fake).mean()


D_LOSS = {"hinge": d_hinge, "ns": d_nonsaturating}
G_LOSS = {"hinge": g_hinge, "ns": g_nonsaturating}
