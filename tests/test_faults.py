"""The run directory under faults: credentials refused before anything is written, one writer per run,
resume checks what it resumes, signals at any moment of start-up, checkpoints pruned under a reader."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings

import pytest
from conftest import bigbatch_limited
from PIL import Image
from test_resume import flip_byte

import bigbatch
from bigbatch import checkpoint_find, checkpoints
from bigbatch.cli import main
from bigbatch.data.prepare import prepare
from bigbatch.errors import STOPPED
from bigbatch.rundir import open_run, trainer


def weights(run, name="000000.512"):
    return {net: (run / "checkpoints" / name / f"{net}.safetensors").read_bytes() for net in ("G", "D", "G_ema")}


def one_error_line(capsys):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bigbatch: error: "), err
    return err


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "data.path=ftp://user:PASS@host/d.h5"],
        ["train", "data.path=s3://bucket/d.h5?X-Amz-Signature=PASS"],
        ["train", "data.val_path=https://user:PASS@host/v.h5", "task=classify"],
        ["train", "train.init_from=s3://user:PASS@bucket/run"],
        ["train", "data.storage_options={client_kwargs={endpoint_url='http://user:PASS@127.0.0.1:9000'}}"],
        ["train", "data.storage_options={secret='PASS'}"],
        ["prepare", "s3://user:PASS@bucket/images", "out.h5"],
        ["prepare", "builtin:digits", "s3://user:PASS@bucket/out.h5"],
        ["prepare", "builtin:digits", "s3://bucket/out.h5", "--endpoint-url", "http://user:PASS@127.0.0.1:9000"],
        ["eval", "https://user:PASS@host/images.zip", "builtin:digits", "--metrics", "is"],
        ["stats", "s3://user:PASS@bucket/d.h5"],
        ["train", "data.path=s3://AKIAEXAMPLE:wJalr/XUtnF/PASS@bucket/key.h5"],  # a '/' in the secret
        ["train", "data.path=https://user:ab[PASS@host/x.h5"],  # a character urllib rejects
        ["train", "data.path=s3://bucket/x.h5#token=PASS"],
        ["train", "data.storage_options={sas_token='PASS'}"],
        ["train", "data.storage_options={client_kwargs={aws_session_token='PASS'}}"],
        ["sample", "s3://user:PASS@bucket/run"],
    ],
)
def test_credentials_in_urls_are_refused_before_anything_is_written(argv, tmp_path, capsys):
    assert main(argv) == 2
    err = one_error_line(capsys)
    assert "PASS" not in err and "credentials" in err and "environment" in err
    assert list(tmp_path.iterdir()) == []  # no run directory, no data file


def test_a_run_has_one_writer_and_the_lock_goes_with_its_process(tiny, tmp_path, capsys):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "bigbatch.cli", "train", "--run-dir", str(run), "data.resolution=16", "model.ch=8"]
    cmd += ["model.dim_z=16", "train.kimg=1000", "train.log_every_kimg=0.032", "checkpoint.every_kimg=0.064"]
    cmd += ["data.workers=2"]  # forked workers outlive a SIGKILLed trainer for seconds: they must not hold its lock

    def start_and_wait_for_a_checkpoint():
        old = checkpoint_find.find_checkpoint(run) if checkpoints.complete_checkpoints(run) else None
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        while time.time() < deadline and p.poll() is None:
            if checkpoints.complete_checkpoints(run) and checkpoint_find.find_checkpoint(run) != old:
                break
            time.sleep(0.2)
        assert p.poll() is None, p.stderr.read()
        return p

    p = start_and_wait_for_a_checkpoint()
    try:
        # A second writer is refused, naming the holder; readers go on.
        for argv in (["train", "--run-dir", str(run), "--resume"], ["train", "--run-dir", str(run)]):
            assert main(argv) == 2
            assert f"is in use by process {p.pid}" in one_error_line(capsys)
        assert main(["info", str(run)]) == 0
        assert main(["sample", str(run), "--n", "4"]) == 0
    finally:
        p.kill()  # SIGKILL: no clean-up of any kind, the kernel releases the lock
        p.wait()
        assert trainer(run) is None  # at once: its data workers, still alive, do not hold it
        cmd[cmd.index(str(run)) + 1 : cmd.index(str(run)) + 1] = ["--resume"]  # the same command, resuming
    p = start_and_wait_for_a_checkpoint()
    assert main(["stop", str(run)]) == 0  # SIGTERM to the holder of the lock; waits until it has saved
    assert f"Stopped process {p.pid}" in capsys.readouterr().out
    assert p.wait(timeout=120) == 0
    assert main(["stop", str(run)]) == 2
    assert "is not being trained" in one_error_line(capsys)
    assert main(["stop", str(run / "checkpoints")]) == 2  # a folder that is not a run: said so
    assert "is not a run directory (no config.toml)" in one_error_line(capsys)


def test_runs_started_together_never_share_an_auto_numbered_directory(tiny):
    runs, barrier = [], threading.Barrier(6)

    def claim():
        barrier.wait()
        runs.append(open_run(tiny, None, resume=False))

    threads = [threading.Thread(target=claim) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r.path for r in runs}) == 6
    for r in runs:
        r.close()  # nothing written: the directories go again
    assert not any(r.path.exists() for r in runs)


def test_resume_refuses_other_images_at_the_data_path_but_follows_the_same_images_moved(tiny, tmp_path, capsys):
    data, other = tmp_path / "data.h5", tmp_path / "other.h5"
    prepare("builtin:digits", str(data), resolution=16, workers=0)
    prepare("builtin:digits", str(other), resolution=16, workers=0, limit=1000)
    cfg = tiny.override({"data.path": str(data), "train.kimg": 0.256})
    run = bigbatch.train(cfg, run_dir=tmp_path / "run", quiet=True)
    meta = checkpoints.read_meta(checkpoint_find.find_checkpoint(run))
    assert meta["data"]["path"] == str(data) and meta["data"]["content_hash"].startswith("sha256:")

    shutil.move(data, tmp_path / "moved.h5")
    shutil.copy(other, data)  # the same name, other images
    capsys.readouterr()
    assert main(["train", "--run-dir", str(run), "--resume", "train.kimg=0.384"]) == 2
    assert "holds other images than the run was trained on" in one_error_line(capsys)
    moved = f"data.path={tmp_path / 'moved.h5'}"
    assert main(["train", "--run-dir", str(run), "--resume", "train.kimg=0.384", moved]) == 0


def test_resume_checks_the_config_against_the_checkpoints_own(tiny, tmp_path, capsys):
    run = bigbatch.train(tiny.override({"train.kimg": 0.256}), run_dir=tmp_path / "run", quiet=True)
    saved = run / "config.toml"
    saved.write_text(saved.read_text().replace("seed = 0", "seed = 5"))  # edited by hand
    capsys.readouterr()
    assert main(["train", "--run-dir", str(run), "--resume"]) == 2
    err = one_error_line(capsys)
    assert "train.seed (0 -> 5)" in err and "undo the edit of the run's config.toml" in err
    # The checkpoint's own copy is checksummed: editing it makes the checkpoint corrupt, not a new recipe.
    ckpt_config = checkpoint_find.find_checkpoint(run) / "config.toml"
    ckpt_config.write_text(ckpt_config.read_text().replace("seed = 0", "seed = 5"))
    with pytest.raises(bigbatch.BigbatchError, match="is corrupt: config.toml does not match"):
        checkpoints.verify(ckpt_config.parent)


def snapshot(run):
    """Every file under `run`: its bytes and modification time."""
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(run.rglob("*")) if p.is_file()}


def test_a_run_stopped_before_its_first_checkpoint_resumes_from_the_start(tiny, tmp_path, capsys):
    whole = weights(bigbatch.train(tiny, run_dir=tmp_path / "whole", quiet=True))
    run = bigbatch.train(tiny, run_dir=tmp_path / "run", quiet=True)
    shutil.rmtree(run / "checkpoints")  # as if killed after start-up, before the first save
    before = snapshot(run)
    assert main(["train", "--run-dir", str(run)]) == 2
    assert "already holds a run; add --resume" in one_error_line(capsys)
    assert snapshot(run) == before  # a refused command leaves the run as it was, .lock included
    assert main(["train", "--run-dir", str(run), "--resume"]) == 0
    assert "no checkpoint yet" in capsys.readouterr().err
    assert weights(run) == whole
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["kimg"] for r in rows] == [0.128, 0.256, 0.384, 0.512]


def test_signals_during_start_up(tiny, tmp_path, capsys, monkeypatch):
    import bigbatch.loop as training

    build = training.build_task
    signals = []

    def build_then_signal(*args, **kwargs):
        task = build(*args, **kwargs)
        if signals:
            os.kill(os.getpid(), signals.pop())
        return task

    monkeypatch.setattr(training, "build_task", build_then_signal)
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(tiny.dumps())
    run = tmp_path / "run"

    # Ctrl-C while the run starts: stop at once, one line, exit 130, nothing left that blocks a restart.
    signals.append(signal.SIGINT)
    assert main(["train", "--config", str(cfg), "--run-dir", str(run)]) == 130
    assert capsys.readouterr().err == "bigbatch: interrupted\n"
    assert not run.exists()

    # SIGTERM while the run starts: save where it is (step 0) and exit 0; resuming trains the same weights.
    signals.append(signal.SIGTERM)
    assert main(["train", "--config", str(cfg), "--run-dir", str(run)]) == 0
    assert "Stopped by signal; saved" in capsys.readouterr().out
    assert checkpoint_find.find_checkpoint(run).name == "000000.000"
    assert main(["train", "--run-dir", str(run), "--resume"]) == 0
    whole = weights(bigbatch.train(tiny, run_dir=tmp_path / "whole", quiet=True))
    assert weights(run) == whole

    # SIGTERM before training is even set up (the command line being read): one line, 143.
    monkeypatch.setattr("bigbatch.cli.parse_args", lambda argv: os.kill(os.getpid(), signal.SIGTERM))
    assert main(["info", str(run)]) == 143
    assert capsys.readouterr().err == "bigbatch: stopped by SIGTERM\n"


def test_ctrl_c_while_train_imports_its_modules_ends_it_at_once(tmp_path):
    # Found from outside: a Ctrl-C in a run's first second raised KeyboardInterrupt inside the imports of
    # scipy and torch, where library code (C++ that called Python, an import that handles errors) caught or
    # mangled it: a RecursionError's traceback, or an abort. Here the import that takes the signal swallows
    # it, as such code does; the run must end anyway, with one line and status 130, having written nothing.
    script = """
import builtins, os, signal, sys, time
real = builtins.__import__
def hook(name, *args, **kwargs):
    if name == "bigbatch.loop" and "bigbatch.loop" not in sys.modules:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(2)
        except BaseException:
            pass  # (library code that swallowed the interrupt)
        print("went on", file=sys.stderr)
    return real(name, *args, **kwargs)
builtins.__import__ = hook
from bigbatch.cli import main
from bigbatch.errors import STOPPED
sys.exit(main(["train", "--run-dir", sys.argv[1], "train.kimg=0.001"]))
"""
    run = tmp_path / "run"
    out = subprocess.run([sys.executable, "-c", script, str(run)], capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stderr) == (130, "bigbatch: interrupted\n") and not run.exists()


def test_a_checkpoint_pruned_under_a_reader(tiny, tmp_path, monkeypatch):
    cfg = tiny.override({"checkpoint.keep": 3, "checkpoint.every_kimg": 0.128})
    run = bigbatch.train(cfg, run_dir=tmp_path / "run", quiet=True)
    newest, before = run / "checkpoints" / "000000.512", run / "checkpoints" / "000000.384"
    load = checkpoints.load_checkpoint
    pruned = []

    def prune_first(ckpt, nets, **options):  # the training run deletes the checkpoint just as the reader opens it
        if not pruned:
            pruned.append(ckpt)
            shutil.rmtree(ckpt)
        return load(ckpt, nets, **options)

    monkeypatch.setattr(checkpoints, "load_checkpoint", prune_first)
    # Named by its run: the reader goes on with the run's newest checkpoint.
    G = bigbatch.load_generator(run)
    assert pruned == [newest] and G.checkpoint == before
    # ... and so does export (found from outside: it failed, naming the pruned checkpoint).
    from bigbatch.export import deployable

    pruned.clear()
    assert deployable(run).meta["checkpoint"] == f"{run.name}/checkpoints/000000.256" and pruned == [before]
    # Named as a folder: said so in one line.
    pruned.clear()
    with pytest.raises(checkpoints.Pruned, match="000000.256 was deleted while being read"):
        bigbatch.load_generator(run / "checkpoints" / "000000.256")


def test_a_reader_that_listed_before_the_newest_checkpoint_went_into_place_looks_again(tiny, tmp_path, monkeypatch):
    # Found from outside: a reader that listed the folder before the run renamed its new checkpoint in, and found the
    # one before pruned, said "no complete checkpoint yet" (exit 2) or warned of damage.
    run = bigbatch.train(tiny, run_dir=tmp_path / "run", quiet=True)
    listed, looks = checkpoints.complete_checkpoints, []
    stale = lambda run: [] if not looks.append(1) and len(looks) == 1 else listed(run)  # noqa: E731 (000000.256 pruned)
    monkeypatch.setattr(checkpoints, "complete_checkpoints", stale)
    monkeypatch.setattr("bigbatch.errors._WARNED", set())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert checkpoint_find.find_checkpoint(run) == run / "checkpoints" / "000000.512" and len(looks) == 1


def test_a_full_disk_is_one_line_and_leaves_nothing_half_written(tmp_path):
    # prepare: no crash of the interpreter (HDF5's own write errors used to end in a segfault).
    stale = tmp_path / ".data.h5.partial-999999999"  # a prepare killed earlier: no such process
    stale.write_bytes(b"\0" * 1000)
    p = bigbatch_limited(500_000, "prepare", "builtin:digits", "data.h5", "--resolution", "32", cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("bigbatch: error: cannot write data.h5: File too large") and p.stderr.count("\n") == 1
    assert sorted(f.name for f in tmp_path.iterdir()) == []  # neither its partial file nor the stale one

    # training: the checkpoint that does not fit is removed, the one before stays, the run resumes.
    run = tmp_path / "run"
    args = ["train", "--run-dir", str(run), "data.resolution=16", "model.ch=8", "model.dim_z=16", "train.kimg=0.512"]
    args += ["checkpoint.every_kimg=0.256"]
    first = bigbatch_limited(10**9, *args, "train.kimg=0.256", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    (run / "checkpoints" / ".tmp-000000.100-999999999").mkdir()  # a save killed earlier
    size = sum(f.stat().st_size for f in (run / "checkpoints" / "000000.256").iterdir())
    p = bigbatch_limited(size // 3, *args[:3], "--resume", "train.kimg=0.512", cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    err = p.stderr.splitlines()[-1]
    assert err.startswith(f"bigbatch: error: cannot write checkpoint {run / 'checkpoints' / '000000.512'}: ")
    assert "File too large" in err and "--resume" in err  # (it named the file as if it were the checkpoint)
    # The file that did not fit, named; "free space" only for a full disk (found from outside: said of any error).
    failed = re.search(r"000000\.512: (\S+): File too large", err)
    assert failed and failed[1] in {"G.safetensors", "D.safetensors", "G_ema.safetensors", "state.pt", "config.toml"}
    assert "free space" not in err and "raise the file size limit (ulimit -f)" in err, err
    assert "the checkpoints before it are intact" in err  # (and where there is none, "it is the first": found outside)
    assert [c.name for c in checkpoints.complete_checkpoints(run)] == ["000000.256"]
    assert [f.name for f in (run / "checkpoints").iterdir() if f.name.startswith(".")] == []
    assert main([*args[:3], "--resume", "train.kimg=0.512"]) == 0  # once there is space
    assert checkpoint_find.find_checkpoint(run).name == "000000.512"

    # sample (as stats and every other file bigbatch writes: through a temporary file and a rename)
    p = bigbatch_limited(2000, "sample", str(run), "--n", "64", "--out", "sheet.png", cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("bigbatch: error: ") and "sheet.png: File too large" in p.stderr
    assert sorted(f.name for f in tmp_path.iterdir()) == ["run"]


def test_an_output_on_a_read_only_file_system_is_named_in_its_one_line(tiny, tmp_path, capsys, monkeypatch):
    # Found from outside (a tmpfs mounted read-only): `sample --out ro/x.png` said ".x.png.tmp-8388: Read-only
    # file system". On such a file system removing the temporary file that was never made fails too (EROFS,
    # not ENOENT), and that error replaced the first. The file system is played here, as Linux answers.
    import errno
    import pathlib

    import bigbatch.files

    run = bigbatch.train(tiny, run_dir=tmp_path / "run", quiet=True)

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(args[0]))

    monkeypatch.setattr(bigbatch.files, "write_file", read_only)
    monkeypatch.setattr(pathlib.Path, "unlink", read_only)
    assert main(["sample", str(run), "--n", "4", "--out", str(tmp_path / "ro" / "x.png")]) == 2
    err = capsys.readouterr().err
    fix = "give a path on storage this user may write to"  # (found from outside: the fix unsaid)
    assert err == f"bigbatch: error: {tmp_path / 'ro' / 'x.png'}: Read-only file system; {fix}\n", err

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(args[0]))

    monkeypatch.setattr(bigbatch.files, "write_file", full)  # (sample resumes nothing: no advice to resume)
    assert main(["sample", str(run), "--n", "4", "--out", str(tmp_path / "x.png")]) == 2
    assert capsys.readouterr().err.endswith("x.png: No space left on device; free space there\n")


def test_damaged_run_records_are_passed_over_or_one_line(tiny, tmp_path, capsys):
    run = bigbatch.train(tiny.override({"checkpoint.keep": 2}), run_dir=tmp_path / "run", quiet=True)
    latest = run / "checkpoints" / "latest"
    for garbage in (b"\x00\xff not a name\n", b"../../etc\n", b""):
        latest.write_bytes(garbage)
        assert checkpoint_find.find_checkpoint(run).name == "000000.512"  # the newest complete one, with a warning
    meta = run / "checkpoints" / "000000.512" / "meta.json"
    meta.write_text(meta.read_text().replace('"nimg": 512', '"nimg": "512"'))
    assert checkpoint_find.find_checkpoint(run).name == "000000.256"  # a meta.json of the wrong shape: not complete
    capsys.readouterr()
    assert main(["sample", str(meta.parent)]) == 2
    assert "incomplete or damaged" in one_error_line(capsys)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"kimg": "x", "loss_D": 1}\n{"kimg": null}\n[1, 2]\n"text"\n')
    assert main(["plot", str(run)]) == 0
    assert main(["train", "--run-dir", str(run), "--resume"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["kimg"] for r in rows] == [0.128, 0.256, 0.384, 0.512]


def test_odd_command_lines_are_one_line(tiny, tmp_path, capsys):
    run = bigbatch.train(tiny.override({"train.kimg": 0.128}), run_dir=tmp_path / "run", quiet=True)
    capsys.readouterr()
    assert main(["sample", str(run), "--n", "10000000000"]) == 2
    assert "more than half of this machine's" in one_error_line(capsys)
    assert main(["sample", str(run), "--npz", "--interp"]) == 2
    assert "give one of them" in one_error_line(capsys)
    odd = bytes(tmp_path) + b"/run-\xff"  # a name in another encoding than UTF-8 (in a process of its own:
    cli = [sys.executable, "-m", "bigbatch"]  # pytest's capture cannot hold the bytes printed)
    p = subprocess.run([*cli, "train", "--run-dir", odd, "train.kimg=0.128"], capture_output=True)
    assert p.returncode == 2 and b"is not valid UTF-8" in p.stderr and p.stderr.count(b"\n") == 1
    os.rename(run, odd)  # readers take it
    p = subprocess.run([*cli, "sample", odd, "--n", "4"], capture_output=True)
    assert p.returncode == 0 and odd in p.stdout, p.stderr


def test_a_read_error_in_a_loader_worker_names_the_data_file(tmp_path):
    from bigbatch.data.hdf5 import H5Data
    from bigbatch.data.loader import BatchLoader

    path = tmp_path / "d.h5"
    prepare("builtin:digits", str(path), resolution=16, workers=0, limit=300)
    data = H5Data(path)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)  # the file shrinks under the training run
    import torch

    loader = BatchLoader(data, [torch.arange(64) + 200], workers=1)
    with pytest.raises(bigbatch.BigbatchError) as e:
        next(loader)
    loader.close()
    assert str(e.value) == f"data file {path} is shorter than its index says: it is truncated"


def test_one_command_starts_or_resumes(tiny, tmp_path, capsys):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(tiny.dumps())
    run = tmp_path / "run"
    command = ["train", "--config", str(cfg), "--run-dir", str(run), "--resume=auto"]
    assert main([*command, "train.kimg=0.256"]) == 0  # nothing there: starts
    assert main(["train", "--run-dir", str(tmp_path / "none"), "--resume"]) == 2  # plain --resume needs a run
    assert "holds no run to resume" in one_error_line(capsys)
    assert main(["train", "--run-dir", str(tmp_path / "none"), "--resume", "yes"]) == 2  # (spaced: not an override)
    assert "holds no run to resume" in one_error_line(capsys)
    assert main([*command[:-1], "--resume", "auto"]) == 0  # the same command again: resumes (train.kimg may change)
    assert "Resuming" in capsys.readouterr().out  # (--resume auto, spaced: found from outside, read as an override)
    assert weights(run) == weights(bigbatch.train(tiny, run_dir=tmp_path / "whole", quiet=True))
    assert main(["train", "--preset", "digits", "--run-dir", str(run), "--resume", "train.kimg=1"]) == 2
    err = one_error_line(capsys)
    assert "data.resolution (16 -> 32)" in err and "model.ch" in err


def test_a_damaged_newest_checkpoint_is_moved_aside_so_pruning_keeps_the_good_ones(tiny, tmp_path, capsys):
    run = bigbatch.train(tiny.override({"checkpoint.keep": 2}), run_dir=tmp_path / "run", quiet=True)
    flip_byte(run / "checkpoints" / "000000.512" / "G.safetensors")
    shorter = tiny.override({"train.kimg": 0.384, "checkpoint.every_kimg": 0.128, "checkpoint.keep": 1})
    bigbatch.train(shorter, run_dir=run, resume=True, quiet=True)
    assert "moved aside to .corrupt-000000.512" in capsys.readouterr().err
    assert [c.name for c in checkpoints.complete_checkpoints(run)] == ["000000.384"]
    assert checkpoint_find.find_checkpoint(run).name == "000000.384"
    assert main(["train", "--run-dir", str(run), "--resume"]) == 0  # and on to the end


def test_a_newest_checkpoint_without_its_meta_json_is_damage_and_a_file_in_the_way_is_named(tiny, tmp_path, capsys):
    # Found from outside: the first was set aside as another history; the second's error named a temporary folder.
    run = bigbatch.train(tiny, run_dir=tmp_path / "run", quiet=True)
    (run / "checkpoints" / "000000.512" / "meta.json").unlink()
    bigbatch.train(tiny, run_dir=run, resume=True, quiet=True)
    err = capsys.readouterr().err
    assert "000000.512 is damaged: its meta.json is missing" in err and "moved aside to .corrupt-000000.512" in err
    assert "another history" not in err and not list((run / "checkpoints").glob(".superseded-*"))
    assert checkpoint_find.find_checkpoint(run).name == "000000.512"  # (trained again from 000000.256)
    (run / "checkpoints" / "000000.768").write_text("in the way")
    assert main(["train", "--run-dir", str(run), "--resume", "train.kimg=0.768"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]  # (after the warning that train.kimg grew)
    assert f"cannot write checkpoint {run}/checkpoints/000000.768: a file is in its place; move it away" in err
    assert ".tmp-" not in err and checkpoint_find.find_checkpoint(run).name == "000000.512"


def test_a_checkpoint_from_before_data_hashes_resumes_only_on_its_own_data_path(tiny, tmp_path):
    run = bigbatch.train(tiny.override({"train.kimg": 0.256}), run_dir=tmp_path / "run", quiet=True)
    meta = checkpoint_find.find_checkpoint(run) / "meta.json"
    record = json.loads(meta.read_text())
    del record["data"]  # as written before data identities were recorded
    meta.write_text(json.dumps(record))
    other = tiny.override({"data.path": "builtin:fashion-mnist"})
    with pytest.raises(bigbatch.BigbatchError, match="predates recorded data hashes"):
        bigbatch.train(other, run_dir=run, resume=True, quiet=True)
    bigbatch.train(tiny, run_dir=run, resume=True, quiet=True)


def test_a_run_directory_that_cannot_be_made_is_one_line(tiny, tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    assert main(["train", "--run-dir", str(tmp_path / "afile" / "run")]) == 2
    assert "Not a directory" in one_error_line(capsys)


def test_sigterm_to_a_prepare_with_workers_ends_it_cleanly(tmp_path):

    src = tmp_path / "images"
    src.mkdir()
    for i in range(1000):  # resized from 512 px: a few seconds of decoding to signal in
        Image.new("RGB", (512, 512), (i % 256, 0, 0)).save(src / f"{i}.png")
    out = str(tmp_path / "out.h5")
    cmd = [sys.executable, "-m", "bigbatch", "prepare", str(src), out, "--workers", "2", "--resolution", "32"]
    for delay in (0.1, 0.5):  # while the workers decode (the signal goes to the whole process group)
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        began = time.monotonic()  # decoding has begun once the output's partial file exists
        while not list(tmp_path.glob(".out.h5.partial-*")) and p.poll() is None and time.monotonic() - began < 60:
            time.sleep(0.02)
        time.sleep(delay)
        os.killpg(p.pid, signal.SIGTERM)
        out, err = p.communicate(timeout=60)  # never hangs
        assert "Traceback" not in err, err
        assert p.returncode == 128 + signal.SIGTERM and err.endswith(f"{STOPPED}\n"), (p.returncode, err)
        assert not list(tmp_path.glob(".out.h5.partial-*"))
        assert kept_said(tmp_path, err)
    # Started by a script as a background job, SIGINT ignored: `kill -INT` still stops it, as it stops train
    # (found from outside: ignored, and the prepare went on to the end).
    ignoring = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ignoring)
    began = time.monotonic()
    while not list(tmp_path.glob(".out.h5.partial-*")) and p.poll() is None and time.monotonic() - began < 60:
        time.sleep(0.02)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err.endswith("bigbatch: interrupted\n") and "Traceback" not in err, err
    assert kept_said(tmp_path, err)


def kept_said(folder, err: str) -> bool:
    """Whether a stopped prepare's lines before its last said where it kept its work, as it kept some (found from
    outside: unsaid; a rerun goes on from it)."""
    parts = folder / ".out.h5.parts"
    kept = f"bigbatch: the images prepared so far are kept in {parts}: the same command goes on from them\n"
    before = err.splitlines(keepends=True)[:-1]
    return before == ([kept] if parts.is_dir() and any(parts.iterdir()) else [])


def test_info_verify_reads_every_checkpoint_of_a_run_back(tiny, tmp_path, capsys, monkeypatch):
    run = bigbatch.train(tiny.override({"checkpoint.keep": 2}), run_dir=tmp_path / "run", quiet=True)
    capsys.readouterr()
    assert main(["info", str(run), "--verify"]) == 0
    out = capsys.readouterr().out
    assert out.count("verified  ") == 2 and "xxh3_128 checksums" in out and "2 checkpoints verified" in out
    older = run / "checkpoints" / "000000.256"  # (found from outside: one of another size left out of info unsaid)
    size = (older / "D.safetensors").stat().st_size
    os.truncate(older / "D.safetensors", size + 1)
    assert main(["info", str(run)]) == 0 and "checkpoints 000000.512 (latest" in (out := capsys.readouterr().out)
    assert out.count("damaged     ") == 1 and f"damaged     checkpoint {older} is corrupt: D.safetensors is" in out
    os.truncate(older / "D.safetensors", size)
    flip_byte(run / "checkpoints" / "000000.256" / "D.safetensors")  # the older one, damaged on disk
    assert main(["info", str(run), "--verify"]) == 2
    out, err = capsys.readouterr()
    assert "verified  " in out and f"damaged   checkpoint {run / 'checkpoints' / '000000.256'} is corrupt: D.s" in out
    assert err.count("\n") == 1 and "1 of 2 checkpoints damaged (000000.256); the others are intact" in err
    (run / "checkpoints" / "000000.512" / "G.safetensors").unlink()
    assert main(["info", str(run), "--verify"]) == 2
    out, err = capsys.readouterr()
    assert "G.safetensors, which its meta.json lists, is missing" in out and "none is intact" in err
    assert main(["info", str(run / "checkpoints" / "000000.256"), "--verify"]) == 2  # one checkpoint alone
    # Found from outside: with no checkpoint left to describe the run by, only the first damaged one was named.
    for ckpt in ("000000.256", "000000.512"):
        (run / "checkpoints" / ckpt / "state.pt").write_bytes(b"cut short")
    capsys.readouterr()
    assert main(["info", str(run), "--verify"]) == 2
    out, err = capsys.readouterr()
    assert out.count("damaged   ") == 2 and "2 of 2 checkpoints damaged (000000.512, 000000.256)" in err
    # Found from outside: a run with no checkpoint yet was called a damaged checkpoint; one pruned while --verify
    # read the others (by the run training), damaged.
    young = tmp_path / "young"
    young.mkdir()
    (young / "config.toml").write_text((run / "config.toml").read_text())
    assert main(["info", str(young), "--verify"]) == 0 and "has no checkpoint yet" in capsys.readouterr().out
    published = checkpoint_find.published

    def pruned_meanwhile(path):
        found = published(path)
        shutil.rmtree(found[0])
        return found

    fresh = bigbatch.train(tiny.override({"checkpoint.keep": 2}), run_dir=tmp_path / "fresh", quiet=True)
    monkeypatch.setattr(checkpoint_find, "published", pruned_meanwhile)
    capsys.readouterr()
    assert main(["info", str(fresh), "--verify"]) == 0
    out = capsys.readouterr().out
    assert out.count("pruned    ") == 1 and out.count("verified  ") == 1 and "1 checkpoint verified" in out


def test_a_full_disk_stops_tensorboard_with_a_warning_and_the_run_with_one_line(tiny, tmp_path, capsys, monkeypatch):
    import errno

    import tensorboard.summary.writer.record_writer as record_writer

    write, calls = record_writer.RecordWriter.write, []

    def fills_up(self, data):  # TensorBoard's event file: the disk fills after a few records
        calls.append(1)
        if len(calls) > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(self, data)

    monkeypatch.setattr(record_writer.RecordWriter, "write", fills_up)
    run = bigbatch.train(tiny.override({"train.log_every_kimg": 0.064}), run_dir=tmp_path / "run", quiet=True)
    err = capsys.readouterr().err
    assert err.count("TensorBoard's log in") == 1 and "stopped (No space left on device)" in err, err
    assert "Traceback" not in err  # (its writer thread printed one)
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 8  # the log went on

    class Full:  # then metrics.jsonl's disk: the run stops, in one line naming the file and the fix
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")  # (a failed write names no file)

    def opens(path, *args, **kwargs):
        return Full() if str(path).endswith("metrics.jsonl") else open(path, *args, **kwargs)

    monkeypatch.setattr("bigbatch.rundir.open", opens, raising=False)
    monkeypatch.setattr(record_writer.RecordWriter, "write", write)  # TensorBoard's disk has room again
    argv = ["train", "--preset", "digits", "train.kimg=0.064", "model.ch=8", "data.resolution=16"]
    assert main([*argv, "--run-dir", str(tmp_path / "full")]) == 2
    err = one_error_line(capsys)
    assert "metrics.jsonl: No space left on device; free space there" in err and "--resume" in err
