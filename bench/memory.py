"""The largest micro-batch of BigGAN (128 px, ch 96, 1000 classes) that fits a memory budget, for
fp32, bf16 and bf16 + activation checkpointing. One table. With --preset NAME of a swap preset, the
same for its SAEHD autoencoder (see "The autoencoder" below).

    python bench/memory.py                      # CPU: peaks measured at two micro-batches
    python bench/memory.py --budgets 6,8,11,16  # on a GPU: probed with the capped allocator
    python bench/memory.py --preset saehd512_df_ud            # the autoencoder, in the preset's 6 GiB
    python bench/memory.py --preset saehd128 --at 8,16 --modes fp32,bf16+ckpt

On a GPU each cell is what `train.micro_batch = "auto"` picks: the Replicator probes one D and one G
forward/backward under an allocator capped at the budget (powers of two dividing the batch). On CPU
there is no allocator to cap: the peak of the same probe is counted (CPUPeak) at two micro-batches,
and the cells extrapolate the line through them (memory grows linearly in the micro-batch), marked ~.

The autoencoder (a swap preset, e.g. saehd512_df_ud: 512 px df-ud, batch 8): its probe is one forward
and backward of the SAEHD loss on src and dst faces (synthetic, written to a temporary data file), the
probe `train.micro_batch = "auto"` runs. Per mode: the peak at each micro-batch of --at (default:
half the batch and the batch) and at the batch (on the line through the last two of --at, marked ~,
when --at does not hold it), the largest micro-batch that fits the budget (default: the preset's
train.memory_budget, else 6 GiB), what micro_batch "auto" picks for the batch, and whether the whole
batch fits in one micro-batch. On a GPU
the largest micro-batch is probed with the capped allocator over the powers of two up to --search
(the probe's memory does not depend on the batch it is part of).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _args import at_least, device_arg, int_list, one_line_errors, positive_float_list  # noqa: E402
from _env import measured_on  # noqa: E402
from _gan import gan_task  # noqa: E402
from _swap import Fp32Kernels, is_swap, optimizers, swap_task, synthetic_faces  # noqa: E402

import bigbatch  # noqa: E402
from bigbatch.config import Config, parse_override  # noqa: E402
from bigbatch.engine import dist, memory  # noqa: E402
from bigbatch.engine.precision import native_bf16  # noqa: E402
from bigbatch.errors import BigbatchError  # noqa: E402

MODE_NAMES = {"fp32": ("fp32", False), "bf16": ("bf16", False), "bf16+ckpt": ("bf16", True)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", metavar="key=value", help="with --preset: config overrides")
    p.add_argument("--preset", default="", help="a swap preset (e.g. saehd512_df_ud): its autoencoder")
    p.add_argument("--resolution", type=at_least(4), default=128)
    p.add_argument("--ch", type=at_least(1), default=96)
    p.add_argument("--batch", type=at_least(1), default=2048)
    p.add_argument(
        "--budgets", type=positive_float_list, help="GiB (default 6,8,11,16; a preset: its memory_budget, else 6)"
    )
    p.add_argument(
        "--at",
        type=int_list(1),
        help="CPU: the micro-batches to measure (default 2,4; a preset: half its batch, its batch)",
    )
    p.add_argument("--modes", default="fp32,bf16,bf16+ckpt", help="of fp32, bf16, bf16+ckpt")
    p.add_argument("--search", type=at_least(1), default=64, help="a preset on a GPU: the largest micro-batch probed")
    p.add_argument(
        "--bf16-kernels",
        choices=("auto", "native", "fp32"),
        default="auto",
        help="a preset on CPU: count bf16 probes with fp32 convolutions and matmuls (auto: where bf16 is not native)",
    )
    p.add_argument("--device", default="auto", type=device_arg)
    args = p.parse_args()
    print(measured_on(args.device))
    # (found from outside: --budgets 0 ran, abc and --at 4,4 were tracebacks)
    if args.at is not None and len(set(args.at)) < 2:
        p.error("--at: give two different micro-batches or more, e.g. 2,4 (memory is extrapolated on their line)")
    if args.at is not None and not args.preset and max(args.at) > args.batch:  # (found from outside: "peak @ 8" of 6)
        p.error(f"--at: micro-batches of at most --batch {args.batch}, got {max(args.at)}")
    unknown = [m for m in args.modes.split(",") if m not in MODE_NAMES]
    if unknown:
        p.error(f"--modes: unknown {', '.join(unknown)}; valid: {', '.join(MODE_NAMES)}")
    modes = [MODE_NAMES[m] for m in args.modes.split(",")]
    if args.preset:
        cfg = bigbatch.preset(args.preset).override(dict(parse_override(o) for o in args.overrides))
        if not is_swap(cfg):
            p.error(f"--preset {args.preset} is a {cfg.task} preset; this benchmark takes swap presets")
        cfg = cfg.override({"train.device": args.device})
        return swap_table(cfg, args, modes)
    if args.overrides:
        p.error("key=value overrides go with --preset")
    budgets, at = args.budgets or [6.0, 8.0, 11.0, 16.0], sorted(set(args.at or [2, 4]))
    cfg = Config.from_dict(
        {
            "name": "bench",
            "data": {"resolution": args.resolution},
            "model": {"name": "biggan", "ch": args.ch, "dim_z": 120 if args.resolution != 256 else 140},
            "train": {"batch": args.batch, "micro_batch": 1, "device": args.device},
        }
    )
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
            a, b = at[0], at[-1]
            baseline = memory.state_bytes(plain, opts)
            for m in (a, b):
                peaks[m] = memory.measure(task.probe, m, rep.device, 2**62, baseline).peak_bytes
            per_image = (peaks[b] - peaks[a]) / (b - a)
            fixed = peaks[a] - a * per_image
            for gib in budgets:
                # (every divisor, as micro_batch "auto" takes: found from outside, powers of two alone, "~2" for 6)
                fit = [m for m in _divisors(args.batch) if fixed + m * per_image <= gib * 2**30]
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
    batch, budget = cfg.train.batch, cfg.train.memory_budget
    budgets = args.budgets or [_gib(budget) if budget else 6.0]
    share = cfg.train.batch // dist.context(cfg.train.device).world_size
    at = sorted(set(args.at) if args.at else {max(1, share // 2), share})
    if len(at) < 2:  # (a batch of 1: its half is itself)
        raise SystemExit("--at needs two micro-batches or more (memory is extrapolated on the line through them)")
    rows, emulated = [], False
    with synthetic_faces(cfg) as cfg:
        for precision, ckpt in modes:
            row = {"mode": precision + (" + checkpointing" if ckpt else ""), "peaks": {}, "largest": [], "auto": []}
            if dist.context(cfg.train.device).device.type == "cuda":
                _swap_cuda(cfg, precision, ckpt, budgets, args.search, row)
            else:
                emulate = precision == "bf16" and args.bf16_kernels != "native"
                emulate = emulate and (args.bf16_kernels == "fp32" or not native_bf16(torch.device("cpu")))
                emulated = emulated or emulate
                _swap_cpu(cfg, precision, ckpt, budgets, at, emulate, row)
            rows.append(row)
    device = rows[0]["device"]
    o = cfg.model.options
    dims = "/".join(str(o.get(k, "-")) for k in ("ae_dims", "e_dims", "d_dims", "d_mask_dims"))
    how = (
        "probed under the allocator capped at the budget (powers of two up to " + str(max(args.search, batch)) + ")"
        if device.type == "cuda"
        else f"counted (CPUPeak) at micro-batches {', '.join(map(str, at))}; ~: on the line through "
        f"{at[-2]} and {at[-1]}"
    )
    if emulated:
        how += "; bf16 with fp32 convolutions and matmuls rounded to bf16 (no native bf16 kernels on this CPU)"
    print(
        f"# {cfg.name}: saehd {o.get('archi', '')} {cfg.data.resolution}px, ae/e/d/d_mask dims {dims}, batch {batch}, "
        f"device {device}; peak memory of one forward + backward of the autoencoder's loss, {how}"
    )
    columns = sorted({m for r in rows for m in r["peaks"]})
    head = "| mode | " + " | ".join(f"peak @ micro-batch {m}" for m in columns)
    for g in budgets:
        head += f" | largest micro-batch in {g:g} GiB | micro_batch auto for batch {batch}"
        head += f" | batch {batch} in one micro-batch"
    print(head + " |")
    print("|" + "---|" * head.count("|"))
    for r in rows:
        cells = [r["peaks"].get(m, "-") for m in columns]
        for most, pick in zip(r["largest"], r["auto"]):
            cells += [most, str(pick), "yes" if pick == batch else "no"]
        print(f"| {r['mode']} | " + " | ".join(cells) + " |")
    fp32 = next((r for r in rows if r["mode"] == "fp32"), None)
    for i, g in enumerate(budgets):
        base = int(fp32["largest"][i].lstrip("~")) if fp32 else 0
        others = [r for r in rows if r is not fp32]
        if base and others:
            ratios = [f"{r['mode']} {int(r['largest'][i].lstrip('~')) / base:.1f}x" for r in others]
            print(f"\nLargest micro-batch in {g:g} GiB against fp32's: " + ", ".join(ratios))


def _swap_cpu(
    cfg: Config, precision: str, ckpt: bool, budgets: list[float], at: list[int], emulate: bool, row: dict
) -> None:
    """CPU: the probe's peak counted at each micro-batch of `at`, the line through the last two."""
    torch.manual_seed(0)
    task, rep = swap_task(cfg, precision=precision, checkpointing=ckpt, micro_batch="auto")
    baseline = memory.state_bytes([m for m, _ in rep.models], optimizers(task))
    peaks = {}
    for m in at:
        with Fp32Kernels() if emulate else contextlib.nullcontext():
            peaks[m] = memory.measure(task.probe, m, rep.device, 2**62, baseline).peak_bytes
        print(f"  {row['mode']}, micro-batch {m}: {memory.format_bytes(peaks[m])}", file=sys.stderr, flush=True)
    a, b = at[-2], at[-1]
    per_image = (peaks[b] - peaks[a]) / (b - a)
    fixed = peaks[a] - a * per_image
    line = {m: peaks.get(m, fixed + m * per_image) for m in _divisors(rep.share)}
    row["peaks"] = {m: memory.format_bytes(p) for m, p in peaks.items()}
    if rep.share not in peaks:
        row["peaks"][rep.share] = "~" + memory.format_bytes(line[rep.share])
    for gib in budgets:
        most = int((gib * 2**30 - fixed) // per_image) if per_image > 0 else 0
        row["largest"].append(f"~{most}" if most > 0 else "0")
        row["auto"].append(max([m for m, p in line.items() if p <= gib * 2**30], default=0))
    row["device"] = rep.device
    rep.close()


def _swap_cuda(cfg: Config, precision: str, ckpt: bool, budgets: list[float], search: int, row: dict) -> None:
    """GPU: per budget, what micro_batch "auto" picks (Replicator.plan_micro_batch under the capped
    allocator) for a batch of max(search, batch), and for the batch itself; its probes' peaks."""
    peaks: dict[int, int] = {}
    for gib in budgets:
        torch.manual_seed(0)
        task, rep = swap_task(cfg, precision=precision, checkpointing=ckpt, micro_batch="auto")
        share = rep.share
        rep.memory_budget = int(gib * 2**30)
        rep.set_batch(max(search, cfg.train.batch))  # "auto" not yet planned: candidates are its divisors
        try:
            most = rep.plan_micro_batch(task.probe, optimizers(task)).micro_batch
        except BigbatchError:
            most = 0
        peaks.update({p.micro_batch: p.peak_bytes for p in rep.probes if p.fits})
        row["largest"].append(str(most))
        row["auto"].append(max([d for d in _divisors(share) if d <= most], default=0))
        row["device"] = rep.device
        if gib == budgets[-1] and share not in peaks:  # the batch's own peak, uncapped (over the budget)
            plain = [m for m, _ in rep.models]
            baseline = memory.state_bytes(plain, optimizers(task)) - memory.state_bytes(plain, [])
            peaks[share] = memory.measure(task.probe, share, rep.device, 2**62, baseline).peak_bytes
        rep.close()
        del task, rep
        torch.cuda.empty_cache()
    row["peaks"] = {m: memory.format_bytes(p) for m, p in peaks.items()}


def _gib(text: str) -> float:
    return memory.parse_bytes(text) / 2**30


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


if __name__ == "__main__":
    with one_line_errors():
        main()
