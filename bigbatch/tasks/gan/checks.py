"""What the GAN task makes of a config and of the data it is given: its config's checks and those of the models it
builds (build_models), each one line naming the key; and what a new run says of its settings (warn_new_gan,
warn_built)."""

from __future__ import annotations

import torch
from torch import nn

from bigbatch import models
from bigbatch.config import Config
from bigbatch.data.load import rectangles
from bigbatch.data.schedule import schedule_of
from bigbatch.engine.determinism import seeded
from bigbatch.engine.running_stats import has_batchnorm
from bigbatch.engine.wrap import torch_spectral_norm
from bigbatch.errors import BigbatchError, warn, warnings_off
from bigbatch.models.layers import SpectralNorm
from bigbatch.tasks.gan.scorer import check_eval
from bigbatch.tasks.interface import refuse_sections

# The train keys of the classify task, which the GAN task does not read.
CLASSIFY_KEYS = (
    "optimizer", "lr", "lr_batch", "lr_scale", "warmup_kimg", "lr_steps", "lr_gamma", "momentum", "nesterov",
    "weight_decay", "norm_decay", "label_smoothing", "crop_scale", "labels", "freeze_kimg", "body_lr_mult",
    "train_bn", "model_ema_kimg", "mixup", "cutmix", "randaugment", "random_erase", "warmup_lr", "lr_min",
    "cooldown_kimg", "mixup_prob", "mixup_switch_prob", "mixup_off_kimg", "bce_loss", "bce_threshold", "trust_coeff",
    "plateau_patience",
)  # fmt: skip


def check_config(cfg: Config) -> None:
    """What the GAN makes of the config: a registered model family and its options, one resolution
    throughout (the GAN families are built for one), evaluation settings it can score."""
    m = cfg.model
    gan_models = models.list_models(task="gan")
    if m.name not in gan_models:
        valid = f"valid: {', '.join(gan_models)}{models.registry.USER_FAMILY}"
        m._fail("name", f"names no GAN model family '{m.name}'; {valid}")
    r = cfg.data.resolution
    if r & (r - 1):
        cfg.data._fail("resolution", f"must be a power of two for a GAN, got {r}")
    foreign = cfg.train.changed(*CLASSIFY_KEYS) + cfg.data.changed("val_path", "val_fraction", "val_rect", "val_crop")
    if cfg.train.lr_decay not in ("none", "linear"):
        cfg.train._fail(
            "lr_decay", f'must be "none" or "linear" for the GAN task, got "{cfg.train.lr_decay}" (a classifier\'s)'
        )
    refuse_sections(cfg, "the GAN task", "swap", "xseg")
    if foreign:
        raise BigbatchError(
            f"config key '{foreign[0]}' is not read by the GAN task (task = \"gan\"); the GAN's are train.g_lr, "
            'train.d_lr, train.betas and train.lr_decay = "none" | "linear"; remove it or set task = "classify"'
        )
    try:
        models.registry.check_options(m.name, m.options)
    except BigbatchError as e:
        raise BigbatchError(f"config key 'model.options': {e}") from None
    classifier = m.options.get("d_cond", "PD") in ("AC", "ADC")
    if cfg.train.changed("cond_lambda") and not classifier:  # (read by an auxiliary classifier)
        cfg.train._fail(
            "cond_lambda", 'weighs an auxiliary classifier\'s loss: give model.options.d_cond "AC" or "ADC"'
        )
    if classifier and cfg.train.cond_lambda == 0:  # (found from outside: unsaid)
        warn(f"train.cond_lambda = 0 with model.options.d_cond = {m.options['d_cond']!r}: neither G nor D learns from "
             "the class (D has no projection beside its classifier)", once=True)  # fmt: skip
    for i, phase in enumerate(schedule_of(cfg).phases):
        if phase.lr is not None:
            raise BigbatchError(
                f"config key 'data.schedule' phase {i} gives an lr, which the GAN task does not read (it uses "
                "train.g_lr and train.d_lr)"
            )
        if phase.resolution != cfg.data.resolution:
            raise BigbatchError(
                f"config key 'data.schedule' phase {i} (from {phase.start / 1000:g} kimg) has resolution "
                f"{phase.resolution}, but data.resolution is {cfg.data.resolution}: the GAN models are built for "
                "one resolution, so a GAN schedule may change only the batch"
            )
    check_eval(cfg.eval)


def check_stored_size(cfg: Config, r: int, whole: bool, meta: dict | None = None) -> None:
    """data.path's images (`whole`: of that short side) are at data.resolution, which the models are built for
    (also --dry-run's check, from the file's metadata)."""
    if rect := rectangles(meta or {}):  # (found from outside: "images of 0 px")
        raise BigbatchError(
            f"data set {cfg.data.path} holds {rect}, and a GAN's are: prepare the images again with --resolution "
            f"{cfg.data.resolution} (their center squares)"
        )
    if r != cfg.data.resolution:
        held = "whole images of short side" if whole else "images of"
        fix = f"set data.resolution={r}, or " if r and not r & (r - 1) else ""  # (a GAN's: a power of two)
        raise BigbatchError(
            f"data set {cfg.data.path} holds {held} {r} px but data.resolution is {cfg.data.resolution}: {fix}"
            f"prepare the images again with --resolution {cfg.data.resolution}"
        )


def warn_new_gan(cfg: Config, trains: bool = True) -> None:
    """What a new GAN run says of its settings as it starts, and its dry run (found from outside: said by neither,
    then by the run alone): FreezeD of a D not pretrained, an EMA that starts after the run's end (for show-batch's
    models too: `trains` is not read); LeCam's settings that change nothing (found from outside: unsaid)."""
    t = cfg.train
    iterations = -(-t.images // t.batch)
    if t.lecam and t.lecam_start >= iterations:
        warn(f"train.lecam_start = {t.lecam_start} iterations is not before the run's end ({iterations}): the LeCam "
             "penalty never applies; give a smaller train.lecam_start")  # fmt: skip
    if not t.lecam and (changed := t.changed("lecam_decay", "lecam_start")):
        warn(f"{' and '.join(changed)} given, and train.lecam is 0: LeCam is off (give train.lecam, e.g. 0.3)")
    if not (t.zcr_d or t.zcr_g) and t.changed("zcr_radius"):
        warn("train.zcr_radius given, and train.zcr_d and train.zcr_g are 0: zCR is off (give them, e.g. 20 and 0.5)")
    if t.init_from:
        return
    if t.freeze_d:
        warn(f"train.freeze_d = {t.freeze_d} freezes D's first blocks at their random start: FreezeD fixes a "
             "pretrained D's (give train.init_from or --init-from)")  # fmt: skip
    if t.ema_start_kimg >= t.kimg:
        warn(f"train.ema_start_kimg = {t.ema_start_kimg:g} is not before the run's end (train.kimg = {t.kimg:g}): "
             "G_ema is a copy of G throughout")  # fmt: skip


def reads_batch_whole(D: nn.Module) -> bool:
    """Whether D's output on an image depends on the other images of its batch: BatchNorm (as DCGAN trains), or what
    a D declares (a minibatch-stddev layer: reads_real_and_fake_apart). Such a D reads real and fake images apart, and
    a penalty per image through it is not one."""
    return has_batchnorm([D]) or getattr(D, "reads_real_and_fake_apart", False)


def warn_built(cfg: Config, D: nn.Module) -> None:
    """What a new GAN run says of its built D, and its dry run: a Wasserstein loss with nothing to keep D Lipschitz
    (its outputs then grow without bound); a gradient penalty (train.gp) through a D that reads its batch whole; ADA's
    adaptive p on the sign of outputs that an ls or wgan D does not centre on 0."""
    t = cfg.train
    normed = any(isinstance(m, SpectralNorm) for m in D.modules()) or torch_spectral_norm(D) is not None
    if t.loss == "wgan" and not t.gp and not normed:
        warn(
            'train.loss = "wgan" with a D that nothing keeps Lipschitz: its outputs can grow without bound; give '
            "train.gp (WGAN-GP: 10) or a D with spectral norm (dcgan: model.options.d_sn = true; biggan, sngan)"
        )
    # (a minibatch statistic too, StyleGAN2's: found by review, unsaid)
    if t.gp and reads_batch_whole(D):
        warn(
            f"train.gp = {t.gp:g} with a D that reads its batch as a whole (BatchNorm, a minibatch statistic): its "
            "penalty per image depends on the other images of its batch (WGAN-GP's critic reads each alone): give "
            "one that does not (dcgan: model.options.d_bn = false)"
        )
    if t.loss in ("wgan", "ls") and cfg.augment.target:  # (ADA's or DiffAugment's adaptive p: found from outside)
        warn(
            f'augment.target moves augment.p by r_t = E[sign D(real)] (ADA\'s), which a "{t.loss}" D does not centre '
            "on 0 (its outputs are free of an offset, or aimed at 0 and 1): give augment.p fixed (augment.target = "
            "0), or a hinge or ns loss"
        )


def check_path_length(cfg: Config, G: nn.Module) -> None:
    """train.pl_weight only where G has a mapping network to regularize (also checked by --dry-run)."""
    if cfg.train.pl_weight and not getattr(G, "supports_path_length", False):
        cfg.train._fail("pl_weight", f"needs a G with a mapping network (model.name = \"stylegan2\"); "
                        f"{cfg.model.name}'s has none: set it to 0")  # fmt: skip


def check_attention_given(cfg: Config, G: nn.Module, D: nn.Module) -> None:
    """A new run's g_attn or d_attn given at the default's size, which no block of the model puts out, refused as
    any other such size is (found from outside: BigGAN-PyTorch's --G_attn 64 carried to a 32 px run was dropped
    without a word; a saved run of it still loads, found by review)."""
    for key, net in (("g_attn", G), ("d_attn", D)):
        if cfg.model.options.get(key) and getattr(net, "attention", True) is None:
            raise BigbatchError(
                f"model.options.{key} = {cfg.model.options[key]}: no block of this {cfg.data.resolution} px "
                f"{cfg.model.name} puts out {cfg.model.options[key]} px; give one that does, or 0 for no attention"
            )


def build_models(cfg: Config, n_classes: int, img_channels: int) -> tuple[nn.Module, nn.Module]:
    """G and D as the config describes them, initialised from train.seed (the caller's global RNG is
    left as it was)."""
    with seeded(cfg.train.seed):
        return models.create(
            cfg.model.name,
            resolution=cfg.data.resolution,
            n_classes=n_classes if cfg.model.conditional else 0,
            ch=cfg.model.ch,
            dim_z=cfg.model.dim_z,
            img_channels=img_channels,
            **cfg.model.options,
        )


def check_new_gan(cfg: Config) -> None:
    """What a new GAN run refuses: an attention size that the models, built on the meta device, have no block of
    (models that cannot be built are the build's to refuse, after its checks of the data: found by the suite)."""
    try:
        with torch.device("meta"), warnings_off():
            G, D = build_models(cfg, 10, 3)
    except BigbatchError:
        return
    check_attention_given(cfg, G, D)
