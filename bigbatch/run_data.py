"""A run's config as the commands that read a run take it: a data path the run was given relative to the folder it
trained in is found from there when it is not found from here (found from outside: `bigbatch eval runs/a`, run from
another folder than training's, could not find the data of its held-out split, and nothing could be given to find
it). Each checkpoint records that folder with its data's identity (meta.json's "data")."""

from __future__ import annotations

import os
from pathlib import Path

from bigbatch import checkpoints
from bigbatch.config import Config
from bigbatch.urls import is_url

DATA_PATHS = ("path", "val_path", "dst_path")


def run_config(ckpt: Path) -> Config:
    """The config of checkpoint `ckpt`, its relative data paths (data.path, data.val_path, data.dst_path) that do not
    exist from the current folder taken from the folder the run trained in, where they exist there."""
    cfg = Config.load(ckpt / "config.toml")
    folder = ((checkpoints.read_meta(ckpt) or {}).get("data") or {}).get("folder")
    if not isinstance(folder, str):
        return cfg  # (a checkpoint from before the folder was recorded)
    found = {}
    for key in DATA_PATHS:
        value = getattr(cfg.data, key)
        if not value or is_url(value) or os.path.isabs(value) or os.path.exists(value):
            continue
        there = os.path.join(folder, value)
        if os.path.exists(there):
            found[f"data.{key}"] = there
    return cfg.override(found) if found else cfg
