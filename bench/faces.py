"""The face pipeline's speed: a made clip (bench/_faces.py: a real photo moved, turned and zoomed across the
frames, H.264 with audio) extracted, then merged back with a SAEHD model of saehd128's size, as a user runs
`bigbatch extract` and `bigbatch merge --video`. One table: each stage's wall time, frames a second, and the
target (a 10-second 720p clip of one face: extract in under 2 minutes, merge in under 1 on this machine's two
cores).

    python bench/faces.py [--frames 250] [--size 1280x720] [--workers 2] [--device cpu|cuda] [--work DIR]

The merge's model is trained for one step only: its speed does not depend on its weights.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _faces  # noqa: E402


def _cli(*args: str) -> float:
    """Seconds `bigbatch ARGS` took, as a user runs it (a process of its own)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bigbatch", *args], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=250)
    parser.add_argument("--size", default="1280x720")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--resolution", type=int, default=128, help="the model's (saehd128's)")
    parser.add_argument("--work", help="folder to work in (default: a temporary one)")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-faces-"))
    work.mkdir(parents=True, exist_ok=True)
    clip = work / "clip.mp4"
    start = time.perf_counter()
    _faces.write_video(clip, args.frames, width, height)
    made = time.perf_counter() - start

    import torch

    import bigbatch

    res = str(args.resolution)
    rows = []
    extract = _cli("extract", str(clip), str(work / "aligned"), "--size", "256", "--workers", str(args.workers),
                   "--device", args.device, "--no-debug")  # fmt: skip
    faces = len(list((work / "aligned").glob("*.jpg")))
    rows.append(("extract (detect, landmarks x2, align, write)", extract, faces, 120.0))
    _cli("prepare", str(work / "aligned"), str(work / "faces.h5"), "--resolution", res, "--masks", "dfl")
    cfg = bigbatch.preset("saehd128").override(
        {
            "data.path": str(work / "faces.h5"),
            "data.dst_path": str(work / "faces.h5"),
            "data.resolution": args.resolution,
            "train.batch": 2,
            "train.micro_batch": 2,
            "train.kimg": 0.002,
            "checkpoint.every_kimg": 0.002,
            "sample.every_kimg": 0.0,
            "eval.every_kimg": 0.0,
        }
    )
    run = bigbatch.train(cfg, run_dir=work / "run", quiet=True)
    merge = _cli("merge", str(run), str(clip), str(work / "aligned"), str(work / "merged"), "--device", args.device)
    rows.append(("merge (overlay, rct; PNG frames and masks)", merge, args.frames, None))
    video = _cli("video", "make", str(work / "merged"), str(work / "merged.mp4"), "--audio-from", str(clip))
    rows.append(("video make (libx264, audio)", video, args.frames, None))
    rows.append(("merge + video", merge + video, args.frames, 60.0))
    seamless = _cli("merge", str(run), str(clip), str(work / "aligned"), str(work / "seamless"), "--mode", "seamless",
                    "--device", args.device)  # fmt: skip
    rows.append(("merge, seamless", seamless, args.frames, None))

    threads = torch.get_num_threads()
    seconds = args.frames / 25
    print(f"\nFace pipeline on a {args.frames}-frame {width}x{height} clip ({seconds:.0f} s at 25 fps; made in "
          f"{made:.0f} s), {faces} faces; {os.cpu_count()} CPUs, extract --workers {args.workers}, torch threads "
          f"{threads}, device {args.device}, model {args.resolution} px liae-ud (saehd128)\n")  # fmt: skip
    print("| stage | seconds | frames/s | target |")
    print("|---|---|---|---|")
    for name, seconds, n, target in rows:
        goal = f"< {target:.0f} s: {'met' if seconds < target else 'missed'}" if target else ""
        print(f"| {name} | {seconds:.1f} | {n / seconds:.2f} | {goal} |")


if __name__ == "__main__":
    main()
