"""A run started from Python (bigbatch.launch.dask.run, .ray.run, .local.run): a RunHandle that
streams the run's metrics rows and sample sheets back to the caller while it trains, stops it with a
checkpoint, and gives its result, as a notebook user needs to plot losses and look at samples as
they arrive and stop when the pictures are good enough:

    run = bigbatch.launch.dask.run(client, cfg, "runs/fashion")
    for update in run:                 # until the run ends
        if update.row: ...             # a metrics.jsonl row, as rank 0 wrote it
        if update.sheet: display(update.sheet)   # the newest sample sheet (a PNG)
        if good_enough: run.stop()     # every rank saves a checkpoint and exits
    result = run.result()              # RunResult; raises BigbatchError if the run failed
"""

from __future__ import annotations

import collections
import io
import json
import re
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from bigbatch.errors import STOPPED_BY_SIGNAL, BigbatchError
from bigbatch.launch import RankResult, with_restarts

Sink = Callable[[list[tuple[str, Any]]], None]
"""Where a launch sends what rank 0 publishes: ("out" | "err", line), ("row", dict),
("sheet", (name, PNG bytes)), ("reset", None)."""


@dataclass(frozen=True)
class SampleSheet:
    """A sample sheet the run wrote (RUN/samples/NAME); shows itself in a notebook."""

    name: str
    png: bytes

    def __repr__(self) -> str:  # (found from outside: printed, a sheet showed its whole PNG as bytes)
        return f"SampleSheet({self.name!r}, {len(self.png):,} bytes of PNG)"

    @property
    def kind(self) -> str:
        """What it shows: the first part of its name (grid-000012.345.png: "grid")."""
        return self.name.rsplit("-", 1)[0]

    @property
    def kimg(self) -> float:
        """The kimg it was drawn at (from its name, e.g. fakes-000012.345.png)."""
        found = re.search(r"(\d+)\.(\d{3})\.png$", self.name)
        return float(f"{found[1]}.{found[2]}") if found else float("nan")  # as the checkpoint names parse

    def image(self) -> Any:
        """The sheet as a PIL image."""
        from PIL import Image

        return Image.open(io.BytesIO(self.png))

    def save(self, path: str) -> None:
        with open(path, "wb") as f:
            f.write(self.png)

    def _repr_png_(self) -> bytes:
        return self.png


@dataclass(frozen=True)
class Update:
    """What came from the run since the last update: a metrics row or a new sample sheet."""

    row: dict[str, Any] | None = None
    sheet: SampleSheet | None = None


@dataclass(frozen=True)
class RunResult:
    run_dir: str
    status: int
    """0: the run reached its end, or was stopped and saved a checkpoint; 130 or 143: stopped (`stop`) before every
    rank could save, as in its start-up (it resumes from its last checkpoint)."""
    rows: list[dict[str, Any]]
    """Every row of its metrics.jsonl."""
    ranks: list[RankResult] = field(default_factory=list)
    stopped: bool = False
    """Whether it ended before its end, stopped (`stop`, or a signal to its ranks): it resumes from its last
    checkpoint; else it trained to train.kimg (found from outside: both were status 0, nothing else telling them
    apart, as Lightning's `interrupted` does)."""

    @property
    def final(self) -> dict[str, Any]:
        """The last training row logged (losses, img/s): the run's last kimg where it trained to its end (a stopped
        run saved its checkpoint where it stopped, after its last row)."""
        return next((r for r in reversed(self.rows) if "eval_seconds" not in r), {})

    @property
    def scores(self) -> dict[str, Any]:
        """The last evaluation row (fid, val_top1, ...), {} if none."""
        return next((r for r in reversed(self.rows) if "eval_seconds" in r), {})


class RunHandle:
    """A run under way (see the module's docstring). `rows`, `sheet` and `lines` are kept up to date
    whether or not anyone iterates; iterating yields each Update once (use one loop at a time)."""

    def __init__(
        self,
        run_dir: str,
        session: Callable[[Sink, threading.Event], list[RankResult]],
        restarts: int = 0,
        echo: bool = False,
    ) -> None:
        self.run_dir, self.echo = run_dir, echo
        self.rows: list[dict[str, Any]] = []
        self.sheet: SampleSheet | None = None
        """The newest sample sheet."""
        self.sheets: dict[str, SampleSheet] = {}
        """The newest sheet of each kind ("grid", "interp", ...: the file names' first part)."""
        self._lines: collections.deque[str] = collections.deque(maxlen=1000)
        # Updates not yet iterated; of the sheets, only each kind's newest waits (they can be large).
        self._pending: collections.deque[Update] = collections.deque()
        self._ended_all = False
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._replay: int | None = None  # after a reset: how many of `rows` the resent ones have matched
        self._stop = threading.Event()
        self._result: RunResult | None = None
        self._error: BaseException | None = None
        self._stopped_by_signal = False  # (of the last attempt: found from outside, a rank's stop before a restart
        # made a run trained to its end "stopped")

        def attempt() -> list[RankResult]:
            self._stopped_by_signal = False
            return self._ended(session(self._receive, self._stop))

        def main() -> None:
            try:
                status, message, ranks = with_restarts(attempt, restarts, self._say, self._stop.is_set)
                # A stop asked for that came before a rank could save (its start-up: nothing trained, nothing lost;
                # found from outside, raised as a failure) is the result asked for, its status saying so.
                if status != 0 and not (self._stop.is_set() and status in (130, 143)):
                    self._error = BigbatchError(message or f"the run ended with exit status {status}")
                stopped = status in (130, 143) or self._stopped_by_signal
                self._result = RunResult(run_dir, status, list(self.rows), ranks, stopped)
            except BaseException as e:  # noqa: BLE001 - given to whoever asks for the result
                self._error = e
            finally:
                with self._arrived:
                    self._ended_all = True
                    self._arrived.notify_all()

        self._thread = threading.Thread(target=main, name=f"bigbatch run {run_dir}", daemon=True)
        self._thread.start()

    @property
    def lines(self) -> list[str]:
        """Rank 0's last printed lines, up to 1,000 (and the launcher's restarts)."""
        return list(self._lines)

    def __iter__(self) -> Iterator[Update]:
        return self.updates()

    def updates(self, timeout: float | None = None) -> Iterator[Update]:
        """Each new metrics row and sample sheet as it arrives, until the run ends; with `timeout`,
        raise TimeoutError when nothing came for that many seconds."""
        while True:
            with self._arrived:
                if not self._arrived.wait_for(lambda: self._pending or self._ended_all, timeout):
                    raise TimeoutError(f"nothing from the run in {self.run_dir} for {timeout:g} s")
                if not self._pending:
                    return  # the run has ended, and every update was yielded
                update = self._pending.popleft()
            yield update

    def stop(self, wait: bool = True, timeout: float | None = None) -> RunResult | None:
        """Ask every rank to save a checkpoint and exit (as Ctrl-C on `bigbatch launch` does); with
        `wait`, return the result once they have."""
        self._stop.set()
        return self.result(timeout) if wait else None

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float | None = None) -> RunResult:
        """Wait for the run to end; its RunResult, or its error (BigbatchError naming the failed rank)."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the run in {self.run_dir} is still training after {timeout:g} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def __repr__(self) -> str:
        state = "running" if not self.done() else ("failed" if self._error else "done")
        kimg = self.rows[-1]["kimg"] if self.rows else 0.0
        return f"<RunHandle {self.run_dir}: {state}, {kimg:g} kimg, {len(self.rows)} rows>"

    def _ended(self, ranks: list[RankResult]) -> list[RankResult]:
        """After a launch: rows the resent file no longer holds (a resume dropped them) are dropped."""
        with self._lock:
            if self._replay is not None:
                del self.rows[self._replay :]
                self._replay = None
        return ranks

    def _say(self, line: str) -> None:
        self._receive([("err", line + "\n")])

    def _receive(self, items: list[tuple[str, Any]]) -> None:
        with self._lock:
            for kind, payload in items:
                if kind in ("out", "err"):
                    self._lines.append(payload.rstrip("\n"))
                    self._stopped_by_signal |= payload.startswith(STOPPED_BY_SIGNAL)
                    if self.echo:
                        print(payload, end="", file=sys.stdout if kind == "out" else sys.stderr, flush=True)
                elif kind == "reset":
                    self._replay = 0  # the rows come again from the first: only new ones are updates
                elif kind == "row":
                    self._row(payload)
                elif kind == "sheet":
                    self.sheet = SampleSheet(*payload)
                    self.sheets[self.sheet.kind] = self.sheet
                    older = [u for u in self._pending if u.sheet is not None and u.sheet.kind == self.sheet.kind]
                    for update in older:
                        self._pending.remove(update)
                    self._put(Update(sheet=self.sheet))

    def _row(self, row: dict[str, Any]) -> None:
        if self._replay is not None:
            if self._replay < len(self.rows) and _same(self.rows[self._replay], row):
                self.rows[self._replay] = row  # (the file's, its timings too)
                self._replay += 1
                return
            del self.rows[self._replay :]  # a resume dropped the rows past its checkpoint
            self._replay = None
        self.rows.append(row)
        self._put(Update(row=row))

    def _put(self, update: Update) -> None:
        self._pending.append(update)
        self._arrived.notify_all()


TIMINGS = ("seconds", "img_per_s", "eval_seconds")  # what a row trained again (bit for bit) has of its own


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The same row (NaN as NaN: a diverged loss is logged as NaN, which equals nothing), its timings aside: a
    restart trains the rows past its checkpoint again to the same values (found from outside: each came again as
    an update, a plot going back in kimg)."""
    a, b = ({k: v for k, v in r.items() if k not in TIMINGS} for r in (a, b))
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
