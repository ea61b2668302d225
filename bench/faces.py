"""The face pipeline's speed: a made clip (bench/_faces.py: a real photo moved, turned and zoomed across the
frames, H.264 with audio) extracted, then merged back with a SAEHD model of saehd128's size, as a user runs
`bigbatch extract` and `bigbatch merge --video` (x264's medium preset, FFmpeg's and DFL's default, and
veryfast). One table: each stage's wall time, frames a second, and the target (a 10-second 720p clip of one
face: extract in under 2 minutes, merge to a video in under 1 on this machine's two cores).

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
from _args import at_least, device_arg, positive_int  # noqa: E402


def _cli(*args: str) -> float:
    """Seconds `bigbatch ARGS` took, as a user runs it (a process of its own)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bigbatch", *args], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def model_table(resolution: int, rounds: int = 4, batch: int = 8) -> None:
    """saehd128's swap alone, ms a face at batch 8: plain, and packed for CPU inference as merge runs it
    (SAEHD.pack_for_cpu), on one thread and on every core; interleaved rounds, the second best of each."""
    import torch

    from bigbatch.models.saehd import SAEHD

    torch.manual_seed(0)
    plain = SAEHD(resolution, "liae-ud").eval()
    packed = SAEHD(resolution, "liae-ud").eval()
    packed.load_state_dict(plain.state_dict())
    packed.pack_for_cpu()
    x = torch.rand(batch, resolution, resolution, 3).permute(0, 3, 1, 2)  # NHWC-strided, as merge's faces
    every = torch.get_num_threads()
    print("\n| SAEHD swap, batch 8 | threads | ms a face | plain / packed |")
    print("|---|---|---|---|")
    for threads in sorted({1, every}):
        torch.set_num_threads(threads)
        times: dict[str, list[float]] = {"plain": [], "packed": []}
        with torch.inference_mode():
            for model in (plain, packed):  # (the first call reorders the packed weights)
                model.swap(x)
            for _ in range(rounds):
                for name, model in (("plain", plain), ("packed", packed)):
                    start = time.perf_counter()
                    model.swap(x)
                    times[name].append((time.perf_counter() - start) / batch * 1e3)
        ms = {k: sorted(v)[1] for k, v in times.items()}
        print(f"| plain | {threads} | {ms['plain']:.0f} | |")
        print(f"| packed for CPU inference | {threads} | {ms['packed']:.0f} | {ms['plain'] / ms['packed']:.2f}x |")
    torch.set_num_threads(every)


def frame_size(text: str) -> tuple[int, int]:
    """--size: 'WIDTHxHEIGHT' -> (width, height), each a whole number 1 or more."""
    width, _, height = text.partition("x")
    try:
        return positive_int(width), positive_int(height)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"give WIDTHxHEIGHT, e.g. 1280x720 (got {text!r})") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=positive_int, default=250)
    parser.add_argument("--size", type=frame_size, default="1280x720", help="WIDTHxHEIGHT of the clip")
    parser.add_argument("--workers", type=at_least(0), default=os.cpu_count() or 1)
    parser.add_argument("--device", default="cpu", type=device_arg)
    parser.add_argument("--resolution", type=positive_int, default=128, help="the model's (saehd128's)")
    parser.add_argument("--work", help="folder to work in (default: a temporary one)")
    args = parser.parse_args()
    width, height = args.size
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
    merge_args = ("merge", str(run), str(clip), str(work / "aligned"))
    merge = _cli(*merge_args, str(work / "merged"), "--device", args.device)
    rows.append(("merge (overlay, rct; PNG frames and masks)", merge, args.frames, None))
    video = _cli("video", "make", str(work / "merged"), str(work / "merged.mp4"), "--audio-from", str(clip))
    rows.append(("video make from the PNGs (libx264 medium, audio)", video, args.frames, None))
    for preset in ("medium", "veryfast"):  # (each a fresh merge: a rerun would skip the frames written)
        out = work / f"merged-{preset}"
        seconds = _cli(*merge_args, str(out), "--video", f"{out}.mp4", "--preset", preset, "--device", args.device)
        rows.append((f"merge --video, x264 {preset} (PNGs too)", seconds, args.frames, 60.0))
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
    if args.device == "cpu":
        model_table(args.resolution)


if __name__ == "__main__":
    main()
