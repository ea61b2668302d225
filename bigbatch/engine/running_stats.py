"""BatchNorm running statistics that do not depend on how a step's batch is split.

In training, BatchNorm normalizes with each micro-batch's own statistics and moves its running
statistics towards them: r <- (1 - m) r + m x, once per forward. One process with k micro-batches
applies k such updates in a row; k processes of one micro-batch each apply one update each, to
copies that then had to be averaged (close to, not equal with, the one process's). Here every
micro-batch's updates are captured on the rank that computes them and replayed on every rank in the
global order of the micro-batches (rank 0's, then rank 1's, ...), which is the order one process
computes them in: so the running statistics, like the weights, are the same bit for bit whatever the
number of processes (with equal threads per process), and the same on every rank.

How: each micro-batch's forward starts from the statistics before the step (on every rank the same)
and leaves r1, BatchNorm's own kernel's result (whatever the model's layout, compile or precision),
counting its calls c in num_batches_tracked. After the step, starting from the statistics r0 before it,
each micro-batch in global order gives r <- r1 + (1 - m)^c (r - r0): the micro-batch's own update of
r0, plus what the micro-batches before it moved the statistics, decayed as its forward decays them.
This is the same arithmetic in one process as in many. With one micro-batch it is PyTorch's, bit for
bit; with several, PyTorch's sequential updates within rounding. Inside a step the statistics read as
a plain BatchNorm's would within its first micro-batch (a forward in eval mode there, or code that
reads them, sees those before the step, or after this micro-batch's forward). BatchNorms with
momentum=None (a cumulative average, whose factor depends on the count) keep PyTorch's update and are
averaged over ranks after the step.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from bigbatch.engine import dist
from bigbatch.errors import warn


def captured(models: Iterable[nn.Module]) -> list[nn.modules.batchnorm._BatchNorm]:
    """The BatchNorms of `models` whose running statistics a step captures and replays."""
    return [
        m
        for model in models
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats and m.momentum is not None
    ]


def has_batchnorm(models: Iterable[nn.Module]) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for model in models for m in model.modules())


def span(micro_batch: int, world_size: int, sync_bn: bool) -> int:
    """How many images a BatchNorm's statistics span in training: a micro-batch (of every rank with sync_bn)."""
    return micro_batch * (world_size if sync_bn else 1)


SMALL_SPAN = 16  # below this many images a step's statistics are noisy (Wu & He 2018: BatchNorm's error rises)


def span_small(
    micro_batch: int, world_size: int, sync_bn: bool, share: int, planned: str, checkpointed: bool, given: bool = False
) -> str | None:
    """What to tell a run whose BatchNorms' statistics span fewer than SMALL_SPAN images where a process's `share` of
    the step holds more (`planned`: what chose the micro-batch; `checkpointed`: with activation checkpointing
    already; `given`: the micro-batch was set, not planned by "auto"); None if they span enough."""
    now = span(micro_batch, world_size, sync_bn)
    if now >= min(SMALL_SPAN, span(share, world_size, sync_bn)):
        return None
    wider = ", train.sync_bn spans the processes' micro-batches" if world_size > 1 and not sync_bn else ""
    budget = f"{'' if checkpointed else 'train.checkpointing or '}a larger train.memory_budget"
    fix = f"{budget} fits more{wider}"
    if given:
        budget, fix = (
            "a larger train.micro_batch",
            f"a larger train.micro_batch spans more ('auto': the largest that fits){wider}",
        )
    following = min(d for d in range(micro_batch + 1, share + 1) if share % d == 0)
    if following > 2 * max(micro_batch, SMALL_SPAN):  # (found from outside: batch 67, prime, planned 1 x 67, and the
        near = max(1, round(share / SMALL_SPAN)) * SMALL_SPAN * world_size  # budget alone was blamed)
        fix = (
            f"a process's share of {share} has no divisor between {micro_batch} and {following}: give train.batch a "
            f"number of more divisors (such as {near}), or {budget} may fit it whole{wider}"
        )
    return (
        f"{planned}: BatchNorm statistics span only {now} image{'s' * (now != 1)} of a step's {share * world_size}, "
        f"which trains a BatchNorm network otherwise than at its whole batch; {fix}"
    )


def span_changed(before: int, micro_batch: int, world_size: int, sync_bn: bool, share: int) -> str | None:
    """What to tell a resumed run whose BatchNorm statistics spanned `before` images and now span another
    number (another micro-batch, or with sync_bn another world size), with what keeps them if this world
    size can (a micro-batch divides a process's `share` of the step); None if unchanged."""
    now = span(micro_batch, world_size, sync_bn)
    if now == before:
        return None
    per = world_size if sync_bn else 1
    how = f"micro_batch {micro_batch}" + (f" x {per} processes with sync_bn" if per > 1 else "")
    if before % per == 0 and share % (before // per) == 0:
        keep = f"give train.micro_batch={before // per} to keep them"  # (a Replicator's user reads micro_batch=)
    else:  # (a micro-batch is at most a process's share of the step, and divides it)
        keep = f"at {world_size} processes a micro-batch divides a process's {share} images: resume at the world "
        keep += "size the run had to keep them"
    return (
        f"BatchNorm statistics now span {now} images ({how}), {before} before this resume: training goes on, "
        f"but not as the run left alone would have ({keep})"
    )


class StepStatistics:
    """One optimizer step's running-statistics updates: `micro_batch()` before each micro-batch's forward,
    `end()` after the last (on every rank, as a collective), `abandon()` if the step raised.
    `across_ranks`: the BatchNorms' statistics span the ranks' micro-batches already (sync_bn): every
    rank holds the same updates, the global micro-batch's, and replays its own."""

    def __init__(self, bns: list[nn.modules.batchnorm._BatchNorm], across_ranks: bool = False):
        # Those in training mode: a BatchNorm in eval mode (frozen, as in fine-tuning) reads its statistics
        # in the forward and leaves them as they are.
        self.bns, self.across_ranks = [m for m in bns if m.training], across_ranks
        self.buffers = [b for m in self.bns for b in (m.running_mean, m.running_var)]
        self.tracked = [m.num_batches_tracked for m in self.bns]
        # The statistics before the step, copied in a few multi-tensor kernels (on a GPU a launch each costs the
        # host microseconds: ResNet-50's 53 BatchNorms took 445 a step one tensor at a time, 30 now).
        self.start = torch._foreach_mul(self.buffers, 1.0) if self.buffers else []  # (x * 1: x, -0.0 and NaN too)
        self.counts = torch.stack(self.tracked) if self.bns else None
        self.updates: list[torch.Tensor] = []  # per micro-batch: its r1 of every buffer, flat
        self.calls: list[torch.Tensor] = []  # per micro-batch: each BatchNorm's forward calls
        self.open = False

    @torch.no_grad()
    def micro_batch(self) -> None:
        if not self.bns:  # (the same models on every rank: none of them gathers either)
            return
        self._close()
        torch._foreach_copy_(self.buffers, self.start)
        self.before = torch.stack(self.tracked)
        self.open = True

    @torch.no_grad()
    def close(self) -> list[torch.Tensor]:
        """After the last micro-batch, on every rank (a collective): what `end` decides by, as float64 tensors
        for the caller to read on the host with its own (on a GPU each read waits for the device's queue):
        whether every update was finite, and each micro-batch's count of each BatchNorm's forwards. Nothing
        without BatchNorms in training."""
        self._close()
        if not self.updates:
            return []
        updates, calls = torch.stack(self.updates), torch.stack(self.calls)
        if not self.across_ranks:  # every rank's micro-batches, rank 0's first
            updates, calls = torch.cat(dist.in_rank_order(updates)), torch.cat(dist.in_rank_order(calls))
        self.gathered = updates, calls.shape
        return [torch.isfinite(updates).all().double().reshape(1), calls.flatten().double()]

    @torch.no_grad()
    def end(self, read: list[float]) -> bool:
        """Replay every rank's micro-batches in global order onto the statistics before the step; whether
        they were finite (if not, the statistics before the step stay: a forward that overflowed, its
        loss not depending on every BatchNorm, would have made them NaN for good). `read`: what `close`
        gave, read on the host (the same on every rank: they agree)."""
        if not self.updates:
            self.abandon()
            return True
        (updates, shape), finite = self.gathered, bool(read[0])
        self.abandon()  # back to the statistics before the step
        if not finite:
            return False
        calls = [[int(k) for k in read[1 + i * shape[1] : 1 + (i + 1) * shape[1]]] for i in range(shape[0])]
        sizes = [b.numel() for b in self.buffers]
        factors = [1.0 - m.momentum for m in self.bns for _ in (0, 1)]
        for r1, c in zip(updates, calls):
            n = [k for m_calls in c for k in (m_calls, m_calls)]
            moved = torch._foreach_sub(self.buffers, self.start)  # (zero for the first: r1 stays as it is)
            torch._foreach_mul_(moved, [f**k for f, k in zip(factors, n)])
            torch._foreach_add_(moved, [v.view_as(b) for v, b in zip(r1.split(sizes), self.buffers)])
            torch._foreach_copy_(self.buffers, moved)
        ran = torch.tensor(calls).sum(0).to(self.counts, non_blocking=True)  # (the host's counts)
        torch._foreach_copy_(self.tracked, list((self.counts + ran).unbind()))
        return True

    @torch.no_grad()
    def abandon(self) -> None:
        """Put back the statistics before the step."""
        if self.bns:
            torch._foreach_copy_(self.buffers, self.start)
            torch._foreach_copy_(self.tracked, list(self.counts.unbind()))
        self.open = False

    def _close(self) -> None:
        if not self.open:
            return
        self.updates.append(torch.cat([b.flatten() for b in self.buffers]))
        self.calls.append(torch.stack(self.tracked) - self.before)
        self.open = False


_NONE = object()  # (no first batch)


@torch.no_grad()
def reestimate(model: nn.Module, batches: Iterable[Any], forward: Callable[[Any], object] | None = None) -> int:
    """Recompute `model`'s BatchNorm running statistics as the plain average over `forward(batch)` (by
    default `model(batch)`) for each of `batches`, with the BatchNorms alone in training mode, so nothing
    else (dropout, spectral-norm vectors) changes: BigGAN's standing statistics, and the "precise BN" of
    Wu & Johnson 2021 (SWA's `update_bn`). The statistics become a function of the weights and the inputs
    only, whatever they were before. Every module's mode is left as it was (a network in training goes on
    training); returns the number of batches; with none, the statistics stay as they were."""
    batches = iter(batches)
    first = next(batches, _NONE)
    if first is _NONE:
        return 0
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    modes = [(m, m.training) for m in model.modules()]
    momenta = [m.momentum for m in bns]
    model.eval()
    for m in bns:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the batches below
        m.train()
    n = 0
    try:
        for batch in itertools.chain([first], batches):
            (model if forward is None else forward)(batch)
            n += 1
    finally:
        for m, momentum in zip(bns, momenta):
            m.momentum = momentum
        for m, training in modes:
            m.train(training)
    return n


def average_the_rest(model: nn.Module, replayed: list[nn.Module]) -> None:
    """Average over ranks the running statistics of `model`'s BatchNorms not in `replayed` (those StepStatistics
    replays in global order are the same on every rank already): one with momentum=None, whose running statistics
    are a cumulative average. A no-op in one process."""
    if not dist.active():
        return
    skip = {id(m) for m in replayed}
    bufs = [
        b
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats and id(m) not in skip
        for b in (m.running_mean, m.running_var)
    ]
    if bufs:
        flat = dist.mean(torch.cat([b.flatten().float() for b in bufs]))
        for b, v in zip(bufs, flat.split([b.numel() for b in bufs])):
            b.copy_(v.view_as(b))


def say_not_finite(name: str, step: int, count: int, main: bool) -> None:
    """Warn (on the `main` process) that the optimizer `name`'s step `step` left its BatchNorm statistics as before
    it, not finite: the `count`-th such step, said at the 1st, 10th, 100th, ..."""
    if main and str(count).strip("0") == "1":
        so_far = f" ({count} steps so far: the run's updates are diverging)" if count > 1 else ""
        warn(f"{name} step {step}: BatchNorm statistics not finite, left as before the step{so_far}")
