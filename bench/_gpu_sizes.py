"""bench/gpu.py's sizes (the GPU's, and the dry run's toy sizes), the configs its parts train, and how they
time a step and rate its FLOP/s."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch
from _gan import sync
from throughput import compute_peak

import bigbatch
from bigbatch.config import Config
from bigbatch.engine.memory import CPUPeak, state_bytes
from bigbatch.engine.precision import native_bf16

REPO = Path(__file__).resolve().parent.parent
CLASSES = 1000  # BigGAN-128's and ResNet-50's ImageNet classes
# Untimed iterations under train.compile: the first compiles each graph (G and D, in the D step and in the G
# step); the next ones let lazily built kernels settle (on CPU, oneDNN's took seconds each).
COMPILE_WARMUP = 5

# What each part is run at: the GPU's sizes, and the dry run's toy sizes (the same code, only smaller).
SIZES = {
    "full": {
        "gan": {"train.batch": 256},  # of the biggan128_bs2048 preset: 128 px, ch 96, dim_z 120
        "gan_micro": 256,  # the whole batch, as micro_batch "auto" plans it on an H100/H200 (it was 64 x 4)
        "plan": {"train.memory_budget": "6GiB"},  # the preset's batch 2048
        "swap": {},  # the saehd512_df_ud preset as it is: batch 8, bf16, checkpointing, 6 GiB
        "resnet": {"data.resolution": 224, "model.ch": 64, "train.batch": 256, "train.micro_batch": 256},
        "stylegan2": {},  # the stylegan2_256 preset as it is: 256 px, ch 64, batch 64
        "stylegan2_micro": 64,  # the whole batch, as micro_batch "auto" plans it on an H100/H200 (it was 32 x 2)
        "steps": 5,
    },
    "toy": {
        "gan": {"data.resolution": 32, "model.ch": 8, "train.batch": 8},
        "gan_micro": 4,
        # Batch 16 in 12 MiB: micro_batch 4 fits and 8 does not in fp32 (8 and 16 in bf16), so the probes both
        # fit and fail and the plan accumulates, at a quarter of batch 64's seconds (bf16 is emulated on a CPU).
        "plan": {"data.resolution": 32, "model.ch": 8, "train.batch": 16, "train.memory_budget": "12MiB"},
        "swap": {
            "data.resolution": 64,
            "model.options.ae_dims": 32,
            "model.options.e_dims": 8,
            "model.options.d_dims": 8,
            "model.options.d_mask_dims": 4,
            "train.memory_budget": "14MiB",
        },
        "resnet": {"data.resolution": 32, "model.ch": 8, "train.batch": 8, "train.micro_batch": 8},
        "stylegan2": {
            "data.resolution": 16,
            "model.ch": 2,
            "model.dim_z": 16,
            "model.options.ch_max": 16,
            "model.options.w_dim": 16,
            "model.options.map_layers": 2,
            "model.options.mbstd_group": 4,
            "train.batch": 8,
        },
        "stylegan2_micro": 4,
        "steps": 1,
    },
}


def timed(step: Callable[[], None], device: torch.device, models: list, steps: int, warmup: int) -> tuple[float, int]:
    """Seconds per `step()` over `steps` calls after `warmup` (>= 1), and the peak memory, as
    throughput.measure_swap counts it: on a GPU max_memory_allocated over the timed calls, on CPU the
    first call's count (CPUPeak; it also creates the optimizer state) plus the weights."""
    counter = CPUPeak() if device.type == "cpu" else None
    with counter if counter is not None else nullcontext():
        step()
    peak = counter.peak + state_bytes(models, []) if counter is not None else 0
    for _ in range(warmup - 1):
        step()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    seconds = (time.perf_counter() - t) / steps
    return seconds, torch.cuda.max_memory_allocated(device) if device.type == "cuda" else peak


# ---- the parts: each returns its row's cells (setting, plan, img_per_s, s_per_iter, peak, note) ----------


def config(args: argparse.Namespace, key: str) -> Config:
    """What the parts of SIZES' `key` train: their preset (ResNet-50: a plain bf16 channels-last classifier) at
    the sizes."""
    if key == "resnet":
        train = {"precision": "bf16", "channels_last": True}
        base = {"name": "resnet50", "task": "classify", "model": {"name": "resnet50"}, "train": train}
        cfg = Config.from_dict(base)
    else:
        presets = {"swap": "saehd512_df_ud", "stylegan2": "stylegan2_256"}
        cfg = bigbatch.preset(presets.get(key, "biggan128_bs2048"))  # (the "plan" parts: BigGAN too)
    return cfg.override({**SIZES[args.sizes][key], "train.device": args.device})


def of_peak(flop_per_s: float, args: argparse.Namespace, precision: str) -> str:
    """Achieved FLOP/s and their share of the peak measured now, in this process (throughput.compute_peak: the
    best of large matmuls and 3x3 convolutions in the precision's dtype, under the same TF32 settings)."""
    device = torch.device(args.device)
    if precision == "bf16" and not native_bf16(device):  # emulated: measuring it took two minutes on a CPU
        return f"{flop_per_s / 1e12:.2f} TFLOP/s, no native bf16 here (no peak measured)"
    peak = compute_peak(device, precision, toy=args.sizes == "toy")
    return f"{flop_per_s / 1e12:.2f} TFLOP/s, {100 * flop_per_s / peak:.0f}% of {peak / 1e12:.1f} measured"
