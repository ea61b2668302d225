"""GANs on limited data: the digits recipe trained on a few images without augmentation, with
DiffAugment's transforms (p = 1), with ADA's adaptive p over them (ada) and with ADA's own pipeline
(ada-bgc: augment.pipeline = "ada", its blit, geom and color groups), scored against the whole data
set. Prints one table.

    python bench/augment.py --n 100 --kimg 30 --out /tmp/augment-bench

Each variant but all-data (all 1797 digits, no augmentation: the reference) trains `bigbatch train
--preset digits` on the same `--n` images (`bigbatch prepare builtin:digits --limit N`, spread over
the ten classes), the same seed and length. Scores: FCD (FID on
the features of a classifier trained on the whole of digits, `eval.extractor=classifier`; lower is
better) of 1000 samples of G_ema against all 1797 digits, and the fraction of samples of each class an
SVM trained on the real 8x8 digits recognises as that class (bench/digits_quality.py's measure).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _args import name_list, positive_float, positive_int
from digits_quality import recognised
from sklearn.datasets import load_digits
from sklearn.svm import SVC

import bigbatch

VARIANTS = {
    "all-data": {"data.path": "builtin:digits"},  # the reference: all 1797 images, no augmentation
    "none": {},
    "diffaugment": {"augment.policy": "color,translation,cutout"},
    "ada": {"augment.policy": "color,translation,cutout", "augment.target": 0.6},
    "ada-bgc": {"augment.pipeline": "ada", "augment.policy": "bgc", "augment.target": 0.6},  # ADA's own pipeline
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=positive_int, default=100, help="training images (spread over the classes)")
    p.add_argument("--kimg", type=positive_float, default=30)
    p.add_argument(
        "--variants", type=name_list(tuple(VARIANTS)), default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)}"
    )
    p.add_argument("--ada-speed-kimg", type=float, default=10, help="augment.speed_kimg of the ada variants")
    p.add_argument("--out", type=Path, default=Path("/tmp/augment-bench"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    data = args.out / f"digits-{args.n}.h5"
    if not data.exists():
        prepare = ["prepare", "builtin:digits", str(data), "--limit", str(args.n), "--resolution", "32"]
        subprocess.run([sys.executable, "-m", "bigbatch", *prepare], check=True)
    d = load_digits()
    clf = SVC(gamma=0.001).fit(d.data, d.target)
    rows = []
    for name in args.variants:
        overrides = {"data.path": str(data), "train.kimg": args.kimg, "eval.every_kimg": 0, **VARIANTS[name]}
        if name.startswith("ada"):
            overrides["augment.speed_kimg"] = args.ada_speed_kimg
        run = args.out / name
        start = time.perf_counter()
        bigbatch.train(bigbatch.preset("digits").override(overrides), run_dir=run, resume="auto", quiet=True)
        seconds = time.perf_counter() - start
        score = subprocess.run(
            [sys.executable, "-m", "bigbatch", "eval", str(run), "builtin:digits", "--metrics", "fid",
             "--extractor", "classifier", "--n", "1000"],
            check=True, capture_output=True, text=True,
        ).stdout.strip().splitlines()[-1]  # fmt: skip
        fcd = json.loads(score)["fcd"]
        logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        last_p = next((r["augment_p"] for r in reversed(logged) if "augment_p" in r), None)
        hits = recognised(bigbatch.load_generator(run), clf, n_per_class=100, seed=0)
        rows.append((name, fcd, float(np.mean([h for _, h in hits])), last_p, seconds))
    print(f"digits, {args.n} training images, {args.kimg:g} kimg, seed 0\n")
    print("| variant | FCD vs all 1797 digits | recognised by the SVM | p at the end | train s |")
    print("|---|---|---|---|---|")
    for name, fcd, acc, last_p, seconds in rows:
        shown_p = "-" if last_p is None else f"{last_p:.3f}"
        print(f"| {name} | {fcd:.3f} | {acc:.1%} | {shown_p} | {seconds:.0f} |")


if __name__ == "__main__":
    main()
