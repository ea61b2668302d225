"""A run's config as the commands that read a run take it: a data path the run was given relative to the folder it
trained in is found from there (found from outside: `bigbatch eval runs/a`, run from another folder than training's,
could not find the data of its held-out split, and nothing could be given to find it). Each checkpoint records that
folder with its data's identity (meta.json's "data") where a data path is relative. And where `bigbatch eval` writes
its reports in a run."""

from __future__ import annotations

import os
from pathlib import Path

import xxhash

from bigbatch import checkpoints
from bigbatch.config import Config
from bigbatch.errors import BigbatchError, warn
from bigbatch.files import json_loads
from bigbatch.urls import endpoint_options, is_url

DATA_PATHS = ("path", "val_path", "dst_path")


def _relative(value: str) -> bool:
    return bool(value) and not is_url(value) and not os.path.isabs(value)


def relative_data(cfg: Config) -> bool:
    """Whether any of `cfg`'s data paths is a local path relative to the current folder."""
    return any(_relative(getattr(cfg.data, key)) for key in DATA_PATHS)


def run_config(ckpt: Path, endpoint_url: str | None = None) -> Config:
    """The config of checkpoint `ckpt`, each relative data path (data.path, data.val_path, data.dst_path) taken from
    the folder the run trained in where it exists there (the file the run read, before one of that name here), else
    as it is (from the current folder). `endpoint_url`: an S3 endpoint to read its data from, in place of its
    data.storage_options' (their other options kept: urls.endpoint_options)."""
    cfg = Config.load(ckpt / "config.toml")
    if endpoint_url:
        cfg = cfg.override({"data.storage_options": endpoint_options(endpoint_url, cfg.data.storage_options)})
    folder = ((checkpoints.read_meta(ckpt) or {}).get("data") or {}).get("folder")
    if not isinstance(folder, str) or os.path.realpath(folder) == os.path.realpath("."):
        return cfg  # (a checkpoint from before the folder was recorded, or read from that folder)
    found = {}
    for key in DATA_PATHS:
        value = getattr(cfg.data, key)
        if _relative(value) and os.path.exists(there := os.path.join(folder, value)):
            found[f"data.{key}"] = there
    return cfg.override(found) if found else cfg


def resume_base(run: Path) -> Config:
    """The config a bare `train --resume` goes on with: the run's own, RUN/config.toml; where that is lost, or cut
    short (its bytes the start of the copy the newest complete checkpoint keeps, none at all too), that copy (not the
    default preset's; found from outside: a config.toml cut short was refused, with an intact copy in each
    checkpoint). A file edited otherwise is read as it is, and said wrong if it is."""
    saved, found = run / "config.toml", checkpoints.complete_checkpoints(run)
    kept = (found[-1] / "config.toml").read_bytes() if found else b""
    if saved.exists():
        text = saved.read_bytes()
        if not (found and len(text) < len(kept) and kept.startswith(text)):
            try:
                return Config.load(saved)
            except BigbatchError as e:  # (found from outside: the copy went unsaid)
                if found:
                    e.args = (f"{e}; or delete it, and the run resumes with the copy {found[-1].name} keeps",)
                raise
        warn(f"{saved} is cut short ({len(text)} of its {len(kept)} bytes): resuming with {found[-1].name}'s copy")
    elif not found:
        raise BigbatchError(f"{saved} is missing and the run has no complete checkpoint: give --config")
    return Config.load(found[-1] / "config.toml")


def run_root(run: str | Path, ckpt: Path) -> Path:
    """The run folder of `run` (a run, or one of its checkpoint folders) whose checkpoint `ckpt` is."""
    return Path(run) if (Path(run) / "checkpoints").is_dir() else ckpt.parent.parent


def eval_folder(run: str | Path, ckpt: Path, name: str, source: str, data_hash: str | None = None) -> Path:
    """RUN/eval/<name>-<checkpoint>/, where `bigbatch eval` writes its report on data `name` (a file's
    stem; "heldout" for the run's held-out split) scored with `ckpt`: one folder per data set and
    checkpoint, so that no report replaces another's (a folder of another data set of the same stem
    takes a digest of `source`, the data as the report names it, or of its `data_hash`, its content's, where
    known: the same file named from another folder is the same data). checkpoints/best/ is named by the
    images it had seen (best-000012.800): a later best gets a folder of its own."""
    root = run_root(run, ckpt)
    which = ckpt.name
    meta = checkpoints.read_meta(ckpt) if which == "best" else None
    if meta is not None and isinstance(meta.get("nimg"), int):
        which = f"best-{checkpoints.checkpoint_name(meta['nimg'])}"
    out = root / "eval" / f"{name}-{which}"
    try:
        said = json_loads((out / "metrics.json").read_text())
    except (OSError, ValueError):
        said = None
    if isinstance(said, dict) and said.get("data") is not None:
        # By content where both say it (found from outside: by name, the same file from another folder was other data)
        same = said["data_hash"] == data_hash if data_hash and said.get("data_hash") else said["data"] == source
        if not same:
            out = out.with_name(f"{out.name}-{xxhash.xxh64_hexdigest((data_hash or source).encode())[:8]}")
    return out
