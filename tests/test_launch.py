"""`bigbatch launch dask`: one rank per Dask worker, set up as torchrun would, trains the weights of
one process; a failing rank stops the launch with its own one-line error."""

import os
import subprocess
import sys

import pytest
from test_distributed import ARGS, max_rel, train

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
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert bad.stderr.startswith("bigbatch: error: rank 0 on tcp://127.0.0.1:") and "no registered model" in bad.stderr
    # Same batch, micro-batch and data as one process with accumulation 4: the same weights.
    dask = tmp_path / "dask" / "checkpoints" / "000000.256"
    one = train(tmp_path / "one", 1, "train.batch=32", "train.micro_batch=8")
    for net in ("G", "D", "G_ema"):
        assert max_rel(one, dask, net) <= 1e-4, net
    assert '"world_size": 2' in (tmp_path / "dask" / "plan.json").read_text()


@pytest.mark.parametrize(
    "args, words",
    [
        (["launch", "dask", "--", "train"], "--scheduler tcp://HOST:8786) or --local N"),
        (["launch", "dask", "--local", "1"], "nothing to launch"),
    ],
)
def test_launcher_usage_errors_are_one_line(args, words, capsys):
    from bigbatch.cli import main

    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("bigbatch: error: ") and err.count("\n") == 1 and words in err, err
