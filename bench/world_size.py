"""World-size invariance, measured: `python bench/world_size.py [--procs 3,4] [--before DIR]`.

Trains the digits GAN (16 px, ch 8) for a few steps as one process of k micro-batches and as k processes
(torchrun, gloo) of one micro-batch each, and as 2 processes of k/2 accumulated micro-batches, one thread per
process; prints a table of how many tensors of G, D and G_ema differ from the one-process run (parameters,
BatchNorm running statistics) and by how much. `--before DIR`: also a checkout of other code (a git worktree),
the same runs, for a before/after in one sitting. Then what the BatchNorm replay costs a step."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _args import int_list  # noqa: E402
from _env import measured_on  # noqa: E402
from safetensors.torch import load_file

STATS = ("running_mean", "running_var", "num_batches_tracked")


def train(code: Path, run: Path, procs: int, batch: int, micro: int) -> Path:
    kimg = batch * 4 / 1000  # four steps
    args = ["--preset", "digits", "data.resolution=16", "model.ch=8", "model.dim_z=16", f"train.batch={batch}"]
    args += [f"train.micro_batch={micro}", f"train.kimg={kimg:g}", f"checkpoint.every_kimg={kimg:g}"]
    args += [f"sample.every_kimg={kimg:g}", "eval.every_kimg=0", "--run-dir", str(run)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(code)}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}"]
    cmd = (launch if procs > 1 else [sys.executable]) + ["-m", "bigbatch.cli", "train", *args]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=code)
    if out.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()


def splits(k: int) -> list[tuple[int, int]]:
    """(processes, micro-batch) of the runs compared with one process of k micro-batches: k processes, and 2 where
    that is another split (found from outside: --procs 2 trained 2 x 1 twice into one folder, the second refused)."""
    return [(k, 4)] + ([(2, 4)] if k % 2 == 0 and k != 2 else [])


def differ(a: Path, b: Path) -> tuple[str, str]:
    """(parameters unequal / all, max abs diff), (statistics unequal / all, max relative diff)."""
    params, stats = [0, 0, 0.0], [0, 0, 0.0]
    for net in ("G", "D", "G_ema"):
        x, y = load_file(a / f"{net}.safetensors"), load_file(b / f"{net}.safetensors")
        for k in x:
            into = stats if k.rsplit(".", 1)[-1] in STATS else params
            into[1] += 1
            if not x[k].equal(y[k]):
                into[0] += 1
                d = (x[k].double() - y[k].double()).abs().max().item()
                into[2] = max(into[2], d / max(y[k].double().abs().max().item(), 1e-30) if into is stats else d)
    return f"{params[0]}/{params[1]}, {params[2]:.1e}", f"{stats[0]}/{stats[1]}, {stats[2]:.1e}"


def replay_cost(micro_batches: int = 8, repeats: int = 20) -> str:
    """Milliseconds a step spends capturing and replaying BatchNorm statistics: ResNet-50's 53 BatchNorms."""
    import time

    import torch

    import bigbatch
    from bigbatch.engine import running_stats

    torch.set_num_threads(1)
    bns = running_stats.captured([bigbatch.models.create_classifier("resnet50", 1000)])
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        step = running_stats.StepStatistics(bns)
        for _ in range(micro_batches):
            step.micro_batch()
        step.end(torch.cat(step.close()).tolist())
        best = min(best, time.perf_counter() - began)
    return f"{len(bns)} BatchNorms, {micro_batches} micro-batches a step: {best * 1000:.1f} ms a step (CPU, 1 thread)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", type=int_list(2), default="3,4", help="comma-separated process counts k, 2 or more")
    p.add_argument("--before", help="another checkout to run the same way")
    args = p.parse_args()
    print(measured_on(getattr(args, "device", "cpu")))
    codes = {"this code": Path(__file__).resolve().parents[1]}
    if args.before:
        if not (Path(args.before) / "bigbatch" / "__init__.py").is_file():  # (found from outside: this code's figures
            p.error(f"--before {args.before} holds no bigbatch/: give the folder of another checkout")  # as before's)
        codes = {"before": Path(args.before).resolve(), **codes}
    print("| code | split (batch 4k, micro 4) | parameters unequal, max abs diff | BN statistics unequal, max rel |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for k in args.procs:
            for name, code in codes.items():
                root = Path(tmp) / f"{name.replace(' ', '_')}-{k}"
                one = train(code, root / "one", 1, 4 * k, 4)
                for procs, micro in splits(k):
                    other = train(code, root / f"p{procs}", procs, 4 * k, micro)
                    split = f"{procs} x {k // procs} against 1 x {k}"
                    print(f"| {name} | {split} | {' | '.join(differ(one, other))} |", flush=True)
    print(f"\nThe BatchNorm replay's cost, ResNet-50: {replay_cost()}")


if __name__ == "__main__":
    main()
