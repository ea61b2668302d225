"""bench/gpu_check.py, every command through the CLI on one GPU: its CPU dry run takes every step through the
code the GPU run takes (toy sizes) and passes, the resume compared to the bit; a step that fails, hangs or
checks false is a row that says so, the steps after it run, and the exit status is 1."""

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).parent.parent
sys.path.insert(0, str(REPO / "bench"))


def _copy_of_repo(root: Path) -> Path:
    """What the check reads of the repository (bench/, the tests for its cuda-tests step, pytest's settings)
    copied to `root`: run there, it can be checked for writes while others edit the repository."""
    shutil.copytree(REPO / "bench", root / "bench", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "tests", root / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def _rows(text: str) -> dict[str, list[str]]:
    rows = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| step |"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0]] = cells
    return rows


@pytest.mark.slow
def test_dry_run_on_cpu_passes_every_step_and_resumes_to_the_bit(tmp_path):
    import argparse

    import gpu_check

    out = tmp_path / "RESULTS.md"
    out.write_text("# Benchmark results\n\nAn earlier section.\n")
    repo = _copy_of_repo(tmp_path / "repo")
    before = _files(repo)
    # One thread a process and two steps at once: on 2 cores, the steps' start-up (Python, torch) is most of it.
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "bench/gpu_check.py", "--device", "cpu", "--dry-run", "--out", str(out), "--jobs", "2"]
    t = time.perf_counter()
    run = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr[-6000:]
    seconds = time.perf_counter() - t

    text = out.read_text()
    assert text.startswith("# Benchmark results\n\nAn earlier section.\n\n## GPU check, ")  # appended, not clobbered
    assert text.endswith(run.stdout)  # what it printed is what it appended
    assert re.search(r"^## GPU check, \d{4}-\d\d-\d\d, .+, 1 thread \(dry run", text, re.M)
    assert f"`python bench/gpu_check.py --device cpu --dry-run --out {out} --jobs 2`" in text
    assert re.search(r"sources [0-9a-f]{12} ", text) and "31 of 31 steps passed" in text
    rows = _rows(text)
    names = [s.name for s in gpu_check.steps(argparse.Namespace(sizes="toy", device="cpu"), tmp_path)]
    assert list(rows) == names
    # Progress went to stderr as each step started and ended.
    for name in names:
        assert re.search(rf"\] {name}: start .*\n(.*\n)*.*\] {name}: pass \(", run.stderr), name
    for name, (_, command, s, peak, losses, result) in rows.items():
        assert result.startswith("pass") and "**" not in result, f"{name}: {result}"
        assert float(s) >= 0, name
        if name == "make-data":
            continue
        assert re.fullmatch(r"[\d.]+ [KMG]iB RSS", peak), f"{name}: {peak}"  # on CPU: the peak resident set
        if name.startswith("train-"):  # every loss of the run's metrics.jsonl finite
            assert re.match(r"\d+ finite in \d+ rows; last ", losses) and "nan" not in losses.lower(), name
            assert command.startswith("`bigbatch train ") and ("train.device=cpu" in command or "--resume" in command)
        else:
            assert losses == "-", name
    # Each family and task, in the precisions asked for.
    for name, words in {
        "train-digits-bf16": ["--preset digits", "train.precision=bf16"],
        "train-digits-fp16": ["--preset digits", "train.precision=fp16"],
        "train-biggan128": ["--preset biggan128_bs2048", "train.precision=bf16"],
        "train-stylegan2-ada": ["--preset stylegan2_cifar"],
        "train-stylegan2-diffaugment": ["--preset stylegan2_256", "augment.pipeline=diffaugment"],
        "train-classify-gpu-decode": ["data.decode=gpu", "photos-jpeg.h5"],
        "train-classify-cpu-decode": ["data.decode=cpu", "photos-jpeg.h5"],
        "train-saehd512": ["--preset saehd512_df_ud", "data.dst_path="],
    }.items():
        assert all(w in rows[name][1] for w in words), rows[name][1]
    assert "OpenCV standing in for nvJPEG (CPU dry run)" in rows["train-classify-gpu-decode"][5]
    assert "--codec jpeg --crop none" in rows["prepare-jpeg"][1]
    # The resume: stopped mid-way by SIGTERM (exit status 0, a checkpoint), resumed, equal to the bit.
    assert re.search(
        r"SIGTERM after \d+ log rows; saved at 0\.\d+ of 0\.64 kimg, exit status 0", rows["train-resume-parts"][5]
    )
    assert "train.deterministic=true" in rows["train-resume-whole"][1]
    assert re.search(r"checkpoint 000000\.640: D\.safetensors, G\.safetensors, G_ema\.safetensors \(.*\) identical to "
                     r"the bit", rows["train-resume-continue"][5])  # fmt: skip
    # The commands after training, each with what it said.
    assert re.search(r'"fcd": [\d.]+', rows["eval-gan"][5]) and "top-1 " in rows["eval-classify"][5]
    assert "SSIM" in rows["eval-swap"][5]
    assert rows["predict"][5] == "pass: 4 images predicted"  # china/: 4 of 24 photos in 7 class folders
    exported = rows["exports-on-device"][5]
    assert len(re.findall(r"\((torchscript|pt2|onnx)[^)]*\): on cpu", exported)) == 5, exported
    assert "suggested train.lr" in rows["lr-find"][5] and "[augment] at p 0.5" in rows["show-batch"][5]
    assert rows["swap"][5] == "pass: Swapped 8 faces"
    assert re.fullmatch(r"pass: \d+ skipped in [\d.]+s", rows["cuda-tests"][5])  # no GPU here: each skips
    # Nothing under the repository it ran in changed: not its RESULTS.md, no new files (it worked in /tmp).
    assert _files(repo) == before
    print(f"dry run: {seconds:.0f} s")


def test_a_step_that_fails_hangs_or_checks_false_is_a_row_that_says_so(tmp_path):
    from _check_run import CheckFailed, Step, run_steps, table

    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "step.py"
    script.write_text(
        "import sys, time\n"
        "what = sys.argv[1]\n"
        "if what == 'hang': time.sleep(60)\n"
        "print('said', what)\n"
        "sys.exit(3 if what == 'fail' else 0)\n"
    )

    def check(output: str) -> str:
        if "said odd" in output:
            raise CheckFailed("it said odd")
        return output.strip()

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"kimg": 0.1, "loss_D": 1.0}\n{"kimg": 0.2, "loss_D": NaN, "loss_G": 2}\n')
    steps = [
        Step("ok", [str(script), "ok"], 30, check=check),
        Step("fail", [str(script), "fail"], 30),
        Step("hang", [str(script), "hang"], 1),
        Step("after-fail", [str(script), "ok"], 30, needs=("fail",)),
        Step("odd", [str(script), "odd"], 30, check=check),
        Step("nan", [str(script), "ok"], 30, run=run),
        Step("raises", [], 30, call=lambda: 1 / 0),
    ]
    t = time.perf_counter()
    rows = run_steps(steps, work, dict(os.environ), budget=300, jobs=1)
    assert time.perf_counter() - t < 60
    assert rows["ok"]["passed"] and rows["ok"]["note"] == "said ok" and rows["ok"]["peak"] > 0
    assert rows["fail"]["error"].startswith("CheckFailed: exit status 3: said fail; log: ")
    assert rows["hang"]["error"].startswith("CheckFailed: timed out after 1 s") and rows["hang"]["seconds"] < 30
    assert rows["after-fail"]["error"] == "not run: needs fail, which failed"
    assert rows["odd"]["error"] == "CheckFailed: it said odd"
    assert rows["nan"]["error"] == "CheckFailed: non-finite losses: loss_D nan at kimg 0.2"
    assert rows["raises"]["error"] == "ZeroDivisionError: division by zero"
    assert [n for n, r in rows.items() if r["passed"]] == ["ok"]
    shown = table(rows)
    assert "| fail | `python " in shown and "**FAIL: CheckFailed: exit status 3" in shown
    assert "| after-fail | " in shown and "**FAIL: not run: needs fail, which failed**" in shown
    # No time left: the steps are reported not run, not started.
    late = run_steps([Step("late", [str(script), "ok"], 30)], work, dict(os.environ), budget=5, jobs=1)
    assert late["late"]["error"] == "not run: the 5 s budget was spent"


def test_checkpoints_that_differ_are_named_with_their_largest_difference(tmp_path):
    import torch
    from _check_run import CheckFailed, same_checkpoints
    from safetensors.torch import save_file

    for name, value in (("a", 1.0), ("b", 1.0), ("c", 1.5)):
        ckpt = tmp_path / name / "checkpoints" / "000000.640"
        ckpt.mkdir(parents=True)
        (tmp_path / name / "checkpoints" / "latest").write_text("000000.640")
        save_file({"w": torch.full((3,), value)}, ckpt / "G.safetensors")
        save_file({"w": torch.zeros(2)}, ckpt / "D.safetensors")
    assert same_checkpoints(tmp_path / "a", tmp_path / "b").endswith("identical to the bit")
    with pytest.raises(CheckFailed, match=r"G\.safetensors \(max \|difference\| 0\.5\) differ"):
        same_checkpoints(tmp_path / "a", tmp_path / "c")


def test_the_command_exits_1_when_a_step_fails(tmp_path):
    out = tmp_path / "RESULTS.md"
    bad = tmp_path / "bad.py"
    bad.write_text("raise SystemExit('this step fails on purpose')\n")
    cmd = [sys.executable, str(REPO / "bench" / "gpu_check.py"), "--device", "cpu", "--dry-run", "--out", str(out)]
    run = subprocess.run([*cmd, "--step", f"bad={bad}", "--only", "bad"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr
    rows = _rows(out.read_text())
    assert list(rows) == ["bad"] and "**FAIL: CheckFailed: exit status 1: this step fails on purpose" in rows["bad"][5]
    assert "0 of 1 steps passed" in out.read_text() and "bad: FAIL" in run.stderr


def test_a_stopped_check_ends_its_steps_and_still_appends_its_table(tmp_path):
    out = tmp_path / "RESULTS.md"
    quick, slow = tmp_path / "quick.py", tmp_path / "slow.py"
    quick.write_text("print('done')\n")
    slow.write_text("import time\ntime.sleep(600)\n")
    cmd = [sys.executable, str(REPO / "bench" / "gpu_check.py"), "--device", "cpu", "--dry-run", "--out", str(out)]
    cmd += ["--step", f"quick={quick}", "--step", f"slow={slow}", "--step", f"later={quick}", "--jobs", "2"]
    proc = subprocess.Popen([*cmd, "--only", "quick,slow,later"], stderr=subprocess.PIPE, text=True)
    seen = set()
    for line in proc.stderr:
        seen |= {name for name in ("quick: pass", "slow: start", "later: pass") if name in line}
        if seen == {"quick: pass", "slow: start", "later: pass"}:
            start = time.perf_counter()
            proc.send_signal(signal.SIGTERM)
            break
    proc.stderr.read()
    assert proc.wait(timeout=60) == 143 and time.perf_counter() - start < 30  # (not the 600 s the step sleeps)
    rows = _rows(out.read_text())
    assert rows["quick"][5] == "pass" and rows["later"][5] == "pass"
    assert "**FAIL: CheckFailed: stopped by a signal**" == rows["slow"][5], rows["slow"]


def test_the_gpu_run_trains_what_the_issue_asks():
    # The dry run trains the toy sizes; the GPU's are checked here as the configs its training steps build.
    import argparse

    import gpu_check

    from bigbatch.config import parse_override
    from bigbatch.presets import preset

    steps = {s.name: s for s in gpu_check.steps(argparse.Namespace(sizes="full", device="cuda"), Path("/w"))}
    cfgs = {}
    for name, s in steps.items():
        if s.argv[2:3] == ["train"] and "--preset" in s.argv:
            at = s.argv.index("--preset")
            cfgs[name] = preset(s.argv[at + 1]).override(dict(parse_override(o) for o in s.argv[at + 4 :]))
    assert all(c.train.device == "cuda" for c in cfgs.values())
    assert {cfgs[f"train-digits-{p}"].train.precision for p in ("bf16", "fp16")} == {"bf16", "fp16"}
    big = cfgs["train-biggan128"]
    assert (big.model.name, big.data.resolution, big.model.ch, big.train.precision) == ("biggan", 128, 96, "bf16")
    assert cfgs["train-stylegan2-ada"].augment.pipeline == "ada" and cfgs["train-stylegan2-ada"].augment.target == 0.6
    diff = cfgs["train-stylegan2-diffaugment"].augment
    assert (diff.pipeline, diff.transforms, diff.start_p) == ("diffaugment", ["color", "translation", "cutout"], 1.0)
    assert {cfgs[f"train-classify-{d}-decode"].data.decode for d in ("gpu", "cpu")} == {"gpu", "cpu"}
    swap = cfgs["train-saehd512"]
    t = swap.train
    assert (swap.data.resolution, t.batch, t.micro_batch, t.memory_budget, t.precision) == (
        512,
        8,
        "auto",
        "6GiB",
        "bf16",
    )
    whole, parts = cfgs["train-resume-whole"], cfgs["train-resume-parts"]
    assert whole == parts and whole.train.deterministic and whole.checkpoint.every_kimg > whole.train.kimg
    rows = whole.train.kimg / whole.train.log_every_kimg
    assert math.isclose(rows, 30) and gpu_check.SIZES["full"]["resume_signal_rows"] < rows / 3  # stopped early
    for name, cfg in cfgs.items():  # a few kimg each (SAEHD: 20 iterations of 8 faces)
        assert cfg.train.kimg <= 20 and (cfg.train.kimg <= 7 or "resume" in name), name
    assert json.dumps(sorted(gpu_check.SIZES["full"])) == json.dumps(sorted(gpu_check.SIZES["toy"]))


def test_steps_left_out_take_those_that_need_them_with_them():
    import argparse

    import gpu_check

    every = gpu_check.steps(argparse.Namespace(sizes="full", device="cuda"), Path("/w"))
    kept = {s.name: s for s in gpu_check.leave_out(every, ["cuda-tests", "train-biggan128"], argparse.ArgumentParser())}
    gone = {s.name for s in every} - set(kept)
    assert gone == {"cuda-tests", "train-biggan128", "sample-biggan", "export-biggan-pt"}
    # The check of the exports only waited for BigGAN's: it runs, on those that were made.
    on_device = kept["exports-on-device"]
    assert "export-biggan-pt" not in on_device.after and "export-saehd-pt" in on_device.after
    assert [Path(a).name for a in on_device.argv[3:]] == ["classify.pt", "classify.onnx", "stylegan2.pt2", "saehd.pt"]
    parser = argparse.ArgumentParser()
    parser.error = lambda message: (_ for _ in ()).throw(ValueError(message))
    with pytest.raises(ValueError, match="--skip: unknown train-nothing; valid: make-data, cuda-tests"):
        gpu_check.leave_out(every, ["train-nothing"], parser)
