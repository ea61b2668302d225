import os

# Idle torch threads sleep instead of spinning: on a shared 2-core machine spinning made Inception 5x slower.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch

import bigbatch

torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture
def tiny():
    """The digits recipe shrunk to a few seconds: 16px, narrow nets, 512 images."""
    return bigbatch.preset("digits").override(
        {
            "data.resolution": 16,
            "model.ch": 8,
            "model.dim_z": 16,
            "train.kimg": 0.512,
            "train.batch": 32,
            "train.micro_batch": 16,
            "train.log_every_kimg": 0.128,
            "checkpoint.every_kimg": 0.256,
            "sample.every_kimg": 0.256,
            "sample.n": 16,
            "model.options": {"g_sn": True},  # spectral norm in G too, so resume covers its state
        }
    )


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


RESTART_ARGS = ["train.batch=32", "train.micro_batch=8", "train.kimg=0.512", "checkpoint.every_kimg=0.128"]
"""The 2-process run the elastic-restart tests (torchrun, Dask) kill a rank of, on top of test_distributed.ARGS."""


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory):
    """The run directory of RESTART_ARGS trained by 2 torchrun processes, left alone: what a run that
    lost a rank and restarted must end with. Trained once for the session."""
    from test_distributed import train

    run = tmp_path_factory.mktemp("uninterrupted") / "whole"
    train(run, 2, *RESTART_ARGS)
    return run


@pytest.fixture
def faces(tmp_path):
    """Two tiny face sets with masks (alpha) and eyes-and-mouth regions (a folder), as prepare writes them."""
    import numpy as np
    from PIL import Image

    from bigbatch.data.prepare import prepare

    rng = np.random.default_rng(0)
    paths = []
    for side in ("src", "dst"):
        (tmp_path / side / "img").mkdir(parents=True)
        (tmp_path / side / "em").mkdir()
        for i in range(12):
            a = rng.integers(0, 256, (72, 72, 4), dtype=np.uint8)
            a[..., 3] = 0
            a[12:60, 16:56, 3] = 255
            Image.fromarray(a, "RGBA").save(tmp_path / side / "img" / f"{i:02d}.png")
            em = np.zeros((72, 72), np.uint8)
            em[24:32, 20:52] = 255
            Image.fromarray(em).save(tmp_path / side / "em" / f"{i:02d}.png")
        out = tmp_path / f"{side}.h5"
        prepare(
            str(tmp_path / side / "img"), str(out), 64, workers=0, masks="alpha", eyes_mouth=str(tmp_path / side / "em")
        )
        paths.append(out)
    return paths
