"""The classify task: an image classifier (a registered classify family: ResNet-18/50, the CIFAR
ResNets) trained on the Replicator with the fast-ImageNet recipe's parts, each a config key:
progressive resizing and dynamic batch (data.schedule phases, with an lr range each), warm-up then
linear/cosine/step decay with the rate scaled to the batch (train.lr, train.lr_batch), no weight
decay on normalization parameters and biases (train.norm_decay), zero-initialised last BN gamma per
residual block (model.options.zero_init_residual), label smoothing, random-resized-crop and flip
augmentation, and square or rectangular validation on a held-out split (data.val_path or
data.val_fraction), logged as val_top1, val_top5 and val_loss.

As for the GAN, every random draw is keyed by the step's global positions (crops by the step, flips
by the loader), so 1 process x k micro-batches and k processes train the same weights.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from bigbatch import models
from bigbatch.config import OPTIMIZER_KEYS, Config, unread_optimizer_keys
from bigbatch.data.load import validation_data
from bigbatch.data.schedule import PHASES_REPLACE, phase_sides, resize_batch, schedule_of
from bigbatch.engine import batch_parts, running_stats
from bigbatch.engine import precision as prec
from bigbatch.engine.ema import make_ema, update_ema
from bigbatch.engine.replicator import Replicator
from bigbatch.errors import BigbatchError, warn
from bigbatch.models import contract
from bigbatch.models.registry import is_own
from bigbatch.sampling import BLACK, GREEN, RED, captioned_sheet, from_uint8, to_uint8
from bigbatch.tasks.classify import erasing, mixing, optim, randaugment
from bigbatch.tasks.classify.finetune import body_and_head, load_pretrained
from bigbatch.tasks.classify.lr import batch_scale, lr_schedule
from bigbatch.tasks.classify.lr import check as check_rates
from bigbatch.tasks.classify.scorer import ClassifyScorer, Plateau
from bigbatch.tasks.classify.validation import (
    METRICS,
    ROTATIONS,
    Validation,
    check_classes,
    rotate,
    rotation_labels,
    warn_upscaled,
)
from bigbatch.tasks.interface import BATCH_SHEET, Feed, check_family, peek, refuse_face_sets, refuse_sections, register

# Keys of the GAN task that a classify run does not read (changing them is a mistake worth saying).
GAN_TRAIN_KEYS = (
    "d_steps", "g_lr", "d_lr", "loss", "g_ortho", "d_ortho", "freeze_d", "ema_halflife_kimg", "ema_start_kimg",
    "ema_buffers", "r1_gamma", "r1_every", "r2_gamma", "gp", "lecam", "lecam_decay", "lecam_start", "pl_weight",
    "pl_every", "pl_batch_shrink", "pl_decay", "cr_real", "cr_fake", "zcr_d", "zcr_g", "zcr_radius", "cond_lambda",
)  # fmt: skip


GAN_EVAL_KEYS = ("metrics", "n", "reference_n", "extractor", "weights", "truncation", "classifier")  # (eval's)


def _toml(value: Any) -> str:
    """A default as a command line's key=value gives it."""
    return (
        str(value).lower() if isinstance(value, bool) else str(list(value)) if isinstance(value, tuple) else str(value)
    )


def check_config(cfg: Config) -> None:
    """What the classify task makes of the config: a classify model family and its options, a schedule
    whose phases all give an lr or none (then train.lr's warm-up and decay apply), a held-out split to
    score when evaluation is on, and none of the GAN's keys."""
    m = cfg.model
    check_family(cfg, "classify", "classifier")
    foreign = cfg.train.changed(*GAN_TRAIN_KEYS) + m.changed("dim_z", "sn_update")
    if foreign:
        raise BigbatchError(
            f"config key '{foreign[0]}' is a GAN key, not read by task = \"classify\"; a classifier's are train.lr, "
            "train.optimizer, train.momentum, train.weight_decay, train.warmup_kimg, train.lr_decay; remove it"
        )
    t = cfg.train
    if cfg.eval.tta and t.labels == "rotation":
        cfg.eval._fail(
            "tta", 'averages with the mirror image, which swaps the rotations learned (train.labels = "rotation")'
        )
    refuse_sections(cfg, 'task = "classify"', "swap", "xseg", "augment")
    if other := t.changed(*unread_optimizer_keys(t.optimizer)):
        uses = " and ".join(f"train.{k}" for k in OPTIMIZER_KEYS[t.optimizer])
        defaults = type(t)()
        reset = " ".join(f"{k}={_toml(getattr(defaults, k.removeprefix('train.')))}" for k in other)
        raise BigbatchError(
            f"config key '{other[0]}' is not read by train.optimizer = \"{t.optimizer}\", which reads {uses}; "
            f"remove it, or reset what a preset set ({reset}), or choose an optimizer that reads it"
        )
    check_rates(cfg)
    if t.freeze_kimg and not t.init_from:  # (a linear probe of random features: said, as likely a mistake)
        warn(
            "train.freeze_kimg freezes the body, and there is no train.init_from to load it: it stays random", once=True
        )
    elif t.freeze_kimg >= t.kimg > 0:
        warn(
            f"train.freeze_kimg {t.freeze_kimg:g} lasts the whole run of {t.kimg:g} kimg: the body never trains",
            once=True,
        )
    if t.randaugment:
        randaugment.check(t.randaugment)
    mixing.check(t)
    if t.mixup or t.cutmix:  # (what any world size refuses, here: found from outside, --dry-run passed it)
        _check_pairs(cfg, 1)
    if t.changed("ema_rampup") and not t.model_ema_kimg:
        t._fail(  # (found from outside: a preset's rampup, and "set model_ema_kimg" to one turning the average off)
            "ema_rampup",
            f"caps the half-life of the weights' average, which is off (train.model_ema_kimg 0): give the average a "
            f"half-life, or turn the cap off with it (train.ema_rampup={_toml(type(t)().ema_rampup)})",
        )
    if cfg.eval.every_kimg and not (cfg.data.val_path or cfg.data.val_fraction):
        raise BigbatchError(
            "config key 'eval.every_kimg' asks for validation, but there is no held-out split: set data.val_path "
            "(e.g. builtin:fashion-mnist-test) or data.val_fraction (e.g. 0.1)"
        )
    if cfg.data.val_path and cfg.data.val_fraction:
        cfg.data._fail("val_fraction", "holds out part of data.path, but data.val_path is the held-out split: set one")
    if cfg.eval.best not in ("", *METRICS):
        cfg.eval._fail("best", f"must be one of {', '.join(METRICS)} for a classifier, got {cfg.eval.best!r}")
    if 0 < cfg.eval.resolution < 4:  # (as eval --resolution; found from outside: scored at 1 px)
        cfg.eval._fail("resolution", f"must be 0 (where it trained) or at least 4 pixels, got {cfg.eval.resolution}")


def param_groups(model: nn.Module, weight_decay: float, norm_decay: bool) -> list[dict[str, Any]]:
    """Optimizer parameter groups: weight decay on the weights of convolutions and linear layers only
    (every parameter of more than one dimension), none on normalization parameters and biases unless
    `norm_decay` (fast.ai's ImageNet in 18 minutes; Goyal et al. 2017 sec. 5.1 also exempt BN)."""
    decay, exempt = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if norm_decay or p.ndim > 1 else exempt).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    return groups + ([{"params": exempt, "weight_decay": 0.0}] if exempt else [])


def _check_pairs(cfg: Config, world_size: int) -> None:
    """Mixup and CutMix mix pairs of neighbouring images: every micro-batch of every process holds whole pairs."""
    t = cfg.train
    shares = [p.batch // world_size for p in schedule_of(cfg).phases]  # (every phase's)
    if any(n % 2 or (isinstance(t.micro_batch, int) and min(t.micro_batch, n) % 2) for n in shares):
        raise BigbatchError(
            "train.mixup and train.cutmix mix pairs of neighbouring images: give an even train.micro_batch and "
            f"batches whose share a process takes is even (now {shares}, micro-batch {t.micro_batch})"
        )


def refuse_scoring_keys(cfg: Config) -> None:
    """The GAN's scoring keys, refused as a new run starts (found from outside: eval.metrics=fid was taken, and the
    run reported top-1 alone); a saved run that holds one still loads, resumes, is scored and exported (found by
    review: refused on every load, they had been taken before)."""
    scored = cfg.eval.changed(*GAN_EVAL_KEYS) + cfg.sample.changed("truncation") + cfg.model.changed("conditional")
    if scored:
        raise BigbatchError(
            f"config key '{scored[0]}' is for a GAN, not read by task = \"classify\"; a classifier's evaluation "
            "reports val_top1, val_top5 and val_loss on its held-out split (eval.every_kimg, eval.best, "
            "eval.resolution): remove it"
        )


def warn_unread(cfg: Config) -> None:
    """Keys a run's training settings leave unread, said as it starts (not refused: a run saved with a preset's
    former train.lr = 1 still resumes; not on eval, info or a resume either, where nothing can be done of it: found
    from outside). timm's --decay-epochs under a cosine schedule, and Nesterov without momentum, were silent."""
    t = cfg.train
    by_phase = schedule_of(cfg).phases[0].lr is not None
    unread = t.changed(*PHASES_REPLACE) if by_phase else []
    if unread:
        warn(f"config key '{unread[0]}' is not read: data.schedule's phases give the learning rates", once=True)
    elif t.lr_decay != "step" and (steps := t.changed("lr_steps", *(() if t.lr_decay == "plateau" else ("lr_gamma",)))):
        warn(f'config key \'{steps[0]}\' is not read by train.lr_decay = "{t.lr_decay}" (only by "step")', once=True)
    if t.optimizer == "sgd" and t.nesterov and not t.momentum:  # (torch's SGD refuses it: turned off here)
        warn("train.nesterov needs train.momentum > 0, which is 0: plain SGD without momentum is trained", once=True)


def warn_new_run(cfg: Config, trains: bool = True) -> None:
    """What a new run says of its settings as it starts, and its dry run (found from outside: the dry run said
    none): keys it leaves unread, phases at none of them at data.resolution, and, where it `trains` (not lr-find or
    show-batch), decays, phases and a warm-up that the run's length never reaches or leaves."""
    warn_unread(cfg)
    optim.warn_unadapted(cfg.train)
    if cfg.eval.tta and not cfg.data.xflip:
        warn(
            "eval.tta averages each held-out image with its mirror, which a run without mirrored images "
            "(data.xflip = false) never sees: drop eval.tta unless mirrored images mean the same"
        )
    # (a phase of resolution 0 trains at data.resolution: found from outside, warned of as none did, with no sides)
    sides = phase_sides(cfg)
    if cfg.data.schedule and cfg.data.resolution not in sides:
        # (a data.resolution override on a preset whose phases name theirs: the phases win)
        warn(
            f"data.schedule's phases train at {', '.join(map(str, sides))} px and none at data.resolution = "
            f"{cfg.data.resolution}: the run trains and evaluates at theirs; to change them, write the phases' "
            "resolutions (data.schedule)"
        )
    if trains:
        _warn_past_the_end(cfg)


@register("classify", check=check_config, new_run=refuse_scoring_keys, says=warn_new_run)
def build(
    cfg: Config, rep: Replicator, data: Any, *, run: Path | None, resumed_at: int | None, quiet: bool
) -> ClassifyTask:
    """The classifier `model.name` for the data set's classes, prepared by `rep`, with SGD or AdamW."""
    refuse_face_sets(data, 'task = "classify"')
    rotation = cfg.train.labels == "rotation"
    if data.n_classes < 2 and not rotation:
        raise BigbatchError(
            f"data set {data.source} has {data.n_classes} class(es): a classifier needs labelled images of at least 2 "
            'classes (prepare a folder with one sub-folder per class), or train.labels = "rotation" for unlabelled data'
        )
    t, m = cfg.train, cfg.model
    n_classes = len(ROTATIONS) if rotation else data.n_classes
    mixing.check_threshold(t, n_classes)
    net = models.create_classifier(m.name, n_classes, ch=m.ch, img_channels=data.channels, **m.options)
    if not is_own(m.name):  # (a user's own family: its contract checked on two inputs)
        contract.check_classifier(m.name, net, n_classes, data.channels, cfg.data.resolution)
    if t.init_from and resumed_at is None:
        said = load_pretrained(net, t.init_from, ROTATIONS if rotation else data.class_names, m.name)
        # Assumptions about a file's classes or input scale: said under --quiet too, as a warning (found from outside:
        # --quiet hid that torchvision's weights want ImageNet's statistics)
        if rep.is_main and ("taken as the data's" in said or "input_stats" in said):
            warn(said)
        elif rep.is_main and not quiet:
            print(said, flush=True)
    model = rep.prepare(net.train())
    if t.mixup or t.cutmix:  # (pairs of neighbouring images: micro-batches that never cut one)
        _check_pairs(cfg, rep.world_size)
        rep.takes_micro = lambda m: m % 2 == 0
    groups = param_groups(net, t.weight_decay, t.norm_decay)
    if t.freeze_kimg or t.body_lr_mult != 1:  # fine-tuning: the body's groups apart from the head's
        groups = body_and_head(groups, net, t.body_lr_mult, train_bn=t.train_bn and t.freeze_kimg > 0)
    kernels = prec.optimizer_kernels(rep.device)  # (fused on a GPU)
    opt = optim.build(t, groups, kernels)
    rep.wrap_optimizer(opt, "model")
    task = ClassifyTask(cfg, rep, data, model, opt, run, resumed_at, quiet)  # (which may refuse the data)
    if rep.is_main and resumed_at is None:  # (once the data and model are taken: a refusal is said alone)
        warn_upscaled(cfg, data, task.val_data if cfg.data.val_path else None)  # (a share of data.path: as it is)
    return task


def _warn_past_the_end(cfg: Config) -> None:
    """Step decays and phases (absolute kimg) that a run shortened below them never reaches, and a warm-up it never
    leaves, said (found from outside: fashion_resnet at train.kimg=60 trained at its full rate throughout, its steps
    at 300 and 450; a preset's 30 kimg warm-up in a 0.256 kimg run)."""
    t, kimg = cfg.train, cfg.train.kimg
    late = [k for k in t.lr_steps if k >= kimg] if t.lr_decay == "step" else []
    if late:
        warn(
            f"train.lr_steps {', '.join(f'{k:g}' for k in late)} kimg lie at or past the run's end (train.kimg "
            f"{kimg:g}): the learning rate never steps down there; give steps within the run (train.lr_steps=[...])"
        )
    phases = [p for p in schedule_of(cfg).phases if p.start >= t.images]
    if phases:
        shown = ", ".join(f"{p.start / 1000:g} ({p.resolution} px, batch {p.batch})" for p in phases)
        warn(
            f"data.schedule's phases from kimg {shown} begin at or past the run's end (train.kimg {kimg:g}): the run "
            "never trains (or evaluates) so; write the phases for this length (data.schedule)"
        )
    if t.warmup_kimg >= kimg:
        warn(
            f"train.warmup_kimg {t.warmup_kimg:g} is not shorter than the run (train.kimg {kimg:g}): the learning "
            "rate never leaves its warm-up; shorten the warm-up with the run (e.g. train.warmup_kimg=0)"
        )
    if (t.mixup or t.cutmix) and t.mixup_off_kimg >= kimg:  # (found from outside: unsaid)
        warn(f"train.mixup_off_kimg {t.mixup_off_kimg:g} lies at or past the run's end (train.kimg {kimg:g}): mixing "
             "never stops")  # fmt: skip


class ClassifyTask:
    """One optimizer step per iteration on the feed's next batch: cross-entropy (label smoothing) of
    the augmented images, the learning rate of the step set from images seen."""

    usage = "Score it: bigbatch eval {run} [DATA]; use it: bigbatch predict {run} IMAGE..., bigbatch export {run} OUT"

    def __init__(
        self,
        cfg: Config,
        rep: Replicator,
        data: Any,
        model: nn.Module,
        opt: torch.optim.Optimizer,
        run: Path | None,
        resumed_at: int | None,
        quiet: bool,
    ):
        self.cfg, self.rep, self.data, self.model, self.opt = cfg, rep, data, model, opt
        if cfg.train.labels == "rotation":  # (found from outside: it named eval, which scores class labels only)
            self.usage = "Fine-tune it on your classes: bigbatch train ... train.init_from={run}"
        self.schedule = schedule_of(cfg)
        self.plateau = Plateau(cfg) if cfg.train.lr_decay == "plateau" else None  # (its factor follows the scores)
        self.lr = lr_schedule(cfg) if self.plateau is None else self.plateau.rates(lr_schedule(cfg))
        self.rotation = cfg.train.labels == "rotation"
        self.randaugment = randaugment.parse(cfg.train.randaugment) if cfg.train.randaugment else None
        self.class_names = ROTATIONS if self.rotation else data.class_names
        self.steps = 0
        # The average of the weights (train.model_ema_kimg): what is scored, kept as best and put to use.
        self.ema = make_ema(self.plain()) if cfg.train.model_ema_kimg else None
        # A position of the last step: its phase's resolution is validated (resumed: the image before the checkpoint,
        # as phase_trained has it; found from outside, a checkpoint at a phase's start was scored at the next's side)
        self.nimg = max(0, (resumed_at or 0) - 1)
        self.seen = resumed_at or 0  # images seen after it
        self.frozen_until = round(cfg.train.freeze_kimg * 1000)  # images for which the body is frozen
        self.val_data = validation_data(cfg, data)
        if self.val_data is not None and not self.rotation and run is not None:
            try:  # (what training validates on; lr-find and show-batch do not read it)
                check_classes(
                    self.val_data,
                    data.class_names,
                    f"data.path {data.source}",
                    "give data.val_path images of its classes (prepare VAL val.h5 --classes DATA.h5 numbers VAL's "
                    "class folders as DATA.h5's classes; with --labels FILE.csv, a flat folder's), or hold out part "
                    'of data.path instead: data.val_path="" data.val_fraction=0.1',
                )
            except BigbatchError as e:
                if cfg.eval.every_kimg:
                    raise
                if rep.is_main:  # not scored while training: `bigbatch eval RUN` would refuse it afterwards
                    warn(f"{e} (training goes on: eval.every_kimg is 0, but `bigbatch eval` of the run refuses it)")
        # The random-resized crops are cut by the loader from the images as stored, then resized to the phase's size
        # (found from outside: stored squares were shrunk to it first, the crops enlarged from that); an encoded
        # file's before decoding, on the CPU or on the GPU.
        self.loader_crop_scale = cfg.train.crop_scale if cfg.train.crop_scale < 1 else 0.0
        self._shown: Validation | None = None  # what previews read their images through
        self.scorer: ClassifyScorer | None = None
        if cfg.eval.every_kimg and run is not None and self.val_data is not None:
            self.scorer = ClassifyScorer(self, run, resumed_at, quiet or not rep.is_main)

    # lr-find (bigbatch.lr_find): the rate is train.lr, per train.lr_batch images; the curve is the loss.
    lr_key, range_loss = "train.lr", ("loss",)

    def set_lr(self, rate: float) -> None:
        """Hold train.lr at `rate` for the steps that follow (scaled to the phase's batch as configured),
        for the whole network: a fine-tuning's frozen start is set aside."""
        cfg, schedule = self.cfg, self.schedule
        self.frozen_until = 0
        self.lr = lambda nimg: rate * batch_scale(cfg, schedule.phase_at(nimg).batch)

    @property
    def resolution(self) -> int:
        """The resolution the last step trained at."""
        return self.schedule.phase_at(self.nimg).resolution or self.cfg.data.resolution

    def scored_at(self) -> int:
        """The side the held-out split is scored at: eval.resolution, else where the last step trained."""
        return self.cfg.eval.resolution or self.resolution

    def plain(self) -> nn.Module:
        return self.rep.unwrap(self.model)

    def evaluated(self) -> nn.Module:
        """The network that is scored and put to use: the average of the weights when there is one."""
        return self.ema if self.ema is not None else self.plain()

    def standing_stats(self, steps: int) -> int:
        """Re-estimate the BatchNorm statistics of the network that is scored (in place: they are what is
        kept and put to use) as the plain average over the images of the latest `steps` training steps of
        the current phase, read as those steps read them (resolution, flips, crops; unmixed, without
        RandAugment: the statistics are for unaugmented images), in chunks of the
        micro-batch: "precise BN" (Wu & Johnson 2021). The running statistics of training are an average
        over weights that kept changing, and an average of weights has none of its own; these are the
        network's own. Every rank computes them from the whole steps, so they do not depend on the world
        size; they depend only on the weights and the images seen (a resumed run gets the same). Returns
        the number of forwards."""
        schedule = self.schedule
        if not self.seen:
            return 0
        phase = schedule.phase_at(self.seen - 1)
        begin = max(b for b in schedule.begins() if b <= self.seen - 1)
        starts = range(self.seen - phase.batch, begin - 1, -phase.batch)[:steps]
        micro, device = self.rep.plan.micro_batch, self.rep.device

        def chunks():
            for start in starts:
                real = peek(self.data, schedule, self.cfg, start, phase.batch, crop_scale=self.loader_crop_scale)
                images, labels, *_ = self._batch(start, phase.batch, 0, real.images, real.labels)
                for i in range(0, len(images), micro):
                    x = self.inputs(images[i : i + micro].to(device), labels[i : i + micro].to(device))
                    yield x.contiguous(memory_format=torch.channels_last) if self.rep.channels_last else x

        with prec.autocast(self.rep.precision, device):
            return running_stats.reestimate(self.evaluated(), chunks())

    def step(self, feed: Feed) -> dict[str, float]:
        """One SGD/AdamW step on the feed's next batch (BN statistics of momentum=None averaged over ranks)."""
        lr = self.lr(feed.nimg)
        frozen = feed.nimg < self.frozen_until  # fine-tuning: the head alone at first (and the body's norms: train_bn)
        for group in self.opt.param_groups:
            still = frozen and group.get("body") and not group.get("norm")
            group["lr"], group["frozen"] = (0.0 if still else lr * group.get("lr_mult", 1.0)), bool(still)
        self.nimg = feed.nimg
        real = feed.next()
        out = self.rep.step(self.loss, self.batch(real.nimg, real.images, real.labels), self.opt)
        self.steps += 1
        self.seen = feed.nimg
        self.rep.average_running_stats(self.model)
        if self.ema is not None:
            t, images = self.cfg.train, self.seen - self.nimg
            update_ema(
                self.ema, self.plain(), self.seen, images, t.model_ema_kimg, 0.0, t.ema_rampup, average_buffers=True
            )
        stats = {"lr": lr, "grad_norm": self.rep.grad_norm(self.opt), "resolution": self.resolution}
        return stats if self.rep.skipped(self.opt) else {**out, **stats}

    def batch(self, nimg: int, images: torch.Tensor, labels: torch.Tensor) -> tuple:
        """This rank's share of the step at `nimg`: images, labels, RandAugment draws and mixing draws (each None
        when off), drawn for the whole step and sliced by rank (the loader cut the random-resized crops)."""
        return self._batch(nimg, self.rep.batch, self.rep.rank * self.rep.share, images, labels)

    def _batch(self, nimg: int, batch: int, offset: int, images: torch.Tensor, labels: torch.Tensor) -> tuple:
        """`batch`: the whole step's; `offset`: the global place of images[0] within it."""
        n = len(images)
        if self.rotation:  # the label of an image is its rotation, decided by its global position
            labels = rotation_labels(nimg + offset, n)
        mixed, t = None, self.cfg.train
        augs = self._augs(batch, nimg)  # (host arrays: they stay there, cut with the batch)
        augs = None if augs is None else batch_parts.cut(augs, offset, offset + n)
        if (t.mixup or t.cutmix) and not 0 < t.mixup_off_kimg * 1000 <= nimg:  # drawn for the whole step, by pairs
            # of global positions
            draws = mixing.draw(batch, t.mixup, t.cutmix, t.seed, nimg, t.mixup_prob, t.mixup_switch_prob)
            mixed = draws[offset : offset + n]
        return images, labels, augs, mixed

    def _augs(self, batch: int, nimg: int) -> tuple[np.ndarray | None, np.ndarray | None] | None:
        """RandAugment's draws and random erasing's of the step at `nimg` of `batch` images (each None where
        off; None when both are)."""
        t = self.cfg.train
        ra = randaugment.draw(self.randaugment, batch, t.seed, nimg) if self.randaugment else None
        er = erasing.draw(t.random_erase, batch, t.seed, nimg) if t.random_erase else None
        return None if ra is None and er is None else (ra, er)

    def batch_sheet(self, nimg: int) -> Image.Image:
        """The step's first images as the network receives them (the loader's crops and flips, augmentations,
        rotations), each under its class name; mixed (mixup, CutMix), under its target: each class with its share
        (found from outside: its own class alone)."""
        real = peek(self.data, self.schedule, self.cfg, nimg, BATCH_SHEET, crop_scale=self.loader_crop_scale)
        images, labels, augs, mixed = self._batch(nimg, self.schedule.phase_at(nimg).batch, 0, real.images, real.labels)
        x, names = self.inputs(images, labels, augs), [self.class_names[int(y)] for y in labels]
        if mixed is None:
            return captioned_sheet([(img, [(name, BLACK)]) for img, name in zip(to_uint8(x), names)])
        x, lam = mixing.mix(x, mixed)
        theirs = [self.class_names[int(y)] for y in mixing.partner(labels)]
        return captioned_sheet(
            [
                (img, [(f"{share:.0%} {name}", BLACK), (f"{1 - share:.0%} {other}", BLACK)])
                for img, name, other, share in zip(to_uint8(x), names, theirs, lam.tolist())
            ]
        )

    def inputs(self, images: torch.Tensor, labels: torch.Tensor, augs: tuple | None = None) -> torch.Tensor:
        """What the network receives for uint8 NHWC images: [-1, 1] NCHW, through RandAugment and random erasing
        by their draws `augs`, rotated by their labels when it learns rotations."""
        x = from_uint8(images)
        ra, er = augs or (None, None)  # (`_augs`)
        x = x if ra is None else randaugment.apply(x, ra)
        x = x if er is None else erasing.apply(x, er)
        return rotate(x, labels) if self.rotation else x

    def loss(self, micro: tuple) -> dict[str, torch.Tensor]:
        images, labels, augs, mixed = micro
        t = self.cfg.train
        x, smoothing = self.inputs(images, labels, augs), t.label_smoothing
        x, lam = (x, None) if mixed is None else mixing.mix(x, mixed)
        logits = self.model(x).float()
        if t.bce_loss:
            loss = mixing.bce(logits, mixing.targets(labels, logits.shape[1], smoothing, lam), t.bce_threshold)
        elif lam is None:
            loss = F.cross_entropy(logits, labels, label_smoothing=smoothing)
        else:
            loss = mixing.loss(logits, labels, lam, smoothing)
        if lam is not None:
            labels = torch.where(lam >= 0.5, labels, mixing.partner(labels))  # (train_top1: the larger share's)
        return {"loss": loss, "train_top1": 100 * (logits.detach().argmax(1) == labels).float().mean()}

    def probe(self, m: int) -> None:
        """One forward/backward of m images at the largest resolution of the schedule."""
        size = phase_sides(self.cfg)[-1]
        images, labels = self.data.get(torch.arange(min(m, len(self.data))).repeat(m)[:m])
        self.rep.probe_step(self.loss, (resize_batch(images, size), labels, self._augs(m, 0), None))
        self.opt.zero_grad(set_to_none=True)

    # ---- checkpoints and previews --------------------------------------------------------------
    def nets(self) -> dict[str, nn.Module]:
        return {"model": self.plain(), **({"model_ema": self.ema} if self.ema is not None else {})}

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "opt": self.opt.state_dict(), **({} if not self.plateau else self.plateau.state())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        prec.load_optimizer(self.opt, state["opt"])
        self.steps = int(state["steps"])
        if self.plateau is not None:
            self.plateau.load(state)

    def rate_said(self) -> str:
        """The start line's learning rate, where the batch scales train.lr ("" where not: found from outside, unsaid,
        where timm says the rate it computed from the base rate and the global batch)."""
        t, first = self.cfg.train, self.schedule.phase_at(self.nimg)  # (the phase it starts or resumes in)
        if not t.lr_batch or first.batch == t.lr_batch or first.lr is not None:
            return ""
        how = "by the square root" if t.lr_scale == "sqrt" else "linearly"
        rate, batch = t.lr * batch_scale(self.cfg, first.batch), first.batch
        return f"; lr {rate:.4g} (train.lr {t.lr:g} per {t.lr_batch} images, scaled {how} to the batch of {batch})"

    def lengthened(self, was_kimg: float, nimg: int) -> str:
        """What a resume's longer train.kimg does to the rate at `nimg` ("" where nothing): a decay runs to the end."""
        try:
            before = lr_schedule(self.cfg.override({"train.kimg": was_kimg}))(nimg)
        except BigbatchError:  # (a schedule the shorter length could not hold)
            return ""
        now = lr_schedule(self.cfg)(nimg)  # (the schedule's alone: not a plateau's factor)
        if math.isclose(now, before, rel_tol=1e-9):
            return ""
        return f" (its learning rate's schedule with it: {now:.3g} from here, where the shorter run had {before:.3g})"

    def model_info(self) -> dict[str, Any]:
        return {
            "n_classes": len(self.class_names),
            "img_channels": self.data.channels,
            "class_names": self.class_names,
            "feature_dim": self.plain().feature_dim,
        }

    def previews(self, at_checkpoint: bool) -> dict[str, Image.Image]:
        """A sheet of held-out images (training images without a split), each under its predicted class,
        green when right, red when wrong."""
        source = self.val_data if self.val_data is not None else self.data
        n = min(self.cfg.sample.n, len(source))
        if n == 0:
            return {}
        index = torch.linspace(0, len(source) - 1, n).round().long()
        model, size, d = self.evaluated(), self.scored_at(), self.cfg.data
        if self._shown is None:  # cut as validation cuts them (val_crop, val_rect, whole images)
            self._shown = Validation(source, lambda: size, 1, d.val_crop, d.val_rect, "fp32", torch.device("cpu"))
        rows = []
        for i in index.tolist():  # one at a time: buckets may differ in shape
            image, label = self._shown.seen(i, size)
            if self.rotation:
                label = int(rotation_labels(i, 1))
                image = torch.rot90(image, label, (0, 1))
            rows.append((image, label))
        was_training = model.training
        model.eval()
        with torch.no_grad():
            device = next(model.parameters()).device
            preds = [int(model(from_uint8(img[None]).to(device)).argmax(1)) for img, _ in rows]
        model.train(was_training)
        return {"predictions": prediction_sheet(rows, preds, self.class_names)}


def prediction_sheet(rows: list[tuple[torch.Tensor, int]], preds: list[int], class_names: list[str]) -> Image.Image:
    """Images (uint8 HWC) in rows of 8, each under its predicted class: green when right; red when
    wrong, with the true class under it."""

    def name(i: int) -> str:
        return class_names[i] if i < len(class_names) else str(i)

    cells = []
    for (img, label), pred in zip(rows, preds):
        right = pred == label
        caption = [(name(pred), GREEN)] if right else [(name(pred), RED), (f"true {name(label)}", BLACK)]
        cells.append((img, caption))
    return captioned_sheet(cells)
