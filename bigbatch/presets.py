"""Named recipes. Each is a function returning a full Config; its docstring says where its numbers come from."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

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
from bigbatch.errors import BigbatchError

_PRESETS: dict[str, Callable[[], Config]] = {}


def preset_fn(fn: Callable[[], Config]) -> Callable[[], Config]:
    _PRESETS[fn.__name__] = fn
    return fn


def list_presets() -> dict[str, str]:
    """Preset names and the first line of their docstrings."""
    return {name: (fn.__doc__ or "").strip().splitlines()[0] for name, fn in sorted(_PRESETS.items())}


def base_config(name: str | None, config: str | None, default: str = "digits") -> Config:
    """The config a command starts from: --preset NAME, or --config FILE.toml, or the `default` preset."""
    if name and config:
        raise BigbatchError("give either --preset or --config, not both")
    return Config.load(config) if config else preset(name or default)


def preset(name: str) -> Config:
    """The Config of a named recipe."""
    if name not in _PRESETS:
        raise BigbatchError(f"unknown preset '{name}'; valid: {', '.join(sorted(_PRESETS))}")
    return _PRESETS[name]()


def reference_eval(images_per_iteration: int) -> EvalConfig:
    """BigGAN-PyTorch's scripts' evaluation: every 2000 iterations (--test_every 2000), 50k samples
    (--num_inception_images), G_ema in eval mode with its running statistics (--G_eval_mode). Its best
    copy follows IS by default (--which_best); here FID picks checkpoints/best/ (eval.best="is" for theirs)."""
    return EvalConfig(every_kimg=2000 * images_per_iteration / 1000, metrics="fid,is", n=50_000, best="fid")


def ema_halflife_kimg(decay: float, images_per_update: int) -> float:
    """The half-life (kimg) of an EMA with `decay` per update of `images_per_update` images."""
    return math.log(0.5) / math.log(decay) * images_per_update / 1000


IMAGENET = 1_281_167  # ImageNet-1k training images


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
    micro-batch updates). Data: `bigbatch prepare IMAGENET_TRAIN data/imagenet128.h5 --resolution 128`.
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
    dim_z 128 with shared embedding 128, attention at 64, SN eps 1e-6, BN eps 1e-5, orthogonal init, no
    orthogonal regularization, EMA 0.9999 from iteration 20k, G sampled in eval mode; its default 100
    epochs of ImageNet as the run length. micro_batch "auto" as in biggan128_bs2048.
    """
    return Config(
        name="biggan_deep128",
        data=DataConfig(path="data/imagenet128.h5", resolution=128),
        model=ModelConfig(name="biggan_deep", ch=128, dim_z=128),
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
    init, SN eps 1e-8, EMA 0.9999 per iteration (200 real images) from iteration 1000, 500 epochs.
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
    rule), betas (0, 0.999) (the paper: 0.9), ch 64, dim_z 128 with a shared class embedding, attention at
    64 in G and D, SN eps 1e-8, Xavier init, EMA 0.9999 per iteration from iteration 2000, G in eval mode;
    about 1M iterations as in Zhang et al. 2019.
    """
    return Config(
        name="sagan128",
        data=DataConfig(path="data/imagenet128.h5", resolution=128),
        model=ModelConfig(name="sagan", ch=64, dim_z=128),
        train=TrainConfig(
            kimg=1_000_000 * 256 / 1000,
            batch=256,
            micro_batch="auto",
            g_lr=1e-4,
            d_lr=4e-4,
            betas=(0.0, 0.999),
            ema_halflife_kimg=ema_halflife_kimg(0.9999, 256),
            ema_start_kimg=2000 * 256 / 1000,
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


FASHION_TRAIN = 60_000  # Fashion-MNIST training images (one epoch, in images)


def _fashion_classifier(name: str, model: ModelConfig, train: TrainConfig, schedule: list | None = None) -> Config:
    """What the two Fashion-MNIST classifier presets share: the data, its official 10k test split as the
    held-out split scored every half epoch, mirrored training images, checkpoints every 2 epochs."""
    return Config(
        name=name,
        task="classify",
        data=DataConfig(
            path="builtin:fashion-mnist",
            resolution=28,
            xflip=True,
            val_path="builtin:fashion-mnist-test",
            schedule=schedule or [],
        ),
        model=model,
        train=train,
        checkpoint=CheckpointConfig(every_kimg=120, keep=3),
        sample=SampleConfig(every_kimg=60, n=32),
        eval=EvalConfig(every_kimg=30, batch_size=500),
    )


@preset_fn
def fashion_resnet() -> Config:
    """ResNet-20 on Fashion-MNIST at 28 px, the plain recipe: the baseline of `fashion_resnet_fast`.

    He et al. 2016's CIFAR schedule (sec. 4.2) as most scripts run it: SGD with momentum 0.9 at lr 0.1
    for batch 128, weight decay 5e-4 on every parameter, the rate divided by 10 at 50% and 75% of the
    run, one resolution and one batch throughout, no warm-up, last BN gamma initialised to one, no
    label smoothing; 10 epochs (600 kimg), scored on the 10k test images every half epoch.
    """
    train = TrainConfig(
        kimg=10 * FASHION_TRAIN / 1000,
        batch=128,
        micro_batch=128,
        optimizer="sgd",
        lr=0.1,
        lr_batch=128,
        momentum=0.9,
        nesterov=False,
        weight_decay=5e-4,
        norm_decay=True,
        lr_decay="step",
        lr_steps=[5 * FASHION_TRAIN / 1000, 7.5 * FASHION_TRAIN / 1000],
        log_every_kimg=6,
    )
    return _fashion_classifier("fashion_resnet", ModelConfig(name="resnet_cifar", ch=16, options={"depth": 20}), train)


@preset_fn
def fashion_resnet_fast() -> Config:
    """ResNet-20 on Fashion-MNIST with the fast-ImageNet recipe (fast.ai/DIU, DAWNBench 2018), scaled down
    and tuned to reach 90% in fewer images than fastai's `fit_one_cycle` (bench/RESULTS.md, issue 45):
    - progressive resizing with a dynamic batch (data.schedule, as diux-dev/imagenet18): the first epoch at
      16 px and batch 256, then 28 px at 128. One change, early: each costs accuracy for about 30 kimg;
    - AdamW with fastai's betas 0.9/0.99 and decoupled weight decay 0.01 (9 points ahead of SGD at 30 kimg
      here), lr 4.5e-3 per 128 images (3e-3 is 0.15-0.75 points behind at 150 kimg) scaled to the batch
      (train.lr_batch), a linear warm-up over half an epoch, then linear decay to 0 at 300 kimg;
    - no weight decay on norms and biases (train.norm_decay = false: 93.2 -> 93.48% top-5 on ImageNet);
      the last BN gamma of each residual block at zero (Goyal et al. 2017); label smoothing 0.1;
    - what is scored and kept is an average of the weights of half-life 3 kimg (train.model_ema_kimg,
      capped at a tenth of the images seen: train.ema_rampup) with BatchNorm statistics re-estimated
      from the last 16 steps before each evaluation (eval.standing_stats, precise BN).
    bench/time_to_accuracy.py races it against `fashion_resnet` to a val_top1 target.
    """
    epoch = FASHION_TRAIN / 1000
    train = TrainConfig(
        kimg=5 * epoch,
        batch=128,
        micro_batch=128,
        optimizer="adamw",
        lr=4.5e-3,
        lr_batch=128,
        betas=(0.9, 0.99),
        weight_decay=0.01,
        norm_decay=False,
        warmup_kimg=0.5 * epoch,
        lr_decay="linear",
        label_smoothing=0.1,
        model_ema_kimg=3.0,
        ema_rampup=0.1,
        log_every_kimg=6,
    )
    model = ModelConfig(name="resnet_cifar", ch=16, options={"depth": 20, "zero_init_residual": True})
    schedule = [  # batches as multiples of train.batch (128), so that a batch sweep scales every phase
        {"kimg": 0, "resolution": 16, "batch": "2x"},
        {"kimg": 1 * epoch, "resolution": 28, "batch": "1x"},
    ]
    return _fashion_classifier("fashion_resnet_fast", model, train, schedule).override({"eval.standing_stats": 16})


def _imagenet_classifier(name: str, train: TrainConfig, data: DataConfig, zero_init_residual: bool) -> Config:
    """ResNet-50 on ImageNet-1k prepared as DATA.h5 files (`bigbatch prepare`): training images at
    data.path, the 50k validation images at data.val_path (--buckets for rectangular validation)."""
    return Config(
        name=name,
        task="classify",
        data=data,
        model=ModelConfig(name="resnet50", ch=64, options={"zero_init_residual": zero_init_residual}),
        train=train,
        checkpoint=CheckpointConfig(every_kimg=IMAGENET / 1000, keep=3),
        sample=SampleConfig(every_kimg=IMAGENET / 1000, n=32),
        eval=EvalConfig(every_kimg=IMAGENET / 1000, batch_size=250),
    )


@preset_fn
def imagenet_resnet50_fast() -> Config:
    """ResNet-50 on ImageNet, fast.ai/DIU's one-machine schedule: 93% top-5 in 28 epochs (109 minutes on 8 V100s).

    diux-dev/imagenet18 train.py `one_machine` and training/train_imagenet_nv.py: epochs 0-7 at 128 px,
    lr 1 -> 2 (warm-up); 7-13 at 128 px, lr 2 -> 0.25; 13-22 at 224 px, lr 0.4375 -> 0.04375; 22-25,
    lr -> 0.004375; 25-28 at 288 px, lr 0.0025 -> 0.00025, with rectangular validation. Their batch
    sizes (512, 224, 128) are per GPU, so 4096, 1792 and 1024 over 8 GPUs; their rates scale by the
    batch (bs_scale), here train.lr_batch = 4096 with lr [1, 0.1] at 224 px etc. SGD momentum 0.9,
    weight decay 1e-4 but none on BN parameters and biases (--no-bn-wd), zero last-BN gamma
    (--init-bn0), fp16 (they used a static loss scale of 1024; here a dynamic one), random-resized
    crops (min scale 0.08; they raised it to 0.087 and 0.5 in later phases), flips. Prepare the
    training images whole, short side 352, as JPEG (one store for every phase: the loader cuts the
    random-resized crops from the whole image before decoding), and the validation images the same
    way: `bigbatch prepare train/ imagenet-train.h5 --resolution 352 --codec jpeg --crop none`,
    `bigbatch prepare val/ imagenet-val.h5 --resolution 352 --codec jpeg --crop none --labels
    LOC_val_solution.csv --classes imagenet-train.h5` (rectangular validation at each image's own ratio).
    Not taken from fashion_resnet_fast's tuning, which was measured on 0.3M images only: AdamW, and the
    average of weights with precise BN (eval.standing_stats); here the rate ends near 0, where it adds little.
    """
    e = IMAGENET / 1000  # one epoch in kimg
    schedule = [  # batches 4096, 1792, 1024 as multiples of train.batch (1024), so a batch sweep scales them all
        {"kimg": 0, "resolution": 128, "batch": "4x", "lr": [1.0, 2.0]},
        {"kimg": 7 * e, "lr": [2.0, 0.25]},
        {"kimg": 13 * e, "resolution": 224, "batch": "1.75x", "lr": [1.0, 0.1]},
        {"kimg": 22 * e, "lr": [0.1, 0.01]},
        {"kimg": 25 * e, "resolution": 288, "batch": "1x", "lr": [0.01, 0.001]},
    ]
    data = DataConfig(
        path="imagenet-train.h5",
        resolution=128,
        xflip=True,
        workers=8,
        val_path="imagenet-val.h5",
        val_rect=True,
        val_crop=1.14,
        schedule=schedule,
    )
    train = TrainConfig(
        kimg=28 * e,
        batch=1024,
        micro_batch="auto",
        precision="fp16",
        optimizer="sgd",
        lr=1.0,
        lr_batch=4096,
        momentum=0.9,
        nesterov=False,
        weight_decay=1e-4,
        norm_decay=False,
        crop_scale=0.08,
        log_every_kimg=100,
    )
    return _imagenet_classifier("imagenet_resnet50_fast", train, data, zero_init_residual=True)


@preset_fn
def imagenet_resnet50() -> Config:
    """ResNet-50 on ImageNet, the plain 90-epoch recipe (He et al. 2016; torchvision's reference script).

    224 px throughout, batch 256, SGD momentum 0.9 at lr 0.1, weight decay 1e-4 on every parameter,
    the rate divided by 10 at epochs 30 and 60, random-resized crops (min scale 0.08) and flips,
    validation by resizing to 256 and cropping the center 224 (val_crop 1.14). The baseline of
    `imagenet_resnet50_fast`; same data files.
    """
    e = IMAGENET / 1000
    data = DataConfig(
        path="imagenet-train.h5", resolution=224, xflip=True, workers=8, val_path="imagenet-val.h5", val_crop=1.14
    )
    train = TrainConfig(
        kimg=90 * e,
        batch=256,
        micro_batch="auto",
        optimizer="sgd",
        lr=0.1,
        lr_batch=256,
        momentum=0.9,
        nesterov=False,
        weight_decay=1e-4,
        norm_decay=True,
        lr_decay="step",
        lr_steps=[30 * e, 60 * e],
        crop_scale=0.08,
        log_every_kimg=100,
    )
    return _imagenet_classifier("imagenet_resnet50", train, data, zero_init_residual=False)


@preset_fn
def finetune_resnet50() -> Config:
    """An ImageNet ResNet-50 fine-tuned on your classes, as fastai's first lesson (`fine_tune`).
    224 px, the body from train.init_from (torchvision's or timm's resnet50 weights, .pth or .safetensors), the
    head new; the head alone for the first 2 kimg, then everything, the body at a tenth of the rate
    (AdamW 1e-3 per 64 images, warm-up, cosine decay), label smoothing, random-resized crops, flips,
    10% held out. Set data.path to a prepared data file and train.init_from to the weights."""
    data = DataConfig(path="data/train.h5", resolution=224, xflip=True, val_fraction=0.1, val_crop=1.14)
    train = TrainConfig(kimg=20, batch=64, micro_batch="auto", optimizer="adamw", lr=1e-3, lr_batch=64)
    train = replace(train, weight_decay=0.01, warmup_kimg=1, lr_decay="cosine", label_smoothing=0.1)
    train = replace(train, crop_scale=0.35, init_from="resnet50.pth", freeze_kimg=2, body_lr_mult=0.1)
    cfg = _imagenet_classifier("finetune_resnet50", train, data, zero_init_residual=False)
    every = {"checkpoint": CheckpointConfig(every_kimg=2), "sample": SampleConfig(every_kimg=2, n=32)}
    return replace(cfg, **every, eval=EvalConfig(every_kimg=2, batch_size=128))


def _stylegan2(
    name: str, data: DataConfig, model: ModelConfig, train: TrainConfig, per_gpu: int, snapshot_kimg: float
) -> Config:
    """What StyleGAN2-ADA's configurations share (its train.py): the non-saturating loss, Adam with betas
    (0, 0.99) and eps 1e-8, R1 every 16 D steps, path length regularization every 4 G steps, ADA's
    augmentation (bgc, target 0.6, p moving at 500 kimg), FID on 50k images at every snapshot. Its lazy
    regularization runs as separate optimizer steps, whose count it offsets by scaling Adam's rates and
    betas (by 4/5 for G and 16/17 for D); here the penalties join the ordinary steps, so those stay as given.
    `per_gpu`: its micro-batch on each of its reference GPUs."""
    return Config(
        name=name,
        data=data,
        model=model,
        train=replace(
            train,
            micro_batch=per_gpu,
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


@preset_fn
def stylegan2_cifar() -> Config:
    """StyleGAN2 with ADA on CIFAR-10 at 32x32, class-conditional: StyleGAN2-ADA's --cfg=cifar --cond=1.

    Its numbers: batch 64 on 2 GPUs (32 each, one minibatch-statistic group of 32), fmaps 1 (512 channels
    at every resolution here), a 2-layer mapping network in G (8 in D's class mapping), D without residual
    skips ("orig"), lr 0.0025, R1 gamma 0.01, no style mixing and no path length regularization, EMA
    half-life 500 kimg ramped up as 5% of the images seen, 100,000 kimg; x-flips off. Parameters: G
    20,215,315 and D 23,089,664, ADA's own networks' counts at these settings (tests/test_models.py).
    Data: `bigbatch prepare CIFAR10_FOLDER data/cifar10.h5`.
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
            kimg=100_000, batch=64, g_lr=0.0025, d_lr=0.0025, r1_gamma=0.01, ema_halflife_kimg=500, ema_rampup=0.05
        ),
        per_gpu=32,
        snapshot_kimg=200,
    )


@preset_fn
def stylegan2_256() -> Config:
    """StyleGAN2 with ADA at 256x256, unconditional (FFHQ, LSUN): StyleGAN2-ADA's --cfg=paper256 --mirror=1.

    Its numbers: batch 64 on 8 GPUs (8 each, a minibatch-statistic group of 8), fmaps 0.5 (64 channels at
    256 px, doubling at each halving up to 512), an 8-layer mapping network at 0.01x the learning rate,
    lr 0.0025, R1 gamma 1, style mixing 0.9, path length weight 2 on half the images, EMA half-life 20 kimg,
    25,000 kimg. Data: `bigbatch prepare FACES_FOLDER data/ffhq256.h5 --resolution 256`.
    """
    return _stylegan2(
        "stylegan2_256",
        DataConfig(path="data/ffhq256.h5", resolution=256, xflip=True),
        ModelConfig(name="stylegan2", ch=64, dim_z=512, conditional=False, options={"mbstd_group": 8}),
        TrainConfig(kimg=25_000, batch=64, g_lr=0.0025, d_lr=0.0025, r1_gamma=1.0, pl_weight=2.0, ema_halflife_kimg=20),
        per_gpu=8,
        snapshot_kimg=200,
    )


# The face-swap recipes live in their own module and are registered here, with the others.
from bigbatch.presets_swap import saehd128, saehd512_df_ud, saehd_cpu  # noqa: E402

for _swap in (saehd128, saehd512_df_ud, saehd_cpu):
    preset_fn(_swap)
