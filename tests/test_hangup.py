"""A run whose terminal hangs up (a closed ssh session) saves a checkpoint and exits 0."""

import os
import select
import sys
import time

from bigbatch.checkpoint_find import find_checkpoint


def test_a_run_whose_terminal_hangs_up_saves_and_exits_0(tmp_path):
    # Found by review: the handler asked whether stdout was a terminal once it had hung up, when it no longer is one
    # (Linux swaps a hung-up tty's operations first): nothing was silenced, the next line failed, exit status 1.
    import pty

    run = tmp_path / "tty"
    args = ["train", "--run-dir", str(run), "data.resolution=16", "model.ch=8", "train.kimg=1000"]
    args += ["train.log_every_kimg=0.064", "checkpoint.every_kimg=1000"]
    pid, fd = pty.fork()
    if pid == 0:  # (the child: a session of its own, the pty its terminal)
        os.execv(sys.executable, [sys.executable, "-m", "bigbatch.cli", *args])
    deadline = time.time() + 120
    while not (run / "metrics.jsonl").exists() and time.time() < deadline:
        if select.select([fd], [], [], 0.2)[0]:
            try:
                os.read(fd, 65536)  # (drained: a full terminal would block the run)
            except OSError:
                break
    os.close(fd)  # the terminal hangs up: the kernel sends SIGHUP to its session
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert find_checkpoint(run).parent.name == "checkpoints"
