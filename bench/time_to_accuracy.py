"""Time to accuracy (DAWNBench's metric): train the fast classifier preset and its baseline on this
machine, in turns, until val_top1 reaches a target, and print wall time, images seen and the ratio;
with --ablate, the fast preset again with each technique of the recipe switched off in turn.

    python bench/time_to_accuracy.py                               # fashion_resnet_fast vs fashion_resnet, 90%
    python bench/time_to_accuracy.py --target 91 --ablate         # + one run per technique switched off
    python bench/time_to_accuracy.py --ablate --only warmup,zero_gamma train.seed=1

Each run is `bigbatch train` in a process of its own (the same command a user runs), watched through
its metrics.jsonl: when an evaluation row reaches the target the run is stopped (SIGTERM: it saves a
checkpoint and exits). Time is that row's `seconds`: wall time since the run started, evaluations
(every eval.every_kimg, the same for every run) included, start-up excluded. A run that ends without
reaching the target is reported as such, with its best val_top1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Each technique of the fast recipe, and the overrides that switch it off (everything else as is).
ABLATIONS = {
    "progressive_resizing": ["data.schedule=0:28:512,120:28:256"],
    "dynamic_batch": ["train.batch=256", "data.schedule=0:16:256,120:22:256,240:28:256"],
    "lr_scaling": ["train.lr_batch=0"],
    "warmup": ["train.warmup_kimg=0"],
    "no_norm_decay": ["train.norm_decay=true"],
    "zero_gamma": ["model.options.zero_init_residual=false"],
    "label_smoothing": ["train.label_smoothing=0"],
}


def race(preset: str, overrides: list[str], target: float, root: Path, name: str) -> dict:
    """Train `preset` with `overrides` until val_top1 >= target (or the run ends)."""
    run = root / name
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "bigbatch", "train", "--preset", preset, *overrides, "--run-dir", str(run)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics, seen, reached, best = run / "metrics.jsonl", 0, None, float("nan")
    while True:
        done = proc.poll() is not None
        rows = metrics.read_text().splitlines() if metrics.exists() else []
        for line in rows[seen:]:
            row = json.loads(line)
            if "val_top1" in row:
                best = row["val_top1"] if best != best else max(best, row["val_top1"])
                if reached is None and row["val_top1"] >= target:
                    reached = row
        seen = len(rows)
        if reached is not None and not done:
            proc.send_signal(signal.SIGTERM)
            proc.wait()
            break
        if done:
            break
        time.sleep(1.0)
    if proc.returncode not in (0, None) and reached is None:
        raise SystemExit(f"{name}: bigbatch train failed:\n{proc.stderr.read()[-2000:] if proc.stderr else ''}")
    return {
        "name": name,
        "reached": reached is not None,
        "seconds": reached["seconds"] if reached else float("nan"),
        "kimg": reached["kimg"] if reached else float("nan"),
        "best": best,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fast", default="fashion_resnet_fast")
    parser.add_argument("--baseline", default="fashion_resnet")
    parser.add_argument("--target", type=float, default=90.0, help="val_top1 to reach, percent")
    parser.add_argument("--ablate", action="store_true", help="also the fast preset with each technique off")
    parser.add_argument("--only", default="", help="comma-separated ablations (default: all with --ablate)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the baseline (ablations only)")
    parser.add_argument("--runs-dir", default="", help="keep the runs here (default: a temporary folder)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides for every run, e.g. train.seed=1")
    args = parser.parse_args()
    only = [a for a in args.only.split(",") if a]
    unknown = set(only) - set(ABLATIONS)
    if unknown:
        parser.error(f"unknown ablations {sorted(unknown)}; valid: {', '.join(ABLATIONS)}")
    ablations = only or (list(ABLATIONS) if args.ablate else [])

    with tempfile.TemporaryDirectory(prefix="bigbatch-tta-") as tmp:
        root = Path(args.runs_dir or tmp)
        results = [race(args.fast, args.overrides, args.target, root, args.fast)]
        if not args.no_baseline:
            results.append(race(args.baseline, args.overrides, args.target, root, args.baseline))
        for name in ablations:
            results.append(race(args.fast, args.overrides + ABLATIONS[name], args.target, root, f"without {name}"))

    fast = results[0]
    print(f"\nTime to val_top1 >= {args.target:g}% ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs)\n")
    print("| run | reached | wall s | kimg | best val_top1 | time / fast |")
    print("|---|---|---|---|---|---|")
    for r in results:
        ratio = r["seconds"] / fast["seconds"] if r["reached"] and fast["reached"] else float("nan")
        print(
            f"| {r['name']} | {'yes' if r['reached'] else 'no'} | {r['seconds']:.0f} | {r['kimg']:g} | "
            f"{r['best']:.2f} | {ratio:.2f} |"
        )


if __name__ == "__main__":
    main()
