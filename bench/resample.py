"""A 3x3 conv and the 2x resampling next to it, as two ops and as one (bigbatch/models/resample.py): the
forward and backward time of each, per layer shape, in one process, one thread. What FUSE_FROM rests on.

    python bench/resample.py                        # fp32 and bf16, channels-last, batch 8
    python bench/resample.py --batch 32 --channels 128 --precisions bf16

Rows: D (the conv on an input of the column's size, then 2x average pooling) and G (nearest 2x
upsampling of an input of half the column's size, then the conv): columns are the full resolution.
Each cell: median of --repeats forward+backward passes (input, weight and bias gradients) after two
untimed ones, two ops / one op (above 1: the one op is faster).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _args import int_list, name_list, positive_int  # noqa: E402
from _env import measured_on  # noqa: E402
from _gan import sync  # noqa: E402

from bigbatch.models.resample import FUSE_FROM, conv_pool, upsample_conv  # noqa: E402

TWO_OPS = {
    "D": lambda conv, x: F.avg_pool2d(conv(x), 2),
    "G": lambda conv, x: conv(F.interpolate(x, scale_factor=2.0)),
}
ONE_OP = {"D": conv_pool, "G": upsample_conv}


def seconds(f, repeats: int, device: torch.device) -> float:
    times = []
    for i in range(repeats + 2):
        t = time.perf_counter()
        f()
        sync(device)
        if i >= 2:
            times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def cell(
    kind: str, batch: int, channels: int, side: int, precision: str, repeats: int, device: torch.device | None = None
) -> tuple[float, float]:
    """Seconds per forward+backward of layer `kind` ("D" or "G") on an input of `side` px: as two ops, as one."""
    device = device or torch.device("cpu")
    torch.manual_seed(0)
    conv = nn.Conv2d(channels, channels, 3, padding=1).to(device, memory_format=torch.channels_last)
    x = torch.randn(batch, channels, side, side, device=device).to(memory_format=torch.channels_last).requires_grad_()
    out = []
    for f in (TWO_OPS[kind], ONE_OP[kind]):

        def step(f=f) -> None:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                y = f(conv, x)
            y.float().sum().backward()

        out.append(seconds(step, repeats, device))
    return out[0], out[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=positive_int, default=8)
    p.add_argument("--channels", type=int_list(), default="128,512", help="comma-separated conv widths (in = out)")
    p.add_argument("--precisions", type=name_list(("fp32", "bf16")), default="fp32,bf16", help="of fp32, bf16")
    p.add_argument("--repeats", type=positive_int, default=3)
    a = p.parse_args()
    print(measured_on())
    torch.set_num_threads(1)
    sides = {"D": (8, 16, 32, 64), "G": (4, 8, 16, 32)}
    print(f"# one thread, batch {a.batch}, channels-last; ms per forward+backward, two ops / one op; blocks fuse "
          f"from a full resolution of {FUSE_FROM} px (D: the conv's input; G: its output)\n")  # fmt: skip
    print("| precision | layer | channels | " + " | ".join(f"{r} px" for r in (8, 16, 32, 64)) + " |")
    print("|---|---|---|" + "---|" * 4)
    for precision in a.precisions:
        for kind in ("D", "G"):
            for c in a.channels:
                cells = []
                for side in sides[kind]:
                    two, one = cell(kind, a.batch, c, side, precision, a.repeats)
                    cells.append(f"{1e3 * two:.1f} / {1e3 * one:.1f} = **{two / one:.2f}**")
                print(f"| {precision} | {kind} | {c} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
