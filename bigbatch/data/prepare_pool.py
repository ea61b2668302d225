"""`bigbatch prepare`'s decoding: the files of a listing decoded (and encoded) in worker processes, in listing
order, a remote source's bytes fetched by threads ahead of them; each PART files' results kept as they come, so
that a killed prepare resumes from them."""

from __future__ import annotations

import errno
import hashlib
import multiprocessing
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from bigbatch.data import codecs
from bigbatch.data.h5write import CannotWrite, cannot_write
from bigbatch.data.listing import Interrupted
from bigbatch.data.parts import PART, DamagedPart, Parts, Result
from bigbatch.data.sources import Listing, OutOfMemory, decode_or_reason, file_stamp
from bigbatch.errors import BigbatchError
from bigbatch.signals import die_with_parent, forking
from bigbatch.urls import Location, is_url

WATCH_S = 1.0  # how often a wait for a chunk's result looks whether a worker died
CHUNK = 32  # files per task sent to a worker: big enough to amortise the hand-off, small enough to balance
FETCHERS = 4  # threads fetching chunks of a remote source at once (each chunk's files concurrently too)

_worker: dict[str, Any] = {}


def _init_worker(listing_source: Any, decoding: dict[str, Any], parent: int | None = None) -> None:
    """Set up a decoding process. A pool's workers (`parent`: the main process's PID) ignore SIGTERM and
    SIGINT (sent to the whole process group by a terminal or a job scheduler): the main process stops
    them after their current chunk, or kills them where one died (`_kill_workers`: the pool's own SIGTERM does
    not end them). A worker killed while it writes a result leaves half a message in the pool's pipe, and the
    pool's manager thread waits for the rest forever, never saying the pool broke: the waits for results look at
    the workers themselves (`_watch`), and the pipe is closed under that thread (`_kill_workers`). A main process
    killed outright (SIGKILL) takes them with it."""
    if parent is not None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        die_with_parent(parent)
    _worker.clear()  # (a prepare before in this process, workers 0 or 1: its --face-type cut the next one's faces)
    _worker.update(source=listing_source, **decoding)


def _decode_chunk(payload: list[Any]) -> list[Result]:
    """In a worker: read the files (local sources) or take the bytes (remote), then decode them."""
    source = _worker["source"]
    data = source.read(payload) if source.worker_reads else payload
    w = _worker
    args = w["resolution"], w["ratios"], w["alpha"], w["dfl"], w["whole"]
    out = [decode_or_reason(d, *args, yaw=True, cut_to=w.get("cut_to")) for d in data]
    codec, quality = w["codec"]
    if codec == "raw":
        return out
    return [r if isinstance(r, str) else (r[0], codecs.encode(r[1], codec, quality), *r[2:]) for r in out]


@contextmanager
def decoded(
    listing: Listing, workers: int, decoding: dict[str, Any], parts: Parts | None = None
) -> Iterator[Iterator[Result]]:
    """Decoded images (or reasons) in listing order, from `workers` processes (0 or 1: this one), as
    `decoding` says (resolution, ratios, the mask planes `decode` adds: alpha, dfl; whole; (codec,
    quality) to encode them with). Entered before the output file is opened, so
    that no worker inherits its handle. With `parts`, the results of each PART files are kept as they
    come and those a killed run kept are read back instead of decoded (`parts.resumed` counts them)."""
    source = listing.source
    n = len(listing.keys)
    todo = [k for k in range(-(-n // PART)) if parts is None or not parts.done(k)]
    spans = [
        (i, min(i + CHUNK, (k + 1) * PART, n)) for k in todo for i in range(k * PART, min((k + 1) * PART, n), CHUNK)
    ]
    chunks = [listing.keys[a:b] for a, b in spans]
    pool = fetcher = None
    started: dict[int, Any] = {}
    if workers > 1:
        # fork: workers start at once (spawn would re-import torch in each); they run only Pillow and file reads.
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        context = multiprocessing.get_context(method)
        pool = ProcessPoolExecutor(workers, context, initializer=_init_worker, initargs=(source, decoding, os.getpid()))
        with forking():
            pool.submit(int).result()  # start the workers now
        started = dict(getattr(pool, "_processes", None) or {})  # (their handles: a private field, read softly)
    else:
        _init_worker(source, decoding)
    if not source.worker_reads:
        # Remote bytes are fetched by threads here, several chunks ahead, while the workers decode.
        fetcher = ThreadPoolExecutor(FETCHERS)
    broken = False
    try:
        computed = _results(chunks, source, pool, fetcher, workers, lambda: _watch(started))
        yield computed if parts is None else _through_parts(computed, parts, n, set(todo))
    except BrokenProcessPool:  # (found from outside: a traceback, or a hang with the pool's shutdown below)
        broken = True
        raise _died(started) from None
    finally:  # also when stopped early (--strict, a size mismatch): drop the work not yet started
        manager = getattr(pool, "_executor_manager_thread", None)  # (read before the shutdown drops it)
        if broken:
            _kill_workers(pool, started)
        for executor in (pool, fetcher):
            if executor is not None:
                executor.shutdown(wait=not broken, cancel_futures=True)
        if broken and manager is not None:
            # The manager thread of a broken pool closes its wake-up pipe as it ends; Python's exit writes to that
            # pipe, and where the two met, a traceback followed the one-line error (found in the suite): it ends
            # here, the workers dead and its pipe closed (_kill_workers), or is left to the exit after a while.
            manager.join(timeout=5)


def _died(workers: dict[int, Any]) -> OutOfMemory:
    """A pool's worker died (the kernel's out-of-memory killer, mostly): one line, the parts kept for a rerun."""
    deadline = time.monotonic() + 1.0  # (the dead one reaped: found in the suite, its signal unsaid, not yet known)
    for p in workers.values():
        if p.exitcode is None:
            p.join(max(0.0, deadline - time.monotonic()))
    codes = [p.exitcode for p in workers.values() if p.exitcode is not None]
    how = next((f"killed by signal {-c}" for c in codes if c < 0), f"exited with status {codes[0]}" if codes else "")
    oom = ", as the kernel's out-of-memory killer does" if f"signal {int(signal.SIGKILL)}" in how else ""
    return OutOfMemory(
        f"a decoding worker died ({how or 'ended abruptly'}{oom}): run prepare again, with fewer --workers if memory "
        "is short"
    )


def _watch(workers: dict[int, Any]) -> None:
    """BrokenProcessPool where a worker has ended (the pool says so itself only where none died mid-message)."""
    if any(p.exitcode is not None for p in workers.values()):
        raise BrokenProcessPool("a worker ended")


def _kill_workers(pool: Any, started: dict[int, Any]) -> None:
    """The pool's workers still alive killed: they ignore SIGTERM (see `_init_worker`), so the pool's own ending of a
    broken pool waited for them forever, one of them blocked writing a result nobody reads (found from outside: a
    decoding worker killed by the out-of-memory killer left prepare hung at 100% CPU, deaf to SIGTERM)."""
    workers = {**started, **(getattr(pool, "_processes", None) or {})}.values()
    for process in workers:
        if process.exitcode is None:
            process.kill()
            process.join(timeout=5)  # (one in uninterruptible I/O dies when it ends: not waited for; review)
    # The pool's manager thread may wait for the rest of a message the dead worker cut short, which the exit of
    # Python joins forever (found by review): with the workers dead, closing this end too gives it an EOF.
    writer = getattr(getattr(pool, "_result_queue", None), "_writer", None)
    if writer is not None and all(p.exitcode is not None for p in workers):
        writer.close()


@contextmanager
def parts_kept_unless_refused(parts: Parts | None, out: Location) -> Iterator[None]:
    """The parts go once the data file is written, or when prepare is refused (a bad file with --strict);
    a prepare killed, interrupted, out of memory or out of disk keeps them to resume (found from outside: a full
    disk at the data file's end took hours of decoded parts with it)."""
    try:
        yield
    except Interrupted as e:  # (found by review: its parts went too; then, what a rerun keeps was not said)
        kept = ", and it resumes where it stopped (a new --resolution starts over)" if parts is not None else ""
        raise type(e)(f"{e}{kept or ' (a target on S3 keeps no parts: it starts over)'}") from None
    except DamagedPart:  # (the others kept: a rerun decodes that one anew)
        raise
    except BigbatchError as refused:
        e = refused.error if isinstance(refused, CannotWrite) else None  # (the data file's write: full, say)
        if parts is None or e is None or e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            if parts is not None:
                parts.remove()
            raise
        _out_of_disk(parts, out, e)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or parts is None:
            raise
        _out_of_disk(parts, out, e)
    if parts is not None:
        parts.remove()


def _out_of_disk(parts: Parts, out: Location, e: OSError) -> NoReturn:
    """A full disk (or a file size limit) while prepare writes: the parts kept whole stay for the rerun."""
    size = sum(f.stat().st_size for f in parts.folder.glob("part-*.npz")) / 2**20
    if not size:  # (none whole: nothing to resume from)
        parts.remove()
        raise cannot_write(out, e) from None
    raise BigbatchError(
        f"cannot write {out.name}: {e.strerror or e}; the images decoded so far are kept in {parts.folder} "
        f"({size:,.0f} MiB), and prepare run again resumes from them: free space there (the data file takes "
        "about as much again), or delete that folder to start over elsewhere"
    ) from None


def parts_of(listing: Listing, out: Path, settings: dict[str, Any]) -> Parts:
    """The parts folder of this command: what decides the decoded images (the files, in order, with
    their labels, and how they are decoded) keys it."""
    import bigbatch

    h = hashlib.sha256()
    for key, name in zip(listing.keys, listing.names):
        h.update(f"{key}\0{name}\0{listing.source.stamp(key)}\0".encode(errors="surrogateescape"))  # (non-UTF-8 names)
    h.update(np.ascontiguousarray(listing.labels, "<i8").tobytes())
    zipped = getattr(listing.source, "location", None)  # a local zip: its own size and time
    archive = file_stamp(str(zipped.path)) if zipped is not None and not zipped.url else ""
    key = {**settings, "files": h.hexdigest(), "classes": listing.class_names, "part": PART}
    key.update(version=bigbatch.__version__, archive=archive)
    return Parts(parts_folder(out), key)


def parts_folder(out: Path) -> Path:
    """Where a prepare into the local file `out` keeps its parts (.OUT.parts beside it)."""
    return out.with_name(f".{out.name}.parts")


def _through_parts(
    computed: Iterator[Any], parts: Parts, n: int, todo: set[int]
) -> Iterator[tuple[int, Any, str | None] | str]:
    """Every file's result in order: a kept part's read back, the others' decoded and kept."""
    for k in range(-(-n // PART)):
        if k not in todo:
            results = parts.load(k)
        else:
            results = [next(computed) for _ in range(min(PART, n - k * PART))]
            parts.save(k, results)
        yield from results


def _ordered(submit: Any, items: Iterable[Any], window: int, watch: Any = None) -> Iterator[Any]:
    """submit(item).result() for each item in order, with up to `window` in flight; `watch()` called every
    WATCH_S of a wait (to raise where the work cannot come)."""
    pending: deque[Future] = deque()

    def first() -> Any:
        future = pending.popleft()
        while watch is not None and not wait([future], WATCH_S).done:  # (not result(timeout): a TimeoutError the
            watch()  # work raised would look like the wait's, for ever; review)
        return future.result()

    for item in items:
        pending.append(submit(item))
        if len(pending) >= window:
            yield first()
    while pending:
        yield first()


def _results(
    chunks: list[list[str]], source: Any, pool: Any, fetcher: Any, workers: int, watch: Any
) -> Iterator[tuple[int, Any, str | None] | str]:
    payloads: Iterable[Any] = chunks
    if fetcher is not None:
        payloads = _ordered(lambda keys: fetcher.submit(source.read, keys), chunks, 2 * FETCHERS)
    if pool is None:
        for payload in payloads:
            yield from _decode_chunk(payload)
    else:
        for decoded in _ordered(lambda payload: pool.submit(_decode_chunk, payload), payloads, 2 * workers, watch):
            yield from decoded


def said_kept(out: str) -> None:
    """Say where a prepare into `out` stopped by a signal kept the images it had prepared, if it kept any."""
    if is_url(out):  # (a URL's output keeps no parts: prepare's parts_of call)
        return
    parts = parts_folder(Path(out))
    if parts.is_dir() and any(parts.iterdir()):
        print(f"bigbatch: the images prepared so far are kept in {parts}: the same command goes on from them",
              file=sys.stderr)  # fmt: skip
