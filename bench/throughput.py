"""Training throughput of a task's step on the Replicator (GAN, classify, swap): img/s, achieved FLOP/s as
a fraction of a peak measured in the same run, and peak memory, for precisions x activation
checkpointing x micro-batch splits. Images are synthetic, so any preset and resolution works.

    python bench/throughput.py                                   # digits preset, CPU-sized
    python bench/throughput.py --preset digits data.resolution=64 train.batch=64 --micro 64,16
    python bench/throughput.py model.name=biggan data.resolution=128 model.ch=96 model.dim_z=120 \
        train.batch=256 --micro 64 --precisions fp32,bf16 --classes 1000        # on a GPU
    python bench/throughput.py --preset saehd512_df_ud --precisions fp32,bf16 --checkpointing off,on --steps 3
    python bench/throughput.py --preset fashion_resnet_fast data.resolution=32 train.batch=128 \
        train.micro_batch=128 --precisions fp32,bf16 --checkpointing off         # ResNet-20 at 32 px
    python bench/throughput.py --preset digits train.compile=true --warmup 3 --precisions bf16 --checkpointing off
    python bench/throughput_all.py                   # every task, fp32 and bf16, compile off and on: one table

FLOPs are counted by torch.utils.flop_counter (matmuls and convolutions, forward and backward) over
one D step and one G step (classify: one step; swap: one iteration), run eagerly also under
train.compile (the same arithmetic; no second compile); the peak is the best of a few large matmuls and
convolutions in the same dtype. "plain loop" runs the same micro-batches through the same loss functions with a bare
backward/step loop (no Replicator): engine overhead is the gap between it and img/s; the cost of
smaller kernels is the gap between micro-batch splits of the plain loop. On CPU, fp16 is emulated
(slow); it is there for completeness, GPUs are where it matters.

A classify preset (task = "classify", e.g. fashion_resnet_fast, imagenet_resnet50) times `task.step` on one
synthetic batch held in memory (no data reading: the loader cuts the crops; the loss included), at
data.resolution and train.batch: the preset's data.schedule is set aside. --classes sets its classes.

A swap preset (task = "swap", e.g. saehd512_df_ud) times its training iteration instead: `task.step`
on the feed the training loop reads (src and dst faces, synthetic, from a temporary data file), one
optimizer step of the SAEHD autoencoder (and of each discriminator that is on), warp and data reading
included: s/iteration, img/s, CPU seconds per iteration (this process's, all its threads: what a
busy machine does not inflate) and peak memory (on CPU counted over the first warm-up iteration,
which also creates the optimizer state; on a GPU max_memory_allocated over the timed ones).
micro_batch "auto" (the preset's) is planned first, as the training loop plans it; --micro N fixes
it instead. On a CPU without native bf16 (AVX2), bf16 convolutions run orders of magnitude slower
than fp32: time bf16 on a GPU or a CPU with AVX-512 or AMX.

train.compile=true works for each task (the --warmup iterations compile: give it 3 or more; under it the
GAN's plain loop is not run, and on CPU the counted peak memory is that of the eager step: see
counted_peak).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).parent))
from _args import name_list, one_line_errors, positive_int  # noqa: E402
from _classify import classify_task  # noqa: E402
from _env import measured_on  # noqa: E402
from _gan import config, gan_task, sync  # noqa: E402
from _swap import is_swap, swap_feed, swap_task, synthetic_faces  # noqa: E402

from bigbatch.batching import compiles, plan_micro_batch  # noqa: E402
from bigbatch.engine import batch_parts, dist  # noqa: E402
from bigbatch.engine.memory import CPUPeak, format_bytes, state_bytes  # noqa: E402
from bigbatch.engine.precision import DTYPES, autocast, native_bf16  # noqa: E402


def compute_peak(device: torch.device, precision: str, toy: bool = False) -> float:
    """FLOP/s of the best of several large matmuls and 3x3 convolutions in the precision's dtype (`toy`: small
    ones, for a dry run: a CPU took a second and a half each time)."""
    dtype = DTYPES[precision]
    n, c = (256, 64) if toy else (8192, 256) if device.type == "cuda" else (1024, 256)
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    x = torch.randn(64 if device.type == "cuda" and not toy else 2, c, 32, 32, device=device).to(dtype)
    w = torch.randn(c, c, 3, 3, device=device).to(dtype)
    candidates = [
        (lambda: a @ b, 2 * n**3),
        (lambda: torch.nn.functional.conv2d(x, w, padding=1), 2 * x.shape[0] * c * c * 9 * 32 * 32),
    ]
    best = 0.0
    for fn, flops in candidates:
        for _ in range(4):
            sync(device)
            t = time.perf_counter()
            for _ in range(3):
                fn()
            sync(device)
            best = max(best, 3 * flops / (time.perf_counter() - t))
    return best


# Both counters below are dispatch modes, and a torch.compile'd model called under one runs eagerly then and
# (torch 2.13) from then on, or never compiles if that was its first call. Under set_stance("force_eager")
# neither happens: the counted step runs eagerly (the same arithmetic) and the compiled graphs stay in use.


def count_flops(step: Callable[[], object]) -> int:
    """FLOPs (torch.utils.flop_counter: matmuls and convolutions, forward and backward) of one `step()`,
    run eagerly."""
    counter = FlopCounterMode(display=False)
    with torch.compiler.set_stance("force_eager"), counter:
        step()
    return counter.get_total_flops()


def counted_peak(step: Callable[[], object]) -> int:
    """The peak bytes of CPU tensors (CPUPeak) that one `step()`, run eagerly, creates."""
    with torch.compiler.set_stance("force_eager"), CPUPeak() as counter:
        step()
    return counter.peak


def bare_iteration(task, nimg: int, step: int, precision: str) -> None:
    """The same D and G step as the Replicator's, written as the plain loop everyone writes: the
    cost of the micro-batch kernels alone, to tell engine overhead from small-kernel cost."""
    plan = task.rep.plan
    m, acc = plan.micro_batch, plan.accumulation
    for loss_fn, batch, opt, train, frozen in (
        (task.d_loss, task.d_batch(nimg), task.opt_D, task.D, task.G),
        (task.g_loss, task.g_batch(step), task.opt_G, task.G, task.D),
    ):
        train.requires_grad_(True)
        frozen.requires_grad_(False)
        for j in range(acc):
            micro = batch_parts.to_device(batch_parts.cut(batch, j * m, (j + 1) * m), task.rep.device)
            with autocast(precision, task.rep.device):
                out = loss_fn(micro)
            loss = out["loss"] if isinstance(out, dict) else out
            (loss.float() / acc).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def measure(
    cfg,
    precision: str,
    checkpointing: bool,
    micro: int,
    steps: int,
    classes: int,
    *,
    warmup: int = 1,
    flops: bool = True,
    plain: bool = True,
    after_warmup: Callable[[], None] | None = None,
) -> dict:
    """img/s and peak memory of the GAN step (see the module docstring). `warmup`: untimed iterations
    first (with train.compile, the first compiles); `flops`: count FLOPs over one more iteration (run
    eagerly, see count_flops); `plain`: time the plain loop too; `after_warmup`: called after the
    untimed iterations, before anything timed (bench/gpu.py waits there for its turn on the device)."""
    task, rep = gan_task(cfg, classes, precision=precision, checkpointing=checkpointing, micro_batch=micro)
    device = rep.device
    batch = cfg.train.batch
    t = time.perf_counter()
    for i in range(warmup):  # allocator, kernels, optimizer state
        task.d_step(0)
        task.g_step(i)  # (StyleGAN2's lazy path-length steps where they fall: g_step(0) is one, every time)
        if i == 0:  # (with train.compile: the first compiles, in a new process as a run's first step does)
            sync(device)
            first_s = time.perf_counter() - t
    if plain:
        bare_iteration(task, 0, 0, precision)
    sync(device)
    warmup_s = time.perf_counter() - t
    if after_warmup is not None:
        after_warmup()
    n_flops = count_flops(lambda: (task.d_step(batch), task.g_step(1))) if flops else None
    # Timed: engine and plain-loop iterations alternate, so machine noise hits both alike.
    d_time = g_time = bare = cpu = 0.0
    nimg = 2 * batch
    for step in range(steps):
        sync(device)
        t0, c = time.perf_counter(), time.process_time()
        task.d_step(nimg)
        sync(device)
        t1 = time.perf_counter()
        task.g_step(2 + step)
        sync(device)
        t2 = time.perf_counter()
        cpu += time.process_time() - c
        if plain:
            bare_iteration(task, nimg, 2 + step, precision)
            sync(device)
        d_time, g_time, bare = d_time + t1 - t0, g_time + t2 - t1, bare + time.perf_counter() - t2
        nimg += batch
    # Peak memory of one more iteration (the CPU counter slows what it watches, so not timed).
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        task.d_step(nimg)
        task.g_step(steps + 2)
        peak = torch.cuda.max_memory_allocated(device)
    else:
        peak = counted_peak(lambda: (task.d_step(nimg), task.g_step(steps + 2)))
        peak += state_bytes([p for p, _ in rep.models], [task.opt_G, task.opt_D])
    seconds = (d_time + g_time) / steps
    return {
        "img_per_s": batch / seconds,
        "s_per_iter": seconds,
        "cpu_s_per_iter": cpu / steps,
        "bare_img_per_s": batch * steps / bare if plain else None,
        "d_ms": 1000 * d_time / steps,
        "g_ms": 1000 * g_time / steps,
        "flops": n_flops,
        "flop_per_s": n_flops / seconds if flops else None,
        "peak": peak,
        "plan": f"{rep.plan.micro_batch}x{rep.plan.accumulation}",
        "device": str(device),
        "warmup_s": warmup_s,
        "first_s": first_s,
    }


def measure_classify(
    cfg,
    precision: str,
    checkpointing: bool,
    micro: int,
    steps: int,
    classes: int,
    *,
    warmup: int = 1,
    flops: bool = True,
) -> dict:
    """img/s of the classify task's step (ClassifyTask.step: the loss, one SGD/AdamW step; the loader cuts the
    crops) on one synthetic batch held in memory, after `warmup` (>= 1) untimed steps (with
    train.compile, the second compiles); FLOPs of one more step; peak memory as measure_swap counts it."""
    task, rep, feed = classify_task(cfg, classes, precision=precision, checkpointing=checkpointing, micro_batch=micro)
    device = rep.device
    t = time.perf_counter()
    peak = None
    for i in range(max(warmup, 1)):
        if i == 0 and device.type == "cpu":  # weights, then all this step creates (optimizer state too)
            peak = counted_peak(lambda: task.step(feed)) + state_bytes([m for m, _ in rep.models], [])
        else:
            task.step(feed)
    sync(device)
    warmup_s = time.perf_counter() - t
    n_flops = count_flops(lambda: task.step(feed)) if flops else None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sync(device)
    t, c = time.perf_counter(), time.process_time()
    for _ in range(steps):
        task.step(feed)
    sync(device)
    seconds, cpu = (time.perf_counter() - t) / steps, (time.process_time() - c) / steps
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
    return {
        "img_per_s": cfg.train.batch / seconds,
        "s_per_iter": seconds,
        "cpu_s_per_iter": cpu,
        "flops": n_flops,
        "flop_per_s": n_flops / seconds if flops else None,
        "peak": peak,
        "plan": f"{rep.plan.micro_batch}x{rep.plan.accumulation}",
        "device": str(device),
        "warmup_s": warmup_s,
    }


def measure_swap(
    cfg, precision: str, checkpointing: bool, micro, steps: int, warmup: int, *, flops: bool = True
) -> dict:
    """Seconds per training iteration of the swap task (see the module docstring); `flops`: count the
    FLOPs of one more iteration (untimed, after the warm-up; see count_flops)."""
    task, rep = swap_task(cfg, precision=precision, checkpointing=checkpointing, micro_batch=micro)
    device = rep.device
    if rep.micro_batch_pending:  # "auto": planned as the training loop plans it, before its first step
        plan_micro_batch(rep, task.probe, verbose=False)
    peak = None
    with closing(swap_feed(task, rep)) as feed:
        for i in range(warmup):
            if i == 0 and device.type == "cpu":  # weights, then all this step creates (optimizer state too)
                peak = counted_peak(lambda: task.step(feed)) + state_bytes([p for p, _ in rep.models], [])
            else:
                task.step(feed)
        n_flops = count_flops(lambda: task.step(feed)) if flops else None
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        seconds = cpu = 0.0
        for _ in range(steps):
            sync(device)
            t, c = time.perf_counter(), time.process_time()
            task.step(feed)
            sync(device)
            seconds, cpu = seconds + time.perf_counter() - t, cpu + time.process_time() - c
        if device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(device)
    rep.close()
    return {
        "s_per_iter": seconds / steps,
        "cpu_s_per_iter": cpu / steps,
        "img_per_s": cfg.train.batch * steps / seconds,
        "flops": n_flops,
        "flop_per_s": n_flops * steps / seconds if flops else None,
        "peak": peak,
        "plan": f"{rep.plan.micro_batch}x{rep.plan.accumulation}",
        "device": device,
    }


def flop_cells(r: dict, peak: float) -> str:
    """GFLOP/iter | achieved TFLOP/s | peak TFLOP/s | % of peak, as table cells."""
    if r["flops"] is None:
        return f"- | - | {peak / 1e12:.3f} | -"
    fraction = 100 * r["flop_per_s"] / peak
    return f"{r['flops'] / 1e9:.2f} | {r['flop_per_s'] / 1e12:.4f} | {peak / 1e12:.3f} | {fraction:.1f}%"


def peaks_of(rows: list[tuple], device: torch.device) -> dict[str, float]:
    """compute_peak of each precision of `rows` (precision first in each), measured now."""
    return {precision: compute_peak(device, precision) for precision in dict.fromkeys(r[0] for r in rows)}


def print_table(rows: list[tuple], middle: str, cells) -> None:
    """`rows` of (precision, checkpointing, result) as a table: precision | ckpt | micro x acc, then the
    `middle` columns (`cells(result)`), the FLOP columns against each precision's peak (measured now) and
    peak memory."""
    peaks = peaks_of(rows, torch.device(rows[0][2]["device"]))
    header = (
        f"| precision | ckpt | micro x acc | {middle} | GFLOP/iter | achieved TFLOP/s | peak TFLOP/s | % of peak "
        "| peak memory |"
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for precision, ckpt, r in rows:
        peak = "-" if r["peak"] is None else format_bytes(r["peak"])
        flop = flop_cells(r, peaks[precision])
        print(f"| {precision} | {'on' if ckpt else 'off'} | {r['plan']} | {cells(r)} | {flop} | {peak} |")


def swap_main(cfg, args: argparse.Namespace) -> None:
    """The swap task's table: precisions x activation checkpointing x micro-batches."""
    micros = args.micro or [cfg.train.micro_batch]
    rows = []
    with synthetic_faces(cfg) as faces:
        for precision in args.precisions:
            for ckpt in (c == "on" for c in args.checkpointing):
                for micro in micros:
                    torch.manual_seed(0)
                    r = measure_swap(faces, precision, ckpt, micro, args.steps, args.warmup)
                    rows.append((precision, ckpt, r))
                    print(
                        f"  {precision}, checkpointing {'on' if ckpt else 'off'}: {r['s_per_iter']:.2f} s/iteration",
                        file=sys.stderr,
                        flush=True,
                    )
    device = rows[0][2]["device"]
    threads = torch.get_num_threads()
    where = f"{device}, {threads} thread{'s' * (threads != 1)}" if device.type == "cpu" else str(device)
    o = cfg.model.options
    dims = "/".join(str(o.get(k, "-")) for k in ("ae_dims", "e_dims", "d_dims", "d_mask_dims"))
    print(
        f"# {cfg.name}: saehd {o.get('archi', '')} {cfg.data.resolution}px, ae/e/d/d_mask dims {dims}, "
        f"batch {cfg.train.batch}, device {where}; {args.steps} timed iteration{'s' * (args.steps != 1)} "
        f"after {args.warmup} warm-up" + ("" if native_bf16(device) else "; no native bf16 kernels on this CPU")
    )
    print_table(
        rows,
        "s/iteration | img/s | CPU s/iteration",
        lambda r: f"{r['s_per_iter']:.2f} | {r['img_per_s']:.3f} | {r['cpu_s_per_iter']:.2f}",
    )


def classify_main(cfg, args: argparse.Namespace) -> None:
    """The classify task's table: precisions x activation checkpointing x micro-batches."""
    micros = args.micro or [cfg.train.micro_batch]
    rows = []
    for precision in args.precisions:
        for ckpt in (c == "on" for c in args.checkpointing):
            for micro in micros:
                r = measure_classify(cfg, precision, ckpt, micro, args.steps, args.classes, warmup=args.warmup)
                rows.append((precision, ckpt, r))
    threads = torch.get_num_threads()
    compiled = ", train.compile" if cfg.train.compile else ""
    print(
        f"# {cfg.name}: {cfg.model.name} ch {cfg.model.ch} {cfg.data.resolution}px, {args.classes} classes, batch "
        f"{cfg.train.batch}{compiled}, device {rows[0][2]['device']}, {threads} thread{'s' * (threads != 1)}; "
        f"{args.steps} timed steps after {args.warmup} warm-up, one batch in memory"
    )
    print_table(
        rows,
        "img/s | s/step | CPU s/step",
        lambda r: f"{r['img_per_s']:.1f} | {r['s_per_iter']:.3f} | {r['cpu_s_per_iter']:.3f}",
    )


def micro_batches(text: str) -> list[int | str]:
    """--micro: comma-separated whole numbers, or "auto" (a swap preset's micro-batch, planned)."""
    return [m if m == "auto" else positive_int(m) for m in text.split(",")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", metavar="key=value")
    p.add_argument("--preset", default="digits")
    p.add_argument(
        "--precisions",
        type=name_list(tuple(DTYPES)),
        help="of fp32, bf16, fp16 (default: all three on a GPU; fp32,bf16 on a CPU, whose fp16 kernels are ~100x slow)",
    )
    p.add_argument("--checkpointing", type=name_list(("off", "on")), default="off,on", help="off, on or off,on")
    p.add_argument("--micro", type=micro_batches, help="micro-batches to compare, e.g. 64,16 (default: the config's)")
    p.add_argument("--steps", type=positive_int, default=5, help="timed iterations (GAN: one D and one G step each)")
    p.add_argument("--classes", type=positive_int, default=10, help="GAN and classify presets: classes of the data")
    p.add_argument("--warmup", type=positive_int, default=1, help="untimed iterations first (train.compile: 3 or more)")
    args = p.parse_args()
    torch.manual_seed(0)
    cfg = config(args.preset, args.overrides)
    device = dist.context(cfg.train.device).device  # train.compile "auto" as resolved there, said in the table
    print(measured_on(device))
    if args.precisions is None:  # (found from outside: most of a CPU run's minutes went to fp16 rows)
        args.precisions = ["fp32", "bf16"] if device.type == "cpu" else ["fp32", "bf16", "fp16"]
    cfg = cfg.override({"train.compile": compiles(cfg, device)})
    if is_swap(cfg):
        return swap_main(cfg, args)
    if "auto" in (args.micro or []):
        p.error("--micro auto: only a swap preset plans its micro-batch; give numbers, e.g. 64,16")
    if cfg.task == "classify":
        return classify_main(cfg, args)
    micros = args.micro or [cfg.train.micro_batch]
    ckpts = [c == "on" for c in args.checkpointing]
    precisions = args.precisions
    plain = not cfg.train.compile  # compiled, the plain loop would compile graphs of its own
    rows = []
    for precision in precisions:
        for ckpt in ckpts:
            for micro in micros:
                r = measure(cfg, precision, ckpt, micro, args.steps, args.classes, warmup=args.warmup, plain=plain)
                rows.append((precision, ckpt, r))
    print(
        f"# {cfg.model.name} {cfg.data.resolution}px ch {cfg.model.ch}, batch {cfg.train.batch}, "
        f"{args.classes} classes" + (", train.compile" if cfg.train.compile else "") + f", device "
        f"{rows[0][2]['device']}, {args.steps} timed iterations (D step + G step) after {args.warmup} warm-up"
    )

    def cells(r: dict) -> str:
        bare = "-" if r["bare_img_per_s"] is None else f"{r['bare_img_per_s']:.1f}"
        return f"{r['img_per_s']:.1f} | {bare} | {r['d_ms']:.1f} | {r['g_ms']:.1f}"

    print_table(rows, "img/s | plain loop img/s | D step ms | G step ms", cells)


if __name__ == "__main__":
    with one_line_errors():
        main()
