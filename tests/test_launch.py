"""`bigbatch launch dask`: one rank per Dask worker, set up as torchrun would, trains the weights of
one process; a failing rank stops the launch with its own one-line error."""

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import RESTART_ARGS
from test_distributed import ARGS, max_rel

import bigbatch
import bigbatch.checkpoint_find
import bigbatch.checkpoints
import bigbatch.rundir
from bigbatch.errors import STOPPED
from bigbatch.launch import RankResult, rank_command, rank_environments, report
from bigbatch.launch.dask import local_cluster
from bigbatch.launch.ray import ray_ranks
from bigbatch.metrics_file import read_metrics

distributed = pytest.importorskip("distributed")


def test_rank_environments_follow_hosts_and_pinned_gpus():
    workers = ["tcp://10.0.0.2:4000", "tcp://10.0.0.2:4001", "tcp://10.0.0.3:4000", "tcp://10.0.0.2:4002"]
    envs = rank_environments(workers, 29500, ["", "", "", ""])
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "2"]  # the GPU index on each host
    assert [e["LOCAL_WORLD_SIZE"] for e in envs] == ["3", "3", "1", "3"]
    assert {(e["WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("4", "10.0.0.2", "29500")}
    assert all("CUDA_VISIBLE_DEVICES" not in e for e in envs)
    # Workers that all see the same GPUs (SLURM, plain dask workers): LOCAL_RANK picks one each.
    same = rank_environments(workers, 1, ["0,1,2", "0,1,2", "0", "0,1,2"])
    assert [e["LOCAL_RANK"] for e in same] == ["0", "1", "0", "2"]
    # Two runs side by side on one host's four workers: the second run's ranks take the last two GPUs.
    host = [f"tcp://10.0.0.2:{port}" for port in (4000, 4001, 4002, 4003)]
    second = rank_environments(host[2:], 1, ["0,1,2,3"] * 2, cluster=host)
    assert [(e["RANK"], e["LOCAL_RANK"]) for e in second] == [("0", "2"), ("1", "3")]
    # dask-cuda rotates CUDA_VISIBLE_DEVICES so each worker's own GPU comes first (Ray sets one per actor):
    # each rank then sees only its GPU, as device 0.
    rotated = rank_environments(workers, 1, ["0,1,2", "1,2,0", "5", "2,0,1"])
    assert [(e["LOCAL_RANK"], e["CUDA_VISIBLE_DEVICES"]) for e in rotated] == [
        ("0", "0"),
        ("0", "1"),
        ("0", "5"),
        ("0", "2"),
    ]


def test_a_rank_runs_python_m_bigbatch_while_its_worker_lives():
    env = {**os.environ, "BIGBATCH_LAUNCH_PARENT": str(os.getpid())}  # this process stands for the worker
    bad = subprocess.run(rank_command(["train", "nosuchkey=1"]), env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("bigbatch: error: unknown config key 'nosuchkey'"), bad
    if sys.platform == "linux":
        # Its parent is not the worker that started it (the worker died first): it stops before running anything.
        env["BIGBATCH_LAUNCH_PARENT"] = "1"
        orphan = subprocess.run(rank_command(["presets"]), env=env, capture_output=True, text=True)
        assert (orphan.returncode, orphan.stdout) == (1, "")


def result(rank, rc, tail="", ended=0.0, stopped=False):
    return RankResult(rank, f"tcp://h:{rank}", rc, tail, ended, stopped)


def test_the_report_names_the_rank_that_failed_of_its_own_accord(capsys):
    assert report([result(0, 0), result(1, 0)]) == 0
    # Rank 1's own error broke rank 0's collective first in time: rank 1 is the cause, with its status.
    gloo = "Traceback (most recent call last):\nRuntimeError: [gloo] Connection closed by peer"
    assert report([result(0, 1, gloo, ended=1.0), result(1, 2, "bigbatch: error: data.h5 is corrupt", ended=2.0)]) == 2
    assert capsys.readouterr().err == (
        "bigbatch: error: rank 1 on tcp://h:1: data.h5 is corrupt (1 other rank failed or stopped too)\n"
    )
    # A rank killed from outside (the OOM killer) is the cause, not the rank the launcher then stopped.
    assert report([result(0, -15, "", ended=5.0, stopped=True), result(1, -9, "", ended=1.0)]) == 137  # (a shell's)
    assert capsys.readouterr().err.startswith("bigbatch: error: rank 1 on tcp://h:1: killed by signal 9")
    # ... also when the survivor's broken collective ended it first, said as its own line (found from outside:
    # "rank 1: lost contact with another rank" was reported for rank 0, killed by SIGKILL).
    lost = "bigbatch: error: lost contact with another rank ([gloo] Connection reset by peer): its own error line"
    assert report([result(0, -9, "", ended=2.0), result(1, 1, lost, ended=1.0)]) == 137
    assert capsys.readouterr().err.startswith("bigbatch: error: rank 0 on tcp://h:0: killed by signal 9")
    # Stopped by the launcher: rank 0 saved and exited 0; a rank whose loop had already ended on rank 0's
    # signal took its own SIGTERM by default: a clean stop. Without rank 0's clean exit it is not.
    assert report([result(0, 0, stopped=True), result(1, -15, stopped=True)]) == 0
    assert report([result(0, -15, stopped=True), result(1, 0, stopped=True)]) == 130
    assert "interrupted, and not every rank ended cleanly (rank 0: -15)" in capsys.readouterr().err
    # ... and stopped as they started, each said so: a clean stop, before anything was saved.
    starting = [result(0, 143, STOPPED, stopped=True), result(1, 143, "x\n" + STOPPED, stopped=True)]
    assert report(starting) == 130
    assert "interrupted as the ranks started: they stopped before the training loop began" in capsys.readouterr().err
    # One process of this machine's (a sweep's or search's local run): no rank named (found from outside: "rank 0 on
    # local:" before its error).
    assert report([RankResult(0, "local", 2, "bigbatch: error: 2 of the last 4 model steps ...")]) == 2
    assert capsys.readouterr().err == "bigbatch: error: 2 of the last 4 model steps ...\n"


def test_a_rank_that_failed_of_its_own_accord_is_restarted_whatever_its_status():
    from bigbatch.launch import with_restarts

    def launches(*sessions):
        runs = iter(sessions)
        return lambda: next(runs)

    said = []
    # Found from a review: a rank ended by SIGINT (status 128 + 2 since ranks' statuses are passed on) was
    # taken for an interrupted launch and not restarted; a lost rank is a lost rank.
    status, _, _ = with_restarts(
        launches([result(0, -15, stopped=True), result(1, -2)], [result(0, 0)]), 1, said.append
    )
    assert status == 0 and "restarting every rank (1 of 1)" in said[-1]
    # An interrupted launch (the launcher stopped every rank) is not restarted: 130, as before.
    stopped = [result(0, -15, stopped=True), result(1, 0, stopped=True)]
    assert with_restarts(launches(stopped, [result(0, 0)]), 1, said.append)[0] == 130
    # A SIGTERM from outside to a rank as it starts stops the run, as one in its loop does (found from outside:
    # taken for the rank's failure, so --restarts trained the run to its end), said in one line of the launcher.
    lost = "bigbatch: error: lost contact with another rank ([gloo] Connection closed by peer)"
    asked = [result(0, 1, lost, ended=2.0), result(1, 143, "bigbatch: stopped by SIGTERM\n", ended=1.0)]
    status, message, _ = with_restarts(launches(asked, [result(0, 0)]), 1, said.append)
    assert status == 143 and message.startswith("rank 1 on tcp://h:1 was stopped by SIGTERM as it started, so every")


def test_a_sheet_names_the_kimg_its_checkpoint_folder_names():
    """A sheet's kimg equals the float of the checkpoint folder of the same kimg, so the two compare with ==."""
    from bigbatch.launch.handle import SampleSheet

    for kimg in ("000001.632", "000000.256", "000123.457", "001000.001"):
        sheet = SampleSheet(f"interp-{kimg}.png", b"")
        assert sheet.kimg == float(kimg) and sheet.kind == "interp"
    assert (
        repr(SampleSheet("grid-000001.000.png", b"\x89PNG" * 1000))
        == "SampleSheet('grid-000001.000.png', 4,000 bytes of PNG)"
    )
    assert SampleSheet("notes.png", b"").kimg != SampleSheet("notes.png", b"").kimg  # no kimg in the name: nan


def test_a_launched_rank_that_has_ended_ignores_a_late_sigterm(tmp_path):
    """The launcher signals every rank to stop a run, but the ranks stop together on the first signal:
    a rank that has already saved and ended must exit 0 when its own signal arrives late, as it exits.
    Outside a launched rank, SIGTERM keeps its meaning."""
    code = (
        "import os, signal\n"
        "from bigbatch import cli\n"
        "from bigbatch.signals import stop_signals\n"
        "with stop_signals():\n"
        "    pass  # the training loop\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print('after the loop', flush=True)\n"
        "cli.main(['--no-such-option'])\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print('after main', flush=True)\n"
    )
    rank = {**os.environ, "BIGBATCH_LAUNCH_PARENT": str(os.getpid())}
    out = subprocess.run([sys.executable, "-c", code], env=rank, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "after main" in out.stdout, out.stderr
    plain = {k: v for k, v in os.environ.items() if k != "BIGBATCH_LAUNCH_PARENT"}
    out = subprocess.run([sys.executable, "-c", code], env=plain, capture_output=True, text=True, timeout=120)
    assert out.returncode == -signal.SIGTERM and "after the loop" not in out.stdout


def test_ray_rank_counts_follow_the_cluster():
    gpus = {"CPU": 32.0, "GPU": 8.0}
    assert ray_ranks(gpus, None, None) == (8, 1.0)  # one rank per GPU
    assert ray_ranks(gpus, 4, None) == (4, 1.0)
    assert ray_ranks({"CPU": 4.0}, 2, None) == (2, 0.0)
    for resources, nprocs, per, words in [
        ({"CPU": 4.0}, None, None, r"give the number of CPU ranks \(--nprocs N, in Python nprocs=N\)"),
        ({"CPU": 4.0}, 5, None, "do not fit"),
        (gpus, 9, None, "do not fit"),
        (gpus, None, 2.0, "a rank trains on a GPU of its own"),
        (gpus, None, 0.5, r"must be 1 \(a rank trains on a GPU of its own\) or 0 \(CPU ranks\), got 0.5"),  # NCCL
        ({"CPU": 4.0}, 0, None, "--nprocs must be a number of ranks, 1 or more, got 0"),  # (it trained on all)
    ]:
        with pytest.raises(bigbatch.BigbatchError, match=words):
            ray_ranks(resources, nprocs, per)


@pytest.fixture(scope="module")
def dask_cluster():
    """A local Dask cluster of 2 single-threaded workers for this module's tests that launch on one: started
    once, as a start (workers' processes and imports) cost more than most of these runs; each test leaves it
    as it found it (its ranks ended)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")  # the workers' environment, which their ranks inherit
        cluster = local_cluster(2, dashboard_address=None)
    with cluster:
        yield cluster


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray instance of 2 CPUs for this module's tests that launch on one, this process connected to it:
    started once (its processes take tens of seconds to come up); its address is what `launch ray --address`
    takes. (`--local`, where the launcher starts its own, is tested by stopping such a launch.)"""
    ray = pytest.importorskip("ray")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")  # the actors' environment, which their ranks inherit
        ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, logging_level="ERROR")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def launch(scheduler, *command):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "bigbatch.cli", "launch", "dask", "--scheduler", scheduler, "--", *command]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def test_dask_workers_train_the_weights_of_one_process(tmp_path, dask_cluster, one_process_run):
    scheduler = dask_cluster.scheduler_address
    ok = launch(scheduler, "train", *ARGS, "train.batch=32", "train.micro_batch=8", "--run-dir", str(tmp_path / "dask"))
    assert ok.returncode == 0, ok.stderr[-3000:]
    bad = launch(scheduler, "train", "model.name=nope", "--run-dir", str(tmp_path / "bad"))
    stopped = stop_a_long_launch(tmp_path / "long", signal.SIGINT)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    # Said before a rank starts (it was each rank's line, once they had started).
    assert re.match(r"bigbatch: error: config key 'model.name' names no", bad.stderr)
    # Same batch, micro-batch and data as one process with accumulation 4: the same weights.
    dask = tmp_path / "dask" / "checkpoints" / "000000.256"
    for net in ("G", "D", "G_ema"):
        assert max_rel(one_process_run, dask, net) <= 1e-4, net
    assert '"world_size": 2' in (tmp_path / "dask" / "plan.json").read_text()
    # Ctrl-C in a terminal (SIGINT to the launcher's whole process group: its local Dask workers too, which
    # died of it with tracebacks, losing the ranks) stops every rank: they save one checkpoint together, exit 0.
    assert stopped.returncode == 0, (stopped.returncode, stopped.stderr[-3000:])
    assert "Traceback" not in stopped.stderr and "Stopped by signal; saved" in stopped.stdout
    assert "stopping every rank" in stopped.stderr  # (the ranks print on their workers' stdout)
    assert bigbatch.checkpoint_find.find_checkpoint(tmp_path / "long").name != "000000.000"
    # (SIGTERM to the whole group, which killed the workers too, is forwarded the same way: tested with Ray's.)


def stop_a_long_launch(run_dir, sig, engine="dask"):
    """`bigbatch launch ENGINE --local 2` of a long run, stopped by `sig` to its whole process group: as
    Ctrl-C in its terminal (SIGINT) or `timeout` and batch systems (SIGTERM) stop it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "bigbatch.cli", "launch", engine, "--local", "2", "--", "train", *ARGS]
    cmd += ["train.kimg=1000", "train.batch=32", "train.micro_batch=8", "--run-dir", str(run_dir)]
    # Its own process group, as a terminal's foreground job; started with SIGINT ignored, as a job a script
    # starts in the background inherits it (the launcher's forwarded Ctrl-C then stopped nothing).
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    # Rank 0's progress lines reach the launcher's output while it trains (not at the end).
    out_lines = []
    reader = threading.Thread(target=lambda: out_lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while not any(line.startswith("kimg ") for line in out_lines) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.2)
    live = [line for line in out_lines if line.startswith("kimg ")]
    os.killpg(proc.pid, sig)
    err = proc.stderr.read()
    proc.wait(timeout=180)
    reader.join(timeout=10)
    assert live and out_lines[0].startswith("Training digits"), (out_lines, err)  # seen while training ran
    return subprocess.CompletedProcess(cmd, proc.returncode, "".join(out_lines), err)


def test_ray_actors_train_the_weights_of_one_process(tmp_path, ray_cluster, one_process_run):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "bigbatch.cli", "launch", "ray", "--address", ray_cluster, "--nprocs", "2"]
    base = [*launch, "--", "train"]
    ok = subprocess.run(
        [*base, *ARGS, "train.batch=32", "train.micro_batch=8", "--run-dir", str(tmp_path / "ray")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "Done:" in ok.stdout  # rank 0's output reaches the launcher
    for net in ("G", "D", "G_ema"):
        assert max_rel(one_process_run, tmp_path / "ray" / "checkpoints" / "000000.256", net) <= 1e-4, net
    bad = subprocess.run(
        [*base, "model.name=nope", "--run-dir", str(tmp_path / "bad")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert re.match(r"bigbatch: error: config key 'model.name' names no", bad.stderr)  # (before Ray started)
    # SIGTERM to the launcher's process group (`timeout`, a batch system) reached Ray's own processes, which
    # shut down: the ranks saved, but the launcher waited a minute for Ray and failed. Now a clean stop.
    ended = stop_a_long_launch(tmp_path / "ended", signal.SIGTERM, "ray")
    assert ended.returncode == 0, (ended.returncode, ended.stderr[-3000:])
    assert "Stopped by signal; saved" in ended.stdout and "GCS" not in ended.stderr, ended.stderr[-3000:]
    assert bigbatch.checkpoint_find.find_checkpoint(tmp_path / "ended").name != "000000.000"


@pytest.mark.parametrize(
    "args, words",
    [
        (["launch", "dask", "--", "train"], "--scheduler tcp://HOST:8786) or --local N"),
        (["launch", "dask", "--local", "1"], "nothing to launch"),
        (["launch", "dask", "--local", "1", "--", "frobnicate"], "'frobnicate' is not a bigbatch command"),
        (["launch", "ray", "--", "train"], "--address auto or ray://HEAD:10001) or --local N"),
        (["launch", "dask", "--local", "1", "--restarts", "1", "--", "train"], "give it --resume=auto"),
        (["launch", "ray", "--local", "1", "--restarts", "-1", "--", "train"], "--restarts must be a count"),
        (["launch", "dask", "--local", "1", "--", "trian"], "'trian' is not a bigbatch command: did you mean 'train'?"),
        (["launch", "dask", "--local", "1", "--grace", "nan", "--", "train"], "--grace must be a number of seconds"),
        # (found from outside: each rank's error, once the cluster had started)
        (["launch", "ray", "--local", "1", "--", "train", "--preset", "nope"], "unknown preset 'nope'"),
        (["launch", "dask", "--local", "1", "--", "train", "train.batchh=3"], "unknown config key 'train.batchh'"),
        # (found from outside: prepare ran on every rank, the second refused the first's output; --resume's mistakes
        # said by each rank, 10 s on)
        (
            ["launch", "dask", "--local", "2", "--", "prepare", "builtin:digits", "p.h5"],
            "'prepare' runs once, not on every rank: run `bigbatch prepare ...` itself; launch runs train or eval",
        ),
        (["launch", "dask", "--local", "2", "--", "train", "--resume"], "--resume needs --run-dir naming the run"),
        (
            ["launch", "ray", "--local", "2", "--", "train", "--run-dir", "/nonexistent/run", "--resume"],
            "/nonexistent/run holds no run to resume",
        ),
    ],
)
def test_launcher_usage_errors_are_one_line(args, words, capsys):
    from bigbatch.cli import main

    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("bigbatch: error: ") and err.count("\n") == 1 and words in err, err


def test_a_launched_run_dir_is_the_launchers_not_each_workers(tmp_path, monkeypatch):
    # Found from outside: a relative --run-dir was resolved in each worker's folder, and named here as if in this one.
    from bigbatch.launch import absolute_run_dir

    monkeypatch.chdir(tmp_path)
    command = ["train", "--run-dir", "runs/a", "--run-dir=b", "--resume=auto", "--run-dir", "s3://b/r"]
    assert absolute_run_dir(command) == [
        "train", "--run-dir", str(tmp_path / "runs/a"), f"--run-dir={tmp_path / 'b'}", "--resume=auto", "--run-dir",
        "s3://b/r",
    ]  # fmt: skip
    for missing in (["train", "--run-dir"], ["train", "--run-dir", "--resume=auto"]):  # (argparse says what is missing)
        assert absolute_run_dir(missing) == missing


def test_an_address_that_is_not_a_dask_scheduler_is_one_line(capsys):
    # Found from outside: a service that answers Dask's handshake with other bytes (read as a frame length)
    # ended in a traceback of an allocation of exabytes.
    import socket

    from bigbatch.cli import main

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer():
        conn, _ = server.accept()
        conn.sendall((3 << 60).to_bytes(8, "little"))  # a frame of 3 EiB, as Dask reads it
        time.sleep(30)
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    assert main(["launch", "dask", "--scheduler", f"tcp://127.0.0.1:{port}", "--", "train"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bigbatch: error: cannot reach the Dask scheduler at tcp://127.0.0.1:{port}: it answered")
    assert err.count("\n") == 1 and "EiB" not in err, err  # (found from outside: an allocation of exabytes, said)
    server.close()


def test_what_is_not_an_open_dask_client_is_one_line(tiny, dask_cluster):
    # Found from outside: a LocalCluster (a notebook's common slip), its address, None or a closed Client gave
    # TypeError, AttributeError or KeyError from inside the launcher.
    from distributed import Client

    closed = Client(dask_cluster)
    closed.close()
    for given, says in [
        (dask_cluster, "got LocalCluster: give distributed.Client(cluster)"),
        (dask_cluster.scheduler_address, f"got str: give distributed.Client('{dask_cluster.scheduler_address}')"),
        (None, "got NoneType: give a distributed.Client"),
        (closed, "a Dask run: the Dask Client is closed: give an open one"),
    ]:
        with pytest.raises(bigbatch.BigbatchError, match=re.escape(says)):
            bigbatch.launch.dask.run(given, tiny, "r")
    with pytest.raises(bigbatch.BigbatchError, match="sweep's launcher takes a dask.distributed Client, got Local"):
        bigbatch.sweep(tiny, {"train.batch": [32]}, "runs", launcher=dask_cluster)
    with (
        Client(dask_cluster) as client,
        pytest.raises(bigbatch.BigbatchError, match="nprocs 3: the Dask cluster has 2"),
    ):
        bigbatch.sweep(tiny, {"train.batch": [32]}, "runs", launcher=client, nprocs=3)  # (before 32's plan for 3)


def test_a_ray_address_where_ray_does_not_answer_is_one_line_and_a_sigterm_while_ray_starts_ctrl_cs(monkeypatch):
    # Found from outside: `launch ray --address` at a web server's port waited for ever (Ray's GCS, or its client
    # server, speaks gRPC: it answers HTTP/2's preface); a SIGTERM while ray.init ran exited 15 through Ray's
    # handler, a local instance's processes left running.
    import http.server
    from concurrent import futures

    import grpc

    from bigbatch.launch import ray as launch

    web = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    with pytest.raises(bigbatch.BigbatchError, match="no Ray cluster answered at 127.0.0.1:.*something else listens"):
        launch.launch_ray(["train"], address=f"127.0.0.1:{web.server_address[1]}")
    web.shutdown()
    server = grpc.server(futures.ThreadPoolExecutor(1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    launch._reachable(f"ray://127.0.0.1:{port}")  # (a gRPC server: taken for Ray's)
    server.stop(None)
    shut = []

    def init(**options):
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # as ours would on a SIGTERM now...
        raise AssertionError("not interrupted")

    class Ray:  # ... and Ray's own, which ray.init puts in
        def init(self, **options):
            raise SystemExit(signal.SIGTERM)

        def shutdown(self):
            shut.append(True)

    monkeypatch.setattr(launch, "_ray", lambda: Ray())
    with pytest.raises(KeyboardInterrupt):
        launch.launch_ray(["train"], local=2)
    assert shut == [True]
    monkeypatch.setattr(Ray, "init", lambda self, **options: init(**options))
    with pytest.raises(KeyboardInterrupt):
        launch.launch_ray(["train"], local=2)


def test_a_local_cluster_whose_loop_was_slow_to_start_is_tried_again(monkeypatch):
    # Seen in CI on a loaded machine: Dask gives its event loop's thread 10 s, then a bare AssertionError.
    tries = []

    def slow_then_up(**options):
        tries.append(options)
        if len(tries) < 3:
            raise AssertionError
        return "cluster"

    monkeypatch.setattr(distributed, "LocalCluster", slow_then_up)
    monkeypatch.setattr(time, "sleep", lambda s: None)
    assert local_cluster(2) == "cluster" and len(tries) == 3 and tries[0]["n_workers"] == 2
    tries.clear()
    with pytest.raises(bigbatch.BigbatchError, match=r"did not start \(2 tries\): its event loop did not start"):
        local_cluster(2, attempts=2)


def _rank_processes(run_dir, rank):
    """PIDs of `bigbatch train` processes for `run_dir` whose RANK is `rank` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if str(run_dir).encode() in cmdline and b"bigbatch" in cmdline and f"RANK={rank}".encode() in env:
            found.append(int(entry))
    return found


def test_a_lost_rank_restarts_the_dask_group_which_resumes_to_the_same_weights(tmp_path, dask_cluster, uninterrupted):
    args = [*ARGS, *RESTART_ARGS]
    run = tmp_path / "restarted"
    address = dask_cluster.scheduler_address
    cmd = [sys.executable, "-m", "bigbatch.cli", "launch", "dask", "--scheduler", address, "--grace", "5"]
    cmd += ["--restarts", "1", "--", "train", *args, "--run-dir", str(run), "--resume=auto"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, killed = time.monotonic() + 240, False
    while not killed and time.monotonic() < deadline and proc.poll() is None:
        if (run / "checkpoints" / "000000.256" / "meta.json").exists():
            for pid in _rank_processes(run, 1):
                os.kill(pid, signal.SIGKILL)  # the rank dies mid-run, between two checkpoints
                killed = True
        time.sleep(0.05)
    out, err = proc.communicate(timeout=300)
    assert killed and proc.returncode == 0, err[-3000:]
    assert "restarting every rank (1 of 1)" in err
    assert "Traceback" not in err  # rank 0's broken collective is one line too (and the launcher's names rank 1)
    whole = uninterrupted / "checkpoints" / "000000.512"
    for net in ("G", "D", "G_ema"):
        assert (run / "checkpoints" / "000000.512" / f"{net}.safetensors").read_bytes() == (
            whole / f"{net}.safetensors"
        ).read_bytes(), net


def test_a_dask_run_from_python_streams_rows_and_sheets_stops_resumes_and_sweeps_side_by_side(
    tiny, tmp_path, capsys, dask_cluster
):
    from bigbatch.launch.dask import run

    long = tiny.override({"train.kimg": 1000, "train.log_every_kimg": 0.064, "sample.every_kimg": 0.128})
    path = tmp_path / "live"
    with distributed.Client(dask_cluster) as client:
        handle = run(client, long, path, nprocs=2)
        rows, sheets = [], []
        for update in handle.updates(timeout=120):  # while it trains: rows and sheets as they are written
            rows += [update.row] if update.row else []
            sheets += [update.sheet] if update.sheet else []
            if rows and rows[-1]["kimg"] >= 0.256 and sheets and not handle._stop.is_set():
                handle.stop(wait=False)  # every rank saves a checkpoint and exits
        stopped = handle.result()
        assert stopped.status == 0 and stopped.stopped and 0.256 <= stopped.final["kimg"] < 1000
        assert rows == stopped.rows == read_metrics(path / "metrics.jsonl")
        saved = float(bigbatch.checkpoint_find.find_checkpoint(path).name)  # where the stop found it
        assert stopped.final["kimg"] <= saved < stopped.final["kimg"] + 0.064
        assert sheets[-1] == handle.sheet and (path / "samples" / handle.sheet.name).read_bytes() == handle.sheet.png
        assert handle.sheet.image().size[0] > 16 and handle.sheet.kimg == saved  # the sheets of the stop
        assert any(line.startswith("Stopped by signal; saved") for line in handle.lines[-5:])  # (a list: it slices)

        # The same call resumes it: a new handle yields the run's whole history, each row once.
        end = saved + 0.128  # (float noise and all: kimg counts whole images)
        again = run(client, long.override({"train.kimg": end}), path, nprocs=2)
        every = [u.row for u in again if u.row]
        resumed = again.result()
        assert every == resumed.rows == read_metrics(path / "metrics.jsonl") and not resumed.stopped
        assert every[: len(rows)] == rows and every[-1]["kimg"] == pytest.approx(end)
        with pytest.raises(bigbatch.BigbatchError, match="takes a bigbatch.Config"):
            run(client, "digits", tmp_path / "bad")

        # A sweep on the cluster: one run per worker, side by side (both start before either ends).
        grid = {"train.batch": [16, 32]}
        capsys.readouterr()
        base = tiny.override({"train.kimg": 0.256})
        results = bigbatch.sweep(base, grid, tmp_path / "sweep", launcher=client, quiet=False)
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("bigbatch sweep:")]
    assert said[:2] == ["bigbatch sweep: starting batch=16", "bigbatch sweep: starting batch=32"], said
    assert sorted(said[2:]) == ["bigbatch sweep: batch=16 ended", "bigbatch sweep: batch=32 ended"], said
    assert [(r["train.batch"], r["status"], r["kimg"]) for r in results] == [
        (16, "finished", 0.256),
        (32, "finished", 0.256),
    ]


def test_a_ray_run_from_python_streams_rows_and_a_sweep_runs_side_by_side(tiny, tmp_path, ray_cluster):
    from bigbatch.launch.ray import run

    short = tiny.override({"train.kimg": 0.256, "train.log_every_kimg": 0.064})
    handle = run(short, tmp_path / "live", nprocs=2)  # on the Ray instance this process is connected to
    rows = [u.row for u in handle.updates(timeout=120) if u.row]
    result = handle.result()
    assert result.status == 0 and not result.stopped and result.final["kimg"] == 0.256 and "loss_D" in result.final
    assert rows == result.rows == read_metrics(tmp_path / "live" / "metrics.jsonl")
    assert handle.sheets.keys() >= {"grid"} and handle.sheet.kimg == 0.256

    grid = {"train.g_lr": [1e-4, 2e-4]}
    results = bigbatch.sweep(short, grid, tmp_path / "sweep", launcher="ray")
    assert [(r["train.g_lr"], r["status"], r["kimg"]) for r in results] == [
        (1e-4, "finished", 0.256),
        (2e-4, "finished", 0.256),
    ]


def test_rows_trained_again_after_a_restart_are_not_updates_again():
    # Found from outside: after a restart, each row past the checkpoint came again as an update (the same values
    # trained again, bit for bit, but for their timings), and a plot went back in kimg.
    from bigbatch.launch.handle import RunHandle

    rows = [{"kimg": 0.1, "loss": 1.0, "seconds": 1.0}, {"kimg": 0.2, "loss": 0.5, "seconds": 2.0, "img_per_s": 9}]

    def session(sink, stop):
        again = {**rows[1], "seconds": 7.0, "img_per_s": 3}
        sink([("row", rows[0]), ("row", rows[1]), ("reset", None), ("row", rows[0]), ("row", again)])
        sink([("row", {"kimg": 0.3, "loss": 0.4, "seconds": 8.0}), ("reset", None), ("row", rows[0])])
        sink([("row", {"kimg": 0.2, "loss": 0.6, "seconds": 9.0})])  # (another value: a row of its own)
        return []

    handle = RunHandle("run", session)
    assert [(u.row["kimg"], u.row["loss"]) for u in handle.updates(timeout=10)] == [
        (0.1, 1.0), (0.2, 0.5), (0.3, 0.4), (0.2, 0.6)
    ]  # fmt: skip
    assert [r["loss"] for r in handle.rows] == [1.0, 0.6]  # (the rows a resume dropped are dropped)
    again = {**rows[1], "seconds": 7.0}
    handle = RunHandle("run", lambda sink, stop: sink([("row", rows[1]), ("reset", None), ("row", again)]) or [])
    assert len(list(handle.updates(timeout=10))) == 1 and handle.rows == [again]  # (the file's row, its timings too)


def test_a_local_run_stopped_in_its_start_up_gives_its_result(tiny, tmp_path):
    # Found from outside: stop() a moment after local.run raised "not every rank ended cleanly" for the stop asked
    # for; nothing had trained, nothing is lost, and the result says it stopped before it could save.
    from bigbatch.launch import local

    handle = local.run(tiny.override({"train.kimg": 1000}), tmp_path / "run", env={"OMP_NUM_THREADS": "1"})
    stopped = handle.stop(timeout=120)
    assert stopped.status in (0, 130, 143) and stopped.stopped  # (found from outside: unsaid, as a finished run)
    assert stopped.status == 0 or not bigbatch.checkpoints.complete_checkpoints(tmp_path / "run")
