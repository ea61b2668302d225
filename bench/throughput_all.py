"""Every task's training throughput in one table: a GAN (BigGAN at 32 px), two classifiers (ResNet-20 at
32 px, ResNet-50 at 224 px) and face swaps (SAEHD at 128 and 512 px), each in fp32 and bf16, with
train.compile off and on: img/s, FLOPs per iteration, the achieved FLOP/s as a fraction of the peak
measured in the same cell, and memory. Sized for a CPU: one thread per cell, ~30 minutes on this 2-core
machine (SAEHD 512's compiled cells are left out of the default table: --cells runs them).

    python bench/throughput_all.py --out /tmp/throughput_all.md         # the whole table
    python bench/throughput_all.py --cells resnet20-fp32,resnet20-fp32-compile
    python bench/throughput_all.py --profile resnet50-fp32 --out /tmp/throughput_profile.md

Each cell runs bench/throughput.py's measure (GAN), measure_classify or measure_swap in a process of
its own (OMP_NUM_THREADS=1, torch.set_num_threads(1)) under a time limit, all within --budget seconds,
the cells with the shorter limits first (Inductor's C++ build of a model takes minutes on two cores). A
cell that fails or runs out of time is a row that says so, with how far compiling had got; its output
is in --logs. The peak is throughput.compute_peak (the best of large matmuls and 3x3 convolutions in the
cell's dtype), measured in the cell's own process right after its steps; "wall / CPU" shows how much
other work on the machine took the cell's core (1.00 on an idle one).

Under train.compile, Inductor's cache is a fresh folder per run (--inductor-cache to reuse one): the
compile times are a first run's. FLOPs are counted with the step run eagerly (the same arithmetic);
the counted peak memory (CPUPeak) is that of the eager step, so compiled rows give only the process's
max resident set size, which includes the compiler's own memory.

--profile CELL runs that cell's step in this process under torch.profiler after the same warm-up and
writes where its time goes: self CPU time by phase (data, augmentation, forward, backward, optimizer,
the rest) and kind of op (convolutions, matmuls, normalization, copies and casts, other ops, time
outside any op), then the top ops.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack, closing
from dataclasses import dataclass
from pathlib import Path

import torch
import torch._inductor.config
from torch._dynamo.callback import callback_handler
from torch._dynamo.utils import counters

sys.path.insert(0, str(Path(__file__).parent))
from _args import positive_float, writable_file  # noqa: E402
from _classify import classify_task  # noqa: E402
from _gan import gan_task  # noqa: E402
from _kinds import KINDS, OUTSIDE, kind_of  # noqa: E402
from _procs import result_row, run_limited  # noqa: E402
from _swap import swap_feed, swap_task, synthetic_faces  # noqa: E402
from gpu import device_name  # noqa: E402
from throughput import compute_peak, measure, measure_classify, measure_swap  # noqa: E402

import bigbatch  # noqa: E402
from bigbatch.config import Config  # noqa: E402
from bigbatch.engine.memory import format_bytes  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PRECISIONS = ("fp32", "bf16")
# Untimed iterations first (then one more, untimed, counts the FLOPs). The first, eager, is counted by CPUPeak
# (throughput.counted_peak); under train.compile the next compiles (forward, and backward at its first call)
# and two more let the remaining graphs (D and G steps, grad modes) compile and settle.
WARMUP = {False: 1, True: 4}


@dataclass(frozen=True)
class Workload:
    """One row pair of the table: a preset at CPU sizes and how many iterations to time."""

    task: str  # "gan", "classify" or "swap": which of throughput.py's measures times it
    preset: str
    overrides: dict[str, object]
    describe: str
    steps: int
    classes: int = 0  # of the synthetic data (GAN, classify)
    precision_overrides: dict[str, dict[str, object]] | None = None  # per precision, on top of `overrides`
    limit_s: tuple[int, int] = (240, 480)  # per cell, eager and compiled (compiling dominates those)
    compile_left_out: str = ""  # why the default table leaves out its compiled cells, if it does


WORKLOADS = {
    "biggan32": Workload(
        "gan",
        "biggan128_bs2048",
        {"data.resolution": 32, "model.ch": 32, "train.batch": 16, "train.micro_batch": 16},
        "BigGAN 32 px ch 32 (biggan128_bs2048's architecture), batch 16, 1000 classes; a D and a G step",
        steps=10,
        classes=1000,
    ),
    "resnet20": Workload(
        "classify",
        "fashion_resnet_fast",
        {"data.resolution": 32, "train.batch": 128, "train.micro_batch": 128},
        "ResNet-20 (fashion_resnet_fast) 32 px RGB, batch 128, 10 classes",
        steps=5,
        classes=10,
    ),
    "resnet50": Workload(
        "classify",
        "imagenet_resnet50",
        {"data.resolution": 224, "train.batch": 16, "train.micro_batch": 16},
        "ResNet-50 (imagenet_resnet50, a batch held in memory) 224 px, batch 16, 1000 classes",
        steps=3,
        classes=1000,
    ),
    "saehd128": Workload(
        "swap",
        "saehd128",
        {},
        "SAEHD liae-ud 128 px 256/64/64/22 (saehd128), batch 8; warp and data reading included",
        steps=3,
    ),
    # Each precision at the plan micro_batch "auto" makes in the preset's 6 GiB (bench/RESULTS.md), fixed here
    # so no probing is timed: fp32 2 x 4 (8 in one micro-batch counts 12.55 GiB), bf16 with checkpointing 8 x 1.
    "saehd512": Workload(
        "swap",
        "saehd512_df_ud",
        {},
        "SAEHD df-ud 512 px 320/64/72/22 (saehd512_df_ud), batch 8: fp32 at micro-batch 2 x 4, bf16 with "
        "activation checkpointing at 8 x 1 (the plans of micro_batch auto in 6 GiB); warp and data reading included",
        steps=1,
        precision_overrides={
            "fp32": {"train.micro_batch": 2, "train.checkpointing": False},
            "bf16": {"train.micro_batch": 8, "train.checkpointing": True},
        },
        limit_s=(600, 900),
        compile_left_out="not in the default table: compiling, then 6 iterations of 60-80 s (4 untimed, one to "
        "count FLOPs, one timed) would take 10-15 minutes a cell; `--cells saehd512-bf16-compile` runs it",
    ),
}


def cell_names() -> list[str]:
    """Every cell, in the table's order: by workload, eager then compiled, fp32 then bf16."""
    return [f"{w}-{p}{c}" for w in WORKLOADS for c in ("", "-compile") for p in PRECISIONS]


def run_order(names: list[str]) -> list[str]:
    """The cells with the shorter time limits first (eager, then compiled, then SAEHD at 512 px): a spent
    budget cuts the costliest."""
    return sorted(names, key=lambda n: parse_cell(n)[0].limit_s[parse_cell(n)[2]])


def default_cells() -> list[str]:
    return [n for n in cell_names() if not (n.endswith("-compile") and WORKLOADS[n.split("-")[0]].compile_left_out)]


def parse_cell(name: str) -> tuple[Workload, str, bool]:
    workload, precision, *rest = name.split("-")
    return WORKLOADS[workload], precision, rest == ["compile"]


def cell_config(w: Workload, precision: str, compile: bool) -> Config:
    more = (w.precision_overrides or {}).get(precision, {})
    return bigbatch.preset(w.preset).override({**w.overrides, **more, "train.compile": compile})


class CompileLog:
    """Dynamo's compile starts and ends (the lazily compiled backward graphs too), written to `path` as
    they happen: what a cell killed at its time limit was doing."""

    def __init__(self, path: Path | None):
        self.path, self.started, self.seconds, self.graphs, self.t0 = path, None, 0.0, 0, time.perf_counter()
        callback_handler.register_start_callback(self.start)
        callback_handler.register_end_callback(self.end)

    def start(self, args) -> None:
        self.started = time.perf_counter()
        self.write(f"compiling graph {self.graphs + 1} ({args.callback_trigger.name.lower()}, {args.compile_id})")

    def end(self, args) -> None:
        if self.started is not None:
            self.seconds += time.perf_counter() - self.started
        self.started, self.graphs = None, self.graphs + 1
        self.write(f"{self.graphs} graphs compiled in {self.seconds:.0f} s, running")

    def write(self, what: str) -> None:
        if self.path is not None:  # (whole: a temporary file renamed, so a cell killed mid-write leaves the last)
            at = time.perf_counter() - self.t0
            self.path.with_suffix(".tmp").write_text(json.dumps({"what": what, "at": at, "compile_s": self.seconds}))
            self.path.with_suffix(".tmp").replace(self.path)


def run_cell(name: str) -> dict:
    """One cell in this process (one thread): its row."""
    w, precision, compile = parse_cell(name)
    cfg = cell_config(w, precision, compile)
    warmup, micro, ckpt = WARMUP[compile], cfg.train.micro_batch, cfg.train.checkpointing
    if w.task == "gan":
        r = measure(cfg, precision, ckpt, micro, w.steps, w.classes, warmup=warmup, plain=False)
    elif w.task == "classify":
        r = measure_classify(cfg, precision, ckpt, micro, w.steps, w.classes, warmup=warmup)
    else:
        with synthetic_faces(cfg) as faces:
            r = measure_swap(faces, precision, ckpt, micro, w.steps, warmup)
    device = torch.device(str(r["device"]))
    peak_flops = compute_peak(device, precision)
    return {
        "img_per_s": r["img_per_s"],
        "s_per_iter": r["s_per_iter"],
        "cpu_s_per_iter": r["cpu_s_per_iter"],
        "flops": r["flops"],
        "flop_per_s": r["flop_per_s"],
        "peak_flop_per_s": peak_flops,
        "peak": None if compile and device.type == "cpu" else r["peak"],
        "plan": r["plan"].replace("x", " × "),
        "checkpointing": ckpt,
        "graphs": counters["stats"]["unique_graphs"],
        "breaks": sum(counters["graph_break"].values()),
    }


def child(name: str, result: Path, progress: Path | None) -> None:
    """One cell in this process: its row as JSON to `result` (an error as a row too)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    log = CompileLog(progress)
    try:
        row = run_cell(name)
        row["compile_s"] = log.seconds
        row["device_name"] = device_name(torch.device("cpu"))
    except Exception as e:  # noqa: BLE001 -- any failure is the cell's result, reported in its row
        traceback.print_exc()
        row = {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"}
    row["max_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result.write_text(json.dumps(row))


def spawn(name: str, limit: float, log: Path) -> dict:
    """Run cell `name` in a process of its own (its output to `log`) for at most `limit` seconds: its
    row, or an error saying how it ended (and, past the limit, how far compiling had got)."""
    with tempfile.TemporaryDirectory(prefix="bigbatch-throughput-") as tmp:
        result, progress = Path(tmp) / "row.json", Path(tmp) / "progress.json"
        cmd = [sys.executable, __file__, "--cell", name, "--progress", str(progress), str(result)]
        with open(log, "w") as out:
            status, seconds = run_limited(cmd, limit, stdout=out, stderr=subprocess.STDOUT)
        return result_row(result, progress, status, seconds, limit)


# ---- the table ---------------------------------------------------------------------------------------------


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def row_cells(name: str, r: dict) -> list[str]:
    w, precision, compile = parse_cell(name)
    flops, achieved, peak = r.get("flops"), r.get("flop_per_s"), r.get("peak_flop_per_s")
    fraction = None if achieved is None or not peak else 100 * achieved / peak
    if "left_out" in r:
        note = r["left_out"]
    elif "error" in r:
        note = f"**{r['error']}**"
    elif compile:
        note = f"graphs {r['graphs']}, breaks {r['breaks']}; compiling {r['compile_s']:.0f} s"
    else:
        note = ""
    if "retried" in r:
        note = "; ".join(filter(None, [note, r["retried"]]))
    wall_cpu = r["s_per_iter"] / r["cpu_s_per_iter"] if r.get("cpu_s_per_iter") else None
    plan = "-" if "plan" not in r else r["plan"] + (", checkpointing" if r.get("checkpointing") else "")
    return [
        name.split("-")[0],
        precision,
        "on" if compile else "off",
        plan,
        fmt(r.get("img_per_s"), ".2f" if (r.get("img_per_s") or 0) < 10 else ".1f"),
        fmt(r.get("s_per_iter"), ".3f"),
        fmt(wall_cpu, ".2f"),
        fmt(None if flops is None else flops / 1e9, ".1f"),
        fmt(None if achieved is None else achieved / 1e9, ".1f"),
        fmt(None if peak is None else peak / 1e9, ".0f"),
        fmt(fraction, ".1f") + ("%" if fraction is not None else ""),
        "-" if r.get("peak") is None else format_bytes(r["peak"]),
        "-" if r.get("max_rss") is None else format_bytes(r["max_rss"]),
        fmt(r.get("seconds"), ".0f"),
        note,
    ]


def table(rows: dict[str, dict]) -> str:
    header = [
        "workload",
        "precision",
        "compile",
        "micro × acc",
        "img/s",
        "s/iter",
        "wall / CPU",
        "GFLOP/iter",
        "achieved GFLOP/s",
        "peak GFLOP/s",
        "% of peak",
        "peak memory (counted)",
        "max RSS",
        "cell s",
        "note",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, r in rows.items():
        lines.append("| " + " | ".join(c.replace("|", "/") for c in row_cells(name, r)) + " |")
    return "\n".join(lines)


def report(rows: dict[str, dict], seconds: float, retry_above: float) -> str:
    device = next((r["device_name"] for r in rows.values() if "device_name" in r), "CPU")
    git = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "-uno"], capture_output=True, text=True)
    commit = (git.stdout.strip() or "unknown") + (" with uncommitted changes" if dirty.stdout.strip() else "")
    done = [(n, r) for n, r in rows.items() if r.get("flop_per_s") and r.get("peak_flop_per_s")]
    lowest = min(done, key=lambda nr: nr[1]["flop_per_s"] / nr[1]["peak_flop_per_s"], default=None)
    lines = [
        f"## Training throughput of every task, {datetime.date.today().isoformat()}, {device} per cell",
        "",
        f"`{shlex.join(['python', *sys.argv])}` at commit {commit}; torch {torch.__version__}; "
        f"{seconds / 60:.1f} minutes in all; {sum('img_per_s' in r for r in rows.values())} of {len(rows)} cells "
        "measured.",
        "",
        table(rows),
        "",
        "Workloads (synthetic images; the models, losses and optimizers of the presets):",
        *(f"- {name}: {w.describe}; {w.steps} timed iteration{'s' * (w.steps != 1)}." for name, w in WORKLOADS.items()),
        f"- Untimed iterations first: {WARMUP[False]} eager, {WARMUP[True]} under train.compile (Inductor, a "
        "fresh cache: a first run's compile time). Each cell in a process of its own, one thread.",
        "- img/s and s/iter: wall time of the timed iterations; wall / CPU: that over the process's CPU time (1.00 "
        "on an idle core; above it, other work on the machine took the core). A cell above "
        f"{retry_above:.2f} ran once more and the less disturbed run is shown.",
        "- GFLOP/iter: torch.utils.flop_counter (matmuls and convolutions, forward and backward; 2 per "
        "multiply-add) of one iteration run eagerly; peak: the best large matmul or 3x3 convolution in the "
        "precision's dtype, measured in the same process just after.",
        "- peak memory (counted): CPUPeak over the first iteration plus the weights (eager cells only: under "
        "compile it would count the eager step); max RSS: the cell process's, compiler included.",
    ]
    if lowest:
        name, r = lowest
        lines.append(f"- Lowest fraction of peak: {name}, {100 * r['flop_per_s'] / r['peak_flop_per_s']:.1f}%.")
    return "\n".join(lines) + "\n"


# ---- the profile -------------------------------------------------------------------------------------------

PHASES = ("data", "augmentation", "forward", "backward", "optimizer", "the rest of the step")


def labelled(label: str, fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch.profiler.record_function(label):
            return fn(*args, **kwargs)

    return wrapper


def phase_of(event) -> str:
    """The phase an event's self time belongs to: its nearest labelled ancestor (or itself)."""
    e = event
    while e is not None:
        if e.name.startswith("Optimizer."):
            return "optimizer"
        if e.name.startswith("autograd::engine::evaluate_function"):
            return "backward"
        if e.name in PHASES:
            return e.name
        e = e.cpu_parent
    return "the rest of the step"


def profiled_step(name: str, stack: ExitStack) -> tuple[Callable[[], None], str]:
    """The cell's iteration as a function, built as the cell builds it, its phases labelled for the
    profiler (data, augmentation, forward); and what it is."""
    w, precision, compile = parse_cell(name)
    cfg = cell_config(w, precision, compile)
    train = {"precision": precision, "checkpointing": cfg.train.checkpointing, "micro_batch": cfg.train.micro_batch}
    if w.task == "gan":
        task, _ = gan_task(cfg, w.classes, **train)
        for attr in ("d_loss", "g_loss"):
            setattr(task, attr, labelled("forward", getattr(task, attr)))
        for attr in ("d_batch", "g_batch"):
            setattr(task, attr, labelled("data", getattr(task, attr)))
        n = iter(range(10**9))

        def step() -> None:
            i = next(n)
            task.d_step(i * cfg.train.batch)
            task.g_step(i)

        return step, w.describe
    if w.task == "classify":
        task, _, feed = classify_task(cfg, w.classes, **train)
        task.loss = labelled("forward", task.loss)
        task.inputs = labelled("augmentation", task.inputs)
        feed.next = labelled("data", feed.next)
        return lambda: task.step(feed), w.describe
    faces = stack.enter_context(synthetic_faces(cfg))
    task, rep = swap_task(faces, **train)
    stack.callback(rep.close)
    feed = stack.enter_context(closing(swap_feed(task, rep)))
    for attr in ("loss", "code_d_loss", "gan_d_loss"):
        setattr(task, attr, labelled("forward", getattr(task, attr)))
    task.sides = labelled("augmentation", task.sides)
    task.draws = labelled("data", task.draws)
    feed.next = labelled("data", feed.next)
    read_dst = feed.companion
    feed.companion = lambda data: labelled("data", read_dst(data))
    return lambda: task.step(feed), w.describe


def profile(name: str, steps: int) -> str:
    """torch.profiler over `steps` iterations of cell `name` (after its warm-up), as markdown."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    _, precision, compile = parse_cell(name)
    # Inductor's generated C++ kernels, each a profiler event of its own (else their time is the compiled
    # graph's, outside any op).
    torch._inductor.config.cpp.enable_kernel_profile = True
    with ExitStack() as stack:
        step, describe = profiled_step(name, stack)
        for _ in range(WARMUP[compile]):
            step()
        t = time.perf_counter()
        for _ in range(steps):
            step()
        plain_s = (time.perf_counter() - t) / steps
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            t = time.perf_counter()
            for _ in range(steps):
                with torch.profiler.record_function("the rest of the step"):
                    step()
            profiled_s = (time.perf_counter() - t) / steps
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
    grid: dict[tuple[str, str], float] = {}
    for e in events:
        key = (phase_of(e), kind_of(e.name))
        grid[key] = grid.get(key, 0.0) + e.self_cpu_time_total / 1e3 / steps
    total = sum(grid.values())
    kinds = [k for k, _ in KINDS] + [OUTSIDE]
    lines = [
        f"## Profile of {name}: {describe}, {precision}" + (", train.compile" if compile else ""),
        "",
        f"`{shlex.join(['python', *sys.argv])}`; torch.profiler (CPU activities), {steps} iterations after "
        f"{WARMUP[compile]} untimed, one thread. An iteration took {1000 * plain_s:.0f} ms without the profiler, "
        f"{1000 * profiled_s:.0f} ms under it; the self CPU times below add up to {total:.0f} ms.",
        "",
        "Self CPU time per iteration, ms (and % of the total), by phase and kind of op:",
        "",
        "| phase | " + " | ".join(kinds) + " | all |",
        "|" + "---|" * (len(kinds) + 2),
    ]
    for phase in PHASES:
        row = [grid.get((phase, k), 0.0) for k in kinds]
        if sum(row) == 0:
            continue
        cells = [f"{v:.1f}" if v else "" for v in row]
        lines.append(f"| {phase} | " + " | ".join(cells) + f" | {sum(row):.1f} ({100 * sum(row) / total:.0f}%) |")
    column = [sum(grid.get((p, k), 0.0) for p in PHASES) for k in kinds]
    lines.append("| all | " + " | ".join(f"{v:.1f} ({100 * v / total:.0f}%)" for v in column) + f" | {total:.1f} |")
    lines += ["", "Top ops by self CPU time:", "", "| op | self CPU ms/iter | % | calls/iter |", "|---|---|---|---|"]
    ops = sorted(prof.key_averages(), key=lambda a: a.self_cpu_time_total, reverse=True)
    for a in ops[:25]:
        ms = a.self_cpu_time_total / 1e3 / steps
        lines.append(f"| `{a.key}` | {ms:.1f} | {100 * ms / total:.1f}% | {a.count / steps:g} |")
    return "\n".join(lines) + "\n"


def contention(r: dict) -> float:
    """Wall time over CPU time of a cell's timed iterations (1 on an idle core; inf without a result)."""
    return r["s_per_iter"] / r["cpu_s_per_iter"] if r.get("cpu_s_per_iter") else float("inf")


def run_cells(names: list[str], budget: float, logs: Path, retry_above: float) -> dict[str, dict]:
    """Each cell in turn (spawn) within `budget` seconds; a cell measured while other work took its core
    (wall / CPU above `retry_above`) runs once more, and the less disturbed run is kept."""
    start = time.perf_counter()
    rows: dict[str, dict] = {}
    for name in names:
        w, _, compile = parse_cell(name)
        runs: list[dict] = []
        while len(runs) < 2 and (not runs or retry_above < contention(runs[0]) < float("inf")):
            left = budget - (time.perf_counter() - start)
            if left < 30:
                runs.append({"error": f"not run: the {budget:.0f} s budget was spent"})
                break
            limit = min(left, w.limit_s[compile])
            print(f"[throughput_all] {name} (at most {limit:.0f} s)", file=sys.stderr, flush=True)
            runs.append(spawn(name, limit, logs / f"{name}.{len(runs) + 1}.log"))
            r = runs[-1]
            said = r.get("error") or f"{r['img_per_s']:.2f} img/s, wall / CPU {contention(r):.2f}, {r['seconds']:.0f} s"
            print(f"[throughput_all] {name}: {said}", file=sys.stderr, flush=True)
        measured = [r for r in runs if "img_per_s" in r]
        rows[name] = min(measured, key=contention) if measured else runs[0]
        if len(measured) == 2:
            rows[name]["retried"] = f"ran twice, wall / CPU {contention(runs[0]):.2f} then {contention(runs[1]):.2f}"
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--cells",
        default="",
        help=f"comma-separated, of {', '.join(cell_names())} (default: all but saehd512's compiled ones)",
    )
    p.add_argument(
        "--budget", type=positive_float, default=2400, help="seconds for all cells (each also has its limit)"
    )
    p.add_argument("--out", type=writable_file, help="also write the markdown here")
    p.add_argument("--logs", type=Path, default=Path(tempfile.gettempdir()) / "throughput_all_logs")
    p.add_argument(
        "--retry-above", type=float, default=1.1, help="run a cell again once if its wall / CPU is above this"
    )
    p.add_argument("--inductor-cache", default="", help="Inductor's cache folder (default: a fresh one)")
    p.add_argument("--profile", metavar="CELL", help="profile this cell's step in this process instead")
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--cell", help=argparse.SUPPRESS)  # internal: run one cell in this process
    p.add_argument("--progress", type=Path, help=argparse.SUPPRESS)
    p.add_argument("result", nargs="?", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.cell:
        return child(args.cell, args.result, args.progress)
    wanted = args.cells.split(",") if args.cells else default_cells()
    unknown = [c for c in wanted + ([args.profile] if args.profile else []) if c not in cell_names()]
    if unknown:
        p.error(f"unknown cell {', '.join(unknown)}; valid: {', '.join(cell_names())}")
    # One thread per process, set before torch's thread pools start in the processes this one spawns.
    os.environ.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    with ExitStack() as stack:
        cache = args.inductor_cache or stack.enter_context(tempfile.TemporaryDirectory(prefix="inductor-"))
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        if args.profile:
            text = profile(args.profile, args.profile_steps)
        else:
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # as Ctrl-C: the running cell is killed too
            args.logs.mkdir(parents=True, exist_ok=True)
            start = time.perf_counter()
            rows = run_cells(run_order(wanted), args.budget, args.logs, args.retry_above)
            if not args.cells:
                rows.update({n: {"left_out": parse_cell(n)[0].compile_left_out} for n in cell_names() if n not in rows})
            rows = {n: rows[n] for n in cell_names() if n in rows}
            text = report(rows, time.perf_counter() - start, args.retry_above)
    print(text, end="", flush=True)  # (first: a file that cannot be written loses nothing measured)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
