"""Precision policy: fp32, bf16 or fp16 autocast for forward and backward; weights, optimizer state and
losses stay fp32. fp16 adds one GradScaler per optimizer (nanoGPT's `enabled=(dtype == float16)` policy)."""

from __future__ import annotations

from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext

import torch

from bigbatch.errors import BigbatchError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def check(precision: str, device: torch.device) -> None:
    if precision not in DTYPES:
        raise BigbatchError(f"unknown precision {precision!r}; valid: {', '.join(DTYPES)}")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise BigbatchError("this GPU has no bf16 support; use precision 'fp16' (with loss scaling) or 'fp32'")


def autocast(precision: str, device: torch.device) -> ContextManager:
    """Autocast to the compute dtype; a no-op for fp32."""
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[precision])


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """A dynamic loss scaler, enabled only for fp16 (bf16 has fp32's exponent range and needs none)."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


def optimizer_kernels(device: torch.device) -> dict[str, bool]:
    """torch.optim's Adam, AdamW and SGD options for weights on `device`: on a CUDA GPU their fused kernels (one
    pass over all the weights a step in a few launches, where the for-each kernels torch picks there by default
    pass over them once per arithmetic op); on CPU torch's default, the bits the CPU's tests pin."""
    return {"fused": True} if device.type == "cuda" else {}
