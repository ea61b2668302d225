"""Precision policy: fp32, bf16 or fp16 autocast for forward and backward; weights, optimizer state and
losses stay fp32. fp16 adds one GradScaler per optimizer (nanoGPT's `enabled=(dtype == float16)` policy)."""

from __future__ import annotations

from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext

import torch

from bigbatch.errors import BigbatchError, warn

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SCALE_START = 2.0**16  # GradScaler's init_scale (grad_scaler makes it with its defaults)
SETTLING_FLOOR = 2.0**8  # fp16's loss scale halving above it in its first fall is settling (8 halvings from the start)
SETTLING = (
    "{}: fp16 loss scale settling: a step whose scaled gradients overflow is skipped and the scale halved (at the "
    "start, and now and then after each growth); normal, and not counted towards the skip limit"
)


def native_bf16(device: torch.device) -> bool:
    """Whether bf16 convolutions run natively on `device` (GPUs; CPUs whose torch kernels are AVX-512's or AMX's):
    elsewhere torch emulates them, 5-20x slower than fp32."""
    return device.type != "cpu" or torch.backends.cpu.get_cpu_capability() not in ("DEFAULT", "NO AVX", "AVX2")


def check(precision: str, device: torch.device) -> None:
    if precision not in DTYPES:
        raise BigbatchError(f"unknown precision {precision!r}; valid: {', '.join(DTYPES)}")
    native = native_bf16(device)
    if precision == "fp16" and device.type == "cpu":  # (found from outside: 6 img/s where fp32 ran 729, unsaid)
        warn(
            "fp16 precision on a CPU: PyTorch's CPU fp16 kernels are slow (the digits recipe trained ~100x "
            "slower than in fp32, on a CPU with AVX-512 FP16 too); "
            + ("bf16 is a CPU's mixed precision" if native else "fp32 is this one's fastest (no native bf16 either)"),
            once=True,
        )
    if precision == "bf16" and not native:  # (found from outside: 15x slower than fp32, unsaid)
        warn(
            f"bf16 precision on this CPU (torch's kernels for {torch.backends.cpu.get_cpu_capability()}): it has no "
            "native bf16, and torch emulates it 5-20x slower than fp32 (the digits recipe: 16 img/s against 278); "
            "fp32 is its fastest (bf16 pays on GPUs from Ampere and CPUs with AVX-512 or AMX)",
            once=True,
        )
    # bf16 kernels from Ampere (compute capability 8.0) on. (torch.cuda.is_bf16_supported() says yes to older GPUs
    # too, where bf16 is emulated, slowly, and it asks the current GPU, before a rank of several has set its own.)
    if precision == "bf16" and device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0):
        name = torch.cuda.get_device_name(device)
        raise BigbatchError(
            f"this GPU ({name}) has no bf16 kernels (they need compute capability 8.0, Ampere, or newer): use "
            "precision 'fp16' (with loss scaling) or 'fp32'"
        )


def autocast(precision: str, device: torch.device) -> ContextManager:
    """Autocast to the compute dtype; a no-op for fp32."""
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[precision])


def check_weights(opt: torch.optim.Optimizer, precision: str) -> None:
    """fp16's loss scaler unscales float32 gradients only: an optimizer over half-precision weights is refused in
    one line (found from outside: "Attempting to unscale FP16 gradients" at the first step)."""
    trained = (p for g in opt.param_groups if not g.get("frozen") for p in g["params"] if p.requires_grad)
    dtypes = {p.dtype for p in trained if p.is_floating_point()}  # (frozen ones get no gradient to unscale: review)
    if precision == "fp16" and dtypes - {torch.float32}:
        raise BigbatchError(
            f"the optimizer's weights are {', '.join(sorted(str(d).removeprefix('torch.') for d in dtypes))}: keep "
            'them float32 (no model.half()); precision="fp16" computes in fp16 (autocast), the weights stay float32'
        )


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """A dynamic loss scaler, enabled only for fp16 (bf16 has fp32's exponent range and needs none)."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


def fresh_scaler(scaler: torch.amp.GradScaler, device: torch.device) -> torch.amp.GradScaler:
    """`scaler`'s scale and growth tracker in a scaler with no step under way (torch's refuses every unscale_ after
    one that no update followed, as a step interrupted between them leaves it)."""
    if not scaler.is_enabled():
        return scaler
    fresh = torch.amp.GradScaler(device.type)
    fresh.load_state_dict(scaler.state_dict())
    return fresh


def optimizer_kernels(device: torch.device) -> dict[str, bool]:
    """torch.optim's Adam, AdamW and SGD options for weights on `device`: on a CUDA GPU their fused kernels (one
    pass over all the weights a step in a few launches, where the for-each kernels torch picks there by default
    pass over them once per arithmetic op); on CPU torch's default, the bits the CPU's tests pin."""
    return {"fused": True} if device.type == "cuda" else {}


def load_optimizer(opt: torch.optim.Optimizer, state: dict) -> None:
    """`opt.load_state_dict(state)` keeping what `opt` was made with on this run's device: its kernels (a
    checkpoint's param groups carry their run's fused/foreach flags, which load_state_dict would take: a CPU
    checkpoint resumed on a GPU would lose the fused kernels, a GPU one resumed on a CPU take the CPU's fused
    ones), and each weight's layout in its moments (a checkpoint keeps its run's: fused kernels refuse a
    channels-last weight whose moment is not, as a resume that switches train.channels_last gives)."""
    kept = [{k: g[k] for k in ("fused", "foreach") if k in g} for g in opt.param_groups]
    opt.load_state_dict({**state, "param_groups": [{**s, **k} for s, k in zip(state["param_groups"], kept)]})
    for p, moments in opt.state.items():
        for name, v in moments.items():
            if torch.is_tensor(v) and v.shape == p.shape and v.stride() != p.stride():
                moments[name] = torch.empty_strided(p.shape, p.stride(), dtype=v.dtype, device=v.device).copy_(v)
