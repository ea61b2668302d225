"""A sweep or search run again, and stopped, as its user expects (each found from outside): a grid of NumPy values or of
numbers written otherwise (2.0 for 2) takes the runs it trained, a finished run scored otherwise than the sweep now
asks is said to be, a search's finished trials are told from their runs, not started again, and `bigbatch stop
RUNS_DIR` stops the sweep running in it."""

import csv
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from test_classify import tiny as tiny_classifier

import bigbatch
from bigbatch.cli import main
from bigbatch.rundir import trainer


def short(**overrides):
    return tiny_classifier(
        **{"train.kimg": 0.128, "eval.every_kimg": 0.128, "checkpoint.every_kimg": 0.128, **overrides}
    )


def test_a_grid_run_again_takes_its_runs_whatever_writes_their_numbers(tmp_path, capsys):
    assert short().override({"train.batch": np.int64(32)}).train.batch == 32  # (was "must be an integer, got 32")
    runs = tmp_path / "runs"
    rows = bigbatch.sweep(short(**{"eval.every_kimg": 0}), {"train.weight_decay": np.array([0])}, runs)  # (was
    # "must map to a list")
    assert [(r["run"], r["status"]) for r in rows] == [("weight_decay=0", "finished")]
    capsys.readouterr()
    # 0.0 is the 0 it trained (was: a new run, weight_decay=0.0), and scored otherwise now: said.
    rows = bigbatch.sweep(short(**{"eval.every_kimg": 0.064}), {"train.weight_decay": [0.0]}, runs)
    assert [(r["run"], r["status"]) for r in rows] == [("weight_decay=0", "finished")]
    assert sorted(p.name for p in runs.iterdir() if p.is_dir()) == ["weight_decay=0"]
    out, err = capsys.readouterr()
    assert "[1/1] weight_decay=0: finished" in out
    assert "weight_decay=0 was not scored (its own eval.every_kimg was 0): its row has no scores" in err


def test_a_search_run_again_tells_its_finished_trials_without_starting_them(tmp_path, capsys):
    optuna = pytest.importorskip("optuna")
    runs = tmp_path / "search"

    def search(**over):
        study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=3))
        bigbatch.sweep(short(**over), {"train.lr": (0.05, 0.2)}, runs, search=study, n_trials=1, metric="val_top1")
        return study

    first = search()
    run = next(p for p in runs.iterdir() if p.is_dir())
    assert first.trials[0].user_attrs["run"] == str(run)  # (where Optuna's dashboard shows the trial)
    events = sorted(p.name for p in run.rglob("events.out.tfevents.*"))
    capsys.readouterr()
    again = search()
    assert again.trials[0].state.name == "COMPLETE" and again.trials[0].value == first.trials[0].value
    out = capsys.readouterr().out
    assert f"[1/1] {run.name}: " in out and ": finished before" in out and "starting" not in out, out
    assert sorted(p.name for p in run.rglob("events.out.tfevents.*")) == events  # (no process started for it)
    search(**{"eval.every_kimg": 0.064})  # (scored otherwise now: said, as a grid's run is)
    assert f"{run.name} was scored with its own eval.every_kimg=0.128 (this sweep: 0.064)" in capsys.readouterr().err


def test_bigbatch_stop_of_a_sweeps_folder_stops_the_sweep_running_in_it(tmp_path, capsys):
    (tmp_path / "base.toml").write_text(short(**{"train.kimg": 50, "eval.every_kimg": 0}).dumps())
    script, runs = tmp_path / "grid.py", tmp_path / "runs"
    script.write_text(
        "import sys, bigbatch\n"
        f"base = bigbatch.Config.load({str(tmp_path / 'base.toml')!r})\n"
        "bigbatch.sweep(base, {'train.seed': [0, 1]}, sys.argv[1])\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    sweep = subprocess.Popen(
        [sys.executable, "-m", "bigbatch", "sweep", str(script), str(runs)], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (runs / "seed=0" / "metrics.jsonl").is_file():  # (training: past its start-up)
            assert sweep.poll() is None and time.monotonic() < deadline, sweep.communicate()
            time.sleep(0.2)
        assert main(["stop", str(runs), "--wait", "120"]) == 0
        out, err = sweep.communicate(timeout=60)
    finally:
        sweep.kill()
    table = runs / "results.md"
    assert (
        capsys.readouterr().out
        == f"Stopped the sweep's process {sweep.pid}; its table: {table} (the sweep run again goes on)\n"
    )
    assert sweep.returncode == 130 and "bigbatch sweep: stopped at seed=0; run the sweep again to resume it" in err, err
    with open(runs / "results.csv") as f:
        assert [(r["run"], r["status"]) for r in csv.DictReader(f)] == [("seed=0", "interrupted"), ("seed=1", "new")]
    assert trainer(runs / "seed=0") is None
    assert main(["stop", str(runs)]) == 2  # no sweep runs in it now
    assert capsys.readouterr().err == (
        f"bigbatch: error: {runs} is a sweep's folder, and no sweep runs in it now: nothing to stop (one of its runs "
        f"trained on its own: bigbatch stop {runs}/<run>)\n"
    )
