"""DeepFaceLab's optimizers (core/leras/optimizers), update for update: AdaBelief and RMSprop with
DFL's lr dropout and cosine rate. The adabelief-pytorch package implements the paper (bias
correction, epsilon inside the root, weight decay), which DFL's does not; so this short one."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import torch

from bigbatch.data.streams import LR_DROPOUT as LR_DROPOUT_STREAM
from bigbatch.data.streams import generator
from bigbatch.engine.batch_parts import runs

EPS = 1e-6  # np.finfo(np.float32).resolution, added outside the square root
LR_DROPOUT, LR_COS = 0.3, 500  # DFL's lr_dropout option: these two together


class _DFLOptimizer(torch.optim.Optimizer):
    """Shared by both: lr_dropout p < 1 updates each element with probability p, lr_cos N multiplies
    the rate by (cos(2π·step/N) + 1) / 2, step counting the optimizer's steps (one counter, DFL's
    `iters`, kept in each param group so that it is checkpointed). DFL couples them: its lr_dropout
    option on means lr_dropout=0.3 with lr_cos=500 (both off in pretraining). Clipping (DFL's
    clipnorm 1.0) is the engine's `grad_clip`, applied before the step. The dropout masks of a step come
    from a stream keyed by `seed` (integers) and the step, so a resumed run and every rank draw the same."""

    moments: tuple[str, ...] = ()  # the state kept per parameter (its names in the state dict), from zero

    def __init__(self, params: Iterable, defaults: dict, seed: tuple[int, ...] = (0,)) -> None:
        if not 0.0 < defaults["lr_dropout"] <= 1.0:
            raise ValueError(f"lr_dropout must be in (0, 1], got {defaults['lr_dropout']}")
        super().__init__(params, defaults)
        self.seed = tuple(seed)

    def _rate(self, group: dict) -> float:
        """This step's rate; counts the step (every step, whether or not a parameter has a gradient)."""
        step = group.setdefault("step", 0)
        group["step"] = step + 1
        lr = group["lr"]
        if group["lr_cos"]:
            lr *= (math.cos(step * (2 * math.pi / group["lr_cos"])) + 1.0) / 2.0
        return lr

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001, ANN201 - torch's signature
        loss = closure() if closure is not None else None
        for g, group in enumerate(self.param_groups):
            step = group.get("step", 0)
            lr = self._rate(group)
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                if not self.state[p]:  # its moments start at zero
                    self.state[p].update((name, torch.zeros_like(p.grad)) for name in self.moments)
            keys = (self.seed[0], LR_DROPOUT_STREAM, *self.seed[1:], g, step) if group["lr_dropout"] < 1 else None
            for part in (_on_cpu if params and params[0].device.type == "cpu" else _on_device)(
                [[p, p.grad, *(self.state[p][name] for name in self.moments)] for p in params],
                keys,
                group["lr_dropout"],
            ):
                pieces, grads, *moments, masks = part
                diffs = self._directions(group, grads, dict(zip(self.moments, moments)))
                torch._foreach_mul_(diffs, -lr)  # (the same arithmetic as -lr * direction, element by element)
                if masks:  # lr dropout: each element updated with probability lr_dropout
                    torch._foreach_mul_(diffs, masks)
                torch._foreach_add_(pieces, diffs)
        return loss

    def _directions(self, group: dict, g: list[torch.Tensor], state: dict) -> list[torch.Tensor]:
        """The updates of (pieces of) parameters before the rate (new tensors), from their gradients `g`,
        their moments (the same pieces of each, lists by name in `state`) updated in place."""
        raise NotImplementedError


PIECE = 1 << 18  # elements: on CPU, what the update's passes go over while it is in cache
DEVICE_PART = 1 << 22  # elements: on a GPU, what the update's passes go over at once (its temporaries: 64 MiB)
Part = tuple[list[torch.Tensor], ...]  # (parameters, gradients, each moment, lr dropout masks): matching pieces


def _pieces(group: list[torch.Tensor], size: int) -> Iterable[tuple[torch.Tensor, ...]]:
    """A parameter's tensors (it, its gradient, its moments, ...) cut alike into flat pieces of at most `size`
    elements, or whole when one of them is not contiguous."""
    if all(t.is_contiguous() for t in group):
        return zip(*(t.view(-1).split(size) for t in group))
    return [tuple(group)]


def _on_cpu(tensors: list[list[torch.Tensor]], keys: tuple[int, ...] | None, keep: float) -> Iterator[Part]:
    """On CPU, each parameter (with its gradient and moments) cut into flat pieces of PIECE elements (whole
    when one is not contiguous), one piece a part: the update's half-dozen elementwise passes then run over
    a piece while it is in cache. The same arithmetic element by element, so the same bits; 1.45x faster on
    SAEHD's 82M weights on one core (175 -> 120 ms). Its lr dropout masks are drawn whole, parameter by
    parameter, from one CPU stream keyed by `keys`."""
    draw = generator(*keys) if keys is not None else None
    for group in tensors:
        masks = [torch.rand(group[0].shape, generator=draw, device=group[0].device) < keep] if draw is not None else []
        for piece in _pieces(group + masks, PIECE):
            yield (*([t] for t in piece[: len(group)]), list(piece[len(group) :]))


def _on_device(tensors: list[list[torch.Tensor]], keys: tuple[int, ...] | None, keep: float) -> Iterator[Part]:
    """On a GPU, the parameters in parts of about DEVICE_PART elements (many small ones together, a large
    one cut into pieces), each part's passes as multi-tensor kernels: about 600 launches a step where
    CPU-sized pieces took ten thousand (SAEHD 512's 251M weights, 86 tensors). Its lr dropout masks are
    drawn on the device, piece by piece, from a device stream keyed by `keys` (the same on every rank)."""
    draw = generator(*keys, device=tensors[0][0].device) if keys is not None and tensors else None
    pieces = (piece for group in tensors for piece in _pieces(group, DEVICE_PART))
    for run in runs(pieces, lambda piece: piece[0].numel(), DEVICE_PART):
        part = tuple(list(column) for column in zip(*run))
        masks = []
        if draw is not None:
            masks = [torch.rand(t.shape, generator=draw, device=t.device).lt_(keep) for t in part[0]]
        yield (*part, masks)


class AdaBelief(_DFLOptimizer):
    """DFL's AdaBelief: m = β1·m + (1-β1)·g; v = β2·v + (1-β2)·(g - m)² with the new m; p -= lr·m /
    (√v + 1e-6). No bias correction, no weight decay; m and v start at zero."""

    moments = ("m", "v")

    def __init__(
        self,
        params: Iterable,
        lr: float = 5e-5,
        betas: tuple[float, float] = (0.9, 0.999),
        lr_dropout: float = 1.0,
        lr_cos: int = 0,
        seed: tuple[int, ...] = (0,),
    ) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, lr_dropout=lr_dropout, lr_cos=lr_cos), seed)

    def _directions(self, group: dict, g: list[torch.Tensor], state: dict) -> list[torch.Tensor]:
        b1, b2 = group["betas"]
        m, v = state["m"], state["v"]
        torch._foreach_mul_(m, b1)
        torch._foreach_add_(m, g, alpha=1 - b1)
        belief = torch._foreach_sub(g, m)
        torch._foreach_mul_(v, b2)
        torch._foreach_addcmul_(v, belief, belief, value=1 - b2)
        del belief
        denom = torch._foreach_sqrt(v)
        torch._foreach_add_(denom, EPS)
        return torch._foreach_div(m, denom)


class RMSprop(_DFLOptimizer):
    """DFL's RMSprop: a = ρ·a + (1-ρ)·g²; p -= lr·g / (√a + 1e-6)."""

    moments = ("acc",)

    def __init__(
        self,
        params: Iterable,
        lr: float = 5e-5,
        rho: float = 0.9,
        lr_dropout: float = 1.0,
        lr_cos: int = 0,
        seed: tuple[int, ...] = (0,),
    ) -> None:
        super().__init__(params, dict(lr=lr, rho=rho, lr_dropout=lr_dropout, lr_cos=lr_cos), seed)

    def _directions(self, group: dict, g: list[torch.Tensor], state: dict) -> list[torch.Tensor]:
        acc = state["acc"]
        torch._foreach_mul_(acc, group["rho"])
        torch._foreach_addcmul_(acc, g, g, value=1 - group["rho"])
        denom = torch._foreach_sqrt(acc)
        torch._foreach_add_(denom, EPS)
        return torch._foreach_div(g, denom)
