"""The largest micro-batch of BigGAN (128 px, ch 96, 1000 classes) that fits a memory budget, for
fp32, bf16 and bf16 + activation checkpointing. One table.

    python bench/memory.py                      # CPU: peaks measured at two micro-batches
    python bench/memory.py --budgets 6,8,11,16  # on a GPU: probed with the capped allocator

On a GPU each cell is what `train.micro_batch = "auto"` picks: the Replicator probes one D and one G
forward/backward under an allocator capped at the budget (powers of two dividing the batch). On CPU
there is no allocator to cap: the peak of the same probe is counted (CPUPeak) at two micro-batches,
and the cells extrapolate the line through them (memory grows linearly in the micro-batch), marked ~.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _gan import gan_task  # noqa: E402

from bigbatch.config import Config  # noqa: E402
from bigbatch.engine import memory  # noqa: E402
from bigbatch.errors import BigbatchError  # noqa: E402

MODES = [("fp32", False), ("bf16", False), ("bf16", True)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resolution", type=int, default=128)
    p.add_argument("--ch", type=int, default=96)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--budgets", default="6,8,11,16", help="GiB")
    p.add_argument("--at", default="2,4", help="CPU: the two micro-batches to measure")
    p.add_argument("--device", default="auto")
    args = p.parse_args()
    cfg = Config.from_dict(
        {
            "name": "bench",
            "data": {"resolution": args.resolution},
            "model": {"name": "biggan", "ch": args.ch, "dim_z": 120 if args.resolution != 256 else 140},
            "train": {"batch": args.batch, "micro_batch": 1, "device": args.device},
        }
    )
    budgets = [float(b) for b in args.budgets.split(",")]
    rows = []
    for precision, ckpt in MODES:
        torch.manual_seed(0)
        task, rep = gan_task(cfg, 1000, precision=precision, checkpointing=ckpt, micro_batch="auto")
        opts = [task.opt_G, task.opt_D]
        plain = [m for m, _ in rep.models]
        cells, peaks = [], {}
        if rep.device.type == "cuda":
            for gib in budgets:
                rep.memory_budget = int(gib * 2**30)
                try:
                    cells.append(str(rep.plan_micro_batch(task.probe, opts).micro_batch))
                except BigbatchError:
                    cells.append("0")
                peaks.update({pr.micro_batch: pr.peak_bytes for pr in rep.probes if pr.fits})
        else:
            a, b = (int(m) for m in args.at.split(","))
            baseline = memory.state_bytes(plain, opts)
            for m in (a, b):
                peaks[m] = memory.measure(task.probe, m, rep.device, 2**62, baseline).peak_bytes
            per_image = (peaks[b] - peaks[a]) / (b - a)
            fixed = peaks[a] - a * per_image
            for gib in budgets:
                fit = [m for m in _pow2(args.batch) if fixed + m * per_image <= gib * 2**30]
                cells.append(f"~{max(fit)}" if fit else "0")
        rows.append((precision, ckpt, peaks, cells, rep.device))
        del task, rep
    device = rows[0][4]
    print(f"# biggan {args.resolution}px ch {args.ch}, 1000 classes, batch {args.batch}, device {device}")
    shown = sorted({m for r in rows for m in r[2]})[:3]
    head = "| precision | checkpointing | " + " | ".join(f"peak @ micro {m}" for m in shown)
    head += " | " + " | ".join(f"micro-batch in {g:g} GiB" for g in budgets) + " |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for precision, ckpt, peaks, cells, _ in rows:
        mem = " | ".join(memory.format_bytes(peaks[m]) if m in peaks else "-" for m in shown)
        print(f"| {precision} | {'on' if ckpt else 'off'} | {mem} | " + " | ".join(cells) + " |")


def _pow2(batch: int) -> list[int]:
    return [m for m in (2**i for i in range(batch.bit_length())) if batch % m == 0]


if __name__ == "__main__":
    main()
