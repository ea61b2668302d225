"""bench/gpu.py's `waits` part: how often an iteration makes the host wait for the GPU, and where.

A device tensor read on the host (`.item()`, `.tolist()`, `bool(t)`), a copy from pageable host memory without
non_blocking=True, `torch.tensor(data, device="cuda")` and an op whose output's size its values decide each
synchronize the host with the device: the GPU's queue runs dry and the GPU idles while the host catches up.
Under `torch.cuda.set_sync_debug_mode("warn")` each such op warns, from the Python line that called it; this
part counts them over a few iterations of BigGAN's, StyleGAN2's and ResNet-50's steps as training runs them
(tests/device_guard.py counts the same on a CPU, where nothing synchronizes). The engine's one read of each
optimizer step's results is expected: 2 an iteration for a GAN (D and G), 1 for a classifier."""

from __future__ import annotations

import argparse
import gc
import itertools
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
from _classify import classify_task
from _gan import gan_task, sync
from _gpu_sizes import CLASSES, SIZES, config

COUNTED = 4  # iterations counted, after two that plan, tune and warm up


def counted(iteration: Callable[[], None], device: torch.device) -> tuple[float, Counter]:
    """Waits an iteration (the mean over COUNTED), and how many at each calling line."""
    for _ in range(2):
        iteration()
    sync(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(COUNTED):
                iteration()
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode(0)
    sites = Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchroniz" in str(w.message).lower())
    return sum(sites.values()) / COUNTED, sites


def gan_iteration(args: argparse.Namespace, key: str, classes: int, micro: int) -> Callable[[], None]:
    """One iteration of the GAN task of SIZES' `key` (a D step, then a G step), at micro-batch `micro`, in bf16."""
    task, _ = gan_task(config(args, key), classes, precision="bf16", micro_batch=micro)
    steps = itertools.count()

    def one() -> None:
        k = next(steps)
        task.d_step(k * task.rep.batch)
        task.g_step(k)

    return one


def classify_iteration(args: argparse.Namespace) -> Callable[[], None]:
    """One iteration of ResNet-50's classify step on a batch in memory."""
    task, _, feed = classify_task(config(args, "resnet"), CLASSES)
    return lambda: task.step(feed)


def waits(args: argparse.Namespace) -> dict:
    device, sizes = torch.device(args.device), SIZES[args.sizes]
    builds = {
        "BigGAN-128 bf16": lambda: gan_iteration(args, "gan", CLASSES, sizes["gan_micro"]),
        "StyleGAN2 paper256 bf16": lambda: gan_iteration(args, "stylegan2", 0, sizes["stylegan2_micro"]),
        "ResNet-50 bf16": lambda: classify_iteration(args),
    }
    cells = []
    for name, build in builds.items():
        per_iteration, sites = counted(build(), device)
        if device.type != "cuda":
            cells.append(f"{name}: - (no CUDA here: nothing synchronizes)")
        else:
            where = ", ".join(f"{site} ×{n}" for site, n in sites.most_common(4))
            cells.append(f"{name}: {per_iteration:g} an iteration" + (f" ({where})" if where else ""))
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"setting": "waits for the GPU an iteration (torch.cuda.set_sync_debug_mode)", "note": "; ".join(cells)}
