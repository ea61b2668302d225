"""What a user watching a run is told: `info` of a run that skipped steps says how many (found from outside: 93 of
94 skipped read as done and healthy), and `stop --wait` of a run stopped in its start-up says so (it said the run
"does not exist", exit 2, after stopping it)."""

import json

from bigbatch.cli import main
from bigbatch.run_stop import stopped_said

SMALL = ["--preset", "digits", "data.resolution=16", "model.ch=8", "model.dim_z=16", "train.batch=8"]


def test_info_says_the_steps_a_run_skipped(tmp_path, capsys):
    run = str(tmp_path / "r")
    argv = [*SMALL, "train.kimg=0.096", "train.log_every_kimg=0.032", "sample.every_kimg=0", "eval.every_kimg=0"]
    assert main(["train", *argv, "train.g_lr=1e36", "train.skip_limit=1.0", "--run-dir", run]) == 0
    capsys.readouterr()
    assert main(["info", run]) == 0
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    g, d = (sum(r.get(f"skipped_{n}", 0) for r in rows) for n in "GD")
    assert g >= 10 and d >= 10  # (every step of each, but the first's)
    said = f"skipped     {g} of G's and {d} of D's steps in 12 iterations: their loss or gradients not finite"
    assert said in capsys.readouterr().out
    assert main(["train", *argv, "--run-dir", str(tmp_path / "healthy")]) == 0
    capsys.readouterr()
    assert main(["info", str(tmp_path / "healthy")]) == 0
    assert "skipped " not in capsys.readouterr().out


def test_a_run_stopped_before_its_first_checkpoint_is_said_so(tmp_path):
    said = stopped_said(tmp_path / "gone", 123)  # (stopped in its reference statistics: it removed its folder)
    assert said == "Stopped process 123 in its start-up, before it trained: the command that started it starts it again"
