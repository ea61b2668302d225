"""What each launcher adds to start a run: the wall time of the same tiny run (digits at 16 px, 64
images, one process, one thread) started plainly with `bigbatch train`, and by torchrun, `bigbatch
launch dask --local 1`, `bigbatch launch ray --local 1`, and from Python with
bigbatch.launch.local.run and bigbatch.launch.dask.run on a running cluster. One table: median of
`--repeat` runs each, and its difference to plain `bigbatch train` (the launcher's own cost: starting
its cluster or agent, placing the rank, sending its output back).

    python bench/launch_overhead.py             # 3 runs each
    python bench/launch_overhead.py --repeat 5
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))
sys.path.insert(0, str(Path(__file__).parent))
from _args import positive_int  # noqa: E402

import bigbatch  # noqa: E402
from bigbatch.config import parse_override  # noqa: E402

TINY = [
    "data.resolution=16",
    "model.ch=8",
    "model.dim_z=16",
    "train.kimg=0.064",
    "train.batch=32",
    "train.micro_batch=32",
    "train.log_every_kimg=0.032",
    "checkpoint.every_kimg=0.064",
    "sample.every_kimg=0.064",
    "sample.n=16",
]
CLI = [sys.executable, "-m", "bigbatch"]


def timed(cmd: list[str]) -> float:
    began = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])} ... failed: {out.stderr[-2000:]}")
    return time.perf_counter() - began


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=positive_int, default=3)
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    tmp = Path(tempfile.mkdtemp(prefix="bigbatch-launch-"))
    atexit.register(shutil.rmtree, tmp, True)  # (found from outside: six runs a round left in /tmp)
    n = iter(range(10**6))

    def run_dir() -> str:
        return str(tmp / f"run{next(n)}")

    cfg = bigbatch.preset("digits").override(dict(map(parse_override, TINY)))
    ways = {
        "bigbatch train": lambda: timed([*CLI, "train", *TINY, "--run-dir", run_dir()]),
        "torchrun --nproc-per-node 1": lambda: timed(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", "-m", "bigbatch"]
            + ["train", *TINY, "--run-dir", run_dir()]
        ),
        "bigbatch launch dask --local 1": lambda: timed(
            [*CLI, "launch", "dask", "--local", "1", "--", "train", *TINY, "--run-dir", run_dir()]
        ),
        "bigbatch launch ray --local 1": lambda: timed(
            [*CLI, "launch", "ray", "--local", "1", "--", "train", *TINY, "--run-dir", run_dir()]
        ),
        "launch.local.run (Python)": lambda: handle_time(lambda: bigbatch.launch.local.run(cfg, run_dir())),
    }
    try:
        import distributed

        cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None)
        client = distributed.Client(cluster)
        ways["launch.dask.run, cluster up (Python)"] = lambda: handle_time(
            lambda: bigbatch.launch.dask.run(client, cfg, run_dir())
        )
    except ImportError:
        client = None
    times = {name: [] for name in ways}
    for _ in range(args.repeat):  # interleaved, so that the machine's noise spreads over every way
        for name, way in ways.items():
            times[name].append(way())
    if client is not None:
        client.close()
        cluster.close()
    base = statistics.median(times["bigbatch train"])
    print(f"Tiny digits run (64 images), one process, OMP_NUM_THREADS=1, median of {args.repeat}\n")
    print("| started by | wall s | added s |")
    print("|---|---|---|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:.1f} | {med - base:+.1f} |")


def handle_time(start) -> float:
    began = time.perf_counter()
    result = start().result()
    assert result.status == 0
    return time.perf_counter() - began


if __name__ == "__main__":
    main()
