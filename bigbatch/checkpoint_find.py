"""Which checkpoint a path names (a run's latest, best/, a folder by name, as the commands read them) and which one a
run resumes from (passing over damaged ones, moved aside); checkpoints.py writes, checks and reads them."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from bigbatch import checkpoints
from bigbatch.errors import BigbatchError, named_few, warn
from bigbatch.files import owner_alive
from bigbatch.metrics_file import HIGHER_IS_BETTER, read_metrics
from bigbatch.urls import local_run

T = TypeVar("T")


def run_named(path: str | Path) -> Path:
    """`path`, or the run directory it names when it is the run's checkpoints/ folder or its checkpoints/latest
    file (what a shell's completion offers one step past the run; found from outside: both were refused as
    neither a run nor a checkpoint, an XSeg model's `latest` as an unreadable DeepFaceLab file)."""
    path = Path(path)
    if path.name == "latest" and path.is_file() and path.parent.name == "checkpoints":
        return path.parent.parent
    if path.name == "checkpoints" and path.is_dir() and (path / "latest").is_file():
        return path.parent
    return path


EXPORTED = (".pt", ".pt2", ".onnx", ".dfm")  # what `bigbatch export` writes


def exported_said(path: Path) -> str | None:
    """The refusal of a model file given where a run is read (found from outside: a fastai user's exported model,
    as load_learner takes one, was "neither a run directory nor a checkpoint folder"); None for another path."""
    if path.suffix.lower() not in EXPORTED or not path.is_file():
        return None
    return (
        f"{path} is a model file, not a run: give the run it was exported from; the file runs without bigbatch "
        f"(torch.jit.load, torch.export.load or onnxruntime; `bigbatch info {path}` shows its settings)"
    )


def holds_checkpoints(path: Path) -> bool:
    """Whether `path` is a checkpoint folder or a run directory (intact or not; see run_named)."""
    path = run_named(path)
    markers = ("meta.json", "state.pt", "config.toml")
    if not path.is_dir():
        return False
    if (path / "checkpoints").is_dir() or any((path / m).exists() for m in markers):
        return True
    # A run starting (its lock taken, nothing written yet): found from outside, said to be a folder of no images.
    return (path / ".lock").exists() and all(p.name.startswith(".") for p in path.iterdir())


SWEEP_LOCK = ".sweep.lock"  # RUNS_DIR/.sweep.lock: flock-ed by the process of a sweep running in it (its PID, host)


def is_sweep_folder(path: Path) -> bool:
    """Whether `path` is a sweep's RUNS_DIR (its results table, or the lock of a sweep running in it)."""
    return (path / "results.csv").is_file() or (path / SWEEP_LOCK).exists()


def sweep_folder_said(path: Path) -> str:
    """What to give instead of a sweep's folder where a run is wanted (found from outside: "neither a run directory
    nor a checkpoint folder", with no way on)."""
    return (
        f"{path} is a sweep's folder (its results.md tabulates its runs): give one of its runs, {path}/<run>; "
        f"`bigbatch plot {path}` draws them all"
    )


def network_pickle(path: Path) -> str:
    """What to do with a network pickle (StyleGAN2-ADA's snapshot), which is never unpickled here."""
    return (
        f"{path} is a network pickle (StyleGAN2-ADA's snapshot), which is code and never unpickled here: save its G, D "
        "and G_ema state dicts with ADA's own code first (README: \"ADA's snapshots are pickles\"), then `bigbatch "
        "convert` their folder into a run"
    )


def find_checkpoint(path: str | Path, reader: bool = False) -> Path:
    """The checkpoint a path names: a checkpoint folder itself, or a run's `latest` (falling back to
    its newest complete checkpoint when `latest` is missing or names an incomplete one). A damaged `latest` is
    refused; to a `reader` of its weights with the run's newest intact checkpoint named (checksummed to find it:
    resume and info find theirs their own way)."""
    path = run_named(local_run(path))  # (credentials and URLs refused)
    if not path.exists():
        raise BigbatchError(f"{path} does not exist; give a run directory or one of its checkpoints/<kimg> folders")
    if (path / "meta.json").exists() or (path / "state.pt").exists():
        if (corrupt := checkpoints.corrupt_by_size(path)) is not None:
            raise corrupt
        if not checkpoints.is_complete(path):
            raise BigbatchError(
                f"checkpoint {path} is incomplete or damaged (interrupted while being written, or its meta.json "
                "edited); use another one"
            )
        return path
    if not holds_checkpoints(path):
        # (found from outside: a DFL model folder, an AMP one too, was "neither a run directory nor a checkpoint")
        dfl = sorted(path.glob("*_data.dat"), key=lambda f: "_SAEHD_" not in f.name) if path.is_dir() else []
        if dfl:
            kind = dfl[0].name.removesuffix("_data.dat").rpartition("_")[2] or "DFL"
            how = f"`bigbatch convert {path} RUN` makes it a run; export to .dfm, merge and swap take it as it is"
            raise BigbatchError(
                f"{path} holds a DeepFaceLab {kind} model ({dfl[0].name}), not a bigbatch run: of DFL's models, "
                + (how if kind == "SAEHD" else "bigbatch reads SAEHD's (`convert`) and XSeg's (`xseg`, `merge --xseg`)")
            )
        if path.is_dir() and is_sweep_folder(path):
            raise BigbatchError(sweep_folder_said(path))
        if path.is_file() and (path.parent / "meta.json").is_file():  # (a checkpoint's own file: found by review)
            raise BigbatchError(f"{path} is a file of the checkpoint {path.parent}: give that folder, or its run")
        if path.suffix in (".pkl", ".pth", ".safetensors") and path.is_file():  # (found from outside: no way on)
            if path.suffix == ".pkl":
                raise BigbatchError(network_pickle(path))
            raise BigbatchError(
                f"{path} is a weights file, not a run: `bigbatch convert` makes a run of BigGAN-PyTorch's or "
                "StyleGAN2-ADA's"
            )
        weights = sorted(p.name for p in path.iterdir() if p.suffix in (".pth", ".pkl")) if path.is_dir() else []
        if weights and all(w.endswith(".pkl") for w in weights):
            raise BigbatchError(network_pickle(path / weights[0]))
        if weights:  # (found from outside: BigGAN-PyTorch's weights folder given to --init-from, with no way on)
            raise BigbatchError(
                f"{path} holds weight files ({', '.join(weights[:3])}), not a bigbatch run: `bigbatch convert "
                f"{path} RUN --preset P` makes a run of BigGAN-PyTorch's or StyleGAN2-ADA's state dicts (P: the preset "
                "of their model, such as biggan128_bs2048 or stylegan2_256)"
            )
        runs = sorted(p.name for p in path.iterdir() if (p / "config.toml").is_file()) if path.is_dir() else []
        if runs:  # (found from outside: a folder of runs, which plot takes, got no way on)
            raise BigbatchError(
                f"{path} is a folder of runs ({named_few(runs, 3)}): give one of them, {path}/<run>; `bigbatch plot "
                f"{path}` draws them all"
            )
        if said := exported_said(path):
            raise BigbatchError(said)
        raise NotARun(f"{path} is neither a run directory nor a checkpoint folder")
    complete = checkpoints.complete_checkpoints(path)
    name = latest_name(path)
    # (complete though not listed: the run renamed it in after the listing, and may have pruned the one before;
    # found from outside, a reader between the two said "no complete checkpoint yet" or warned of damage)
    if name and ((path / "checkpoints" / name) in complete or checkpoints.is_complete(path / "checkpoints" / name)):
        return path / "checkpoints" / name
    if name and (corrupt := checkpoints.corrupt_by_size(path / "checkpoints" / name)) is not None:
        raise with_intact(corrupt, path) if reader else corrupt  # (as a file that fails its checksum: readers refuse
        # it, resume passes over it)
    if not complete:
        raise BigbatchError(f"run {path} has no complete checkpoint{way_back(path) or ' yet'}")
    if not (name and any(map(owner_alive, (path / "checkpoints").glob(f".tmp-{name}-*")))):  # (one going into place)
        warn(
            f"checkpoints/latest of {path} names no complete checkpoint "
            f"({name or ('empty' if (path / 'checkpoints' / 'latest').exists() else 'missing')}); using "
            f"{complete[-1].name}",
            once=True,
        )
    return complete[-1]


def latest_name(run: Path) -> str:
    """The checkpoint name a run's checkpoints/latest holds; "" if it is missing, "not a checkpoint name" if it holds
    something else."""
    try:
        name = (Path(run) / "checkpoints" / "latest").read_bytes().decode("utf-8", "replace").strip()
    except OSError:
        return ""
    return name if not name or checkpoints.CHECKPOINT_NAME.fullmatch(name) else "not a checkpoint name"


def published(run: Path) -> list[Path]:
    """Every checkpoint folder of a run (`checkpoints/<kimg>`, complete or not; not best/), newest first.
    A folder is written hidden and renamed into place whole, so one that is incomplete is damaged."""
    root = Path(run) / "checkpoints"
    found = (
        [p for p in root.iterdir() if p.is_dir() and checkpoints.CHECKPOINT_NAME.fullmatch(p.name)]
        if root.is_dir()
        else []
    )
    return sorted(found, key=lambda p: float(p.name), reverse=True)


def check_complete(ckpt: Path) -> None:
    """Corrupt unless the checkpoint holds every file its meta.json lists, at its recorded size."""
    meta = checkpoints.read_meta(ckpt)
    if meta is None:
        raise checkpoints.Corrupt(f"checkpoint {ckpt} is damaged: its meta.json is missing or unreadable", ckpt)
    if (corrupt := checkpoints.corrupt_by_size(ckpt)) is not None:
        raise corrupt
    if missing := [f for f in meta["files"] if not (Path(ckpt) / f).is_file()]:
        raise checkpoints.Corrupt(
            f"checkpoint {ckpt} is damaged: {missing[0]}, which its meta.json lists, is missing", ckpt
        )


def resume_checkpoint(run: Path) -> Path | None:
    """The checkpoint a run resumes from: `latest` (see find_checkpoint), or when it is damaged (a file
    missing, cut short or failing its checksum) the newest other one that is intact, with a warning for
    each one passed over (moved aside); None if the run has none yet (stopped before its first); a
    BigbatchError if it has some but none intact (then and after: the damaged ones are aside, not gone).
    Rank 0's work: the other ranks take its answer."""
    found = published(run)
    if not found:
        if said := way_back(run):
            raise BigbatchError(f"no checkpoint of {run} is intact{said}")
        return None
    # A damaged checkpoint that latest names (a file missing or cut short; found from outside, its meta.json gone: it
    # was set aside as another history) is passed over below, as one that fails its checksums.
    first: Path | None = Path(run) / "checkpoints" / latest_name(run)
    if first not in found or checkpoints.is_complete(first):
        try:
            first = find_checkpoint(run)
        except BigbatchError:  # none is complete: each is looked at below
            first = None
    others = [c for c in found if c != first]
    for ckpt in [first, *others] if first is not None else others:
        try:
            check_complete(ckpt)
            checkpoints.verify(ckpt)
            return ckpt
        except (checkpoints.Corrupt, checkpoints.Pruned) as e:
            aside = ckpt.with_name(f"{checkpoints.ASIDE}{ckpt.name}")
            if isinstance(e, checkpoints.Corrupt):
                shutil.rmtree(aside, ignore_errors=True)
                os.replace(ckpt, aside)
            moved = f" (moved aside to {aside.name})" if isinstance(e, checkpoints.Corrupt) else ""
            warn(f"{checkpoints.damage(e)}{moved}; passing over it to the checkpoint before")
    raise BigbatchError(f"no checkpoint of {run} is intact (see the warnings){way_back(run)}")


def way_back(run: Path) -> str:
    """ ", each damaged checkpoint moved aside (.corrupt-*): …, then how the run goes on" for a run whose checkpoints
    were all damaged, else "" (found from outside: a resume that set every one aside named no way on, and the
    run's readers then said it had saved none yet, though its best/ was intact)."""
    aside = sorted((Path(run) / "checkpoints").glob(f"{checkpoints.ASIDE}*"))
    if not aside:
        return ""
    best = checkpoints.best_checkpoint(run)
    way = f"start a new run from its best (train.init_from={best}), or " if best is not None else ""
    return (
        f", each damaged checkpoint moved aside ({aside[-1].name}, ...): {way}restore one (its files from a copy), or "
        "start a new run in another --run-dir"
    )


def set_aside_newer(run_dir: Path, nimg: int) -> None:
    """Before a run's first save since it (re)started at `nimg` images: move aside the checkpoints after `nimg`, of
    another history (a run rolled back by naming an older checkpoint in `latest`). Found from outside: a newer one
    of the same name was kept as the new one, and the old ones outnumbered the new in the prune, so the weights
    left no longer matched the logs. Moved aside, not deleted: nothing is lost."""
    newer = [c for c in published(run_dir) if round(float(c.name) * 1000) > nimg]
    for c in newer:
        os.replace(c, c.with_name(f"{checkpoints.SUPERSEDED}{c.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"))
    if newer:
        warn(
            f"{len(newer)} checkpoint(s) after {checkpoints.checkpoint_name(nimg)}, where this run went on from, moved "
            f"aside to checkpoints/{checkpoints.SUPERSEDED}* ({', '.join(sorted(c.name for c in newer))}): another "
            "history (latest named an older one); delete them, or move one back and name it in checkpoints/latest to "
            "resume from it"
        )


def pick_checkpoint(path: str | Path, which: str = "latest") -> Path:
    """The checkpoint of a run that `which` names: latest, best (checkpoints/best/) or a folder name."""
    path = run_named(path)
    if (path / "meta.json").exists() and which != "latest":
        raise BigbatchError(f"{path} is a checkpoint already: --checkpoint {which} names one of a run directory")
    if which == "latest" or (path / "meta.json").exists():
        return find_checkpoint(path, reader=True)
    if which == "best":
        if (best := checkpoints.best_checkpoint(path, damaged_too=True)) is None:
            raise BigbatchError(f"{path} has no checkpoints/best/ (eval.every_kimg was off): use --checkpoint latest")
        check_complete(best)  # (found from outside: a damaged best/ was said to be missing)
        return best
    found = path / "checkpoints" / which
    if not checkpoints.is_complete(found):
        whole = [p.name for p in checkpoints.complete_checkpoints(path)]
        if (found / "meta.json").exists():  # there, but damaged: say how (it was called missing)
            try:
                check_complete(found)
            except (checkpoints.Corrupt, checkpoints.Pruned) as e:
                raise BigbatchError(
                    f"{checkpoints.damage(e)}; complete checkpoints of the run: {', '.join(whole) or 'none'}"
                ) from None
        names = ["best"] * (checkpoints.best_checkpoint(path) is not None) + ["latest"] + whole
        raise BigbatchError(f"{path} has no complete checkpoint {which!r}; it has: {', '.join(names)}")
    return found


def read_picked(path: str | Path, which: str, read: Callable[[Path], T]) -> T:
    """`read(checkpoint)` on the checkpoint of `path` that `which` names (pick_checkpoint); a run's latest that
    its training prunes under the reader is read again at the run's newest (read_newest)."""
    if which == "latest":
        return read_newest(path, read)
    return read(pick_checkpoint(path, which))


class NotARun(BigbatchError):
    """A path that is no run nor checkpoint, nor anything else find_checkpoint knows (a command that takes more,
    as merge a DeepFaceLab model, says that too)."""


def read_newest(path: str | Path, read: Callable[[Path], T], tries: int = 5) -> T:
    """`read(checkpoint)` on the checkpoint `path` names; when `path` names a run whose training prunes
    that checkpoint under the reader, again on the run's newest."""
    named = run_named(local_run(path))  # (as find_checkpoint reads it: RUN/checkpoints is the run)
    for attempt in range(tries):
        ckpt = find_checkpoint(named, reader=True)
        try:
            got = read(ckpt)
            if ckpt != named and (note := best_passed_over(named, ckpt)):
                warn(note, once=True)
            return got
        except BigbatchError as e:
            if (ckpt / "meta.json").exists() or ckpt == named or attempt == tries - 1:
                # (not pruned meanwhile, or a checkpoint named by the user)
                raise with_intact(e, named) if isinstance(e, checkpoints.Corrupt) else e from None
    raise AssertionError("unreachable")


def best_passed_over(run: Path, ckpt: Path) -> str | None:
    """What to tell a reader of a run's latest checkpoint `ckpt` whose checkpoints/best/ scored better than its own
    evaluation (metrics.jsonl's row at it) by over a twentieth (found from outside: a fine-tune's val_top1 fell from
    98.3 to 30 as it unfroze, and predict read the latest without a word, as fastai's SaveModelCallback and timm's
    model_best would not have), or None."""
    best = checkpoints.best_checkpoint(run)
    if best is None or best.resolve() == ckpt.resolve():
        return None
    meta = checkpoints.read_meta(best) or {}
    record = meta.get("best") or {}
    metric, value = record.get("metric"), record.get("value")
    nimg = round(float(ckpt.name) * 1000) if checkpoints.CHECKPOINT_NAME.fullmatch(ckpt.name) else None
    try:
        rows = read_metrics(run / "metrics.jsonl") if nimg is not None else []
    except OSError:  # (a note, not the read: an unreadable log keeps nothing from it)
        return None
    latest = next((r[metric] for r in reversed(rows) if round(r["kimg"] * 1000) == nimg and metric in r), None)
    if not isinstance(value, (int, float)) or not isinstance(latest, (int, float)):
        return None
    gap = (value - latest) if metric in HIGHER_IS_BETTER else (latest - value)
    if gap <= 0.05 * max(abs(value), abs(latest)):
        return None
    at = meta.get("kimg")
    return (
        f"{run}'s checkpoints/best/ scored {metric} {value:.4g}{f' at {at:g} kimg' if at is not None else ''}, the "
        f"latest checkpoint read here {latest:.4g} ({ckpt.name}): give {run / 'checkpoints' / 'best'} to read the "
        "best"
    )


def with_intact(e: checkpoints.Corrupt, path: Path) -> checkpoints.Corrupt:
    """A damaged checkpoint of the run `path`, said with the run's newest intact one to read instead (found from
    outside: named none); `e` as it is where `path` names the checkpoint itself, or none is intact."""
    if e.ckpt is None or e.ckpt == path or (intact := newest_intact(path, e.ckpt)) is None:
        return e
    said = f"{checkpoints.damage(e)}; the run's newest intact checkpoint is {intact}: give it instead"
    return checkpoints.Corrupt(said, e.ckpt)


def newest_intact(run: Path, but: Path) -> Path | None:
    """The newest checkpoint of `run` other than `but` whose files match their checksums, or None."""
    for ckpt in published(run):  # (newest first)
        if ckpt != but and checkpoints.is_complete(ckpt) and checkpoints.intact(ckpt):
            return ckpt
    return None
