"""The largest micro-batch of BigGAN (128 px, ch 96, 1000 classes) that fits a memory budget, for
fp32, bf16 and bf16 + activation checkpointing. One table. With --preset NAME of a swap preset, the
same for its SAEHD autoencoder (see "The autoencoder" below).

    python bench/memory.py                      # CPU: peaks measured at two micro-batches
    python bench/memory.py --budgets 6,8,11,16  # on a GPU: probed with the capped allocator
    python bench/memory.py --preset saehd512_df_ud            # the autoencoder, in the preset's 6 GiB
    python bench/memory.py --preset saehd512_df_ud --at 4,8 --modes bf16+ckpt   # measured at the batch

On a GPU each cell is what `train.micro_batch = "auto"` picks: the Replicator probes one D and one G
forward/backward under an allocator capped at the budget (powers of two dividing the batch). On CPU
there is no allocator to cap: the peak of the same probe is counted (CPUPeak) at two micro-batches,
and the cells extrapolate the line through them (memory grows linearly in the micro-batch), marked ~.

The autoencoder (a swap preset, e.g. saehd512_df_ud: 512 px df-ud, batch 8): its probe is one forward
and backward of the SAEHD loss on src and dst faces (synthetic, written to a temporary data file), the
probe `train.micro_batch = "auto"` runs. Per mode: the peak at each micro-batch of --at and at the
batch (measured when --at holds it, else on the line through the last two of --at, marked ~), the
largest micro-batch that fits the budget (default: the preset's train.memory_budget, else 6 GiB), what
micro_batch "auto" picks for the batch, and whether the whole batch fits in one micro-batch. On a GPU
the largest micro-batch is probed with the capped allocator over the powers of two up to --search
(the probe's memory does not depend on the batch it is part of).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _gan import gan_task  # noqa: E402
from _swap import is_swap, optimizers, swap_task, synthetic_faces  # noqa: E402

import bigbatch  # noqa: E402
from bigbatch.config import Config, parse_override  # noqa: E402
from bigbatch.engine import memory  # noqa: E402
from bigbatch.errors import BigbatchError  # noqa: E402

MODES = [("fp32", False), ("bf16", False), ("bf16", True)]
MODE_NAMES = {"fp32": ("fp32", False), "bf16": ("bf16", False), "bf16+ckpt": ("bf16", True)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", metavar="key=value", help="with --preset: config overrides")
    p.add_argument("--preset", default="", help="a swap preset (e.g. saehd512_df_ud): its autoencoder")
    p.add_argument("--resolution", type=int, default=128)
    p.add_argument("--ch", type=int, default=96)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--budgets", default="", help="GiB (default 6,8,11,16; a preset: its memory_budget, else 6)")
    p.add_argument("--at", default="", help="CPU: the micro-batches to measure (default 2,4; a preset: 1,2)")
    p.add_argument("--modes", default="fp32,bf16,bf16+ckpt", help="of fp32, bf16, bf16+ckpt")
    p.add_argument("--search", type=int, default=64, help="a preset on a GPU: the largest micro-batch probed")
    p.add_argument("--device", default="auto")
    args = p.parse_args()
    modes = [MODE_NAMES[m] for m in args.modes.split(",")]
    if args.preset:
        cfg = bigbatch.preset(args.preset).override(dict(parse_override(o) for o in args.overrides))
        if not is_swap(cfg):
            p.error(f"--preset {args.preset} is a {cfg.task} preset; this benchmark takes swap presets")
        if args.device != "auto":
            cfg = cfg.override({"train.device": args.device})
        return swap_table(cfg, args, modes)
    args.budgets, args.at = args.budgets or "6,8,11,16", args.at or "2,4"
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
    for precision, ckpt in modes:
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


def swap_table(cfg: Config, args: argparse.Namespace, modes: list[tuple[str, bool]]) -> None:
    """The autoencoder's table (see the module docstring)."""
    batch = cfg.train.batch
    budget_text = cfg.train.memory_budget
    budgets = (
        [float(b) for b in args.budgets.split(",")]
        if args.budgets
        else [memory.parse_bytes(budget_text) / 2**30 if budget_text else 6.0]
    )
    at = sorted({int(m) for m in (args.at or "1,2").split(",")})
    rows = []
    with synthetic_faces(cfg) as cfg:
        for precision, ckpt in modes:
            torch.manual_seed(0)
            task, rep = swap_task(cfg, precision=precision, checkpointing=ckpt, micro_batch="auto")
            opts = optimizers(task)
            plain = [m for m, _ in rep.models]
            peaks: dict[int, int] = {}
            largest, auto, fits = [], [], []
            if rep.device.type == "cuda":
                weights = memory.state_bytes(plain, [])
                share = rep.share
                for gib in budgets:
                    rep.memory_budget = int(gib * 2**30)
                    rep.set_batch(max(args.search, batch))  # pending "auto": the candidates are its divisors
                    try:
                        m = rep.plan_micro_batch(task.probe, opts).micro_batch
                    except BigbatchError:
                        m = 0
                    rep._plan = None  # (plan again for the next budget)
                    peaks.update({pr.micro_batch: pr.peak_bytes for pr in rep.probes if pr.fits})
                    largest.append(str(m))
                    auto.append(str(max([d for d in _divisors(share) if d <= m], default=0)))
                    fits.append(m >= share)
                if share not in peaks:  # the batch's peak, not probed (or over every budget): measured uncapped
                    baseline = memory.state_bytes(plain, opts) - weights
                    peaks[share] = memory.measure(task.probe, share, rep.device, 2**62, baseline).peak_bytes
                shown = {m: memory.format_bytes(peaks[m]) for m in sorted(peaks)}
            else:
                baseline = memory.state_bytes(plain, opts)
                for m in at:
                    peaks[m] = memory.measure(task.probe, m, rep.device, 2**62, baseline).peak_bytes
                    print(f"  {precision}{' + ckpt' if ckpt else ''}: micro-batch {m}: "
                          f"{memory.format_bytes(peaks[m])}", file=sys.stderr, flush=True)
                a, b = at[-2], at[-1]
                per_image = (peaks[b] - peaks[a]) / (b - a)
                fixed = peaks[a] - a * per_image
                line = {m: fixed + m * per_image for m in _divisors(rep.share)}
                shown = {m: memory.format_bytes(peaks[m]) for m in at}
                if rep.share not in peaks:
                    shown[rep.share] = "~" + memory.format_bytes(line[rep.share])
                for gib in budgets:
                    cap = gib * 2**30
                    most = int((cap - fixed) // per_image) if per_image > 0 else 0
                    largest.append(f"~{most}" if most > 0 else "0")
                    exact = {m: peaks.get(m, v) for m, v in line.items()}
                    auto.append(str(max([m for m, v in exact.items() if v <= cap], default=0)))
                    fits.append(exact[rep.share] <= cap)
            rows.append((precision, ckpt, shown, largest, auto, fits, rep.device, rep.share))
            del task, rep
    model, share = cfg.model.options, rows[0][7]
    device = rows[0][6]
    dims = "/".join(str(model.get(k, "-")) for k in ("ae_dims", "e_dims", "d_dims", "d_mask_dims"))
    print(
        f"# {cfg.name}: saehd {model.get('archi', '')} {cfg.data.resolution}px, ae/e/d/d_mask dims {dims}, "
        f"batch {batch}, device {device}; peak of one probe (forward + backward of the autoencoder's loss)"
        + ("" if device.type == "cuda" else f", counted at micro-batches {', '.join(map(str, at))} (~: on their line)")
    )
    columns = sorted({m for r in rows for m in r[2]})
    head = "| mode | " + " | ".join(f"peak @ micro {m}" for m in columns)
    for g in budgets:
        head += f" | largest micro-batch in {g:g} GiB | micro_batch auto for batch {batch} | batch {batch} in one micro-batch"
    head += " |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for precision, ckpt, shown, largest, auto, fits, _, _ in rows:
        cells = [shown.get(m, "-") for m in columns]
        for most, pick, fit in zip(largest, auto, fits):
            cells += [most, pick, "yes" if fit else "no"]
        print(f"| {precision}{' + checkpointing' if ckpt else ''} | " + " | ".join(cells) + " |")
    names = [f"{p}{' + checkpointing' if c else ''}" for p, c, *_ in rows]
    if "fp32" in names:
        base = rows[names.index("fp32")][3]
        for i, g in enumerate(budgets):
            ratios = []
            for name, row in zip(names, rows):
                num, den = int(row[3][i].lstrip("~")), int(base[i].lstrip("~"))
                if name != "fp32":
                    ratios.append(f"{name} {num / den:.1f}x" if den else f"{name} {num} (fp32: 0)")
            if ratios:
                print(f"\nLargest micro-batch in {g:g} GiB against fp32's: " + ", ".join(ratios))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _pow2(batch: int) -> list[int]:
    return [m for m in (2**i for i in range(batch.bit_length())) if batch % m == 0]


if __name__ == "__main__":
    main()
