"""Param groups marked "frozen" (a fine-tuning's frozen body, as fastai's `freeze`): in one process their
parameters stop requiring grad while frozen, so backward computes none of their weight gradients (nor, below
the lowest part that trains, any gradient at all), as fastai's freeze does by `requires_grad`. In eager mode
the step is the same to the bit: what trains gets the gradients it got (compiled, the graph is traced again
without them, and fused otherwise). Under DDP, whose reducer waits for a gradient of every parameter it was
built with, they are computed and dropped instead (Replicator.step)."""

from __future__ import annotations

import torch


def hold(opt: torch.optim.Optimizer, held: list[torch.nn.Parameter], everything: bool = False) -> None:
    """Before a step of `opt`: the parameters of its frozen groups stop requiring grad, and those `held` (the
    Replicator's list of what this turned off) that `opt` now trains require it again, as do all with
    `everything` (a memory probe measures every gradient; DDP). Never a parameter its user froze, and not one
    another optimizer holds frozen (a GAN's G and D each keep theirs). An optimizer whose groups are all frozen
    is left to the step, which says so in one line."""
    groups = opt.param_groups
    if not held and (everything or not any(g.get("frozen") for g in groups)):  # (most steps: nothing to do)
        return
    everything = everything or all(g.get("frozen") for g in groups)
    trains = {id(p) for g in groups if everything or not g.get("frozen") for p in g["params"]}
    for p in held:
        if everything or id(p) in trains:
            p.requires_grad_(True)
    held[:] = [] if everything else [p for p in held if id(p) not in trains]
    for p in (p for g in groups if g.get("frozen") and not everything for p in g["params"]):
        if p.requires_grad:
            p.requires_grad_(False)
            held.append(p)


def thaw(held: list[torch.nn.Parameter]) -> None:
    """Every parameter `hold` turned off requires grad again (a memory probe; the Replicator closing)."""
    for p in held:
        p.requires_grad_(True)
    held.clear()


def drop_grads(opt: torch.optim.Optimizer) -> None:
    """Forget the gradients of `opt`'s frozen groups (computed where `hold` cannot stop them: under DDP)."""
    for p in (p for group in opt.param_groups if group.get("frozen") for p in group["params"]):
        p.grad = None
