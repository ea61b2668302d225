"""The batch-size claim, reproduced: does a GAN get better with a bigger batch for the same number of
generator steps? (TF-Replicator found SN-GAN's quality rising with the batch from 8 to 512 on TPUs;
BigGAN's paper, with batch 256 to 2048.)

Trains the fashion32 GAN (SN-DCGAN, class-conditional, Fashion-MNIST at 32x32) at each batch for the
same number of G steps, with the preset's learning rates, and scores each run at its end with the
classifier metrics (fcd, kcd, cs: FID, KID and IS computed on a small Fashion-MNIST classifier's
features, trained once and cached), or with Inception FID (--extractor inception, where its weights
are; ~0.35 s an image on a CPU, so a GPU's job). The table is RUNS/results.md.

    bigbatch sweep sweeps/batch_scaling.py                     # or: python sweeps/batch_scaling.py
    bigbatch sweep sweeps/batch_scaling.py --steps 2000 --batches 16 64 256 1024 --launcher ray
"""

import argparse
import sys
from pathlib import Path

import bigbatch


def main(argv: list[str]) -> list[dict]:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))  # (its first paragraph)
    ap.add_argument("--steps", type=int, default=300, help="G steps of every run (default 300)")
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256, 1024])
    ap.add_argument("--ch", type=int, default=64, help="model width (the preset's: 64)")
    ap.add_argument("--eval-n", type=int, default=10_000, help="generated images per score")
    ap.add_argument("--extractor", default="classifier", help="classifier (fcd, kcd, cs) or inception (fid, kid, is)")
    ap.add_argument("--launcher", default="local", help="local, or ray (after `ray start`); a Dask client from Python")
    ap.add_argument("--runs-dir", default="runs/batch_scaling")
    args = ap.parse_args(argv)
    base = bigbatch.preset("fashion32").override(
        {
            "model.ch": args.ch,
            "eval.metrics": "fid,kid,is",
            "eval.extractor": args.extractor,
            "eval.n": args.eval_n,
            "sample.every_kimg": 1e9,  # a sheet at the end only
            "checkpoint.every_kimg": 1e9,
        }
    )
    # Same G steps for each batch: the run length in images follows the batch. The whole batch in one
    # micro-batch, so that BatchNorm sees the batch the published numbers mean.
    rows = []
    for b in args.batches:  # plain Python: the run length follows the batch
        kimg = args.steps * b / 1000
        cfg = base.override(
            # scored once, at the end: every run at the same G step
            {
                "train.batch": b,
                "train.micro_batch": b,
                "train.kimg": kimg,
                "train.log_every_kimg": kimg / 20,
                "eval.every_kimg": kimg,
            }
        )
        rows += bigbatch.sweep(cfg, {"train.batch": [b]}, args.runs_dir, launcher=args.launcher, quiet=False)
    print((Path(args.runs_dir) / "results.md").read_text())
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
