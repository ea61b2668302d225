"""Where benchmark scripts put their tables (found from outside, a user reproducing README's benchmarks): a dry
run appends to no file unless asked, and a table whose file cannot be written is refused before it is measured."""

from __future__ import annotations

import os
import subprocess
import sys

from test_bench_gpu import REPO, _copy_of_repo, _files


def test_a_dry_run_without_out_prints_its_table_and_appends_to_no_file(tmp_path):
    # A toy run on a CPU appended its section to the repository's own bench/RESULTS.md.
    repo = _copy_of_repo(tmp_path / "repo")
    before = _files(repo)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "bench/gpu.py", "--device", "cpu", "--dry-run", "--parts", "resample"]
    run = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "## GPU proof, " in run.stdout and "| resample |" in run.stdout
    assert "a dry run's table appends to no file unless --out names one" in run.stderr
    assert _files(repo) == before


def test_a_table_whose_file_cannot_be_written_is_refused_before_it_is_measured(tmp_path):
    # throughput_all.py measured for half an hour, then lost its table to a traceback writing --out; gpu.py and
    # gpu_check.py so too, after the whole of a GPU's time (found from outside).
    for script, out, said in (
        ("throughput_all.py", tmp_path / "none" / "x.md", f"its folder {tmp_path / 'none'} does not exist"),
        ("gpu.py", tmp_path, "is a folder: give the file to append the table to"),
        ("gpu_check.py", "s3://bucket/x.md", "is a URL, and a benchmark writes local files"),
    ):
        cmd = [sys.executable, str(REPO / "bench" / script), "--device", "cpu", "--dry-run", "--out", str(out)]
        run = subprocess.run(cmd[:2] + cmd[-2:] if script == "throughput_all.py" else cmd, capture_output=True,
                             text=True, timeout=120)  # fmt: skip
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
        last = run.stderr.strip().splitlines()[-1]
        assert last.startswith(f"{script}: error: argument --out: ") and said in last, last
