"""The config sections of what a run writes as it trains: checkpoints, sample grids, evaluations (config.py
holds the tree; this file its output sections)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from bigbatch import config_types as limits  # (their MAX_... counts)
from bigbatch.config_types import MAX_RESOLUTION, Section, at_least_zero, at_most, positive

# Below this, resampling |z| > threshold would take ever more draws for no visible change.
MIN_TRUNCATION = 0.05


@dataclass
class CheckpointConfig(Section):
    _name = "checkpoint"

    every_kimg: float = 10.0
    """Write a checkpoint every this many kimg (and always at the end and on SIGINT/SIGTERM)."""
    every_minutes: float = 0.0
    """Also write one when this many minutes have passed since the last (0 = off; DeepFaceLab's autosave: 25), so
    that a crash loses at most that much however slow the steps; it counts toward checkpoint.keep like any other.
    Where it falls changes nothing trained: a run resumed from it goes on bit for bit."""
    keep: int = 3
    """How many of the newest checkpoints to keep; older ones are deleted."""

    def _validate(self) -> None:
        positive(self, "every_kimg", "keep")
        at_least_zero(self, every_minutes="a finite number of minutes >= 0 (0 = off)")


@dataclass
class SampleConfig(Section):
    _name = "sample"

    every_kimg: float = 5.0
    """Write a fixed-seed sample grid from G_ema every this many kimg (0 = none; checkpoints still draw
    their class and interpolation sheets)."""
    n: int = 64
    """Images in each grid (rows of 8; class-conditional grids show one class per row)."""
    seed: int = 0
    """Seed of the grid's z and labels, the same for the whole run."""
    truncation: float = math.inf
    """Resample entries of z whose magnitude exceeds this threshold (the BigGAN truncation trick); inf = off."""

    def _validate(self) -> None:
        positive(self, "n")
        at_most(self, n=65536)
        at_least_zero(self, seed="a whole number >= 0")
        if not self.every_kimg >= 0:
            self._fail("every_kimg", f"must be >= 0 kimg (0 = no sample grids), got {self.every_kimg}")
        if not self.truncation >= MIN_TRUNCATION:
            self._fail("truncation", f"must be a threshold >= {MIN_TRUNCATION} (inf = off), got {self.truncation}")


@dataclass
class EvalConfig(Section):
    _name = "eval"

    every_kimg: float = 0.0
    """Score G_ema (a classifier: its held-out split) every this many kimg and at the end of the run
    (0 = never during training)."""
    fine_from_kimg: float = 0.0
    """With eval.fine_every_kimg: from this many kimg on, score at that finer cadence instead, where a run
    nears its target, so that the time to reach it is known to the finer step (time-to-accuracy entries,
    DAWNBench's and MLPerf's, often score only late in the run)."""
    fine_every_kimg: float = 0.0
    """The cadence of the scores from eval.fine_from_kimg on (0 = eval.every_kimg throughout), or eval.every_kimg's
    where that is finer. It refines eval.every_kimg: with that at 0, nothing is scored during training."""
    metrics: str = "fid"
    """GAN: comma-separated metrics, fid, is, kid, pr (precision and recall, Kynkäänniemi et al. 2019,
    k = 3) and dc (density and coverage, Naeem et al. 2020, k = 5) of the pool features, these two against
    a seeded subset of the reference as large as eval.n (with the classifier extractor they are reported
    as fcd, cs, kcd, c_precision, c_recall, c_density, c_coverage). A classify run always reports
    val_top1, val_top5 and val_loss on its held-out split."""
    n: int = 10_000
    """Generated images per evaluation (the papers' FID uses 50,000; fewer gives a biased, higher FID)."""
    reference_n: int = 0
    """Data-set images for the reference statistics (0 = all); computed once and cached by hash."""
    extractor: str = "auto"
    """Feature network: "inception" (the TF Inception as a state dict) or "inception-torchscript"
    (StyleGAN's TorchScript file), "classifier" (a small classifier trained on the data set: fcd, cs,
    kcd), "classifier:RUN" (the classifier of a classify run, e.g. classifier:runs/fashion_resnet_fast-00000),
    or "auto" (Inception when its weights are present, else "classifier")."""
    weights: str = ""
    """Inception weights file to use instead of looking in BIGBATCH_CACHE/weights ("" = look there)."""
    batch_size: int = 64
    """Images per forward of G and of the feature network (results do not depend on it)."""
    seed: int = 0
    """Seed of the evaluated samples' z and labels (the same at every evaluation)."""
    truncation: float = math.inf
    """Truncation threshold of the evaluated samples (inf = none, as FID is usually reported)."""
    standing_stats: int = 0
    """Recompute the scored network's BatchNorm statistics before scoring; 0 = use the running statistics.
    GAN: G_ema's, from this many batches of fresh samples, on a copy (BigGAN's standing statistics).
    Classify: the classifier's (its average with train.model_ema_kimg), from the images of the latest this
    many training steps of the current phase, in place, so that they are kept and put to use ("precise
    BN", Wu & Johnson 2021: the running statistics are an average over weights that kept changing, and
    an average of weights has none of its own)."""
    best: str = ""
    """The metric whose best value keeps RUN/checkpoints/best/ ("" = the first of eval.metrics; of pr and dc, one
    of their values: precision, recall, density or coverage, else the first; classify: val_top1, or val_top5 or
    val_loss; swap: ssim, src_ssim or dst_ssim; xseg: iou, or val_loss)."""
    classifier: dict[str, Any] = field(default_factory=dict)
    """Options of the "classifier" extractor (resolution, width, steps, batch, lr, seed)."""
    resolution: int = 0
    """Classify: the side the held-out split is scored, and `predict` and exports take images, at (0: where the last
    step trained); above it ImageNet nets score higher after random-resized crops (FixRes; FFCV's: 160-192 px, 256)."""
    tta: bool = False
    """Classify: score the held-out split with each image's probabilities averaged with its mirror image's (flip TTA,
    FFCV's lr_tta and airbench's; `bigbatch eval --tta`'s): the val_* rows, checkpoints/best/ and a plateau schedule
    read those scores, and `bigbatch eval` of the run scores so."""

    def _validate(self) -> None:
        at_least_zero(
            self, **dict.fromkeys(("every_kimg", "fine_from_kimg", "fine_every_kimg"), "a finite number >= 0 (0 = off)")
        )
        names = ("auto", "inception", "inception-torchscript", "classifier")
        if self.extractor not in names and not re.fullmatch(r"classifier:.+", self.extractor):
            self._fail("extractor", f"must be one of {', '.join(names)} or classifier:RUN, got {self.extractor!r}")
        if self.n < 2:
            self._fail("n", f"must be at least 2 images, got {self.n}")
        at_least_zero(self, seed="a whole number >= 0", resolution="0 (where it trained) or a side in pixels")
        if self.reference_n < 0 or self.reference_n == 1:
            self._fail("reference_n", f"must be 0 (all images) or at least 2, got {self.reference_n}")
        positive(self, "batch_size")
        at_least_zero(self, standing_stats="a number of batches >= 0")
        at_most(
            self, n=limits.MAX_SCORED, reference_n=1 << 40, standing_stats=limits.MAX_STANDING,
            batch_size=limits.MAX_EVAL_BATCH, resolution=MAX_RESOLUTION,
        )  # fmt: skip
        if not self.truncation >= MIN_TRUNCATION:
            self._fail("truncation", f"must be a threshold >= {MIN_TRUNCATION} (inf = off), got {self.truncation}")

    def count(self, nimg: int) -> int:
        """How many scores are due by `nimg` images seen (every eval.every_kimg, from eval.fine_from_kimg
        every eval.fine_every_kimg), the run's end not counted: a score is due when a step moves it."""
        if not self.every_kimg:
            return 0
        every, fine = max(1, round(self.every_kimg * 1000)), round(self.fine_every_kimg * 1000)
        if not (fine := min(fine, every)):  # (found from outside: a fine cadence coarser than every_kimg, scores rarer)
            return nimg // every
        # Every's ticks before `start`, fine's from it on, `start` itself one of them where on fine's grid (found
        # from outside: every 0.8, finer from 1.2, scored at 0.8 and 1.4 on).
        start = round(self.fine_from_kimg * 1000)
        return max(0, min(nimg, start - 1)) // every + max(0, nimg // fine - (max(start, 1) - 1) // fine)
