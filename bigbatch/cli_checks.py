"""What is checked before anything runs: a dry run's config against its data files and models (built on the meta
device), and what `bigbatch launch` would start on every rank."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bigbatch.cli_tools import config_of
from bigbatch.errors import BigbatchError, warn
from bigbatch.urls import is_url


def check_data(cfg: Any, new_run: bool = True) -> dict[str, dict]:
    """Read the metadata of the config's data files (data.path, dst_path, val_path): an empty or foreign file is
    refused as training would refuse it; a local one not made yet is warned about (a plan may come first); a URL's
    store is asked for it with data.storage_options, as training asks (found from outside: a bucket the credentials
    could not read passed a dry run). builtin:NAME's name is checked. `new_run`: and an XSeg's train.init_from
    against the faces, as a new run checks it. Returns the metadata read, by the path given."""
    from bigbatch.data.hdf5 import read_meta
    from bigbatch.data.load import check_builtin, check_one_shape
    from bigbatch.urls import Location

    metas = {}
    for given in (cfg.data.path, cfg.data.dst_path, cfg.data.val_path):
        if given and given.startswith("builtin:"):  # (found from outside: builtin:nosuch passed)
            name = check_builtin(given)
            if given == cfg.data.path and cfg.task == "gan":  # (its classes and channels: a fine-tune's start)
                from bigbatch.data.builtin import CHANNELS, CLASSES

                metas[given] = {"class_names": CLASSES[name], "channels": CHANNELS}
            continue
        if not given:
            continue
        path = Location.of(given)
        if not path.url and not path.path.exists():
            here = "" if path.path.is_absolute() else f" in the current folder {os.getcwd()}"
            warn(f"data file {path} does not exist{here}: training refuses it until `bigbatch prepare` makes it")
            continue
        if not path.url and not path.path.is_file():
            raise BigbatchError(f"data file {path} is not a file; give a DATA.h5 that `bigbatch prepare` wrote")
        meta = metas[given] = read_meta(path, cfg.data.storage_options if path.url else None)
        if given in (cfg.data.path, cfg.data.dst_path):  # (found by review: the dry run passed them)
            key = "data.path" if given == cfg.data.path else "data.dst_path"
            check_one_shape(key, str(path), len(meta.get("groups") or []))
        _check_stored_size(cfg, given, meta)
    # The faces' face type, as the task takes it (a swap's of both sides; an XSeg's of src alone, or of both),
    # checked against the config's, the sides' and an XSeg's train.init_from.
    start = cfg.train.init_from
    starts = new_run and start and not is_url(start) and Path(start).exists()
    if cfg.task == "gan" and starts and cfg.data.path in metas:  # (found from outside: passed, refused by the run)
        gan_start(cfg, len(metas[cfg.data.path]["class_names"]), int(metas[cfg.data.path]["channels"]))
    src, dst = (SimpleNamespace(meta=metas[k]) if k in metas else None for k in (cfg.data.path, cfg.data.dst_path))
    if cfg.task not in ("swap", "xseg") or src is None or (dst is None and cfg.task == "swap"):
        return metas
    from bigbatch.tasks.swap.task import face_type_of

    face_type = face_type_of(cfg, src, dst or src, cfg.task)
    if cfg.task == "xseg" and starts:
        from bigbatch import models  # (found from outside: the dry run passed a start the run refused)
        from bigbatch.tasks.xseg.task import init_from

        init_from(models.create_segmenter(cfg.model.name, cfg.data.resolution, **cfg.model.options), start, face_type)
    return metas


def _check_stored_size(cfg: Any, given: str, meta: dict) -> None:
    """A GAN's images, or a swap's or XSeg's faces, at another size than data.resolution (or XSeg's without their
    labels): refused by the task's own check (found from outside: the dry run passed them); a classifier's stored
    smaller than it trains or scores at: warned of, as training warns."""
    whole = meta.get("crop") == "none"
    stored = meta.get("short_side" if whole else "resolution")
    if cfg.task == "gan" and given == cfg.data.path and (stored or (not whole and meta.get("height"))):
        from bigbatch.tasks.gan.checks import check_stored_size

        check_stored_size(cfg, stored or 0, whole, meta)
    elif cfg.task == "classify" and given in (cfg.data.path, cfg.data.val_path) and stored:  # (from outside: unsaid)
        from bigbatch.tasks.classify.validation import warn_upscaled

        held = SimpleNamespace(meta=meta, whole=whole, source=given)
        warn_upscaled(cfg, held if given == cfg.data.path else None, held if given == cfg.data.val_path else None)
    elif cfg.task == "swap" and given in (cfg.data.path, cfg.data.dst_path):
        from bigbatch.tasks.swap.load import NO_YAWS, check_face_size

        side = "src" if given == cfg.data.path else "dst"
        if stored or meta.get("height"):
            check_face_size(cfg, side, given, stored or 0, meta)
        if cfg.swap.uniform_yaw and not meta.get("face_yaws"):  # (found by review: the dry run passed them)
            cfg.swap._fail("uniform_yaw", f"needs each face's yaw, and the {side} faces {given} have none: {NO_YAWS}")
    elif cfg.task == "xseg" and given in (cfg.data.path, cfg.data.dst_path):  # (found by review: passed them)
        from bigbatch.tasks.swap.task import face_type_of
        from bigbatch.tasks.xseg.task import labelled

        side = "src" if given == cfg.data.path else "dst"
        shown = SimpleNamespace(channels=meta.get("channels", 4), source=given, resolution=stored or 0, meta=meta)
        if stored or meta.get("height"):
            labelled(cfg, shown, side)
        face_type_of(cfg, shown, shown, "xseg")  # (xseg.face_type against the faces')


def gan_start(cfg: Any, n_classes: int, channels: int) -> None:
    """A new GAN run's train.init_from against its models (built on the meta device) for data of `n_classes` and
    `channels`: the weights' family, shapes and classes, as the run checks them as it starts."""
    import warnings

    import torch

    from bigbatch.tasks.gan.checks import build_models
    from bigbatch.tasks.gan.finetune import init_from

    with torch.device("meta"):
        G, D = build_models(cfg, n_classes, channels)
    with warnings.catch_warnings():  # (torch's, of weights copied onto the meta device: a no-op there)
        warnings.simplefilter("ignore", UserWarning)
        init_from(cfg.train.init_from, G, D, cfg.model.name, main=False, quiet=True)


def build_on_meta(cfg: Any, warns: bool = True, data: dict | None = None) -> int | None:
    """Build the config's models on the meta device (no memory; `data`: the metadata of data.path, its classes and
    channels, where read, else 10 classes stand in, and 3 channels),
    so that --dry-run refuses what only their constructors check, as training would (a classifier's depth
    that is not 6n+2, a resolution a GAN family has no layers for, an unknown SAEHD archi). `warns`: a new run's
    (not a resume's): and refuse and say what a new run does of its settings as it starts (said on the first rank).
    Returns the bytes their weights, gradients, optimizer state and averages take whatever the micro-batch (a
    floor of the step's memory, activations on top; found from outside, a dry run said nothing of memory), or None
    where not known (a task of the user's own)."""
    import torch

    from bigbatch import models
    from bigbatch.tasks.interface import check_new_run, say_new_run

    trained, kept, states = [], [], 2  # (Adam's two moments a weight; SGD with momentum's one, RMSprop's one)
    # (the data's classes: found from outside, an ImageNet model's 1000-class head and embeddings counted as 10's)
    classes, channels = len((data or {}).get("class_names") or []) or 10, int((data or {}).get("channels") or 3)
    with torch.device("meta"):
        if cfg.task == "classify":
            trained = [models.create_classifier(cfg.model.name, classes, ch=cfg.model.ch, **cfg.model.options)]
            kept = trained * bool(cfg.train.model_ema_kimg)
            states = 2 if cfg.train.optimizer == "adamw" else int(cfg.train.momentum > 0)
        elif cfg.task == "gan":
            from bigbatch.tasks.gan.checks import build_models, check_path_length, warn_built
            from bigbatch.tasks.gan.finetune import freeze_d_blocks

            G, D = build_models(cfg, classes, channels)
            check_path_length(cfg, G)
            freeze_d_blocks(D, cfg.train.freeze_d)  # (found from outside: passed, refused by the run)
            if warns and os.environ.get("RANK", "0") == "0":
                warn_built(cfg, D)
            trained, kept = [G, D], [G]  # (G_ema)
        elif cfg.task == "swap":
            from bigbatch.tasks.swap.discriminators import discriminators
            from bigbatch.tasks.swap.task import build_model

            model = build_model(cfg)
            trained = [model, *discriminators(cfg, model).values()]  # (a patch D too large: found from outside)
            states = 2 if cfg.swap.optimizer == "adabelief" else 1
        elif cfg.task == "xseg":
            trained, states = [models.create_segmenter(cfg.model.name, cfg.data.resolution, **cfg.model.options)], 1
    if warns:  # (a new run's: found by review, the dry run of a resume refused what the resume takes)
        check_new_run(cfg)
        if os.environ.get("RANK", "0") == "0":  # (what it says of its settings: found from outside, said by the run
            say_new_run(cfg)  # alone)
    if not trained:
        return None
    from bigbatch.engine.memory import grad_bytes, state_bytes

    held = state_bytes(trained, []) + state_bytes(kept, [])  # (weights and buffers; the averages' copies of them)
    return held + sum(grad_bytes([m]) for m in trained) * states + grad_bytes(trained)  # (the states of each; the
    # gradients of one at a time)


LAUNCHED = ("train", "eval")  # the commands whose ranks work together (eval: each extracts its share of features)


def check_launch_counts(args: argparse.Namespace) -> None:
    """`bigbatch launch`'s numbers, checked before a cluster starts (found from outside: --nprocs 0 was said once a
    cluster had started, 13 s on, as "the cluster has 2 workers")."""
    if not 0 <= args.grace < math.inf:  # (found from outside: nan taken, and no rank would ever be killed)
        raise BigbatchError(f"--grace must be a number of seconds >= 0, got {args.grace:g}")
    if args.restarts < 0:
        raise BigbatchError(f"--restarts must be a count >= 0, got {args.restarts}")
    if args.nprocs is not None and args.nprocs < 1:
        raise BigbatchError(f"--nprocs must be a number of ranks, 1 or more, got {args.nprocs}")
    if args.nprocs and args.local and args.nprocs > args.local:
        raise BigbatchError(f"--nprocs {args.nprocs} is more than the {args.local} processes --local starts")


def check_launched(
    command: list[str], known: list[str], parse: Callable[[list[str]], argparse.Namespace], local: bool
) -> None:
    """What `bigbatch launch` runs, checked before a cluster starts: train or eval (of the `known` commands), and a
    train's preset (or config file, where it is here) and overrides, as `parse` reads them (found from outside: an
    unknown preset was each rank's error, once Ray had started). `local`: the cluster is this machine's, whose
    files the ranks see."""
    import difflib

    import bigbatch.batching  # noqa: F401 (their config checks, registered as they load: a model name, a batch plan)
    import bigbatch.tasks  # noqa: F401

    if command and command[0] not in LAUNCHED:
        if command[0] in known:  # (found from outside: prepare ran on every rank, the second refused its output)
            raise BigbatchError(
                f"{command[0]!r} runs once, not on every rank: run `bigbatch {command[0]} ...` itself; launch runs "
                f"{' or '.join(LAUNCHED)}"
            )
        close = "".join(f"did you mean {c!r}? " for c in difflib.get_close_matches(command[0], LAUNCHED, 1))
        raise BigbatchError(f"{command[0]!r} is not a bigbatch command: {close}launch {' or '.join(LAUNCHED)}")
    if command[:1] != ["train"]:
        return
    train = parse(command)
    if train.resume and not train.run_dir:  # (found from outside: said by each rank, once the cluster had started)
        raise BigbatchError(f"--resume{'=auto' if train.resume == 'auto' else ''} needs --run-dir naming the run")
    if local and train.resume == "yes":
        from bigbatch.rundir import check_resume

        check_resume(Path(train.run_dir), True)
    if (train.config and not Path(train.config).is_file()) or (train.resume and not (train.preset or train.config)):
        return  # (a file on the cluster's nodes, or the run's own config: the ranks read it)
    config_of(train, "digits")


def dry_resume(cfg: Any, run: Path, resume: bool | str) -> str:
    """What a resume of `run` would check and keep, without taking the run (found from outside: --dry-run
    --resume passed a changed train.batch that the resume refused, and described an "auto" it would not probe)."""
    from bigbatch import checkpoint_find, checkpoints
    from bigbatch.rundir import Run, _check_length, read_plan, resume_config

    try:
        ckpt: Path | None = checkpoint_find.find_checkpoint(run)
    except BigbatchError:  # (none complete, or latest damaged: the resume passes over those, to the newest intact)
        found = checkpoints.complete_checkpoints(run) if (run / "checkpoints").is_dir() else []
        ckpt = found[-1] if found else None
    if ckpt is None:
        if (run / "config.toml").is_file():
            resume_config(run / "config.toml", cfg, f"run {run}")
        return "; resumes from the start (the run has no checkpoint yet)"
    resumed = Run(run, resume_config(ckpt / "config.toml", cfg, f"checkpoint {ckpt}"), ckpt, resumed=True)
    _check_length(resumed, resume)
    said = f"; resumes {ckpt.name}"
    if (was := resumed.length_before) is not None and resumed.cfg.train.kimg > was:  # (said: found from outside)
        said += f", train.kimg {was:g} -> {resumed.cfg.train.kimg:g}"
    record, t = read_plan(run), resumed.cfg.train
    if t.micro_batch == "auto" and isinstance(kept := record.get("micro_batch"), int):
        # Probed again where the resume will (found from outside: "keeping" said of a resume with another budget,
        # precision or checkpointing, which probed again): the checkpoint's config stands for its plan's settings.
        from bigbatch.config import Config
        from bigbatch.engine import dist, memory

        was = Config.load(ckpt / "config.toml").train
        plan = {
            "world_size": record.get("world_size", 1),
            "precision": was.precision,
            "checkpointing": bool(was.checkpointing),
            "memory_budget_bytes": record.get("memory_budget_bytes"),
        }
        budget = memory.parse_bytes(t.memory_budget) if t.memory_budget else None
        how = (t.precision, bool(t.checkpointing))
        if memory.plan_holds(plan, dist.context(t.device).world_size, budget, str, *how):
            said += f", keeping the micro_batch {kept} its run planned"
        else:
            said += f', probing micro_batch "auto" again as it starts (its run planned {kept})'
    return said
