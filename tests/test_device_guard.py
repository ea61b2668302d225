"""Every task's training on CPU as if its models lived on a GPU: a tensor made on the host inside a step that
meets the step's tensors is an error naming both places (tests/device_guard.py), so a CPU tensor in a CUDA
step fails here before a GPU run dies of it. Each run is a few steps of `bigbatch.train` at toy sizes, under
every model family, every [augment] pipeline and group, R1, path length, consistency regularization, the classify
task's RandAugment, erasing, mixing and rotations, and the swap task's warp, colour transfer, masks, losses and
discriminators."""

from collections import Counter

import numpy as np
import pytest
import torch
from device_guard import DeviceGuard, DeviceMixError
from test_xseg_train import labelled  # noqa: F401 (a fixture)

import bigbatch
from bigbatch import loop
from bigbatch.models import stylegan2

SHORT = {
    "train.kimg": 0.064,
    "train.log_every_kimg": 0.032,
    "checkpoint.every_kimg": 0.064,
    "sample.every_kimg": 0.064,
    "sample.n": 8,
}
GAN = {**SHORT, "data.resolution": 16, "model.ch": 4, "model.dim_z": 8, "train.batch": 16, "train.micro_batch": 8}
DIFFAUGMENT = {"augment.pipeline": "diffaugment", "augment.policy": "color,translation,cutout", "augment.p": 1.0}
# ADA at a p where every group moves some images, and a target that moves p (after ADA_IMAGES)
ADA = {"augment.pipeline": "ada", "augment.policy": "bgcfnc", "augment.p": 0.6, "augment.target": 0.6}
ICR = {"train.cr_real": 10.0, "train.cr_fake": 10.0, "train.zcr_d": 20.0, "train.zcr_g": 0.5}
STYLEGAN2 = {"model.options.mixing": 0.9}  # on test_stylegan2.tiny: R1, path length, EMA rampup
GANS = {
    "dcgan, DiffAugment, ICR, fp16": {**DIFFAUGMENT, **ICR, "train.precision": "fp16"},  # (a D of BatchNorm)
    "biggan, ADA, orthogonal reg., R1": {
        "model.name": "biggan",
        "data.resolution": 32,
        "model.options": {"g_attn": 16, "d_attn": 16},
        "train.g_ortho": 1e-4,
        "train.d_ortho": 1e-4,
        "train.r1_gamma": 1.0,
        "train.r1_every": 2,
        **ADA,
    },
    # (64 px: its fused resampling and four stages; attention at 32 px, not 64 px's 4096-token one)
    "biggan_deep": {
        "model.name": "biggan_deep",
        "data.resolution": 64,
        "model.options": {"g_attn": 32, "d_attn": 32},
        "train.kimg": 0.016,
    },
    "sagan": {"model.name": "sagan", "data.resolution": 32},
    "sngan, unconditional, bf16": {
        "model.name": "sngan",
        "data.resolution": 32,
        "model.conditional": False,
        "train.precision": "bf16",
    },
    # bf16: R1 differentiates ADA's sampling under autocast (its second derivative is bigbatch's own)
    "stylegan2, ADA, R1, path length, bf16": {**STYLEGAN2, **ADA, "train.precision": "bf16"},
    "stylegan2, DiffAugment": {**STYLEGAN2, **DIFFAUGMENT},
}


def train_guarded(cfg, run_dir, monkeypatch) -> list[Counter]:
    """Train under the guard; what each iteration waited for on the device, by what and where."""
    build, waits = loop.build_task, []

    def counted(*args, **kwargs):
        task = build(*args, **kwargs)
        step = task.step

        def one(feed):
            before = Counter(guard.waits)
            out = step(feed)
            waits.append(guard.waits - before)
            return out

        task.step = one
        return task

    monkeypatch.setattr(loop, "build_task", counted)
    # StyleGAN2 keeps its filters a device at a time; here the host's and the step's device are one CPU, so those
    # made by earlier tests (the host's) are dropped, and the run makes its own from the step's tensors.
    monkeypatch.setattr(stylegan2, "_WEIGHTS", {})
    with DeviceGuard() as guard:
        run = bigbatch.train(cfg, run_dir=run_dir, quiet=True)
    assert (run / "checkpoints" / "latest").exists()
    assert waits
    return waits


ENGINE_READ = "tolist of a device tensor at bigbatch/engine/replicator.py"  # a step's means, norm, BatchNorm counts


def outside_the_engine(waits: list[Counter], optimizer_steps: int | None = None) -> list[str]:
    """The waits of a task's iterations but the engine's one read of each optimizer step's results (and that
    one read a step: `optimizer_steps` an iteration)."""
    if optimizer_steps is not None:
        reads = [sum(n for w, n in step.items() if w.startswith(ENGINE_READ)) for step in waits]
        assert reads == [optimizer_steps] * len(waits)
    # (A step skipped under fp16 reads its loss scale too, to tell settling from divergence and say it.)
    return sorted({w for step in waits for w in step if not w.startswith((ENGINE_READ, SKIPPED_READ))})


SKIPPED_READ = "item of a device tensor at bigbatch/engine/replicator.py"


@pytest.mark.parametrize("case", list(GANS))
def test_gan_steps_keep_their_tensors_on_the_models_device(case, tmp_path, monkeypatch):
    # ... and wait for the device only where the engine reads a step's results: the latents, the augmentation
    # parameters, StyleGAN2's draws and path lengths stay on the host and go to the device without waiting.
    from test_stylegan2 import tiny

    base = tiny(**SHORT) if case.startswith("stylegan2") else bigbatch.preset("digits").override(GAN)
    cfg = base.override(GANS[case])
    assert outside_the_engine(train_guarded(cfg, tmp_path / "r", monkeypatch), optimizer_steps=2) == []


def test_classify_steps_keep_their_tensors_on_the_models_device(tmp_path, monkeypatch):
    # Crops (cut by the loader) and flips, label smoothing; then rotation labels.
    from test_classify import tiny

    base = {**SHORT, "train.batch": 32, "train.micro_batch": 16, "eval.every_kimg": 0.064}
    for name, over in {
        "crops": {"train.crop_scale": 0.35, "train.label_smoothing": 0.1},
        "rotation": {"train.labels": "rotation", "train.crop_scale": 0.5, "data.val_fraction": 0.0}
        | {"eval.every_kimg": 0},
        # (found by review: their weights and fills were copied to the device blocking, 16 waits a step)
        "randaugment": {"train.randaugment": "rand-m9-n4-mstd0.5-inc1", "train.random_erase": 0.5},
    }.items():
        cfg = tiny(**(base | over))
        assert outside_the_engine(train_guarded(cfg, tmp_path / name, monkeypatch), optimizer_steps=1) == []


def test_swap_steps_keep_their_tensors_on_the_models_device(faces, tmp_path, monkeypatch):
    # The warp, masks, eyes-and-mouth priority, true-face and GAN losses, style losses and colour transfer.
    from test_swap import swap_config

    src, dst = faces
    for ct in ("rct", "sot"):
        cfg = swap_config(
            src,
            dst,
            **{
                "model.options.archi": "liae-ud" if ct == "rct" else "df-ud",
                "swap.ct_mode": ct,
                "swap.true_face_power": 0.0 if ct == "rct" else 0.1,  # df archis only
                "swap.random_hsv_power": 0.1,
                "swap.face_style_power": 0.1,
                "swap.bg_style_power": 0.1,
                "swap.blur_out_mask": True,
                "train.kimg": 0.008,  # (two iterations, a sheet and a checkpoint at the second)
            },
        )
        assert outside_the_engine(train_guarded(cfg, tmp_path / ct, monkeypatch)) == []


def test_xseg_steps_keep_their_tensors_on_the_models_device(labelled, tmp_path, monkeypatch):  # noqa: F811
    # DFL's XSeg augmentation: backgrounds, warp, flares, colours, filters, resizes, the JPEG round trip. Found from
    # outside: its draws went to the device with the batch and were read back, 23 waits an iteration.
    from test_xseg_train import xseg_config

    cfg = xseg_config(labelled[1], **{"train.batch": 8, "train.micro_batch": 4})
    assert outside_the_engine(train_guarded(cfg, tmp_path / "r", monkeypatch), optimizer_steps=1) == []


def test_the_guard_names_a_host_tensor_in_a_device_step_and_lets_the_right_ways_through():
    # The GPU's first StyleGAN2 step died of this (ada.apply compared its device parameters with a host
    # constant); params on the images' device is how the task hands them over.
    from bigbatch.tasks.gan import ada

    x = torch.randn(8, 3, 16, 16)
    with DeviceGuard():
        x = x.to(torch.device("cpu"))  # the step's device, as the task moves its batch
        params = ada.draw(["blit", "geom", "color", "filter", "noise", "cutout"], 0.7, 8, 16, 0, 9, 1).to(x.device)
        assert ada.apply(x, params, ["blit", "geom", "color", "filter", "noise", "cutout"]).shape == x.shape
        with pytest.raises(DeviceMixError, match=r"test_device_guard\.py:\d+ .*made at .*test_device_guard\.py"):
            _ = x * torch.ones(16)
        with pytest.raises(DeviceMixError, match="cat"):
            torch.cat([x, torch.zeros(1, 3, 16, 16)])
        # named, moved, derived, or a number: all fine, as on CUDA
        _ = x * torch.ones(16, device=x.device) + torch.ones(16).to(x.device) + x.new_ones(16) + torch.tensor(2.0)
        _ = x[torch.tensor([0, 2])]  # host indices
        for to_numpy in (lambda t: t.numpy(), np.asarray):  # CUDA refuses both
            with pytest.raises(DeviceMixError, match="NumPy"):
                to_numpy(x.sum(0))
        _ = x.cpu().numpy(), np.asarray(torch.ones(2))


def test_commands_after_training_keep_their_tensors_on_the_models_device(tmp_path):
    # sample (grid, interpolations, truncation), a classifier's eval and predict, lr-find and show-batch, run
    # in this process under the guard. (Not export: it builds and traces on the CPU by design.)
    import numpy as np
    from PIL import Image
    from test_classify import tiny

    from bigbatch.cli import main

    gan = bigbatch.train(bigbatch.preset("digits").override(GAN), run_dir=tmp_path / "gan", quiet=True)
    over = SHORT | {"train.batch": 32, "train.micro_batch": 16, "eval.every_kimg": 0}
    classifier = bigbatch.train(tiny(**over), run_dir=tmp_path / "cls", quiet=True)
    Image.fromarray(np.full((20, 24, 3), 99, np.uint8)).save(tmp_path / "x.png")
    commands = [
        ["sample", str(gan), "--n", "8", "--truncation", "1.5", "--out", str(tmp_path / "s.png")],
        ["sample", str(gan), "--interp", "--out", str(tmp_path / "i.png")],
        ["eval", str(classifier)],
        ["predict", str(classifier), str(tmp_path / "x.png")],
        ["lr-find", "--config", str(classifier / "config.toml"), "train.kimg=0.128"],
        ["show-batch", "--config", str(classifier / "config.toml")],
    ]
    for argv in commands:
        with DeviceGuard():
            assert main(argv) in (0, None), argv
