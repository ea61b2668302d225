"""GAN losses as pure functions of D's logits (each the mean over the batch given), and regularizers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


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


def r1_penalty(logits_real: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """R1 (Mescheder et al. 2018): the mean over the images of the squared norm of D's gradient with respect
    to them, `real` being the images D's `logits_real` were computed from (requires_grad). Kept in the
    graph (create_graph), so its own gradient reaches D's weights; in fp32."""
    (grad,) = torch.autograd.grad(logits_real.float().sum(), real, create_graph=True)
    return grad.float().square().sum(dim=(1, 2, 3)).mean()


def ortho_penalty(module: nn.Module) -> torch.Tensor:
    """BigGAN's orthogonal regularization, summed over every weight of >= 2 dims but a G's shared class embedding
    (BigGAN-PyTorch's blacklist: G.shared; D's projection embedding and an unshared G's per-class BN gains and
    biases are regularized, found from outside to be left out).

    Its gradient is 2 (W W^T * (1 - I)) W for each weight W viewed as (out, -1): the gradient that
    BigGAN-PyTorch's utils.ortho adds, so strength beta here equals its G_ortho / D_ortho. (The paper
    writes R = beta ||W^T W * (1 - I)||_F^2, whose gradient is twice that.) Computed in fp32.
    """
    shared = getattr(module, "shared", None)
    skip = {id(p) for p in shared.parameters()} if isinstance(shared, nn.Module) else set()
    total = torch.zeros((), device=next(module.parameters()).device)
    with torch.autocast(total.device.type, enabled=False):
        for p in module.parameters():
            if p.ndim < 2 or id(p) in skip or not p.requires_grad:
                continue
            w = p.flatten(1).float()
            gram = w @ w.t()
            total = total + 0.5 * (gram - torch.diag(torch.diagonal(gram))).square().sum()
    return total
