"""bench/time_to_accuracy.py over seeds and thread counts: each run raced to the target (stopped there, or
run to its end with --to-end), side by side on cores of their own, and its table per preset."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parent.parent / "bench" / "time_to_accuracy.py"
# Both presets shrunk to ResNet-8 on digits at 16 px: seconds a run.
TINY = [
    "data.path=builtin:digits", "data.val_path=", "data.val_fraction=0.2", "data.resolution=16",
    "data.schedule=0:16:64", "model.ch=8", "model.options.depth=8", "train.kimg=4.096", "train.batch=64",
    "train.micro_batch=64", "train.lr_batch=64", "train.lr_steps=[1.5]", "train.warmup_kimg=0",
    "eval.every_kimg=1.024", "eval.batch_size=200",
]  # fmt: skip


def test_races_over_seeds_stop_at_the_target_and_the_table_gives_median_and_worst(tmp_path):
    argv = [sys.executable, str(BENCH), "--seeds", "0-1", "--threads", "1", "--jobs", "2", "--target", "20"]
    argv += ["--to-end", "--runs-dir", str(tmp_path / "runs"), "--json", str(tmp_path / "r.json"), *TINY]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "r.json").read_text())
    assert sorted((r["name"], r["seed"]) for r in results) == [
        ("fashion_resnet", 0), ("fashion_resnet", 1), ("fashion_resnet_fast", 0), ("fashion_resnet_fast", 1)
    ]  # fmt: skip
    for r in results:
        assert r["reached"] and r["kimg"] % 1.024 < 1e-9 and r["cpu_seconds"] > 0
        first = next(i for i, s in enumerate(r["evaluations"]) if s >= 20)
        assert r["kimg"] == 1.024 * (first + 1) and r["best"] == max(r["evaluations"])
        # The fast preset ran to its end (--to-end); the baseline was stopped at the target.
        evaluations = 4 if r["name"] == "fashion_resnet_fast" else first + 1
        assert len(r["evaluations"]) == evaluations and r["final"] == r["evaluations"][-1]
    seeds = {r["seed"]: r for r in results if r["name"] == "fashion_resnet_fast"}
    assert seeds[0]["evaluations"] != seeds[1]["evaluations"]  # two seeds, two runs
    row = next(line for line in out.stdout.splitlines() if line.startswith("| fashion_resnet_fast |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    kimgs = sorted(r["kimg"] for r in seeds.values())
    assert cells[1:5] == ["1", "2/2", f"{sum(kimgs) / 2:g}", f"{kimgs[-1]:g}"]
    # The baseline's CPU seconds against the fast preset's, both medians over the seeds.
    base = next(line for line in out.stdout.splitlines() if line.startswith("| fashion_resnet |"))
    median = {
        n: sum(r["cpu_seconds"] for r in results if r["name"] == n) / 2
        for n in ("fashion_resnet", "fashion_resnet_fast")
    }
    assert base.strip("|").split("|")[-1].strip() == f"{median['fashion_resnet'] / median['fashion_resnet_fast']:.2f}"
