"""BigGAN's self-attention math, softmax(q kᵀ) v, as the explicit formula (the (n, L, S) map in memory,
softmax in fp32 under autocast) and as the model computes it (bigbatch.models.biggan.attend, through
scaled_dot_product_attention), at BigGAN-128's attention layers: forward+backward time, the memory the
pass adds, the error against float64, and on a GPU each fused kernel that takes the shapes.

    python bench/attention.py                         # CPU, a small layer (the GPU's take minutes here)
    python bench/attention.py --device cuda           # BigGAN-128's G and D layers, fp32 and bf16

Rows: G's layer at 64 px (batch 64, 192 channels: q and k 24 wide, v 96) and D's (real and fake as one
batch of 128, 96 channels: 12 and 48). Time: median of 5 passes after 2 untimed. Peak: the most memory
the pass held above its inputs (CUDA: max_memory_allocated; CPU: bigbatch's CPUPeak count). Error: the
largest relative L2 of the output and the three gradients against the formula in float64.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _args import device_arg, name_list, positive_int  # noqa: E402
from _env import measured_on  # noqa: E402
from resample import seconds  # noqa: E402

from bigbatch.engine.memory import CPUPeak, format_bytes  # noqa: E402
from bigbatch.models.biggan import attend  # noqa: E402

# name -> (batch, channels, side): the attention input at BigGAN-128's 64 px (G, and D on real + fake)
LAYERS = {
    "full": {"G 64 px": (64, 192, 64), "D 64 px": (128, 96, 64)},
    "small": {"G 32 px": (8, 64, 32), "D 32 px": (16, 32, 32)},
    "toy": {"G 16 px": (2, 32, 16), "D 16 px": (4, 16, 16)},
}


def explicit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The formula as SA-GAN and BigGAN-PyTorch write it: the whole map, then its softmax."""
    return torch.softmax(q @ k.transpose(1, 2), dim=-1) @ v


def inputs(batch: int, channels: int, side: int, device: torch.device) -> list[torch.Tensor]:
    """q (n, L, c/8), k (n, L/4, c/8), v (n, L/4, c/2), scaled as a trained layer's logits are (std ~2)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    L, e = side * side, channels // 8
    shapes = [(batch, L, e), (batch, L // 4, e), (batch, L // 4, channels // 2)]
    return [(torch.randn(s, generator=g) * (2 / e**0.25)).to(device).requires_grad_() for s in shapes]


def error(f, qkv: list[torch.Tensor], precision: str) -> float:
    """Largest relative L2 error of f's output and gradients against `explicit` in float64."""
    w = torch.randn(qkv[0].shape[:2] + qkv[2].shape[2:], generator=torch.Generator().manual_seed(1)).to(qkv[0].device)
    qkv64 = [t.detach().double().requires_grad_() for t in qkv]
    out64 = explicit(*qkv64)
    ref = [out64, *torch.autograd.grad((out64 * w.double()).sum(), qkv64)]
    with torch.autocast(qkv[0].device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        out = f(*qkv)
    got = [out, *torch.autograd.grad((out.float() * w).sum(), qkv)]
    return max(((a.double() - b).norm() / b.norm()).item() for a, b in zip(got, ref))


def cell(f, qkv: list[torch.Tensor], precision: str, repeats: int) -> tuple[float, int]:
    """Seconds per forward+backward of f, and the memory it held above its inputs."""
    device = qkv[0].device

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = f(*qkv)
        out.float().square().mean().backward()
        for t in qkv:
            t.grad = None

    time = seconds(step, repeats, device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return time, torch.cuda.max_memory_allocated(device) - base
    with CPUPeak() as counter:
        step()
    return time, counter.peak


def backends(qkv: list[torch.Tensor], precision: str) -> list[str]:
    """The fused kernels of scaled_dot_product_attention that take attend's call (on CUDA)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION"}
    taken = []
    for name, member in names.items():
        if not hasattr(SDPBackend, member):
            continue
        try:
            with warnings.catch_warnings(), sdpa_kernel([getattr(SDPBackend, member)]):
                warnings.simplefilter("ignore")
                with torch.autocast(qkv[0].device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                    attend(*qkv).float().sum().backward()
            taken.append(name)
        except RuntimeError:
            pass
        for t in qkv:
            t.grad = None
    return taken


def rows(device: torch.device, sizes: str, precisions: list[str], repeats: int = 5) -> list[dict]:
    out = []
    for layer, (batch, channels, side) in LAYERS[sizes].items():
        for precision in precisions:
            qkv = inputs(batch, channels, side, device)
            row = {"layer": layer, "shape": f"{batch} × {side * side} × {side * side // 4}", "precision": precision}
            for name, f in (("explicit", explicit), ("attend", attend)):
                row[f"{name}_s"], row[f"{name}_peak"] = cell(f, qkv, precision, repeats)
                row[f"{name}_error"] = error(f, qkv, precision)
            cuda = device.type == "cuda"
            row["kernels"] = ", ".join(backends(qkv, precision)) if cuda else "- (CPU: attend is the formula)"
            out.append(row)
    return out


FORMATS = {"s": lambda s: f"{1e3 * s:.2f}", "peak": format_bytes, "error": lambda e: f"{e:.1e}"}


def table(rows: list[dict]) -> str:
    lines = [
        "| layer | n × L × S | precision | explicit ms | attend ms | explicit / attend | explicit peak | attend peak "
        "| explicit error | attend error | fused kernels that take it |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ms, peak, err = ((f(r[f"explicit_{k}"]), f(r[f"attend_{k}"])) for k, f in FORMATS.items())
        cells = [r["layer"], r["shape"], r["precision"], *ms, f"{r['explicit_s'] / r['attend_s']:.2f}", *peak, *err]
        lines.append("| " + " | ".join([*cells, r["kernels"]]) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", type=device_arg)
    p.add_argument("--sizes", choices=tuple(LAYERS), help="default: full on a GPU, small on CPU")
    p.add_argument("--precisions", type=name_list(("fp32", "bf16")), default="fp32,bf16", help="of fp32, bf16")
    p.add_argument("--repeats", type=positive_int, default=5)
    args = p.parse_args()
    device = torch.device(args.device)
    sizes = args.sizes or ("full" if device.type == "cuda" else "small")
    print(measured_on(device))
    print(table(rows(device, sizes, args.precisions, args.repeats)))


if __name__ == "__main__":
    main()
