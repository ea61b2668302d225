"""S3 at count: `bigbatch prepare` from an S3 prefix of 100,000 small JPEGs (100 class folders of 1,000)
on a moto server: the upload (one folder through s3fs's put, the rest seeded into moto's store: PUTs
through HTTP run at tens a second here), the listing (its pages and every request counted), a prepare
SIGKILLed half way and run again (it resumes from its parts), an uninterrupted one, and the same files
prepared from the local folder, whose content hash all three must share.

    python bench/s3_count.py                                # 100 classes x 1,000 (2 hours on 2 busy cores)
    python bench/s3_count.py --classes 10 --per-class 300   # a quick look
    python bench/s3_count.py --put-all                      # every object through s3fs's put

moto (ThreadedMotoServer's app and server, as the tests use) runs in a process of its own on the same
cores, behind a counter of the requests it answers by S3 operation; its CPU seconds are shown per phase.
Every prepare is the CLI's (`bigbatch.cli.main`) in a process of its own (peak RSS: its main process, and
the largest decoding process). moto answers on 127.0.0.1 with no latency but its own CPU: real S3 takes
tens of ms a request and many at once, so wall times here are moto's and these cores', not S3's."""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from _args import at_least, positive_int

BUCKET = "bench"
COUNTS = "/__bench_counts"  # the counter's own paths, answered without reaching moto
SEED = "/__bench_seed"


def serve(parent: int) -> None:
    """(In the moto process.) ThreadedMotoServer's app and server, with a request counter in front."""
    import logging

    from bigbatch.signals import die_with_parent

    die_with_parent(parent)  # (not left serving if the benchmark is killed)

    from moto.moto_server.threaded_moto_server import MotoRequestHandler
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request
    app = DomainDispatcherApplication(create_backend_app)
    counts: Counter[str] = Counter()

    def counting(environ: dict[str, Any], start_response: Any) -> Any:
        if environ["PATH_INFO"] in (COUNTS, SEED):
            if environ["PATH_INFO"] == SEED:
                seed(**json.loads(environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"]))))
            start_response("200 OK", [("Content-Type", "application/json")])
            return [json.dumps(counts).encode()]
        counts[operation(environ["REQUEST_METHOD"], environ["PATH_INFO"], environ.get("QUERY_STRING", ""))] += 1
        return app(environ, start_response)

    server = make_server("127.0.0.1", 0, counting, True, request_handler=MotoRequestHandler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


def seed(root: str, bucket: str, prefix: str, folders: list[str]) -> None:
    """(In the moto process.) The files of `folders` under `root` straight into moto's store, as PUTs would
    leave them (same bytes, ETag and listing), without HTTP."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    for folder in folders:
        for path in sorted((Path(root) / folder).iterdir()):
            backend.put_object(bucket, f"{prefix}/{folder}/{path.name}", path.read_bytes())


def operation(method: str, path: str, query: str) -> str:
    """The S3 operation of a path-style request (enough of S3's REST API to tell the ones that count)."""
    params = {q.split("=", 1)[0] for q in query.split("&") if q}
    on_object = "/" in path.strip("/")
    if method == "GET" and not on_object:
        return (
            "ListObjectsV2" if "list-type" in params else "GetBucketLocation" if "location" in params else "ListObjects"
        )
    if method == "GET":
        return "GetObject"
    if method == "HEAD":
        return "HeadObject" if on_object else "HeadBucket"
    if method == "PUT":
        return "PutObject" if on_object else "CreateBucket"
    return f"{method} {'object' if on_object else 'bucket'}"


def make_jpegs(root: Path, classes: int, per_class: int) -> int:
    """classes x per_class JPEGs of 32x32 (smooth colour with noise, q90: about 1 KB each); total bytes."""
    from PIL import Image

    rng = np.random.default_rng(0)
    total = 0
    for c in range(classes):
        folder = root / f"n{c:08d}"  # (ImageNet's folder names)
        folder.mkdir(parents=True)
        for i in range(per_class):
            coarse = rng.integers(0, 256, (4, 4, 3)).astype(np.float32)
            pixels = np.kron(coarse, np.ones((8, 8, 1))) + rng.normal(0, 12, (32, 32, 3))
            path = folder / f"n{c:08d}_{i}.JPEG"
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(path, quality=90)
            total += path.stat().st_size
    return total


class Moto:
    """The moto process: its endpoint, its request counts and CPU seconds so far."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(os.getpid())], stdout=subprocess.PIPE, text=True
        )
        self.endpoint = f"http://127.0.0.1:{int(self.process.stdout.readline())}"

    def counts(self) -> Counter[str]:
        with urllib.request.urlopen(self.endpoint + COUNTS) as r:
            return Counter(json.loads(r.read()))

    def seed(self, root: Path, bucket: str, prefix: str, folders: list[str]) -> None:
        body = json.dumps({"root": str(root), "bucket": bucket, "prefix": prefix, "folders": folders}).encode()
        urllib.request.urlopen(urllib.request.Request(self.endpoint + SEED, body, method="POST")).read()

    def cpu(self) -> float:
        import psutil

        t = psutil.Process(self.process.pid).cpu_times()
        return t.user + t.system

    def rss_mb(self) -> float:
        import psutil

        return psutil.Process(self.process.pid).memory_info().rss / 2**20

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait()


class Phase:
    """Wall time, moto's CPU seconds and the requests moto answered during a `with` block."""

    def __init__(self, moto: Moto) -> None:
        self.moto = moto

    def __enter__(self) -> Phase:
        self.start, self.cpu0, self.counts0 = time.perf_counter(), self.moto.cpu(), self.moto.counts()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start
        self.moto_cpu = self.moto.cpu() - self.cpu0
        self.requests = self.moto.counts() - self.counts0

    def shown(self) -> str:
        return ", ".join(f"{n} {op}" for op, n in sorted(self.requests.items(), key=lambda x: -x[1]))


def child(argv: list[str], report: Path) -> None:
    """(In a prepare or listing process.) Run it, then write its peak RSS (and its largest child's) to `report`."""
    result: dict[str, Any] = {}
    if argv[0] == "list":
        import psutil

        from bigbatch.data.sources import list_source
        from bigbatch.urls import Location

        fs, _ = Location.of(argv[1]).fs()
        fs.ls(BUCKET)  # (botocore's service model loaded: not the listing's memory)
        before = psutil.Process().memory_info().rss
        t, cpu = time.perf_counter(), time.process_time()
        listing = list_source(argv[1])
        result.update(seconds=time.perf_counter() - t, files=len(listing.keys), classes=len(listing.class_names))
        cached = sum(len(v) for k, v in fs.dircache.items() if k.startswith(argv[1].removeprefix("s3://")))
        result.update(rss_before_mb=before / 2**20, cached=cached, cpu_listing=time.process_time() - cpu)
    else:
        from bigbatch.cli import main

        t = time.perf_counter()
        if main(argv) != 0:
            sys.exit(1)
        result.update(seconds=time.perf_counter() - t)
    me, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    result.update(rss_mb=me.ru_maxrss / 1024, worker_rss_mb=workers.ru_maxrss / 1024)
    result.update(cpu=me.ru_utime + me.ru_stime, worker_cpu=workers.ru_utime + workers.ru_stime)
    report.write_text(json.dumps(result))


def run_child(argv: list[str], work: Path, kill_at_parts: int = 0, parts: Path | None = None) -> dict[str, Any]:
    """`child(argv)` in a process of its own; SIGKILLed once `parts` holds `kill_at_parts` parts."""
    report, printed = work / "child.json", work / "child.out"
    report.unlink(missing_ok=True)
    with printed.open("w") as out:
        p = subprocess.Popen([sys.executable, __file__, "--child", str(report), *argv], stdout=out)
    if kill_at_parts:
        assert parts is not None
        while p.poll() is None and len(list(parts.glob("part-*.npz"))) < kill_at_parts:
            time.sleep(0.05)
        p.send_signal(signal.SIGKILL)
        p.wait()
        if p.returncode != -signal.SIGKILL:
            raise SystemExit("prepare ended before it could be killed")
        return {"parts": len(list(parts.glob("part-*.npz")))}
    if p.wait() != 0:
        raise SystemExit(f"{argv} failed")
    resumed = re.search(r"resumed: (\d+) files", printed.read_text())  # (prepare's own report)
    return {**json.loads(report.read_text()), "resumed": int(resumed.group(1)) if resumed else 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", type=positive_int, default=100)
    parser.add_argument("--per-class", type=positive_int, default=1000)
    parser.add_argument("--workers", type=at_least(0), default=2)
    parser.add_argument("--put-all", action="store_true", help="every object through s3fs's put (default: one folder)")
    parser.add_argument("--out", type=Path, help="work folder, kept (default: a new one in /tmp, removed after)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    n = args.classes * args.per_class
    if n < 512:  # (killed half way: after one of at least two parts of 256 files)
        parser.error(f"--classes x --per-class is {n} files: the killed prepare needs two parts of 256 (512 files)")
    work = args.out or Path(tempfile.mkdtemp(prefix="bench-s3-count-"))
    t = time.perf_counter()
    size = make_jpegs(work / "imgs", args.classes, args.per_class)
    made = time.perf_counter() - t
    print(f"{n} JPEGs of 32x32 ({size / n:.0f} bytes each) in {args.classes} folders, made in {made:.0f} s")

    moto = Moto()
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_ENDPOINT_URL=moto.endpoint,
        AWS_DEFAULT_REGION="us-east-1",
    )
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.mkdir(BUCKET)
    url = f"s3://{BUCKET}/imgs"
    folders = sorted(p.name for p in (work / "imgs").iterdir())
    put = folders if args.put_all else folders[:1]
    rows: list[tuple[str, str, str, str]] = []
    try:
        # Upload: through s3fs's put (concurrent PUTs), the folders not put seeded into moto directly.
        with Phase(moto) as up:
            for folder in put:
                fs.put(str(work / "imgs" / folder), f"{BUCKET}/imgs/{folder}", recursive=True)
        puts = len(put) * args.per_class
        rows.append(
            (
                f"upload, s3fs put of {puts} objects",
                f"{up.seconds:.1f}",
                up.shown(),
                f"{puts / up.seconds:.0f} objects/s; moto {up.moto_cpu / puts * 1e3:.1f} CPU ms a PUT",
            )
        )
        if len(put) < len(folders):
            with Phase(moto) as seeded:
                moto.seed(work / "imgs", BUCKET, "imgs", folders[len(put) :])
            rows.append((f"the other {n - puts} seeded into moto's store", f"{seeded.seconds:.1f}", "-", ""))

        # The listing, in a process of its own: its requests, time and memory.
        with Phase(moto) as ls:
            listed = run_child(["list", url], work)
        assert listed["files"] == n and listed["classes"] == args.classes, listed
        peak = (listed["rss_mb"] - listed["rss_before_mb"]) * 2**20 / n
        rows.append(
            (
                "listing (list_source)",
                f"{listed['seconds']:.1f}",
                ls.shown(),
                f"{peak:.0f} bytes of peak RSS a key, {listed['cached']} entries left in s3fs's cache; CPU ms a key: "
                f"moto {ls.moto_cpu / n * 1e3:.2f}, the listing process {listed['cpu_listing'] / n * 1e3:.2f}",
            )
        )

        # prepare from S3: killed half way, run again; uninterrupted; then from the local folder.
        argv = ["prepare", url, str(work / "s3.h5"), "--resolution", "32", "--workers", str(args.workers)]
        total = -(-n // 256)
        with Phase(moto) as killed:
            k = run_child(argv, work, kill_at_parts=total // 2, parts=work / ".s3.h5.parts")
        rows.append(
            (
                "prepare from S3, SIGKILLed",
                f"{killed.seconds:.1f}",
                killed.shown(),
                f"{k['parts']} of {total} parts kept",
            )
        )
        with Phase(moto) as resumed:
            r = run_child(argv, work)
        rows.append(
            (
                "prepare from S3, the same command again",
                f"{r['seconds']:.1f}",
                resumed.shown(),
                f"resumed {r['resumed']} files; peak RSS {r['rss_mb']:.0f} MB (a worker {r['worker_rss_mb']:.0f})",
            )
        )
        with Phase(moto) as whole:
            w = run_child([*argv[:2], str(work / "s3-whole.h5"), *argv[3:]], work)
        rows.append(
            (
                "prepare from S3, uninterrupted",
                f"{w['seconds']:.1f}",
                whole.shown(),
                f"{n / w['seconds']:.0f} img/s; CPU ms a file: moto {whole.moto_cpu / n * 1e3:.1f}, prepare's "
                f"process {w['cpu'] / n * 1e3:.1f}, its workers {w['worker_cpu'] / n * 1e3:.1f}; peak RSS "
                f"{w['rss_mb']:.0f} MB (a worker {w['worker_rss_mb']:.0f})",
            )
        )
        moto_rss = moto.rss_mb()
    finally:
        moto.stop()
    loc = run_child([argv[0], str(work / "imgs"), str(work / "local.h5"), *argv[3:]], work)
    rows.append(
        (
            "prepare from the local copy",
            f"{loc['seconds']:.1f}",
            "-",
            f"{n / loc['seconds']:.0f} img/s; CPU ms a file: prepare's process {loc['cpu'] / n * 1e3:.1f}, its "
            f"workers {loc['worker_cpu'] / n * 1e3:.1f}; peak RSS {loc['rss_mb']:.0f} MB (a worker "
            f"{loc['worker_rss_mb']:.0f})",
        )
    )

    from bigbatch.data import read_meta

    hashes = {name: read_meta(work / f"{name}.h5")["content_hash"] for name in ("s3", "s3-whole", "local")}
    print(f"moto's process held {moto_rss:.0f} MB at the end; load average {os.getloadavg()[0]:.1f}\n")
    print("| phase | seconds | requests moto answered | |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    saved = w["seconds"] - r["seconds"]
    print(f"\nresume: {saved:.0f} s of {w['seconds']:.0f} s saved ({saved / w['seconds']:.0%})")
    for name, h in hashes.items():
        print(f"content hash, {name}: {h}")
    # What the listing and the reads must be at any count: pages of 1,000 keys (and the two probes of
    # whether the prefix is a file), no request per file beyond its one GET, the resume reading only the rest.
    pages = -(-n // 1000)
    checks = {
        "the same content hash from S3 (resumed, uninterrupted) and from the local copy": len(set(hashes.values()))
        == 1,
        f"the listing in {pages} pages (+2 probes)": ls.requests["ListObjectsV2"] <= pages + 2,
        "one GET a file, no HEAD a file": whole.requests["GetObject"] == n and whole.requests["HeadObject"] <= 2,
        "the run again read only the files its parts lacked": resumed.requests["GetObject"] == n - r["resumed"] > 0,
    }
    for what, ok in checks.items():
        print(f"{'ok' if ok else 'FAILED'}: {what}")
    if not all(checks.values()):
        raise SystemExit(1)
    if args.out is None:
        import shutil

        shutil.rmtree(work)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(int(sys.argv[2]))
    elif sys.argv[1:2] == ["--child"]:
        child(sys.argv[3:], Path(sys.argv[2]))
    else:
        main()
