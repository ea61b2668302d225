"""Named recipes. Each is a function returning a full Config; its docstring says where its numbers come from."""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from bigbatch.config import (
    AugmentConfig,
    CheckpointConfig,
    Config,
    DataConfig,
    EvalConfig,
    ModelConfig,
    SampleConfig,
    TrainConfig,
)
from bigbatch.config_types import read_toml, strings
from bigbatch.errors import BigbatchError, warn
from bigbatch.presets_classify import IMAGENET
from bigbatch.urls import refuse_credentials

_PRESETS: dict[str, Callable[[], Config]] = {}


def preset_fn(fn: Callable[[], Config]) -> Callable[[], Config]:
    _PRESETS[fn.__name__] = fn
    return fn


def list_presets() -> dict[str, str]:
    """Preset names and the first paragraph of their docstrings (found from outside: a first line cut one short)."""
    import re

    def first(doc: str) -> str:  # (its first paragraph: a sentence split at "." cut "He et al.", found by review)
        return " ".join(re.split(r"\n\s*\n", doc.strip(), maxsplit=1)[0].split())

    return {name: first(fn.__doc__ or "") for name, fn in sorted(_PRESETS.items())}


def preset_notes(name: str) -> str:
    """A preset's whole docstring: its source and the settings it takes from there."""
    preset(name)  # (an unknown name refused, with the names)
    return inspect.cleandoc(_PRESETS[name].__doc__ or "")


def base_config(name: str | None, config: str | None, default: str = "digits") -> Config:
    """The config a command starts from: --preset NAME, or --config FILE.toml, or the `default` preset; with
    both, the file laid over the preset (timm's config file and arguments). A file alone that leaves keys out
    (not a run's config.toml) fills them from Config's defaults, which are no preset's: said (found from outside:
    `[train] batch = 32` trained another model than the digits recipe, under its name)."""
    for flag, given in (("--preset", name), ("--config", config)):
        if given is not None and not given.strip():  # (found from outside: taken for the default preset)
            raise BigbatchError(
                f"{flag} is empty: give a {'preset name (bigbatch presets)' if flag == '--preset' else 'TOML file'}"
            )
    if not config:
        return preset(name or default)
    tree = read_toml(Path(config))
    under = preset(name) if name else None
    if under is not None and under.left_out(tree):
        return under.layered(tree)
    cfg = Config.from_dict(tree)
    if under is not None:  # (found from outside: a run's config over another task's preset became it, unsaid)
        warn(f"{config} sets every key (as a run's config.toml does): nothing of --preset {name} is left; drop it")
    left = cfg.left_out(tree)
    if left:
        shown = ", ".join(left[:4]) + (f" and {len(left) - 4} more" if len(left) > 4 else "")
        warn(
            f"{config} leaves out {shown}: those take Config's defaults, no preset's; give --preset NAME with "
            "--config to lay the file over a recipe"
        )
    return cfg


def check_task_of_default(overrides: dict[str, Any], default: str = "digits") -> None:
    """A command line's task=TASK (in its `overrides`) with neither --preset nor --config, laid over the `default`
    preset of another task, refused in its terms where TASK has presets (found from outside: task=classify was
    refused for a GAN key of the default preset's, which the user never set); credentials in the overrides refused
    first, as the config's own check does."""
    for key, value in strings(overrides):
        refuse_credentials(value, f"config key '{key}'")
    task, base = overrides.get("task"), preset(default)
    if task == base.task or not isinstance(task, str):
        return
    names = [name for name in sorted(_PRESETS) if preset(name).task == task]
    if names:
        raise BigbatchError(
            f"task={task} with neither --preset nor --config is laid over the default preset {default}, a "
            f"{base.task} recipe: give --preset of a {task} recipe ({', '.join(names[:4])}; `bigbatch presets` lists "
            "them)"
        )


def preset(name: str) -> Config:
    """The Config of a named recipe."""
    if name not in _PRESETS:
        close = difflib.get_close_matches(name.lower(), _PRESETS, n=1)  # (found from outside: 'Digits' unhinted)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise BigbatchError(f"unknown preset '{name}'{hint}; valid: {', '.join(sorted(_PRESETS))}")
    return _PRESETS[name]()


def reference_eval(images_per_iteration: int) -> EvalConfig:
    """BigGAN-PyTorch's scripts' evaluation: every 2000 iterations (--test_every 2000), 50k samples
    (--num_inception_images), G_ema in eval mode with its running statistics (--G_eval_mode). Its best
    copy follows IS by default (--which_best); here FID picks checkpoints/best/ (eval.best="is" for theirs)."""
    return EvalConfig(every_kimg=2000 * images_per_iteration / 1000, metrics="fid,is", n=50_000, best="fid")


def ema_halflife_kimg(decay: float, images_per_update: int) -> float:
    """The half-life (kimg) of an EMA with `decay` per update of `images_per_update` images."""
    return math.log(0.5) / math.log(decay) * images_per_update / 1000


@preset_fn
def digits() -> Config:
    """Class-conditional SN-DCGAN on scikit-learn's 8x8 digits at 32x32; ~2 minutes on 2 CPU cores (the default).

    Hinge loss with a projection discriminator (Miyato & Koyama 2018), conditional BN in G; Adam at
    2e-4 with beta1 = 0.5 as in DCGAN (beta1 = 0 learned the classes markedly slower here); widths cut
    to fit the CPU budget (ch 32). Run length: an SVM trained on the real digits recognised the
    requested class in 98% of EMA samples at 40 kimg and 99.6% at 80 (bench/digits_quality.py).
    """
    return Config(
        name="digits",
        data=DataConfig(path="builtin:digits", resolution=32),
        model=ModelConfig(name="dcgan", ch=32, dim_z=64),
        train=TrainConfig(
            kimg=80,
            batch=64,
            micro_batch=64,
            g_lr=2e-4,
            d_lr=2e-4,
            betas=(0.5, 0.999),
            ema_halflife_kimg=2.0,
            log_every_kimg=2.0,
        ),
        checkpoint=CheckpointConfig(every_kimg=40, keep=3),
        sample=SampleConfig(every_kimg=20, n=80),
    )


@preset_fn
def fashion32() -> Config:
    """Class-conditional SN-DCGAN on Fashion-MNIST (60k images) at 32x32; CPU-sized, ~30 minutes on 2 cores.

    Same recipe as `digits` with twice the width for the richer data (Debian's dataset-fashion-mnist).
    """
    return Config(
        name="fashion32",
        data=DataConfig(path="builtin:fashion-mnist", resolution=32, xflip=True),
        model=ModelConfig(name="dcgan", ch=64, dim_z=128),
        train=TrainConfig(
            kimg=300,
            batch=64,
            micro_batch=64,
            g_lr=2e-4,
            d_lr=2e-4,
            betas=(0.5, 0.999),
            ema_halflife_kimg=5.0,
            log_every_kimg=5.0,
        ),
        checkpoint=CheckpointConfig(every_kimg=50, keep=3),
        sample=SampleConfig(every_kimg=25, n=80),
    )


@preset_fn
def biggan128_bs2048() -> Config:
    """BigGAN at 128x128 on ImageNet, batch 2048: BigGAN-PyTorch's scripts/launch_BigGAN_bs256x8.sh.

    Its numbers: 256 x 8 accumulations, G lr 1e-4, D lr 4e-4, Adam betas (0, 0.999), eps 1e-6, 1 D step,
    ch 96, dim_z 120 hierarchical, shared embedding 128, attention at 64 in G and D, SN eps 1e-6, BN eps
    1e-5, orthogonal init, EMA decay 0.9999 per iteration from iteration 20k (here as a half-life and
    start in kimg), G sampled in eval mode, 150k iterations (307,200 kimg). Orthogonal regularization is
    off, as in that script (--G_ortho 0.0); the paper used beta = 1e-4: set train.g_ortho=1e-4 for it.
    micro_batch "auto" takes the largest per-process micro-batch that fits (the reference split 256 over
    8 V100s); spectral norm updates once per step (model.sn_update="micro" for the reference's per
    micro-batch updates). G's BatchNorm statistics span one micro-batch, so they follow what fits: the
    reference's spanned a GPU's 32 images (DataParallel without --cross_replica): train.micro_batch=32 for
    those. Data: `bigbatch prepare IMAGENET_TRAIN data/imagenet128.h5 --resolution 128`.
    """
    return Config(
        name="biggan128_bs2048",
        data=DataConfig(path="data/imagenet128.h5", resolution=128),
        model=ModelConfig(name="biggan", ch=96, dim_z=120),
        train=TrainConfig(
            kimg=150_000 * 2048 / 1000,
            batch=2048,
            micro_batch="auto",
            g_lr=1e-4,
            d_lr=4e-4,
            betas=(0.0, 0.999),
            adam_eps=1e-6,
            ema_halflife_kimg=ema_halflife_kimg(0.9999, 2048),
            ema_start_kimg=20_000 * 2048 / 1000,
            ema_buffers="average",  # (its utils.ema blends the whole state dict)
            log_every_kimg=20 * 2048 / 1000,
        ),
        checkpoint=CheckpointConfig(every_kimg=1000 * 2048 / 1000, keep=2),
        sample=SampleConfig(every_kimg=1000 * 2048 / 1000, n=64),
        eval=reference_eval(2048),
    )


@preset_fn
def biggan_deep128() -> Config:
    """BigGAN-deep at 128x128 on ImageNet, batch 2048: BigGAN-PyTorch's scripts/launch_BigGAN_deep.sh.

    Its numbers: 256 x 8 accumulations, G lr 1e-4, D lr 4e-4, betas (0, 0.999), eps 1e-6, ch 128, depth 2,
    dim_z 128 with shared embedding 128, attention at 64, SN eps 1e-6, BN eps 1e-5, orthogonal initialisation
    (--G_init ortho --D_init ortho; the script's first version also gave --skip_init, which skipped it, and
    runs of this preset before took that: model.options.init "none"), no orthogonal regularization, EMA 0.9999
    from iteration 20k, G sampled in eval mode; its default 100 epochs of ImageNet as the run length.
    micro_batch "auto" as in biggan128_bs2048.
    """
    return Config(
        name="biggan_deep128",
        data=DataConfig(path="data/imagenet128.h5", resolution=128),
        model=ModelConfig(name="biggan_deep", ch=128, dim_z=128, options={"init": "ortho"}),
        train=TrainConfig(
            kimg=100 * IMAGENET / 1000,
            batch=2048,
            micro_batch="auto",
            g_lr=1e-4,
            d_lr=4e-4,
            betas=(0.0, 0.999),
            adam_eps=1e-6,
            ema_halflife_kimg=ema_halflife_kimg(0.9999, 2048),
            ema_start_kimg=20_000 * 2048 / 1000,
            ema_buffers="average",  # (its utils.ema blends the whole state dict)
            log_every_kimg=20 * 2048 / 1000,
        ),
        checkpoint=CheckpointConfig(every_kimg=500 * 2048 / 1000, keep=2),
        sample=SampleConfig(every_kimg=1000 * 2048 / 1000, n=64),
        eval=reference_eval(2048),
    )


@preset_fn
def biggan_cifar() -> Config:
    """BigGAN on CIFAR-10 at 32x32: BigGAN-PyTorch's launch_cifar_ema.sh.

    Its numbers: batch 50, 4 D steps per G step, G and D lr 2e-4, betas (0, 0.999), ch 64, dim_z 128,
    per-layer class embeddings in G's BN (no shared embedding, no hierarchical z), no attention, N(0, 0.02)
    init, SN eps 1e-8, EMA 0.9999 per iteration (200 real images) from iteration 1000, 500 epochs. One difference in
    what it samples and scores: that script, alone of BigGAN-PyTorch's, has no --G_eval_mode, so its G_ema runs in
    train mode there, each batch's own BN statistics; bigbatch's sample and eval use G_ema's running statistics, or
    with --standing-stats BigGAN-PyTorch's standing ones.
    Data: `bigbatch prepare CIFAR10_FOLDER data/cifar10.h5`.
    """
    per_iteration = 4 * 50
    return Config(
        name="biggan_cifar",
        data=DataConfig(path="data/cifar10.h5", resolution=32),
        model=ModelConfig(
            name="biggan",
            ch=64,
            dim_z=128,
            options={"shared": False, "hier": False, "g_attn": 0, "d_attn": 0, "init": "N02", "sn_eps": 1e-8},
        ),
        train=TrainConfig(
            kimg=500 * 50_000 / 1000,
            batch=50,
            micro_batch=256,  # a memory cap: batch 50 runs as one micro-batch; a sweep's 512 as 256 x 2
            d_steps=4,
            g_lr=2e-4,
            d_lr=2e-4,
            betas=(0.0, 0.999),
            adam_eps=1e-8,
            ema_halflife_kimg=ema_halflife_kimg(0.9999, per_iteration),
            ema_start_kimg=1000 * per_iteration / 1000,
            ema_buffers="average",  # (its utils.ema blends the whole state dict)
            log_every_kimg=20.0,
        ),
        checkpoint=CheckpointConfig(every_kimg=2000 * per_iteration / 1000, keep=2),
        sample=SampleConfig(every_kimg=2000 * per_iteration / 1000, n=80),
    )


@preset_fn
def sngan_cifar() -> Config:
    """SN-GAN (ResNet) on CIFAR-10, unconditional: Miyato et al. 2018, Table 3's ResNet setting.

    Its numbers: batch 64, 5 D steps per G step (n_dis), lr 2e-4 for G and D, Adam betas (0, 0.9), hinge
    loss, G 256 and D 128 channels (ch 64 here), dim_z 128, 50k G steps (16,000 kimg). The paper decays
    the learning rate linearly to 0 (train.lr_decay) and evaluates G itself: the EMA is off (half-life 0:
    G_ema is a copy of G).
    """
    return Config(
        name="sngan_cifar",
        data=DataConfig(path="data/cifar10.h5", resolution=32),
        model=ModelConfig(name="sngan", ch=64, dim_z=128, conditional=False),
        train=TrainConfig(
            kimg=50_000 * 5 * 64 / 1000,
            batch=64,
            micro_batch=64,
            d_steps=5,
            g_lr=2e-4,
            d_lr=2e-4,
            betas=(0.0, 0.9),
            lr_decay="linear",
            ema_halflife_kimg=0.0,
            log_every_kimg=32.0,
        ),
        checkpoint=CheckpointConfig(every_kimg=320.0, keep=3),
        sample=SampleConfig(every_kimg=320.0, n=64),
    )


@preset_fn
def sagan128() -> Config:
    """SA-GAN at 128x128 on ImageNet: BigGAN-PyTorch's scripts/launch_SAGAN_bs128x2_ema.sh.

    Its numbers: batch 256 (128 x 2 accumulations), G lr 1e-4, D lr 4e-4 (the paper's two time-scale
    rule), betas (0, 0.999) (the paper: 0.9), ch 64, dim_z 128, a class embedding per conditional BN (no
    --G_shared: model.options.shared false), attention at 64 in G and D, SN eps 1e-8, Xavier init, EMA 0.9999
    per iteration from iteration 2000, G in eval mode; about 1M iterations as in Zhang et al. 2019.
    """
    return Config(
        name="sagan128",
        data=DataConfig(path="data/imagenet128.h5", resolution=128),
        model=ModelConfig(name="sagan", ch=64, dim_z=128, options={"shared": False}),
        train=TrainConfig(
            kimg=1_000_000 * 256 / 1000,
            batch=256,
            micro_batch="auto",
            g_lr=1e-4,
            d_lr=4e-4,
            betas=(0.0, 0.999),
            ema_halflife_kimg=ema_halflife_kimg(0.9999, 256),
            ema_start_kimg=2000 * 256 / 1000,
            ema_buffers="average",  # (its utils.ema blends the whole state dict)
            log_every_kimg=25.6,
        ),
        checkpoint=CheckpointConfig(every_kimg=256.0, keep=2),
        sample=SampleConfig(every_kimg=512.0, n=64),
        eval=reference_eval(256),
    )


@preset_fn
def dcgan64() -> Config:
    """DCGAN at 64x64 as PyTorch's DCGAN tutorial trains it on CelebA (unconditional).

    Its numbers: batch 128, Adam lr 2e-4 with betas (0.5, 0.999), nz 100, ngf = ndf = 64, BatchNorm in D
    (no spectral norm), the non-saturating (BCE) loss, N(0, 0.02) init, 5 epochs of CelebA's 202,599 images;
    no EMA. Data: `bigbatch prepare img_align_celeba data/celeba64.h5 --resolution 64`.
    """
    return Config(
        name="dcgan64",
        data=DataConfig(path="data/celeba64.h5", resolution=64),
        model=ModelConfig(name="dcgan", ch=64, dim_z=100, conditional=False, options={"d_sn": False}),
        train=TrainConfig(
            kimg=5 * 202_599 / 1000,
            batch=128,
            micro_batch=128,
            g_lr=2e-4,
            d_lr=2e-4,
            betas=(0.5, 0.999),
            loss="ns",
            ema_halflife_kimg=0.0,
            log_every_kimg=12.8,
        ),
        checkpoint=CheckpointConfig(every_kimg=100.0, keep=3),
        sample=SampleConfig(every_kimg=50.0, n=64),
    )


def _stylegan2(name: str, data: DataConfig, model: ModelConfig, train: TrainConfig, snapshot_kimg: float) -> Config:
    """What StyleGAN2-ADA's configurations share (its train.py): the non-saturating loss, Adam with betas
    (0, 0.99) and eps 1e-8, R1 every 16 D steps, path length regularization every 4 G steps, ADA's
    augmentation (bgc, target 0.6, p moving at 500 kimg), FID on 50k images at every snapshot. Its lazy
    regularization runs as separate optimizer steps, whose count it offsets by scaling Adam's rates and
    betas (by 4/5 for G and 16/17 for D); here the penalties join the ordinary steps, so those stay as given.
    Its micro-batch on each of its reference GPUs is D's minibatch-statistic group here (`model.options`); the
    micro-batch is "auto" (the whole batch where it fits: on an H200 paper256's 64 images as one, not eight
    micro-batches of ADA's 8), which changes no result where a group fits: the groups are consecutive images, and the
    path length images and the per-image draws do not depend on how a step is split (tests/test_stylegan2.py). Where
    not even a group fits, auto settles under it and says so (the statistic then over fewer images)."""
    return Config(
        name=name,
        data=data,
        model=model,
        train=replace(
            train,
            micro_batch="auto",
            betas=(0.0, 0.99),
            adam_eps=1e-8,
            loss="ns",
            r1_every=16,
            pl_every=4,
            log_every_kimg=4.0,
        ),
        augment=AugmentConfig(pipeline="ada", policy="bgc", target=0.6, speed_kimg=500.0),
        checkpoint=CheckpointConfig(every_kimg=snapshot_kimg, keep=3),
        sample=SampleConfig(every_kimg=snapshot_kimg, n=64),
        eval=EvalConfig(every_kimg=snapshot_kimg, metrics="fid", n=50_000),
    )


def _ada_paper(
    name: str, path: str, resolution: int, ch: int, batch: int, lr: float, r1_gamma: float, ema_kimg: float
) -> Config:
    """StyleGAN2-ADA's paper256, paper512 and paper1024 (--mirror=1): unconditional, with x-flips, an 8-layer mapping
    and path length regularization, 25,000 kimg on 8 reference GPUs, each a minibatch-statistic group; what
    differs between them is given."""
    per_gpu = batch // 8
    return _stylegan2(
        name,
        DataConfig(path=path, resolution=resolution, xflip=True),
        ModelConfig(name="stylegan2", ch=ch, dim_z=512, conditional=False, options={"mbstd_group": per_gpu}),
        TrainConfig(
            kimg=25_000, batch=batch, g_lr=lr, d_lr=lr, r1_gamma=r1_gamma, pl_weight=2.0, ema_halflife_kimg=ema_kimg
        ),
        snapshot_kimg=200,
    )


@preset_fn
def stylegan2_cifar() -> Config:
    """StyleGAN2 with ADA on CIFAR-10 at 32x32, class-conditional: StyleGAN2-ADA's --cfg=cifar --cond=1.

    Its numbers: batch 64 on 2 GPUs (32 each, one minibatch-statistic group of 32), fmaps 1 (512 channels
    at every resolution here), a 2-layer mapping network in G (8 in D's class mapping), D without residual
    skips ("orig"), lr 0.0025 (G's 0.002 here: ADA builds G's Adam at lr x 4/5 for a path-length step every 4,
    which cifar never takes, its pl_weight 0: found from outside), R1 gamma 0.01, no style mixing and no path
    length regularization, EMA half-life 500 kimg ramped up as 5% of the images seen, 100,000 kimg; x-flips off.
    Parameters: G 20,215,315 and D 23,089,664, ADA's own networks' counts at these settings (tests/test_models.py).
    Data: `bigbatch prepare CIFAR10_FOLDER data/cifar10.h5`.
    In fp32, as ADA's --fp32=1 (its default runs the 4 highest resolutions in fp16, clamped; here
    train.precision="bf16" is the mixed precision).
    """
    return _stylegan2(
        "stylegan2_cifar",
        DataConfig(path="data/cifar10.h5", resolution=32),
        ModelConfig(
            name="stylegan2",
            ch=128,
            dim_z=512,
            options={"map_layers": 2, "mixing": 0.0, "mbstd_group": 32, "d_resnet": False},
        ),
        TrainConfig(
            kimg=100_000, batch=64, g_lr=0.002, d_lr=0.0025, r1_gamma=0.01, ema_halflife_kimg=500, ema_rampup=0.05
        ),
        snapshot_kimg=200,
    )


@preset_fn
def stylegan2_256() -> Config:
    """StyleGAN2 with ADA at 256x256, unconditional (FFHQ, LSUN): StyleGAN2-ADA's --cfg=paper256 --mirror=1.

    Its numbers: batch 64 on 8 GPUs (8 each, a minibatch-statistic group of 8), fmaps 0.5 (64 channels at
    256 px, doubling at each halving up to 512), an 8-layer mapping network at 0.01x the learning rate,
    lr 0.0025, R1 gamma 1, style mixing 0.9, path length weight 2 on half the images, EMA half-life 20 kimg,
    25,000 kimg. Data: `bigbatch prepare FACES_FOLDER data/ffhq256.h5 --resolution 256`.
    In fp32, as ADA's --fp32=1 (its default runs the 4 highest resolutions in fp16, clamped; here
    train.precision="bf16" is the mixed precision).
    """
    return _ada_paper("stylegan2_256", "data/ffhq256.h5", 256, ch=64, batch=64, lr=0.0025, r1_gamma=1.0, ema_kimg=20)


@preset_fn
def stylegan2_512() -> Config:
    """StyleGAN2 with ADA at 512x512, unconditional (MetFaces, AFHQ): StyleGAN2-ADA's --cfg=paper512 --mirror=1.

    Its numbers: batch 64 on 8 GPUs (8 each, a minibatch-statistic group of 8), fmaps 1 (64 channels at
    512 px, doubling at each halving up to 512), an 8-layer mapping network at 0.01x the learning rate,
    lr 0.0025, R1 gamma 0.5, style mixing 0.9, path length weight 2 on half the images, EMA half-life 20 kimg,
    25,000 kimg. Parameters: G 30,276,583 and D 28,982,849, ADA's own networks' (tests/test_models.py).
    Data: `bigbatch prepare FACES_FOLDER data/afhq512.h5 --resolution 512`.
    In fp32, as ADA's --fp32=1 (its default runs the 4 highest resolutions in fp16, clamped; here
    train.precision="bf16" is the mixed precision).
    """
    return _ada_paper("stylegan2_512", "data/afhq512.h5", 512, ch=128, batch=64, lr=0.0025, r1_gamma=0.5, ema_kimg=20)


@preset_fn
def stylegan2_1024() -> Config:
    """StyleGAN2 with ADA at 1024x1024, unconditional (FFHQ, MetFaces): StyleGAN2-ADA's --cfg=paper1024 --mirror=1.

    With train.r1_gamma=10, its --cfg=stylegan2 (StyleGAN2's config F). Its numbers: batch 32 on 8 GPUs (4
    each, a minibatch-statistic group of 4), fmaps 1 (32 channels at 1024 px, doubling at each halving up to
    512), an 8-layer mapping network at 0.01x the learning rate,
    lr 0.002, R1 gamma 2, style mixing 0.9, path length weight 2 on half the images, EMA half-life 10 kimg,
    25,000 kimg. Parameters: G 30,370,060 and D 29,012,513, ADA's own networks' (tests/test_models.py).
    Data: `bigbatch prepare FACES_FOLDER data/ffhq1024.h5 --resolution 1024`.
    In fp32, as ADA's --fp32=1 (its default runs the 4 highest resolutions in fp16, clamped; here
    train.precision="bf16" is the mixed precision).
    """
    return _ada_paper("stylegan2_1024", "data/ffhq1024.h5", 1024, ch=128, batch=32, lr=0.002, r1_gamma=2.0, ema_kimg=10)


# The classifier and face-swap recipes live in modules of their own and are registered here, with the others.
from bigbatch.presets_classify import (  # noqa: E402
    fashion_resnet,
    fashion_resnet_fast,
    finetune_resnet50,
    imagenet_resnet18_ffcv,
    imagenet_resnet50,
    imagenet_resnet50_fast,
    imagenet_resnet50_ffcv,
)
from bigbatch.presets_swap import saehd128, saehd512_df_ud, saehd_cpu, xseg  # noqa: E402

for _fn in (
    fashion_resnet,
    fashion_resnet_fast,
    imagenet_resnet50_fast,
    imagenet_resnet50,
    finetune_resnet50,
    imagenet_resnet50_ffcv,
    imagenet_resnet18_ffcv,
    saehd128,
    saehd512_df_ud,
    saehd_cpu,
    xseg,
):
    preset_fn(_fn)
