"""A GPU proof in one command, each row a step as `bigbatch train` runs it (cuDNN autotuned but under a memory budget):
BigGAN-128 img/s and peak memory in fp32 and bf16, eager and under train.compile (bf16 compiled again in a new
process from the compile cache the first compile left, as a resumed run does; bf16 as CUDA graphs, train.compile =
"reduce-overhead", as ResNet-50 is too; profiled eager and compiled, where the device's time goes: torch.profiler),
its memory plan at batch 2048 in 6 GiB; SAEHD 512 df-ud at batch 8 in 6 GiB, in NCHW and channels-last, autotuned,
and profiled; ResNet-50 at 224 px in bf16, eager (with and without cuDNN's autotuning, and profiled) and compiled
(again in a new process from the cache too), on a batch in memory and fed from a JPEG store by the Feed (CPU decode
by every core, nvJPEG, nvImageCodec); JPEG decoding on the device (nvJPEG; nvImageCodec where installed: a machine
without a network needs its wheels carried); StyleGAN2 at 256 px (ADA's paper256) in fp32 and bf16, and bf16
compiled; StyleGAN2 bf16 profiled, its FIR filter five ways (bench/fir.py) and its step with the separable and fused
ways; BigGAN-128's resampling layers as two ops and as one (bench/resample.py) and its attention (the formula against
the fused kernels: bench/attention.py); tests/test_cuda.py (the tests that compile last); how often an iteration of
BigGAN, StyleGAN2 and ResNet-50 waits for the GPU, and where (bench/_gpu_waits.py). One dated table appended to
bench/RESULTS.md.

    make bench-gpu                                                   # = python bench/gpu.py; < 8 minutes
    python bench/gpu.py --parts biggan-bf16,resnet50                 # some parts only
    python bench/gpu.py --parts biggan-bf16-compile --limit 500 --budget 520   # compiling, given more time
    python bench/gpu.py --device cpu --dry-run --out /tmp/proof.md   # every part at toy sizes on CPU, ~3 min

Each part runs in a process of its own under a time limit, and all of them within --budget seconds
(the slow compile parts near the end), so a part that fails, hangs or breaks its CUDA context is
reported in its row and the others still run; the exit status is 1 if any part failed or was not run.
The compile parts run at once, each in its own process (run_in_turns): they compile side by side, which
is host work, and take turns for their timed iterations, so that no figure is measured beside another
part's work.
The parts measure with the benchmarks' own code, on tasks built as training builds them:
throughput.measure (BigGAN img/s), throughput.measure_swap (SAEHD), and the planning that
`train.micro_batch = "auto"` does (bigbatch.batching.plan_micro_batch: on a GPU, probes under the
allocator capped at the budget; on CPU, peaks counted by CPUPeak). --dry-run takes the same code paths
at toy sizes (BigGAN 32 px ch 8, SAEHD 64 px, ResNet-50 ch 8 at 32 px, budgets of a few MiB). On CPU it
compiles with torch.compile's "eager" backend (Dynamo's tracing, guards and recompiles; not Inductor's
code generation, whose C++ build of BigGAN alone takes minutes on two cores): see --compile-backend.

The table is appended atomically: the file as it is when the run ends, plus the section, written to a
temporary file beside it and renamed over it, so edits made to the file meanwhile are kept.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext, suppress
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
if __name__ == "__main__" and sys.argv[1:] == ["--digest"]:  # (without torch: a checkout's, in a moment)
    from _digest import source_digest

    sys.exit(print(source_digest()))

import torch  # noqa: E402
from _args import positive_float, writable_file  # noqa: E402
from _classify import classify_task  # noqa: E402
from _gan import BF16_AS_FP32, gan_task, sync  # noqa: E402
from _gpu_data import jpeg_decode, resnet50_fed  # noqa: E402
from _gpu_profile import biggan_profile, describe_gan, resnet50_profile, saehd_profile, stylegan2_profile  # noqa: E402
from _gpu_report import device_name, keep_section, results_file, section, source_digest  # noqa: E402
from _gpu_sizes import CLASSES, COMPILE_WARMUP, REPO, SIZES, config, of_peak, timed  # noqa: E402
from _gpu_waits import waits  # noqa: E402
from _procs import ForkServer, result_row, run_limited, wait_for_turn  # noqa: E402
from _procs import run_in_turns as _run_in_turns  # noqa: E402
from _swap import synthetic_faces  # noqa: E402
from throughput import count_flops, measure, measure_swap  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

from bigbatch.batching import plan_micro_batch  # noqa: E402
from bigbatch.engine import compile_cache  # noqa: E402
from bigbatch.engine.determinism import cudnn_autotuning, run_kernels  # noqa: E402
from bigbatch.engine.memory import format_bytes  # noqa: E402
from bigbatch.engine.precision import native_bf16  # noqa: E402


def first_iteration(compiled: compile_cache.Compiled) -> str:
    """A compile part's first iteration: its seconds, and how many of the graphs it compiled came from the cache."""
    cached = f"{compiled.from_cache} of {compiled.graphs} Inductor graphs from the cache"
    return f"first iteration {compiled.seconds:.1f} s ({cached})"


def biggan(args: argparse.Namespace, precision: str, compile: bool | str, again: bool = False) -> dict:
    """img/s and peak memory of the GAN step (one D and one G step) at a fixed micro-batch. `compile`: train.compile
    (True, or a mode: "reduce-overhead" replays CUDA graphs). `again`: compiled in a new process after the compile
    parts, from the compile cache they left (bigbatch.engine.compile_cache)."""
    cfg = config(args, "gan").override({"train.compile": compile})
    watch = compile_cache.CompileWatch()
    sizes = SIZES[args.sizes]
    # Under compile: no FLOP counter (it would compile again) and no plain loop (other guards: more graphs).
    warmup, extras = (COMPILE_WARMUP, False) if compile else (1, True)
    alone = []  # whether its turn came with no other part working (run_in_turns)

    def turn() -> None:
        alone.append(wait_for_turn(Path(args.turns), args.part))

    r = measure(
        cfg,
        precision,
        False,
        sizes["gan_micro"],
        sizes["steps"],
        CLASSES,
        warmup=warmup,
        flops=extras,
        plain=extras,
        after_warmup=turn if args.turns else None,
    )
    if compile:
        graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
        backend = "" if args.compile_backend == "inductor" else f"; backend {args.compile_backend}"
        beside = " (beside the other compile parts)" if args.turns else ""
        beside += "; **timed while another part still compiled** (little time was left)" if alone == [False] else ""
        first = first_iteration(watch.compiled(r["first_s"]))
        note = f"{first}; compile + {warmup} iterations {r['warmup_s']:.0f} s{beside}; {graphs} graphs, {breaks} breaks"
        note += backend
    else:
        note = f"plain loop {r['bare_img_per_s']:.1f} img/s; {of_peak(r['flop_per_s'], args, precision)}"
    setting = f"{describe_gan(cfg)}, {precision}" + (", train.compile" if compile else "")
    setting += f" = {compile} (CUDA graphs)" if isinstance(compile, str) else ""
    setting += ", again in a new process (a resumed run)" if again else ""
    return {
        "setting": setting,
        "plan": r["plan"].replace("x", " × "),
        "img_per_s": r["img_per_s"],
        "s_per_iter": cfg.train.batch / r["img_per_s"],
        "peak": r["peak"],
        "note": note,
    }


def stylegan2(args: argparse.Namespace, precision: str, compile: bool = False, fir: str = "") -> dict:
    """img/s and peak memory of StyleGAN2's training step (one D and one G step) at ADA's paper256 settings,
    style mixing on and the lazy penalties at their intervals among the timed steps, at a fixed micro-batch.
    `compile`: train.compile (the lazy R1 and path length steps run eagerly: their double backward). `fir`: the
    layers' FIR filter computed another way of bench/fir.py's, or its "fused+act", the model's fused kernels
    (bigbatch/models/fused.py: the filter, the bias and the activation; this part's process alone)."""
    filtering: AbstractContextManager = nullcontext()
    if fir:
        from fir import using

        filtering = using(fir)
    cfg = config(args, "stylegan2").override({"train.compile": compile})
    micro, steps = SIZES[args.sizes]["stylegan2_micro"], SIZES[args.sizes]["steps"]
    turn = (lambda: wait_for_turn(Path(args.turns), args.part)) if args.turns else None
    fused = fir.startswith("fused")
    warmup = COMPILE_WARMUP if compile else 2 if fused else 1  # (fused: a lazy and a plain step's kernels compiled)
    with filtering:
        r = measure(
            cfg, precision, False, micro, steps, 0, plain=False, flops=not compile, warmup=warmup, after_warmup=turn
        )
    t = cfg.train
    lazy = f"R1 every {t.r1_every} D steps, path length every {t.pl_every} G steps"
    if compile:
        # (no first iteration's time: the first is a lazy step, run eagerly; the second compiles)
        note = f"{lazy}, run eagerly; compile + {warmup} iterations {r['warmup_s']:.0f} s; "
        note += f"{counters['stats']['unique_graphs']} graphs"
    else:
        note = f"{lazy}; {of_peak(r['flop_per_s'], args, precision)}"
    if fused and not compile:  # (what its first iterations compiled: a warm start's cost beside the rate)
        graphs = counters["stats"]["unique_graphs"]
        note += f"; the kernels compiled {graphs} graph(s); the {warmup} untimed iterations {r['warmup_s']:.1f} s"
    return {
        "setting": f"StyleGAN2 {cfg.data.resolution} px ch {cfg.model.ch} (ADA's paper256), batch {t.batch}, "
        + precision
        + (", train.compile" if compile else "")
        + ways(fir, compile),
        "plan": r["plan"].replace("x", " × "),
        "img_per_s": r["img_per_s"],
        "s_per_iter": t.batch / r["img_per_s"],
        "peak": r["peak"],
        "note": note,
    }


def ways(fir: str, compile: bool) -> str:
    """What a StyleGAN2 row's `fir` changes, for its setting."""
    if fir != "fused+act":
        return f", the layers' FIR filter {fir} (bench/fir.py; the skip image's upsampling as it is)" if fir else ""
    compiled = "; in the compiled graphs the filter's sums traced, the kernels in the lazy steps" if compile else ""
    return f", the model's fused kernels (bigbatch/models/fused.py: its layers' filter, bias and activation{compiled})"


def biggan_plan(args: argparse.Namespace, precision: str) -> dict:
    """What micro_batch "auto" picks for BigGAN at its batch in the budget, and one iteration at that plan."""
    cfg = config(args, "plan")
    task, rep = gan_task(cfg, CLASSES, precision=precision, micro_batch="auto")
    plan = plan_micro_batch(rep, task.probe, verbose=False)
    probes = ", ".join(f"{p.micro_batch} {'fits' if p.fits else 'no'}" for p in rep.probes)
    chosen = next(p for p in rep.probes if p.micro_batch == plan.micro_batch)
    seconds, peak = timed(lambda: (task.d_step(0), task.g_step(0)), rep.device, [m for m, _ in rep.models], 1, 1)
    return {
        "setting": f"{describe_gan(cfg)}, {precision}, micro_batch auto in {cfg.train.memory_budget}",
        "plan": f"{plan.micro_batch} × {plan.accumulation}",
        "img_per_s": cfg.train.batch / seconds,
        "s_per_iter": seconds,
        "peak": peak,
        "note": f"probe peak {format_bytes(chosen.peak_bytes)}; probed: {probes}",
    }


def saehd(args: argparse.Namespace, channels_last: bool = False, autotune: bool = False) -> dict:
    """SAEHD 512 df-ud's training iteration (throughput.measure_swap): its plan in the budget, s/iteration, peak.
    `channels_last`: its convolutions in NHWC (train.channels_last; "auto" leaves SAEHD in NCHW, 2x faster so on a
    CPU), the layout a GPU's tensor cores take. `autotune`: cuDNN's autotuning (cudnn.benchmark), which training
    leaves off under a memory budget (its trials' workspaces), as SAEHD's 6 GiB is."""
    cfg = config(args, "swap").override({"train.channels_last": channels_last})
    t, o = cfg.train, cfg.model.options
    with synthetic_faces(cfg) as faces, cudnn_autotuning(autotune):
        r = measure_swap(faces, t.precision, t.checkpointing, t.micro_batch, SIZES[args.sizes]["steps"], 2)
    dims = "/".join(str(o[k]) for k in ("ae_dims", "e_dims", "d_dims", "d_mask_dims"))
    mode = t.precision + (", checkpointing" if t.checkpointing else "") + (", channels-last" if channels_last else "")
    mode += ", cuDNN autotuned" if autotune else ""
    return {
        "setting": f"{cfg.name}: {o['archi']} {cfg.data.resolution} px, dims {dims}, batch {t.batch}, {mode}, "
        f"micro_batch {t.micro_batch} in {t.memory_budget}",
        "plan": r["plan"].replace("x", " × "),
        "img_per_s": r["img_per_s"],
        "s_per_iter": r["s_per_iter"],
        "peak": r["peak"],
        "note": f"{r['cpu_s_per_iter']:.2f} CPU s/iteration; synthetic faces, warp and data reading included",
    }


def resnet50(args: argparse.Namespace, compile: bool | str = False, again: bool = False) -> dict:
    """ResNet-50's classify step (ClassifyTask.step: SGD, cross-entropy) in bf16 and channels-last on one batch
    held in memory, with and without cuDNN's autotuning; `compile`: under train.compile (autotuned), True or a
    mode ("reduce-overhead": CUDA graphs); `again`: compiled in a new process after the compile parts, from the
    compile cache they left (a resumed run's first step)."""
    cfg = config(args, "resnet").override({"train.compile": compile})
    batch = cfg.train.batch
    task, rep, feed = classify_task(cfg, CLASSES)
    steps = 4 * SIZES[args.sizes]["steps"]
    models = [m for m, _ in rep.models]
    if compile:
        watch = compile_cache.CompileWatch()
        t = time.perf_counter()
        task.step(feed)
        sync(rep.device)
        first = watch.compiled(time.perf_counter() - t)
        alone = wait_for_turn(Path(args.turns), args.part) if args.turns else True
        seconds, peak = timed(lambda: task.step(feed), rep.device, models, steps, COMPILE_WARMUP)
        note = f"{first_iteration(first)}; channels_last"
        note += "" if alone else "; **timed while another part still compiled** (little time was left)"
    else:
        torch.backends.cudnn.benchmark = False  # first PyTorch's default, then cuDNN's autotuning (train's)
        heuristic_s, _ = timed(lambda: task.step(feed), rep.device, models, steps, 3)
        torch.backends.cudnn.benchmark = True
        seconds, peak = timed(lambda: task.step(feed), rep.device, models, steps, 3)
        flops = count_flops(lambda: task.step(feed))
        note = f"{of_peak(flops / seconds, args, 'bf16')}; channels_last (train.channels_last = true); one batch "
        note += f"in memory, no data reading; cuDNN autotuning (without it {batch / heuristic_s:.0f} img/s)"
    return {
        "setting": f"ResNet-50 ch {cfg.model.ch}, {cfg.data.resolution} px, {CLASSES} classes, batch {batch}, bf16"
        + (", train.compile" if compile else "")
        + (f" = {compile} (CUDA graphs)" if isinstance(compile, str) else "")
        + (", again in a new process (a resumed run)" if again else ""),
        "plan": f"{rep.plan.micro_batch} × {rep.plan.accumulation}",
        "img_per_s": batch / seconds,
        "s_per_iter": seconds,
        "peak": peak,
        "note": note,
    }


# BigGAN-128 (ch 96)'s resampling layers as bench/resample.py times them (in = out channels): D's conv inputs and
# G's conv inputs (half the output side), per resolution; and the dry run's.
RESAMPLE_LAYERS = {
    "full": (
        64,
        [("D", 96, 128), ("D", 192, 64), ("D", 384, 32), ("D", 768, 16)]
        + [("G", 96, 64), ("G", 192, 32), ("G", 384, 16), ("G", 768, 8)],
    ),
    "toy": (2, [("D", 4, 32), ("D", 4, 16), ("G", 4, 16), ("G", 4, 8)]),
}


def resample(args: argparse.Namespace) -> dict:
    """A 3x3 conv and the 2x resampling next to it, two ops against one (bigbatch/models/resample.py), on the
    device in bf16 at BigGAN-128's widths: whether the CPU's FUSE_FROM holds on this GPU."""
    from resample import cell as layer_seconds

    from bigbatch.models.resample import FUSE_FROM

    batch, layers = RESAMPLE_LAYERS[args.sizes]
    ratios = []
    for kind, channels, side in layers:
        two, one = layer_seconds(kind, batch, channels, side, "bf16", 5, torch.device(args.device))
        ratios.append(f"{kind} {side if kind == 'D' else 2 * side} px ×{channels}: {two / one:.2f}")
    return {
        "setting": f"a 3x3 conv and its 2x resampling, forward+backward, bf16, batch {batch}: two ops / one op",
        "note": "; ".join(ratios) + f" (BigGAN's blocks use one op from {FUSE_FROM} px on)",
    }


def fir_ways(args: argparse.Namespace) -> dict:
    """StyleGAN2's FIR filter in its resampling layers, the model's way and four others, and the layers with the
    model's fused kernels (bench/fir.py), on the device in bf16 at paper256's widths: which way its layers should
    take on this GPU."""
    from fir import PAPER256, TIMED
    from fir import cell as fir_cell

    # (the dry run's: paper256's smallest layers at 32 channels, bf16 being emulated on a CPU without it)
    batch, largest, widest = (32, 256, 512) if args.sizes == "full" else (2, 16, 32)
    cells = []
    for kind in ("D", "G"):
        for side, channels in ((s, min(c, widest)) for s, c in PAPER256 if s <= largest):
            ways = fir_cell(kind, batch, channels, side, "bf16", 5, torch.device(args.device))
            cells.append(f"{kind} {side} px ×{channels}: " + " / ".join(f"{1e3 * s:.2f}" for s, _ in ways.values()))
    return {
        "setting": f"StyleGAN2's FIR filter in D's down and G's up layers, forward+backward, bf16, batch {batch}: "
        + "ms "
        + " / ".join(TIMED),
        "note": "; ".join(cells),
    }


def attention(args: argparse.Namespace) -> dict:
    """BigGAN-128's attention math as the formula and as the model runs it (bench/attention.py), fp32 and bf16."""
    from attention import rows

    cells = []
    for r in rows(torch.device(args.device), "full" if args.sizes == "full" else "toy", ["fp32", "bf16"]):
        cells.append(
            f"{r['layer']} {r['precision']}: {1e3 * r['explicit_s']:.1f} / {1e3 * r['attend_s']:.1f} ms, "
            f"{format_bytes(r['explicit_peak'])} / {format_bytes(r['attend_peak'])}, error "
            f"{r['explicit_error']:.0e} / {r['attend_error']:.0e} ({r['kernels']})"
        )
    return {"setting": "softmax(q kᵀ) v forward+backward: the formula / attend", "note": "; ".join(cells)}


def cuda_tests(args: argparse.Namespace, marks: str) -> dict:
    """tests/test_cuda.py's tests that `marks` selects, under pytest (they skip without a GPU); its pass/fail
    count. Each test's line is printed as it ends, and the counts so far kept in the part's progress file, so
    a part stopped at its limit still says how far it got (its row; the lines above the table)."""
    cmd = [sys.executable, "-m", "pytest", "tests/test_cuda.py", "-v", "-m", marks, "-p", "no:cacheprovider"]
    proc = subprocess.Popen(
        [*cmd, "--durations=5"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines, ended, t0 = [], {}, time.perf_counter()
    progress = Path(args.result).with_suffix(".progress")
    for line in proc.stdout:
        print(line, end="", file=sys.stderr, flush=True)
        lines.append(line)
        test = re.search(r"::(\S+) (PASSED|FAILED|ERROR|SKIPPED)", line)
        if test:  # (written whole: a temporary file renamed)
            outcome = test.group(2).lower()
            ended[outcome] = ended.get(outcome, 0) + 1
            so_far = ", ".join(f"{n} {outcome}" for outcome, n in ended.items())
            said = {"what": f"{so_far}, the last {test.group(1)}", "at": time.perf_counter() - t0}
            progress.with_suffix(".tmp").write_text(json.dumps(said))
            progress.with_suffix(".tmp").replace(progress)
    status = proc.wait()
    counts = [line.strip("=\n ") for line in lines if re.search(r"\d+ (passed|failed|skipped|deselected)", line)]
    summary = counts[-1] if counts else f"no summary (pytest exit status {status})"
    if status:
        raise RuntimeError(f"pytest exit status {status}: {summary}")
    return {"setting": f"tests/test_cuda.py -m '{marks}'", "note": summary}


# Name -> (what it runs, time limit in seconds on the GPU), in the table's order.
PARTS: dict[str, tuple[Callable[[argparse.Namespace], dict], int]] = {
    "biggan-fp32": (functools.partial(biggan, precision="fp32", compile=False), 90),
    "biggan-bf16": (functools.partial(biggan, precision="bf16", compile=False), 90),
    "biggan-fp32-compile": (functools.partial(biggan, precision="fp32", compile=True), 240),
    "biggan-bf16-compile": (functools.partial(biggan, precision="bf16", compile=True), 240),
    "biggan-bf16-compile-again": (functools.partial(biggan, precision="bf16", compile=True, again=True), 120),
    "biggan-bf16-compile-cudagraphs": (functools.partial(biggan, precision="bf16", compile="reduce-overhead"), 240),
    "biggan-plan-fp32": (functools.partial(biggan_plan, precision="fp32"), 90),
    "biggan-plan-bf16": (functools.partial(biggan_plan, precision="bf16"), 90),
    "saehd512": (saehd, 150),
    "saehd512-channels-last": (functools.partial(saehd, channels_last=True), 150),
    "saehd512-autotuned": (functools.partial(saehd, autotune=True), 150),
    "resnet50": (resnet50, 90),
    "resnet50-compile": (functools.partial(resnet50, compile=True), 240),
    "resnet50-compile-cudagraphs": (functools.partial(resnet50, compile="reduce-overhead"), 240),
    "resnet50-compile-again": (functools.partial(resnet50, compile=True, again=True), 120),
    "resnet50-fed": (resnet50_fed, 120),
    "jpeg-decode": (jpeg_decode, 90),
    "jpeg-decode-nvimgcodec": (functools.partial(jpeg_decode, decode="nvimgcodec"), 90),
    "resample": (resample, 60),
    "attention": (attention, 60),
    "biggan-bf16-profile": (biggan_profile, 90),
    "biggan-bf16-compile-profile": (functools.partial(biggan_profile, compile=True), 120),
    "saehd512-profile": (saehd_profile, 120),
    "resnet50-profile": (resnet50_profile, 90),
    "stylegan2-fp32": (functools.partial(stylegan2, precision="fp32"), 120),
    "stylegan2-bf16": (functools.partial(stylegan2, precision="bf16"), 120),
    "stylegan2-bf16-compile": (functools.partial(stylegan2, precision="bf16", compile=True), 240),
    "stylegan2-bf16-separable": (functools.partial(stylegan2, precision="bf16", fir="separable"), 120),
    "stylegan2-bf16-fused": (functools.partial(stylegan2, precision="bf16", fir="fused+act"), 150),
    "stylegan2-bf16-compile-fused": (
        functools.partial(stylegan2, precision="bf16", compile=True, fir="fused+act"),
        240,
    ),
    "stylegan2-bf16-profile": (stylegan2_profile, 120),
    "fir": (fir_ways, 90),
    "cuda-tests": (functools.partial(cuda_tests, marks="not compiles"), 90),
    "cuda-tests-compile": (functools.partial(cuda_tests, marks="compiles"), 240),
    "waits": (waits, 120),
}
# Issue 43's targets first: eager (bf16, as trained by default); the CUDA tests that compile nothing (the new
# CUDA paths; at most 90 s, so that the compile parts keep their time: each test's line is printed as it ends,
# so a cut still says how far they got); then compiled and as CUDA graphs (minutes of compiling: the compile parts at
# once, run_in_turns) and what loads from the compile cache; the CUDA tests that compile; the profiles (where the
# time goes: SAEHD's, whose target is furthest, first); then the extras, measured before, where --budget cuts.
RUN_ORDER = ["biggan-bf16", "resnet50", "jpeg-decode", "jpeg-decode-nvimgcodec", "resnet50-fed", "saehd512"]
RUN_ORDER += ["saehd512-channels-last", "saehd512-autotuned"]
RUN_ORDER += ["stylegan2-bf16", "cuda-tests", "biggan-bf16-compile", "biggan-bf16-compile-cudagraphs"]
RUN_ORDER += ["stylegan2-bf16-compile", "resnet50-compile", "resnet50-compile-cudagraphs", "biggan-bf16-compile-again"]
RUN_ORDER += ["resnet50-compile-again"]
RUN_ORDER += ["waits", "cuda-tests-compile"]
RUN_ORDER += ["saehd512-profile", "biggan-bf16-profile", "resnet50-profile", "biggan-bf16-compile-profile"]
RUN_ORDER += ["biggan-fp32", "biggan-plan-fp32", "biggan-plan-bf16", "biggan-fp32-compile", "stylegan2-fp32"]
RUN_ORDER += ["resample", "attention", "stylegan2-bf16-profile", "fir", "stylegan2-bf16-separable"]
RUN_ORDER += ["stylegan2-bf16-fused", "stylegan2-bf16-compile-fused"]
BUDGETED = {
    "biggan-plan-fp32",
    "biggan-plan-bf16",
    "saehd512",
    "saehd512-channels-last",
    "saehd512-autotuned",
    "saehd512-profile",
}  # parts whose config has train.memory_budget
# Compiled at once, timed one at a time (biggan-fp32-compile, an extra, alone at the end).
IN_TURNS = {"biggan-bf16-compile", "stylegan2-bf16-compile", "resnet50-compile"}
IN_TURNS |= {"biggan-bf16-compile-cudagraphs", "resnet50-compile-cudagraphs"}
TURN_S = 60  # what each part after the first adds to its group's limit: its turn at timing


def run_part(cmd: list[str], limit: float, popen: Callable[..., Any] = subprocess.Popen) -> dict:
    """Run a part's process (`cmd` writes its row as JSON to the path it is given last) for at most
    `limit` seconds; its row, or an error saying how it ended. `popen`: what starts it (run_limited's)."""
    with tempfile.TemporaryDirectory(prefix="bigbatch-gpu-") as tmp:
        out = Path(tmp) / "row.json"
        status, seconds = run_limited([*cmd, str(out)], limit, popen=popen)
        return result_row(out, out.with_suffix(".progress"), status, seconds, limit)


def run_in_turns(
    cmds: dict[str, list[str]], limit: float, popen: Callable[..., Any] = subprocess.Popen, stopped: dict | None = None
) -> dict[str, dict]:
    """Run parts' processes at once (`_procs.run_in_turns`: they build and compile side by side, then are
    timed one at a time), each given `--turns DIR` and its result path; their rows. Compiling is host work
    (Dynamo and Inductor in Python, Triton's builds), so parts that each compile for minutes take about
    as long together as the longest. Stopped (SIGTERM, Ctrl-C), the rows of those that had ended go to
    `stopped`."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bigbatch-gpu-") as tmp:
        turns = Path(tmp)
        outs = {name: turns / f"{name}.json" for name in cmds}
        try:
            ended = _run_in_turns(
                {n: [*cmd, "--turns", tmp, str(outs[n])] for n, cmd in cmds.items()}, limit, turns, TURN_S, popen
            )
        except (SystemExit, KeyboardInterrupt):
            at = time.perf_counter() - start  # (when it was stopped: those that ended, ended before)
            for n in [n for n, out in outs.items() if out.exists() and stopped is not None]:
                with suppress(ValueError):  # (written in half: the part was under way)
                    stopped[n] = result_row(outs[n], outs[n], 0, at, limit)  # type: ignore[index]
            raise
        return {n: result_row(outs[n], outs[n].with_suffix(".progress"), *ended[n], limit) for n in cmds}


def child(args: argparse.Namespace) -> None:
    """One part, in this process: its row as JSON to args.result (an error as a row too)."""
    if args.compile_backend != "inductor":  # bigbatch.engine.wrap calls torch.compile(model): its backend, here
        torch.compile = functools.partial(torch.compile, backend=args.compile_backend)
    torch.manual_seed(0)
    if "-compile" in args.part:  # graphs compiled so far, for a row cut at its time limit
        from throughput_all import CompileLog

        CompileLog(Path(args.result).with_suffix(".progress"))
    # As `bigbatch train` runs: cuDNN autotuning on, but under a memory budget (the plan parts, SAEHD's 6 GiB).
    autotune = args.part not in BUDGETED
    BF16_AS_FP32[0] = args.sizes == "toy" and not native_bf16(torch.device(args.device))
    try:
        with run_kernels(False, autotune=autotune):
            row = PARTS[args.part][0](args)
        row["device_name"] = device_name(torch.device(args.device))
        if BF16_AS_FP32[0] and "bf16" in row.get("setting", ""):
            row["setting"] += " (trained as fp32: a dry run on a CPU without native bf16)"
    except Exception as e:  # noqa: BLE001 -- any failure is the part's result, reported in its row
        traceback.print_exc()
        row = {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"}
    Path(args.result).write_text(json.dumps(row))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--dry-run", action="store_true", help="every part at toy sizes (for CPU: a test of this script)")
    p.add_argument(
        "--out",
        type=writable_file,
        help="the file to append to (default bench/RESULTS.md; a dry run's: none unless --out names one)",
    )
    p.add_argument(
        "--parts",
        default=",".join(RUN_ORDER),
        help=f"comma-separated, run in the order given (the compile parts with the first), of {', '.join(PARTS)}",
    )
    p.add_argument("--budget", type=positive_float, default=450, help="seconds for all parts (each also has its limit)")
    p.add_argument(
        "--limit", type=float, help="seconds each part may take, instead of its own limit (e.g. compiling alone)"
    )
    p.add_argument(
        "--compile-backend", default="", help='torch.compile backend (default "inductor"; a CPU dry run: "eager")'
    )
    p.add_argument("--digest", action="store_true", help="print the digest of bigbatch's and bench/'s sources")
    p.add_argument("--part", help=argparse.SUPPRESS)  # internal: run one part in this process
    p.add_argument("--turns", help=argparse.SUPPRESS)  # internal: the part's turns with others (run_in_turns)
    p.add_argument("result", nargs="?", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.out = results_file(args.out, args.dry_run)
    if args.digest:
        return print(source_digest())
    args.sizes = "toy" if args.dry_run else "full"
    args.compile_backend = args.compile_backend or ("eager" if args.dry_run and args.device == "cpu" else "inductor")
    if args.part:
        return child(args)
    if args.result:
        p.error(f"unrecognized argument {args.result}")
    wanted = list(dict.fromkeys(args.parts.split(",")))  # (a part named twice runs once)
    unknown = [w for w in wanted if w not in PARTS]
    if unknown:
        p.error(f"--parts: unknown {', '.join(unknown)}; valid: {', '.join(PARTS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("no CUDA GPU here; for every part at toy sizes on CPU: --device cpu --dry-run --out /tmp/proof.md")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # as Ctrl-C: the running part is killed too
    # A compile cache of this run's own, which the parts inherit: the compile parts compile from nothing, the
    # -again part from what they left (a user's warm ~/.cache/bigbatch/compile would make every part warm).
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache = tempfile.mkdtemp(prefix="bigbatch-gpu-compile-")
    # On a CPU the parts' processes are forks of one that has imported what they import (this script: torch,
    # bigbatch), which was most of a dry-run part's time; on a GPU each is a new Python with a CUDA context of
    # its own.
    # A stop (SIGTERM, Ctrl-C: a `timeout` around this, a scheduler) ends the part under way, and the table of those
    # that ended is still appended (found on a GPU: a `timeout` a few seconds short of --budget lost every row).
    rows: dict[str, dict] = {}
    start, stopped = time.perf_counter(), 0
    try:
        with ForkServer([Path(__file__).stem, "torch._dynamo"]) if args.device == "cpu" else nullcontext() as forks:
            run_parts(args, wanted, forks.popen if forks else subprocess.Popen, rows)
    except (SystemExit, KeyboardInterrupt) as e:
        stopped = 130 if isinstance(e, KeyboardInterrupt) else e.code if isinstance(e.code, int) else 1
        at = time.perf_counter() - start
        cut = {"error": f"not run, or cut: stopped by a signal at {at:.0f} s"}
        rows.update({n: dict(cut) for n in wanted if n not in rows})
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # (the table first: found by review, a stop here lost it)
    rows = {n: rows[n] for n in PARTS if n in rows}
    text = section(rows, args, time.perf_counter() - start, SIZES[args.sizes]["steps"], COMPILE_WARMUP)
    print(text, end="")
    keep_section(args.out, text)
    shutil.rmtree(cache, ignore_errors=True)
    sys.exit(stopped or (1 if any("error" in r for r in rows.values()) else 0))


def run_parts(args: argparse.Namespace, wanted: list[str], popen: Callable[..., Any], rows: dict[str, dict]) -> None:
    """The `wanted` parts in their order (the compile parts at once, where the first of them is), within --budget:
    their rows into `rows`, each as it ends."""
    start = time.perf_counter()
    flags = ["--device", args.device, "--compile-backend", args.compile_backend] + ["--dry-run"] * args.dry_run
    for name in wanted:
        if name in rows:  # run with its group
            continue
        group = [n for n in wanted if n in IN_TURNS] if name in IN_TURNS else [name]
        left = args.budget - (time.perf_counter() - start)
        if left < (30 if args.device == "cuda" else 10):  # (a GPU part's start alone takes ~10 s)
            rows.update({n: {"error": f"not run: the {args.budget:.0f} s budget was spent"} for n in group})
            continue
        own = args.limit or max(PARTS[n][1] for n in group)
        limit = min(left, own + TURN_S * (len(group) - 1))
        print(f"[bench/gpu.py] {' and '.join(group)} (at most {limit:.0f} s)", file=sys.stderr, flush=True)
        cmds = {n: [sys.executable, __file__, "--part", n, *flags] for n in group}
        if len(group) > 1:
            rows.update(run_in_turns(cmds, limit, popen, rows))
        else:
            rows[name] = run_part(cmds[name], limit, popen)
        for n in group:  # (its figures in the log too: a SIGKILL, which no table outlives, leaves them there)
            print(f"[bench/gpu.py] {n} ended: {json.dumps(rows[n])}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
