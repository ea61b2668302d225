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
    assert "_Measured " in out.stdout and ", 1 thread, torch's CPU kernels for" in out.stdout, out.stdout  # (its CPU:
    # found from outside, "2 CPUs" alone, which a GPU machine's runs would have said too)
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

    # Runs made apart are tabled together (--results, no run), fast first whatever the order, with
    # fastai's side-by-side runs (bench/fastai_fashion.py --json) as rows of their own.
    fast_json, base_json = tmp_path / "fast.json", tmp_path / "base.json"
    fast_json.write_text(json.dumps([r for r in results if r["name"] == "fashion_resnet_fast"]))
    base_json.write_text(json.dumps([r for r in results if r["name"] == "fashion_resnet"]))
    fastai = []
    for seed, scores in ((0, [12.0, 25.0, 31.0]), (1, [15.0, 18.0, 21.0])):
        rows = [
            {"epoch": 0.5 * (i + 1), "kimg": 0.5 * (i + 1), "wall_s": 10.0 * (i + 1), "cpu_s": 9.0 * (i + 1), "top1": s}
            for i, s in enumerate(scores)
        ]
        fastai.append(tmp_path / f"fastai-s{seed}.json")
        fastai[-1].write_text(json.dumps({"fastai": "2.8.12", "args": {"seed": seed, "threads": 1}, "rows": rows}))
    argv = [sys.executable, str(BENCH), "--target", "20", "--results", str(base_json), str(fast_json), "--fastai"]
    again = subprocess.run(argv + [str(f) for f in fastai], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr[-3000:]
    lines = [line for line in again.stdout.splitlines() if line.startswith("| ")]
    assert lines[1] == row and lines[2] == base  # the same rows as the run's own table
    cells = [c.strip() for c in lines[3].strip("|").split("|")]
    # fastai: seed 0 reaches 20% at its second evaluation (1 kimg, 18 CPU s), seed 1 at its third (1.5, 27).
    assert cells[:7] == ["fastai 2.8.12 fit_one_cycle", "1", "2/2", "1.25", "1.5", "22", "27"]
    assert cells[-1] == f"{22.5 / median['fashion_resnet_fast']:.2f}"
    assert cells[7:9] == ["26.00 (21.00)", "21.00"]
    missing = subprocess.run(argv[:-1] + [str(tmp_path / "nope.json")], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no such file" in missing.stderr and "Traceback" not in missing.stderr
    wrong = subprocess.run(argv + [str(fast_json)], capture_output=True, text=True, timeout=60)  # not fastai's
    assert wrong.returncode == 2 and "--fastai bench/fastai_fashion.py's" in wrong.stderr
    assert "Traceback" not in wrong.stderr
    other = subprocess.run(argv[:-1] + ["--target", "30"], capture_output=True, text=True, timeout=60)
    assert other.returncode == 2 and "raced to 20%: give that --target" in other.stderr
