"""GAN losses as pure functions of D's logits (each the mean over the batch given), and regularizers. G_LOSS's take
D's outputs on the fakes; RpGAN's G (g_relativistic) those on the real images paired with them too."""

from __future__ import annotations

import math
from collections.abc import Callable

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


def d_least_squares(real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    """LSGAN's (Mao et al. 2017; StudioGAN's d_ls): outputs on reals pulled to 1, on fakes to 0."""
    return 0.5 * ((real - 1).square().mean() + fake.square().mean())


def g_least_squares(fake: torch.Tensor) -> torch.Tensor:
    return 0.5 * (fake - 1).square().mean()


def d_wasserstein(real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    """WGAN's critic (Arjovsky et al. 2017): its outputs on fakes less those on reals."""
    return fake.mean() - real.mean()


def d_relativistic(real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    """RpGAN's (Jolicoeur-Martineau 2019; R3GAN, Huang et al. 2024): each fake image's output against the real image's
    it is paired with, softplus(D(fake) - D(real))."""
    return F.softplus(fake - real).mean()


def g_relativistic(fake: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """RpGAN's G: softplus(D(real) - D(fake)) of each pair (its gradient through D(fake) alone)."""
    return F.softplus(real - fake).mean()


D_LOSS = {
    "hinge": d_hinge,
    "ns": d_nonsaturating,
    "ls": d_least_squares,
    "wgan": d_wasserstein,
    "rpgan": d_relativistic,
}
G_LOSS = {"hinge": g_hinge, "ns": g_nonsaturating, "ls": g_least_squares, "wgan": g_hinge}  # (WGAN's G: -D(fake))


def r1_penalty(logits_real: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """R1 (Mescheder et al. 2018): the mean over the images of the squared norm of D's gradient with respect
    to them, `real` being the images D's `logits_real` were computed from (requires_grad). Kept in the
    graph (create_graph), so its own gradient reaches D's weights; in fp32."""
    (grad,) = torch.autograd.grad(logits_real.float().sum(), real, create_graph=True)
    return grad.float().square().sum(dim=(1, 2, 3)).mean()


def gradient_penalty(
    judge: Callable[[torch.Tensor], torch.Tensor], real: torch.Tensor, fake: torch.Tensor, mix: torch.Tensor
) -> torch.Tensor:
    """WGAN-GP's (Gulrajani et al. 2017): the mean over the images of (|grad judge(x)|_2 - 1)^2 at x = a real + (1 - a)
    fake, `mix` holding each image's a; in the graph (create_graph), in fp32."""
    a = mix.to(real.device, torch.float32, non_blocking=True).view(-1, 1, 1, 1)
    x = (a * real.detach().float() + (1 - a) * fake.detach().float()).to(real.dtype).requires_grad_()
    (grad,) = torch.autograd.grad(judge(x).float().sum(), x, create_graph=True)
    return (grad.float().flatten(1).norm(dim=1) - 1).square().mean()


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


class LeCam:
    """LeCam regularization of D (Tseng et al. 2021; StudioGAN's apply_lecam): the squares of D's outputs on real
    images above the moving average of its outputs on fakes, and on fakes below that of reals, weighted by `weight`.
    The averages move by `decay` a D step (the step's means over every micro-batch and rank: the same for any
    accumulation and process count), taking each step's means as they are until iteration `start`, after which the
    penalty applies (StudioGAN's lecam_ema_start_iter, its iterations: G steps). A step reads the averages of the
    steps before it: its own means are known only once all its micro-batches have run (StudioGAN's update them at
    each micro-batch, the authors' code, of one micro-batch, with the step's own first)."""

    def __init__(self, weight: float, decay: float, start: int):
        self.weight, self.decay, self.start = weight, decay, start
        self.means: tuple[float, float] | None = None  # the moving averages of D(real) and D(fake), or none yet

    def penalty(self, logits_real: torch.Tensor, logits_fake: torch.Tensor, iteration: int) -> torch.Tensor | None:
        """The penalty of a micro-batch's D outputs at `iteration`, in fp32, unweighted (None before it applies)."""
        if self.means is None or iteration <= self.start:
            return None
        real, fake = self.means
        return F.relu(logits_real.float() - fake).square().mean() + F.relu(real - logits_fake.float()).square().mean()

    def observe(self, d_real: float, d_fake: float, iteration: int) -> None:
        """The averages after a D step of `iteration` whose mean outputs (over all ranks) were `d_real` and `d_fake`
        (not finite: an overflowed step's, left out)."""
        if not (math.isfinite(d_real) and math.isfinite(d_fake)):
            return
        decay = self.decay if iteration >= self.start and self.means is not None else 0.0
        before = self.means or (0.0, 0.0)
        self.means = (before[0] * decay + d_real * (1 - decay), before[1] * decay + d_fake * (1 - decay))

    def state_dict(self) -> dict:
        return {"means": list(self.means) if self.means is not None else None}

    def load_state_dict(self, state: dict) -> None:
        means = state["means"]
        self.means = (float(means[0]), float(means[1])) if means is not None else None
