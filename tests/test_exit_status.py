"""A finished command line run exits 0 whatever SIGTERM arrives while it exits (a scheduler preempting a job as it
ends must not read a finished, saved run as killed); a stop asked of a run under way is answered at once."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path


def test_sigterm_after_a_finished_run_says_done_leaves_its_status_0(tmp_path):
    # Found from outside: a SIGTERM in the second after "Done:" (the process exiting) gave status 143.
    cmd = [sys.executable, "-m", "bigbatch.cli", "train", "--run-dir", str(tmp_path / "run"), "data.resolution=16"]
    cmd += ["model.ch=8", "model.dim_z=16", "train.batch=32", "train.kimg=0.064", "sample.every_kimg=0"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said = ""
    while not said.startswith("Done:") and p.poll() is None:
        said = p.stdout.readline()
    assert said.startswith("Done:"), p.stderr.read()
    sent = 0
    time.sleep(0.02)  # (past the run's own end, where a signal still asks it to stop: into the process's exit)
    while p.poll() is None and sent < 400:  # (through the exit: 0.2 to 0.9 s after "Done:" on this machine)
        p.send_signal(signal.SIGTERM)
        sent += 1
        time.sleep(0.01)
    p.communicate(timeout=120)
    assert sent > 0 and p.returncode == 0, (p.returncode, sent)  # (sent none: it exited unseen, nothing tested)


def test_ctrl_c_once_training_is_said_saves_a_checkpoint(tmp_path):
    # Found from outside: a Ctrl-C on the "Training ..." line, while the first batch sheet was drawn, ended the run at
    # once with nothing saved (exit 130), where README says a first Ctrl-C saves a checkpoint.
    script = (
        "import os, signal, sys\n"
        "from bigbatch import cli, rundir\n"
        "drawn = rundir.Run.write_batch_sheet\n"
        "def sheet(self, task, nimg):\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    return drawn(self, task, nimg)\n"
        "rundir.Run.write_batch_sheet = sheet\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    run = tmp_path / "run"
    cmd = [sys.executable, "-c", script, "train", "--run-dir", str(run), "data.resolution=16", "model.ch=8"]
    cmd += ["model.dim_z=16", "train.batch=32", "train.kimg=1000", "checkpoint.every_kimg=1000"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Stopped by signal" in done.stdout and any((run / "checkpoints").iterdir())


def test_a_commands_process_leaves_its_objects_out_of_pythons_last_collection(tmp_path):
    # Found from outside: 1-3 s from a stop's "saved" to the process's end, in Python's collection at exit (a
    # scheduler's SIGKILL 3 s after its SIGTERM came first); the command's objects are frozen as it returns. Called
    # from Python (a notebook's main([...])), nothing is; nor a sweep file's objects, a user's, whose finalizers (a
    # file's flush) that collection runs (found by review).
    (tmp_path / "s.py").write_text("print('a sweep file')\n")
    code = (
        "import gc, sys; from bigbatch.cli import main; main(['presets']); n = gc.get_freeze_count(); "
        "sys.argv = ['bigbatch'] + sys.argv[1:]; main(); print(n, gc.get_freeze_count(), file=sys.stderr)"
    )
    counts = []
    for argv in (["presets"], ["sweep", "s.py"]):
        out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        counts.append(tuple(map(int, out.stderr.split()[-2:])))
    assert counts[0][0] == 0 and counts[0][1] > 1000 and counts[1] == (0, 0)


def test_a_stop_asked_of_a_training_run_is_answered_at_once(capfd):
    # Found from outside: an accumulated step of 512 micro-batches took minutes to end after Ctrl-C, without a word.
    from bigbatch.signals import stop_signals

    with stop_signals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)  # (while it starts: the loop says what it does)
        assert stop.requested and capfd.readouterr().err == ""
        stop.requested, stop.armed = False, True
        for _ in range(2):
            os.kill(os.getpid(), signal.SIGTERM)
        said = capfd.readouterr().err
        assert stop.requested and said.count("\n") == 1 and said.startswith("bigbatch: stopping: a checkpoint is saved")
        assert "(a Ctrl-C stops at once" in said  # (a SIGTERM's: no first Ctrl-C to follow)
        # Its reader gone (`2>&1 | tee` closed by the same Ctrl-C): the stop asked all the same (found by review)
        stop.requested, kept, (read, write) = False, os.dup(2), os.pipe()
        os.close(read)
        os.dup2(write, 2)
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.requested
        finally:
            os.dup2(kept, 2)
            os.close(kept)
            os.close(write)


def test_a_background_jobs_ctrl_c_while_torch_imports_ends_it(tmp_path):
    # A script's `cmd &` starts with SIGINT ignored: a `kill -INT` in the seconds torch took to import was lost, and
    # the run trained on to its end (found from outside).
    cmd = [sys.executable, "-m", "bigbatch", "train", "--preset", "digits", "--run-dir", str(tmp_path / "r")]
    ignored = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731
    proc = subprocess.Popen(cmd, preexec_fn=ignored, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:  # (once it catches SIGINT: /proc's SigCgt mask; found by review, a fixed wait could come before it)
        deadline = time.monotonic() + 60
        while not int(re.search(r"SigCgt:\s*(\w+)", Path(f"/proc/{proc.pid}/status").read_text())[1], 16) & 2:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=120)[1]
    finally:
        proc.kill()
    assert proc.returncode == 130 and err == "bigbatch: interrupted as it started: nothing was done\n", err
    assert not (tmp_path / "r").exists()
