"""The training loop: one function, read top to bottom, for every task. Progress is counted in images
taken from the data feed; everything due (log rows, previews, checkpoints, evaluation) falls due on
image counts, so a resumed run and one of another world size do the same things at the same points."""

from __future__ import annotations

import gc
import os
import shlex
import time
import traceback
from contextlib import closing, suppress
from pathlib import Path
from typing import Literal

import torch

from bigbatch import checkpoint_find
from bigbatch.batching import (
    describe_compile,
    describe_plan,
    eager_fallback,
    plan_micro_batch,
    replicator_for,
    warn_under_group,
)
from bigbatch.config import Config
from bigbatch.data.load import training_data
from bigbatch.data.loader import DataReadError
from bigbatch.data.schedule import Phase, schedule_of
from bigbatch.engine import compile_cache, dist
from bigbatch.engine.arguments import SkipLimitReached
from bigbatch.engine.determinism import global_rngs_kept, run_kernels
from bigbatch.engine.replicator import Replicator
from bigbatch.errors import STOPPED_BY_SIGNAL, BigbatchError, warn
from bigbatch.metrics_file import truncate_metrics
from bigbatch.models.registry import builder, is_own
from bigbatch.progress import Progress
from bigbatch.provenance import code_version
from bigbatch.rundir import Run, check_replicas, open_run
from bigbatch.signals import EvaluationStopped, StartupStopped, Stopped, StopRequest, stop_signals
from bigbatch.tasks import Feed, build_task
from bigbatch.urls import local_folder


def train(
    cfg: Config, run_dir: str | Path | None = None, resume: bool | Literal["auto"] = False, quiet: bool = False
) -> Path:
    """Train what `cfg` describes into `run_dir` (default runs/<name>-NNNNN); return the run directory. Stopped by
    Ctrl-C or SIGTERM, it saves where it is and raises bigbatch.Stopped (a KeyboardInterrupt; `.run` is the run).
    `resume`: continue the run in `run_dir` (its config must be `cfg`, but for its length and output
    cadences); "auto": continue it if `run_dir` holds one, else start it. `quiet`: no progress bar, log
    lines or probe table; the line saying where it trains, the last line (done, or stopped and how to
    continue) and warnings stay.

    Under torchrun every process calls this; rank 0 alone writes the run directory."""
    if not isinstance(cfg, Config):
        raise BigbatchError(
            f"train takes a Config (bigbatch.preset(NAME) or Config.from_dict), got {type(cfg).__name__}"
        )
    if run_dir is not None and not isinstance(run_dir, (str, os.PathLike)):  # (found from outside: a TypeError)
        raise BigbatchError(f"run_dir must be a path (a str or a Path), got {type(run_dir).__name__} {run_dir!r}")
    if run_dir is not None:
        run_dir = local_folder(run_dir, "run_dir", "train")
    if resume not in (True, False, "auto") or not isinstance(resume, (bool, str)):  # (1 == True: refused too)
        raise BigbatchError(f'resume must be True, False or "auto" (start or resume), got {resume!r}')
    cfg = Config.from_dict(cfg.to_dict())  # checked whole: a config changed field by field from Python too
    # SIGTERM (and SIGINT once training runs) from here on: save a checkpoint and stop (Stopped). SIGINT during
    # start-up stops at once (KeyboardInterrupt), leaving nothing behind but what a resume can use.
    # The run's kernels, from before the device is set up to its end: deterministic ones (train.deterministic),
    # else cuDNN's autotuned ones (not under a memory budget, which its trials' workspaces would pass).
    # Under train.compile "auto", a graph that fails to compile runs eagerly.
    autotune = not cfg.train.memory_budget
    with stop_signals() as stop, run_kernels(cfg.train.deterministic, autotune), eager_fallback(cfg):
        rep = replicator_for(cfg)
        try:
            # The run directory: a new one, or the run to resume (whose config must agree with cfg), locked.
            run = open_run(cfg, run_dir, resume)
            try:  # (the global generators, which each micro-batch seeds and a resume sets, put back after it)
                with global_rngs_kept(rep.device):
                    return _train(run, rep, quiet, stop)
            except BaseException as e:
                # The traceback holds _train's frame and with it the task's DDP wrappers: they must go
                # before rep.close() destroys the process group (one freed after it can hang the exit).
                traceback.clear_frames(e.__traceback__)
                if isinstance(e, Exception):  # (not a stop: Stopped and Ctrl-C are KeyboardInterrupts)
                    run.record_failure(e)
                raise
            finally:
                run.close()
        finally:
            # What the run left in reference cycles (its task, models, optimizers, batches on the device: torch's
            # lazy imports keep a first run's frames in one) goes now, not at the collector's next pass in a later
            # run (a sweep's next trial, which finds the GPU's memory taken) or in a fork, where a CUDA tensor freed
            # aborts it (found by review); before the process group goes, as the DDP wrappers must.
            try:
                gc.collect()
            finally:  # (a second Ctrl-C in the collection: the process group goes still)
                rep.close()
            if torch.cuda.is_initialized():
                torch.cuda.empty_cache()


def _train(run: Run, rep: Replicator, quiet: bool, stop: StopRequest) -> Path:
    cfg, main = run.cfg, rep.is_main
    code_version()  # (the sources this process runs, as its checkpoints name them: read now, not after an upgrade)
    # A user's own family: the command line knows it where BIGBATCH_IMPORT names its module; not one of a script's.
    prefix = _cli_prefix(cfg.model.name)
    own_family = f"{cfg.model.name!r} is registered (in the script: a module of its own, named by BIGBATCH_IMPORT, "
    own_family += "lets the command line build it)"

    # The task: data, models, optimizers and averages, all random draws decided by train.seed. Built
    # before anything is written, so a bad config leaves nothing behind.
    data = training_data(cfg)
    run.check_data(data)  # on resume: the images the run was trained on
    try:
        task = build_task(cfg, rep, data, run=run.path, resumed_at=run.resumed_at, quiet=quiet)
    except StartupStopped as e:  # (one process: in the reference statistics, before the first step)
        if main:
            kept = f" ({e})" if str(e) else ""
            print(
                f"{STOPPED_BY_SIGNAL} while computing reference statistics{kept}; nothing trained since the start: the "
                "same command starts it again",
                flush=True,
            )
        raise Stopped(run.path, "nothing trained since the start: the same call starts it again") from None
    nimg, seconds = run.restore(task, rep) if run.checkpoint else (0, 0.0)
    if differ := dist.ranks_differing(task.nets()):  # (found from outside: a rank given another train.init_from
        # trained on, to be refused at the first checkpoint as a failing device, all of it lost)
        ranks = f"rank {', '.join(map(str, differ))} starts from other weights than rank 0"
        start = f"the checkpoint {run.checkpoint}" if run.checkpoint else f"train.init_from {cfg.train.init_from}"
        if run.checkpoint or cfg.train.init_from:
            fix = "give every rank the same files (a path of each node's own must hold the same weights)"
            raise BigbatchError(f"{ranks} (this rank's: of {start}): {fix}")
        raise BigbatchError(  # (a new run: its initialisation drew from what train.seed does not decide)
            f"{ranks}, initialised from train.seed: a model family's initialisation must draw from torch's generator "
            "alone (seeded alike on every rank), not the time, the process or its own generator"
        )
    if run.resumed and run.checkpoint is None and main:  # a run stopped before its first checkpoint: anew
        truncate_metrics(run.path / "metrics.jsonl", 0)
    if rep.micro_batch_pending:  # micro_batch "auto", not settled by the checkpoint resumed
        prepared = [plain for plain, _ in rep.models]
        resident = [m for m in task.nets().values() if not any(m is p for p in prepared)]  # (G_ema: found from outside)
        plan_micro_batch(rep, task.probe, verbose=main and not quiet, resident=resident)
        if main:
            warn_under_group(cfg, rep.plan.micro_batch)
    progress = Progress(run, rep, nimg, seconds, run.resumed, quiet, getattr(task, "monitored", None))
    if main:
        run.write_start(rep)
        if run.checkpoint:
            was = run.length_before
            if was is not None and cfg.train.kimg > was:  # (found from outside: --resume=auto with its --preset
                said = getattr(task, "lengthened", lambda was, nimg: "")(was, nimg)  # (found from outside: unsaid)
                warn(f"train.kimg {was:g} -> {cfg.train.kimg:g}: the run trains on to {cfg.train.kimg:g} kimg{said}")
            print(f"Resuming {run.path} from {run.checkpoint.name} ({nimg / 1000:.3f} kimg)", flush=True)
            run.write_previews(task, nimg, at_checkpoint=True, missing=True)
            if run.log_window and run.log_window.get("sheet_pending"):  # (its write failed: found by review)
                run.write_previews(task, nimg, at_checkpoint=False, missing=True)
        plan = f"{describe_plan(cfg, rep.plan)}; {'channels-last' if rep.channels_last else 'NCHW'}"
        plan += getattr(task, "rate_said", str)()  # (a classifier's rate scaled to the batch)
        if rep.compile:  # (the first step says how much came from the cache)
            plan += f"; {describe_compile(cfg)}, cache {compile_cache.in_use()}"
        # (found from outside: 600 kimg on a folder of 540 images, 1,111 epochs, was not said in any unit but kimg)
        fed = len(getattr(task, "feed_data", data))  # (xseg's src and dst faces: found from outside, src's alone)
        epochs = f" ({cfg.train.kimg * 1000 / fed:,.4g} epochs of {fed:,} images)" if fed else ""
        # (found from outside: 0.1 kimg at batch 64 trained 0.128, said only when it was done)
        end = schedule_of(cfg).end(progress.total, getattr(task, "d_steps", 1))
        ends = f"{end / 1000:.3f}".rstrip("0").rstrip(".")  # (:g kept 6 digits: 100000.032 said as 100000)
        epochs += f"; its last step ends at {ends} kimg" if end > progress.total else ""
        if run.resumed and nimg >= progress.total:  # (found from outside: "Training ..." of a run at its end)
            print(f"{run.path} has trained its {cfg.train.kimg:g} kimg: nothing to train (a longer train.kimg "
                  "trains it on)", flush=True)  # fmt: skip
        else:
            print(f"Training {cfg.name} in {run.path}: {plan}; {cfg.train.kimg:g} kimg{epochs}", flush=True)
        if fed and (largest := max(p.batch for p in schedule_of(cfg).phases)) > fed:  # (found from outside: unsaid)
            warn(f"a step's batch of {largest:,} is more than the {fed:,} images trained on: it holds some repeated")
        if cfg.eval.best and not cfg.eval.every_kimg:  # (found from outside: silent)
            warn(
                f"eval.best={cfg.eval.best!r} keeps no checkpoints/best/: nothing is scored while the run trains "
                "(eval.every_kimg is 0); set eval.every_kimg, or score its checkpoints with `bigbatch eval` after"
            )

    # From here (the "Training" line said) a first SIGINT saves a checkpoint, as SIGTERM does; a second one stops at
    # once. (Found from outside: armed after the first batch sheet was drawn, a Ctrl-C on that line saved nothing.)
    stop.armed = True

    def due(every_kimg: float, before: int) -> bool:
        every = max(1, round(every_kimg * 1000))
        return nimg // every > before // every or nimg >= progress.total

    def scores_due(before: int) -> bool:  # (eval.every_kimg, finer from eval.fine_from_kimg)
        return cfg.eval.count(nimg) > cfg.eval.count(before) or nimg >= progress.total

    schedule = schedule_of(cfg)
    resizes = len({p.resolution for p in schedule.phases}) > 1

    def announce_phase(at: int, phase: Phase) -> None:
        size = f"{phase.resolution}px, " if resizes else ""
        begun = schedule.begins()[schedule.phases.index(phase)]
        if main:
            run.record_phase(at, phase.resolution or cfg.data.resolution, rep.plan, resumed_inside=at > begun)
        if at > begun:  # resumed inside it: its batch sheet was written when it began
            progress.say(
                f"kimg {at / 1000:g}: resumed inside the data.schedule phase begun at {begun / 1000:g} kimg: "
                f"{size}{rep.plan.describe()}"
            )
            return
        # (found from outside: "auto" fitted the first phase's whole share, then accumulated at it; not a divisor a
        # D's groups took: review)
        held, planned = "", max((p.micro_batch for p in rep.probes if p.fits), default=0)
        if rep.plan.accumulation > 1 and rep.plan.micro_batch == planned == schedule.phases[0].batch // rep.world_size:
            held = f" (micro_batch 'auto' planned the first phase's whole share, {planned}, which fitted, and keeps "
            held += "it; for larger micro-batches give train.micro_batch)"
        progress.say(f"kimg {at / 1000:g}: data.schedule phase begins: {size}{rep.plan.describe()}{held}")
        if main:  # what the models are fed from here on
            run.write_batch_sheet(task, at)

    if main and nimg == 0:  # a look at what the models are fed, before the first step
        run.write_batch_sheet(task, 0)

    # A write that fails on rank 0 (a full disk) stops every rank, not rank 0 alone: at once in one process,
    # after one more step under torchrun (the ranks' vote is read an iteration late: dist.StopVote), which
    # writes nothing more; the first error is the one raised.
    failed: BaseException | None = None
    sheet_pending = False  # (rank 0's failed write was a sample sheet's: in the checkpoints written since, for the
    # resume; one process can still save its weights)

    def evaluate() -> bool:
        """Score the task (every rank) and log it, keeping the best (rank 0); False if a stop cut it short."""
        nonlocal failed
        try:
            scores = task.scorer()
        except EvaluationStopped:  # (one process only: several finish, their collectives must meet)
            progress.tell(f"kimg {nimg / 1000:g}: evaluation stopped by the signal; the resumed run makes it")
            return False
        if main and failed is None:
            try:
                progress.scores(nimg, task.steps, scores)
                if task.scorer.improved(scores):
                    run.save_best(task, rep, nimg, progress.seconds(), scores)
            except (BigbatchError, OSError) as e:
                failed = e
        return True

    def save_stopped(previews: bool = True) -> tuple[Path, str]:
        """Save where the run is, as a stop does: the checkpoint (and its previews), and the command that continues
        from it."""
        path = run.save(task, rep, nimg, progress.seconds(), window(), stopped=True)
        if previews:
            run.write_previews(task, nimg, at_checkpoint=True)
        resume_with = f"{prefix}bigbatch train --run-dir {shlex.quote(str(run.path))} --resume"
        if prefix is None:  # (a script's own family: the command line cannot build it)
            resume_with = f"bigbatch.train(cfg, run_dir={str(run.path)!r}, resume=True), where {own_family}"
        elif rep.world_size > 1:  # (under torchrun or a launcher: the command that started it, as many ranks)
            resume_with = f"{resume_with}, started as this run was ({rep.world_size} processes)"
        return path, resume_with

    def window() -> dict:
        """The log row under way, and whether an evaluation due was cut short, or a sample sheet due not written
        (the resumed run makes them)."""
        pending = {"eval_pending": True} if eval_pending else {}
        return {**progress.window.state(), **pending, **({"sheet_pending": True} if sheet_pending else {})}

    # An evaluation due at the checkpoint resumed, which a stop cut short: made first (and recorded made).
    eval_pending = bool(run.log_window and run.log_window.get("eval_pending")) and task.scorer is not None
    if eval_pending:
        eval_pending = not evaluate()
        if not eval_pending and main and nimg >= progress.total and failed is None:
            run.save(task, rep, nimg, progress.seconds(), window(), replace=True)  # (no longer pending)

    # Train.
    crop_scale = getattr(task, "loader_crop_scale", 0.0)  # crops the task has the loader cut before decoding
    order = getattr(task, "data_order", None)  # the task's own order of its data (the swap task's by yaw)
    data = getattr(task, "feed_data", data)  # what the task reads through the feed (the xseg task's faces, joined)
    feed = Feed(data, schedule, rep, cfg, start=nimg, on_phase=announce_phase, crop_scale=crop_scale, order=order)
    compiling = compile_cache.CompileWatch() if rep.compile else None  # what the first step compiles, and from where
    vote = dist.StopVote()  # several processes: every rank stops (saves) at the same iteration, none waiting for it
    # checkpoint.every_minutes: rank 0 asks for a checkpoint once that long has passed since its last one (or since
    # training began in this process), once until it is written (the vote answers an iteration late).
    every_s, saved_at, asked, checkpoint = cfg.checkpoint.every_minutes * 60, time.monotonic(), False, False
    eval_s = 0.0  # how long the last evaluation took (in this process)
    with closing(feed), closing(vote):
        while nimg < progress.total:
            ask = main and not asked and 0 < every_s <= time.monotonic() - saved_at
            halt, timed = vote(stop.requested or failed is not None, ask)
            asked |= ask
            # (several processes: asked an iteration ago, and answered now; a checkpoint since was the one asked for)
            timed = timed and not (checkpoint and rep.world_size > 1)
            if halt:
                break
            # One iteration of the task, on the feed's next batches (data.schedule sets their size).
            began, before, applied = time.perf_counter(), nimg, _steps_applied(rep)
            try:
                stats = task.step(feed)
            except DataReadError as e:
                # The data could not be read (a network store gone, a file cut short) before this iteration changed
                # anything: one process saves where it is, as a stop does, and the run resumes to the weights of
                # one left alone (found from outside: a run ended on the error saved nothing). Several processes
                # cannot (the others wait in the step's collectives): their last checkpoint stands.
                if failed is not None:  # (rank 0's write failed before: that first)
                    progress.close()
                    raise failed from None
                if rep.world_size > 1 or _steps_applied(rep) != applied:
                    raise
                check_replicas(task, nimg)  # (finite weights)
                path, resume_with = save_stopped()
                progress.close()
                raise BigbatchError(f"{e}; saved {path}. Once it reads again, continue with: {resume_with}") from None
            except SkipLimitReached as e:  # (its last row logged, skipped steps counted: found from outside, lost)
                if main and failed is None:
                    with suppress(BigbatchError, OSError):  # (the iteration that raised, not yet counted: found
                        progress.log(feed.nimg, task.steps + 1)  # from outside, its row took the one before's number)
                progress.close()
                if failed is not None:
                    raise failed from None
                raise e if not main or checkpoint_find.published(run.path) else BigbatchError(e.unsaved) from None
            nimg = feed.nimg
            progress.add(time.perf_counter() - began, before, nimg, stats)
            if compiling is not None:  # the models compiled in the first step: how long it took, how much was cached
                compiled, compiling = compiling.compiled(time.perf_counter() - began), None
                progress.say(f"First step compiled: {compiled.describe()}")
                if main:
                    run.record(compiled=compiled.to_dict())

            # Rank 0's log row, where due, before an evaluation's: a stop that cuts the evaluation short leaves the
            # rows in the order of a run left alone (the resumed run logs the evaluation after this row).
            if main and failed is None and due(cfg.train.log_every_kimg, before):
                try:
                    progress.log(nimg, task.steps)
                except (BigbatchError, OSError) as e:
                    failed = e
            checkpoint = timed or due(cfg.checkpoint.every_kimg, before)
            # Evaluation, where due, on every rank (they share the work); rank 0 logs it and keeps the best. A
            # checkpoint due with it, or one checkpoint.every_minutes would ask for before it ends (as long as the
            # last took), is written first, its evaluation pending: a resume from it makes the evaluation (found
            # from outside: killed in evaluations, a run lost its training since the checkpoint before each time).
            # Only the run's last is written again once it is made.
            evaluating, first, save = task.scorer is not None and scores_due(before), False, checkpoint
            sheet_due = bool(cfg.sample.every_kimg) and due(cfg.sample.every_kimg, before)
            if evaluating:
                # Several processes: a stop asked for before it begins leaves it to the resumed run, every rank
                # agreeing (found from outside: a stop that came just before it waited for the whole evaluation,
                # minutes at eval.n 50,000; the vote answers an iteration late). One process stops inside it.
                if rep.world_size > 1 and not dist.agree(not stop.requested):
                    eval_pending = True
                    break
                # (rank 0's clock: whether it would ask during the evaluation, as long as the last took)
                first = checkpoint or (
                    every_s > 0 and dist.agree(not main or time.monotonic() - saved_at + eval_s >= every_s)
                )
                if first:
                    check_replicas(task, nimg)  # several processes: every rank holds rank 0's weights
                    if main and failed is None:
                        try:
                            eval_pending = True  # (in the checkpoint: a resume from it makes the evaluation)
                            run.save(task, rep, nimg, progress.seconds(), window())
                            run.write_previews(task, nimg, at_checkpoint=True)
                            saved_at, asked = time.monotonic(), False
                            if sheet_due:  # (found from outside: killed in the evaluation, its grid was never drawn)
                                sheet_due = False
                                run.write_previews(task, nimg, at_checkpoint=False)
                        except (BigbatchError, OSError) as e:
                            failed = e
                scoring = time.monotonic()
                eval_pending = not evaluate()
                eval_s = time.monotonic() - scoring
                save = first and nimg >= progress.total and not eval_pending  # (the run's last: its evaluation made)
                checkpoint = first  # (written: the next iteration's timed vote is not for another)
            elif checkpoint:
                check_replicas(task, nimg)  # several processes: every rank holds rank 0's weights
            if not main or failed is not None:
                continue
            try:
                # Rank 0's output, where due: previews, a checkpoint.
                if sheet_due:
                    try:
                        run.write_previews(task, nimg, at_checkpoint=False)
                    except (BigbatchError, OSError) as e:  # (one process saves where it is as it stops: found from
                        failed, sheet_pending = e, True  # outside, its training since the last checkpoint was lost;
                        # several keep to their last, as for any failed write)
                if save:
                    run.save(task, rep, nimg, progress.seconds(), window(), replace=evaluating)
                    if failed is None and not evaluating:  # (those of one written before its evaluation: with it)
                        try:
                            run.write_previews(task, nimg, at_checkpoint=True)
                        except (BigbatchError, OSError) as e:  # (saved just now: said with the command that goes
                            failed, sheet_pending = e, True  # on, found from outside; the resume draws them)
                    saved_at, asked = time.monotonic(), False
            except (BigbatchError, OSError) as e:
                failed = e
        # Stopped by a signal (or rank 0's failed write): every rank checks the weights (a collective: rank 0
        # too, which then raises its failure; found from outside, a stop saved weights a step made inf).
        stopped = nimg < progress.total or eval_pending  # (a stop in the last evaluation: the resumed run makes it)
        try:
            if stopped:
                check_replicas(task, nimg)
        except BigbatchError:
            if failed is None:
                progress.close()
                raise
            sheet_pending = False  # (weights not to save)
        if failed is not None and sheet_pending and rep.world_size == 1:  # (a sheet's write failed: weights saved)
            try:
                if not stopped:  # (the run's last step: checked as every save is)
                    check_replicas(task, nimg)
                path, resume_with = save_stopped(previews=False)
            except (BigbatchError, OSError):
                pass  # (weights not finite, or storage that refuses the checkpoint too: the last one stands)
            else:
                progress.close()
                raise BigbatchError(f"{failed}; saved {path}. Once it writes again, continue with: {resume_with}")
        if failed is not None:
            progress.close()
            raise failed
        if stopped and main:  # save where we are
            path, resume_with = save_stopped()
            print(f"{STOPPED_BY_SIGNAL}; saved {path}. Continue with: {resume_with}", flush=True)
    progress.close()
    if stopped:
        raise Stopped(run.path)
    if main:
        if prefix is None:  # (found from outside: `bigbatch sample` said "names no GAN model family")
            usage = f"Load it from Python (bigbatch.load_generator, load_classifier), where {own_family}"
        else:
            usage = task.usage.format(run=shlex.quote(str(run.path))).replace("bigbatch ", f"{prefix}bigbatch ")
        counts = rep.counters().items()
        if skips := [f"{c['failed']} of its {c['steps']} {name} steps" for name, c in counts if c["failed"]]:
            # (found from outside: a run that skipped 31 of its 32 steps ended as one that trained)
            warn(f"{' and '.join(skips)} were skipped: their loss or gradients were not finite")
        print(f"Done: {run.path} ({nimg / 1000:.3f} kimg). {usage}", flush=True)
    return run.path


def _steps_applied(rep: Replicator) -> int:
    """The optimizer steps the Replicator has taken (skipped ones too), over its optimizers."""
    return sum(state.steps for state in rep.optimizers.values())


def _cli_prefix(name: str) -> str | None:
    """What a command line for a run of family `name` begins with: "" (bigbatch's own), "BIGBATCH_IMPORT=MODULE "
    (a user's, registered by MODULE), or None (one a script registered itself, which no command line can import)."""
    if is_own(name):
        return ""
    module = builder(name).__module__
    return None if module == "__main__" else f"BIGBATCH_IMPORT={shlex.quote(module)} "
