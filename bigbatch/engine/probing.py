"""micro_batch "auto": the largest micro-batch whose step fits the memory budget, found by probing it (a
Replicator's memory planning; the Replicator keeps the plan)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from bigbatch.engine import dist, frozen, memory
from bigbatch.errors import BigbatchError, warn


class _OneImage(Exception):
    """A probe at micro-batch 1 that the model cannot train (a BatchNorm of one value per channel)."""


def fit(
    rep: Any,
    probe: Callable[[int], None],
    optimizers: list[torch.optim.Optimizer],
    resident: Sequence[torch.nn.Module] = (),
) -> tuple[int, list[memory.Probe], int]:
    """The micro-batch the Replicator `rep`'s plan_micro_batch settles on, the probes that found it, and the budget
    they fit in. `resident`: models held through the step that it does not train (an average of the weights)."""
    frozen.thaw(rep._held)  # (the probes measure every gradient: a frozen body's too)
    if rep.sync_bn and rep.world_size > 1 and rep.device.type == "cuda":
        # An OOM on one rank mid-probe would leave the others waiting in SyncBatchNorm's collective.
        raise BigbatchError("micro_batch='auto' cannot probe with sync_bn across GPUs; give micro_batch a number")
    local = memory.local_world()
    budget = rep.memory_budget or memory.default_budget(rep.device, local)
    if rep.device.type == "cuda":
        total = torch.cuda.get_device_properties(rep.device).total_memory
        if budget > total:
            raise BigbatchError(
                f"memory budget {memory.format_bytes(budget)} exceeds the GPU's {memory.format_bytes(total)}"
            )
        # Probes beyond the budget fail as on a GPU of that size; the cap is lifted when probing ends.
        torch.cuda.set_per_process_memory_fraction(memory.CUDA_HEADROOM * budget / total, rep.device)
    elif rep.memory_budget and rep.is_main and budget > (share := memory.default_budget(rep.device, local)):
        warn(  # (found from outside: a budget of TiB, a typo for GiB, was taken without a word; refused on a GPU)
            f"memory budget {memory.format_bytes(budget)} is more than the {memory.format_bytes(share)} of free memory "
            f"this process's share of the machine is ({local} here): probes are counted, not held to it, on a CPU"
        )
    plain, cuda = [p for p, _ in rep.models], [rep.device] if rep.device.type == "cuda" else []
    baseline = memory.state_bytes(plain, optimizers, not cuda) - (memory.state_bytes(plain, []) if cuda else 0)
    # (a CPU counts what the step makes on top of the models: G_ema, a classifier's average too, found from outside;
    # on a GPU, where the allocator's peak is measured, they are in it)
    baseline += 0 if cuda else memory.state_bytes(resident, [])
    sizes = [d for d in range(1, rep.share + 1) if rep.share % d == 0 and rep.takes_micro(d)]  # (to try)
    saved = memory.save_buffers(plain)
    holders = [*optimizers, *plain]  # (of gradients)

    def fresh(m: int) -> None:  # each probe makes the gradients, as a step from zero_grad does (on CPU,
        memory.zero_grads(holders)  # where new storages are counted, a probe after the first found them
        try:  # made and left them out)
            probe(m)
        except ValueError as e:  # (found from outside: PyTorch's traceback, where the plan had come to 1)
            if "Expected more than 1 value per channel" not in str(e):
                raise
            raise _OneImage from None

    try:
        with torch.random.fork_rng(devices=cuda), _said_over(rep, plain, resident, optimizers):  # (the probes' torch
            try:  # draws: their own; NumPy's and Python's, seeded again before each micro-batch that trains)
                micro, probes = memory.fit_micro_batch(fresh, sizes, rep.device, budget, baseline, dist.agree)
            except _OneImage:  # (a BatchNorm1d over one image: 1 is no micro-batch of this model)
                if not sizes[1:]:
                    raise BigbatchError(
                        f"this rank's share of the batch is {rep.share} image, and a BatchNorm of this model needs "
                        "more than one value per channel (BatchNorm1d over one image): give a larger batch"
                    ) from None
                try:
                    micro, probes = memory.fit_micro_batch(fresh, sizes[1:], rep.device, budget, baseline, dist.agree)
                except _OneImage:  # (found by review: another size's, escaping as a private error)
                    raise BigbatchError(
                        "a probe of this model's step raised PyTorch's 'Expected more than 1 value per channel' at "
                        "a micro-batch above 1: a BatchNorm of it sees one value per channel there"
                    ) from None
    finally:
        memory.restore_buffers(saved)
        memory.zero_grads(holders)
        if rep.device.type == "cuda":
            torch.cuda.set_per_process_memory_fraction(1.0, rep.device)
    return micro, probes, budget


@contextmanager
def _said_over(
    rep: Any, models: list[torch.nn.Module], resident: Sequence[torch.nn.Module], optimizers: list
) -> Iterator[None]:
    """A budget that not even the smallest micro-batch fits, said with the part of it no micro-batch changes (the
    weights, their gradients, the optimizer's state, the `resident` models) and the settings that lower the rest that
    are not on already (found from outside: bf16 and checkpointing advised to a run that had both, and nothing said
    of a floor above the budget)."""
    try:
        yield
    except memory.OverBudget as e:
        fixed = memory.state_bytes([*models, *resident], optimizers, existing=True) + memory.trained_bytes(optimizers)
        held = f"the weights, their gradients{',' if resident else ' and'} the optimizer's state"
        held += " and averages" if resident else ""  # (as a dry run says them: found from outside, 2.4 MiB apart)
        if fixed >= e.budget:
            raise BigbatchError(
                f"{e}: {held} alone take {memory.format_bytes(fixed)}, which no micro-batch, precision or "
                "checkpointing lowers; raise train.memory_budget, or give a smaller model"
            ) from None
        ways = ["bf16"] * (rep.precision == "fp32") + ["activation checkpointing"] * (not rep.checkpointing)
        lower = f", use {' or '.join(ways)}" if ways else ""
        raise BigbatchError(
            f"{e}, {memory.format_bytes(fixed)} of it {held}; raise train.memory_budget{lower}, or give a smaller model"
        ) from None
