"""ImageNet at full count, rehearsed on this machine: the README's "ImageNet, step by step" run as a user
runs it, on a made data set of ImageNet's shape (1,281,167 training files in 1,000 class folders of
732-1,300 files, 50,000 validation files in one folder with LOC_val_solution.csv), adjusted only in
resolution, workers and model width, so that it fits this disk and runs in under an hour:

    python bench/rehearsal.py --root /tmp/rehearsal --fraction 0.1   # 1/10 of the count
    python bench/rehearsal.py --root /tmp/rehearsal                  # the full count (6 GiB on disk)
    python bench/rehearsal.py --root /tmp/rehearsal --fraction 0.1 1 # both, and how each stage grows
    python bench/rehearsal.py --fraction 0.1 1 --from-train       # train, eval, export again on those files

The photos are natural ones: crops of the colour photographs scikit-image and scikit-learn ship, at
random position and scale, aspect ratio 4:3 to 16:9 either way, mirrored at random, short side 48-100
px (ImageNet's 240-500 over five), JPEG q90, a few KB each; 20,000 distinct ones, which the files draw
from. The stages, each a command run as the README writes it:

1. `prepare train/ imagenet-train.h5 --resolution 64 --codec jpeg --crop none --workers 2`, SIGKILLed
   once half its parts are written, then run again (it resumes from the parts);
2. `prepare val/ imagenet-val.h5 ... --labels LOC_val_solution.csv --classes imagenet-train.h5`;
3. `info imagenet-train.h5 --verify`;
4. `bigbatch.data.Loader` over the training file (the Python API: random-resized crops, flips, two
   workers), 21 batches of 256;
5. `train --preset imagenet_resnet50_fast` for three steps, data.workers=2, the schedule's resolutions
   scaled as the store is (64/352), model.ch 8 (ResNet-50 at 1/8 of its width); start-up is the time
   from the command to its first step, and "to the plan" the part of it before the batch plan is
   printed (imports, the data files opened, the model built, micro_batch "auto" probed);
6. `eval RUN imagenet-val.h5` (top-1/5 over every validation image);
7. `export RUN model.pt`.

For each: wall time, peak memory of the command's processes together (their proportional set size,
PSS: a page a forked worker shares with its parent counted once; sampled every 0.1 s) and bytes
written. With two fractions the table adds how each grows (the full count's figure over 1/10's: 10 is
linear) and the memory a training image costs a run (the difference of the peaks over the
difference of the counts). Wall seconds on this 2-core machine; the table names the date and commit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np

TRAIN_FILES, VAL_FILES, CLASSES = 1_281_167, 50_000, 1000
FEWEST = 732  # ImageNet-1k's smallest class; most hold 1,300
STORED = 64  # the store's short side (the README's 352, over 5.5)
STEPS = 3  # training steps at the first phase's batch (4 x train.batch = 4,096 images)
BIGBATCH = [sys.executable, "-m", "bigbatch"]


def class_counts(fraction: float, seed: int = 0) -> np.ndarray:
    """Files per class: 1,300 for most, fewer (down to 732) for about one class in ten, summing to
    1,281,167 at the full count; scaled by `fraction` (at least one file a class)."""
    rng = np.random.default_rng(seed)
    counts = np.full(CLASSES, 1300)
    short = rng.choice(CLASSES, 104, replace=False)
    deficit = 1300 * CLASSES - TRAIN_FILES
    weights = rng.uniform(0.2, 1.0, len(short))
    cut = np.minimum(np.floor(deficit * weights / weights.sum()).astype(int), 1300 - FEWEST)
    cut[0] += deficit - cut.sum()
    counts[short] -= cut
    assert counts.sum() == TRAIN_FILES and counts.min() >= FEWEST
    return np.maximum(1, np.round(counts * fraction).astype(int))


def synsets(seed: int = 0) -> list[str]:
    """1,000 WordNet-style ids, sorted as ImageNet's folders are (n + 8 digits)."""
    rng = np.random.default_rng(seed)
    return [f"n{v:08d}" for v in sorted(rng.choice(15_000_000, CLASSES, replace=False) + 1_000_000)]


_SOURCES: list = []


def _sources() -> list:
    """The colour photographs, each at short sides 100-400 px, so that a crop of a few times its output
    size (detail per pixel as in ImageNet's photos, which vary in it) is cut from one near its scale."""
    if not _SOURCES:
        import skimage.data as sk
        from PIL import Image
        from sklearn.datasets import load_sample_images

        photos = [sk.astronaut(), sk.coffee(), sk.chelsea(), sk.rocket(), sk.cat(), sk.stereo_motorcycle()[0]]
        for a in [*photos, *load_sample_images().images]:
            img = Image.fromarray(a)
            for short in (100, 140, 200, 280, 400):
                s = short / min(img.size)
                if s <= 1:
                    _SOURCES.append(img.resize((round(img.width * s), round(img.height * s)), Image.Resampling.BOX))
    return _SOURCES


def _photo(rng: np.random.Generator) -> bytes:
    """One photo: short side 48-100 px, aspect 4:3 to 16:9 (landscape three times in four), a crop of
    1-2 times its size from one of the sources (so 1-2 source pixels a pixel), mirrored half the time."""
    import io

    from PIL import Image

    sources = _sources()
    ratio = float(np.exp(rng.uniform(np.log(4 / 3), np.log(16 / 9))))
    short = int(rng.integers(48, 101))
    w, h = (round(short * ratio), short) if rng.random() < 0.75 else (short, round(short * ratio))
    zoom = rng.uniform(1.0, 2.0)
    fits = [s for s in sources if s.width >= w * zoom and s.height >= h * zoom] or [max(sources, key=lambda s: s.width)]
    src = fits[int(rng.integers(len(fits)))]
    cw, ch = min(src.width, round(w * zoom)), min(src.height, round(h * zoom))
    x, y = int(rng.integers(0, src.width - cw + 1)), int(rng.integers(0, src.height - ch + 1))
    img = src.crop((x, y, x + cw, y + ch)).resize((w, h), Image.Resampling.BILINEAR)
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    out = io.BytesIO()
    img.save(out, "JPEG", quality=90)
    return out.getvalue()


POOL = 20_000  # distinct photos; the files draw from them (a few KB each, so the full count is made in minutes)
_POOL: list[bytes] = []


def _write_folder(job: tuple[str, list[str], int]) -> int:
    """Writes the files of one folder (a class, or a slice of val/) that are not there yet, each a photo
    drawn from the pool (the same in every process: seed 0) by a generator seeded with the job."""
    folder, names, seed = job
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, POOL, len(names))
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    have = set(os.listdir(root))
    written = 0
    for name, pick in zip(names, picks):
        if name not in have:
            if not _POOL:
                pool_rng = np.random.default_rng(0)
                _POOL.extend(_photo(pool_rng) for _ in range(POOL))
            tmp = root / f".{name}.tmp"
            tmp.write_bytes(_POOL[pick])
            tmp.rename(root / name)
            written += 1
    return written


def make_imagenet(root: Path, fraction: float, workers: int) -> dict:
    """train/<synset>/<synset>_<i>.JPEG, val/ILSVRC2012_val_<8 digits>.JPEG and LOC_val_solution.csv
    (ImageId,PredictionString: the synset and a box, as ImageNet's). Resumable: files already there stay."""
    names, counts = synsets(), class_counts(fraction)
    train = enumerate(zip(names, counts))
    jobs = [(str(root / "train" / s), [f"{s}_{i}.JPEG" for i in range(c)], k) for k, (s, c) in train]
    n_val = max(CLASSES, round(VAL_FILES * fraction))
    val = [f"ILSVRC2012_val_{i:08d}" for i in range(1, n_val + 1)]
    jobs += [(str(root / "val"), [f"{v}.JPEG" for v in val[a : a + 1000]], 10_000 + a) for a in range(0, n_val, 1000)]
    rng = np.random.default_rng(1)
    truth = rng.integers(0, CLASSES, n_val)
    root.mkdir(parents=True, exist_ok=True)
    csv = root / "LOC_val_solution.csv"
    if not csv.exists():
        rows = (f"{v},{names[t]} {rng.integers(0, 40)} {rng.integers(0, 40)} 60 50 " for v, t in zip(val, truth))
        tmp = csv.with_suffix(".tmp")
        tmp.write_text("ImageId,PredictionString\n" + "\n".join(rows) + "\n")
        tmp.rename(csv)
    start = time.perf_counter()
    with Pool(workers) as pool:
        written = sum(pool.imap_unordered(_write_folder, jobs, chunksize=4))
    return {"train": int(counts.sum()), "val": n_val, "written": written, "seconds": time.perf_counter() - start}


@dataclass
class Stage:
    """One command's figures (printed as it ends, so that a long rehearsal shows them as it goes)."""

    name: str
    seconds: float
    peak: int  # bytes, the command's processes together (PSS)
    disk: int = 0  # bytes written
    note: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        print(
            f"[rehearsal] {self.name}: {self.seconds:.1f} s, {_mib(self.peak)}, {_mib(self.disk)} {self.note}",
            flush=True,
        )


def _tree_pss(proc: Any) -> int:
    """The proportional set size of a process and its children together: pages they share (a forked
    worker's copy of its parent, the libraries) counted once, split among them. Read from
    /proc/PID/smaps_rollup, which costs the kernel little, so sampling does not slow what it measures."""
    import psutil

    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            with open(f"/proc/{p.pid}/smaps_rollup") as f:
                total += next(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
        except (OSError, StopIteration, psutil.Error):
            pass
    return total


def run(cmd: list[str], cwd: Path, kill_when: object = None, lines: list | None = None) -> tuple[float, int, int]:
    """Runs `cmd`; returns (wall seconds, peak PSS of its process tree, exit status). `kill_when()` true:
    SIGKILL to the whole group. `lines`: each stdout line with the seconds since the start."""
    import psutil

    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )
    out: list = [] if lines is None else lines

    def read() -> None:
        for line in proc.stdout:
            out.append((time.perf_counter() - start, line.rstrip()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    ps, peak = psutil.Process(proc.pid), 0
    try:
        while proc.poll() is None:
            peak = max(peak, _tree_pss(ps))
            if kill_when is not None and kill_when():
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
            time.sleep(0.1)
    finally:  # (found from outside: a rehearsal stopped by timeout or Ctrl-C left its training, a session of its
        with contextlib.suppress(ProcessLookupError):  # own, running with no parent; its group's other processes too,
            os.killpg(proc.pid, signal.SIGKILL)  # its leader gone or not: found by review)
        proc.wait()
    reader.join()
    wall = time.perf_counter() - start
    if proc.returncode not in (0, -signal.SIGKILL):
        print("\n".join(line for _, line in out[-30:]), file=sys.stderr)
        raise SystemExit(f"{' '.join(cmd[2:])} failed (exit {proc.returncode})")
    return wall, peak, proc.returncode


def _parts_written(folder: Path) -> int:
    """Whole parts a prepare has kept (part-*.npz; not its manifest or a part being written)."""
    return sum(name.startswith("part-") for name in os.listdir(folder)) if folder.is_dir() else 0


def _summary(lines: list) -> str:
    """From prepare's report: its rate, and how many files it read back from a killed run's parts."""
    text = "\n".join(line for _, line in lines)
    rate, resumed = re.search(r"\((\d+) img/s", text), re.search(r"resumed: (\d+) files", text)
    out = f"{int(rate[1]):,} img/s" if rate else ""
    return out + (f", {int(resumed[1]):,} resumed from parts" if resumed else "")


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def rehearse(root: Path, fraction: float, workers: int, from_train: bool = False) -> tuple[dict, list[Stage]]:
    made = make_imagenet(root, fraction, workers)
    work = root / "work"
    work.mkdir(exist_ok=True)
    if from_train:
        missing = [n for n in ("imagenet-train.h5", "imagenet-val.h5") if not (work / n).is_file()]
        if missing:
            raise SystemExit(f"--from-train: {work} has no {' or '.join(missing)}; run the whole rehearsal once")
    for old in ("model.pt",) if from_train else ("imagenet-train.h5", "imagenet-val.h5", "model.pt"):
        (work / old).unlink(missing_ok=True)
    stages = [Stage("make (not timed as a user's)", made["seconds"], 0, _size(root / "train") + _size(root / "val"))]
    if not from_train:
        stages += _prepare_stages(root, work, made, workers)
    stages += _run_stages(work, made, workers)
    return made, stages


def _prepare_stages(root: Path, work: Path, made: dict, workers: int) -> list[Stage]:
    """prepare train (killed at half, run again), prepare val, info --verify, the Loader."""
    stages = []
    store = ["--resolution", str(STORED), "--codec", "jpeg", "--crop", "none", "--workers", str(workers)]
    train_cmd = [*BIGBATCH, "prepare", str(root / "train"), "imagenet-train.h5", *store]
    parts = work / ".imagenet-train.h5.parts"
    half = made["train"] / 256 / 2
    killed_wall, killed_peak, _ = run(train_cmd, work, kill_when=lambda: _parts_written(parts) >= half)
    kept = _parts_written(parts)
    lines: list = []
    wall, peak, _ = run(train_cmd, work, lines=lines)
    stages.append(Stage("prepare train, killed at half", killed_wall, killed_peak, note=f"{kept} parts kept"))
    stages.append(Stage("prepare train, run again", wall, peak, _size(work / "imagenet-train.h5"), _summary(lines)))

    val_cmd = [*BIGBATCH, "prepare", str(root / "val"), "imagenet-val.h5", *store, "--labels"]
    val_cmd += [str(root / "LOC_val_solution.csv"), "--classes", "imagenet-train.h5"]
    lines = []
    wall, peak, _ = run(val_cmd, work, lines=lines)
    stages.append(Stage("prepare val (CSV labels)", wall, peak, _size(work / "imagenet-val.h5"), _summary(lines)))

    wall, peak, _ = run([*BIGBATCH, "info", "imagenet-train.h5", "--verify"], work)
    stages.append(Stage("info --verify", wall, peak))

    scale = STORED / 352
    lines = []
    child = [sys.executable, __file__, "--loader-child", "imagenet-train.h5", str(round(128 * scale)), str(workers)]
    wall, peak, _ = run(child, work, lines=lines)
    times = json.loads(lines[-1][1])
    note = f"to build {times['construct']:.2f} s, first batch {times['first']:.2f} s, 20 more {times['rest']:.1f} s"
    stages.append(Stage("Loader (Python API), 21 batches of 256", wall, peak, note=note, extra=times))
    return stages


def _run_stages(work: Path, made: dict, workers: int) -> list[Stage]:
    """train a few steps, eval, export."""
    from bigbatch.data import Schedule
    from bigbatch.presets import preset

    stages, cfg, scale = [], preset("imagenet_resnet50_fast"), STORED / 352
    phases, res, batch = [], cfg.data.resolution, cfg.train.batch
    for p in cfg.data.schedule:  # (a phase leaving out resolution or batch keeps the previous phase's)
        res, batch, lr = p.get("resolution", res), p.get("batch", batch), p.get("lr", [])
        lr = lr if isinstance(lr, list) else [lr]
        phases.append(":".join(map(str, [p["kimg"], round(res * scale), batch, *lr])))
    schedule = ",".join(phases)
    first_batch = Schedule.parse(cfg.data.schedule, base_batch=cfg.train.batch).phases[0].batch
    kimg = STEPS * first_batch / 1000
    run_dir = work / "runs" / "fast"
    shutil.rmtree(run_dir, ignore_errors=True)
    train = [*BIGBATCH, "train", "--preset", "imagenet_resnet50_fast", "--run-dir", str(run_dir)]
    train += ["data.path=imagenet-train.h5", "data.val_path=imagenet-val.h5", f"data.workers={workers}"]
    train += [f"data.schedule={schedule}", "model.ch=8", f"train.kimg={kimg}"]
    train += [f"train.log_every_kimg={first_batch / 1000}"]
    lines = []
    wall, peak, _ = run(train, work, lines=lines)
    steps = [t for t, line in lines if line.startswith("kimg ") and "/" in line.split()[1]]
    startup = steps[0] - (steps[1] - steps[0]) if len(steps) > 1 else float("nan")
    planned = next(t for t, line in lines if line.startswith("Training "))
    note = f"start-up {startup:.1f} s, {planned:.1f} s to the plan"
    stages.append(Stage(f"train, {STEPS} steps of {first_batch}", wall, peak, _size(run_dir), note))
    stages[-1].extra.update(startup=startup, planned=planned)

    lines = []
    wall, peak, _ = run([*BIGBATCH, "eval", str(run_dir), "imagenet-val.h5"], work, lines=lines)
    top = next((line for _, line in lines if "top-1" in line), "")
    stages.append(Stage(f"eval on {made['val']:,} val images", wall, peak, note=top.strip()[:60]))

    wall, peak, _ = run([*BIGBATCH, "export", str(run_dir), "model.pt", "--overwrite"], work)
    stages.append(Stage("export", wall, peak, _size(work / "model.pt")))
    return stages


def loader_child(path: str, resolution: int, workers: int) -> None:
    """In its own process: bigbatch.data.Loader over the training file as the README's Python API shows
    (random-resized crops, flips, `workers` processes); prints seconds to construct it, to its first
    batch, and for 20 batches of 256 after it."""
    import torch  # noqa: F401  (imported before the clock starts, as any training script has)

    from bigbatch.data import Loader

    start = time.perf_counter()
    loader = Loader(path, batch=256, resolution=resolution, augment="rrc", xflip=True, workers=workers, steps=21)
    made = time.perf_counter()
    batches = iter(loader)
    next(batches)
    first = time.perf_counter()
    for _ in batches:
        pass
    print(json.dumps({"construct": made - start, "first": first - made, "rest": time.perf_counter() - first}))


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB" if n else ""


def table(results: dict[float, tuple[dict, list[Stage]]]) -> str:
    fractions = sorted(results)
    head = " | ".join(f"{results[f][0]['train']:,} train files: s, peak memory (PSS), disk" for f in fractions)
    head = "| stage | " + head
    grow = len(fractions) == 2
    out = [head + (" | growth (time, memory) |" if grow else " |")]
    out.append("|---" * (len(fractions) + 1 + grow) + "|")
    for i, stage in enumerate(results[fractions[0]][1]):
        cells = []
        for f in fractions:
            s = results[f][1][i]
            cells.append(f"{s.seconds:,.1f} s, {_mib(s.peak)}, {_mib(s.disk)}" + (f" ({s.note})" if s.note else ""))
        if grow:
            a, b = results[fractions[0]][1][i], results[fractions[1]][1][i]
            ratio = f"{b.seconds / a.seconds:.1f}x, " + (f"{b.peak / a.peak:.2f}x" if a.peak else "")
            cells.append(ratio)
        out.append(f"| {stage.name} | " + " | ".join(cells) + " |")
    if grow:
        (ma, sa), (mb, sb) = results[fractions[0]], results[fractions[1]]
        out.append("\nMemory an image costs (the difference of the peaks over the difference of the counts): ")
        costs = []
        for a, b in zip(sa, sb):
            if a.peak:  # (a stage over the validation images: per validation image)
                val = " val " in b.name or b.name.startswith("prepare val")
                label = "eval" if b.name.startswith("eval") else b.name.split(",")[0].split(" (")[0]
                extra = mb["val"] - ma["val"] if val else mb["train"] - ma["train"]
                kind = "validation" if val else "training"
                costs.append(f"{label} {(b.peak - a.peak) / extra:,.0f} B a {kind} image")
        out[-1] += ", ".join(costs)
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--root", type=Path, default=Path("/tmp/rehearsal"), help="where the made files go (default: %(default)s)"
    )
    ap.add_argument(
        "--fraction",
        type=float,
        nargs="+",
        default=[1.0],
        help="shares of ImageNet's count to rehearse (default: 1, the full count; any share keeps one file a class, "
        "and training's 3 steps of 4,096 images, some 15 minutes on 2 cores, whatever the share)",
    )
    ap.add_argument("--workers", type=int, default=2, help="prepare's and the loader's workers (default: 2)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--make-only", action="store_true", help="make the data sets (resumable) and stop")
    ap.add_argument(
        "--from-train", action="store_true", help="train, eval and export on the files an earlier rehearsal prepared"
    )
    ap.add_argument("--loader-child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    for stop in (signal.SIGTERM, signal.SIGHUP):  # (run's children stopped with it: their own session hears neither)
        signal.signal(stop, lambda signum, _: sys.exit(128 + signum))
    if args.loader_child:
        path, resolution, workers = args.loader_child
        return loader_child(path, int(resolution), int(workers))
    if args.make_only:
        for f in args.fraction:
            print(make_imagenet(args.root / f"count-{f:g}", f, args.workers))
        return
    results = {}
    for f in args.fraction:
        results[f] = rehearse(args.root / f"count-{f:g}", f, args.workers, args.from_train)
        print(table({f: results[f]}), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"\n{time.strftime('%Y-%m-%d')}, commit {commit}, {os.cpu_count()} CPUs\n")
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps({f: [m, [s.__dict__ for s in st]] for f, (m, st) in results.items()}, indent=1))


if __name__ == "__main__":
    main()
