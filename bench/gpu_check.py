"""Every user-facing command through the CLI on one CUDA GPU, on data this script makes (no network):
`bigbatch prepare`, `train` for each family and task (the digits GAN in bf16 and fp16, BigGAN at 128 px,
StyleGAN2 with ADA and with DiffAugment, a classifier on a JPEG store decoding on the GPU and on the CPU,
SAEHD 512 df-ud), a SIGTERM to a GPU run mid-way and `--resume`, bit for bit against the run left alone,
then `eval`, `sample`, `predict`, `export` (the files loaded and run on the GPU), `lr-find`, `show-batch`
and `swap` on those runs, and tests/test_cuda.py; one dated table appended to bench/RESULTS.md.

    make gpu-check                                                   # = python bench/gpu_check.py; ~5 minutes
    python bench/gpu_check.py --device cpu --dry-run --out /tmp/x.md  # the same steps at toy sizes on CPU
    python bench/gpu_check.py --only train-digits-bf16,eval-gan --keep /tmp/w   # some steps (and those they need)
    python bench/gpu_check.py --skip cuda-tests,train-biggan128     # not these (nor the steps that need them)

Each step is one process, `python -m bigbatch ...` (or a script) under bench/_peak.py, which records its
peak memory, and under a time limit (bench/_procs.py's run_limited), up to --jobs (3) at once once the
steps it needs have passed (their start-up, ~10 s of Python, torch and CUDA each, overlaps: about 4.5
minutes in all on an H200), all within --budget seconds: a step
that fails or hangs is reported in its row, the steps that need it are reported not run, and the others
run. A training step's row also checks that every loss in its metrics.jsonl is finite. The exit status is
1 if any step failed or was not run. --dry-run takes every step through the same code at toy sizes; on
CPU, data.decode = "gpu" decodes with OpenCV standing in for nvJPEG (bench/_peak.py), and the runs train
on the CPU. The runs and data go to a temporary folder (--keep DIR keeps them).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _args import writable_file  # noqa: E402
from _check_run import CheckFailed, Step, final_checkpoint, metrics, run_steps, same_checkpoints, section  # noqa: E402
from _gpu_report import device_name, keep_section, results_file, source_digest  # noqa: E402
from _procs import ForkServer  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

# What each step runs at: the GPU's sizes (a few kimg each, tens of seconds), and the dry run's toy sizes
# (the same steps, only smaller). Keys of a step's own table are config overrides.
SIZES = {
    "full": {
        "photos": 256,  # bench/storage.py's ImageNet-sized photos of seven camera photographs, seven classes
        "jpeg_side": 160,  # the JPEG store's short side (whole images, --crop none)
        "raw_side": 128,  # the raw store's squares: BigGAN's and StyleGAN2 paper256's side here
        "small_side": 32,  # the second raw store's: StyleGAN2 cifar's
        "faces": (16, 512),  # synthetic faces with masks: how many, side (the saehd512_df_ud preset's)
        "workers": 8,
        "digits": {"train.kimg": 6.4, "train.log_every_kimg": 0.64, "eval.classifier.steps": 300},
        "resume": {"train.kimg": 19.2, "train.log_every_kimg": 0.64},
        "resume_signal_rows": 3,  # SIGTERM once this many rows are logged (of 30)
        "biggan": {"train.batch": 64, "train.micro_batch": 32, "train.kimg": 1.28, "train.log_every_kimg": 0.32},
        "stylegan2_cifar": {"train.batch": 64, "train.micro_batch": 32, "train.kimg": 1.28},
        "stylegan2_256": {"data.resolution": 128, "train.batch": 32, "train.micro_batch": 32, "train.kimg": 0.32},
        "classify": {
            "data.resolution": 128,
            "data.workers": 4,
            "train.batch": 64,
            "train.micro_batch": 64,
            "train.kimg": 1.28,
            "train.log_every_kimg": 0.32,
            "eval.every_kimg": 0.64,
        },
        "saehd": {"train.kimg": 0.16, "train.log_every_kimg": 0.04},
        "eval_n": 2048,
        "lr_find_steps": 30,
    },
    "toy": {
        "photos": 24,
        "jpeg_side": 48,
        "raw_side": 32,
        "small_side": 16,
        "faces": (8, 64),
        "workers": 2,
        "digits": {
            "data.resolution": 16,
            "model.ch": 8,
            "model.dim_z": 16,
            "train.batch": 32,
            "train.micro_batch": 16,
            "train.kimg": 0.128,
            "train.log_every_kimg": 0.064,
            "eval.classifier.steps": 5,
            "eval.classifier.width": 8,
        },
        "resume": {"train.kimg": 0.64, "train.log_every_kimg": 0.032},
        "resume_signal_rows": 3,
        "biggan": {
            "data.resolution": 32,
            "model.ch": 4,
            "model.dim_z": 16,
            "train.batch": 8,
            "train.micro_batch": 4,
            "train.kimg": 0.016,
            "train.log_every_kimg": 0.008,
        },
        "stylegan2_cifar": {
            "data.resolution": 16,
            "model.ch": 2,
            "model.dim_z": 16,
            "model.options.ch_max": 16,
            "model.options.w_dim": 16,
            "model.options.mbstd_group": 4,
            "train.batch": 8,
            "train.micro_batch": 4,
            "train.kimg": 0.016,
        },
        "stylegan2_256": {
            "data.resolution": 32,
            "model.ch": 2,
            "model.dim_z": 16,
            "model.options.ch_max": 16,
            "model.options.w_dim": 16,
            "model.options.map_layers": 2,
            "model.options.mbstd_group": 4,
            "train.batch": 8,
            "train.micro_batch": 4,
            "train.kimg": 0.016,
        },
        "classify": {
            "data.resolution": 32,
            "data.workers": 1,
            "model.ch": 4,
            "train.batch": 8,
            "train.micro_batch": 8,
            "train.kimg": 0.024,
            "train.log_every_kimg": 0.008,
            "eval.every_kimg": 0.016,
        },
        "saehd": {
            "model.options.ae_dims": 32,
            "model.options.e_dims": 8,
            "model.options.d_dims": 8,
            "model.options.d_mask_dims": 4,
            "train.memory_budget": "14MiB",
            "train.kimg": 0.016,
            "train.log_every_kimg": 0.008,
        },
        "eval_n": 64,
        "lr_find_steps": 6,
    },
}

# What the steps' processes import, done once before they fork on a CPU (ForkServer): bigbatch, and what torch
# imports as it is used (Dynamo, torch.export, the ONNX exporter: seconds a process). Not OpenCV or ONNX Runtime,
# which start threads of their own as they are imported.
PRELOAD = ["torch", "torch._dynamo", "torch.export", "torch._functorch.aot_autograd", "torch._inductor.decomposition"]
PRELOAD += ["torch.onnx", "onnxscript", "networkx", "sympy", "torch.utils.tensorboard", "matplotlib", "bigbatch.cli"]
PRELOAD += ["bigbatch.batching", "bigbatch.loop", "bigbatch.tasks", "bigbatch.metrics.evaluate", "bigbatch.export"]
PRELOAD += ["bigbatch.sampling"]

# Every training step: only the final checkpoint (and sample sheets), no scoring while it trains (eval runs after).
QUIET = {"checkpoint.every_kimg": 1e6, "sample.every_kimg": 1e6, "eval.every_kimg": 0}


def make_data(work: Path, sizes: dict) -> str:
    """The photos (bench/storage.py's make_photos: ImageNet-sized crops of seven photographs, seven classes),
    and SAEHD's src and dst faces (bench/_swap.py's synthetic faces with masks) and aligned dst faces as PNGs."""
    import numpy as np
    import torch
    from _swap import write_faces
    from PIL import Image
    from storage import make_photos

    from bigbatch.data import H5Data

    make_photos(work / "photos", sizes["photos"])
    n, side = sizes["faces"]
    (work / "data").mkdir(exist_ok=True)
    write_faces(work / "data" / "src.h5", side, n, seed=0)
    dst = write_faces(work / "data" / "dst.h5", side, n, seed=1)
    (work / "aligned").mkdir(exist_ok=True)
    faces = H5Data(dst, in_ram=True)
    for i in range(min(n, 8)):
        image = faces.get(torch.tensor([i]))[0][0]
        Image.fromarray(np.ascontiguousarray(image.numpy()[..., :3])).save(work / "aligned" / f"{i:03d}.png")
    return f"{sizes['photos']} photos, {n} src and {n} dst faces of {side} px"


def overrides(*tables: dict) -> list[str]:
    return [f"{k}={v}" for table in tables for k, v in table.items()]


def interrupted(output: str, run: Path, total_kimg: float) -> str:
    """The signalled run saved a checkpoint mid-way and exited 0 (run_limited saw the status)."""
    if "Stopped by signal" not in output:
        raise CheckFailed("it ended without being stopped by the SIGTERM (trained too fast to catch mid-way?)")
    kimg = float(final_checkpoint(run).name)
    if not 0 < kimg < total_kimg:
        raise CheckFailed(f"its checkpoint is at {kimg:g} kimg, not mid-way through {total_kimg:g}")
    return f"SIGTERM after {len(metrics(run))} log rows; saved at {kimg:g} of {total_kimg:g} kimg, exit status 0"


class SignalAfterRows:
    """A step's watch: SIGTERM to the training process once its metrics.jsonl holds `rows` rows."""

    def __init__(self, run: Path, rows: int):
        self.run, self.rows, self.sent = run, rows, False

    def __call__(self, proc) -> None:
        if not self.sent and len(metrics(self.run)) >= self.rows:
            os.kill(proc.pid, signal.SIGTERM)
            self.sent = True


def grep(pattern: str, what: str) -> Callable[[str], str]:
    """A check: the output's first match of `pattern` (its group 1, else all of it) is the note."""

    def check(output: str) -> str:
        m = re.search(pattern, output, re.M)
        if not m:
            raise CheckFailed(f"its output does not say {what}")
        return m.group(1) if m.groups() else m.group(0)

    return check


def steps(args: argparse.Namespace, work: Path) -> list[Step]:
    """The steps in order; `needs` names the steps whose outputs each reads."""
    sizes, device = SIZES[args.sizes], args.device
    runs, data, out = work / "runs", work / "data", work / "out"
    on = {"train.device": device}
    bigbatch = ["-m", "bigbatch"]
    cpu = device == "cpu"

    def train(name: str, preset: str, *tables: dict, limit: float = 90, note: str = "", **kw) -> Step:
        argv = [*bigbatch, "train", "--preset", preset, "--run-dir", str(runs / name), *overrides(on, QUIET, *tables)]
        return Step(f"train-{name}", argv, limit, run=runs / name, note=note, **kw)

    photos_raw, photos_jpeg = data / "photos-raw.h5", data / "photos-jpeg.h5"
    photos_small = data / "photos-small.h5"
    w = str(sizes["workers"])
    digits = sizes["digits"]
    resume = {**sizes["digits"], **sizes["resume"], "train.deterministic": "true"}
    classify = {
        "data.path": photos_jpeg,
        "data.schedule": "[]",
        "data.val_path": '""',
        "data.val_fraction": 0.25,
        **sizes["classify"],
    }
    saehd = {"data.path": data / "src.h5", "data.dst_path": data / "dst.h5", "data.resolution": sizes["faces"][1]}
    gpu_decode = "data.decode gpu" + (", OpenCV standing in for nvJPEG (CPU dry run)" if cpu else " (nvJPEG)")
    total = float(resume["train.kimg"])
    exports = {
        "classify.pt": "classify-gpu-decode",
        "classify.onnx": "classify-gpu-decode",
        "biggan.pt": "biggan128",
        "stylegan2.pt2": "stylegan2-diffaugment",
        "saehd.pt": "saehd512",
    }
    ada = {"data.path": photos_small, "train.precision": "bf16", "augment.p": 0.2, "augment.speed_kimg": 1}
    sigterm = SignalAfterRows(runs / "resume-parts", sizes["resume_signal_rows"])
    return [
        Step("make-data", [], 60, call=lambda: make_data(work, sizes), shown="python: make_photos, write_faces"),
        Step(
            "cuda-tests",
            ["-m", "pytest", "tests/test_cuda.py", "-q", "-p", "no:cacheprovider"],
            180,
            cwd=REPO,
            check=grep(r"^=* ?(\d+ (?:passed|failed|skipped).*?) ?=*$", "a summary"),
            shown="python -m pytest tests/test_cuda.py -q",
        ),
        Step(
            "prepare-jpeg",
            [*bigbatch, "prepare", str(work / "photos"), str(photos_jpeg), "--codec", "jpeg", "--crop", "none"]
            + ["--resolution", str(sizes["jpeg_side"]), "--workers", w],
            60,
            needs=("make-data",),
        ),
        *(
            Step(
                name,
                [*bigbatch, "prepare", str(work / "photos"), str(path), "--resolution", str(sizes[side])]
                + ["--workers", w],
                60,
                needs=("make-data",),
            )
            for name, path, side in (
                ("prepare-raw", photos_raw, "raw_side"),
                ("prepare-small", photos_small, "small_side"),
            )
        ),
        train("digits-bf16", "digits", digits, {"train.precision": "bf16"}),
        train("digits-fp16", "digits", digits, {"train.precision": "fp16"}),
        train(
            "biggan128",
            "biggan128_bs2048",
            {"data.path": photos_raw, "train.precision": "bf16"},
            sizes["biggan"],
            limit=240,  # train.compile "auto" compiles BigGAN on a GPU: minutes from a cold compile cache
            # (on CPU "auto" does not compile: nothing to say)
            check=None if cpu else grep(r"^First step (compiled: .*)$", "how its first step compiled"),
            needs=("prepare-raw",),
        ),
        train(
            "stylegan2-ada",
            "stylegan2_cifar",
            ada,
            sizes["stylegan2_cifar"],
            note="augment.pipeline ada: the preset's bgc from p 0.2, moved towards target 0.6 at speed_kimg 1",
            needs=("prepare-small",),
        ),
        train(
            "stylegan2-diffaugment",
            "stylegan2_256",
            {"data.path": photos_raw, "augment.pipeline": "diffaugment", "augment.policy": "color,translation,cutout"},
            {"augment.target": 0},
            sizes["stylegan2_256"],
            note="augment.pipeline diffaugment, fp32 (the preset's)",
            needs=("prepare-raw",),
        ),
        train(
            "classify-gpu-decode",
            "imagenet_resnet50_fast",
            classify,
            {"data.decode": "gpu"},
            note=gpu_decode + ", fp16 (the preset's)",
            needs=("prepare-jpeg",),
        ),
        train(
            "classify-cpu-decode",
            "imagenet_resnet50_fast",
            classify,
            {"data.decode": "cpu"},
            note="data.decode cpu, fp16 (the preset's)",
            needs=("prepare-jpeg",),
        ),
        train("saehd512", "saehd512_df_ud", saehd, sizes["saehd"], limit=150, needs=("make-data",)),
        # Resume: the run left alone, the same run stopped by SIGTERM mid-way, then resumed; deterministic kernels.
        train("resume-whole", "digits", resume, note="train.deterministic"),
        train(
            "resume-parts",
            "digits",
            resume,
            watch=sigterm,
            check=lambda output: interrupted(output, runs / "resume-parts", total),
        ),
        Step(
            "train-resume-continue",
            [*bigbatch, "train", "--run-dir", str(runs / "resume-parts"), "--resume"],
            90,
            needs=("train-resume-whole", "train-resume-parts"),
            run=runs / "resume-parts",
            check=lambda output: same_checkpoints(runs / "resume-whole", runs / "resume-parts"),
        ),
        Step(
            "eval-gan",
            [*bigbatch, "eval", str(runs / "digits-bf16"), "--n", str(sizes["eval_n"]), "--metrics", "fid,kid"]
            + ["--extractor", "classifier"],
            90,
            needs=("train-digits-bf16",),
            check=grep(r'^\{.*"fcd".*\}$', "its scores"),
        ),
        Step(
            "eval-classify",
            [*bigbatch, "eval", str(runs / "classify-gpu-decode"), str(photos_jpeg)],
            60,
            needs=("train-classify-gpu-decode",),
            check=grep(r"(top-1 .*)", "top-1"),
        ),
        Step(
            "eval-swap",
            [*bigbatch, "eval", str(runs / "saehd512"), str(data / "src.h5"), "--dst", str(data / "dst.h5")],
            60,
            needs=("train-saehd512",),
            check=grep(r"(.*SSIM.*)", "SSIM"),
        ),
        Step(
            "sample-biggan",
            [*bigbatch, "sample", str(runs / "biggan128"), "--interp", "--overwrite"]
            + ["--out", str(out / "biggan-interp.png")],  # (its own, from a check before)
            60,
            needs=("train-biggan128",),
        ),
        Step(
            "sample-stylegan2",
            [*bigbatch, "sample", str(runs / "stylegan2-diffaugment"), "--n", "16", "--psi", "0.7"]
            + ["--overwrite", "--out", str(out / "stylegan2.png")],  # (its own, from a check before)
            60,
            needs=("train-stylegan2-diffaugment",),
        ),
        Step(
            "predict",
            [*bigbatch, "predict", str(runs / "classify-gpu-decode"), str(work / "photos" / "china"), "--topk", "2"]
            + ["--json"],
            60,
            needs=("train-classify-gpu-decode",),
            check=lambda output: f"{output.count(chr(34) + 'file' + chr(34))} images predicted",
        ),
        *(
            Step(
                f"export-{name.replace('.', '-')}",
                [*bigbatch, "export", str(runs / run), str(out / name), "--overwrite"],  # (a --keep folder again)
                90,
                needs=(f"train-{run}",),
                check=grep(r"^(Wrote .*?):", "what it wrote"),
            )
            for name, run in exports.items()
        ),
        Step(
            "exports-on-device",
            [str(REPO / "bench" / "_exported.py"), "--device", device, *(str(out / name) for name in exports)],
            90,
            after=tuple(f"export-{name.replace('.', '-')}" for name in exports),
            check=lambda output: "; ".join(re.findall(r"^exported: (.*)$", output, re.M)),
        ),
        Step(
            "lr-find",
            [*bigbatch, "lr-find", "--preset", "imagenet_resnet50_fast", *overrides(on, classify)]
            + ["data.decode=gpu", "--steps", str(sizes["lr_find_steps"]), "--out", str(out / "lr_find.png")],
            60,
            needs=("prepare-jpeg",),
            check=grep(r"^(suggested .*?);", "its suggestion"),
        ),
        Step(
            "show-batch",
            [*bigbatch, "show-batch", "--preset", "stylegan2_cifar", *overrides(on, ada, sizes["stylegan2_cifar"])]
            + ["augment.p=0.5", "--out", str(out / "batch.png")],
            60,
            needs=("prepare-small",),
            check=grep(r"^Wrote \S+: (.*)$", "what it wrote"),
        ),
        Step(
            "swap",
            [*bigbatch, "swap", str(runs / "saehd512"), str(work / "aligned"), str(out / "swapped")]
            + ["--device", device],
            60,
            needs=("train-saehd512",),
            check=grep(r"^(Swapped \d+ faces)", "how many faces it swapped"),
        ),
    ]


NOTES = [
    "Each step ran as one process: `python bench/_peak.py PEAK.json -m bigbatch ...` runs `python -m bigbatch ...` "
    "in its own process and records its peak memory; s counts the process's whole life (Python, imports, CUDA's "
    "start-up included), with up to --jobs steps running at once (3 unless the command says otherwise).",
    "Peak memory: torch.cuda.max_memory_allocated over the process's life (the tensors' peak in PyTorch's caching "
    "allocator, not the CUDA context's own); marked RSS: the process's peak resident set, where it used no GPU.",
    "Losses: every value of a key with `loss` in it (not fp16's loss scales) in the run's metrics.jsonl, finite.",
    "Training steps: the named preset with the sizes shown, a few kimg; checkpoints only at the end, no scoring "
    "while training but the classifiers' held-out split. Data: bench/storage.py's photos (seven classes) prepared "
    "as raw stores and a JPEG store of whole images; bench/_swap.py's synthetic faces (noise, an elliptic mask).",
    "Resume: the run left alone, and the same config stopped by SIGTERM once a few rows were logged, then "
    "`--resume`d; their final checkpoints' safetensors compared byte for byte (train.deterministic on in both).",
    "exports-on-device: each exported file loaded as its format is (torch.jit.load, torch.export.load, "
    "onnxruntime), run on the device and compared with the same file run on the CPU (bench/_exported.py).",
]
FORKED = (
    "On a CPU each step's process was a fork of one that had imported torch and bigbatch (bench/_procs.py's "
    "ForkServer): its s counts no imports."
)


def main() -> None:
    p = argparse.ArgumentParser(description="Every user-facing command through the CLI on one CUDA GPU; a table.")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--dry-run", action="store_true", help="every step at toy sizes (on CPU: a test of this script)")
    p.add_argument(
        "--out",
        type=writable_file,
        help="the file to append to (default bench/RESULTS.md; a dry run's: none unless --out names one)",
    )
    p.add_argument("--budget", type=float, default=420, help="seconds for all steps (each also has its limit)")
    p.add_argument(
        "--jobs",
        type=int,
        default=3,
        help="steps run at once (default 3: their start-up, ~10 s of Python, torch and CUDA each, overlaps; 1: "
        "each step's seconds its own)",
    )
    p.add_argument("--only", help="comma-separated steps to run, with the steps they need")
    p.add_argument("--skip", help="comma-separated steps to leave out, with the steps that need them")
    p.add_argument(
        "--step",
        action="append",
        default=[],
        metavar="NAME=SCRIPT",
        help="a step of your own, after the others: a script and its arguments, run as they are (repeatable)",
    )
    p.add_argument("--keep", type=Path, help="make the data and runs in this folder and keep them")
    args = p.parse_args()
    args.out = results_file(args.out, args.dry_run)
    args.sizes = "toy" if args.dry_run else "full"
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            p.error("no CUDA GPU here; for every step at toy sizes on CPU: --device cpu --dry-run --out /tmp/x.md")
    # A stop (SIGTERM, Ctrl-C: a `timeout` around this, a scheduler) ends the steps under way and starts no more; the
    # table of what ran is still appended (found on a GPU: a `timeout` short of --budget lost a whole table).
    stop, stopped_by = threading.Event(), []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda number, _: (stopped_by.append(number), stop.set()))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bigbatch-gpu-check-") as tmp:
        work = args.keep.resolve() if args.keep else Path(tmp)
        (work / "out").mkdir(parents=True, exist_ok=True)
        chosen = steps(args, work)
        for extra in args.step:
            name, _, command = extra.partition("=")
            chosen.append(Step(name, shlex.split(command), 60))
        if args.only:
            chosen = pick(chosen, args.only.split(","), p)
        if args.skip:
            chosen = leave_out(chosen, args.skip.split(","), p)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        env["BIGBATCH_CACHE"] = str(work / "cache")  # the eval classifier and statistics: made here, not reused
        env["PYTHONUNBUFFERED"] = "1"
        if args.device == "cpu":
            env["BIGBATCH_CHECK_NVJPEG_STAND_IN"] = "1"
        # On a CPU the steps' processes are forks of one that has imported what they import (torch, bigbatch), the
        # most of a dry-run step's time; on a GPU each is a new Python with a CUDA context of its own.
        fork = args.device == "cpu" and any(s.argv[:2] == ["-m", "bigbatch"] for s in chosen)
        with ForkServer(PRELOAD, env) if fork else nullcontext() as forks:
            popen = forks.popen if forks else subprocess.Popen
            # (on a GPU none started with under 30 s left: a step's start alone takes ~10 s; found on one, steps
            # given 12 and 44 s took the GPU from those that could end)
            least = 30 if args.device == "cuda" else 10
            rows = run_steps(chosen, work, env, args.budget, args.jobs, popen, stop, least)
    import torch

    device = next((r["device"] for r in rows.values() if r.get("device")), None)
    device = device or device_name(torch.device(args.device))
    command = shlex.join(["python", *sys.argv])
    notes = NOTES + [FORKED] * (args.device == "cpu")
    text = section(rows, device, args.dry_run, time.perf_counter() - start, command, notes)
    print(text, end="")
    keep_section(args.out, text, f" (sources {source_digest()})")
    sys.exit(128 + stopped_by[0] if stopped_by else 0 if all(r["passed"] for r in rows.values()) else 1)


def pick(chosen: list[Step], names: list[str], p: argparse.ArgumentParser) -> list[Step]:
    """The steps named, and those they need or wait for (and those in turn), in their order."""
    by_name = {s.name: s for s in chosen}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        p.error(f"--only: unknown {', '.join(unknown)}; valid: {', '.join(by_name)}")
    wanted, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo.extend((*by_name[name].needs, *by_name[name].after))
    return [s for s in chosen if s.name in wanted]


def leave_out(chosen: list[Step], names: list[str], p: argparse.ArgumentParser) -> list[Step]:
    """The steps but those named and those that need them (and those in turn); a step that only waits for one
    left out runs without it."""
    unknown = [n for n in names if n not in {s.name for s in chosen}]
    if unknown:
        p.error(f"--skip: unknown {', '.join(unknown)}; valid: {', '.join(s.name for s in chosen)}")
    out = set(names)
    for s in chosen:  # (in order: a step needs only steps before it)
        if out.intersection(s.needs):
            out.add(s.name)
    # The files the exports left out would have written, not looked for (found by review: exports-on-device failed).
    unmade = {s.argv[s.argv.index("export") + 2] for s in chosen if s.name in out and s.name.startswith("export-")}
    kept = [s for s in chosen if s.name not in out]
    return [replace(s, argv=[a for a in s.argv if a not in unmade], after=tuple(set(s.after) - out)) for s in kept]


if __name__ == "__main__":
    main()
