"""Tar shards as a prepare source: how long listing WebDataset shards takes (their headers read, each sample's
.cls parsed) against listing the same images as a folder of files, and the listing's memory an image, with
`prepare` of both timed end to end and their content hashes compared.

    python bench/tar_listing.py                          # 4 shards of 10,000 samples (jpg, cls, json)
    python bench/tar_listing.py --shards 2 --per-shard 2000

Each sample is a small JPEG (the bytes of one 32x32 image, re-used: listing and reading do not depend on what the
image shows), its .cls and a .json, as webdataset's TarWriter writes them. Figures are ratios measured in one run
on this machine; peak memory is Python's own allocations (tracemalloc) while listing, in a second listing."""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tarfile
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _args import at_least, positive_int  # noqa: E402

from bigbatch.data import prepare  # noqa: E402
from bigbatch.data.sources import list_source  # noqa: E402


def _make(root: Path, shards: int, per_shard: int) -> tuple[str, Path]:
    """The shards under root/wds and the same images as root/folder/<class>/<key>.jpg."""
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), np.uint8)).save(out, "JPEG", quality=90)
    jpeg = out.getvalue()
    (root / "wds").mkdir()
    for s in range(shards):
        with tarfile.open(root / "wds" / f"train-{s:06d}.tar", "w") as tar:
            for i in range(per_shard):
                key, label = f"{s:03d}_{i:06d}", s  # (a class a shard: the folder lists them in the shards' order)
                folder = root / "folder" / f"{label}"
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"{key}.jpg").write_bytes(jpeg)
                fields = (("jpg", jpeg), ("cls", str(label).encode()), ("json", json.dumps({"k": key}).encode()))
                for ext, data in fields:
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return str(root / "wds" / f"train-{{000000..{shards - 1:06d}}}.tar"), root / "folder"


def _timed(fn):  # (seconds, result, peak bytes): timed without tracemalloc (which slows Python), then measured
    start = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - start
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return seconds, out, peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--per-shard", type=positive_int, default=10_000)
    ap.add_argument("--workers", type=at_least(0), default=len(os.sched_getaffinity(0)))
    args = ap.parse_args()
    if not 1 <= args.shards <= 10:
        ap.error("--shards 1 to 10 (a class a shard, named 0 to 9: the folder's sorted order is the shards')")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        pattern, folder = _make(root, args.shards, args.per_shard)
        n = args.shards * args.per_shard
        rows = []
        for what, src in (("folder", str(folder)), ("tar shards", pattern)):
            list_source(src)  # (the page cache warm for both)
            seconds, listing, peak = _timed(lambda src=src: list_source(src))
            assert len(listing.keys) == n, (what, len(listing.keys))
            start = time.perf_counter()
            report = prepare(src, str(root / f"{what}.h5"), resolution=32, workers=args.workers)
            rows.append((what, seconds, peak / n, time.perf_counter() - start, report.content_hash))
        base = rows[0]
        print(f"{n:,} images ({args.shards} shards of {args.per_shard:,}); prepare with {args.workers} workers\n")
        print("| source | listing s | images/s listed | vs folder | listing bytes/image | prepare s | same hash |")
        print("|---|---|---|---|---|---|---|")
        for what, seconds, per, prep, digest in rows:
            same = "yes" if digest == base[4] else "NO"
            print(f"| {what} | {seconds:.2f} | {n / seconds:,.0f} | {seconds / base[1]:.2f}x | {per:,.0f} | {prep:.1f} "
                  f"| {same} |")  # fmt: skip


if __name__ == "__main__":
    main()
