"""`bigbatch info RUN` says whether the run is training now, done, stopped, or ended without saving (found from
outside: it read alike while a run trained, after it was killed and once it was done)."""

import json
import os
import shutil

import pytest

import bigbatch
from bigbatch.cli import main
from bigbatch.files import lock_folder, unlock_folder
from bigbatch.rundir import LOCK


def state(capsys, run) -> str:
    assert main(["info", str(run)]) == 0
    return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("state "))[12:]


def test_info_says_a_runs_state(tiny, tmp_path, capsys):
    cfg = tiny.override({"train.kimg": 0.128, "checkpoint.every_kimg": 0.064, "train.log_every_kimg": 0.032})
    run = bigbatch.train(cfg, run_dir=tmp_path / "r", quiet=True)
    assert state(capsys, run) == "done (0.128 of 0.128 kimg)"
    bigbatch.train(cfg, run_dir=run, resume=True, quiet=True)  # (found from outside: "Training ..." of a run at its
    said = capsys.readouterr().out  # end, as if it trained)
    assert "has trained its 0.128 kimg: nothing to train" in said and "Training " not in said, said
    # `stop` of one of its checkpoints stops its run (found from outside: "not being trained" of the checkpoint)
    assert main(["stop", str(run / "checkpoints" / "000000.128")]) == 2
    assert f"{run.resolve()} is not being trained: no process holds its lock" in capsys.readouterr().err
    (tmp_path / "checkpoints").mkdir()  # (a run in a folder named checkpoints is itself: found by review)
    shutil.copytree(run, tmp_path / "checkpoints" / "mine")
    assert main(["stop", str(tmp_path / "checkpoints" / "mine")]) == 2
    assert f"{tmp_path / 'checkpoints' / 'mine'} is not being trained" in capsys.readouterr().err
    lock = lock_folder(run, LOCK, lambda *a: "busy")  # as the process training it holds it
    try:
        assert state(capsys, run) == f"training now (process {os.getpid()} on {os.uname().nodename})"
    finally:
        unlock_folder(lock)
    (run / "config.toml").write_text(cfg.override({"train.kimg": 1}).dumps())  # (resumed for longer, then killed)
    again = f"`bigbatch train --run-dir {run} --resume` goes on"
    # (found from outside: a kill after a checkpoint, before the next log row, read "stopped")
    killed = "not training: it ended after its checkpoint at 0.128 kimg, not by a stop (killed or crashed); "
    assert state(capsys, run) == killed + again
    meta = run / "checkpoints" / "000000.128" / "meta.json"  # (as a stop's save writes it)
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "stopped": True}))
    assert state(capsys, run) == f"not training: stopped at 0.128 of 1 kimg; {again}"
    plan = json.loads((run / "plan.json").read_text())  # (a run of 2 processes: resumed as it was started)
    (run / "plan.json").write_text(json.dumps({**plan, "world_size": 2}))
    assert state(capsys, run).endswith(f"{again}, started as the run was (2 processes)")  # (found from outside)
    (run / "plan.json").write_text(json.dumps(plan))
    shutil.rmtree(run / "checkpoints" / "000000.128")  # its log went past its latest checkpoint: killed
    (run / "checkpoints" / "latest").unlink(missing_ok=True)
    assert state(capsys, run).startswith("not training: it ended at 0.128 kimg without saving (killed or crashed); ")
    shutil.rmtree(run / "checkpoints")
    said = state(capsys, run)
    assert said.startswith("not training: it ended before its first checkpoint (logged to 0.128 kimg); "), said
    assert said.endswith("--resume` goes on from its start")
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["kimg"] == 0.128


def test_info_says_a_phases_rates_per_lr_batch_and_its_resolution_0_as_data_resolution(tmp_path, capsys):
    # Found from outside: "8px batch 64 lr 1->2" of a phase whose logged rate ran 0.5->1 (rates per 128 images),
    # and a phase of resolution 0 shown as "0px".
    over = {"data.schedule": "0:0:64:1.0:2.0,1:16:32:0.5:0.05", "train.lr_batch": 128, "train.warmup_kimg": 0}
    cfg = bigbatch.preset("fashion_resnet").override({**over, "train.lr_decay": "none"})
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.toml").write_text(cfg.dumps())  # (a run before its first checkpoint)
    assert main(["info", str(tmp_path / "run")]) == 0
    shown = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("schedule "))
    assert shown.startswith("schedule    28px batch 64 lr 1->2 per 128 from 0 kimg (current), 16px batch 32 lr 0.5")


def test_a_lock_file_deleted_while_a_run_trains_is_taken_again(tiny, tmp_path, capsys, monkeypatch):
    # Found from outside: `rm RUN/.lock` (a "stale" lock file cleaned up) while the run trained left `info` saying it
    # ended, `stop` unable to stop it, and a second `train --resume` free to write the run beside it.
    from bigbatch.tasks.gan.task import GANTask

    run, seen, others, step = tmp_path / "r", [], [], GANTask.step

    def step_and_look(self, feed):  # the file deleted in each run's first step (in the second, another's taken)
        out = step(self, feed)
        if feed.nimg in (32, 96):
            (run / LOCK).unlink()
            others.extend([lock_folder(run, LOCK, lambda *a: "busy")] if feed.nimg > 64 else [])
        elif feed.nimg == 64:  # (after the log row at 32)
            seen.append(state(capsys, run))
        return out

    monkeypatch.setattr(GANTask, "step", step_and_look)
    cfg = tiny.override({"train.kimg": 0.064, "train.log_every_kimg": 0.032, "checkpoint.every_kimg": 0.064})
    bigbatch.train(cfg, run_dir=run, quiet=True)
    assert seen[0].startswith(f"training now (process {os.getpid()}"), seen
    # where another process took it meanwhile, this one stops, leaving the run to it
    try:
        with pytest.raises(
            bigbatch.BigbatchError, match=r"\.lock was deleted or replaced while this process held it, and"
        ):
            bigbatch.train(cfg.override({"train.kimg": 0.128}), run_dir=run, resume=True, quiet=True)
    finally:
        unlock_folder(others[-1])


def test_a_stop_at_a_checkpoints_images_marks_that_checkpoint_a_stops(tiny, tmp_path, capsys, monkeypatch):
    # A stop's save where a checkpoint was just saved keeps that one as it is, and says it is a stop's (by review:
    # info would call the run killed after it).
    import signal

    from bigbatch.tasks.gan.task import GANTask

    step = GANTask.step

    def step_then_signal(self, feed):
        out = step(self, feed)
        if feed.nimg == 64:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(GANTask, "step", step_then_signal)
    cfg = tiny.override({"train.kimg": 0.128, "checkpoint.every_kimg": 0.032, "train.log_every_kimg": 0.128})
    with pytest.raises(bigbatch.Stopped):
        bigbatch.train(cfg, run_dir=tmp_path / "r", quiet=True)
    assert state(capsys, tmp_path / "r").startswith("not training: stopped at 0.064 of 0.128 kimg; ")


def test_info_says_the_line_a_run_failed_with_until_it_starts_again(tiny, tmp_path, capsys):
    # Found from outside: a run that failed read as one that had ended, the line it failed with left to its output.
    from bigbatch.tasks.gan.task import GANTask

    step = GANTask.step

    def step_then_fail(self, feed):
        if feed.nimg >= 64:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore of torch's words")
        return step(self, feed)

    cfg = tiny.override({"train.kimg": 0.128, "checkpoint.every_kimg": 0.032})
    with pytest.MonkeyPatch.context() as patch, pytest.raises(RuntimeError):
        patch.setattr(GANTask, "step", step_then_fail)
        bigbatch.train(cfg, run_dir=tmp_path / "r", quiet=True)
    said = state(capsys, tmp_path / "r")
    assert said.startswith("not training: it ended after its checkpoint at 0.064 kimg, not by a stop; "), said
    assert said.endswith(". It failed: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"), said
    bigbatch.train(cfg, run_dir=tmp_path / "r", resume=True, quiet=True)
    assert state(capsys, tmp_path / "r") == "done (0.128 of 0.128 kimg)"
    assert "failed" not in json.loads((tmp_path / "r" / "plan.json").read_text())
