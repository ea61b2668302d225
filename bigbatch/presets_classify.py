"""The classifier recipes: ResNet-20 on Fashion-MNIST (the fast recipe and its baseline), ResNet-50 on ImageNet
(fast.ai/DIU's schedule, the plain 90 epochs, fine-tuning) and FFCV's ResNet-50 and ResNet-18; bigbatch.presets
registers them with the others."""

from __future__ import annotations

from dataclasses import replace

from bigbatch.config import CheckpointConfig, Config, DataConfig, EvalConfig, ModelConfig, SampleConfig, TrainConfig

IMAGENET = 1_281_167  # ImageNet-1k training images
FASHION_TRAIN = 60_000  # Fashion-MNIST training images (one epoch, in images)
# ImageNet's files as `bigbatch prepare` writes them, and its validation: the short side resized to 256 for a center
# crop of 224 (found from outside: 1.14 resized to 255).
IMAGENET_DATA = {"path": "imagenet-train.h5", "xflip": True, "workers": 8, "val_path": "imagenet-val.h5"}
IMAGENET_CROP = 256 / 224


def _fashion_classifier(name: str, model: ModelConfig, train: TrainConfig, schedule: list | None = None) -> Config:
    """What the two Fashion-MNIST classifier presets share: the data, its official 10k test split as the
    held-out split scored every half epoch (the fast preset sets its own cadence), mirrored training
    images, checkpoints every 2 epochs."""
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


def fashion_resnet_fast() -> Config:
    """ResNet-20 on Fashion-MNIST with the fast-ImageNet recipe (fast.ai/DIU, DAWNBench 2018), scaled down.

    Tuned to reach 90% in fewer images than fastai's `fit_one_cycle` (bench/RESULTS.md, issue 45):
    - progressive resizing with a dynamic batch (data.schedule, as diux-dev/imagenet18): the first epoch at
      16 px and batch 256, then 28 px at 128. One change, early: each costs accuracy for about 30 kimg;
    - AdamW with fastai's betas 0.9/0.99 and decoupled weight decay 0.01 (9 points ahead of SGD at 30 kimg
      here), lr 4.5e-3 per 128 images (3e-3 is 0.15-0.75 points behind at 150 kimg) scaled to the batch
      (train.lr_batch), a linear warm-up over half an epoch, then linear decay to 0 at 300 kimg;
    - no weight decay on norms and biases (train.norm_decay = false: 93.2 -> 93.48% top-5 on ImageNet);
      the last BN gamma of each residual block at zero (Goyal et al. 2017); label smoothing 0.1;
    - what is scored and kept is an average of the weights of half-life 3 kimg (train.model_ema_kimg,
      capped at a tenth of the images seen: train.ema_rampup) with BatchNorm statistics re-estimated
      from the last 16 steps before each evaluation (eval.standing_stats, precise BN);
    - scored every epoch, as fastai's fit is, and from 120 kimg, where it nears 90%, every 10 kimg
      (eval.fine_every_kimg: the crossing known to 10 kimg instead of 30, for 3-13 s of a core a score;
      the half-epoch scores at 30 and 90 kimg took 1-4% of the time to 90%, and were dropped).
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
    scoring = {
        "eval.standing_stats": 16,
        "eval.every_kimg": epoch,
        "eval.fine_from_kimg": 2 * epoch,
        "eval.fine_every_kimg": 10,
    }
    return _fashion_classifier("fashion_resnet_fast", model, train, schedule).override(scoring)


def _imagenet_classifier(
    name: str, train: TrainConfig, data: DataConfig, zero_init_residual: bool, arch: str = "resnet50"
) -> Config:
    """A ResNet (`arch`) on ImageNet-1k prepared as DATA.h5 files (`bigbatch prepare`): training images at
    data.path, the 50k validation images at data.val_path (--buckets for rectangular validation)."""
    return Config(
        name=name,
        task="classify",
        data=data,
        model=ModelConfig(name=arch, ch=64, options={"zero_init_residual": zero_init_residual}),
        train=train,
        checkpoint=CheckpointConfig(every_kimg=IMAGENET / 1000, keep=3),
        sample=SampleConfig(every_kimg=IMAGENET / 1000, n=32),
        eval=EvalConfig(every_kimg=IMAGENET / 1000, batch_size=250),
    )


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
    From fashion_resnet_fast's tuning (bench/RESULTS.md, issue 45), what carries to this scale:
    - label smoothing 0.1 (train.label_smoothing), not in the DIU run: there second only to progressive
      resizing (without it 90% took 1.74x the time); at ImageNet scale Szegedy et al. 2016's value for
      1,000 classes, kept by He et al. 2019 ("Bag of Tricks"), torchvision's reference recipe
      (--label-smoothing 0.1) and timm's train.py (--smoothing 0.1);
    - progressive resizing with a dynamic batch, the rate scaled to the batch, no decay on norms and
      biases, zero last-BN gamma: the DIU run's own, kept.
    What does not: AdamW (tuned on 0.3M images of 10 classes; SGD at batch 4096 is Goyal et al.'s and DIU's
    tuned setting), the average of weights and precise BN (eval.standing_stats: an average of weights gains
    while the rate is high, and this one ends at 0.00025; the running statistics are settled by each
    epoch-end evaluation, hundreds of steps after a resolution change), a finer evaluation cadence
    (eval.fine_every_kimg: the target, 93% top-5, is reached in the last epochs), and a single early
    resolution change (DIU tuned its three phases at this scale; another plan needs ImageNet to test).
    """
    e = IMAGENET / 1000  # one epoch in kimg
    schedule = [  # batches 4096, 1792, 1024 as multiples of train.batch (1024), so a batch sweep scales them all
        {"kimg": 0, "resolution": 128, "batch": "4x", "lr": [1.0, 2.0]},
        {"kimg": 7 * e, "lr": [2.0, 0.25]},
        {"kimg": 13 * e, "resolution": 224, "batch": "1.75x", "lr": [1.0, 0.1]},
        {"kimg": 22 * e, "lr": [0.1, 0.01]},
        {"kimg": 25 * e, "resolution": 288, "batch": "1x", "lr": [0.01, 0.001]},
    ]
    data = DataConfig(**IMAGENET_DATA, resolution=128, val_rect=True, val_crop=IMAGENET_CROP, schedule=schedule)
    train = TrainConfig(
        kimg=28 * e,
        batch=1024,
        micro_batch="auto",
        precision="fp16",
        optimizer="sgd",
        lr_batch=4096,  # (the phases give the rates: train.lr is not read)
        momentum=0.9,
        nesterov=False,
        weight_decay=1e-4,
        norm_decay=False,
        label_smoothing=0.1,
        crop_scale=0.08,
        log_every_kimg=100,
    )
    return _imagenet_classifier("imagenet_resnet50_fast", train, data, zero_init_residual=True)


def imagenet_resnet50() -> Config:
    """ResNet-50 on ImageNet, the plain 90-epoch recipe (He et al. 2016; torchvision's reference script).

    224 px throughout, batch 256, SGD momentum 0.9 at lr 0.1, weight decay 1e-4 on every parameter,
    the rate divided by 10 at epochs 30 and 60, random-resized crops (min scale 0.08) and flips,
    validation by resizing to 256 and cropping the center 224 (val_crop 256/224). The baseline of
    `imagenet_resnet50_fast`; same data files.
    """
    e = IMAGENET / 1000
    data = DataConfig(**IMAGENET_DATA, resolution=224, val_crop=IMAGENET_CROP)
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


def ffcv_resolutions(epochs: int, start_ramp: int, end_ramp: int, low: int = 160, high: int = 192) -> list[dict]:
    """FFCV's progressive resizing (ffcv-imagenet train_imagenet.py, get_resolution) as data.schedule's phases: each
    epoch's side `low` up to start_ramp, `high` from end_ramp, between them the line from one to the other rounded
    to a multiple of 32 (Python's round, NumPy's: halves to even) - from 160 to 192, one step at the ramp's middle."""
    e = IMAGENET / 1000
    phases: list[dict] = []
    for epoch in range(epochs):
        if epoch <= start_ramp or epoch >= end_ramp:
            side = low if epoch <= start_ramp else high
        else:
            side = round((low + (high - low) * (epoch - start_ramp) / (end_ramp - start_ramp)) / 32) * 32
        if not phases or phases[-1]["resolution"] != side:
            phases.append({"kimg": epoch * e, "resolution": side})
    return phases


def _ffcv(name: str, arch: str, batch: int, lr: float, weight_decay: float) -> Config:
    """FFCV's ImageNet recipe (libffcv/ffcv-imagenet, rn50_88_epochs.yaml and rn18_88_epochs.yaml: 78.4% and 72.4%
    top-1), 88 epochs: SGD momentum 0.9 at `lr` per `batch` images (ResNet-50: 512 a GPU on 8, 4096; ResNet-18:
    1024 on one), its "cyclic" rate: from 1e-4 of it to it over 2 epochs, then linearly to 0 at the end; weight
    decay but on norms and biases (FFCV's rule is by name, 'bn' in it: it decays the shortcuts' BatchNorm and the
    head's bias, which go without here); label smoothing 0.1; BlurPool (use_blurpool); random-resized crops (scale
    0.08 to 1) at 160 px, 192 from epoch 71 (its ramp from epoch 65 to 76 in steps of 32 px: `ffcv_resolutions`);
    fp16 (autocast and a loss scale); validation at 256 px, the center 224/256 of the short side (its
    DEFAULT_CROP_RATIO), with the mirror images (lr_tta: FFCV sums the two logits, eval.tta averages the two
    predictions). Fewer epochs, as FFCV's other configs stretch the same schedule: train.kimg and
    data.schedule's phases (its ramp's epochs: 16 epochs, 11 to 13; 24, 17 to 20; 32, 23 to 27; 40, 29 to 34; 56,
    41 to 48). Prepare the images as `imagenet_resnet50_fast` says (whole, short side 352, JPEG)."""
    e = IMAGENET / 1000
    schedule = ffcv_resolutions(88, 65, 76)
    data = DataConfig(**IMAGENET_DATA, resolution=160, val_crop=IMAGENET_CROP, schedule=schedule)
    train = TrainConfig(kimg=88 * e, batch=batch, micro_batch="auto", precision="fp16", optimizer="sgd", lr=lr)
    train = replace(train, lr_batch=batch, momentum=0.9, nesterov=False, weight_decay=weight_decay, norm_decay=False)
    train = replace(train, warmup_kimg=2 * e, warmup_lr=lr * 1e-4, lr_decay="linear", lr_min=0.0)
    train = replace(train, label_smoothing=0.1, crop_scale=0.08, log_every_kimg=100)
    cfg = _imagenet_classifier(name, train, data, zero_init_residual=False, arch=arch)
    cfg = replace(cfg, model=replace(cfg.model, options={**cfg.model.options, "blurpool": True}))
    return replace(cfg, eval=replace(cfg.eval, resolution=256, tta=True))


def imagenet_resnet50_ffcv() -> Config:
    """ResNet-50 on ImageNet by FFCV's rn50_88_epochs config (78.4% top-1 in 77 minutes on 8 A100s).

    Batch 4096 (512 a GPU on 8) at lr 1.7, FFCV's cyclic rate, weight decay 1e-4 but on norms and biases, label
    smoothing 0.1, BlurPool, 160 px then 192 from epoch 71, fp16, validation at 256 px with flip TTA (`_ffcv`)."""
    return _ffcv("imagenet_resnet50_ffcv", "resnet50", batch=4096, lr=1.7, weight_decay=1e-4)


def imagenet_resnet18_ffcv() -> Config:
    """ResNet-18 on ImageNet by FFCV's rn18_88_epochs config (72.4% top-1 in 3.1 hours on one A100).

    Batch 1024 at lr 0.5, FFCV's cyclic rate, weight decay 5e-5 but on norms and biases, label smoothing 0.1,
    BlurPool, 160 px then 192 from epoch 71, fp16, validation at 256 px with flip TTA (`_ffcv`)."""
    return _ffcv("imagenet_resnet18_ffcv", "resnet18", batch=1024, lr=0.5, weight_decay=5e-5)


def finetune_resnet50() -> Config:
    """An ImageNet ResNet-50 fine-tuned on your classes, as fastai's first lesson (`fine_tune`).

    224 px, the body from train.init_from (torchvision's or timm's resnet50 weights, .pth or .safetensors, fed
    ImageNet's mean and std as they were trained: model.options.input_stats), the head new; the head alone for the
    first 2 kimg, then everything, the body at a tenth of the rate (AdamW 1e-3 per 64 images, warm-up, cosine
    decay), label smoothing, random-resized crops, flips, 10% held out. Set data.path to a prepared data file and
    train.init_from to the weights."""
    data = DataConfig(path="data/train.h5", resolution=224, xflip=True, val_fraction=0.1, val_crop=IMAGENET_CROP)
    train = TrainConfig(kimg=20, batch=64, micro_batch="auto", optimizer="adamw", lr=1e-3, lr_batch=64)
    train = replace(train, weight_decay=0.01, warmup_kimg=1, lr_decay="cosine", label_smoothing=0.1)
    train = replace(train, crop_scale=0.35, init_from="resnet50.pth", freeze_kimg=2, body_lr_mult=0.1)
    cfg = _imagenet_classifier("finetune_resnet50", train, data, zero_init_residual=False)
    # (the weights see ImageNet's mean and std, as they trained: found from outside, fed [-1, 1] instead)
    cfg = replace(cfg, model=replace(cfg.model, options={**cfg.model.options, "input_stats": "imagenet"}))
    every = {"checkpoint": CheckpointConfig(every_kimg=2), "sample": SampleConfig(every_kimg=2, n=32)}
    return replace(cfg, **every, eval=EvalConfig(every_kimg=2, batch_size=128))
