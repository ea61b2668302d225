"""The classifier's optimizers (train.optimizer): torch's SGD and AdamW, and the two layer-wise adaptive ones of
large-batch training, as timm has them (written here: torch has neither):

- "lars" (You et al. 2017, "Large Batch Training of Convolutional Networks"; timm's `Lars`, after NVIDIA apex's
  LARC): SGD with momentum whose gradient, weight decay added, is scaled for each tensor by the trust ratio
  trust_coeff x |w| / (|g| + weight_decay x |w| + eps) (1 where |w| or |g| is 0); Nesterov's as train.nesterov says
  (on by default, as for SGD: timm's "nlars"; train.nesterov = false for its "lars");
- "lamb" (You et al. 2020, "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes"; timm's `Lamb`):
  Adam's bias-corrected moments, the update (weight decay added) scaled for each tensor by |w| / |update|; the
  gradients first divided by their global norm where it is above 1 (timm's max_grad_norm); eps timm's 1e-6 unless
  train.adam_eps is given.

As timm's, a tensor whose param group has no weight decay (biases and normalization, train.norm_decay false) is not
adapted: LARS steps it as SGD, LAMB as Adam.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.nn.utils import get_total_norm

from bigbatch.errors import warn

ADAMW_BETAS = (0.9, 0.999)  # PyTorch's and timm's; train.betas's default, (0.0, 0.999), is BigGAN's Adam's
LAMB_MAX_GRAD_NORM = 1.0  # timm's Lamb's: the gradients' global norm divided down to it
LAMB_EPS = 1e-6  # timm's Lamb's, where train.adam_eps is left at Adam's 1e-8


def build(t: Any, groups: list[dict[str, Any]], kernels: dict[str, bool]) -> torch.optim.Optimizer:
    """The optimizer train section `t` names, over param groups `groups` (each with its weight_decay); `kernels`:
    torch's fused or for-each choice for SGD and AdamW (engine/precision.py)."""
    betas = t.betas if t.changed("betas") else ADAMW_BETAS
    nesterov = t.nesterov and t.momentum > 0
    if t.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=t.lr, momentum=t.momentum, nesterov=nesterov, **kernels)
    if t.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=t.lr, betas=betas, eps=t.adam_eps, **kernels)
    if t.optimizer == "lars":
        return Lars(groups, lr=t.lr, momentum=t.momentum, nesterov=nesterov, trust_coeff=t.trust_coeff)
    return Lamb(groups, lr=t.lr, betas=betas, eps=t.adam_eps if t.changed("adam_eps") else LAMB_EPS)


def _trust(w_norm: torch.Tensor, g_norm: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """`ratio` where both norms are above 0, else 1 (a zero tensor or gradient is not scaled)."""
    return torch.where((w_norm > 0) & (g_norm > 0), ratio, torch.ones_like(ratio))


class Lars(torch.optim.Optimizer):
    """LARS as timm's `Lars` (see the module): for each tensor with weight decay, g <- trust x (g + wd x w), then
    SGD's momentum (its buffer starts as the first gradient; Nesterov's look-ahead with `nesterov`)."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        momentum: float = 0.9,
        nesterov: bool = False,
        weight_decay: float = 0.0,
        trust_coeff: float = 0.001,
        eps: float = 1e-8,
    ):
        defaults = {"lr": lr, "momentum": momentum, "nesterov": nesterov, "weight_decay": weight_decay}
        super().__init__(params, {**defaults, "trust_coeff": trust_coeff, "eps": eps})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        assert closure is None, "Lars takes no closure"
        for group in self.param_groups:
            wd, momentum = group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if wd != 0:
                    w_norm, g_norm = p.norm(), grad.norm()
                    ratio = group["trust_coeff"] * w_norm / (g_norm + wd * w_norm + group["eps"])
                    grad = grad.add(p, alpha=wd).mul_(_trust(w_norm, g_norm, ratio))
                if momentum != 0:
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = grad.detach().clone()
                    else:
                        state["momentum_buffer"].mul_(momentum).add_(grad)
                    buf = state["momentum_buffer"]
                    grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
                p.add_(grad, alpha=-group["lr"])


class Lamb(torch.optim.Optimizer):
    """LAMB as timm's `Lamb` (see the module): the gradients divided by their global norm where it is above
    LAMB_MAX_GRAD_NORM; Adam's moments (bias-corrected); for each tensor with weight decay, the update
    m / (sqrt(v) + eps) + wd x w scaled by |w| / |update|."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        betas: tuple[float, float] = ADAMW_BETAS,
        eps: float = LAMB_EPS,
        weight_decay: float = 0.01,
    ):
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        assert closure is None, "Lamb takes no closure"
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        if not grads:
            return
        norm = get_total_norm(grads)
        divide = torch.clamp(norm / LAMB_MAX_GRAD_NORM, min=1.0)
        for group in self.param_groups:
            (beta1, beta2), wd = group["betas"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad / divide
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
                state["step"] += 1
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denom = (v.sqrt() / (1 - beta2 ** state["step"]) ** 0.5).add_(group["eps"])
                update = (m / (1 - beta1 ** state["step"])).div_(denom)
                if wd != 0:
                    update.add_(p, alpha=wd)
                    w_norm, u_norm = p.norm(), update.norm()
                    update.mul_(_trust(w_norm, u_norm, w_norm / u_norm))
                p.add_(update, alpha=-group["lr"])


def warn_unadapted(t: Any) -> None:
    """LARS or LAMB with no weight decay, said: they adapt the tensors with decay alone (as timm's), so they step as
    SGD or Adam (found by review)."""
    if t.optimizer in ("lars", "lamb") and t.weight_decay == 0:
        warn(f"train.optimizer = {t.optimizer!r} adapts the rate of the tensors with weight decay, and "
             "train.weight_decay is 0: it steps as plain SGD or Adam")  # fmt: skip
