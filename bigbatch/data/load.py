"""`load_data`: open the data set any `data.path` names (built-in, or a DATA.h5 local or remote);
`training_data` and `validation_data`: the splits a config trains and validates on."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from bigbatch.config import Config
from bigbatch.data.builtin import BUILTIN
from bigbatch.data.images import ImageData
from bigbatch.data.split import Subset, holdout
from bigbatch.errors import BigbatchError, warn

if TYPE_CHECKING:
    from bigbatch.data.hdf5 import H5Data


def check_builtin(path: str) -> str:
    """The name of a built-in data set `path` (builtin:NAME) names, or one line naming those there are."""
    name = path.removeprefix("builtin:")
    if name not in BUILTIN:
        raise BigbatchError(f"unknown built-in data set '{name}'; valid: {', '.join('builtin:' + n for n in BUILTIN)}")
    return name


def load_data(
    path: str | os.PathLike, resolution: int, in_ram: bool = False, storage_options: dict[str, Any] | None = None
) -> ImageData | H5Data:
    """Open a data set named by `data.path`: builtin:NAME (made at `resolution`), or a DATA.h5 written
    by `bigbatch prepare`, local or at an fsspec URL (s3://bucket/DATA.h5), as it was prepared.
    `in_ram` reads a data file's images into memory once; `storage_options` go to fsspec (credentials
    are better left to the environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL)."""
    path = os.fspath(path)  # (a pathlib.Path as a string: found from outside, Loader(Path(...)) crashed)
    if path.startswith("builtin:"):
        return BUILTIN[check_builtin(path)](resolution)
    from bigbatch.urls import Location, public_name

    location = Location.of(path, f"data set {public_name(path)}")
    if location.url or location.text.lower().endswith((".h5", ".hdf5")):
        from bigbatch.data.hdf5 import H5Data

        return H5Data(location, in_ram=in_ram, storage_options=storage_options)
    import shlex

    raise BigbatchError(  # (the command that makes one of it: found from outside, a folder of shards left to guess)
        f"cannot open data set '{location.name}': give a DATA.h5 written by `bigbatch prepare` (a path or "
        f"s3://... URL) or one of {', '.join('builtin:' + n for n in BUILTIN)}; of images, a folder, an archive or "
        f"shards: `bigbatch prepare {shlex.quote(location.text)} DATA.h5` makes one"
    )


def stored_side(data: Any) -> int:
    """The side of a prepared file's stored squares, or the short side its whole images were prepared at
    (`--crop none`; 0: a set made when read): what a resolution above it upscales. Whole images of which prepare
    kept some below that side at their own size: the median image's short side, where it is smaller (found from
    outside: images of short side 56 prepared at 64 were trained at 64 unsaid, and scored at 72 as of 64); a dry
    run's, of the file's metadata alone, the side asked of prepare."""
    meta = getattr(data, "meta", {})
    side = int(meta.get("resolution", 0))
    if getattr(data, "whole", False) and meta.get("below_short_side") and hasattr(data, "stored_sizes"):
        shorts = data.stored_sizes(np.arange(len(data))).min(1)
        side = min(side, int(np.median(shorts)))
    return side


def stored_images(data: Any, side: int) -> str:
    """What a prepared file holds, by its stored_side, for a message: 'whole images of short side 64px' or '64px
    images'."""
    return f"whole images of short side {side}px" if getattr(data, "whole", False) else f"{side}px images"


def rectangles(meta: dict[str, Any]) -> str:
    """'WxH images, not squares' for a data file of one shape that is not square (neither whole images nor
    buckets), else '': what a task or Loader that reads squares names when it refuses the file."""
    w, h = meta.get("width") or 0, meta.get("height") or 0
    return f"{w}x{h} images, not squares" if meta.get("crop") != "none" and w and h and w != h else ""


def check_one_shape(key: str, source: str, groups: int) -> None:
    """Training reads a data file of one shape: one of `groups` > 1 (prepare --buckets) is refused, as training
    and the dry run say it."""
    if groups > 1:
        raise BigbatchError(
            f"{key} {source} holds images of several shapes (prepare --buckets): training reads one shape "
            "at a time; prepare the training images without --buckets (a bucketed file serves as data.val_path, "
            "with data.val_rect = true)"
        )


def training_data(cfg: Config) -> Any:
    """The data set a config trains on: data.path, less the images held out by data.val_fraction (when
    there is no data.val_path)."""
    d = cfg.data
    data = load_data(d.path, d.resolution, d.in_ram, d.storage_options or None)
    check_one_shape("data.path", data.source, len(getattr(data, "bucket_counts", [])))
    if not d.val_fraction or d.val_path:
        return data
    train, val = holdout(data, d.val_fraction, val_path=cfg.task == "classify")
    if len(val) > len(train):  # (a typo for 0.09, or a fraction for the training split: said, not refused)
        warn(
            f"data.val_fraction {d.val_fraction:g} holds out {len(val)} of the {len(data)} images and trains on the "
            f"other {len(train)}: it is the held-out share (e.g. 0.1)",
            once=True,
        )
    return train


def validation_data(cfg: Config, train: Any = None) -> Any:
    """The held-out split a config validates on: data.val_path, or the images data.val_fraction holds
    out of data.path (taken from `train`, the training split, when given), or None."""
    d = cfg.data
    if d.val_path:
        return load_data(d.val_path, d.resolution, d.in_ram, d.storage_options or None)
    if not d.val_fraction:
        return None
    parent = (
        train.data
        if isinstance(train, Subset)
        else load_data(d.path, d.resolution, d.in_ram, d.storage_options or None)
    )
    return holdout(parent, d.val_fraction)[1]
