"""What `bigbatch info` says of a run directory or checkpoint: its checkpoints, last log row and
evaluation, best checkpoint, recipe, model, training settings and files."""

from __future__ import annotations

import math
import shlex
from pathlib import Path

from bigbatch import checkpoint_find, checkpoints
from bigbatch.config import Config
from bigbatch.data.schedule import phase_sides, phase_trained, resolution_trained, schedule_of
from bigbatch.engine.memory import format_bytes
from bigbatch.errors import BigbatchError, counted
from bigbatch.files import held_by
from bigbatch.metrics_file import read_metrics
from bigbatch.rundir import read_plan, trainer


def _batch_plan(cfg: Config, run: Path | None) -> str:
    """The batch and how it was split, as the run resolved it (RUN/plan.json: micro_batch "auto", or one above a
    process's share), else as the config asks; a data.schedule's phases say their own batch."""
    t = cfg.train
    plan = read_plan(run) if run is not None and not cfg.data.schedule else {}
    if not {"micro_batch", "accumulation", "world_size"} <= set(plan):
        return f"batch {t.batch} (micro {t.micro_batch})"
    split = f"micro {plan['micro_batch']} x {plan['accumulation']} accumulated"
    split += f" x {plan['world_size']} processes" if plan["world_size"] > 1 else ""
    asked = f"; train.micro_batch {t.micro_batch}" if str(t.micro_batch) != str(plan["micro_batch"]) else ""
    # (found from outside: plan.json's probed peak, not said; a finished plan is rechecked by it)
    took = [p for p in plan.get("probes") or [] if isinstance(p, dict) and p.get("micro_batch") == plan["micro_batch"]]
    budget = plan.get("memory_budget_bytes")
    if took and isinstance(peak := took[0].get("peak_bytes"), int) and isinstance(budget, int):
        asked += f"; probed peak {format_bytes(peak)} of its budget {format_bytes(budget)}"
    return f"batch {t.batch} ({split}{asked})"


def _damaged_by_size(run: Path, intact: list[Path], said: Path | None) -> list[str]:
    """Why the run's published checkpoints (but `said`, the latest, whose damage is said already) that a file of
    another size than their meta.json records leaves out of `intact` are damaged, each as Corrupt says it."""
    root = run / "checkpoints"
    folders = sorted(p for p in root.iterdir() if p.is_dir() and p.name[0] != ".") if root.is_dir() else []
    found = (checkpoints.corrupt_by_size(p) for p in folders if p not in intact and p.name != checkpoints.BEST)
    return [checkpoints.damage(e) for e in found if e is not None and e.ckpt != said]


def _state(run: Path, ckpt: Path | None, meta: dict, rows: list[dict]) -> str:
    """Whether `run` is training now, has trained its length, or ended before it, and how (found from outside: info
    read alike while a run trained, after it was killed and once it was done)."""
    holder = trainer(run)
    if holder is not None:
        return f"training now ({held_by(*holder)})"
    try:
        import fcntl  # noqa: F401
    except ImportError:  # (found by review: no lock to read here, "not training" said of any run)
        return "unknown: this system has no file locks to tell a run in training"
    total = Config.load(run / "config.toml").train.kimg if (run / "config.toml").is_file() else math.inf
    kimg = float(meta.get("kimg", 0.0)) if ckpt is not None else 0.0
    if ckpt is not None and kimg >= total:
        if not meta.get("eval_pending"):
            return f"done ({kimg:.3f} of {total:g} kimg)"
        run_again = f"`bigbatch train --run-dir {shlex.quote(str(run))} --resume`"  # (found from outside: "done")
        return f"trained ({kimg:.3f} of {total:g} kimg); its last evaluation was not made: {run_again} makes it"
    logged = max((float(r.get("kimg", 0.0)) for r in rows), default=0.0)
    again = f"`bigbatch train --run-dir {shlex.quote(str(run))} --resume` goes on"
    # (found from outside: a run of several processes told to go on as one, where its stop's line says them)
    plan = read_plan(run)
    ranks = plan.get("world_size", 1)
    launch = f", started as the run was ({ranks} processes)" if isinstance(ranks, int) and ranks > 1 else ""
    # (found from outside: a run that failed was said to have ended, the line it failed with left to its output)
    failed = f". It failed: {plan['failed']}" if isinstance(plan.get("failed"), str) else ""
    if ckpt is None and (back := checkpoint_find.way_back(run)):  # (found from outside: "goes on from its start",
        return f"not training: no checkpoint of it is intact{back}"  # which the resume refused)
    if ckpt is None:
        logs = f" (logged to {logged:g} kimg)" if logged else ""
        return f"not training: it ended before its first checkpoint{logs}; {again} from its start{launch}{failed}"
    newer = [c.name for c in checkpoint_find.published(run) if float(c.name) > kimg]
    if newer:  # (found from outside: a run rolled back, latest naming an older checkpoint, was said to have crashed)
        said = (
            f"rolled back to its checkpoint at {kimg:.3f} kimg (checkpoints/latest names it; {len(newer)} newer, to "
            f"{newer[0]}, go aside at its first save); {again} from it"
        )
    elif logged > kimg:  # (a stop saves where it stops: a log past the checkpoint is a run that could not save)
        said = f"it ended at {logged:g} kimg without saving (killed or crashed); {again} from {kimg:.3f}"
    elif meta.get("stopped", True):  # (a checkpoint of before the flag: stopped, as a log no further says)
        said = f"stopped at {kimg:.3f} of {total:g} kimg; {again}"
    else:  # (found from outside: a run killed before its next log row, logged more seldom than it saved: "stopped")
        said = f"it ended after its checkpoint at {kimg:.3f} kimg, not by a stop (killed or crashed); {again}"
    said = said.replace(" (killed or crashed)", "") if failed else said  # (its failure said instead of a guess)
    return f"not training: {said}{launch}{failed}"


def describe_run(path: str | Path) -> str:
    """What a run directory or checkpoint holds, as a few lines of text."""
    path = Path(path)
    damaged, damaged_at, ckpt = None, None, None
    try:
        ckpt = checkpoint_find.find_checkpoint(path)
    except checkpoints.Corrupt as e:  # a run's latest checkpoint damaged: describe the run by its newest intact one
        intact = checkpoints.complete_checkpoints(path) if e.ckpt is not None and e.ckpt.parent.parent == path else []
        if not intact:
            raise
        ckpt, damaged, damaged_at = intact[-1], str(e), e.ckpt
    except BigbatchError:
        # A run before its first checkpoint (found from outside: info only refused): its start record and log.
        folder = (path / "meta.json").exists() or (path / "state.pt").exists()  # (a checkpoint's own refusal stands)
        if folder or not (path / "config.toml").is_file() or checkpoints.complete_checkpoints(path):
            raise
    run = path if ckpt is None else ckpt.parent.parent if ckpt.parent.name == "checkpoints" else None
    meta = checkpoints.model_info(ckpt) if ckpt is not None else {}
    cfg = Config.load((ckpt or path) / "config.toml")
    t, m = cfg.train, cfg.model
    lines = []
    if run is not None and path.resolve() == run.resolve():
        ckpts = checkpoints.complete_checkpoints(run)
        lines.append(f"run         {run}")
        if ckpt is None and (said := checkpoint_find.way_back(run)):
            lines.append(f"checkpoints none intact{said}")
        elif ckpt is None:
            first = min(cfg.checkpoint.every_kimg, t.kimg)
            clock = f" or {cfg.checkpoint.every_minutes:g} minutes in" if cfg.checkpoint.every_minutes else ""
            lines.append(
                f"checkpoints none yet (the first at {first:g} kimg{clock}; a stopped run saves where it stops)"
            )
        else:
            lines.append(f"checkpoints {', '.join(p.name for p in ckpts)} (latest {ckpt.name})")
        if damaged:
            lines.append(f"damaged     {damaged}")
        for other in _damaged_by_size(run, ckpts, damaged_at):  # (found from outside: left out of the list unsaid)
            lines.append(f"damaged     {other}")
        rows = read_metrics(run / "metrics.jsonl")
        lines.append(f"state       {_state(run, ckpt, meta, rows)}")
        logs = [r for r in rows if "eval_seconds" not in r]
        evals = [r for r in rows if "eval_seconds" in r]
        if logs:
            lines.append("last log    " + _row_text(logs[-1]))
        if said := _skips(logs, cfg.train.precision):
            lines.append(f"skipped     {said}")
        if evals:
            lines.append("last eval   " + _row_text(evals[-1]))
        best = checkpoints.best_checkpoint(run)
        record = (checkpoints.read_meta(best) or {}).get("best") if best is not None else None
        if isinstance(record, dict):
            lines.append(f"best        {best} ({record.get('metric')} {record.get('value', float('nan')):.4g})")
    if ckpt is not None:
        by = f", by bigbatch {meta['bigbatch']}" if meta.get("bigbatch") else ""  # (its code: provenance.py)
        lines.append(f"checkpoint  {ckpt} ({meta['kimg']:.3f} of {t.kimg:g} kimg{by})")
        kept = meta.get("best")
        if isinstance(kept, dict) and ckpt.name == "best":  # (found from outside: the best's score not said)
            lines.append(f"best of run {kept.get('metric')} {kept.get('value', float('nan')):.4g}")
    if cfg.task == "swap":
        lines.append(f"recipe      {cfg.name}: src {cfg.data.path}, dst {cfg.data.dst_path} at {cfg.data.resolution}px")
    elif cfg.task == "xseg":
        dst = f" and {cfg.data.dst_path}" if cfg.data.dst_path else ""
        lines.append(f"recipe      {cfg.name}: labelled faces {cfg.data.path}{dst} at {cfg.data.resolution}px")
    else:
        classes = f", {meta.get('n_classes') or 'no'} classes" if ckpt is not None else ""  # (what its data gives)
        trained = resolution_trained(cfg, int(meta.get("nimg", 0)))
        sides = phase_sides(cfg)  # (found from outside:
        at = f"{sides[0]}-{sides[-1]}px (data.schedule)" if len(sides) > 1 else f"{sides[0]}px"  # "at 128px" unused)
        at += f", last trained at {trained}px" if ckpt is not None and (len(sides) > 1 or trained != sides[0]) else ""
        at += f", scored at {cfg.eval.resolution}px" if cfg.eval.resolution else ""
        lines.append(f"recipe      {cfg.name}: data {cfg.data.path} at {at}{classes}")
    options = f" {m.options}" if m.options else ""
    batch = _batch_plan(cfg, run)
    if cfg.task == "swap":
        s = cfg.swap  # (found from outside: DFL's summary says every option; half were unsaid here)
        powers = ("true_face_power", "gan_power", "face_style_power", "bg_style_power", "random_hsv_power")
        extras = [f"{k} {getattr(s, k):g}" for k in powers if getattr(s, k)]
        extras += [f"ct_mode {s.ct_mode}"] if s.ct_mode != "none" else []
        flags = ["masked_training", "eyes_mouth_prio", "random_warp", "lr_dropout", "uniform_yaw", "blur_out_mask"]
        flags = [k for k in [*flags, "src_flip", "dst_flip"] if getattr(s, k)]
        if "masked_training" in flags and meta.get("masks") is False:  # (data without masks trains unmasked)
            flags[0] = "masked_training (no masks in the data: unmasked)"
        face = meta.get("face_type") or s.face_type or "unknown"
        lines.append(f"model       {m.name}{options}, face type {face}")
        lines.append(
            f"training    {batch}, {s.optimizer} lr {s.lr:g}, clip {t.grad_clip:g}, "
            f"{', '.join(flags + extras) or 'plain'}, {t.precision}"
            f"{' + checkpointing' if t.checkpointing else ''}, seed {t.seed}"
        )
    elif cfg.task == "xseg":
        x, face = cfg.xseg, meta.get("face_type") or cfg.xseg.face_type or "unknown"
        lines.append(f"model       {m.name}{options}, face type {face}")
        lines.append(
            f"training    {batch}, rmsprop lr {x.lr:g}{', lr_dropout' if x.lr_dropout else ''}, clip "
            f"{t.grad_clip:g}, {t.precision}{' + checkpointing' if t.checkpointing else ''}, seed {t.seed}"
        )
    elif cfg.task == "gan":
        lines.append(f"model       {m.name} ch {m.ch} dim_z {m.dim_z}{options}")
        lines.append(
            f"training    {batch}, d_steps {t.d_steps}, lr G {t.g_lr:g} D {t.d_lr:g}, "
            f"{t.loss} loss, {t.precision}, seed {t.seed}"
            + (f", R1 gamma {t.r1_gamma:g} every {t.r1_every}" if t.r1_gamma else "")
            + (f", R2 gamma {t.r2_gamma:g} every {t.r1_every}" if t.r2_gamma else "")
            + (f", gradient penalty {t.gp:g}" if t.gp else "")
            + (f", LeCam {t.lecam:g} (decay {t.lecam_decay:g} after {t.lecam_start} iterations)" if t.lecam else "")
            + "".join(f", {k} {v:g}" for k, v in (("CR real", t.cr_real), ("CR fake", t.cr_fake)) if v)
            + (f", zCR D {t.zcr_d:g} G {t.zcr_g:g} radius {t.zcr_radius:g}" if t.zcr_d or t.zcr_g else "")
            + (f", path length {t.pl_weight:g} every {t.pl_every} on 1/{t.pl_batch_shrink}" if t.pl_weight else "")
            + "".join(f", ortho {k} {v:g}" for k, v in (("G", t.g_ortho), ("D", t.d_ortho)) if v)
            # (the average G, its half-life and start: found from outside, not shown)
            + f", G_ema half-life {t.ema_halflife_kimg:g} kimg"
            + (f" (ramped up {t.ema_rampup:g})" if t.ema_rampup else "")
            + (f" from {t.ema_start_kimg:g} kimg" if t.ema_start_kimg else "")
        )
        a = cfg.augment
        if a.transforms:  # ADA's p where the checkpoint is (found from outside: not shown; a resume starts there)
            p = f"target {a.target:g} (speed {a.speed_kimg:g} kimg)" if a.target else f"p {a.start_p:g}"
            p += f", p {meta['augment_p']:.4g} at the checkpoint" if "augment_p" in meta else ""
            lines.append(f"augment     {a.pipeline} {','.join(a.transforms)}, {p}")
    else:
        lines.append(f"model       {cfg.task}: {m.name} ch {m.ch}{options}")
        decay = f"{t.lr_decay} decay" + (f" at {t.lr_steps} kimg" if t.lr_decay == "step" else "")
        sqrt = " (sqrt-scaled)" if t.lr_batch and t.lr_scale == "sqrt" else ""
        rates = (
            f"lr {t.lr:g} per {t.lr_batch or 'batch'}{sqrt}, warm-up {t.warmup_kimg:g} kimg, {decay}"
            if schedule_of(cfg).phases[0].lr is None
            else "lr per phase (data.schedule, below)"  # (found from outside: the rate it does not read was shown)
        )
        momentum = f" momentum {t.momentum:g}{' nesterov' if t.nesterov else ''}" if t.optimizer == "sgd" else ""
        smooth = f", label smoothing {t.label_smoothing:g}" if t.label_smoothing else ""
        smooth += f", weights averaged (half-life {t.model_ema_kimg:g} kimg)" if t.model_ema_kimg else ""
        smooth += ", binary cross-entropy" if t.bce_loss else ""
        lines.append(
            f"training    {batch}, {t.optimizer}{momentum} {rates}, weight decay {t.weight_decay:g}"
            f"{'' if t.norm_decay else ' (not on norms, biases)'}{smooth}, {t.precision}, seed {t.seed}"
        )
        # (found from outside: the recipe's augmentation and averaging were in config.toml alone)
        augments = [f"random-resized crops from {t.crop_scale:g} of the area"] if t.crop_scale < 1 else []
        augments += ["flips"] if cfg.data.xflip else []
        augments += [f"{k} {getattr(t, k):g}" for k in ("mixup", "cutmix", "random_erase") if getattr(t, k)]
        augments += [f"pairs mixed at {t.mixup_prob:g}"] if (t.mixup or t.cutmix) and t.mixup_prob < 1 else []
        augments += [f"randaugment {t.randaugment}"] if t.randaugment else []
        lines.append(f"augment     {', '.join(augments) or 'none'}")
    if cfg.data.schedule:  # (each phase from its first step, as training says it: found from outside, 1.5 for 1.536)
        schedule = schedule_of(cfg)
        # (a phase's rates per train.lr_batch images where set, and its resolution 0 as data.resolution: found from
        # outside, "lr 1->2" of a phase whose logged rate ran 0.5->1, and "0px")
        unit = f" per {t.lr_batch}" + (" (sqrt-scaled)" if t.lr_scale == "sqrt" else "") if t.lr_batch else ""
        lines.append(
            "schedule    "
            + ", ".join(
                f"{p.resolution or cfg.data.resolution}px batch {p.batch}"
                + (f" lr {p.lr[0]:g}->{p.lr[1]:g}{unit}" if p.lr else "")
                + f" from {begin / 1000:g} kimg"
                + (" (current)" if p == phase_trained(cfg, int(meta.get("nimg", 0))) else "")
                for p, begin in zip(schedule.phases, schedule.begins())
            )
        )
    if ckpt is not None:
        lines.append("files       " + ", ".join(f"{k} ({v / 1e6:.1f} MB)" for k, v in meta["files"].items()))
    return "\n".join(lines)


def _skips(logs: list[dict], precision: str) -> str:
    """The steps the log rows say were skipped, by optimizer, of the run's iterations, or "" (found from outside: a
    run that skipped 93 of its 94 steps was said done, its last row's count alone shown)."""
    names = dict.fromkeys(k for r in logs for k in r if k.startswith("skipped_"))
    counts = {k.removeprefix("skipped_"): sum(int(r.get(k, 0)) for r in logs) for k in names}
    if not any(counts.values()):
        return ""
    shown = " and ".join(f"{n} of {name}'s" for name, n in counts.items() if n)
    settling = "; fp16's loss scale settling among them" if precision == "fp16" else ""
    return f"{shown} steps in {logs[-1].get('step', '?')} iterations: their loss or gradients not finite{settling}"


def _row_text(row: dict) -> str:
    return "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items())


def verify_run(path: str | Path) -> str:
    """Every checkpoint of a run (its checkpoints/<kimg> folders and best/), or the one checkpoint named, read
    back against the checksums its meta.json recorded: prints a line each, then returns a summary, or
    raises BigbatchError naming the first damaged one."""
    path = Path(path)
    if (path / "checkpoints").is_dir():
        best = checkpoints.best_checkpoint(path, damaged_too=True)
        found = checkpoint_find.published(path) + ([best] if best is not None else [])
    elif (path / "config.toml").is_file() and path.parent.name != "checkpoints" and not (path / "state.pt").exists():
        found = [] if not any(path.glob("*.safetensors")) else [path]  # (a run with no checkpoint yet, found from
    else:  # outside: called a damaged checkpoint)
        found = [path]
    lines, damaged, forbidden = [], [], []
    for ckpt in list(found):
        try:
            checkpoint_find.check_complete(ckpt)
            meta = checkpoints.verify(ckpt)
        except BigbatchError as e:
            if not ckpt.exists():  # (pruned by the run training meanwhile, found from outside: called damaged)
                found.remove(ckpt)
                lines.append(f"pruned    {ckpt}: removed meanwhile by the run that trains (checkpoint.keep)")
                continue
            if isinstance(e, checkpoints.Forbidden):  # (found from outside: called damaged, which it is not)
                forbidden.append(ckpt.name)
                lines.append(f"unread    {e}")
                continue
            damaged.append(ckpt.name)
            lines.append(f"damaged   {checkpoints.damage(e)}")
            continue
        sums = (meta.get("checksums") or {}).get(checkpoints.CHECKSUM)
        how = f"{checkpoints.CHECKSUM} checksums" if isinstance(sums, dict) else "sizes (written before checksums)"
        lines.append(f"verified  {ckpt}: {len(meta['files'])} files, by their {how}")
    # Those a resume found damaged and moved aside (found from outside: not counted, a run none of whose checkpoints
    # was intact verified as one with no checkpoint yet, exit 0).
    aside = sorted((path / "checkpoints").glob(f"{checkpoints.ASIDE}*")) if (path / "checkpoints").is_dir() else []
    lines += [f"set aside {a}: found damaged by a resume and moved aside (never resumed)" for a in aside]
    if not found and not lines:
        lines.append(f"{path} has no checkpoint yet")
    print("\n".join(lines), flush=True)
    if aside and not [c for c in found if c.name not in damaged and c.name != "best"]:  # (none to resume from)
        raise BigbatchError(f"no checkpoint of {path} to resume from is intact{checkpoint_find.way_back(path)}")
    unread = f"; {len(forbidden)} this user may not read ({', '.join(forbidden)})" if forbidden else ""
    if damaged:
        rest = len(found) - len(damaged) - len(forbidden)  # (found by review: the unread were called intact)
        intact = "none is intact" if not rest else "the others are intact" if not forbidden else "the rest are intact"
        raise BigbatchError(
            f"{len(damaged)} of {counted(len(found), 'checkpoint')} damaged ({', '.join(damaged)}){unread}; {intact}"
        )
    if forbidden:
        raise BigbatchError(
            f"{len(forbidden)} of {counted(len(found), 'checkpoint')} could not be read by this user "
            f"({', '.join(forbidden)}): give it read access, then verify again"
        )
    return f"{len(found)} checkpoint{'s' * (len(found) != 1)} verified"
