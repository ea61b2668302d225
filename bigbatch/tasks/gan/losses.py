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


class LeCam:
    """LeCam regularization of D (Tseng et al. 2021, google/lecam-gan; StudioGAN's apply_lecam): the squares of D's
    outputs on real images above the moving average of its outputs on fakes, and on fakes below that of reals,
    weighted by `weight`. The averages move by `decay` a D step (the step's means over every micro-batch and rank:
    the same for any accumulation and process count), the first `start` D steps taking each step's means as they
    are (the authors' start_itr). A step reads the averages of the steps before it: its own means are known only
    once all its micro-batches have run (the authors' code, one process of one micro-batch, updates them with the
    step's own first); no penalty before the first step's."""

    def __init__(self, weight: float, decay: float, start: int, device: torch.device):
        self.weight, self.decay, self.start = weight, decay, start
        self.means: tuple[float, float] | None = None  # the moving averages of D(real) and D(fake), or none yet
        self.steps = 0  # the D steps observed
        self.held = torch.zeros(2, device=device)  # (the averages on the device: a compiled D step reads them)

    def penalty(self, logits_real: torch.Tensor, logits_fake: torch.Tensor) -> torch.Tensor | None:
        """The penalty of a micro-batch's D outputs, in fp32 (None before the first step's averages)."""
        if self.means is None:
            return None
        real, fake = self.held[0], self.held[1]
        return F.relu(logits_real.float() - fake).square().mean() + F.relu(real - logits_fake.float()).square().mean()

    def observe(self, d_real: float, d_fake: float) -> None:
        """The averages after a D step whose mean outputs (over all ranks) were `d_real` and `d_fake`."""
        decay = self.decay if self.steps >= self.start and self.means is not None else 0.0
        before = self.means or (0.0, 0.0)
        self.means = (before[0] * decay + d_real * (1 - decay), before[1] * decay + d_fake * (1 - decay))
        self.steps += 1
        self.held.copy_(torch.tensor(self.means, dtype=torch.float32))

    def state_dict(self) -> dict:
        return {"means": list(self.means) if self.means is not None else None, "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.means = tuple(float(m) for m in state["means"]) if state.get("means") is not None else None
        self.steps = int(state["steps"])
        self.held.copy_(torch.tensor(self.means or (0.0, 0.0), dtype=torch.float32))
