"""bench/gpu.py's profile parts: where an iteration's time goes on the device (torch.profiler), for BigGAN-128,
SAEHD 512, ResNet-50 and StyleGAN2 256 as their throughput parts run them. On CPU (the dry run) the device is the
CPU."""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable
from contextlib import closing

from _classify import classify_task
from _gan import gan_task, sync
from _gpu_sizes import CLASSES, COMPILE_WARMUP, SIZES, config
from _kinds import kind_of
from _swap import swap_feed, swap_task, synthetic_faces

from bigbatch.batching import plan_micro_batch
from bigbatch.config import Config

STEPS = 2  # iterations profiled, after as many untimed


def profiled(iterate: Callable[[], None], device, steps: int = STEPS) -> tuple[float, str]:  # noqa: ANN001
    """`iterate` (one iteration) run `steps` times under torch.profiler: the wall ms an iteration, and a note: the
    device's busy share of the wall time (below 100%, the GPU waited on the host), that time by kind of op
    (bench/throughput_all.py's kinds) and the ops that took most of it (each op's own kernels)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda) as prof:
        t = time.perf_counter()
        for _ in range(steps):
            iterate()
        sync(device)
        wall_ms = 1e3 * (time.perf_counter() - t) / steps
    rows = prof.key_averages()
    ops = [a for a in rows if a.device_type == DeviceType.CPU]
    kernels = [a for a in rows if a.device_type != DeviceType.CPU] if cuda else ops  # on CPU the ops are the work

    def own(a) -> float:  # noqa: ANN001 -- ms per iteration on the device
        return (a.self_device_time_total if cuda else a.self_cpu_time_total) / 1e3 / steps

    busy_ms = sum(own(a) for a in kernels)
    kinds: dict[str, float] = {}
    for a in ops:
        kinds[kind_of(a.key)] = kinds.get(kind_of(a.key), 0.0) + own(a)
    share = lambda ms: f"{100 * ms / busy_ms:.0f}%"  # noqa: E731
    by_kind = ", ".join(f"{k} {share(v)}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]) if v > 0)
    top = ", ".join(f"`{a.key}` {own(a):.1f} ms" for a in sorted(ops, key=own, reverse=True)[:8])
    busy = f"{'GPU' if cuda else 'CPU'} busy {busy_ms:.0f} of {wall_ms:.0f} ms an iteration under the profiler"
    return wall_ms, f"{busy} ({100 * busy_ms / wall_ms:.0f}%); by kind: {by_kind}; top ops: {top}"


def _row(setting: str, plan: str, wall_ms: float, note: str) -> dict:
    return {"setting": f"{setting}: torch.profiler over {STEPS} iterations after {STEPS} untimed", "plan": plan,
            "s_per_iter": wall_ms / 1e3, "note": note}  # fmt: skip


def _gan_profile(task, rep, steps, warmup: int) -> tuple[float, str]:  # noqa: ANN001
    """A GAN's iterations (one D and one G step each, at the G steps `steps` gives) profiled after `warmup`."""

    def iterate() -> None:
        i = next(steps)
        task.d_step(i * task.cfg.train.batch)
        task.g_step(i)

    for _ in range(warmup):
        iterate()
    sync(rep.device)
    return profiled(iterate, rep.device)


def biggan_profile(args: argparse.Namespace, compile: bool = False) -> dict:
    """BigGAN-128's bf16 iteration (the biggan-bf16 part's). `compile`: the step as a GPU trains it by default
    (train.compile "auto"), after the compile parts (their cache); its first untimed iterations compile."""
    cfg = config(args, "gan").override({"train.compile": compile})
    task, rep = gan_task(cfg, CLASSES, precision="bf16", micro_batch=SIZES[args.sizes]["gan_micro"])
    wall_ms, note = _gan_profile(task, rep, itertools.count(), COMPILE_WARMUP if compile else STEPS)
    setting = f"{describe_gan(cfg)}, bf16{', train.compile' * compile}, micro-batch {rep.plan.micro_batch}"
    return _row(setting, f"{rep.plan.micro_batch} × {rep.plan.accumulation}", wall_ms, note)


def stylegan2_profile(args: argparse.Namespace) -> dict:
    """StyleGAN2 256's bf16 iteration (the stylegan2-bf16 part's) on steps without the lazy penalties."""
    cfg = config(args, "stylegan2")
    task, rep = gan_task(cfg, 0, precision="bf16", micro_batch=SIZES[args.sizes]["stylegan2_micro"])
    t = cfg.train
    # G steps off path length's; D's R1 falls on its first step (the engine's count), among the untimed.
    wall_ms, note = _gan_profile(task, rep, (i for i in itertools.count(1) if i % t.pl_every), STEPS)
    setting = f"StyleGAN2 {cfg.data.resolution} px ch {cfg.model.ch}, batch {t.batch}, bf16, no lazy penalty"
    return _row(setting, f"{rep.plan.micro_batch} × {rep.plan.accumulation}", wall_ms, note)


def saehd_profile(args: argparse.Namespace) -> dict:
    """SAEHD 512 df-ud's iteration (the saehd512 part's: its plan in 6 GiB, warp and data reading included)."""
    cfg = config(args, "swap")
    t = cfg.train
    with synthetic_faces(cfg) as faces:
        task, rep = swap_task(faces)
        if rep.micro_batch_pending:
            plan_micro_batch(rep, task.probe, verbose=False)
        with closing(swap_feed(task, rep)) as feed:
            for _ in range(STEPS):
                task.step(feed)
            sync(rep.device)
            wall_ms, note = profiled(lambda: task.step(feed), rep.device)
        rep.close()
    setting = f"{cfg.name}, batch {t.batch}, {t.precision}" + (", checkpointing" if t.checkpointing else "")
    return _row(setting, f"{rep.plan.micro_batch} × {rep.plan.accumulation}", wall_ms, note)


def resnet50_profile(args: argparse.Namespace) -> dict:
    """ResNet-50's classify step (the resnet50 part's: bf16, channels-last, one batch in memory, autotuned)."""
    cfg = config(args, "resnet")
    task, rep, feed = classify_task(cfg, CLASSES)
    for _ in range(3):
        task.step(feed)
    sync(rep.device)
    wall_ms, note = profiled(lambda: task.step(feed), rep.device)
    setting = f"ResNet-50 ch {cfg.model.ch}, {cfg.data.resolution} px, batch {cfg.train.batch}, bf16"
    return _row(setting, f"{rep.plan.micro_batch} × {rep.plan.accumulation}", wall_ms, note)


def describe_gan(cfg: Config) -> str:
    return f"BigGAN {cfg.data.resolution} px ch {cfg.model.ch}, {CLASSES} classes, batch {cfg.train.batch}"
