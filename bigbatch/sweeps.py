"""Experiments as code: `bigbatch.sweep(base, grid, runs_dir)` trains every combination of the grid's
values, one run directory each, skipping runs that finished and resuming runs that were interrupted,
and writes a table of results (RUNS_DIR/results.csv and results.md). Locally the runs go one after
another; with a Dask client or "ray" as the launcher they go side by side on the cluster. With an
Optuna study as `search`, it samples `n_trials` configs instead and prunes runs on their evaluation
metric. `bigbatch sweep FILE.py` runs a plain Python file that calls it, as `python FILE.py` does."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import shlex
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bigbatch import checkpoints
from bigbatch.checkpoint_find import SWEEP_LOCK
from bigbatch.config import Config
from bigbatch.config_types import plain
from bigbatch.errors import BigbatchError, warn, warnings_off
from bigbatch.files import lock_folder, unlock_folder
from bigbatch.metrics_file import HIGHER_IS_BETTER, SCORES, read_metrics
from bigbatch.resuming import resume_changes, unresumable_changes
from bigbatch.signals import Terminated, sigterm_raises
from bigbatch.sweep_runs import Job, Stopped, complain, make_starter, mark_failed, say, side_by_side, train_here
from bigbatch.sweep_space import check_space, suggest
from bigbatch.sweep_table import (
    earlier_statuses,
    existing_folders,
    is_number,
    logged_scores,
    result_row,
    run_names,
    status,
    write_results,
)
from bigbatch.urls import local_folder


def sweep(
    base: Config,
    grid: dict[str, Any] | Callable[[Any], dict[str, Any]],
    runs_dir: str | Path,
    launcher: Any = "local",
    *,
    nprocs: int = 1,
    search: Any = None,
    n_trials: int | None = None,
    metric: str | None = None,
    quiet: bool = True,
) -> list[dict[str, Any]]:
    """Train `base` with every combination of `grid` (dotted config keys -> lists of values), each in
    RUNS_DIR/<key=value,...>; a run that finished is skipped, one that was interrupted resumes from its
    checkpoint (a run's config must still be the grid's: a changed base is refused by name).

    launcher: "local" (one run after another in this process), a dask.distributed Client or "ray"
    (`ray.init` first, or Ray's local default): runs side by side, `nprocs` ranks each, as many at a
    time as the cluster has workers (Dask) or CPUs/GPUs (Ray) for.

    search: an Optuna study (pip install optuna: bigbatch's extra [optuna]): `n_trials` runs instead of the grid's
    product, each config sampled by the study from `grid` (a list: one of its values; a (low, high)
    tuple: a number in that range, (low, high, "log") on a log scale, (low, high, step) on a step; or a function of
    the trial that returns the overrides, Optuna's define-by-run). Each evaluation reports `metric` (a metrics.jsonl
    name: fcd, fid, val_top1, ...) to the study, which may prune the run (it stops with a checkpoint);
    a trial's value is its run's best `metric`. Runs are RUNS_DIR/trial-NNNN-<hash of its config>.

    quiet: the runs' own output, of a local grid's runs (those of a launcher, or a search's, print none here); the
    sweep's line a run or trial is printed either way.

    Returns the rows this call wrote to RUNS_DIR/results.csv (earlier calls' rows stay in the file):
    per run, its values, status (finished, interrupted, failed, pruned), kimg, wall seconds, img/s,
    final losses and best scores. A run that fails does not stop the others; once all have ended the
    sweep raises BigbatchError naming those that failed."""
    _CALLS[0] += 1
    if not isinstance(base, Config):  # (found from outside: a dict's AttributeError, with its traceback)
        raise BigbatchError(
            f"sweep base must be a Config (bigbatch.preset(...), Config.load(...)), got {type(base).__name__}"
        )
    if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:  # (found from outside: 0 trained on)
        raise BigbatchError(f"sweep nprocs must be >= 1 (ranks per run), got {nprocs!r}")
    root = local_folder(runs_dir, "runs_dir", "a sweep")
    if root.exists() and not root.is_dir():  # (found from outside: "File exists")
        raise BigbatchError(f"sweep runs_dir {root} is a file: give a folder for the sweep's runs")
    if search is not None:
        return _search(base, grid, root, launcher, nprocs, search, n_trials, metric)
    if n_trials is not None or metric is not None:
        raise BigbatchError("n_trials and metric are for a search: give search=optuna.create_study(...) too")
    if not isinstance(grid, dict) or not grid:
        raise BigbatchError(
            "sweep grid must map dotted config keys to lists of values, e.g. {'train.batch': [64, 256]}"
        )
    grid = {key: plain(values) for key, values in grid.items()}  # (np.arange(...) is a list of its values)
    for key, values in grid.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise BigbatchError(f"sweep grid key {key!r} must map to a non-empty list of values, got {values!r}")
        # A tuple of numbers is a search's range (found from outside: in a grid, trained at its ends; its step's too,
        # found by review); other tuples are lists.
        ranged = isinstance(values, tuple) and all(isinstance(v, (int, float)) for v in values[:2])
        if ranged and (len(values) == 2 or len(values) == 3 and (values[2] == "log" or is_number(values[2]))):
            raise BigbatchError(
                f"sweep grid key {key!r} maps to a tuple {values!r}, a search's (low, high) range: give a grid a list "
                "of values, or sample the range with search=optuna.create_study(...)"
            )
        twice = [v for i, v in enumerate(values) if v in values[:i]]
        if twice:
            raise BigbatchError(f"sweep grid key {key!r} lists {twice[0]!r} more than once: give each value once")
    combos = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    named = zip(existing_folders(root, run_names(combos)), combos)
    jobs = [Job(root / name, combo, base.override(combo)) for name, combo in named]  # (each checked before training)
    # A Dask cluster's room first (found from outside: a batch was fixed for 3 ranks, then the cluster had 2 workers);
    # Ray's after the plans (ray.init starts it). Both before the table (found from outside: after it).
    starter = None if launcher in ("local", "ray") else make_starter(launcher, nprocs)
    for job in jobs:  # (a local sweep's runs train in this process, of its world size)
        _check_plan(job, None if launcher == "local" else nprocs)
    starter = make_starter(launcher, nprocs) if launcher == "ray" else starter
    with _one_sweep(root):
        for job in jobs:  # before anything trains: a run of this folder trained with another base is not this one
            _check_unchanged(job)
        todo, last = [], earlier_statuses(root)
        for i, job in enumerate(jobs):
            state = status(job.run, job.cfg)
            # (found from outside: a run that failed in the last call was said to be interrupted)
            failed_last = state != "finished" and last.get(job.run.name) == "failed"
            shown = "failed last time: trying it again" if failed_last else state
            say(f"[{i + 1}/{len(jobs)}] {job.run.name}: {shown}")
            if state != "finished":
                todo.append(job)
            else:
                _say_kept(job)
        with _table_on_stop(root, jobs, lambda stopped: "run the sweep again to resume it"):
            # (the table as each run ends: found from outside, a sweep killed by SIGKILL had written none)
            if launcher == "local":
                for job in todo:
                    train_here(job, quiet)
                    _table(root, jobs)
            else:
                side_by_side(iter(todo), starter, ended=lambda job: _table(root, jobs))
        rows = _finish(root, jobs, _table(root, jobs))
        done, before = sum(r.get("status") == "finished" for r in rows), len(jobs) - len(todo)
        said = f" ({before} before this call)" if before else ""
        said += f"; {len(jobs) - done} not (interrupted)" if done < len(jobs) else ""
        print(f"Sweep {root}: {done} of {len(jobs)} runs finished{said}; results in {root / 'results.md'}", flush=True)
        return rows  # (found from outside: a sweep run again once done said nothing at all)


@contextlib.contextmanager
def _table_on_stop(root: Path, jobs: list[Job], again: Callable[[list[str]], str]) -> Iterator[None]:
    """A sweep stopped (Ctrl-C, SIGTERM, bigbatch stop) or failed still writes its table: the runs that finished,
    the one stopped as interrupted, those not begun as new; and says which runs it stopped and how they go on."""
    try:
        with sigterm_raises():  # (in a script as from the CLI)
            yield
    except BaseException as e:
        if jobs:  # (a search refused before its first trial: no table of nothing)
            _table(root, jobs)
        if isinstance(e, Stopped) or not isinstance(e, (KeyboardInterrupt, Terminated)):
            raise  # (Stopped: its run has said where it stopped)
        # (not a trial pruned in this call: found from outside, named as stopped)
        stopped = [
            j.run.name for j in jobs if j.began and not (j.failed or j.pruned) and status(j.run, j.cfg) == "interrupted"
        ]
        what = f"stopped at {', '.join(stopped)}" if stopped else "stopped"
        by = "SIGTERM" if isinstance(e, Terminated) else "Ctrl-C"
        complain(f"bigbatch sweep: {what} (by {by}); {again(stopped)}")
        raise Stopped from None  # (found from outside: SIGTERM to a search wrote no table and said only that)


@contextlib.contextmanager
def _one_sweep(root: Path) -> Iterator[None]:
    """Hold RUNS_DIR/.sweep.lock while a sweep runs in it: a second sweep into the same folder would find
    the first one's runs in use, call them failed and write its table over the first one's."""
    made = not root.exists()
    root.mkdir(parents=True, exist_ok=True)
    said = "{} is in use by another sweep ({}); wait for it to end, or give this one another RUNS_DIR"
    lock = lock_folder(root, SWEEP_LOCK, lambda folder, pid, held_by: said.format(folder, held_by))
    try:
        yield
    finally:
        # (a folder this sweep made and left empty, refused before its first run, goes: found from outside, a
        # folder of a lock alone was left)
        empty = made and [p.name for p in root.iterdir()] == [SWEEP_LOCK]
        unlock_folder(lock, remove=empty)
        if empty:
            with contextlib.suppress(OSError):  # (something came meanwhile: an NFS .nfsXXXX; not the error to show)
                root.rmdir()


def _table(root: Path, jobs: list[Job]) -> list[dict[str, Any]]:
    """The jobs' rows, written to RUNS_DIR/results.csv and results.md."""
    rows = [result_row(job.run, job.values, job.cfg, job) for job in jobs]
    write_results(root, rows)
    return rows


def _finish(root: Path, jobs: list[Job], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The table's rows; a grid's failed runs raised, a search's warned of unless all failed (a study's FAIL, as
    Optuna's catch leaves it: found from outside, the search's best and the caller's code after went unsaid, unrun)."""
    if failed := [job for job in jobs if job.failed]:
        names = "; ".join(f"{job.run.name}: {job.failed}" for job in failed)
        said = f"{len(failed)} of {len(jobs)} sweep runs failed ({names}); see {root / 'results.md'}"
        if not any(job.trial is not None for job in jobs) or len(failed) == len(jobs):
            raise BigbatchError(said)
        warn(said)
    return rows


def _search(
    base: Config,
    space: Any,
    root: Path,
    launcher: Any,
    nprocs: int,
    study: Any,
    n_trials: int | None,
    metric: str | None,
) -> list[dict[str, Any]]:
    """sweep(..., search=study): n_trials configs sampled by the Optuna study, pruned on `metric`."""
    try:
        import optuna
    except ImportError:
        raise BigbatchError("a sweep's search needs Optuna: pip install optuna (bigbatch's extra [optuna])") from None
    if not isinstance(study, optuna.Study):
        raise BigbatchError(f"search must be an optuna.Study (optuna.create_study(...)), got {type(study).__name__}")
    if not isinstance(n_trials, int) or isinstance(n_trials, bool) or n_trials < 1:
        raise BigbatchError(f"a search needs n_trials, the number of runs to sample (>= 1), got {n_trials!r}")
    if not isinstance(metric, str) or not metric:
        raise BigbatchError("a search needs metric, the metrics.jsonl name to optimize, e.g. 'fcd' or 'val_top1'")
    if len(study.directions) != 1:
        raise BigbatchError("a search optimizes one metric: create the study with one direction")
    sets = ("eval.", "task", "train.labels")  # (what decides the scores logged: where sampled, each trial's check)
    if isinstance(space, dict) and not any(str(k).startswith(sets) for k in space):
        _check_metric(base, metric)  # (found from outside: "fid is better lower" first, then "not a score they log")
    if metric in SCORES:
        want = "maximize" if metric in HIGHER_IS_BETTER else "minimize"
        if study.direction.name.lower() != want:
            raise BigbatchError(
                f"{metric} is better {'higher' if want == 'maximize' else 'lower'}: "
                f"create the study with direction={want!r}"
            )
    if not callable(space) and (not isinstance(space, dict) or not space):
        raise BigbatchError(
            "a search's space maps dotted config keys to lists or (low, high) ranges, or is a "
            "function of the Optuna trial returning the overrides"
        )
    if not callable(space):
        space = {key: plain(spec) for key, spec in space.items()}  # (np.logspace(...) is a list of its choices)
        check_space(base, space)
    jobs: list[Job] = []

    def trials() -> Iterator[Job]:
        while len(jobs) < n_trials:
            trial = study.ask()
            try:
                values = space(trial) if callable(space) else {k: suggest(trial, k, v) for k, v in space.items()}
            except BaseException:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                raise
            digest = hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:8]
            job = Job(root / f"trial-{trial.number:04d}-{digest}", dict(values), base, trial=trial)
            try:
                job.cfg = base.override(values)
            except BigbatchError as e:  # (a value its key never takes: the space's to mend; found from outside: no
                study.tell(trial, state=optuna.trial.TrialState.FAIL)  # trial named)
                raise BigbatchError(f"the search's trial {trial.number} sampled {values}: {e}") from None
            # A config this trial sampled whose batch plan training refuses (a batch its micro-batch does not divide)
            # is the study's FAIL, and the search goes on (found from outside: the whole search stopped at it); what
            # it refuses of the base too, the search's error.
            try:
                _check_plan(job, None if launcher == "local" else nprocs)
            except BigbatchError as e:
                if _refused(Job(job.run, {}, base), None if launcher == "local" else nprocs):
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    raise
                jobs.append(job)
                said = str(e).removeprefix(f"the sweep's run {job.run.name}: ")
                mark_failed(job, BigbatchError(f"sampled {values}: {said}"))
                tell(job)
                continue
            try:  # (found from outside: a search of another base into RUNS_DIR took its runs, and called them failed)
                _check_unchanged(job)
                _check_metric(job.cfg, metric)
            except BigbatchError:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                raise
            jobs.append(job)
            trial.set_user_attr("run", str(job.run))  # (its run folder, where Optuna's dashboard shows the trial)
            if status(job.run, job.cfg) == "finished":  # (a search run again samples its finished trials again: found
                say(f"[{len(jobs)}/{n_trials}] {job.run.name}: {values}: finished before")  # from outside, each was
                _say_kept(job)  # started, trained nothing and left a new TensorBoard file; told, as a grid's are,
                tell(job)  # that it is kept at its own length and scores)
                continue
            say(f"[{len(jobs)}/{n_trials}] {job.run.name}: {values}")
            yield job

    def watch(job: Job, handle: Any) -> None:
        """Report each new evaluation to the study, as its step the evaluation's number (1, 2, ...:
        runs with other batches evaluate at other image counts, and pruners compare equal steps; found
        from outside: numbered by image count, batch 64's first evaluation was batch 50's second)."""
        total = job.cfg.train.images
        for step, row in enumerate((r for r in list(handle.rows) if "eval_seconds" in r), 1):
            value = row.get(metric)
            nimg = round(row["kimg"] * 1000)
            if not is_number(value) or step in job.reported or job.pruned:
                continue
            job.reported.add(step)
            job.trial.report(float(value), step)
            say(f"bigbatch sweep: {job.run.name}: {metric} {float(value):g} at kimg {row['kimg']:g}")  # (found from
            # outside: nothing was said while a trial trained, for hours in README's example)
            # (not a run that has reached its end: it is complete, whatever the pruner says)
            if nimg < total and not handle.done() and job.trial.should_prune():
                job.pruned = True
                handle.stop(wait=False)  # with a checkpoint: it can still be resumed by hand

    def tell(job: Job) -> None:
        if not job.told:
            job.told = True
            _tell(study, job, metric, optuna.trial.TrialState)
            _table(root, jobs)  # (as each trial ends: found from outside, a search killed by SIGKILL had written none)

    starter = make_starter(launcher, nprocs)

    def again(stopped: list[str]) -> str:  # (found from outside: a literal RUN, where a grid's line names it)
        run = shlex.quote(str(root / stopped[0])) if len(stopped) == 1 else "RUN"
        return (  # (found from outside: a trial resumed by hand is not told to the study)
            "run the search again to go on (a new study of the same seeded sampler resumes the stopped trial, one kept "
            f"in storage samples new ones), or `bigbatch train --run-dir {run} --resume` with a stopped run alone"
        )

    with _one_sweep(root):
        try:
            with _table_on_stop(root, jobs, again):
                # Each trial told as its run ends (found from outside: told all at the search's end, no trial had
                # completed when the next was sampled, so TPE sampled at random and the pruner never pruned).
                side_by_side(trials(), starter, watch, ended=tell)
        finally:
            for job in jobs:
                tell(job)
        _say_search_end(root, rows := _table(root, jobs), study, jobs, metric)
        return _finish(root, jobs, rows)


def _say_search_end(root: Path, rows: list[dict[str, Any]], study: Any, jobs: list[Job], metric: str) -> None:
    """A search's last line, as a grid's: how its trials ended, and its best (found from outside: it said nothing)."""
    ended = [r.get("status") for r in rows]
    counts = ", ".join(f"{ended.count(s)} {s}" for s in ("pruned", "failed", "interrupted") if ended.count(s))
    try:
        best = study.best_trial
        name = next((j.run.name for j in jobs if j.trial is not None and j.trial.number == best.number), None)
        said = f"; best {name or f'trial {best.number}'}: {metric} {best.value:g}"
    except ValueError:  # (no trial completed)
        said = ""
    done = ended.count("finished")
    print(
        f"Search {root}: {done} of {len(rows)} trials finished{f' ({counts})' if counts else ''}{said}; results in "
        f"{root / 'results.md'}",
        flush=True,
    )


def _check_metric(cfg: Config, metric: str) -> None:
    """A search's metric is one its runs log, while they train (found from outside: a misspelt one was found
    after every trial had trained, each told as failed; a misspelt one was said second)."""
    names = logged_scores(cfg)
    if names and metric not in names:
        raise BigbatchError(
            f"a search's metric {metric!r} is not a score these runs log ({', '.join(dict.fromkeys(names))}): give "
            "one of those, or set eval.metrics (eval.extractor) to score it"
        )
    if not cfg.eval.every_kimg:
        raise BigbatchError(
            f"a search follows {metric!r} as its runs score it, every eval.every_kimg, which is 0 (nothing scored): "
            "set eval.every_kimg"
        )


def _tell(study: Any, job: Job, metric: str, states: Any) -> None:
    """Tell the study how a trial ended: pruned, failed (or cut short), or its run's best `metric`."""
    rows = [r for r in read_metrics(job.run / "metrics.jsonl") if "eval_seconds" in r and is_number(r.get(metric))]
    values = [float(r[metric]) for r in rows]
    finished = status(job.run, job.cfg) == "finished"
    with_value = values and finished and not job.failed
    try:
        if job.pruned:
            study.tell(job.trial, state=states.PRUNED, skip_if_finished=True)
        elif with_value:
            best = max(values) if study.direction.name == "MAXIMIZE" else min(values)
            study.tell(job.trial, best, skip_if_finished=True)
        else:
            if finished and not job.failed:
                logged = {k for r in read_metrics(job.run / "metrics.jsonl") if "eval_seconds" in r for k in r}
                logged = sorted(logged & set(SCORES))
                said = f"it logged {', '.join(logged)}" if logged else "nothing was scored: set eval.every_kimg"
                warn(f"{job.run.name} has no {metric!r} in its metrics.jsonl ({said})")
            study.tell(job.trial, state=states.FAIL, skip_if_finished=True)
    except Exception as e:  # noqa: BLE001 - the study's storage failing: the other trials are still told
        warn(f"could not tell the study how {job.run.name} ended: {type(e).__name__}: {e}")


def _check_unchanged(job: Job) -> None:
    """A run already in the sweep's folder must have been trained with the config the sweep now gives it
    (as on resume): a finished run of another base would be skipped and reported as this one's."""
    done = checkpoints.complete_checkpoints(job.run)
    saved = done[-1] / "config.toml" if done else job.run / "config.toml"
    if not saved.is_file():
        return
    if shown := unresumable_changes(saved, job.cfg, recovery=False):
        raise BigbatchError(
            f"the sweep's run {job.run} was trained with another config than this sweep gives it, in {shown}: for a "
            "sweep of another base, give it another RUNS_DIR"
        )


def _check_plan(job: Job, nprocs: int | None) -> None:
    """A run's batch plan on the sweep's `nprocs` ranks (None: this process's; its arithmetic only), and what a new
    run's start refuses of its config, before any run trains (found from outside: a grid's micro-batch that did not
    divide its batch, and a GAN's eval.n in a classifier's, failed each run as its turn came)."""
    from bigbatch.batching import describe_plan
    from bigbatch.tasks.interface import check_new_run

    try:
        with warnings_off():
            describe_plan(job.cfg.override({"train.device": "cpu"}), world_size=nprocs)
            if not (job.run / "config.toml").is_file():
                check_new_run(job.cfg)
    except BigbatchError as e:
        raise BigbatchError(f"the sweep's run {job.run.name}: {e}") from None


def _refused(job: Job, nprocs: int | None) -> bool:
    """Whether _check_plan refuses `job`."""
    try:
        _check_plan(job, nprocs)
    except BigbatchError:
        return True
    return False


def _say_kept(job: Job) -> None:
    """A finished run that trained past the sweep's train.kimg, or was scored with other eval settings than the
    sweep's, is kept as it is: said (found from outside: a sweep run again shorter, or with eval.n raised,
    tabulated the runs of before beside the new ones, without a word)."""
    saved = checkpoints.complete_checkpoints(job.run)[-1] / "config.toml"
    own = Config.load(saved)
    if own.train.images > job.cfg.train.images:
        warn(
            f"{job.run.name} trained to its own train.kimg={own.train.kimg:g}, past this sweep's "
            f"{job.cfg.train.kimg:g}: its row is of its own length (give another RUNS_DIR for runs of this length)"
        )
    scoring = {k: v for k, v in resume_changes(saved, job.cfg).items() if k.startswith("eval.") and k not in UNSCORED}
    if not job.cfg.eval.every_kimg:  # (nothing scored by this sweep either: its settings beside the point)
        scoring = {}
    if scoring and not any("eval_seconds" in r for r in read_metrics(job.run / "metrics.jsonl")):
        warn(  # (found from outside: "was scored with its own ..." of a run that logged no score)
            f"{job.run.name} was not scored (its own eval.every_kimg was {own.eval.every_kimg:g}): its "
            "row has no scores (give another RUNS_DIR for runs scored so)"
        )
    elif scoring:
        shown = ", ".join(f"{k}={old!r} (this sweep: {new!r})" for k, (old, new) in scoring.items())
        warn(
            f"{job.run.name} was scored with its own {shown}: its row's scores are of those (give another RUNS_DIR "
            "for runs scored so)"
        )


UNSCORED = ("eval.batch_size", "eval.best")  # eval settings a run's scores do not depend on


def run_file(path: str | Path, args: Sequence[str] = ()) -> None:
    """`bigbatch sweep FILE.py [ARGS]`: run the sweep file as a script (it calls bigbatch.sweep), with
    sys.argv as `python FILE.py ARGS` would give it."""
    import runpy

    path = Path(path)
    if path.is_dir():  # (found from outside: "does not exist")
        raise BigbatchError(f"sweep file {path} is a folder: give the Python file that calls bigbatch.sweep")
    if not path.is_file():
        raise BigbatchError(f"sweep file {path} does not exist; give a Python file that calls bigbatch.sweep")
    if path.suffix.lower() != ".py":  # (found from outside: a results.csv read as Python, a NameError's traceback)
        raise BigbatchError(f"sweep file {path} is not Python source (not a .py): give a .py that calls bigbatch.sweep")
    argv, calls, search = sys.argv, _CALLS[0], sys.path[:]
    sys.argv = [str(path), *args]
    sys.path.insert(0, str(path.resolve().parent))  # (as python FILE.py: found from outside, its own modules beside it
    try:  # were not found)
        runpy.run_path(str(path), run_name="__main__")
    except SyntaxError as e:
        if e.lineno is None:  # (not text: a data file given by mistake)
            raise BigbatchError(
                f"sweep file {path} is not Python source ({e.msg}): give a .py that calls bigbatch.sweep"
            ) from None
        raise BigbatchError(f"sweep file {path}, line {e.lineno}: {e.msg}") from None
    finally:
        sys.argv, sys.path[:] = argv, search
    if _CALLS[0] == calls:
        warn(f"sweep file {path} ran without calling bigbatch.sweep: nothing was trained")


_CALLS = [0]  # calls of sweep() in this process (run_file tells a sweep file that never made one)
