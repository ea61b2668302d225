"""What a rank says where other ranks are concerned (found from outside, a user scaling out): a group it waits for
is said once the wait is long, and torchrun's stop of the ranks after one said a bad command adds no line."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading

from bigbatch import cli, signals
from bigbatch.cli_errors import say_error


def test_a_rank_waiting_for_a_group_that_does_not_come_says_whom_and_where(tmp_path):
    # RANK, WORLD_SIZE and MASTER_* left in a shell by another job: `bigbatch train` waited silently (torch's
    # 30 minutes). (The wait shortened to a second here.)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}

    def said(env):
        code = "import bigbatch.engine.dist as d; d.WAIT_SAID_AFTER_S = 1; d.init(d.context('cpu'))"
        proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True)
        unsaid = threading.Timer(60, proc.kill)  # (nothing said: the line read is empty)
        unsaid.start()
        try:
            return proc.stderr.readline()
        finally:
            unsaid.cancel()
            proc.kill()
            proc.wait()

    assert said(env) == (
        f"bigbatch: rank 0 of 2 waits for the other ranks at 127.0.0.1:{port} (RANK, WORLD_SIZE, MASTER_ADDR and "
        "MASTER_PORT as the environment has them, without torchrun: left by another job, unset them)\n"
    )
    # Under torchrun of one node, a rank of this machine is waited for (found from outside: "another node").
    torchrun = {"TORCHELASTIC_RUN_ID": "x", "LOCAL_RANK": "0", "GROUP_WORLD_SIZE": "1"}
    assert said({**env, **torchrun}).endswith("(started by torchrun: a rank of this machine has not started yet, or "
                                             "it failed)\n")  # fmt: skip


def test_a_rank_torchrun_stops_after_another_said_a_bad_command_adds_no_line(monkeypatch, capsys, tmp_path):
    # The quicker rank said the error and exited 2; torchrun's SIGTERM reached the other still starting, which said
    # "stopped by SIGTERM", as if something else had stopped the run.
    (tmp_path / "attempt_0" / "1").mkdir(parents=True)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "attempt_0" / "1" / "error.json"))

    def started(args):
        raise signals.Terminated

    monkeypatch.setattr(cli, "_presets", started)
    assert cli.main(["presets"]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err == cli.STOPPED + "\n"  # (a stop of its own: said)
    say_error("config key 'train.bogus' names no key")  # (the other rank's line)
    capsys.readouterr()
    assert cli.main(["presets"]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err == ""


def test_a_line_bigbatch_says_is_one_write_so_the_lines_of_ranks_do_not_run_together(monkeypatch):
    # Under PYTHONUNBUFFERED print() writes its parts apart: in CI two ranks' prints (a test script's) sharing a pipe
    # became one line.
    from bigbatch.errors import say, warn

    class Writes(list):
        def write(self, text):
            self.append(text)
            return len(text)

        def flush(self):
            pass

    writes = Writes()
    monkeypatch.setattr(sys, "stderr", writes)
    warn("a warning")
    say_error("an error")
    say(cli.STOPPED)  # (what every rank says at once of a SIGTERM to all)
    assert writes == ["bigbatch: warning: a warning\n", "bigbatch: error: an error\n", cli.STOPPED + "\n"]


def test_one_ctrl_c_to_a_run_with_data_workers_says_stopping_once(tmp_path):
    # Found from outside: a Ctrl-C reaches the terminal's whole process group, and each data worker, forked with the
    # run's handler, said the stop line too.
    import time

    run = tmp_path / "r"
    cmd = [sys.executable, "-m", "bigbatch", "train", "--preset", "digits", "--run-dir", str(run), "data.workers=2"]
    cmd += ["data.resolution=16", "model.ch=8", "model.dim_z=16", "train.kimg=50", "sample.every_kimg=0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (run / "metrics.jsonl").is_file():  # (training, its workers started)
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        err = proc.communicate(timeout=120)[1]
    finally:
        proc.kill()
    assert proc.returncode == 0 and err.count("bigbatch: stopping:") == 1, err
