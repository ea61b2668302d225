"""The face-swap recipes (DeepFaceLab's SAEHD); bigbatch.presets registers them with the others."""

from __future__ import annotations

from bigbatch.config import (
    CheckpointConfig,
    Config,
    DataConfig,
    EvalConfig,
    ModelConfig,
    SampleConfig,
    SwapConfig,
    TrainConfig,
    XSegConfig,
)


def _saehd(name: str, data: DataConfig, options: dict, train: TrainConfig, swap: SwapConfig | None = None) -> Config:
    """What the SAEHD presets share: DFL's trainer around the model (AdaBelief at 5e-5, masked training
    when the data have masks, random warp, dst mirrored), previews every 1,000 iterations."""
    per_iteration = train.batch
    return Config(
        name=name,
        task="swap",
        data=data,
        model=ModelConfig(name="saehd", options=options),
        train=train,
        checkpoint=CheckpointConfig(
            every_kimg=10_000 * per_iteration / 1000, every_minutes=25, keep=3
        ),  # (DFL's autosave)
        sample=SampleConfig(every_kimg=1000 * per_iteration / 1000, n=8),
        swap=swap or SwapConfig(),
    )


def _swap_train(**kw: object) -> TrainConfig:
    """A TrainConfig for the swap task: only the keys it reads (the GAN's EMA default switched off)."""
    return TrainConfig(ema_halflife_kimg=TrainConfig().ema_halflife_kimg, **kw)  # type: ignore[arg-type]


def saehd128() -> Config:
    """DeepFaceLab's SAEHD with its defaults: 128 px, liae-ud, ae/e/d/d_mask dims 256/64/64/22, batch 8.

    DFL's numbers (models/Model_SAEHD/Model.py): AdaBelief at lr 5e-5 without bias correction, masked
    training, random warp, random dst flip, no clipping (its clipgrad option off), fp32 (its use_fp16
    off). 200k iterations (1,600 kimg), the length DFL users commonly train before turning random warp
    off. Data: `bigbatch prepare src_faces data/src.h5 --resolution 128 --masks alpha` and the same for dst
    (DFL's aligned folders: `--masks dfl --eyes-mouth dfl`).
    """
    return _saehd(
        "saehd128",
        DataConfig(path="data/src.h5", dst_path="data/dst.h5", resolution=128),
        {"archi": "liae-ud", "ae_dims": 256, "e_dims": 64, "d_dims": 64, "d_mask_dims": 22},
        _swap_train(kimg=200_000 * 8 / 1000, batch=8, micro_batch=8, log_every_kimg=100 * 8 / 1000),
    )


def saehd512_df_ud() -> Config:
    """SAEHD at 512 px in 6 GiB: df-ud, dims 320/64/72/22, batch 8, bf16, activation checkpointing.

    The run a user of a PyTorch port trained on a 6 GB RTX 2060 (2.6-3.1 s per iteration): the DFL model
    at 512 px that DFL itself cannot fit there. Micro-batch "auto" under a 6 GiB budget (the whole batch
    of 8 in one micro-batch fits: bench/memory.py); the rest as saehd128. Data: `bigbatch prepare ...
    --resolution 512 --masks alpha` for src and dst.
    """
    return _saehd(
        "saehd512_df_ud",
        DataConfig(path="data/src512.h5", dst_path="data/dst512.h5", resolution=512),
        {"archi": "df-ud", "ae_dims": 320, "e_dims": 64, "d_dims": 72, "d_mask_dims": 22},
        _swap_train(
            kimg=200_000 * 8 / 1000,
            batch=8,
            micro_batch="auto",
            memory_budget="6GiB",
            precision="bf16",
            checkpointing=True,
            log_every_kimg=100 * 8 / 1000,
        ),
    )


def saehd_cpu() -> Config:
    """A CPU-sized SAEHD swap between two data sets that ship offline: digits to Fashion-MNIST at 64 px.

    src: scikit-learn's 1,797 digits; dst: Fashion-MNIST's 60,000 training images (Debian's
    dataset-fashion-mnist), both upscaled to 64 px, 5% of each held out and scored (held-out SSIM).
    df-u at dims 64/16/16/8, batch 16, AdaBelief at 2e-4 (4x DFL's: a short run), no masks in the data.
    """
    return Config(
        name="saehd_cpu",
        task="swap",
        data=DataConfig(path="builtin:digits", dst_path="builtin:fashion-mnist", resolution=64, val_fraction=0.05),
        model=ModelConfig(
            name="saehd", options={"archi": "df-u", "ae_dims": 64, "e_dims": 16, "d_dims": 16, "d_mask_dims": 8}
        ),
        train=_swap_train(kimg=32, batch=16, micro_batch=16, log_every_kimg=0.8),
        checkpoint=CheckpointConfig(every_kimg=8, every_minutes=25, keep=2),
        sample=SampleConfig(every_kimg=4, n=8),
        eval=EvalConfig(every_kimg=8, batch_size=64),
        swap=SwapConfig(lr=2e-4),
    )


def xseg() -> Config:
    """DeepFaceLab's XSeg face segmenter, trained on the faces you labelled in DFL's XSeg editor: 256 px, batch 8.

    DFL's numbers (models/Model_XSeg/Model.py): RMSprop at lr 1e-4 with each weight updated with probability
    0.3, sigmoid cross-entropy, every face with another face's background and DFL's augmentation; its default
    batch is 4. 50k iterations; DFL users stop when the previews look right, often sooner, and start from DFL's
    generic XSeg model (train.init_from=DFL/_internal/model_generic_xseg) to need fewer labels. Data: `bigbatch
    prepare workspace/data_src/aligned data/xseg_src.h5 --masks labels --resolution 256`, the same for dst
    (data.dst_path); then `bigbatch xseg apply RUN ALIGNED` writes its masks into the faces.
    """
    return Config(
        name="xseg",
        task="xseg",
        data=DataConfig(path="data/xseg_src.h5", resolution=256),
        model=ModelConfig(name="xseg", options={}),
        train=_swap_train(kimg=50_000 * 8 / 1000, batch=8, micro_batch=8, log_every_kimg=100 * 8 / 1000),
        checkpoint=CheckpointConfig(every_kimg=5_000 * 8 / 1000, every_minutes=25, keep=3),
        sample=SampleConfig(every_kimg=500 * 8 / 1000, n=8),
        eval=EvalConfig(every_kimg=0),
        xseg=XSegConfig(),
    )
