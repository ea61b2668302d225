"""Interrupted runs resume to the same bits; broken checkpoints are skipped or refused clearly."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import bigbatch
from bigbatch.checkpoints import find_checkpoint
from bigbatch.cli import main
from bigbatch.tasks.gan.task import GANTask


def weights(run, name="000000.512"):
    return {net: (run / "checkpoints" / name / f"{net}.safetensors").read_bytes() for net in ("G", "D", "G_ema")}


@pytest.fixture
def uninterrupted(tiny, tmp_path):
    return weights(bigbatch.train(tiny, run_dir=tmp_path / "whole", quiet=True))


def test_resume_after_a_shorter_run_is_bit_identical(tiny, tmp_path, uninterrupted):
    run = tmp_path / "parts"
    bigbatch.train(tiny.override({"train.kimg": 0.256}), run_dir=run, quiet=True)
    bigbatch.train(tiny, run_dir=run, resume=True, quiet=True)
    assert weights(run) == uninterrupted
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["kimg"] for r in rows] == [0.128, 0.256, 0.384, 0.512]
    # Every row says how long the run has trained, its clock going on from the checkpoint resumed.
    seconds = [r["seconds"] for r in rows]
    assert seconds == sorted(seconds) and seconds[0] > 0


def test_sigterm_saves_a_checkpoint_and_resume_is_bit_identical(tiny, tmp_path, uninterrupted, monkeypatch):
    run = tmp_path / "signalled"
    g_step = GANTask.g_step

    def g_step_then_signal(self, step):
        if step == 3:  # mid-way between the periodic checkpoints
            os.kill(os.getpid(), signal.SIGTERM)
        return g_step(self, step)

    monkeypatch.setattr(GANTask, "g_step", g_step_then_signal)
    bigbatch.train(tiny, run_dir=run, quiet=True)
    assert find_checkpoint(run).name == "000000.128"  # 4 iterations of 32 images
    monkeypatch.setattr(GANTask, "g_step", g_step)
    bigbatch.train(tiny, run_dir=run, resume=True, quiet=True)
    assert weights(run) == uninterrupted


def test_sigint_to_the_cli_exits_0_with_a_checkpoint(tmp_path):
    run = tmp_path / "cli"
    cmd = [
        sys.executable,
        "-m",
        "bigbatch.cli",
        "train",
        "--run-dir",
        str(run),
        "data.resolution=16",
        "model.ch=8",
        "train.kimg=1000",
        "train.log_every_kimg=0.064",
        "checkpoint.every_kimg=1000",
    ]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (run / "metrics.jsonl").exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert "Stopped by signal" in out and "--resume" in out
    assert find_checkpoint(run).parent.name == "checkpoints"


def test_half_written_checkpoints_are_ignored(tiny, tmp_path, capsys):
    run = bigbatch.train(tiny, run_dir=tmp_path / "run", quiet=True)
    half = run / "checkpoints" / "000009.000"
    half.mkdir()
    (half / "G.safetensors").write_bytes(b"partial")
    (run / "checkpoints" / ".tmp-000010.000-123").mkdir()
    (run / "checkpoints" / "latest").write_text("000009.000\n")
    with open(run / "metrics.jsonl", "a") as f:  # logged after the last checkpoint, then cut short by a crash
        f.write('{"kimg": 9.0, "loss_D": 1.0}\n{"kimg": 9.1, "lo')
    assert main(["info", str(run)]) == 0
    assert find_checkpoint(run).name == "000000.512"
    assert "names no complete checkpoint" in capsys.readouterr().err
    bigbatch.train(tiny.override({"train.kimg": 0.64}), run_dir=run, resume=True, quiet=True)
    assert find_checkpoint(run).name == "000000.640"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["kimg"] for r in rows] == [0.128, 0.256, 0.384, 0.512, 0.64]


def test_corrupt_checkpoint_is_refused_in_one_line(tiny, tmp_path, capsys):
    run = bigbatch.train(tiny, run_dir=tmp_path / "run", quiet=True)
    state = run / "checkpoints" / "000000.512" / "state.pt"
    state.write_bytes(b"\0" * state.stat().st_size)
    capsys.readouterr()
    assert main(["train", "--run-dir", str(run), "--resume", "train.kimg=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "000000.512 is corrupt: state.pt" in err
    g = run / "checkpoints" / "000000.512" / "G_ema.safetensors"
    g.write_bytes(b"\xff" * g.stat().st_size)
    assert main(["sample", str(run)]) == 2
    assert "G_ema.safetensors cannot be read" in capsys.readouterr().err


def test_resume_refuses_a_changed_recipe(tiny, tmp_path):
    run = bigbatch.train(tiny, run_dir=tmp_path / "run", quiet=True)
    with pytest.raises(bigbatch.BigbatchError, match="differs from the run's in train.g_lr"):
        bigbatch.train(tiny.override({"train.g_lr": 1e-3}), run_dir=run, resume=True, quiet=True)
