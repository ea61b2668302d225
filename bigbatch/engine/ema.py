"""Exponential moving average of G's weights, with the half-life counted in images (Karras et al.)."""

from __future__ import annotations

import copy
import numbers

import torch
from torch import nn

from bigbatch.engine.batch_parts import runs
from bigbatch.errors import BigbatchError, whole_number

PART = 1 << 24  # elements blended at once (64 MiB of temporaries in fp32; a tensor larger than that alone)


def _averaged(net: nn.Module) -> list[bool]:
    """Which of `net`'s buffers (in `buffers()` order) an average of buffers takes: the floating-point ones but
    those its modules name in `ema_copies`. Worked out once a network (its buffers' names do not change)."""
    known = net.__dict__.get("_ema_averaged")
    if known is None:
        copied = {f"{name}.{b}".lstrip(".") for name, m in net.named_modules() for b in getattr(m, "ema_copies", ())}
        known = [b.is_floating_point() and name not in copied for name, b in net.named_buffers()]
        net.__dict__["_ema_averaged"] = known
    return known


def make_ema(G: nn.Module) -> nn.Module:
    """A frozen copy of G in eval mode (without the engine's activation-checkpointing wrappers)."""
    from bigbatch.engine.wrap import strip_wrappers

    return strip_wrappers(copy.deepcopy(G)).eval().requires_grad_(False)


@torch.no_grad()
def update_ema(
    G_ema: nn.Module,
    G: nn.Module,
    nimg: int,
    images: int,
    halflife_kimg: float,
    start_kimg: float,
    rampup: float = 0.0,
    average_buffers: bool = False,
) -> None:
    """Blend G into G_ema after `images` more images (`nimg` seen in all); before `start_kimg` G_ema is
    a plain copy. With `rampup`, the half-life is at most rampup x the images seen before these (StyleGAN2-ADA's
    ema_rampup, whose first step copies G: found from outside, the count after them blended it in at 1 - 1e-6).

    beta = 0.5 ** (images / half-life), so the average forgets at the same rate per image whatever
    the batch size. Buffers (BN running statistics, spectral-norm vectors) are copied from G, or with
    `average_buffers` their floating-point ones averaged like the weights (timm's ModelEmaV2, BigGAN-PyTorch's
    and StudioGAN's EMA): BN statistics that belong to the averaged weights, not to the latest; but those a
    module names in its `ema_copies` (spectral norm's vectors: they are read as unit vectors, and an average
    of them is none) are copied still.
    """
    halflife = halflife_kimg * 1000
    if rampup:
        halflife = min(halflife, rampup * (nimg - images))
    if nimg < start_kimg * 1000 or halflife == 0:
        beta = 0.0
    else:
        beta = 0.5 ** (images / halflife)

    # In parts of about PART elements, each at once (multi-tensor kernels: a few launches on a GPU where a pair
    # of ops per tensor took hundreds; the blend's temporaries a part's, not all of G's weights: 280 MB for
    # BigGAN-128); element by element the same arithmetic as p.lerp(p_ema, beta), so the same bits.
    def blend(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        for part in runs(pairs, lambda pair: pair[0].numel(), PART):
            ema, new = [e for e, _ in part], [x for _, x in part]
            torch._foreach_copy_(ema, torch._foreach_lerp(new, ema, beta))

    buffers = list(zip(G_ema.buffers(), G.buffers()))
    averaged = _averaged(G_ema) if average_buffers else [False] * len(buffers)
    blend(list(zip(G_ema.parameters(), G.parameters())))
    blend([pair for pair, a in zip(buffers, averaged) if a])
    copied = [pair for pair, a in zip(buffers, averaged) if not a]
    if copied:
        torch._foreach_copy_([e for e, _ in copied], [b for _, b in copied])


class EMA(nn.Module):
    """An average of a model's weights for a script on the Replicator (timm's ModelEmaV2, a Lightning EMA callback),
    with the half-life counted in images, so it forgets at the same rate per image whatever the batch:

        ema = bigbatch.EMA(model, halflife_kimg=10)   # a frozen copy of the model, in eval mode
        ...
        rep.step(step_fn, share, opt); ema.update(rep.batch)   # after each step, the step's images
        samples = ema(z)                               # or ema.module, the averaged network

    `start_kimg`: a plain copy before it; `rampup`: the half-life at most rampup x the images seen (StyleGAN2-ADA's
    ema_rampup); `average_buffers`: BatchNorm statistics averaged as the weights (timm's), else the model's.
    `rep.save(..., ema=ema)` and `rep.load(..., ema=ema)` keep it with the images it has seen."""

    def __init__(
        self,
        model: nn.Module,
        halflife_kimg: float,
        start_kimg: float = 0.0,
        rampup: float = 0.0,
        average_buffers: bool = False,
    ):
        super().__init__()
        amounts = (halflife_kimg, start_kimg, rampup)
        if not isinstance(model, nn.Module) or not all(
            isinstance(v, numbers.Real) and not isinstance(v, bool) and v >= 0 for v in amounts
        ):
            raise BigbatchError(
                f"EMA takes a model and a half-life, start and rampup >= 0, got {type(model).__name__}, "
                f"{halflife_kimg!r}, {start_kimg!r}, {rampup!r}"
            )
        live = getattr(model, "module", model) if isinstance(model, nn.parallel.DistributedDataParallel) else model
        live = getattr(live, "_orig_mod", live)  # (what prepare returns may be compiled: the plain model, found by
        # review; a copy of the compiled one saved its weights under _orig_mod. and compiled anew)
        object.__setattr__(self, "live", live)  # (the model averaged: not a submodule, saved on its own)
        self.module = make_ema(live)
        self.halflife_kimg, self.start_kimg, self.rampup = halflife_kimg, start_kimg, rampup
        self.average_buffers = average_buffers
        self.register_buffer("nimg", torch.zeros((), dtype=torch.int64, device="cpu"))  # (a host counter, saved)
        self.training = False

    def update(self, images: int) -> None:
        """Blend the model in after a step of `images` images (the step's whole batch, over every rank)."""
        images = whole_number("EMA.update takes the step's images (rep.batch): they", images, 1)
        self.nimg += images
        how = (self.halflife_kimg, self.start_kimg, self.rampup, self.average_buffers)
        update_ema(self.module, self.live, int(self.nimg), images, *how)

    def forward(self, *args: object, **kwargs: object) -> object:
        return self.module(*args, **kwargs)

    def train(self, mode: bool = True) -> EMA:  # (the average stays in eval mode: frozen statistics, no dropout)
        return self
