"""Interrupted runs resume to the same bits; broken checkpoints are skipped or refused clearly."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomli_w
import torch

import bigbatch
from bigbatch.checkpoint_find import find_checkpoint
from bigbatch.cli import main
from bigbatch.tasks.gan.task import GANTask


def weights(run, name="000000.512"):
    return {net: (run / "checkpoints" / name / f"{net}.safetensors").read_bytes() for net in ("G", "D", "G_ema")}


@pytest.fixture
def uninterrupted(tiny, tmp_path):
    return weights(bigbatch.train(tiny, run_dir=tmp_path / "whole", quiet=True))


def test_resume_after_a_shorter_run_is_bit_identical(tiny, tmp_path, uninterrupted, capsys, monkeypatch):
    monkeypatch.setattr("bigbatch.errors._WARNED", set())
    run = tmp_path / "parts"
    bigbatch.train(tiny.override({"train.kimg": 0.256}), run_dir=run, quiet=True)
    capsys.readouterr()
    bigbatch.train(tiny, run_dir=run, resume=True, quiet=True)
    assert weights(run) == uninterrupted
    # A longer run is said (found from outside: --resume=auto with its --preset took the preset's length, unsaid).
    assert "train.kimg 0.256 -> 0.512: the run trains on to 0.512 kimg" in capsys.readouterr().err
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["kimg"] for r in rows] == [0.128, 0.256, 0.384, 0.512]
    # TensorBoard too: found from outside, a resume purged the row logged at its checkpoint's step.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    assert sorted(e.step for e in events.Scalars("kimg")) == [128, 256, 384, 512]
    # Every row says how long the run has trained, its clock going on from the checkpoint resumed.
    seconds = [r["seconds"] for r in rows]
    assert seconds == sorted(seconds) and seconds[0] > 0
    # Shortened to what it has trained, a resume would end at once and keep the shorter length: refused.
    with pytest.raises(bigbatch.BigbatchError, match=r"train.kimg=0.256 is not beyond the 0.512 kimg .* has trained"):
        bigbatch.train(tiny.override({"train.kimg": 0.256}), run_dir=run, resume=True, quiet=True)
    assert bigbatch.Config.load(run / "config.toml").train.kimg == tiny.train.kimg == 0.512
    # A job's --resume=auto command run again after the run was trained on is done, not refused (found from
    # outside: a requeued job failed on a finished run), and the run keeps its length.
    assert bigbatch.train(tiny.override({"train.kimg": 0.256}), run_dir=run, resume="auto", quiet=True) == run
    assert bigbatch.Config.load(run / "config.toml").train.kimg == 0.512 and weights(run) == uninterrupted


def test_a_run_that_lost_its_config_resumes_with_its_checkpoints_own(tiny, tmp_path, uninterrupted, capsys):
    # Found from outside: without RUN/config.toml, --resume compared the checkpoint with the default preset's
    # config and blamed an edit of config.toml.
    run = tmp_path / "lost"
    bigbatch.train(tiny.override({"train.kimg": 0.256}), run_dir=run, quiet=True)
    # Cut short, it is passed over for the checkpoint's copy too (found from outside: refused in one line).
    (run / "config.toml").write_text((run / "config.toml").read_text()[:300])
    assert main(["train", "--run-dir", str(run), "--resume", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "config.toml is cut short (300 of its " in err and ": resuming with 000000.256's copy" in err
    (run / "config.toml").write_text("garbage [[[\n")  # edited so: refused, the copy named (found from outside: unsaid)
    assert main(["train", "--run-dir", str(run), "--resume", "--dry-run"]) == 2
    (run / "config.toml").unlink()
    assert "or delete it, and the run resumes with the copy 000000.256 keeps" in capsys.readouterr().err
    # Found from outside: a checkpoint folder as --run-dir trained a new run from scratch inside it.
    ckpt = run / "checkpoints" / "000000.256"
    for args in (["--resume"], ["--resume=auto"], []):
        assert main(["train", "--run-dir", str(ckpt), *args, "train.kimg=0.512", "--quiet"]) == 2
        assert f"is a checkpoint of run {run}, not a run directory: give --run-dir {run}" in capsys.readouterr().err
    kept = sorted(p.name for p in ckpt.iterdir() if not p.name.endswith(".safetensors"))
    assert kept == ["config.toml", "meta.json", "state.pt"]
    assert main(["train", "--run-dir", str(run), "--resume", "train.kimg=0.512", "--quiet"]) == 0
    assert weights(run) == uninterrupted
    assert main(["eval", str(run), "--checkpoint", "nosuch"]) == 2  # offers what it has: no best without eval
    assert "has no complete checkpoint 'nosuch'; it has: latest, 000000.256, 000000.512" in capsys.readouterr().err
    # Found from outside: a damaged checkpoint asked for by name was called missing.
    biggest = max((run / "checkpoints" / "000000.256").glob("*.safetensors"), key=lambda f: f.stat().st_size)
    os.truncate(biggest, 100)
    assert main(["eval", str(run), "--checkpoint", "000000.256"]) == 2
    err = capsys.readouterr().err
    assert f"{biggest.name} is 100 bytes" in err and "complete checkpoints of the run: 000000.512" in err


def test_sigterm_saves_a_checkpoint_and_resume_is_bit_identical(tiny, tmp_path, uninterrupted, monkeypatch):
    run = tmp_path / "signalled"
    g_step = GANTask.g_step

    def g_step_then_signal(self, step, *real):
        if step == 3:  # mid-way between the periodic checkpoints
            os.kill(os.getpid(), signal.SIGTERM)
        return g_step(self, step, *real)

    monkeypatch.setattr(GANTask, "g_step", g_step_then_signal)
    with pytest.raises(bigbatch.Stopped) as stopped:  # (found from outside: it returned as a finished run does)
        bigbatch.train(tiny, run_dir=run, quiet=True)
    assert stopped.value.run == run and "resume=True" in str(stopped.value)
    assert find_checkpoint(run).name == "000000.128"  # 4 iterations of 32 images
    monkeypatch.setattr(GANTask, "g_step", g_step)
    bigbatch.train(tiny, run_dir=run, resume=True, quiet=True)
    assert weights(run) == uninterrupted


def test_checkpoints_by_the_clock_change_nothing_trained(tiny, tmp_path, uninterrupted, capsys):
    # checkpoint.every_minutes (DeepFaceLab's autosave): a checkpoint once that long has passed since the last,
    # wherever it falls; here due at every step, as a run whose steps take longer than that.
    run = tmp_path / "clocked"
    clocked = {"checkpoint.every_kimg": 100, "checkpoint.every_minutes": 1e-9, "checkpoint.keep": 100}
    bigbatch.train(tiny.override(clocked), run_dir=run, quiet=True)
    names = sorted(p.name for p in (run / "checkpoints").iterdir() if p.name[0].isdigit())
    assert names == [f"000000.{n:03d}" for n in range(32, 513, 32)]  # after each step of 32 images
    assert weights(run) == uninterrupted
    # A resume whose command leaves them out says so (found from outside: a job's --preset took its cadence, unsaid).
    capsys.readouterr()
    bigbatch.train(tiny.override({"train.kimg": 0.576}), run_dir=run, resume=True, quiet=True)
    said = "every_minutes 1e-09 -> 0.0, checkpoint.keep 100 -> 3: the run saves and keeps its checkpoints so from here"
    assert f"{said} (give checkpoint.every_kimg=100.0 checkpoint.every_minutes=1e-09" in capsys.readouterr().err
    assert main(["train", "--dry-run", "checkpoint.every_minutes=-1"]) == 2
    said = "'checkpoint.every_minutes' must be a finite number of minutes >= 0 (0 = off), got -1.0"
    assert said in capsys.readouterr().err


def test_sigterm_to_the_whole_process_group_with_loader_workers_saves(tmp_path):
    # Found from outside: a job scheduler signals every process of the job; the DataLoader's workers died of the
    # SIGTERM, and the run of a traceback, with no checkpoint saved.
    run = tmp_path / "group"
    cmd = [sys.executable, "-m", "bigbatch.cli", "train", "--run-dir", str(run), "data.resolution=16", "model.ch=8"]
    cmd += ["train.kimg=1000", "train.log_every_kimg=0.064", "checkpoint.every_kimg=1000", "data.workers=2"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 120
    while not (run / "metrics.jsonl").exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGTERM)  # (the training process and its workers)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert "Stopped by signal" in out and find_checkpoint(run).parent.name == "checkpoints"


def test_train_deterministic_holds_torch_to_deterministic_kernels_while_it_trains(tiny, tmp_path, monkeypatch):
    # On a GPU some backward kernels add with atomics in a changing order: a resume is bit-identical there
    # only with deterministic kernels, which train.deterministic asks for, for the run's length alone.
    seen = []
    g_step = GANTask.g_step

    def g_step_and_look(self, step, *real):
        cudnn = torch.backends.cudnn
        state = torch.are_deterministic_algorithms_enabled(), cudnn.benchmark, cudnn.deterministic
        seen.append((*state, os.environ.get("CUBLAS_WORKSPACE_CONFIG")))
        return g_step(self, step, *real)

    monkeypatch.setattr(GANTask, "g_step", g_step_and_look)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)  # the caller's own choice, kept around the run
    short = tiny.override({"train.kimg": 0.064})
    bigbatch.train(short.override({"train.deterministic": True}), run_dir=tmp_path / "on", quiet=True)
    assert len(seen) == 2 and set(seen) == {(True, False, True, ":4096:8")}
    assert not torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.benchmark
    assert not torch.backends.cudnn.deterministic and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    seen.clear()
    bigbatch.train(short, run_dir=tmp_path / "off", quiet=True)  # off by default: nothing asked of torch
    assert set(seen) == {(False, True, False, None)}
    # Off, cuDNN autotunes the run's convolutions (the caller's setting back after it); not under a memory budget.
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    seen.clear()
    bigbatch.train(short, run_dir=tmp_path / "tuned", quiet=True)
    assert set(seen) == {(False, True, False, None)} and not torch.backends.cudnn.benchmark
    seen.clear()
    budget = {"train.memory_budget": "4GiB", "train.micro_batch": "auto"}
    bigbatch.train(short.override(budget), run_dir=tmp_path / "budget", quiet=True)
    assert set(seen) == {(False, False, False, None)}
    # How a run runs, not what it trains: a resume may turn it on.
    seen.clear()
    more = tiny.override({"train.kimg": 0.128, "train.deterministic": True})
    bigbatch.train(more, run_dir=tmp_path / "off", resume=True, quiet=True)
    assert set(seen) == {(True, False, True, ":4096:8")}
    with pytest.raises(bigbatch.BigbatchError, match="train.deterministic"):
        tiny.override({"train.deterministic": "yes"})


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])  # (SIGHUP: found from outside, a closed ssh
def test_sigint_to_the_cli_exits_0_with_a_checkpoint(tmp_path, signum):  # session's run ended, nothing saved)
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
    hangup = lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL)  # noqa: E731 (under nohup too, as a terminal's)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=hangup)
    deadline = time.time() + 120
    while not (run / "metrics.jsonl").exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.2)
    p.send_signal(signum)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    # (a hang-up's terminal is gone, and nothing more is printed there, lest it fail; output to a pipe or a file, as
    # here, still says how the run goes on: found from outside, `train > log &` then a closed ssh session said nothing)
    assert "Stopped by signal" in out and "--resume" in out, out[-300:]
    assert find_checkpoint(run).parent.name == "checkpoints"


def test_a_run_whose_output_reader_went_away_saves_and_stops(tmp_path):
    # `bigbatch train | head -3`, a closed tee (found from outside: killed by the broken pipe, nothing saved).
    run = tmp_path / "piped"
    cmd = [sys.executable, "-m", "bigbatch.cli", "train", "--run-dir", str(run), "data.resolution=16", "model.ch=8"]
    cmd += ["train.kimg=1000", "train.log_every_kimg=0.064", "checkpoint.every_kimg=1000"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().startswith("Training digits in ")
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=120) == 0, err
    assert find_checkpoint(run).parent.name == "checkpoints" and "Traceback" not in err


def test_a_second_sigterm_while_a_stopped_run_exits_keeps_its_status_0(tmp_path):
    # Found from outside: a scheduler's second SIGTERM in the half second a saved run took to exit made its status
    # 143 (the defaults were back), which a requeue reads as killed.
    run = tmp_path / "twice"
    cmd = [sys.executable, "-m", "bigbatch.cli", "train", "--run-dir", str(run), "data.resolution=16", "model.ch=8"]
    cmd += ["train.kimg=1000", "train.log_every_kimg=0.064", "checkpoint.every_kimg=1000"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (run / "metrics.jsonl").exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    said = ""
    while "Stopped by signal" not in said and p.poll() is None:
        said += p.stdout.readline()
    sent = 0
    for _ in range(5):  # (through the exit's half second)
        time.sleep(0.05)
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            sent += 1
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0 and sent, err
    assert find_checkpoint(run).parent.name == "checkpoints"


def test_sigterm_while_the_cli_starts_saves_at_step_0_and_exits_0(tmp_path):
    # Found from outside: a SIGTERM in a run's first seconds (imports, data, models) ended it with status 143
    # and nothing saved, where the README promises a checkpoint even at step 0 and exit status 0.
    run = tmp_path / "early"
    cmd = [sys.executable, "-m", "bigbatch.cli", "train", "--run-dir", str(run), "data.resolution=16", "model.ch=8"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline:  # until bigbatch handles SIGTERM (before that, Python's default ends it)
        caught = next(line for line in Path(f"/proc/{p.pid}/status").read_text().splitlines() if "SigCgt" in line)
        if int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1:
            break
        time.sleep(0.01)
    time.sleep(0.3)  # (starting: importing torch, reading data, building models)
    assert not (run / "metrics.jsonl").exists()  # still starting
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert "Stopped by signal" in out and find_checkpoint(run).name == "000000.000"


def test_a_run_stopped_mid_log_row_logs_the_rows_of_the_run_left_alone(tiny, tmp_path, uninterrupted, monkeypatch):
    # Found from outside: the row under way when a run stopped began again on resume, so the resumed run's
    # next row averaged fewer steps than the uninterrupted run's (other losses, other skipped counts).
    run = tmp_path / "mid"
    g_step = GANTask.g_step

    def g_step_then_signal(self, step, *real):
        if step == 5:  # 6 iterations of 32 images: half-way through the second row of 4
            os.kill(os.getpid(), signal.SIGTERM)
        return g_step(self, step, *real)

    monkeypatch.setattr(GANTask, "g_step", g_step_then_signal)
    with pytest.raises(bigbatch.Stopped):
        bigbatch.train(tiny, run_dir=run, quiet=True)
    assert find_checkpoint(run).name == "000000.192"
    monkeypatch.setattr(GANTask, "g_step", g_step)
    bigbatch.train(tiny, run_dir=run, resume=True, quiet=True)
    assert weights(run) == uninterrupted

    def logged(r):  # all but the clock
        rows = [json.loads(line) for line in (r / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in row.items() if k not in ("seconds", "img_per_s")} for row in rows]

    assert logged(run) == logged(tmp_path / "whole") and len(logged(run)) == 4


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
    assert capsys.readouterr().err.count("names no complete checkpoint") == 1  # info read it, then us: said once
    bigbatch.train(tiny.override({"train.kimg": 0.64}), run_dir=run, resume=True, quiet=True)
    assert find_checkpoint(run).name == "000000.640"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["kimg"] for r in rows] == [0.128, 0.256, 0.384, 0.512, 0.64]
    (run / "checkpoints" / "latest").write_text("")  # (an empty file is not "missing": found from outside)
    assert find_checkpoint(run).name == "000000.640" and "no complete checkpoint (empty)" in capsys.readouterr().err


def flip_byte(path, offset_from_end=100):
    """Damage one byte of a file without changing its size (what a bad disk or a stray write does)."""
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["flipped", "cut short"])
def test_a_damaged_checkpoint_is_refused_by_readers_and_passed_over_by_resume(
    tiny, tmp_path, capsys, uninterrupted, damage
):
    run = bigbatch.train(tiny.override({"checkpoint.keep": 2}), run_dir=tmp_path / "run", quiet=True)
    newest = run / "checkpoints" / "000000.512"
    if damage == "flipped":
        flip_byte(newest / "G_ema.safetensors")  # the tensor bytes: safetensors itself would load it
        said = "000000.512 is corrupt: G_ema.safetensors does not match"
    else:  # (readers used to pass over it to the checkpoint before, as over a half-written one)
        os.truncate(newest / "G_ema.safetensors", 1000)
        said = "000000.512 is corrupt: G_ema.safetensors is 1000 bytes"
    capsys.readouterr()
    intact = f"the run's newest intact checkpoint is {run / 'checkpoints' / '000000.256'}: give it instead"
    for argv in (["sample", str(newest)], ["sample", str(run)], ["eval", str(run), "--metrics", "is", "--n", "2"]):
        assert main(argv) == 2
        err = capsys.readouterr().err  # (found from outside: a run's damaged latest named no checkpoint to read)
        assert err.count("\n") == 1 and said in err and (argv[1] == str(newest)) != (intact in err), argv
    if damage == "cut short":  # info: the run, by its newest intact checkpoint, the damage named
        assert main(["info", str(run)]) == 0
        out = capsys.readouterr().out
        assert "(latest 000000.256)" in out and f"damaged     checkpoint {run}/checkpoints/{said}" in out
    with pytest.raises(bigbatch.BigbatchError, match="is corrupt: G_ema.safetensors"):
        bigbatch.train(tiny.override({"train.init_from": str(run)}), run_dir=tmp_path / "tuned", quiet=True)

    # Training goes back to the checkpoint before, with a warning, and trains the same weights again.
    assert main(["train", "--run-dir", str(run), "--resume"]) == 0
    out = capsys.readouterr()
    assert "000000.512 is corrupt" in out.err and "passing over it" in out.err
    assert "from 000000.256" in out.out
    assert weights(run) == uninterrupted
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["kimg"] for r in rows] == [0.128, 0.256, 0.384, 0.512]
    # TensorBoard too: found from outside, a resume purged the row logged at its checkpoint's step.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    assert sorted(e.step for e in events.Scalars("kimg")) == [128, 256, 384, 512]

    # A state.pt zeroed out, in every checkpoint: nothing left to resume from, said in one line.
    for ckpt in (run / "checkpoints").iterdir():
        if (ckpt / "state.pt").exists():
            (ckpt / "state.pt").write_bytes(b"\0" * (ckpt / "state.pt").stat().st_size)
    assert main(["train", "--run-dir", str(run), "--resume", "train.kimg=1"]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith("bigbatch: error: no checkpoint of")


def test_resume_refuses_a_changed_recipe_but_takes_what_rescues_a_diverged_run(tiny, tmp_path, capsys):
    run = bigbatch.train(tiny, run_dir=tmp_path / "run", quiet=True)
    with pytest.raises(bigbatch.BigbatchError, match="was trained with in train.g_lr"):
        bigbatch.train(tiny.override({"train.g_lr": 1e-3}), run_dir=run, resume=True, quiet=True)
    # Found from outside: a run stopped for non-finite steps was told to try bf16 or clipping, which a resume
    # refused. They are taken, and said.
    capsys.readouterr()
    rescue = {"train.kimg": 0.64, "train.precision": "bf16", "train.grad_clip": 1.0}
    bigbatch.train(tiny.override(rescue), run_dir=run, resume=True, quiet=True)
    assert "resuming with train.grad_clip 0.0 -> 1.0, train.precision 'fp32' -> 'bf16'" in capsys.readouterr().err
    assert json.loads((run / "plan.json").read_text())["precision"] == "bf16"
    # A dry run of a resume checks what the resume checks (found from outside: it passed a changed batch).
    from bigbatch.cli import main

    assert main(["train", "--run-dir", str(run), "--resume", "--dry-run", "train.batch=64"]) == 2
    err = capsys.readouterr().err  # (the fix first, then what may change: found from outside, after 1,500 chars)
    assert "was trained with in train.batch (32 -> 64): drop the override (or the --preset" in err
    assert err.index("train.init_from=RUN") < err.index("A resumed run may change only")
    assert main(["train", "--run-dir", str(run), "--resume", "--dry-run", "train.kimg=1"]) == 0  # (found from
    assert "; resumes 000000.640, train.kimg 0.64 -> 1\n" in capsys.readouterr().out  # outside: a longer run unsaid)
    assert main(["train", "--run-dir", str(run), "--resume", "--dry-run", "train.kimg=0.256"]) == 2  # (review)
    assert "train.kimg=0.256 is not beyond the 0.64 kimg" in capsys.readouterr().err


def test_a_run_whose_checkpoints_are_all_damaged_is_refused_not_restarted(tiny, tmp_path, capsys):
    # Found from outside: with every checkpoint cut short (or its meta.json gone), resume said the run "has no
    # checkpoint yet", trained from kimg 0 and wrote over them. Each is now warned about and moved aside, and
    # the resume refused; a metrics.jsonl line that is not a row is warned about, the file kept beside.
    run = bigbatch.train(tiny, run_dir=tmp_path / "run", quiet=True)
    newest, older = run / "checkpoints" / "000000.512", run / "checkpoints" / "000000.256"
    shutil.copytree(newest, best := run / "checkpoints" / "best")  # (intact: as an evaluation would have kept it)
    os.truncate(newest / "G.safetensors", 1000)
    (older / "meta.json").unlink()
    (run / ".plan.json.tmp-999999999").write_text("left by a killed process")
    capsys.readouterr()
    with pytest.raises(bigbatch.BigbatchError, match=r"no checkpoint of .* is intact \(see the warnings\)"):
        bigbatch.train(tiny.override({"train.kimg": 0.64}), run_dir=run, resume=True, quiet=True)
    err = capsys.readouterr().err
    assert "000000.512 is corrupt: G.safetensors is 1000 bytes" in err and "000000.256 is damaged: its meta.json" in err
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".corrupt")) == [
        ".corrupt-000000.256",
        ".corrupt-000000.512",
    ]
    assert not (run / ".plan.json.tmp-999999999").exists()  # (no such process: removed under the run's lock)
    # Again, still; the way on is named, and readers say what happened (found from outside: no way was named, though
    # best/ was intact, and `info` and `sample` then said the run had saved nothing yet).
    said = rf"moved aside \(.corrupt-000000.512, ...\): start a new run from its best \(train.init_from={best}\)"
    with pytest.raises(bigbatch.BigbatchError, match=said):
        bigbatch.train(tiny.override({"train.kimg": 0.64}), run_dir=run, resume=True, quiet=True)
    assert main(["info", str(run)]) == 0 and "checkpoints none intact, each damaged checkpoint moved aside (" in (
        capsys.readouterr().out
    )
    assert main(["sample", str(run)]) == 2 and "has no complete checkpoint, each damaged checkpoint" in (
        capsys.readouterr().err
    )
    assert main(["info", str(run), "--verify"]) == 2 and "to resume from is intact" in capsys.readouterr().err  # (0)
    bigbatch.train(tiny.override({"train.init_from": str(best)}), run_dir=tmp_path / "again", quiet=True)
    short = bigbatch.train(tiny.override({"train.kimg": 0.256}), run_dir=tmp_path / "short", quiet=True)
    lines = (short / "metrics.jsonl").read_text().splitlines()
    (short / "metrics.jsonl").write_text("\n".join([lines[0], "not a row", *lines[1:]]) + "\n")
    bigbatch.train(tiny, run_dir=short, resume=True, quiet=True)
    assert "1 line (the first: line 2) not a log row, left out of it; the file as it was is kept as " in (
        capsys.readouterr().err
    )
    assert (short / "metrics.jsonl.damaged").read_text().count("not a row") == 1
    assert len((short / "metrics.jsonl").read_text().splitlines()) == 4


def test_a_run_rolled_back_to_an_older_checkpoint_keeps_what_it_trains_from_there(tiny, tmp_path, capsys):
    # Found from outside: with `latest` naming an older checkpoint (rolling back a run that diverged, to resume
    # with grad_clip), the newer folders of the old history were kept over the new one's checkpoints (intact, of
    # the same names) and outnumbered them in the prune: the weights left did not match the logs.
    every = tiny.override({"checkpoint.every_kimg": 0.128})
    run = bigbatch.train(every, run_dir=tmp_path / "run", quiet=True)
    old = weights(run)
    (run / "checkpoints" / "latest").write_text("000000.256\n")
    # A resume refused (found by review: the newer ones were moved aside before its checks) moves nothing.
    with pytest.raises(bigbatch.BigbatchError, match="train.g_lr"):
        bigbatch.train(every.override({"train.g_lr": 1e-3}), run_dir=run, resume=True, quiet=True)
    assert not list((run / "checkpoints").glob(".superseded-*"))
    capsys.readouterr()
    bigbatch.train(every.override({"train.grad_clip": 1.0}), run_dir=run, resume=True, quiet=True)
    err = capsys.readouterr().err
    assert "2 checkpoint(s) after 000000.256, where this run went on from, moved aside to checkpoints/" in err
    assert "(000000.384, 000000.512): another history" in err
    # As trained to 0.256 and resumed from there with the rescue: the run's own newest, and nothing lost.
    parts = tmp_path / "parts"
    bigbatch.train(every.override({"train.kimg": 0.256}), run_dir=parts, quiet=True)
    bigbatch.train(every.override({"train.grad_clip": 1.0}), run_dir=parts, resume=True, quiet=True)
    assert weights(run) == weights(parts) != old
    assert find_checkpoint(run).name == "000000.512"
    aside = sorted(p.name.rsplit("-", 3)[0] for p in (run / "checkpoints").glob(".superseded-*"))
    assert aside == [".superseded-000000.384", ".superseded-000000.512"]
    assert weights(run, next((run / "checkpoints").glob(".superseded-000000.512-*")).name) == old
    # Rolled back one checkpoint: the run trains it again, the same bits, the first kept aside.
    cut = bigbatch.train(every, run_dir=tmp_path / "cut", quiet=True)
    (cut / "checkpoints" / "latest").write_text("000000.384\n")
    bigbatch.train(every, run_dir=cut, resume=True, quiet=True)
    assert weights(cut) == old and find_checkpoint(cut).name == "000000.512"


class Killed(BaseException):
    pass


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_run_killed_as_a_checkpoint_goes_into_place_resumes_from_the_newest_there(
    tiny, tmp_path, uninterrupted, monkeypatch, capsys, when
):
    # Found from outside: killed between the checkpoint's rename and `latest`'s rewrite, a run resumed from the
    # checkpoint before and set the newer one aside as another history.
    replace = os.replace

    def killed(src, dst):
        if Path(src).name.startswith(".tmp-000000.512"):
            if when == "after":
                replace(src, dst)
            raise Killed
        replace(src, dst)

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(Killed):
        bigbatch.train(tiny, run_dir=tmp_path / "run", quiet=True)
    monkeypatch.setattr(os, "replace", replace)
    run = tmp_path / "run"
    assert find_checkpoint(run).name == ("000000.512" if when == "after" else "000000.256")
    capsys.readouterr()
    bigbatch.train(tiny, run_dir=run, resume=True, quiet=True)
    assert "another history" not in capsys.readouterr().err
    assert weights(run) == uninterrupted
    assert not list((run / "checkpoints").glob(".superseded-*"))


def test_an_evaluation_made_again_on_resume_is_logged_once(tmp_path):
    # Found from outside: stopped in an evaluation, a run resumed, made it and logged it, and was stopped again before
    # its checkpoint said so: the next resume made it again, and metrics.jsonl held its row twice.
    from bigbatch.metrics_file import truncate_metrics

    rows = [{"kimg": 0.224, "loss": 1.0}, {"kimg": 0.256, "loss": 0.9}, {"kimg": 0.256, "fid": 9.0, "eval_seconds": 1}]
    rows += [{"kimg": 0.288, "loss": 0.8}]
    path = tmp_path / "metrics.jsonl"
    for scores_too, kept in ((False, rows[:3]), (True, rows[:2])):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        truncate_metrics(path, 256, scores_too=scores_too)
        assert [json.loads(line) for line in path.read_text().splitlines()] == kept


@pytest.mark.parametrize("name", ["biggan_cifar", "biggan_deep128", "sagan128"])
def test_a_preset_run_of_before_its_ema_and_init_keys_resumes_with_its_preset(tmp_path, name, capsys, monkeypatch):
    monkeypatch.setattr("bigbatch.errors._WARNED", set())
    # Found by review: the BigGAN presets' train.ema_buffers = "average" and biggan_deep128's init "none" made their
    # runs of before refused by --preset NAME --resume (a job script's --resume=auto, a sweep).
    from bigbatch.presets import base_config
    from bigbatch.rundir import resume_config

    old = base_config(name, None).to_dict()
    del old["train"]["ema_buffers"]
    old["model"]["options"].pop("init", None)
    if name == "sagan128":  # (its runs of before the key shared one embedding; the preset now sets false)
        del old["model"]["options"]["shared"]
    path = tmp_path / "config.toml"
    path.write_text(tomli_w.dumps(old))
    cfg = resume_config(path, base_config(name, None), "the checkpoint")
    assert cfg.train.ema_buffers == "average" and "init" not in cfg.model.options  # (init: as the run began)
    assert name != "sagan128" or "shared" not in cfg.model.options  # (and SA-GAN's embeddings)
    assert "resuming with train.ema_buffers 'copy' -> 'average'" in capsys.readouterr().err  # (G_ema's statistics)
    path.write_text(cfg.dumps())  # as its checkpoint after that resume holds it: the next one goes on (review)
    assert resume_config(path, base_config(name, None), "the checkpoint").to_dict() == cfg.to_dict()
    other = {**old["model"]["options"], "init": "none", "d_attn": 32}  # (another option too: refused, as ever)
    with pytest.raises(bigbatch.BigbatchError, match=r"trained with in model.options \("):
        resume_config(path, base_config(name, None).override({"model.options": other}), "the checkpoint")


def test_a_run_frozen_before_train_bn_resumes_as_it_began_at_every_resume(tmp_path):
    # Found by review: resumed once with train_bn false (as begun), its checkpoints then held false, and the next
    # resume with the default (True) was refused.
    from bigbatch.presets import base_config
    from bigbatch.rundir import resume_config

    old = base_config("finetune_resnet50", None).override({"train.freeze_kimg": 10}).to_dict()
    del old["train"]["train_bn"]
    path = tmp_path / "config.toml"
    path.write_text(tomli_w.dumps(old))
    given = base_config("finetune_resnet50", None).override({"train.freeze_kimg": 10})
    for _ in range(2):
        cfg = resume_config(path, given, "the checkpoint")
        assert cfg.train.train_bn is False
        path.write_text(cfg.dumps())
    # A run of before model.options.input_stats (fed [-1, 1]) resumes so, its preset's --resume not refused.
    del old["model"]["options"]["input_stats"]
    path.write_text(tomli_w.dumps(old))
    assert resume_config(path, given, "the checkpoint").model.options == {"zero_init_residual": False}


def test_a_reader_while_a_checkpoint_goes_into_place_is_not_warned_and_a_failed_rename_puts_latest_back(
    tiny, tmp_path, monkeypatch, capsys
):
    # Found by review of latest-first: a reader in the window between the two was warned that latest named no
    # complete checkpoint; a rename that failed left latest naming a folder not there.
    monkeypatch.setattr("bigbatch.errors._WARNED", set())
    run = bigbatch.train(tiny, run_dir=tmp_path / "run", quiet=True)
    saving = run / "checkpoints" / f".tmp-000000.768-{os.getpid()}"  # (a process alive writes it)
    saving.mkdir()
    (run / "checkpoints" / "latest").write_text("000000.768\n")
    capsys.readouterr()
    assert find_checkpoint(run).name == "000000.512" and "names no complete" not in capsys.readouterr().err
    saving.rename(run / "checkpoints" / ".tmp-000000.768-4194999")  # a dead one's (killed between the two): said
    assert find_checkpoint(run).name == "000000.512" and "names no complete" in capsys.readouterr().err
    (run / "checkpoints" / ".tmp-000000.768-4194999").rmdir()
    (run / "checkpoints" / "latest").write_text("000000.512\n")
    replace = os.replace

    def failing(src, dst):
        if Path(src).name.startswith(".tmp-000000.768"):
            raise OSError(5, "Input/output error")
        replace(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError, match="Input/output error"):
        bigbatch.train(tiny.override({"train.kimg": 0.768}), run_dir=run, resume=True, quiet=True)
    monkeypatch.setattr(os, "replace", replace)
    assert (run / "checkpoints" / "latest").read_text() == "000000.512\n"
