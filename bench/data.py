"""Data pipeline throughput: `prepare` (images/s, per worker) and random-access reading (batch 256,
DataLoader workers 0/1/2) from DATA.h5 on local disk (page cache and cold), in RAM, through h5py
fancy indexing, and from S3, next to decoding the same images from a PNG folder with Pillow; and
the ratio of reading to what a training step consumes at 128x128.

    python bench/data.py                          # 3000 synthetic photos, 160px sources -> 128px
    python bench/data.py --n 10000 --workers 0,1,2,4 --no-s3

S3 is a moto server on 127.0.0.1 (in this process: an upper bound on latency, a lower bound on
concurrency compared with real S3). The consumption side: BigGAN-PyTorch's published 2048 real
images per ~9 s iteration on 8 V100s (BigGAN 128px, ch 96), and an upper bound for one H100: its
dense bf16 peak (989 TFLOP/s, NVIDIA's datasheet) divided by the FLOPs one real image costs in a
BigGAN-128 ch 96 D step + G step, counted here with torch.utils.flop_counter (--no-flops skips it).
"""

from __future__ import annotations

import argparse
import atexit
import io
import logging
import os
import resource
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))
from _args import int_list, positive_int  # noqa: E402
from _env import measured_on  # noqa: E402

from bigbatch.data import BatchLoader, H5Data, prepare  # noqa: E402
from bigbatch.data.streams import GlobalOrder  # noqa: E402

H100_BF16_DENSE = 989e12
BIGGAN_PYTORCH = 2048 / 9.0  # images per second, 8 x V100, from its README's ~15 days for 150k iterations


def photos(root: Path, n: int, size: int) -> None:
    """Smooth random colour fields with fine noise: compress and decode like photos, not like noise."""
    rng = np.random.default_rng(0)
    for c in range(10):
        (root / f"class{c}").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        low = Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)).resize((size, size), Image.BICUBIC)
        a = np.asarray(low, np.int16) + rng.integers(-6, 7, (size, size, 3))
        Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).save(root / f"class{i % 10}" / f"{i:06d}.png")


class PngFolder:
    """The baseline: one PNG file per image, decoded with Pillow on every read."""

    def __init__(self, files: list[Path], labels: np.ndarray):
        self.files, self.labels = files, torch.from_numpy(labels)

    def __len__(self) -> int:
        return len(self.files)

    def get(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        images = np.stack([np.asarray(Image.open(self.files[i]).convert("RGB")) for i in index.tolist()])
        return torch.from_numpy(images), self.labels[index]


class H5pyFancy:
    """The common way to read HDF5 in a Dataset: h5py fancy indexing, a handle opened per process."""

    def __init__(self, path: str):
        self.path, self._f, self._pid = path, None, -1

    def __getstate__(self) -> dict:
        return {"path": self.path, "_f": None, "_pid": -1}

    def get(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._pid != os.getpid():
            self._f, self._pid = h5py.File(self.path, "r"), os.getpid()
        unique, inverse = np.unique(index.numpy(), return_inverse=True)
        return torch.from_numpy(self._f["images"][unique][inverse]), torch.from_numpy(
            self._f["labels"][unique][inverse]
        )


def read_rate(data, n: int, batches: int, workers: int, evict: str | None = None) -> float:
    """Images/s over `batches` random batches of 256 after the first (worker start-up excluded)."""
    order = GlobalOrder(n, seed=0)
    requests = [order.indices(256 * k, 256) for k in range(batches + 1)]
    if evict:  # drop the file from the page cache: reads go to the disk
        fd = os.open(evict, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    it = iter(BatchLoader(data, requests, workers=workers, prefetch=4))
    next(it)
    start = time.perf_counter()
    count = sum(len(b.labels) for b in it)
    return count / (time.perf_counter() - start)


def timed_prepare(src: str, out: Path, resolution: int, workers: int) -> tuple[object, float, float]:
    """prepare(), with the CPU time per image spent in this process (serial: listing, fetching remote
    bytes, writing, hashing) and in the worker processes (decoding): on a machine with free cores the
    main process's share bounds how far more workers can go, whatever the machine is doing now."""
    self0, kids0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    report = prepare(src, str(out), resolution=resolution, workers=workers, overwrite=True)
    self1, kids1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = lambda a, b: (b.ru_utime + b.ru_stime) - (a.ru_utime + a.ru_stime)
    return report, 1000 * cpu(self0, self1) / report.count, 1000 * cpu(kids0, kids1) / report.count


def flops_per_image() -> float:
    """FLOPs of one D step + one G step of BigGAN-128 ch 96 per real image (batch 2, on CPU)."""
    from _gan import config, gan_task
    from torch.utils.flop_counter import FlopCounterMode

    overrides = ["model.name=biggan", "data.resolution=128", "model.ch=96", "model.dim_z=120"]
    cfg = config("digits", [*overrides, "train.batch=2", "train.micro_batch=2"])
    task, _ = gan_task(cfg, n_classes=1000)
    with FlopCounterMode(display=False) as counter:
        task.d_step(0)
        task.g_step(0)
    return counter.get_total_flops() / 2


def start_s3():
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # (found from outside: a line a request, over the tables)
    server.start()
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}"
    )
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.mkdir("bench")
    return server, fs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=positive_int, default=3000, help="images")
    p.add_argument("--src-size", type=positive_int, default=160, help="side of the source PNGs")
    p.add_argument("--resolution", type=positive_int, default=128)
    p.add_argument("--workers", type=int_list(0), default="0,1,2", help="DataLoader workers to try for reading")
    p.add_argument("--prepare-workers", type=int_list(0), default="1,2", help="prepare workers to try")
    p.add_argument("--batches", type=positive_int, default=12, help="batches of 256 timed per reading row")
    p.add_argument("--no-s3", action="store_true")
    p.add_argument("--no-flops", action="store_true")
    p.add_argument("--dir", help="working folder (default: a temporary one)")
    args = p.parse_args()
    workers = args.workers
    torch.set_num_threads(1)
    root = Path(args.dir or tempfile.mkdtemp(prefix="bigbatch-bench-data-"))
    if not args.dir:  # (found from outside: 0.35 GB a run left in /tmp)
        atexit.register(shutil.rmtree, root, True)
    src, h5 = root / "src", root / "data.h5"
    print(measured_on())
    print(f"# {args.n} synthetic photos {args.src_size}px -> {args.resolution}px, in {root}")  # (cores, load: above)
    if not src.exists():
        photos(src, args.n, args.src_size)
    server, fs = start_s3() if not args.no_s3 else (None, None)
    if fs is not None:
        fs.put(str(src), "bench/src", recursive=True)

    print(
        "\n| prepare from | workers | img/s | CPU ms/img, main process | CPU ms/img, workers | img/s bound by main |"
        "\n|---|---|---|---|---|---|"
    )
    for w in args.prepare_workers:
        for name, source, out in [("local PNG folder", str(src), h5), ("S3 (moto)", "s3://bench/src", root / "s3.h5")]:
            if "s3" in source and fs is None:
                continue
            r, main_ms, worker_ms = timed_prepare(source, out, args.resolution, w)
            print(
                f"| {name} | {w} | {r.images_per_s:.0f} | {main_ms:.2f} | {worker_ms:.2f} | {1000 / main_ms:.0f} |"
                if w > 1
                else f"| {name} | {w} | {r.images_per_s:.0f} | {main_ms:.2f} | - | - |"
            )

    # The same 128px images as PNG files, for the Pillow baseline.
    local = H5Data(h5)
    images, labels = local.get(torch.arange(len(local)))
    pngs = root / "png128"
    pngs.mkdir(exist_ok=True)
    files = [pngs / f"{i:06d}.png" for i in range(len(local))]
    for f, a in zip(files, images.numpy()):
        if not f.exists():
            buf = io.BytesIO()
            Image.fromarray(a).save(buf, "png")
            f.write_bytes(buf.getvalue())
    sources = [
        ("HDF5 local (page cache)", local, None),
        ("HDF5 local (cold: evicted)", local, str(h5)),
        ("HDF5 in RAM", H5Data(h5, in_ram=True), None),
        ("HDF5 via h5py fancy indexing", H5pyFancy(str(h5)), None),
        ("PNG folder, Pillow decode", PngFolder(files, labels.numpy()), None),
    ]
    if fs is not None:
        fs.put(str(h5), "bench/data.h5")
        sources.insert(3, ("HDF5 on S3 (moto)", H5Data("s3://bench/data.h5"), None))
        start = time.perf_counter()
        H5Data("s3://bench/data.h5", in_ram=True)
        mb = h5.stat().st_size / 1e6
        print(f"\nS3 (moto) in_ram: {mb:.0f} MB loaded at {mb / (time.perf_counter() - start):.0f} MB/s")
        for name in ("data.h5", "small.bin"):
            if name == "small.bin":
                fs.pipe("bench/small.bin", b"\0" * (1 << 20))
            size = fs.info(f"bench/{name}")["size"]
            gets = max(1, min(20, size // 49152))  # (a small --n: fewer ranges, each within the object)
            part = min(49152, size)
            start = time.perf_counter()
            for i in range(gets):
                fs.cat_file(f"bench/{name}", start=i * part, end=(i + 1) * part)
            ms = (time.perf_counter() - start) / gets * 1e3
            print(f"moto: one {part / 1024:.0f} KiB ranged GET of a {size / 1e6:.1f} MB object: {ms:.1f} ms")
    rates: dict[str, float] = {}
    print("\n| read (random, batch 256) | workers | img/s | MB/s |\n|---|---|---|---|")
    for name, data, evict in sources:
        for w in workers:
            batches = 2 if "fancy" in name or "S3" in name else args.batches  # those are that slow
            rate = read_rate(data, len(local), batches, w, evict)
            rates[f"{name}, {w} workers"] = rate
            print(f"| {name} | {w} | {rate:.0f} | {rate * images[0].numel() / 1e6:.0f} |")

    if args.resolution == 128:
        consumers = [("BigGAN-PyTorch, 8 x V100 (2048 img / 9 s)", BIGGAN_PYTORCH)]
        if not args.no_flops:
            fpi = flops_per_image()
            consumers.append((f"1 x H100 at 100% of bf16 peak ({fpi / 1e9:.0f} GFLOP/img)", H100_BF16_DENSE / fpi))
        best_local = max(v for k, v in rates.items() if k.startswith("HDF5 local (page"))
        cold = max(v for k, v in rates.items() if k.startswith("HDF5 local (cold"))
        print("\n| consumer at 128px | img/s | HDF5 local / consumer | cold / consumer | target |")
        print("|---|---|---|---|---|")
        for name, rate in consumers:
            print(f"| {name} | {rate:.0f} | {best_local / rate:.1f}x | {cold / rate:.1f}x | >= 10x |")
    else:  # (the consumers' rates are of 128px images: their ratio to reads of another size means nothing)
        print(f"\n# no consumer rows: their rates are at 128px, these reads at {args.resolution}px (--resolution 128)")
    print(f"\n# load average after: {os.getloadavg()[0]:.1f} (other processes share these {os.cpu_count()} CPUs)")
    if server is not None:
        server.stop()


if __name__ == "__main__":
    main()
