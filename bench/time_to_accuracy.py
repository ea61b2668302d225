"""Time to accuracy (DAWNBench's metric): train the fast classifier preset and its baseline on this
machine until val_top1 reaches a target, over seeds and thread counts, and print, per preset and thread
count, the median and worst images seen and CPU seconds to the target, and the accuracy reached; with
--ablate, the fast preset again with each technique of the recipe switched off in turn.

    python bench/time_to_accuracy.py                                 # fast vs baseline, seed 0, 90%
    python bench/time_to_accuracy.py --seeds 0-4 --threads 1,2 --jobs 2 --to-end
    python bench/time_to_accuracy.py --target 91 --ablate --no-baseline
    python bench/time_to_accuracy.py --ablate --only warmup,zero_gamma --seeds 1
    python bench/time_to_accuracy.py --results fast.json base.json --fastai fastai-s*.json   # runs made apart

Each run is `bigbatch train` on the CPU (train.device=cpu; the table's line names the device and its load),
in a process of its own (the command a user runs) with OMP_NUM_THREADS set
to the thread count and pinned to as many cores of its own, watched through its metrics.jsonl. When an
evaluation row reaches the target the run is stopped (SIGTERM: it saves a checkpoint and exits), unless
--to-end, which lets it finish so that its final accuracy is known. `--jobs N` runs up to N runs side by
side, each on cores of its own (one-thread runs on a two-core machine: two at once); images seen and
accuracy do not depend on that, CPU seconds little.

Figures per run: the kimg and wall `seconds` of the first evaluation at or above the target (training,
evaluations and checkpoints included, start-up excluded), the process's CPU seconds when that row was
read (user + system, start-up included: a few seconds, alike for every preset), and its best and final
val_top1. A run that ends without reaching the target counts as not reached: the table then shows how
many did, and its worst is "never". `--json` keeps every run's figures, and `--results` prints the table
of several such files without running anything, so that the presets and seeds can be run apart (a
session at a time) and tabled together. `--fastai` adds bench/fastai_fashion.py's runs (its --json
files, from its throwaway environment) as rows of their own, timed from the start of their fit.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _args import positive_int  # noqa: E402
from _env import measured_on  # noqa: E402

CPU = "train.device=cpu"  # the races count CPU seconds (a train.device= override names another device)

# Each technique of the fast recipe, and the overrides that switch it off (everything else as is).
ABLATIONS = {
    "progressive_resizing": ["data.schedule=0:28:256,60:28:128"],
    "dynamic_batch": ["data.schedule=0:16:128,60:28:128"],
    "adamw": [  # the preset's SGD before issue 45: Nesterov momentum 0.9, 0.2 per 256 images, decay 5e-5
        "train.optimizer=sgd",
        "train.lr=0.1",
        "train.momentum=0.9",
        "train.nesterov=true",
        "train.weight_decay=5e-5",
        "train.betas=[0.0,0.999]",
    ],
    "lr_scaling": ["train.lr_batch=0"],
    "warmup": ["train.warmup_kimg=0"],
    "no_norm_decay": ["train.norm_decay=true"],
    "zero_gamma": ["model.options.zero_init_residual=false"],
    "label_smoothing": ["train.label_smoothing=0"],
    "weight_average": ["train.model_ema_kimg=0", "train.ema_rampup=0"],
    "precise_bn": ["eval.standing_stats=0"],
}
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` and its reaped children (Linux /proc); nan elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return sum(int(f) for f in fields[11:15]) / TICKS  # utime, stime, cutime, cstime


@dataclass
class Race:
    """One `bigbatch train` run, watched until it reaches the target (or ends)."""

    name: str
    preset: str
    overrides: list[str]
    seed: int
    threads: int
    run: Path
    target: float
    to_end: bool
    cores: list[int] = field(default_factory=list)
    reached: dict | None = None
    cpu_at: float = float("nan")
    scores: list[float] = field(default_factory=list)
    _proc: subprocess.Popen | None = None
    _seen: int = 0

    def start(self, cores: list[int]) -> None:
        self.cores = cores
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(self.threads)}
        env["MKL_NUM_THREADS"] = str(self.threads)
        cmd = [sys.executable, "-m", "bigbatch", "train", "--preset", self.preset, CPU, *self.overrides]
        cmd += [f"train.seed={self.seed}", "--run-dir", str(self.run)]
        pin = (lambda: os.sched_setaffinity(0, cores)) if cores and hasattr(os, "sched_setaffinity") else None
        self.run.parent.mkdir(parents=True, exist_ok=True)
        with open(self.run.with_suffix(".log"), "w") as log:  # (a pipe left unread would fill and block it)
            self._proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=pin)

    def poll(self) -> bool:
        """Read new evaluation rows; stop the run at the target unless to_end. True once it is over."""
        proc = self._proc
        assert proc is not None
        cpu = cpu_seconds(proc.pid)  # (before poll() reaps it: an ended run's figures last until then)
        done = proc.poll() is not None
        metrics = self.run / "metrics.jsonl"
        rows = metrics.read_text().split("\n")[:-1] if metrics.exists() else []  # (whole lines only)
        for line in rows[self._seen :]:
            if self.reached is not None and not self.to_end:
                break  # rows it wrote before the stop took effect are not the race's
            row = json.loads(line)
            if "val_top1" in row:
                self.scores.append(row["val_top1"])
                if self.reached is None and row["val_top1"] >= self.target:
                    self.reached, self.cpu_at = row, cpu
        self._seen = len(rows)
        if self.reached is not None and not done and not self.to_end:
            proc.send_signal(signal.SIGTERM)
            proc.wait()
            done = True
        if done and proc.returncode not in (0, None, -signal.SIGTERM) and self.reached is None:
            log = self.run.with_suffix(".log").read_text()[-2000:]
            raise SystemExit(f"{self.name}: bigbatch train failed (exit {proc.returncode}):\n{log}")
        return done

    def result(self) -> dict:
        r = self.reached
        return {
            "name": self.name,
            "seed": self.seed,
            "threads": self.threads,
            "target": self.target,
            "reached": r is not None,
            "kimg": r["kimg"] if r else float("nan"),
            "seconds": r["seconds"] if r else float("nan"),
            "cpu_seconds": self.cpu_at,
            "best": max(self.scores, default=float("nan")),
            "final": self.scores[-1] if self.scores else float("nan"),
            "evaluations": self.scores,
        }


def run_all(races: list[Race], jobs: int) -> list[dict]:
    """Run `races`, up to `jobs` at a time, each pinned to cores of its own when the machine has enough."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pending, running, free = list(races), [], list(cores)
    # A stop (SIGTERM: a scheduler, `kill`) ends the runs under way too, as Ctrl-C does (found from outside: a run
    # went on training, its folder left behind).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        while pending or running:
            while pending and len(running) < jobs:
                race = pending[0]
                if cores and len(free) < race.threads and running:
                    break  # wait for cores
                mine = free[: race.threads] if len(free) >= race.threads else []
                free = free[len(mine) :]
                pending.pop(0).start(mine)
                running.append(race)
            for race in [r for r in running if r.poll()]:
                running.remove(race)
                free = sorted(free + race.cores)
                print(f"  {race.name}: {summary(race.result())}", flush=True)
            time.sleep(0.5)
    finally:
        for race in running:  # (stopped: each run under way ends with its checkpoint, waited for)
            if race._proc is not None and race._proc.poll() is None:
                race._proc.send_signal(signal.SIGTERM)
                race._proc.wait()
    return [r.result() for r in races]


def summary(r: dict) -> str:
    at = f"{r['kimg']:g} kimg, {r['cpu_seconds']:.0f} CPU s" if r["reached"] else "not reached"
    return f"seed {r['seed']}, {r['threads']} thread(s): {at}; best {r['best']:.2f}, final {r['final']:.2f}"


def fastai_result(path: Path, target: float) -> dict:
    """One run of bench/fastai_fashion.py (its --json file) as a row of the table: its first evaluation at
    or above `target`, the CPU seconds of its fit (start-up excluded, a few seconds less than ours)."""
    run = json.loads(path.read_text())
    rows = run["rows"]
    hit = next((r for r in rows if r["top1"] >= target), None)
    scores = [r["top1"] for r in rows]
    return {
        "name": f"fastai {run['fastai']} fit_one_cycle",
        "seed": run["args"]["seed"],
        "threads": run["args"]["threads"],
        "reached": hit is not None,
        "kimg": hit["kimg"] if hit else float("nan"),
        "seconds": hit["wall_s"] if hit else float("nan"),
        "cpu_seconds": hit["cpu_s"] if hit else float("nan"),
        "best": max(scores),
        "final": scores[-1],
        "evaluations": scores,
    }


def table(results: list[dict], target: float, fast: str) -> str:
    """Per preset and thread count: runs reaching the target, median and worst kimg and CPU seconds to it,
    median and worst best val_top1, worst final val_top1, and the median CPU seconds over those of
    `fast` at the same thread count."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in sorted(results, key=lambda r: r["name"] != fast):  # (stable: fast's groups first)
        groups.setdefault((r["name"], r["threads"]), []).append(r)
    lines = [
        f"| run | threads | seeds reaching {target:g}% | kimg median | kimg worst | CPU s median | CPU s worst | "
        "best val_top1 median (worst) | final val_top1 worst | CPU s / fast's |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    medians = {}
    for (name, threads), rs in groups.items():
        hit = [r for r in rs if r["reached"]]
        all_hit = len(hit) == len(rs)
        kimg = [r["kimg"] for r in hit]
        cpu = [r["cpu_seconds"] for r in hit]
        med_cpu = statistics.median(cpu) if hit else float("nan")
        medians[(name, threads)] = med_cpu
        worst_k = f"{max(kimg):g}" if all_hit else "never"
        worst_c = f"{max(cpu):.0f}" if all_hit else "never"
        best = [r["best"] for r in rs]
        ref = medians.get((fast, threads), float("nan"))
        # (none reached: "never" where a median was nan; found from outside)
        med_k, med_c = (f"{statistics.median(kimg):g}", f"{med_cpu:.0f}") if hit else ("never", "never")
        versus = f"{med_cpu / ref:.2f}" if hit and ref == ref else "-"
        lines.append(
            f"| {name} | {threads} | {len(hit)}/{len(rs)} | {med_k} | {worst_k} | {med_c} | {worst_c} | "
            f"{statistics.median(best):.2f} ({min(best):.2f}) | {min(r['final'] for r in rs):.2f} | {versus} |"
        )
    return "\n".join(lines)


def numbers(text: str, least: int = 0) -> list[int]:
    """'0-4' or '0,2,5' -> a list of ints, each `least` or more (an argparse type: else its one-line error)."""
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        try:
            first, last = int(a), int(b or a)
        except ValueError:
            first, last = least - 1, least - 1
        if first < least or last < first:
            raise argparse.ArgumentTypeError(
                f"{part!r}: give whole numbers {least} or more, as '{least}-{least + 4}' (first to last) or "
                f"'{least},{least + 3}'"
            )
        out += range(first, last + 1)
    if len(set(out)) < len(out):  # (the same run twice, in one run folder)
        raise argparse.ArgumentTypeError(f"{text!r} gives a number twice: give each once")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fast", default="fashion_resnet_fast")
    parser.add_argument("--baseline", default="fashion_resnet")
    parser.add_argument("--target", type=float, default=90.0, help="val_top1 to reach, percent")
    parser.add_argument("--seeds", type=numbers, default="0", help="train.seed of each run: '0-4' or '0,3' (default 0)")
    parser.add_argument(
        "--threads", type=lambda t: numbers(t, 1), help="OMP threads per run: '1,2' (default: all cores)"
    )
    parser.add_argument("--jobs", type=positive_int, default=1, help="runs side by side, each on cores of its own")
    parser.add_argument("--to-end", action="store_true", help="let the fast runs finish (final accuracy)")
    parser.add_argument("--ablate", action="store_true", help="also the fast preset with each technique off")
    parser.add_argument("--only", default="", help="comma-separated ablations (default: all with --ablate)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the baseline (ablations only)")
    parser.add_argument("--runs-dir", default="", help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--json", default="", help="also write every run's figures to this file")
    parser.add_argument(
        "--results",
        nargs="+",
        default=[],
        metavar="JSON",
        help="run nothing: the table of the figures earlier --json runs wrote (e.g. the presets run apart)",
    )
    parser.add_argument(
        "--fastai",
        nargs="+",
        default=[],
        metavar="JSON",
        help="add bench/fastai_fashion.py's runs (their --json files) to the table",
    )
    parser.add_argument("overrides", nargs="*", help="key=value overrides for every run, e.g. eval.every_kimg=15")
    args = parser.parse_args()
    only = [a for a in args.only.split(",") if a]
    unknown = set(only) - set(ABLATIONS)
    if unknown:
        parser.error(f"unknown ablations {sorted(unknown)}; valid: {', '.join(ABLATIONS)}")
    ablations = only or (list(ABLATIONS) if args.ablate else [])
    seeds = args.seeds
    threads = args.threads or [len(os.sched_getaffinity(0))]

    missing = [f for f in args.results + args.fastai if not Path(f).is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    try:
        earlier = [r for f in args.results for r in json.loads(Path(f).read_text())]
        fastai = [fastai_result(Path(f), args.target) for f in args.fastai]
        other = sorted({r["target"] for r in earlier if r.get("target", args.target) != args.target})
        given = [(r["name"], r["threads"], r["seed"]) for r in earlier + fastai]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        parser.error(f"--results takes this script's --json files, --fastai bench/fastai_fashion.py's ({e!r})")
    if other:
        parser.error(f"those runs raced to {', '.join(f'{t:g}%' for t in other)}: give that --target")
    twice = sorted({run for run in given if given.count(run) > 1})
    if twice:  # (one run counted twice would be two seeds in the table)
        name, t, seed = twice[0]
        parser.error(f"{name}, seed {seed}, {t} thread(s) is given twice in --results/--fastai: give each run once")
    if args.results:
        print(table(earlier + fastai, args.target, args.fast))
        return
    with tempfile.TemporaryDirectory(prefix="bigbatch-tta-") as tmp:
        root = Path(args.runs_dir or tmp)
        runs = [(args.fast, args.fast, [], args.to_end)]  # (name, preset, overrides, to the end)
        runs += [] if args.no_baseline else [(args.baseline, args.baseline, [], False)]
        runs += [(f"without {a}", args.fast, ABLATIONS[a], False) for a in ablations]
        races = [
            Race(name, preset, args.overrides + over, seed, t, root / f"{name.replace(' ', '-')}-t{t}-s{seed}",
                 args.target, to_end)
            for t in threads for seed in seeds for name, preset, over, to_end in runs
        ]  # fmt: skip
        results = run_all(races, args.jobs)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    results += fastai
    device = next(o.split("=", 1)[1] for o in reversed([CPU, *args.overrides]) if o.startswith("train.device="))
    if device == "auto":  # (bigbatch's choice: a GPU where there is one)
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"\nTime to val_top1 >= {args.target:g}%\n\n{measured_on(device, max(threads))}")
    print(table(results, args.target, args.fast))


if __name__ == "__main__":
    main()
