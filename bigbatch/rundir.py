"""The run directory: opening a new run or the one to resume (its config checked against the run's),
the start record (config.toml, plan.json), checkpoints of a task with the loop's state, restoring them,
and metrics.jsonl. Only rank 0 writes; every rank reads."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

import torch

from bigbatch import checkpoint_find, checkpoints
from bigbatch.config import Config
from bigbatch.engine import dist
from bigbatch.engine.replicator import Replicator
from bigbatch.engine.saving import restore_rng, rng_state
from bigbatch.errors import BigbatchError, first_line, warn
from bigbatch.files import (
    atomic_write,
    check_writable,
    held_by,
    json_loads,
    keep_lock,
    lock_folder,
    remove_stale,
    still_held,
    unlock_folder,
)
from bigbatch.metrics_file import truncate_metrics
from bigbatch.provenance import code_version
from bigbatch.ranks_agree import same_on_every_rank
from bigbatch.resuming import resume_changes, say_sums_reordered
from bigbatch.resuming import resume_config as resume_config  # (the CLI's, sweeps')
from bigbatch.run_data import relative_data
from bigbatch.sampling import save_png
from bigbatch.tasks.interface import Task
from bigbatch.urls import is_url, public_name


@dataclass
class Run:
    path: Path
    cfg: Config
    """The config the run trains with (on resume: the run's own, with the changes a resume may make)."""
    checkpoint: Path | None = None
    """The checkpoint a resumed run continues from (None: from the start)."""
    lock: IO | None = None
    """RUN/.lock, held (rank 0) while this process trains the run: one writer per run directory."""
    created: tuple[Path, ...] = ()
    """The folders this process made for the run, its own first, then any above it (removed if empty when it fails)."""
    resumed: bool = False
    """Whether it continues a run (from `checkpoint`, or from the start if it stopped before one)."""
    data: dict[str, str] | None = None
    """The training data's identity (path, content_hash), recorded in every checkpoint's meta.json."""
    log_window: dict[str, Any] | None = None
    """The log row under way at the checkpoint resumed from (progress.Window.state), to go on with."""
    saved: bool = False  # whether this process has saved a checkpoint of it yet
    started: bool = False  # whether this process wrote its start record (rank 0: its training began)
    length_before: float | None = None  # train.kimg of the checkpoint resumed from (_check_length read it)

    @property
    def resumed_at(self) -> int | None:
        """Images seen at the checkpoint resumed from (None for a new run)."""
        if self.checkpoint is None:
            return None
        return int((checkpoints.read_meta(self.checkpoint) or {}).get("nimg", 0))

    # ---- start -----------------------------------------------------------------------------------
    def write_start(self, rep: Replicator) -> None:
        """config.toml (which reproduces the run) and plan.json (the batch plan, as resolved)."""
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path / "config.toml", self.cfg.dumps())
        record = plan_record(rep, self.cfg)
        if self.resumed:
            before = read_plan(self.path)
            record |= self._history(before, record)
            say_sums_reordered(before, record)
        atomic_write(self.path / "plan.json", json.dumps(record, indent=1) + "\n")
        self.started = True

    def _history(self, before: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
        """What a resume keeps of plan.json (`before`; `now`: the new plan): the phases begun before its checkpoint,
        and "resumes", where each resume changed the config or the split, and what (found from outside: each as if the
        run had had it throughout, the phases before dropped, a new micro-batch or process count left no trace)."""
        at = (self.resumed_at or 0) / 1000
        kept = {
            key: [e for e in before.get(key, []) if isinstance(e, dict) and e.get(mark, math.inf) < at]
            for key, mark in (("phases", "from_kimg"), ("resumes", "at_kimg"))
        }
        changed = resume_changes(self.checkpoint / "config.toml", self.cfg) if self.checkpoint is not None else {}
        changed = {k: [_json(a), _json(b)] for k, (a, b) in changed.items()}
        split = () if self.cfg.data.schedule else ("micro_batch", "world_size")  # (phases record theirs as they begin)
        changed |= {k: [before[k], now[k]] for k in split if before.get(k, now[k]) != now[k]}
        this = code_version()
        wrote = (checkpoints.read_meta(self.checkpoint) or {}).get("bigbatch") if self.checkpoint is not None else this
        if wrote != this:
            changed["bigbatch"] = [wrote, this]
            by = f"bigbatch {wrote}" if wrote else "an earlier bigbatch (before versions were recorded)"
            warn(f"checkpoint {self.checkpoint.name} was written by {by}, and this is {this}: the run goes on, the "
                 "same as if left alone only where nothing it computes changed between them (plan.json's resumes "
                 "keep this)", once=True)  # fmt: skip
        kept["resumes"] += [{"at_kimg": at, "changed": changed}] if self.checkpoint is not None and changed else []
        return {k: v for k, v in kept.items() if v}

    def record(self, **keys: Any) -> None:
        """plan.json with `keys` set: "compiled" (what the first step compiled), "failed" (a failed run's last line)."""
        atomic_write(self.path / "plan.json", json.dumps({**read_plan(self.path), **keys}, indent=1) + "\n")

    def record_failure(self, e: Exception) -> None:
        """plan.json's "failed": the line the run failed with, which `info` says until the run starts again (found
        from outside: a run that failed read as one that had ended); not where another process took the run since."""
        said = first_line(e) if isinstance(e, BigbatchError) else f"{type(e).__name__}: {first_line(e)}"
        with contextlib.suppress(OSError, ValueError):  # (the failure is what is raised: nothing here masks it)
            if self.started and (self.lock is None or still_held(self.lock, self.path / LOCK)):
                self.record(failed=said)

    def record_phase(self, nimg: int, resolution: int, plan: Any, resumed_inside: bool = False) -> None:
        """plan.json's "phases": the split of each data.schedule phase as it began (found from outside: the file
        kept the first phase's alone, though a later one ran micro-batches of another size)."""
        path = self.path / "plan.json"
        record = json_loads(path.read_text())
        begun = {"from_kimg": nimg / 1000, "resolution": resolution, "batch": plan.batch}
        begun |= {"micro_batch": plan.micro_batch, "accumulation": plan.accumulation}
        kept = [p for p in record.get("phases", []) if p["from_kimg"] < nimg / 1000]
        # A resume inside a phase keeps its entry where its split is as it was (found by review: told apart by the
        # split alone, a new phase of the same split was taken for the one before going on)
        going_on = resumed_inside and kept and all(kept[-1].get(k) == v for k, v in begun.items() if k != "from_kimg")
        record["phases"] = kept if going_on else [*kept, begun]
        atomic_write(path, json.dumps(record, indent=1) + "\n")

    # ---- checkpoints -----------------------------------------------------------------------------
    def save(
        self,
        task: Task,
        rep: Replicator,
        nimg: int,
        seconds: float,
        log_window: dict[str, Any] | None = None,
        replace: bool = False,
        stopped: bool = False,
    ) -> Path:
        """The checkpoint at `nimg`, `seconds` into the run (all but the newest checkpoint.keep are deleted);
        `log_window`: the log row under way (so that a resumed run logs the rows an uninterrupted one does);
        `replace`: rewrite an intact checkpoint at `nimg` (its state changed though nothing trained); `stopped`: a
        stop's save, so its meta.json says (info tells a stopped run from a killed one by it)."""
        self.lock = keep_lock(self.lock, self.path, LOCK)  # (its .lock deleted meanwhile: taken again)
        info = {**task.model_info(), "data": self.data, "stopped": stopped, "seconds": round(seconds, 1)}
        info |= {"eval_pending": True} if (log_window or {}).get("eval_pending") else {}  # (for info: from outside)
        state = snapshot(task, rep, nimg, seconds)
        if not self.saved:  # (the first save since the run began here: what follows it on disk is another history)
            checkpoint_find.set_aside_newer(self.path, self.resumed_at or 0)
            self.saved = True
        if log_window is not None:
            state["log_window"] = log_window
        path = checkpoints.save_checkpoint(
            self.path, nimg, task.nets(), state, self.cfg.dumps(), self.cfg.checkpoint.keep, info, replace
        )
        return checkpoints.mark_stopped(path) if stopped else path  # (one kept as it was at nimg: a stop's since)

    def save_best(self, task: Task, rep: Replicator, nimg: int, seconds: float, scores: dict[str, float]) -> Path:
        """checkpoints/best/: the checkpoint at `nimg`, with the scores that made it the best."""
        assert task.scorer is not None
        info = {**task.model_info(), "data": self.data, "eval": scores, "best": task.scorer.best_record()}
        return checkpoints.save_best(
            self.path, nimg, task.nets(), snapshot(task, rep, nimg, seconds), self.cfg.dumps(), info
        )

    def check_data(self, data: Any) -> None:
        """Record the identity of `data`, the images of data.path the run trains on, and on resume refuse
        data that differ from the ones the checkpoint was trained on (the same images moved are fine)."""
        path = self.cfg.data.path
        self.data = {"path": public_name(path), "content_hash": str(data.content_hash)}
        if relative_data(self.cfg):  # (where a reader of the run finds a relative data path: bigbatch.run_data)
            self.data["folder"] = os.getcwd()
        same_on_every_rank(self.cfg, self.data["content_hash"], self.path / LOCK)
        if self.checkpoint is None:
            return
        meta = checkpoints.read_meta(self.checkpoint) or {}
        before = meta.get("data")
        if meta.get("converted_from") and not isinstance(before, dict):
            return  # (weights `convert` brought from elsewhere, trained on no data of this run: any data goes on)
        if not isinstance(before, dict) or "content_hash" not in before:
            # A checkpoint from before data identities were recorded: only its own data path is known.
            saved = Config.load(self.checkpoint / "config.toml").data.path
            if saved != path:
                raise BigbatchError(
                    f"checkpoint {self.checkpoint} predates recorded data hashes, so it can resume only on its own "
                    f"data.path ({saved}), not {self.data['path']}"
                )
            return
        if before["content_hash"] != self.data["content_hash"]:
            raise BigbatchError(
                f"data {self.data['path']} holds other images than the run was trained on (content hash "
                f"{self.data['content_hash'][:16]}…, the checkpoint recorded {str(before['content_hash'])[:16]}… "
                f"for {before.get('path')}); resume on that data (data.path=...), or start a new run from its "
                "weights with train.init_from=RUN"
            )

    def close(self) -> None:
        """Release the run's lock; a directory this process made and never wrote to is removed."""
        _release(self.path, self.lock, self.created)
        self.lock, self.created = None, ()

    def restore(self, task: Task, rep: Replicator) -> tuple[int, float]:
        """Load the checkpoint resumed from into `task` and `rep` (weights, optimizer moments, loss scalers, the
        batch plan, RNG); return the images seen and the seconds trained up to it. metrics.jsonl loses rows past it."""
        ckpt = self.checkpoint
        assert ckpt is not None
        nets = task.nets()
        weights, saved = checkpoints.load_checkpoint(ckpt, nets=tuple(nets))
        back = f"; resume from an earlier checkpoint: its name in {self.path / 'checkpoints' / 'latest'}"
        for key, net in nets.items():
            checkpoints.load_weights(net, weights[key], f"{key} of checkpoint {ckpt}", fix=back)
        engine = saved.get("engine", {})
        if "plan" not in engine:  # checkpoints from before the plan was engine state: plan.json holds it
            engine = {**engine, "plan": _legacy_plan(self.path)}
        try:
            task.load_state_dict(saved)
            rep.load_state_dict(engine)
            nimg, seconds = int(saved["nimg"]), float(saved.get("seconds", 0.0))
            self.log_window = saved.get("log_window")
            restore_rng(saved, rep.device)
        except (KeyError, ValueError, TypeError, RuntimeError) as e:
            old = saved.get("converted_from")  # (an earlier bigbatch's `convert` wrote weights alone)
            how = f": convert the weights again, or fine-tune them with train.init_from={self.path}" if old else ""
            raise BigbatchError(f"checkpoint {ckpt} has an unusable state.pt ({e}){how}") from None
        if rep.is_main:  # (an evaluation the checkpoint says is still due is made again: a row of it goes, found
            # from outside: logged twice)
            redo = bool((self.log_window or {}).get("eval_pending")) and getattr(task, "scorer", None) is not None
            # A rollback's rows past the checkpoint, of another history, kept beside as its checkpoints are (found
            # from outside: lost).
            newer = any(float(c.name) * 1000 > nimg for c in checkpoint_find.published(self.path))
            when = time.strftime("%Y%m%d-%H%M%S")
            superseded = f"superseded-{checkpoints.checkpoint_name(nimg)}-{when}" if newer else None
            truncate_metrics(self.path / "metrics.jsonl", nimg, scores_too=redo, superseded=superseded)
        return nimg, seconds

    def write_previews(self, task: Task, nimg: int, at_checkpoint: bool, missing: bool = False) -> None:
        """The task's previews under RUN/samples/, named after the images seen (as checkpoints are); `missing`: only
        those not there (a resume's, of the checkpoint it starts from: found from outside, a run stopped between its
        checkpoint and its sheets never drew them)."""
        for prefix, image in task.previews(at_checkpoint).items():
            path = self.path / "samples" / f"{prefix}-{checkpoints.checkpoint_name(nimg)}.png"
            if not (missing and path.exists()):
                save_png(image, path)

    def write_batch_sheet(self, task: Task, nimg: int) -> None:
        """RUN/samples/batch-NNNNNN.NNN.png: the first images of the step at `nimg` as the task's models
        receive them (a run's start, each phase's)."""
        save_png(task.batch_sheet(nimg), self.path / "samples" / f"batch-{checkpoints.checkpoint_name(nimg)}.png")

    # ---- metrics.jsonl ---------------------------------------------------------------------------
    def log(self, row: dict[str, Any]) -> None:
        self.lock = keep_lock(self.lock, self.path, LOCK)
        path = self.path / "metrics.jsonl"
        try:
            with open(path, "a") as f:
                f.write(json.dumps(row) + "\n")
        except OSError as e:  # a failed write (a full disk) names no file: this one
            if e.filename:
                raise
            raise OSError(e.errno, e.strerror, str(path)) from e


def check_replicas(task: Task, nimg: int) -> None:
    """Before a checkpoint: every rank must hold rank 0's parameters (one hash each, gathered), and they must be
    finite (found from outside: a learning rate that made them inf was saved, and the stop's advice resumed it); one
    line, on every rank, names what is wrong and stops the run."""
    if differ := dist.ranks_differing(task.nets()):
        said = f"rank {', '.join(map(str, differ))} held other weights than rank 0: the replicas diverged (a "
        said += "nondeterministic kernel or a failing device on that rank)"
    elif bad := checkpoints.not_finite(task.nets()):
        said = f"{', '.join(bad)} held weights that are not finite, made so by the last step applied (lower its rate)"
    else:
        return
    raise BigbatchError(f"before the checkpoint at kimg {nimg / 1000:g}, {said}; nothing was saved (earlier ones stay)")


def snapshot(task: Task, rep: Replicator, nimg: int, seconds: float) -> dict[str, Any]:
    """A checkpoint's state.pt: the task's state, the engine's, the images seen, the seconds of training
    (summed over resumes) and the global RNG."""
    return {
        **task.state_dict(),
        "nimg": nimg,
        "seconds": seconds,
        "engine": rep.state_dict(),
        **rng_state(rep.device),
    }


def read_plan(run: Path) -> dict[str, Any]:
    """RUN/plan.json's record ({} where it is missing or damaged)."""
    try:
        record = json_loads((Path(run) / "plan.json").read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _legacy_plan(run: Path) -> dict[str, Any] | None:
    """The micro_batch "auto" plan RUN/plan.json records, in Replicator.state_dict's form (None if it has none)."""
    record, keys = read_plan(run), ("micro_batch", "world_size", "memory_budget_bytes", "probes")
    return {k: record[k] for k in keys} if all(k in record for k in keys) else None


def open_run(cfg: Config, run_dir: str | Path | None, resume: bool | Literal["auto"]) -> Run:
    """The run `cfg` trains: rank 0 claims (and locks) the run directory, the others follow it. On resume
    ("auto": if `run_dir` holds a run) the config must agree with the one the checkpoint was trained with
    (see `resume_config`); a run stopped before its first checkpoint starts again, with its own config."""
    claimed: list[tuple[Path, IO | None, bool, bool]] = []

    def claim() -> tuple[str, bool]:
        claimed.append(_claim_dir(run_dir, cfg.name, resume))
        return str(claimed[0][0]), claimed[0][3]  # what the other ranks need: the path, and whether it resumes

    found = _catch(claim) if dist.context().rank == 0 else None
    ok, found = dist.broadcast(found)
    if not ok:
        raise BigbatchError(found)
    path, lock, created, resuming = claimed[0] if claimed else (Path(found[0]), None, (), found[1])
    run = Run(path, cfg, lock=lock, created=created, resumed=resuming)
    if not resuming:
        return run
    try:
        # Rank 0 picks the checkpoint (passing over damaged ones, which it moves aside); the others follow.
        picked = _catch(lambda: _pick_checkpoint(path)) if dist.context().rank == 0 else None
        ok, picked = dist.broadcast(picked)
        if not ok:
            raise BigbatchError(picked)
        if picked is not None:
            run.checkpoint = Path(picked)
            run.cfg = resume_config(run.checkpoint / "config.toml", cfg, f"checkpoint {run.checkpoint}")
            _check_length(run, resume)
            _check_converted_data(run)
        else:
            run.cfg = resume_config(path / "config.toml", cfg, f"run {path}")
    except BaseException:
        run.close()
        raise
    return run


def _check_converted_data(run: Run) -> None:
    """A run `convert` wrote without data, resumed on its preset's data path that is not there: said so (found from
    outside: "cannot open data set 'data/src.h5'", a path the run never had, with advice to prepare it)."""
    meta = checkpoints.read_meta(run.checkpoint) or {}
    if not meta.get("converted_from") or isinstance(meta.get("data"), dict):
        return
    d = run.cfg.data
    given = [("data.path", d.path)] + ([("data.dst_path", d.dst_path)] if run.cfg.task == "swap" else [])
    for key, path in given:
        if path and not is_url(path) and not Path(path).exists():  # (builtin:NAME too is a URL's shape)
            keys = "data.path=SRC.h5 data.dst_path=DST.h5" if run.cfg.task == "swap" else "data.path=DATA.h5"
            raise BigbatchError(
                f"{run.path} was converted from {meta['converted_from']} without its data, and its {key} {path} does "
                f"not exist: give the data to train on, {keys} (with --resume)"
            )


def _check_length(run: Run, resume: bool | Literal["auto"]) -> None:
    """A resume that shortens train.kimg to what the run has already trained would end at once, "done",
    and keep the shorter length for later resumes: refused, naming where the run stands. Under --resume=auto
    (a job's one command, run again after the run was trained on by another), the run is done: it keeps its
    length, said in a warning (one not yet at its length is refused as on --resume)."""
    was = run.length_before = Config.load(run.checkpoint / "config.toml").train.kimg
    now, trained = run.cfg.train.kimg, (run.resumed_at or 0) / 1000
    if now < was and trained >= was and resume == "auto":
        warn(f"{run.path} has trained {trained:g} kimg, beyond train.kimg={now:g}: it is done (its length: {was:g})")
        run.cfg = run.cfg.override({"train.kimg": was})
    elif now < was and trained >= now:
        raise BigbatchError(
            f"train.kimg={now:g} is not beyond the {trained:g} kimg {run.path} has trained (its length: {was:g}): "
            "give a larger train.kimg to train it longer, or leave it out to finish the run"
        )


def _pick_checkpoint(run: Path) -> str | None:
    """The checkpoint to resume `run` from, or None (with a warning) when it has none yet; a BigbatchError
    when it has some, but none intact (never a silent restart over them)."""
    if (ckpt := checkpoint_find.resume_checkpoint(run)) is not None:
        return str(ckpt)
    warn(f"{run} has no checkpoint yet (stopped before its first); starting it again from the beginning")
    return None


def _catch(fn: Any) -> tuple[bool, Any]:
    """(True, fn()) or (False, the message of its BigbatchError or OSError): plain data to hand to the
    other ranks, so that they stop with rank 0 instead of waiting for it in a collective."""
    try:
        return True, fn()
    except BigbatchError as e:
        return False, str(e)
    except OSError as e:  # a run directory that cannot be made, locked or listed
        return False, f"{e.filename}: {e.strerror}" if e.filename else str(e)


LOCK = ".lock"  # RUN/.lock: flock-ed by the process training the run; it holds that process's PID and host


def refuse_checkpoint(run_dir: str | Path) -> None:
    """A run's checkpoint folder given as a run directory (found from outside: a run started from scratch in it,
    which the run's pruning would delete): one line, naming the run."""
    path = Path(run_dir)
    if (path / "meta.json").is_file() or (path / "state.pt").is_file():
        run = path.parent.parent if path.parent.name == "checkpoints" else None
        where = f"a checkpoint of run {run}" if run is not None else "a checkpoint"
        raise BigbatchError(
            f"{run_dir} is {where}, not a run directory: give --run-dir {run or 'RUN'} (a run resumes from its newest "
            f"complete checkpoint), or start a new run from these weights with train.init_from={run_dir}"
        )


def _claim_dir(
    run_dir: str | Path | None, name: str, resume: bool | Literal["auto"]
) -> tuple[Path, IO | None, tuple[Path, ...], bool]:
    """(run directory, its lock, the folders made here for it, whether it resumes): a new numbered one by default
    (made atomically, so runs started together never share one), an existing run only with --resume
    (with "auto": resumed if it holds a run, else started)."""
    if run_dir is not None:
        refuse_checkpoint(run_dir)
    else:
        if resume:
            raise BigbatchError("--resume needs --run-dir naming the run to continue")
        root = Path("runs")
        root.mkdir(parents=True, exist_ok=True)
        taken = {p.name for p in root.iterdir()}
        for number in range(100000):
            run = root / f"{name}-{number:05d}"
            if run.name in taken:
                continue
            try:
                run.mkdir()  # fails if another process claimed it first: then try the next number
            except FileExistsError:
                continue
            return run, lock_folder(run, LOCK, _in_use), (run,), False
        raise BigbatchError(f"runs/ holds 100000 runs named {name}-NNNNN; choose another --run-dir")
    run = Path(run_dir)
    try:
        str(run.resolve()).encode("utf-8")
    except UnicodeEncodeError:  # bytes of another encoding, which os.fsdecode kept as surrogates
        shown = os.fsencode(run).decode("utf-8", "backslashreplace")
        raise BigbatchError(
            f"--run-dir (run_dir=) {shown} is not valid UTF-8, which TensorBoard and the run's records need; rename it"
        ) from None
    if run.exists() and not run.is_dir():
        raise BigbatchError(f"{run} is a file; --run-dir (run_dir=) must name a directory")
    # A refused command leaves the run as it was: the check comes before the lock (which records this
    # process's PID), and again under it, where a run another process started meanwhile shows.
    resume = check_resume(run, resume)
    # (and the folders above it that it makes: found from outside, a refused run left nonexist/sub/; each made here,
    # not one another process made meanwhile)
    made = []
    for folder in reversed((run, *run.parents)):
        try:
            folder.mkdir()
            made.append(folder)
        except FileExistsError:
            pass
    created = tuple(reversed(made))
    lock = lock_folder(run, LOCK, _in_use)
    try:
        resume = check_resume(run, resume)
    except BigbatchError:
        _release(run, lock, created)
        raise
    # Atomic writes of killed processes (samples/ too: found from outside, its PNGs' were kept), then what the run
    # writes in, checked now, not at its first save.
    # (and a checkpoint's, or one being pruned, whole: found from outside, a run resumed with nothing to train never
    # saved, which swept them, and kept a killed prune's checkpoint, GBs of BigGAN's)
    stale = (".*.tmp-*", "samples/.*.tmp-*", "checkpoints/.*.tmp-*", "checkpoints/.tmp-*", "checkpoints/.pruned-*")
    remove_stale(path for pattern in stale for path in run.glob(pattern))
    try:
        for folder in (f for f in (run / "checkpoints", run / "samples") if f.is_dir()):
            check_writable(folder)
    except BigbatchError:
        _release(run, lock, created)
        raise
    return run, lock, created, bool(resume)


def check_resume(run: Path, resume: bool | Literal["auto"]) -> bool | Literal["auto"]:
    """`resume` ("auto" settled by whether `run` holds a run), or an error where it does not fit."""
    holds_run = (run / "config.toml").exists() or (run / "checkpoints").exists()
    if not holds_run and checkpoint_find.is_sweep_folder(run):  # (found from outside: a run written among its runs
        raise BigbatchError(  # hid them from plot and info)
            f"{run} is a sweep's folder (its results.csv): a run goes in a folder of its own; give another --run-dir "
            "(run_dir=)"
        )
    if not holds_run and (run / "metrics.jsonl").exists():  # (found from outside: a new run's rows joined another's)
        raise BigbatchError(
            f"{run} holds a metrics.jsonl but no run (no config.toml, no checkpoints/): nothing to resume, and a new "
            "run's rows would join those; give an empty or new --run-dir (run_dir=), or move that file away"
        )
    if resume == "auto":
        resume = holds_run
    problem = None
    if resume and not holds_run:
        problem = f"{run} holds no run to resume; drop --resume (in Python: resume=False) to start a new run there"
    if not resume and holds_run:
        problem = (  # (the Python API's names too: found from outside, a notebook's user was given the CLI's alone)
            f"{run} already holds a run; add --resume (in Python: resume=True) to continue it, or choose another "
            "--run-dir (run_dir=)"
        )
    if problem:
        holder = trainer(run)  # (reads the lock without taking it)
        raise BigbatchError(_in_use(run, str(holder[0]), held_by(*holder)) if holder else problem)
    return resume


def _in_use(run: Path, pid: str, held_by: str) -> str:
    return (
        f"{run} is in use by {held_by}, which is training it; wait for it to end, or stop it "
        f"first (kill -TERM {pid} saves a checkpoint), then resume"
    )


def _release(run: Path, lock: IO | None, created: tuple[Path, ...]) -> None:
    """Release a run's lock; remove the directory if this process made it and nothing was written to it, and the
    folders above it that it made, where still empty."""
    if created and run.is_dir() and {p.name for p in run.iterdir()} <= {LOCK}:
        (run / LOCK).unlink(missing_ok=True)
        for folder in created:
            try:
                folder.rmdir()
            except OSError:
                break
    unlock_folder(lock)


def trainer(run: Path, lock: str = LOCK) -> tuple[int, str] | None:
    """(PID, host) of the process training `run` (holding its lock; `lock`: another of the folder's, as a sweep's), or
    None if none does."""
    try:
        import fcntl

        f = open(Path(run) / lock)
    except (ImportError, OSError):
        return None
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = f.read().split()
            if not holder or not holder[0].isdigit():
                return None  # locked, but the holder is still writing its PID
            return int(holder[0]), holder[1] if len(holder) > 1 else ""
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return None


def _json(value: Any) -> Any:
    """A config value as plan.json can hold it (a tuple as a list, inf as "inf")."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return list(value) if isinstance(value, tuple) else value


def plan_record(rep: Replicator, cfg: Config) -> dict[str, Any]:
    """What RUN/plan.json holds: the resolved batch plan and how it was found."""
    record: dict[str, Any] = {
        **rep.plan.to_dict(),
        "checkpointing": cfg.train.checkpointing,
        "compile": rep.compile,
        "sync_bn": cfg.train.sync_bn,
        "sn_update": cfg.model.sn_update,
    }
    if rep.device.type == "cpu":  # (the order a CPU sums in: a resume under another count is not bit for bit)
        record["cpu_threads"] = torch.get_num_threads()
    if cfg.train.micro_batch == "auto":
        record["memory_budget_bytes"] = rep.budget
        record["probes"] = [dataclasses.asdict(p) for p in rep.probes]
    return record
