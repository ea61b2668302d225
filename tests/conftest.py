import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

# Idle torch threads sleep instead of spinning: on a shared 2-core machine spinning made Inception 5x slower.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Inductor compiles in this process, not in a pool of worker processes (a Python importing torch per core, in
# every compiling process and test subprocess): for the tests' tiny graphs on a machine whose cores are all test
# workers already, the pool cost more CPU than it saved (bench/compile_start.py, two starts: 55 -> 46 CPU s).
if (os.cpu_count() or 1) <= 4:
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# Inductor takes the CPU's vector instructions from /proc/cpuinfo's flags instead of compiling and loading a
# test program for each (AVX-512, AVX2: ~9 CPU s in every process that compiles into a new cache, as each test's
# does; its compiled kernels are the same).
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")

import pytest
import torch

import bigbatch


def pytest_configure(config):
    """Each worker's share of the cores (at most 2), in its own threads and in the processes its tests start
    (torchrun's ranks, the CLI): two workers of two threads each on 2 cores made test_resume.py and
    test_training_eval.py take a third more CPU time than one thread each. OMP_NUM_THREADS set by hand is kept."""
    workers = getattr(config, "workerinput", {}).get("workercount")
    if workers is None and config.getoption("numprocesses", None):
        return  # pytest-xdist's controller, which runs no test: its workers set their own
    share = str(max(1, min(2, (os.cpu_count() or 1) // (workers or 1))))
    given = os.environ.setdefault("OMP_NUM_THREADS", share)
    torch.set_num_threads(int(given) if given.isdigit() and int(given) > 0 else int(share))  # (not "4,2" or "")


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
    # Each test in a folder of its own, with a cache of its own: what one caches (a classifier, reference
    # statistics) neither leaks into the user's ~/.cache/bigbatch nor is read back by a later test or suite.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BIGBATCH_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="session", autouse=True)
def _one_inductor_cache(tmp_path_factory):
    # What Inductor compiles (the fused kernels, train.compile's graphs) kept in one folder for the whole test run,
    # every worker and test subprocess, as a user's machine keeps it from one run to the next: the same graphs were
    # built again in test after test (a third of the compiling tests' CPU time). The tests of a cold start and of
    # the cache itself unset TORCHINDUCTOR_CACHE_DIR for their processes, and so compile from nothing.
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # (shared by the workers, as made_once's folders)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor-cache"))
        yield


RESTART_ARGS = ["train.batch=32", "train.micro_batch=8", "train.kimg=0.512", "checkpoint.every_kimg=0.128"]
"""The 2-process run the elastic-restart tests (torchrun, Dask) kill a rank of, on top of test_distributed.ARGS."""


def made_once(tmp_path_factory, name: str, make) -> Path:
    """`make(folder)` run once for the whole test run, under pytest-xdist too: a session fixture is made once
    per worker, so two tests on two workers made the same run twice. The first worker to ask makes it (the
    other waits on the lock) in the folder the workers share; its output is read, never written, by tests."""
    from filelock import FileLock  # (torch's own dependency)

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the folder of every worker's basetemp
    folder, done = root / f"made-once-{name}", root / f"made-once-{name}.done"
    with FileLock(str(root / f"made-once-{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # (left by a make that failed)
            folder.mkdir()
            make(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory):
    """The run directory of RESTART_ARGS trained by 2 torchrun processes, left alone: what a run that
    lost a rank and restarted must end with. Trained once for the test run."""
    from test_distributed import train

    return made_once(tmp_path_factory, "uninterrupted", lambda d: train(d / "whole", 2, *RESTART_ARGS)) / "whole"


@pytest.fixture(scope="session")
def one_process_run(tmp_path_factory):
    """The last checkpoint of test_distributed.ARGS at batch 32 = micro-batch 8 x accumulation 4, trained by one
    process: what 2 ranks launched any way (torchrun's nodes, Dask, Ray) must equal. Trained once for the test run."""
    from test_distributed import train

    made = made_once(tmp_path_factory, "one", lambda d: train(d / "one", 1, "train.batch=32", "train.micro_batch=8"))
    return made / "one" / "checkpoints" / "000000.256"


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


def stopped_then_resumed(task_class, cfg, run_dir: Path, at: int) -> Path:
    """Train `cfg` in `run_dir`, stopped by SIGTERM after the step that reaches `at` images (a task's `step`
    signalling, as a batch system would), then resumed to its end: the run a test compares with an uninterrupted one."""
    import signal

    step = task_class.step

    def step_then_signal(self, feed):
        out = step(self, feed)
        if feed.nimg == at:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    with pytest.MonkeyPatch.context() as patch, pytest.raises(bigbatch.Stopped) as stopped:
        patch.setattr(task_class, "step", step_then_signal)
        bigbatch.train(cfg, run_dir=run_dir, quiet=True)
    run = stopped.value.run
    from bigbatch.checkpoint_find import find_checkpoint

    saved = find_checkpoint(run) / "meta.json"  # (a stop's save says so: info reads it)
    assert json.loads(saved.read_text())["stopped"] is True
    bigbatch.train(cfg, run_dir=run, resume=True, quiet=True)
    return run


def interrupted_prepare(monkeypatch, *args, **kwargs) -> None:
    """prepare(*args, **kwargs) stopped by Ctrl-C at its 300th image written, inside the second part of 256: two
    parts kept (their decoding runs ahead of the writing) for the next prepare to resume from."""
    import importlib

    from bigbatch.data import prepare

    preparing = importlib.import_module("bigbatch.data.prepare")  # (bigbatch.data.prepare is also the function)
    add, calls = preparing.H5Writer.add, [0]

    def add_then_interrupt(self, *a, **k):
        calls[0] += 1
        if calls[0] == 300:
            raise KeyboardInterrupt
        return add(self, *a, **k)

    with monkeypatch.context() as patched:
        patched.setattr(preparing.H5Writer, "add", add_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            prepare(*args, **kwargs)


def limited(max_bytes):
    """preexec_fn: files this process writes stop growing at max_bytes, the write failing with EFBIG as a
    full disk fails with ENOSPC (SIGXFSZ ignored, so the write returns the error instead of killing)."""
    import resource

    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))

    return apply


def bigbatch_limited(max_bytes, *argv, cwd):
    cmd = [sys.executable, "-m", "bigbatch", *argv]
    return subprocess.run(cmd, preexec_fn=limited(max_bytes), capture_output=True, text=True, cwd=cwd, timeout=300)
