"""The bench scripts refuse a bad command line in one line (argparse's, or bigbatch's own error) with exit status
2: no traceback, no hang, no table of nonsense."""

import contextlib
import io
import json
import os
import runpy
import sys
import time
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).parent.parent


def refused(*argv: str) -> str:
    """Run bench/ARGV[0] with the rest, as `python bench/ARGV[0] ...` in the repository would, but in this process
    (each a new Python took seconds of the suite to import torch); the one error line it gave (after it exited with
    status 2, not by an exception). What a script sets for itself (OMP_NUM_THREADS, torch's threads, signal
    handlers) is put back, for the tests after it in this process."""
    import signal

    import torch

    script = ROOT / "bench" / argv[0]
    err = io.StringIO()
    threads, handlers = torch.get_num_threads(), {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with (
        contextlib.chdir(ROOT),
        mock.patch.dict(os.environ),
        mock.patch.object(sys, "argv", [str(script), *argv[1:]]),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(err),
        pytest.raises(SystemExit) as ended,
    ):
        try:
            runpy.run_path(str(script), run_name="__main__")
        finally:
            torch.set_num_threads(threads)
            for s, handler in handlers.items():
                signal.signal(s, handler)
    assert ended.value.code == 2, err.getvalue()[-3000:]
    errors = [line for line in err.getvalue().splitlines() if ": error: " in line]
    assert len(errors) == 1, err.getvalue()[-3000:]
    return errors[0]


@pytest.mark.parametrize(
    "argv, said",
    [
        (["checksum.py", "--gib", "0"], ["--gib", "above 0"]),
        (["checksum.py", "--gib", "-1"], ["--gib", "above 0"]),
        (["time_to_accuracy.py", "--seeds", "x"], ["--seeds", "'0-4'"]),
        (["time_to_accuracy.py", "--seeds", "3-1"], ["--seeds", "first to last"]),
        (["time_to_accuracy.py", "--threads", "0"], ["--threads", "1 or more"]),
        (["resample.py", "--repeats", "0"], ["--repeats", "1 or more"]),
        (["resample.py", "--channels", "x"], ["--channels", "comma-separated whole numbers"]),
        (["resample.py", "--precisions", "fp16"], ["--precisions", "'fp16'", "fp32, bf16"]),
        (["frozen_step.py", "--steps", "0"], ["--steps", "1 or more"]),
        (["throughput.py", "--checkpointing", "maybe"], ["--checkpointing", "'maybe'", "off, on"]),
        (["throughput.py", "--preset", "nosuch"], ["bigbatch: error:", "unknown preset 'nosuch'"]),
        (["throughput.py", "--micro", "48"], ["bigbatch: error:", "train.micro_batch"]),
        (["digits_quality.py", "run", "--n-per-class", "0"], ["--n-per-class", "1 or more"]),
        (["digits_quality.py", "/nonexistent/run"], ["bigbatch: error:", "/nonexistent/run"]),
        (["data.py", "--workers", "x"], ["--workers", "comma-separated whole numbers"]),
        (["storage.py", "--n", "0"], ["--n", "1 or more"]),
        # Found from outside: tracebacks, some after the benchmark had begun.
        (["attention.py", "--device", "nope"], ["--device", "'nope' is not a device"]),
        (["memory.py", "--budgets", "abc"], ["--budgets", "numbers above 0"]),
        (["memory.py", "--budgets", "0"], ["--budgets", "numbers above 0"]),
        (["memory.py", "--at", "4,4"], ["--at", "two different micro-batches"]),
        (["memory.py", "--batch", "0"], ["--batch", "1 or more"]),
        (["memory.py", "--batch", "6", "--at", "4,8"], ["--at", "at most --batch 6, got 8"]),  # (found from outside)
        (["cpu_resident.py", "--micro", "1"], ["--micro", "2 or more"]),
        (["memory.py", "--preset", "nosuch"], ["bigbatch: error:", "unknown preset 'nosuch'"]),
        (["roofline.py", "--quick", "--tflops", "0"], ["--tflops", "give a number above 0"]),
        (["roofline.py", "--quick", "--measured", "x=1"], ["unknown work x"]),
        (["roofline.py", "--quick", "--micro", "stylegan2=3"], ["--micro stylegan2=3 does not divide its batch of 64"]),
        (["roofline.py", "--quick", "--micro", "resnet50=8"], ["its step is counted as one micro-batch"]),
        (["compile_start.py", "model.nosuch=3"], ["bigbatch: error:", "unknown config key 'model.nosuch'"]),
        (["swap_quality.py", "/nonexistent/run"], ["bigbatch: error:", "/nonexistent/run"]),
        # Found from outside: a worker's ModuleNotFoundError in a log, exit 1.
        (["vs_biggan.py", "--biggan", "/nonexistent"], ["--biggan", "no BigGAN.py in", "BigGAN-PyTorch"]),
        (["vs_stylegan2.py", "--ada", "/nonexistent"], ["--ada", "no training/networks.py", "stylegan2-ada-pytorch"]),
        (["vs_dfl.py", "--dfl", "/nonexistent"], ["--dfl", "no models/Model_SAEHD/Model.py", "DeepFaceLab checkout"]),
        # (found from outside: this code's figures labelled as another checkout's, or a traceback)
        (["world_size.py", "--before", "/nonexistent"], ["--before /nonexistent holds no bigbatch/", "checkout"]),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) and v[0].endswith(".py") else None,
)
def test_a_bad_argument_is_one_line_and_status_2(argv, said):
    line = refused(*argv)
    assert all(word in line for word in said), line


def test_no_jobs_is_refused_at_once_not_waited_on_forever():
    start = time.perf_counter()
    assert "--jobs" in refused("time_to_accuracy.py", "--jobs", "0")
    assert time.perf_counter() - start < 30


def test_one_fastai_run_given_twice_is_refused(tmp_path):
    # fastai-t1-s0.json and fastai-t1-s0-again.json from one glob: seed 0 would count twice ("2/2 seeds").
    rows = [{"epoch": 1, "kimg": 1.0, "wall_s": 10.0, "cpu_s": 9.0, "top1": 91.0}]
    run = {"fastai": "2.8.12", "args": {"seed": 0, "threads": 1}, "rows": rows}
    files = [tmp_path / "fastai-t1-s0.json", tmp_path / "fastai-t1-s0-again.json"]
    for f in files:
        f.write_text(json.dumps(run))
    (tmp_path / "ours.json").write_text("[]")  # (--results: run nothing, table the files)
    line = refused("time_to_accuracy.py", "--results", str(tmp_path / "ours.json"), "--fastai", *map(str, files))
    assert "seed 0" in line and "given twice" in line


def test_a_cuda_device_on_a_machine_without_one_is_refused_as_the_line_is_read():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    for script in ("attention.py", "channels_last.py", "metrics.py", "memory.py"):
        assert "no CUDA GPU here: give --device cpu" in refused(script, "--device", "cuda")


def test_a_rehearsal_stopped_stops_the_command_it_runs(tmp_path):
    # Found from outside: bench/rehearsal.py under `timeout` (or Ctrl-C) left its `bigbatch train`, a session of its
    # own, training with no parent.
    import signal
    import subprocess

    child = "import os, time; open('pid', 'w').write(str(os.getpid())); time.sleep(60)"
    script = (
        f"import sys, signal; sys.path.insert(0, {str(ROOT / 'bench')!r}); import rehearsal; from pathlib import Path; "
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143)); "
        f"rehearsal.run([sys.executable, '-c', {child!r}], Path('.'))"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path)
    for _ in range(300):
        if (tmp_path / "pid").is_file() and (tmp_path / "pid").read_text():
            break
        time.sleep(0.05)
    pid = int((tmp_path / "pid").read_text())
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=30) == 143
    with pytest.raises(ProcessLookupError):
        for _ in range(100):
            os.kill(pid, 0)
            time.sleep(0.05)
