"""Reading an encoded data file straight from S3: images/s of a training read (random batches of the
step's share, each image's bytes one HTTP range request, merged where images are adjacent) at 1, 8
and 32 requests in flight, against a moto S3 server on 127.0.0.1, next to the same file on local disk.

    python bench/s3_read.py                      # 400 photos, JPEG q90 at 256 px
    python bench/s3_read.py --n 2000 --batch 256

moto runs in this process, on the same 2 cores as the reader, with no network latency: real S3
(tens of ms a request, high concurrency) rewards requests in flight far more than this does. Wall
time, best of 3."""

from __future__ import annotations

import argparse
import atexit
import functools
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))

from _args import positive_int  # noqa: E402
from storage import make_photos  # noqa: E402

from bigbatch.data import H5Data, load_data, prepare  # noqa: E402
from bigbatch.data.streams import GlobalOrder  # noqa: E402


def moto() -> str:
    import logging

    from moto import server as moto_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False).start()
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_ENDPOINT_URL=endpoint,
        AWS_DEFAULT_REGION="us-east-1",
    )
    return endpoint


def rate(data: H5Data, batches: list[torch.Tensor]) -> float:
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for index in batches:
            data.get(index)
        best = min(best, time.perf_counter() - t)
    return sum(len(b) for b in batches) / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=positive_int, default=400, help="photos")
    parser.add_argument("--batch", type=positive_int, default=64, help="images per read (a step's share)")
    parser.add_argument("--resolution", type=positive_int, default=256)
    args = parser.parse_args()
    if args.batch > args.n:
        parser.error(f"--batch {args.batch} is more than --n {args.n} photos: give a smaller batch or more photos")
    import cv2

    cv2.setNumThreads(0)
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="bench-s3-"))
    atexit.register(shutil.rmtree, root, True)  # (found from outside: left in /tmp)
    make_photos(root / "photos", args.n)
    moto()
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.mkdir("bench")
    local = root / "photos.h5"
    prepare(str(root / "photos"), str(local), args.resolution, workers=0, codec="jpeg")
    fs.put(str(local), "bench/photos.h5")
    order = GlobalOrder(args.n, seed=0)
    random = [order.indices(k * args.batch, args.batch) for k in range(args.n // args.batch)]
    adjacent = [torch.arange(k * args.batch, (k + 1) * args.batch) for k in range(args.n // args.batch)]
    kib = local.stat().st_size / args.n / 1024
    print(f"{args.n} images, JPEG q90 at {args.resolution} px ({kib:.1f} KiB an image), batches of {args.batch}\n")
    print("| reading | in flight | random batches img/s | adjacent batches img/s |")
    print("|---|---|---|---|")
    disk = H5Data(local)
    print(f"| local disk (page cache) | - | {rate(disk, random):.0f} | {rate(disk, adjacent):.0f} |")
    for flight in (1, 8, 32):
        remote = load_data("s3://bench/photos.h5", args.resolution)
        remote.get(torch.arange(1))  # open this process's handle
        fs = remote._bytes().fs
        fs.cat_ranges = functools.partial(fs.cat_ranges, batch_size=flight)
        print(f"| S3 (moto, 127.0.0.1) | {flight} | {rate(remote, random):.0f} | {rate(remote, adjacent):.0f} |")


if __name__ == "__main__":
    main()
