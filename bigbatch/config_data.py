"""The config section of the data a run trains on (config.py holds the tree; this file its data section)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from bigbatch import config_types as limits  # (their MAX_... counts)
from bigbatch.config_types import MAX_RESOLUTION, Section, at_least_zero, at_most
from bigbatch.urls import WHERE_CREDENTIALS_GO, option_credentials


@dataclass
class DataConfig(Section):
    _name = "data"

    path: str = "builtin:digits"
    """DATA.h5 written by `bigbatch prepare`, or builtin:NAME (builtin:digits, builtin:fashion-mnist)."""
    resolution: int = 32
    """Side of the square training images in pixels (GANs: a power of two; their models are built for
    it). Classifiers take any size: it is the first phase's, and the held-out split's, resolution."""
    xflip: bool = False
    """Augment by mirroring each image left-right with probability 1/2 (off for digits: 2 and 5 are not symmetric)."""
    workers: int = 0
    """Processes that read, resize and flip batches ahead of the training step (DataLoader workers,
    each opening the data file itself); 0 reads in the training process. Results do not depend on it."""
    in_ram: bool = False
    """Read a DATA.h5's images into memory once at start instead of reading each batch from the file
    (built-in data sets are always in memory)."""
    decode: Literal["cpu", "gpu", "nvimgcodec"] = "cpu"
    """JPEG training images decoded "cpu" in the loader's workers (bit-exact), "gpu" in batches on the CUDA device
    (nvJPEG; pixels within a few levels) or "nvimgcodec" there by NVIDIA's nvImageCodec (an optional package)."""
    storage_options: dict[str, Any] = field(default_factory=dict)
    """fsspec options for an s3://... data.path, e.g. {endpoint_url = "http://127.0.0.1:9000"} or
    {profile = "training"}. Credentials belong in the environment (AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY), never here: the config is saved with the run."""
    schedule: list[dict[str, Any]] | str = field(default_factory=list)
    """Phases by images seen (dynamic batch size), e.g. [{kimg = 0, batch = 256}, {kimg = 500, batch = 1024}]
    or "0:32:256,500:32:1024" (KIMG:RESOLUTION:BATCH). A phase starts at the first step at or after its
    kimg (or nimg); a left-out batch or resolution keeps the previous phase's (the first phase's:
    train.batch and data.resolution); a batch written "2x" is twice train.batch, so the phases follow
    an override or sweep of train.batch (the presets write theirs so). Empty: train.batch throughout.
    A classifier's phases may change the resolution (progressive resizing) and give the learning
    rate: lr = [start, end] (linear over the phase) or one number, at train.lr_batch images per step like train.lr, e.g.
    {kimg = 0, resolution = 128, batch = 512, lr = [1.0, 2.0]} or "0:128:512:1.0:2.0" on the command line."""
    dst_path: str = ""
    """swap: the dst faces (DATA.h5 or builtin:NAME), trained beside data.path's src faces; a fourth
    channel (`bigbatch prepare --masks`) is the face mask, a fifth the eyes-and-mouth region."""
    val_path: str = ""
    """classify: the held-out split, a second data set (DATA.h5 or builtin:NAME, e.g.
    builtin:fashion-mnist-test) scored as val_top1, val_top5 and val_loss. "": data.val_fraction."""
    val_fraction: float = 0.0
    """classify, without data.val_path: hold out this fraction of data.path (chosen by a fixed seed,
    the same images on every run and every rank, never trained on); 0 = no validation."""
    val_rect: bool = False
    """classify: rectangular validation (fast.ai's DAWNBench ImageNet): images keep their aspect
    ratio (each its own from `prepare --crop none` data, the bucket's from `--buckets` data), batches
    of one shape each, the short side resized to data.val_crop x the resolution and center-cropped to
    the resolution, the long side to a multiple of 8. False: the usual square center crop (resize to
    val_crop x resolution, crop the center)."""
    val_crop: float = 1.0
    """classify: validation images are resized so their short side is this times the current phase's
    resolution, then center-cropped to it (ImageNet: 256/224 = 1.142857, i.e. 256 -> 224; 1.0: no crop)."""

    def _validate(self) -> None:
        if self.resolution < 4:
            self._fail("resolution", f"must be at least 4 pixels, got {self.resolution}")
        at_most(self, resolution=MAX_RESOLUTION)
        if not (math.isfinite(self.val_fraction) and 0 <= self.val_fraction < 1):
            self._fail("val_fraction", f"must be a fraction in [0, 1), got {self.val_fraction}")
        if not 1 <= self.val_crop <= 2:
            self._fail(
                "val_crop",
                f"must be a ratio in [1, 2] (ImageNet's usual: 256/224 = 1.142857; torchvision's and FFCV's crop "
                f"ratio 0.875 is its inverse), got {self.val_crop}",
            )
        at_least_zero(self, workers="a number of processes >= 0")
        if self.workers > limits.MAX_PROCESSES:  # (found from outside: 2**63 forked until memory ran out)
            self._fail("workers", f"must be 0 to {limits.MAX_PROCESSES} processes, got {self.workers}")
        secrets = sorted(option_credentials(self.storage_options))
        if secrets:
            self._fail(
                "storage_options",
                f"holds credentials ({', '.join(secrets)}), which would be saved in the run's config.toml and "
                f"shown; {WHERE_CREDENTIALS_GO}",
            )
