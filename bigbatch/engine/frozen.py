"""Param groups marked "frozen" (a fine-tuning's frozen body, as fastai's `freeze`): in one process their
parameters stop requiring grad while frozen, so backward computes none of their weight gradients (nor, below
the lowest part that trains, any gradient at all), as fastai's freeze does by `requires_grad`. The step is
the same to the bit: what trains gets the gradients it got. Under DDP, whose reducer waits for a gradient of
every parameter it was built with, they are computed and dropped instead (Replicator.step)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def hold(opt: torch.optim.Optimizer, held: list[torch.nn.Parameter], everything: bool) -> None:
    """Set the parameters of `opt`'s frozen groups not to require grad (all of them again with `everything`,
    as a memory probe must measure them, and under DDP). `held` (the optimizer's own list) keeps those this
    turned off: only they are turned on again, never a parameter its user froze."""
    everything = everything or all(g.get("frozen") for g in opt.param_groups)  # (then the step says so, in a line)
    frozen = set() if everything else {id(p) for g in opt.param_groups if g.get("frozen") for p in g["params"]}
    for p in held:
        if id(p) not in frozen:
            p.requires_grad_(True)
    held[:] = [p for p in held if id(p) in frozen]
    for p in (p for g in opt.param_groups if g.get("frozen") and not everything for p in g["params"]):
        if p.requires_grad:
            p.requires_grad_(False)
            held.append(p)


def drop_grads(opt: torch.optim.Optimizer) -> None:
    """Forget the gradients of `opt`'s frozen groups (computed where `hold` cannot stop them: under DDP)."""
    for p in (p for group in opt.param_groups if group.get("frozen") for p in group["params"]):
        p.grad = None


def thaw(states: Iterable[Any]) -> None:
    """Every parameter `hold` set not to require grad requires it again (`states`: the Replicator's optimizers')."""
    for state in states:
        hold(state.opt, state.held, everything=True)
