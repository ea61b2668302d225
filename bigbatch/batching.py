"""The batch plan of a config: the Replicator it trains with, every data.schedule phase checked against
the world size before anything runs, and the plan in one line (the banner, `train --dry-run`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from bigbatch.config import MAX_BATCH, Config, TrainConfig, register_check
from bigbatch.data.schedule import Phase, schedule_of
from bigbatch.engine import dist, wrap
from bigbatch.engine.arguments import config_terms
from bigbatch.engine.memory import format_bytes, parse_bytes
from bigbatch.engine.plan import Plan, make_plan
from bigbatch.engine.replicator import Replicator
from bigbatch.errors import BigbatchError, warn


@register_check("train")
def _check_memory_budget(t: TrainConfig) -> None:
    if t.memory_budget:
        try:
            parse_bytes(t.memory_budget)
        except BigbatchError as e:
            said = str(e).replace("cannot read memory budget", "cannot be read:").removeprefix("memory budget ")
            t._fail("memory_budget", said)


def replicator_for(cfg: Config) -> Replicator:
    """The engine this process would train `cfg` with (joins torchrun's process group if there is one)."""
    t = cfg.train
    ctx = dist.context(t.device)
    check_schedule(cfg, ctx)
    _unread_budget(cfg, ctx)
    with config_terms():  # (its errors name the config's keys)
        return Replicator(
            schedule_of(cfg).phases[0].batch,
            t.micro_batch,
            t.precision,
            device=t.device,
            memory_budget=t.memory_budget or None,
            checkpointing=t.checkpointing,
            compile=compile_mode(cfg, ctx.device),
            channels_last=channels_last_of(cfg),
            sync_bn=t.sync_bn,
            grad_clip=t.grad_clip,
            skip_limit=t.skip_limit,
            skip_window=t.skip_window,
        )


# The model families torch.compile was measured to speed up on a GPU, which train.compile "auto" compiles
# there: BigGAN-128 on an H200 (bench/RESULTS.md, 2026-11-27, batch 256 as 64 x 4: bf16 468 -> 824 img/s, fp32
# 361 -> 464, 4 graphs, no graph break; on 2026-11-28, with the fused attention kernels since, bf16 630 -> 760).
COMPILED_BY_DEFAULT = ("biggan",)


def compiles(cfg: Config, device: torch.device | None = None) -> bool:
    """Whether a run of `cfg` on `device` (default: the one train.device picks) compiles its models:
    train.compile, with "auto" resolved."""
    t = cfg.train
    if t.compile != "auto":
        return bool(t.compile)
    gan = cfg.task == "gan" and cfg.model.name in COMPILED_BY_DEFAULT and not (t.penalizes_d_gradient or t.pl_weight)
    return gan and (device or dist.context(t.device).device).type == "cuda"


def compile_mode(cfg: Config, device: torch.device | None = None) -> bool | str:
    """How a run of `cfg` on `device` compiles its models (the Replicator's `compile`): False, True (torch.compile's
    default mode) or the mode train.compile names."""
    mode = cfg.train.compile
    return compiles(cfg, device) and (mode if mode in wrap.CUDA_GRAPH_MODES else True)


def describe_compile(cfg: Config) -> str:
    """How the plan line and a dry run name compiling: said to be train.compile "auto"'s choice where it is, and
    the mode where one is asked for (its CUDA graphs: on a GPU alone)."""
    mode = cfg.train.compile
    if mode in wrap.CUDA_GRAPH_MODES:
        return f"torch.compile mode {mode} (CUDA graphs on a GPU)"
    return "torch.compile" + (" (train.compile auto)" if mode == "auto" else "")


@contextmanager
def eager_fallback(cfg: Config) -> Iterator[None]:
    """While it is entered, under train.compile "auto" where it compiles: a graph that fails to compile runs
    eagerly (Dynamo warns) instead of stopping the run; the process's own setting back after."""
    if cfg.train.compile != "auto" or not compiles(cfg):
        yield
        return
    import torch._dynamo

    with torch._dynamo.config.patch(suppress_errors=True):
        yield


def _unread_budget(cfg: Config, ctx: dist.Context) -> None:
    t = cfg.train
    if t.memory_budget and t.micro_batch != "auto" and ctx.rank == 0:
        warn(
            f'train.memory_budget is read by micro_batch "auto" only: at micro_batch {t.micro_batch} nothing holds '
            "the step to it",
            once=True,  # (once a process: found from outside, said at each build of a benchmark's)
        )


def check_schedule(cfg: Config, ctx: dist.Context) -> None:
    """Every phase's batch splits over this many processes (and the fixed micro-batch): checked before
    anything is written, not when the phase begins hours later."""
    phases = schedule_of(cfg).phases
    for p in phases:
        if p.batch > MAX_BATCH:  # (train.batch is capped by its own check)
            raise BigbatchError(
                f"data.schedule's phase from {p.start / 1000:g} kimg has batch {p.batch}: at most {MAX_BATCH} images "
                "a step"
            )
    _check_groups(cfg, phases, ctx)
    # Mixup's pairs: an even micro-batch suggested (found from outside: an odd one was, which the pairs then refused).
    pairs = 2 if cfg.task == "classify" and (cfg.train.mixup or cfg.train.cutmix) else 1
    if pairs > 1 and not cfg.data.schedule and cfg.train.micro_batch != "auto":
        make_plan(cfg.train.batch, cfg.train.micro_batch, cfg.train.precision, ctx, pairs)  # (in train.batch's words)
    for p in phases if cfg.data.schedule else phases[1:]:  # (without one, train.batch is checked as itself)
        where = f"data.schedule's phase from {p.start / 1000:g} kimg"
        if cfg.train.micro_batch == "auto":
            if p.batch % ctx.world_size:
                n, lower = ctx.world_size, p.batch // ctx.world_size * ctx.world_size
                fits = " or ".join(str(m) for m in (lower, lower + n) if m)  # (found from outside: no fix given)
                raise BigbatchError(f"{where} has batch {p.batch}, not a multiple of the {n} processes: give it {fits}")
        else:
            try:
                make_plan(p.batch, cfg.train.micro_batch, cfg.train.precision, ctx, pairs)
            except BigbatchError as e:
                times = p.batch // cfg.train.batch if p.batch % cfg.train.batch == 0 else 0
                size = f"its batch {p.batch}" + (f" ({times}x train.batch)" if times > 1 else "")
                said = str(e).replace(f"train.batch={p.batch}", size, 1).replace(" (a resumed run keeps its batch)", "")
                said = said.replace("a train.batch divisible", "a batch divisible")
                raise BigbatchError(f"{where}: {said}") from None


def _check_groups(cfg: Config, phases: list[Phase], ctx: dist.Context) -> None:
    """A D that computes statistics over groups of images (StyleGAN2's minibatch standard deviation) gets
    micro-batches it can group, in every phase at this world size; one smaller than a group is one group."""
    group = _mbstd_group(cfg)
    if cfg.train.micro_batch == "auto" and group and ctx.rank == 0:  # (found from outside: said once probed)
        for share in [s for s in dict.fromkeys(p.batch // ctx.world_size for p in phases) if s % group]:
            warn(
                f"micro_batch auto settles under {cfg.model.name}'s D group of {group} images for its standard "
                f"deviation, which then groups fewer: no multiple of {group} divides the batch share of {share}, so "
                f"the step depends on the memory budget; give a train.batch of a multiple of {group * ctx.world_size}"
                f", or set model.options.mbstd_group to a divisor of {share}",
                once=True,
            )
    if cfg.train.micro_batch == "auto" or not group:
        return
    for p in phases:
        micro = min(cfg.train.micro_batch, p.batch // ctx.world_size)  # (above a process's share: the share)
        if micro and (p.batch // ctx.world_size) % micro:  # (the batch plan's check says so, first: found from
            continue  # outside, a group that fits a micro-batch the batch could not split into was offered)
        warn_under_group(cfg, micro)  # (found from outside: said for "auto" only)
        if micro and micro % min(group, micro):
            fits = max(d for d in range(1, group + 1) if micro % d == 0)
            share = p.batch // ctx.world_size
            # (found from outside: a multiple of the group was suggested where none divides a process's batch)
            grouped = [m for m in range(group, share + 1, group) if share % m == 0]
            below = [m for m in grouped if m <= micro]  # (the largest not above micro, else the smallest)
            near = below[-1] if below else grouped[0] if grouped else 0
            other = (  # (found from outside: a batch named alone, whose micro-batch still did not group)
                f"train.micro_batch={near}"
                if near
                else f"a train.batch of {group} x {ctx.world_size} x N and a train.micro_batch of a multiple of "
                f"{group} dividing its share"
            )
            raise BigbatchError(
                f"config key 'model.options.mbstd_group': {cfg.model.name}'s D computes a standard deviation over "
                f"groups of {group} images, and its micro-batch is {micro}: set model.options.mbstd_group={fits}, "
                f"or give {other}"
            )


def _mbstd_group(cfg: Config) -> int:
    """The size of the groups a GAN's D computes statistics over (StyleGAN2's mbstd_group), or 0."""
    from bigbatch import models

    group = {**models.registry.options(cfg.model.name), **cfg.model.options}.get("mbstd_group")
    return group if cfg.task == "gan" and isinstance(group, int) and group >= 1 else 0


def warn_under_group(cfg: Config, micro: int) -> None:
    """A micro-batch smaller than a D's group (StyleGAN2's mbstd_group) is grouped whole: the step then depends on
    the micro-batch (with micro_batch "auto", on the memory budget); said once."""
    group = _mbstd_group(cfg)
    if 0 < micro < group:
        auto = cfg.train.micro_batch == "auto"
        what = f"micro_batch auto settled on {micro}, under" if auto else f"train.micro_batch {micro} is under"
        n = max(1, dist.context(cfg.train.device).world_size)
        share = cfg.train.batch // n
        if share % group:  # (found from outside: memory blamed, and a multiple that no micro-batch can be advised)
            if auto:  # (said before the plan: _check_groups)
                return
            why = f"no multiple of {group} divides the batch share of {share}"
            fix = f"give a train.batch of a multiple of {group * n}, or set model.options.mbstd_group={micro}"
        else:
            why = f"the step depends on the {'memory budget' if auto else 'micro-batch'}"
            fix = f"give train.micro_batch a multiple of {group}, or set model.options.mbstd_group={micro}"
        warn(
            f"{what} {cfg.model.name}'s D group of {group} images for its standard deviation, which then groups "
            f"{micro}: {why}; {fix}",
            once=True,
        )


def describe_plan(
    cfg: Config, plan: Plan | None = None, world_size: int | None = None, floor: int | None = None
) -> str:
    """The batch plan of `cfg` in one line (`plan`: as resolved at start; without it nothing is built
    and "auto" is described as probed at start), then the batches of later phases. `world_size`: of the ranks
    it will run on (a sweep's nprocs), where not this process's. `floor`: the bytes of the weights, gradients,
    optimizer state and averages (a dry run's, cli_checks.build_on_meta): said, and a budget under it refused."""
    ctx = dist.context(cfg.train.device)
    if world_size is not None:
        ctx = dataclasses.replace(ctx, world_size=world_size)
    if plan is None:  # (a resolved plan was built by replicator_for, which checked the schedule)
        check_schedule(cfg, ctx)
        _unread_budget(cfg, ctx)
    schedule = schedule_of(cfg)
    phases, begins = schedule.phases, schedule.begins()
    batch = phases[0].batch
    if plan is not None:
        line = plan.describe()
    elif cfg.train.micro_batch == "auto":
        # (found from outside: "the device's memory" on a CPU, and "probed at the start" read as done)
        budget = cfg.train.memory_budget or ("the GPU's memory" if ctx.device.type == "cuda" else "a share of free RAM")
        line = (
            f"batch {batch} = micro_batch auto (the largest that fits {budget}, probed as the run starts; a dry run "
            "does not) x accumulation "
            f"(batch / micro_batch / world_size) x world_size {ctx.world_size}; precision {cfg.train.precision}; "
            f"device {ctx.device}"
        )
    else:
        line = make_plan(batch, cfg.train.micro_batch, cfg.train.precision, ctx).describe()
    if floor:  # (found from outside: a dry run said nothing of memory, and BigGAN-128 in 2 GiB passed it)
        held = f"the weights, their gradients, the optimizer's state and averages take {format_bytes(floor)}"
        if cfg.train.memory_budget and cfg.train.micro_batch == "auto" and parse_bytes(cfg.train.memory_budget) < floor:
            raise BigbatchError(
                f"train.memory_budget {cfg.train.memory_budget} is less than {held}, whatever the micro-batch: raise "
                "it, or give a smaller model"
            )
        line += f"; {held} whatever the micro-batch (activations on top)"
    if len(phases) > 1:
        sized = len({p.resolution for p in phases}) > 1  # progressive resizing: say the sizes too

        def px(p: Phase) -> str:  # (0: data.resolution, found from outside said as "0px")
            return f"{p.resolution or cfg.data.resolution}px "

        def phase(p: Phase, begin: int) -> str:  # (where its first step starts: found from outside, its kimg said)
            return (px(p) if sized else "") + f"batch {p.batch} from {begin / 1000:g} kimg"

        line += "; then " + ", ".join(phase(p, b) for p, b in zip(phases[1:], begins[1:]))
        if sized:
            line = px(phases[0]) + line
    return line


def plan_micro_batch(rep: Replicator, probe, verbose: bool, resident: list | None = None) -> Plan:
    """Settle micro_batch "auto" by probing (`probe(m)`: one forward and backward of every loss at m; `resident`: the
    models held that the Replicator does not train)."""
    plan = rep.plan_micro_batch(probe, resident=resident or ())
    if verbose:
        print(f"micro_batch auto, budget {format_bytes(rep.budget)} per process:", flush=True)
        for p in rep.probes:
            verdict = "fits" if p.fits else "does not fit"
            share = f" ({100 * p.peak_bytes / rep.budget:.0f}% of it)" if rep.budget else ""
            how = "" if p.measured else " (extrapolated from the two largest measured)"
            peak = f"peak {format_bytes(p.peak_bytes)}{share}{how}"
            print(f"  micro_batch {p.micro_batch:5d}: {peak}, {verdict}", flush=True)
    return plan


def channels_last_of(cfg: Config) -> bool:
    """Whether the run's models train in channels-last order (train.channels_last; "auto": all but SAEHD)."""
    t = cfg.train
    return t.channels_last if t.channels_last != "auto" else cfg.task != "swap"
