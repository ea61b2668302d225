"""`bigbatch launch dask`: one rank per Dask worker, set up as torchrun would, trains the weights of
one process; a failing rank stops the launch with its own one-line error."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from test_distributed import ARGS, max_rel, train

import bigbatch.engine.state
from bigbatch.launch import rank_environments

distributed = pytest.importorskip("distributed")


def test_rank_environments_follow_hosts_and_pinned_gpus():
    workers = ["tcp://10.0.0.2:4000", "tcp://10.0.0.2:4001", "tcp://10.0.0.3:4000", "tcp://10.0.0.2:4002"]
    envs = rank_environments(workers, 29500, [False, False, False, False])
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "2"]  # the GPU index on each host
    assert [e["LOCAL_WORLD_SIZE"] for e in envs] == ["3", "3", "1", "3"]
    assert {(e["WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("4", "10.0.0.2", "29500")}
    # dask-cuda pins each worker's GPU with CUDA_VISIBLE_DEVICES: it is that worker's device 0.
    assert [e["LOCAL_RANK"] for e in rank_environments(workers, 1, [True] * 4)] == ["0"] * 4


def launch(scheduler, *command):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "bigbatch.cli", "launch", "dask", "--scheduler", scheduler, "--", *command]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def test_dask_workers_train_the_weights_of_one_process(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the workers' environment, which their ranks inherit
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster:
        ok = launch(
            cluster.scheduler_address,
            "train",
            *ARGS,
            "train.batch=32",
            "train.micro_batch=8",
            "--run-dir",
            str(tmp_path / "dask"),
        )
        assert ok.returncode == 0, ok.stderr[-3000:]
        bad = launch(cluster.scheduler_address, "train", "model.name=nope", "--run-dir", str(tmp_path / "bad"))
        stopped = stop_a_long_launch(cluster.scheduler_address, tmp_path / "long")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    # Whichever rank failed first (the other may have been stopped by it before reading its config).
    assert re.match(
        r"bigbatch: error: rank [01] on tcp://127\.0\.0\.1:\d+: config key 'model.name' names no", bad.stderr
    )
    # Same batch, micro-batch and data as one process with accumulation 4: the same weights.
    dask = tmp_path / "dask" / "checkpoints" / "000000.256"
    one = train(tmp_path / "one", 1, "train.batch=32", "train.micro_batch=8")
    for net in ("G", "D", "G_ema"):
        assert max_rel(one, dask, net) <= 1e-4, net
    assert '"world_size": 2' in (tmp_path / "dask" / "plan.json").read_text()
    # SIGTERM to the launcher (or Ctrl-C) stops every rank: they save one checkpoint together and exit 0.
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert "stopping every rank" in stopped.stderr  # (the ranks print on their workers' stdout)
    assert bigbatch.engine.state.find_checkpoint(tmp_path / "long").name != "000000.000"


def stop_a_long_launch(scheduler, run_dir):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "bigbatch.cli", "launch", "dask", "--scheduler", scheduler, "--", "train", *ARGS]
    cmd += ["train.kimg=1000", "train.batch=32", "train.micro_batch=8", "--run-dir", str(run_dir)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (run_dir / "metrics.jsonl").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)  # training has started on both ranks
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=180)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_ray_actors_train_the_weights_of_one_process(tmp_path):
    pytest.importorskip("ray")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    base = [sys.executable, "-m", "bigbatch.cli", "launch", "ray", "--local", "2", "--", "train"]
    ok = subprocess.run(
        [*base, *ARGS, "train.batch=32", "train.micro_batch=8", "--run-dir", str(tmp_path / "ray")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "Done:" in ok.stdout  # rank 0's output reaches the launcher
    one = train(tmp_path / "one", 1, "train.batch=32", "train.micro_batch=8")
    for net in ("G", "D", "G_ema"):
        assert max_rel(one, tmp_path / "ray" / "checkpoints" / "000000.256", net) <= 1e-4, net
    bad = subprocess.run(
        [*base, "model.name=nope", "--run-dir", str(tmp_path / "bad")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert re.match(r"bigbatch: error: rank [01] on ray://[\d.]+:[01]: config key 'model.name' names no", bad.stderr)


@pytest.mark.parametrize(
    "args, words",
    [
        (["launch", "dask", "--", "train"], "--scheduler tcp://HOST:8786) or --local N"),
        (["launch", "dask", "--local", "1"], "nothing to launch"),
        (["launch", "ray", "--", "train"], "--address auto or ray://HEAD:10001) or --local N"),
    ],
)
def test_launcher_usage_errors_are_one_line(args, words, capsys):
    from bigbatch.cli import main

    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("bigbatch: error: ") and err.count("\n") == 1 and words in err, err
