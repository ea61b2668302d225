"""Progress output of rank 0: metrics.jsonl rows and TensorBoard scalars, a progress bar with img/s and
ETA (or a line per log row when stderr is not a terminal), and the averages between two log rows."""

from __future__ import annotations

import contextlib
import math
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from bigbatch.engine.replicator import Replicator
from bigbatch.errors import silence, warn
from bigbatch.metrics_file import read_metrics
from bigbatch.rundir import Run
from bigbatch.signals import request_stop

NOT_SCORES = ("eval_seconds", "eval_n", "eval_resolution")  # what an evaluation's row holds beside its scores


def _quiet_tensorboard_thread() -> None:
    """TensorBoard's writer thread re-raises a failed write (a full disk) after handing it to the writer, whose
    next call raises it where Progress sees it: that thread's own traceback is left unprinted."""
    hook = threading.excepthook
    if getattr(hook, "_bigbatch", False):
        return

    def quiet(args: threading.ExceptHookArgs) -> None:
        if not (type(args.thread).__name__ == "_AsyncWriterThread" and issubclass(args.exc_type, OSError)):
            hook(args)

    quiet._bigbatch = True  # type: ignore[attr-defined]
    threading.excepthook = quiet


class Window:
    """The iterations between two log rows: mean of each scalar the task reported (non-finite values,
    such as a skipped step's gradient norm, left out; those of AT_ROW as they are at the row), optimizer
    steps skipped, images per second."""

    # A state, not a step's measure: ADA's p now, as StyleGAN2-ADA logs it; the side a classifier's last step
    # trained at (data.schedule's phases; found from outside: no row said it, as FFCV's log does)
    AT_ROW = frozenset({"augment_p", "resolution"})

    def __init__(self, rep: Replicator) -> None:
        self.rep, self.seconds, self.images, self.sums, self.counts = rep, 0.0, 0, {}, {}
        self.skipped_before = {name: c["skipped"] for name, c in rep.counters().items()}

    def add(self, seconds: float, images: int, stats: dict[str, float]) -> None:
        self.seconds += seconds
        self.images += images
        for k, v in stats.items():
            if not math.isfinite(v):
                continue
            if k in self.AT_ROW:
                self.sums[k], self.counts[k] = v, 1
            else:
                self.sums[k] = self.sums.get(k, 0.0) + v
                self.counts[k] = self.counts.get(k, 0) + 1

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the row under way: the sums and counts, and the steps skipped so far
        (its seconds and images per second are this process's own)."""
        skipped = {n: c["skipped"] - self.skipped_before.get(n, 0) for n, c in self.rep.counters().items()}
        return {"sums": dict(self.sums), "counts": dict(self.counts), "skipped": skipped}

    def resume(self, state: dict[str, Any]) -> None:
        """Go on with the row a checkpoint kept (`state`), after the engine's counters were restored."""
        self.sums = {str(k): float(v) for k, v in state.get("sums", {}).items()}
        self.counts = {str(k): int(v) for k, v in state.get("counts", {}).items()}
        counters = self.rep.counters()
        for n, done in state.get("skipped", {}).items():
            if n in counters:
                self.skipped_before[n] = counters[n]["skipped"] - int(done)

    def row(self) -> dict[str, float]:
        means = {k: self.sums[k] / self.counts[k] for k in self.sums}
        counters = self.rep.counters()
        skipped = {f"skipped_{n}": c["skipped"] - self.skipped_before.get(n, 0) for n, c in counters.items()}
        scales = {f"loss_scale_{n}": c["loss_scale"] for n, c in counters.items() if "loss_scale" in c}
        return {**means, **skipped, "img_per_s": self.images / max(self.seconds, 1e-9), **scales}


class Progress:
    """Where rank 0 reports: RUN/metrics.jsonl, RUN/tb/ and the terminal (nothing on other ranks)."""

    def __init__(
        self,
        run: Run,
        rep: Replicator,
        nimg: int,
        seconds: float,
        resumed: bool,
        quiet: bool,
        monitor: Callable[[], tuple[dict[str, float], dict[str, float]]] | None = None,
    ):
        """`monitor`: the task's values of a log row (its `monitored`): those of the row, and TensorBoard's alone."""
        self.run, self.rep, self.main, self.monitor = run, rep, rep.is_main, monitor
        self.began = time.perf_counter() - seconds  # a resumed run's clock goes on from its checkpoint
        self.quiet = quiet or not self.main
        self.total = run.cfg.train.images
        self.tb = None
        rows = read_metrics(run.path / "metrics.jsonl") if self.main and resumed else []
        # An evaluation's seconds, the last one's, for the ETA (found from outside: it left out the evaluations)
        self.eval_s = next((float(r["eval_seconds"]) for r in reversed(rows) if "eval_seconds" in r), None)
        if self.main:
            from torch.utils.tensorboard import SummaryWriter

            _quiet_tensorboard_thread()
            try:
                # A resumed run drops the events logged at and past its checkpoint (purge_step is the first step
                # purged) and logs its rows at the checkpoint again as metrics.jsonl keeps them (found from outside:
                # an evaluation made again at the checkpoint was two points there).
                self.tb = _event_writer(SummaryWriter, run.path / "tb", nimg if resumed else None)
                at = [row for row in rows if round(row["kimg"] * 1000) == nimg] if resumed else []
                for row in at:
                    self._tb_row(nimg, row)
                # TensorBoard's alone of a log row there (each spectrally normalized layer's sigma), of the weights
                # restored (found from outside: each resume left them out at its checkpoint)
                if monitor is not None and any(k.startswith("sv_max_") for row in at for k in row):
                    for k, v in monitor()[1].items():
                        self.tb.add_scalar(f"sv/{k}", v, nimg)
            except OSError as e:
                self._drop_tb(e)
        self.bar = tqdm(
            total=self.total,
            initial=min(nimg, self.total),
            unit="img",
            unit_scale=True,
            dynamic_ncols=True,
            disable=self.quiet or not sys.stderr.isatty(),
            desc=run.cfg.name,
        )
        self.window = Window(rep)
        if resumed and run.log_window:  # the row under way at the checkpoint: its sums go on
            self.window.resume(run.log_window)
        self.losses: set[str] = set()  # the task's losses seen so far: shown with each row ("-" if all skipped)

    def seconds(self) -> float:
        """Wall time of training so far, summed over the run's resumes (from the checkpoints kept)."""
        return time.perf_counter() - self.began

    def where(self, nimg: int, step: int) -> dict[str, Any]:
        """What every metrics.jsonl row begins with: kimg, the task's step, seconds of training."""
        return {"kimg": round(nimg / 1000, 3), "step": step, "seconds": round(self.seconds(), 3)}

    def say(self, text: str) -> None:
        """A line for the user (rank 0, unless quiet)."""
        if not self.quiet:
            show(text)

    def tell(self, text: str) -> None:
        """A line of how the run ends, as its last line is (rank 0, quiet too: found from outside, --quiet hid an
        evaluation cut short)."""
        if self.main:
            show(text)

    def add(self, seconds: float, before: int, nimg: int, stats: dict[str, float]) -> None:
        """One iteration from `before` to `nimg` images."""
        self.window.add(seconds, nimg - before, stats)
        self.bar.update(min(nimg, self.total) - min(before, self.total))

    def log(self, nimg: int, step: int) -> None:
        """The row of the iterations since the last one (and a printed line without a progress bar)."""
        shown, apart = self.monitor() if self.monitor is not None else ({}, {})
        row = {**self.where(nimg, step), "batch": self.rep.batch, **self.window.row(), **shown}
        self.write(nimg, row, {f"sv/{k}": v for k, v in apart.items()})
        self.window = Window(self.rep)
        self.losses |= {k for k in row if k.startswith("loss") and not k.startswith("loss_scale")}
        self.losses |= {k for k in row if k.endswith("_loss")}  # (a swap's src_loss and dst_loss, DFL's per-sample
        # numbers: found from outside, its console showed only the batch's sum, as "loss")
        self.losses |= {"augment_p"} & row.keys()  # [augment]'s p, which ADA moves
        # (a loss not in the row, whose steps were all skipped, as "-": found from outside, "nan" read as diverged)
        shown = {k: f"{row[k]:.3f}" if k in row else "-" for k in sorted(self.losses)}
        self.bar.set_postfix(shown)
        if self.bar.disable and not self.quiet:
            eta = max(0, self.total - nimg) / max(row["img_per_s"], 1e-9)  # the last step may pass the end
            eta += self.evals_left(nimg) * self.eval_s if self.eval_s else 0.0  # (none seen yet: none counted)
            losses = "  ".join(f"{k} {v}" for k, v in shown.items())
            total = self.run.cfg.train.kimg
            places = max(1, min(4, 1 - math.floor(math.log10(total)))) if total > 0 else 1  # 0.032/0.064, 1.2/30
            for written in (f"{total:g}", f"{self.run.cfg.train.log_every_kimg:g}"):
                if "." in written and "e" not in written:  # as many places as the total and the log's step have:
                    places = max(places, min(4, len(written.split(".")[1])))  # 0.128/0.128, 0.576 then 0.640
            show(
                f"kimg {row['kimg']:.{places}f}/{total:g}  {losses}  {rate(row['img_per_s'])} img/s"
                + (f"  ETA {format_seconds(eta)}" if row["img_per_s"] > 0 else "")  # (a row of no step: none)
            )

    def evals_left(self, nimg: int) -> int:
        """The evaluations still due after `nimg` images: eval.every_kimg's (eval.count) and the run's end's, at most
        one a step left (a step that passes several of eval.fine_every_kimg's scores once: found by review)."""
        e = self.run.cfg.eval
        if not e.every_kimg or nimg >= self.total:
            return 0
        due = e.count(self.total) - e.count(nimg) + (e.count(self.total) == e.count(self.total - 1))
        return min(due, -(-(self.total - nimg) // max(1, self.rep.batch)))

    def scores(self, nimg: int, step: int, scores: dict[str, float]) -> None:
        self.eval_s = float(scores["eval_seconds"])
        self.write(nimg, {**self.where(nimg, step), **scores})
        shown = "  ".join(f"{k} {v:.4g}" for k, v in scores.items() if k not in NOT_SCORES)
        self.say(f"kimg {nimg / 1000:g}  {shown}  ({scores['eval_seconds']:.0f} s)")

    def write(self, nimg: int, row: dict[str, Any], tb_only: dict[str, float] | None = None) -> None:
        """A row of metrics.jsonl, and TensorBoard's scalars of it and of `tb_only` (a model's layers)."""
        self.run.log(row)
        if self.tb is None:
            return
        try:
            self._tb_row(nimg, row)
            for k, v in (tb_only or {}).items():
                self.tb.add_scalar(k, v, nimg)
        except OSError as e:  # TensorBoard's copy of the log: the run goes on without it, metrics.jsonl holds all
            self._drop_tb(e)

    def _tb_row(self, nimg: int, row: dict[str, Any]) -> None:
        """A metrics.jsonl row as TensorBoard's scalars at `nimg` images."""
        assert self.tb is not None
        for k, v in row.items():
            if k not in ("kimg", "step", "seconds", "eval_n"):
                self.tb.add_scalar(k, v, nimg)
        self.tb.add_scalar("kimg", row["kimg"], nimg)
        self.tb.flush()

    def _drop_tb(self, e: OSError) -> None:
        tb, self.tb = self.tb, None
        warn(f"TensorBoard's log in {self.run.path / 'tb'} stopped ({e.strerror or e}); metrics.jsonl goes on")
        try:
            if tb is not None:
                tb.close()
        except OSError:
            pass

    def close(self) -> None:
        self.bar.close()
        if self.tb is not None:
            try:
                self.tb.close()
            except OSError as e:
                self._drop_tb(e)


def _event_writer(writer: Any, folder: Path, purge_step: int | None) -> Any:
    """A SummaryWriter into `folder` whose event file sorts after those there. TensorBoard reads a run's event files in
    the order of their names, which begin with the second each was made in: a resumed run's made in the same second
    as the one before it could sort first (its number 10 before 9), and its purge of the steps past its checkpoint be
    read before the steps it purges (found by the suite: each evaluation twice). Made again in the next second then."""
    before = {f.name for f in folder.glob("events.out.tfevents.*")}
    tb = writer(str(folder), purge_step=purge_step)
    ours = {f.name for f in folder.glob("events.out.tfevents.*")} - before
    if purge_step is None or not before or not ours or min(ours) > max(before):
        return tb
    tb.close()
    for name in ours:
        (folder / name).unlink(missing_ok=True)
    made = [int(m.group(1)) for name in before | ours if (m := re.match(r"[^\d]+(\d+)\.", name))]
    until = max(made, default=0) + 1
    if until > time.time() + 2:  # (another host's clock ahead, a name of the future: found by review, waited on)
        warn(f"{folder}: an event file is named after a time ahead of this clock; TensorBoard may show the steps "
             "past the checkpoint resumed beside those logged again")  # fmt: skip
        return writer(str(folder), purge_step=purge_step)
    while time.time() < until:
        time.sleep(0.05)
    return writer(str(folder), purge_step=purge_step)


def show(text: str) -> None:
    """A line on stdout. Its reader gone (`bigbatch train | head`, a closed `tee`), the run stops as on SIGTERM,
    saving where it is, and prints nothing more (found from outside: killed by the broken pipe, nothing saved)."""
    try:
        print(text, flush=True)
    except OSError:  # (BrokenPipeError, or EIO from a terminal hung up)
        with contextlib.suppress(OSError, ValueError):  # (a notebook's stdout has no file descriptor)
            silence(sys.stdout.fileno())
        request_stop()


def rate(img_per_s: float) -> str:
    """A rate in whole images a second, or two figures below 10 (found from outside: XSeg's 0.4 img/s on a CPU
    said as 0)."""
    return f"{img_per_s:.0f}" if img_per_s >= 10 else f"{img_per_s:.2g}"


def format_seconds(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
