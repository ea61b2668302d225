"""bench/gpu.py, the GPU proof in one command: its CPU dry run takes every part through the code the GPU
run takes (toy sizes), and a part that fails or hangs becomes a row saying so."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).parent.parent
sys.path.insert(0, str(REPO / "bench"))

PEAK = re.compile(r"\d+\.\d+ (KiB|MiB|GiB)")
PLAN = re.compile(r"(\d+) × (\d+)")


def _copy_of_repo(root: Path) -> Path:
    """What the dry run reads of the repository (bench/, the CUDA tests, pytest's settings) copied to
    `root`: run there, it can be checked for writes while others edit the repository."""
    shutil.copytree(REPO / "bench", root / "bench", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "tests").mkdir()
    for name in ("tests/conftest.py", "tests/test_cuda.py", "pyproject.toml"):
        shutil.copy(REPO / name, root / name)
    return root


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def test_dry_run_on_cpu_appends_every_part_with_numbers(tmp_path):
    import gpu

    out = tmp_path / "RESULTS.md"
    out.write_text("# Benchmark results\n\nAn earlier section.\n")
    repo = _copy_of_repo(tmp_path / "repo")
    before = _files(repo)
    # One thread per process: on a shared 2-core machine, two threads waiting on each other behind other work
    # made the dry run twice as slow.
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "bench/gpu.py", "--device", "cpu", "--dry-run", "--out", str(out)]
    run = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]

    text = out.read_text()
    assert text.startswith("# Benchmark results\n\nAn earlier section.\n\n## GPU proof, ")  # appended, not clobbered
    assert text.endswith(run.stdout)  # what it printed is what it appended
    heading = re.search(r"^## GPU proof, (\d{4}-\d\d-\d\d), (.+) \(dry run", text, re.M)
    assert heading and re.search(r", 1 thread$", heading.group(2))  # the device's name: this CPU's
    assert f"`python bench/gpu.py --device cpu --dry-run --out {out}`" in text
    # The sources it measured, by a digest that a checkout prints (git's metadata can be stale where it ran).
    digest = subprocess.run([sys.executable, "bench/gpu.py", "--digest"], cwd=repo, capture_output=True, text=True)
    assert re.fullmatch(r"[0-9a-f]{12}\n", digest.stdout) and f"sources {digest.stdout.strip()} " in text
    edited = _copy_of_repo(tmp_path / "edited")
    (edited / "bench" / "resample.py").write_text((edited / "bench" / "resample.py").read_text() + "# an edit\n")
    other = subprocess.run([sys.executable, "bench/gpu.py", "--digest"], cwd=edited, capture_output=True, text=True)
    assert re.fullmatch(r"[0-9a-f]{12}\n", other.stdout) and other.stdout != digest.stdout
    rows = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| part |"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells
    assert set(rows) == set(gpu.PARTS)
    for name, (_, _, plan, img_s, s_iter, peak, seconds, note) in rows.items():
        assert "**" not in note, f"{name}: {note}"  # errors are shown in bold
        assert float(seconds) >= 0
        if name.startswith("cuda-tests"):  # no GPU here: every one skips (those of the other part deselected)
            assert re.fullmatch(r"\d+ skipped, \d+ deselected in [\d.]+s", note), note
            continue
        if name.endswith("-profile"):  # the device's (here the CPU's) busy share, by kind of op and by op
            # (the top op may be autograd's own, AccumulateGrad or LeakyReluBackward0, on a loaded machine: seen in
            # the suite)
            assert re.match(
                r"CPU busy \d+ of \d+ ms .*; by kind: .*convolutions \d+%.*; top ops: `[\w:]+` [\d.]+ ms", note
            ), note
            continue
        if name == "waits":  # what synchronizes an iteration with the device, per model (nothing on a CPU)
            models = ("BigGAN-128 bf16", "StyleGAN2 paper256 bf16", "ResNet-50 bf16")
            assert note == "; ".join(f"{m}: - (no CUDA here: nothing synchronizes)" for m in models), note
            continue
        if name == "attention":  # the formula's and attend's time, peak and error, per layer and precision
            cell = r"[GD] 16 px (fp32|bf16): [\d.]+ / [\d.]+ ms, [\d.]+ \w?i?B / [\d.]+ \w?i?B, error \d\.?\d?e-\d\d / "
            assert len(re.findall(cell, note)) == 4, note
            continue
        if name == "resample":  # two ops over one, per layer
            assert re.match(r"D 32 px ×4: \d+\.\d\d; D 16 px ×4: \d+\.\d\d; G 32 px ×4: \d+\.\d\d;", note), note
            continue
        if name == "fir":  # StyleGAN2's filter each way, ms per layer
            cell = r"[DG] (16|8) px ×32: [\d.]+( / [\d.]+){5}(;|$)"
            ways = "grouped / nchw / separable / one-channel / fused / fused+act"
            assert len(re.findall(cell, note)) == 4 and ways in rows[name][1], note
            continue
        assert float(img_s) > 0 and float(s_iter) > 0, name
        if name == "resnet50-fed":  # each way of feeding it against the same step on a batch in memory
            way = r"{} \(\d+ workers\) \d+ img/s = \d+%"
            fed = ", ".join(way.format(d) for d in ("cpu", "gpu", "nvimgcodec"))
            assert re.match(rf"a batch in memory \d+ img/s; fed, data.decode {fed}$", note), note
            continue
        assert PEAK.fullmatch(peak), f"{name}: {peak}"
        assert name.startswith("jpeg-decode") or PLAN.fullmatch(plan), f"{name}: {plan}"  # decoding has no plan
    # The toy budgets are small enough that micro_batch "auto" splits the batch: the probing path ran.
    for name in ("biggan-plan-fp32", "biggan-plan-bf16", "saehd512"):
        assert int(PLAN.fullmatch(rows[name][2]).group(2)) > 1, rows[name]
    assert "train.compile" in rows["biggan-bf16-compile"][1] and "graphs" in rows["biggan-bf16-compile"][7]
    # Compiled again in a new process: how long its first iteration took, and what came from the compile cache.
    for again in (rows["biggan-bf16-compile-again"], rows["resnet50-compile-again"]):
        assert "again in a new process" in again[1]
        assert re.match(r"first iteration [\d.]+ s \(\d+ of \d+ Inductor graphs from the cache\)", again[7]), again
    assert "channels_last" in rows["resnet50"][7]
    for name in ("biggan-fp32", "biggan-bf16", "resnet50"):  # achieved FLOP/s against the peak measured beside them
        shares = r"\d+\.\d\d TFLOP/s, (\d+% of \d+\.\d measured|no native bf16 here)"  # (a CPU without AVX-512)
        assert re.search(shares, rows[name][7]) and (name == "biggan-fp32") <= ("% of " in rows[name][7]), rows[name]
    decode = rows["jpeg-decode"][7]
    assert "OpenCV standing in for nvJPEG" in decode and "as fast as the CPU path" in decode
    stages = r"the decoder alone \d+ img/s, .* reading the crops' bytes \(a loader worker's part\) \d+ img/s a process"
    assert re.search(stages, decode), decode
    assert re.match("nvImageCodec's CPU decoder: the decoder alone", rows["jpeg-decode-nvimgcodec"][7])
    # Nothing under the repository it ran in changed: not its RESULTS.md, no new files (data went to /tmp).
    assert _files(repo) == before


def test_a_part_that_fails_or_hangs_is_a_row_that_says_so(tmp_path):
    import _gpu_report
    import gpu

    crashed = gpu.run_part([sys.executable, "-c", "raise SystemExit(3)"], limit=60)
    assert "exit status 3" in crashed["error"]
    hung = gpu.run_part([sys.executable, "-c", "import time; time.sleep(60)"], limit=1)
    assert hung["error"] == "timed out after 1 s" and hung["seconds"] < 30
    # A compiling part cut at its limit says how far it had got (the progress its CompileLog wrote).
    progress = "{'what': 'compiling graph 3 (dynamo, 2/0)', 'at': 1.2, 'compile_s': 1.0}"
    compiling = "import json, sys, time, pathlib; pathlib.Path(sys.argv[1]).with_suffix('.progress').write_text("
    compiling += f"json.dumps({progress})); time.sleep(60)"
    cut = gpu.run_part([sys.executable, "-c", compiling], limit=3)  # (a Python without imports: writes at once)
    assert cut["error"] == "timed out after 3 s; at 1 s: compiling graph 3 (dynamo, 2/0)", cut
    # One cut while it wrote (its progress half there) is still a row, not the whole proof's end.
    half = "import sys, time, pathlib; pathlib.Path(sys.argv[1]).with_suffix('.progress').write_text('{\"wh');"
    cut = gpu.run_part([sys.executable, "-c", half + "time.sleep(60)"], limit=3)
    assert cut["error"] == "timed out after 3 s; its progress file unreadable", cut
    write = "import json, sys; open(sys.argv[1], 'w').write(json.dumps({'note': 'ran'}))"
    assert gpu.run_part([sys.executable, "-c", write], limit=60)["note"] == "ran"
    table = _gpu_report.table({"ok": {"setting": "s", "img_per_s": 2.0, "peak": 3 * 2**20}, "bad": hung})
    assert "| ok | s | - | 2.0 | - | 3.0 MiB | - |  |" in table
    assert "| bad | - | - | - | - | - | " in table and "**timed out after 1 s**" in table

    out = tmp_path / "RESULTS.md"
    out.write_text("# Results\n\nkept\n")
    out.chmod(0o664)
    _gpu_report.append_section(out, "## New\n\nrow\n")
    assert out.read_text() == "# Results\n\nkept\n\n## New\n\nrow\n"
    assert out.stat().st_mode & 0o777 == 0o664
    assert [p.name for p in tmp_path.iterdir()] == ["RESULTS.md"]  # no temporary file left beside it


def test_a_stopped_proof_still_appends_the_rows_of_the_parts_that_ended(tmp_path):
    # Found on a GPU: a `timeout` a few seconds short of --budget ended the proof before its table, every row lost.
    out = tmp_path / "RESULTS.md"
    cmd = [sys.executable, str(REPO / "bench" / "gpu.py"), "--device", "cpu", "--dry-run", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([*cmd, "--parts", "attention,resample"], env=env, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # (the parts run in the order given)
        if line.startswith("[bench/gpu.py] resample ("):  # attention has ended; resample is under way
            proc.send_signal(signal.SIGTERM)
            break
    proc.stderr.read()
    assert proc.wait(timeout=60) == 143
    rows = {line.split(" | ")[0][2:]: line for line in out.read_text().splitlines() if line.startswith("| ")}
    assert "G 16 px fp32: " in rows["attention"] and "**" not in rows["attention"]  # (its figures; no error)
    assert "stopped by a signal at" in rows["resample"]


def test_the_one_call_of_a_gpu_session_runs_the_proof_then_the_check_in_the_time_given(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "DRY": "1", "PARTS": "resample", "STEPS": "--only make-data", "PYTHON": sys.executable}
    env["SHARE"] = "62"  # (default 100: the proof alone)
    env["OMP_NUM_THREADS"] = "1"
    run = subprocess.run(["bash", str(REPO / "bench" / "gpu_session.sh"), "300", str(out)], env=env, timeout=280)
    assert run.returncode == 0, (out / "gpu.log").read_text()[-2000:] + (out / "check.log").read_text()[-2000:]
    text = (out / "RESULTS.md").read_text()
    assert text.index("## GPU proof, ") < text.index("## GPU check, ")
    assert "| resample |" in text and "| make-data |" in text
    budget = int(re.search(r"--budget (\d+) --parts resample", text).group(1))
    # (62% of the 300 s left after the preflight, less the stop's margins; the preflight took ~14 s and more on a
    # loaded machine: 140 seen)
    assert 100 < budget <= 186 - 35
    assert "bench/gpu.py: exit status 0 at" in (out / "gpu.log").read_text()
    assert "bench/gpu_check.py: exit status 0 at" in (out / "check.log").read_text()
    assert {p.name for p in out.iterdir()} == {"RESULTS.md", "gpu.log", "check.log", "check-logs.tgz", "machine.txt"}


def test_a_sessions_two_calls_run_gpu_py_parts_each_once_and_a_third_is_refused(tmp_path):
    import gpu

    script = REPO / "bench" / "gpu_session.sh"
    text = script.read_text()
    choose = text[text.index("\nFIRST=") : text.index("esac\n") + 5] + 'echo "$PARTS"\n'  # (the script's own lines)
    calls = []
    for call in ({}, {"CALL": "2"}):
        run = subprocess.run(["bash", "-c", choose], env={**os.environ, **call}, capture_output=True, text=True)
        calls.append(run.stdout.strip().split(","))
    first, second = calls
    assert set(first) <= set(gpu.PARTS) and set(second) <= set(gpu.PARTS) and not set(first) & set(second)
    assert "stylegan2-bf16-profile" in first and not set(first) & gpu.IN_TURNS  # (eager: nothing compiles at length)
    assert second[:2] == ["resnet50-compile", "resnet50-compile-again"] and "cuda-tests-compile" in second
    env = {**os.environ, "DRY": "1", "CALL": "3", "PYTHON": sys.executable}
    run = subprocess.run(["bash", str(script), "300", str(tmp_path)], env=env, capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr == "gpu_session: CALL is 1 or 2, not 3\n"


def test_a_stopped_gpu_session_stops_its_script_which_still_writes_its_table(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "DRY": "1", "PARTS": "attention,resample", "SHARE": "62", "PYTHON": sys.executable}
    env["OMP_NUM_THREADS"] = "1"
    session = subprocess.Popen(["bash", str(REPO / "bench" / "gpu_session.sh"), "300", str(out)], env=env)
    deadline = time.monotonic() + 120
    while "[bench/gpu.py] resample (" not in _text(out / "gpu.log") and time.monotonic() < deadline:
        time.sleep(0.1)
    session.send_signal(signal.SIGTERM)
    assert session.wait(timeout=60) != 0
    rows = {line.split(" | ")[0][2:]: line for line in _text(out / "RESULTS.md").splitlines() if line.startswith("| ")}
    assert "G 16 px fp32: " in rows["attention"] and "stopped by a signal" in rows["resample"]
    assert "exit status 143" in _text(out / "gpu.log") and "not run" in _text(out / "check.log")


def _text(path):
    return path.read_text() if path.exists() else ""


def test_a_fork_servers_processes_are_what_new_pythons_would_be(tmp_path):
    # The CPU dry runs start their processes as forks of one that has done their imports (_procs.ForkServer):
    # each must run as `python ARGS` would, in its own folder, environment, files and session, and end the same.
    import signal

    from _procs import ForkServer, run_limited

    (tmp_path / "script.py").write_text(
        "import atexit, os, sys\n"
        "atexit.register(lambda: print('at exit'))\n"
        "print(__name__, sys.argv, sys.path[0] == os.path.dirname(__file__), os.getcwd(), os.environ.get('X'))\n"
        "print('preloaded' if 'decimal' in sys.modules else 'imported', os.getpgid(0) == os.getpid(), flush=True)\n"
        "sys.exit(int(sys.argv[1]))\n"
    )
    (tmp_path / "mod.py").write_text("import sys\nprint(__name__, sys.argv[1:])\nraise SystemExit('said so')\n")
    log = tmp_path / "log"

    def run(*args, limit=60, **options):
        with open(log, "w") as out:
            options = {"stdout": out, "stderr": subprocess.STDOUT, **options}
            status, seconds = run_limited([sys.executable, *args], limit, popen=forks.popen, **options)
        return status, log.read_text()

    with ForkServer(["decimal"]) as forks:
        env = {**os.environ, "X": "set"}
        status, said = run(str(tmp_path / "script.py"), "3", env=env, cwd=tmp_path / "..")
        assert status == 3, said
        assert said.splitlines() == [
            f"__main__ ['{tmp_path / 'script.py'}', '3'] True {tmp_path.parent} set",
            "preloaded True",
            "at exit",
        ]
        status, said = run("-m", "mod", "a", cwd=tmp_path)
        assert (status, said) == (1, "__main__ ['a']\nsaid so\n")
        status, said = run("-c", "raise ValueError('broke')")
        assert status == 1 and said.startswith("Traceback") and said.endswith("ValueError: broke\n"), said
        status, _ = run("-c", "import time; time.sleep(60)", limit=1)
        assert status is None  # killed at its limit
        sleeper = forks.popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        os.kill(sleeper.pid, signal.SIGTERM)
        assert sleeper.wait(timeout=30) == -signal.SIGTERM and sleeper.poll() == -signal.SIGTERM


def test_compile_parts_compile_at_once_and_are_timed_one_at_a_time(tmp_path):
    # Compiling is minutes of host work a part; the parts do it side by side, and no part's timed iterations
    # run beside another's work.
    import threading

    import gpu

    part = tmp_path / "part.py"  # a part's process: warm after some seconds, then timed alone when let go
    part.write_text(
        "import json, sys, time, pathlib\n"
        "turns, out = pathlib.Path(sys.argv[-2]), pathlib.Path(sys.argv[-1])\n"
        "name, warm_after = sys.argv[1], float(sys.argv[2])\n"
        "time.sleep(warm_after)\n"
        "warm = time.time()\n"
        "(turns / f'{name}.warm').touch()\n"
        "while not (turns / f'{name}.go').exists():\n"
        "    time.sleep(0.01)\n"
        "t0 = time.time(); time.sleep(0.5)\n"
        "go = (turns / f'{name}.go').read_text()\n"
        "out.write_text(json.dumps({'warm': warm, 'timed': [t0, time.time()], 'argv': sys.argv[3:-2], 'go': go}))\n"
    )
    cmds = {
        "slow": [sys.executable, str(part), "slow", "1.5"],
        "fast": [sys.executable, str(part), "fast", "0.1"],
        "crash": [sys.executable, "-c", "raise SystemExit(3)"],
    }
    t = time.perf_counter()
    rows = gpu.run_in_turns(cmds, limit=10 * gpu.TURN_S)
    assert time.perf_counter() - t < 30
    assert rows["crash"]["error"] == "its process ended with exit status 3, no result"  # and it blocked nobody
    slow, fast = rows["slow"], rows["fast"]
    assert slow["argv"] == fast["argv"] == ["--turns"]  # the parts were told of their turns
    both_warm = max(slow["warm"], fast["warm"])
    assert slow["timed"][0] >= both_warm and fast["timed"][0] >= both_warm  # no one timed while one compiled
    assert slow["timed"][1] <= fast["timed"][0]  # one at a time, in the order given
    assert slow["seconds"] < fast["seconds"]  # each part's seconds: from the common start to its end
    assert slow["go"] == fast["go"] == "alone"

    # With too little time left to wait for the others, a warm part is timed beside them (and is told so),
    # rather than killed with them.
    late = gpu.run_in_turns(
        {"ready": [sys.executable, str(part), "ready", "0.1"], "stuck": [sys.executable, str(part), "stuck", "60"]},
        limit=5,
    )
    assert late["ready"]["go"] == "beside" and late["stuck"]["error"] == "timed out after 5 s", late

    hung = gpu.run_in_turns({"hung": [sys.executable, "-c", "import time; time.sleep(60)"]}, limit=1)
    assert hung["hung"]["error"] == "timed out after 1 s" and hung["hung"]["seconds"] < 30

    # A part's side of it: say it is warm, then wait for its turn.
    told = []
    waiter = threading.Thread(target=lambda: told.append(gpu.wait_for_turn(tmp_path, "p")))
    waiter.start()
    time.sleep(0.3)
    assert (tmp_path / "p.warm").exists() and waiter.is_alive()
    (tmp_path / "p.go").write_text("alone")
    waiter.join(timeout=10)
    assert not waiter.is_alive() and told == [True]


def test_the_gpu_run_measures_what_the_issue_asks():
    # The dry run trains the toy sizes; the GPU's are checked here as the configs the parts build.
    import argparse

    import gpu

    args = argparse.Namespace(sizes="full", device="cpu")
    gan, plan, swap, resnet = (gpu.config(args, key) for key in ("gan", "plan", "swap", "resnet"))
    for cfg in (gan, plan):
        assert (cfg.model.name, cfg.data.resolution, cfg.model.ch, cfg.model.dim_z) == ("biggan", 128, 96, 120)
    assert gan.train.batch == 256 == gpu.SIZES["full"]["gan_micro"]  # one micro-batch: the GPU holds it whole
    assert (plan.train.batch, plan.train.micro_batch, plan.train.memory_budget) == (2048, "auto", "6GiB")
    t = swap.train
    assert (swap.name, swap.data.resolution, t.batch, t.micro_batch, t.memory_budget) == (
        "saehd512_df_ud", 512, 8, "auto", "6GiB"
    )  # fmt: skip
    assert (t.precision, t.checkpointing) == ("bf16", True)
    t = resnet.train
    assert (resnet.model.name, resnet.data.resolution, t.batch, t.precision) == ("resnet50", 224, 256, "bf16")
    assert sorted(gpu.RUN_ORDER) == sorted(gpu.PARTS)
