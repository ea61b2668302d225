"""Bad input: one line naming the problem, exit status 2, no traceback."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from PIL import Image

import bigbatch
from bigbatch.cli import main
from bigbatch.config import Config
from bigbatch.models import convert


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["train", "train.batchsize=3"], "unknown config key 'train.batchsize'"),
        (["train", "train.batch=big"], "'train.batch' must be an integer"),
        (["train", "--preset", "nope"], "unknown preset 'nope'"),
        (["train", "--config", "missing.toml"], "missing.toml does not exist"),
        (["train", "train.batch"], "key=value"),
        (["train", "--resume"], "--resume needs --run-dir"),
        (["train", "--run-dir", "empty", "--resume"], "holds no run to resume"),
        (["sample", "nowhere"], "nowhere does not exist"),
        (
            ["info", "nowhere"],
            "nowhere does not exist; give a run directory, one of its checkpoints/<kimg> folders, a DATA.h5 file, or a "
            "file bigbatch export wrote (.onnx, .pt, .pt2, .dfm)",
        ),
        (["info", "builtin:digits"], "builtin:digits is a data set made when read, not a file"),
        (["train", "--bogus"], "unrecognized arguments: --bogus (see 'bigbatch train --help')"),  # (was bigbatch's)
        (["train", "--dry-run", "train.batch=64", "--bogus"], "unrecognized arguments: --bogus"),
        (["train", "--dry-run", "train.batch"], "cannot read override 'train.batch': write it as key=value"),
        (["presets", "train.batch=64"], "unknown preset 'train.batch=64'"),
        (["presets", "digits", "train.batch=64"], "unrecognized arguments: train.batch=64"),
        (["frobnicate"], "invalid choice"),
        (["lr-find", "--out", "curve.jpg"], "'curve.jpg' would hold a PNG image: give a name ending in .png"),
        (["show-batch", "--out", "b.txt"], "give a name ending in .png"),
        (["plot", "runs", "--out", "p"], "give a name ending in .png"),
        (
            ["train", "--preset", "fashion_resnet_fast", "--dry-run", "train.batch=100", "train.micro_batch=33"],
            "phase from 0 kimg: its batch 200 (2x train.batch) is not a multiple of train.micro_batch",
        ),
        (["train", "--preset", "fashion_resnet_fast", "--dry-run", "model.options.depth=21"], "must be 6n+2"),
        # What only the models' constructors check, as training refuses it (found from outside: passed dry runs).
        (
            ["train", "--dry-run", "data.resolution=8"],
            "dcgan supports power-of-two resolutions >= 16 (data.resolution), got 8",
        ),
        (["train", "--preset", "saehd_cpu", "--dry-run", 'model.options.archi="foo"'], "SAEHD archi must be df"),
        (["train", "--preset", "saehd_cpu", "--dry-run", 'model.options.archi="df-uu"'], "(each option once), got"),
        (["train", "--preset", "saehd_cpu", "--dry-run", 'model.options.archi="LIAE-UD"'], "(in lowercase), got"),
        (["train", "--dry-run", "data.path=/tmp"], "data file /tmp is not a file"),  # as training refuses it
        (  # (found from outside: passed by the dry run, refused by the run)
            ["train", "--preset", "fashion_resnet_fast", "--dry-run", "data.decode=gpu", "train.device=cpu"],
            'data.decode = "gpu" decodes on a CUDA device and this run trains on cpu',
        ),
        (["show-batch", "--kimg", "nan"], "--kimg must be a number of kimg, 0 to 1e12, got nan"),
        (["show-batch", "--kimg", "inf"], "--kimg must be a number of kimg, 0 to 1e12, got inf"),
        (["train", "--dry-run", "train.pl_weight=2"], "'train.pl_weight' needs a G with a mapping network"),
        # Positionals after options are gathered per command: not for REMAINDER's (a traceback), nor before it.
        (["sweep", "--bad", "x.py"], "unrecognized arguments: --bad"),
        (["--bogus", "stop", "RUN"], "unrecognized arguments: --bogus"),
        (["prepare", "builtin:digits", "d.h5", "--classes", "x.h5"], "--labels, --classes and --crop none take image"),
        # Found from outside: ignored without a word where no input is a builtin set.
        (["eval", "a", "b.h5", "--resolution", "64"], "no input here is one (A: a and B: b.h5): images are scored"),
        (["eval", "a", "builtin:digits", "--resolution", "0"], "--resolution must be at least 1, got 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, words):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""  # (a dry run printed the whole config before its error)
    assert err.startswith("bigbatch: error: ") and err.count("\n") == 1, err
    assert words in err


def test_console_script_prints_no_traceback(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nbatch = 'x'\n")
    p = subprocess.run(
        [sys.executable, "-m", "bigbatch.cli", "train", "--config", str(bad)], capture_output=True, text=True
    )
    assert p.returncode == 2
    assert p.stderr.strip() == "bigbatch: error: config key 'train.batch' must be an integer, got 'x'"


def test_presets_lists_one_line_each(capsys):
    code, out, _ = run_cli(capsys, "presets")
    assert code == 0
    lines = out.strip().splitlines()
    assert [line.split()[0] for line in lines] == list(bigbatch.list_presets())
    # whole sentences, one line (found from outside: one ended mid-way; then by review: cut at "He et al.")
    assert all(line.endswith(".") and len(line) < 160 for line in lines) and "et al. 2016;" in out


def test_dry_run_prints_config_and_plan(capsys):
    code, out, _ = run_cli(capsys, "train", "--dry-run", "train.batch=256", "train.micro_batch=32")
    assert code == 0
    assert "batch = 256" in out
    assert "batch 256 = micro_batch 32 x accumulation 8 x world_size 1" in out
    # A later phase from where its first step starts (found from outside: the kimg written, 60, where 60.16 is)
    code, out, _ = run_cli(capsys, "train", "--preset", "fashion_resnet_fast", "--dry-run")
    assert code == 0 and "; then 28px batch 128 from 60.16 kimg" in out


def test_batch_plan_must_divide(capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    code, _, err = run_cli(capsys, "train", "--dry-run", "train.batch=64", "train.micro_batch=16")
    assert code == 2 and "train.batch=64 is not a multiple of the world size 3" in err
    monkeypatch.setenv("WORLD_SIZE", "2")  # a share of 48: a micro-batch of 32 below it must divide it
    code, _, err = run_cli(capsys, "train", "--dry-run", "train.batch=96", "train.micro_batch=32")
    assert code == 2 and "not a multiple of train.micro_batch x world_size = 32 x 2" in err
    code, out, _ = run_cli(capsys, "train", "--dry-run", "train.batch=64", "train.micro_batch=64")
    assert code == 0 and "batch 64 = micro_batch 32 (micro_batch 64 asked is more than" in out


def test_a_smaller_batch_than_the_micro_batch_just_trains(capsys, tmp_path):
    # Found from outside: `bigbatch train train.batch=32` on digits (micro_batch 64) was refused.
    assert bigbatch.preset("digits").train.micro_batch == 64
    run = tmp_path / "run"
    code, out, err = run_cli(
        capsys, "train", "train.batch=32", "--run-dir", str(run), "train.kimg=0.064", "data.resolution=16",
        "model.ch=8", "model.dim_z=16", "sample.every_kimg=0.064", "checkpoint.every_kimg=0.064",
    )  # fmt: skip
    assert code == 0, err
    assert "batch 32 = micro_batch 32 (micro_batch 64 asked is more than a process's share: no accumulation)" in out
    assert re.search(r"^kimg 0.0[0-9]{2}/0.064  ", out, re.M), out  # the progress line in the run's own units
    plan = json.loads((run / "plan.json").read_text())
    assert (plan["micro_batch"], plan["accumulation"], plan["micro_batch_asked"]) == (32, 1, 64)
    # `info` says the split the run trained with, not the one asked for (it said "micro 64").
    code, out, _ = run_cli(capsys, "info", str(run))
    assert code == 0 and "batch 32 (micro 32 x 1 accumulated; train.micro_batch 64)" in out, out
    # Before its first checkpoint (a run killed early, or still on its way), a run is described by its start
    # record and log (found from outside: info only refused).
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").mkdir()
    code, out, err = run_cli(capsys, "info", str(run))
    assert code == 0, err
    assert "checkpoints none yet (the first at 0.064 kimg; a stopped run saves where it stops)" in out, out
    assert "batch 32 (micro 32 x 1 accumulated; train.micro_batch 64)" in out and "last log    kimg 0.064" in out
    assert "files" not in out and "dcgan" in out
    (run / "config.toml").unlink()
    code, _, err = run_cli(capsys, "info", str(run))
    assert code == 2 and err == f"bigbatch: error: run {run} has no complete checkpoint yet\n"
    (tmp_path / "ck").mkdir()  # an incomplete checkpoint folder is refused as one, not described as a run
    (tmp_path / "ck" / "config.toml").write_text(bigbatch.preset("digits").dumps())
    (tmp_path / "ck" / "meta.json").write_text("{")
    code, _, err = run_cli(capsys, "info", str(tmp_path / "ck"))
    assert code == 2 and "is incomplete or damaged" in err, err


@pytest.mark.parametrize("name", bigbatch.list_presets())
def test_every_preset_takes_any_power_of_two_batch_from_8(name, capsys):
    # A sweep over train.batch: accepted, and followed (a preset's dynamic batch scales with it).
    for k in range(3, 14):
        code, out, err = run_cli(capsys, "train", "--dry-run", "--preset", name, f"train.batch={2**k}")
        assert code == 0, err
        cfg = bigbatch.preset(name).override({"train.batch": 2**k})
        assert 2**k in [p.batch for p in bigbatch.data.schedule.schedule_of(cfg).phases]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["train", "--run-dir", "r", "model.options.init=bogus"], "option 'init' of 'dcgan' must be one of"),
        (["train", "--run-dir", "r", "train.ema_halflife_kimg=nan"], "'train.ema_halflife_kimg' must be a finite"),
        (["train", "--run-dir", "r", "name=a/b"], "'name' must be letters"),
        (["train", "--run-dir", "r", "sample.truncation=1e-9"], "'sample.truncation' must be a threshold"),
    ],
)
def test_bad_config_leaves_no_run_behind(capsys, tmp_path, argv, words):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and words in err and err.count("\n") == 1
    assert not (tmp_path / "r" / "config.toml").exists()


def test_unwritable_output_is_one_line(capsys, tmp_path):
    code, _, err = run_cli(capsys, "train", "--run-dir", "/proc/nope/run", "train.kimg=0.064", "data.resolution=16")
    assert code == 2 and err.startswith("bigbatch: error: ") and err.count("\n") == 1


def test_override_leaves_the_original_config_alone():
    base = bigbatch.preset("digits")
    base.override({"model.options.d_sn": False})
    with pytest.raises(bigbatch.BigbatchError):
        base.override({"model.options.colour": 1})
    assert base.model.options == {}


def test_python_m_bigbatch_is_the_bigbatch_command(tmp_path, capsys):
    ok = subprocess.run([sys.executable, "-m", "bigbatch", "presets"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert [line.split()[0] for line in ok.stdout.strip().splitlines()] == list(bigbatch.list_presets())
    # A preset named shows its notes and config; --version (found from outside: "the following arguments ...").
    assert main(["presets", "digits"]) == 0
    one = capsys.readouterr().out
    assert one.startswith(bigbatch.list_presets()["digits"].split(";")[0]) and 'name = "digits"' in one
    with pytest.raises(SystemExit) as version:  # (argparse's action, as the command's)
        main(["--version"])
    assert version.value.code == 0 and capsys.readouterr().out == f"bigbatch {bigbatch.__version__}\n"
    bad = subprocess.run([sys.executable, "-m", "bigbatch", "train", "nosuchkey=1"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.startswith("bigbatch: error: unknown config key 'nosuchkey'") and bad.stderr.count("\n") == 1


def test_a_ctrl_c_while_the_command_imports_torch_is_one_line():
    # (found from outside: a traceback out of `import torch`, 1-5 s of every start) A SIGINT 0.2 s into the import,
    # taken as in a terminal (a test worker's children may start with it ignored, as a background job's).
    interrupt = "signal.signal(signal.SIGINT, signal.default_int_handler)"
    interrupt += "; signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGINT))"
    child = f"import os, signal, sys; sys.argv[1:] = ['presets']; {interrupt}"
    child += "; signal.setitimer(signal.ITIMER_REAL, 0.2); from bigbatch.command import main; sys.exit(main())"
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    said = "bigbatch: interrupted as it started: nothing was done\n"
    assert (out.returncode, out.stderr, out.stdout) == (130, said, ""), out.stderr


def test_commands_run_from_a_source_checkout_without_install_metadata(monkeypatch, capsys):
    # Found by review: --version read the installed package's metadata as every command's parser was built, which a
    # checkout run by PYTHONPATH (the GPU checks) lacks.
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata.Distribution, "from_name", staticmethod(missing))
    assert main(["presets"]) == 0 and "digits" in capsys.readouterr().out


def test_overrides_may_stand_among_the_options(capsys):
    argv = ["--dry-run", "train.batch=64", "--preset", "digits", "train.micro_batch=16", "--quiet", "train.batch=128"]
    code, out, err = run_cli(capsys, "train", *argv)
    assert code == 0, err
    # In command-line order, the last word on a key wins, wherever it stands.
    assert "batch 128 = micro_batch 16 x accumulation 8 x world_size 1" in out


def test_convert_takes_overrides_after_its_options(tmp_path, capsys):
    torch.manual_seed(0)
    G, D = bigbatch.models.create("biggan", 32, 5, ch=8, dim_z=16, g_attn=16, d_attn=16)
    weights = tmp_path / "weights"
    weights.mkdir()
    for name, net in (("G", G), ("G_ema", G), ("D", D)):
        torch.save(convert.to_reference(net), weights / f"{name}.pth")
    tiny = ["data.resolution=32", "model.ch=8", "model.dim_z=16", "model.options={g_attn=16, d_attn=16}"]
    # The preset's own model (ch 96 at 128x128) does not fit these weights: the overrides must reach it.
    code, _, err = run_cli(capsys, "convert", str(weights), "run", "--preset", "biggan128_bs2048", *tiny)
    assert code == 0, err
    cfg = Config.load(tmp_path / "run" / "config.toml")
    assert (cfg.model.ch, cfg.model.dim_z, cfg.data.resolution) == (8, 16, 32)


def test_plot_of_a_run_that_has_logged_nothing_yet_says_so(tmp_path, capsys):
    (tmp_path / "config.toml").write_text("")  # a run just started: config written, no row logged
    code, out, err = run_cli(capsys, "plot", str(tmp_path))
    assert code == 2 and err.count("\n") == 1 and "has logged nothing to plot yet" in err and "plot it again" in err


def test_a_run_starting_is_a_run_with_no_checkpoint_yet(tmp_path, capsys):
    # Found from outside: a run whose lock alone was there (computing its reference statistics) was "neither a run
    # directory nor a checkpoint folder" to info, a folder of no images to eval.
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".lock").touch()
    for command in ("info", "eval", "sample"):
        code, out, err = run_cli(capsys, command, str(tmp_path / "run"))
        assert code == 2 and "has no complete checkpoint yet" in err, err


def test_a_reader_that_goes_away_ends_the_command_quietly():
    # `bigbatch presets | head -1`: the pipe closes before the output is written ("bigbatch: error: Broken pipe").
    p = subprocess.Popen([sys.executable, "-m", "bigbatch", "presets"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    assert p.wait(timeout=60) == 141 and p.stderr.read() == b""


def test_a_dry_run_says_when_its_data_file_is_not_made_yet(capsys):
    code, out, err = run_cli(capsys, "train", "--dry-run", "data.path=/nowhere/x.h5")
    assert code == 0 and "# plan: batch 64" in out
    assert "warning: data file /nowhere/x.h5 does not exist: training refuses it" in err
    code, out, err = run_cli(capsys, "train", "--dry-run", "data.path=data/x.h5")
    assert code == 0 and f"data file data/x.h5 does not exist in the current folder {os.getcwd()}:" in err


def test_out_of_memory_is_one_line(capsys, monkeypatch):
    # Found from outside: a step that ran out of memory after the probe said it fits ended in a raw traceback.
    import bigbatch.loop

    def oom(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried")

    monkeypatch.setattr(bigbatch.loop, "train", oom)
    code, out, err = run_cli(capsys, "train", "train.kimg=0.1")
    assert code == 1 and err.count("\n") == 1 and "bigbatch: error: out of memory ([enforce fail" in err
    assert "lower train.micro_batch or train.memory_budget" in err


def test_progress_lines_show_the_kimg_of_each_log_row(capsys, tmp_path):
    # Found from outside: at train.kimg=1.5 and a log every 0.064 kimg lines read "kimg 0.6/1.5" twice.
    code, out, err = run_cli(
        capsys, "train", "--run-dir", str(tmp_path / "run"), "train.kimg=0.5", "train.log_every_kimg=0.064",
        "data.resolution=16", "model.ch=8", "model.dim_z=16", "train.batch=32",
    )  # fmt: skip
    assert code == 0, err
    shown = re.findall(r"^kimg ([0-9.]+)/0.5  ", out, re.M)
    assert len(shown) >= 7 and len(set(shown)) == len(shown) and shown[0] == "0.064", shown
    # A rate below 10 img/s in two figures (found from outside: XSeg's 0.4 img/s on a CPU was "0 img/s").
    from bigbatch.progress import rate

    assert [rate(v) for v in (0.4, 0.0042, 5.33, 123.4)] == ["0.4", "0.0042", "5.3", "123"]
    assert re.search(r"  [\d.]+ img/s  ETA ", out), out


def test_a_dry_run_says_whether_the_models_compile(capsys):
    # train.compile "auto" is on for BigGAN on a GPU alone: the dry run says what it resolves to here.
    code, out, _ = run_cli(capsys, "train", "--preset", "biggan128_bs2048", "--dry-run", "train.device=cpu")
    assert code == 0 and out.rstrip().endswith("# torch.compile (train.compile auto): off (device cpu)")
    code, out, _ = run_cli(capsys, "train", "--dry-run", "train.compile=true")
    assert code == 0 and out.rstrip().endswith("# torch.compile: on (device cpu)")
    code, out, _ = run_cli(capsys, "train", "--dry-run", "train.compile=reduce-overhead")
    assert code == 0 and out.rstrip().endswith(
        "# torch.compile mode reduce-overhead (CUDA graphs on a GPU): on (device cpu)"
    )
    code, _, err = run_cli(capsys, "train", "--dry-run", "train.compile=cudagraphs")
    assert code == 2 and "train.compile" in err and "'reduce-overhead'" in err and "Traceback" not in err


def test_positionals_may_stand_after_the_options(capsys, tmp_path):
    """`eval A --checkpoint best B` reads B as the reference (found from outside: 'unrecognized arguments: B')."""
    a = tmp_path / "a"
    a.mkdir()
    Image.new("RGB", (16, 16)).save(a / "0.png")
    code, out, err = run_cli(capsys, "eval", str(a), "--metrics", "fid", str(tmp_path / "nowhere"))
    assert code == 2 and "unrecognized" not in err
    assert "nowhere does not exist" in err and err.count("\n") == 1
    code, out, err = run_cli(capsys, "eval", str(a), "--metrics", "fid", "b", "c")
    assert code == 2 and "unrecognized arguments: c" in err


def test_an_op_without_a_deterministic_kernel_is_one_line(capsys, monkeypatch):
    # Found by reading: on a GPU, train.deterministic met ops whose CUDA kernels are not (AdaptiveAvgPool2d's
    # backward, a float cumsum) in a traceback. PyTorch's own error, from an op that has none on a CPU either.
    import bigbatch.loop
    from bigbatch.engine.determinism import deterministic_kernels

    def train(*args, **kwargs):
        with deterministic_kernels(True):
            torch.zeros(3).put_(torch.tensor([0]), torch.tensor([1.0]))

    monkeypatch.setattr(bigbatch.loop, "train", train)
    code, out, err = run_cli(capsys, "train", "train.kimg=0.1", "train.deterministic=true")
    assert code == 2 and err.count("\n") == 1, err
    assert "bigbatch: error: put_ has no deterministic kernel on this device" in err

    # Under torch.compile its message starts with the backend's words: the op is still the one named.
    def compiled(*args, **kwargs):
        said = "grid_sampler_2d_backward_cuda does not have a deterministic implementation, but you set 'torch..."
        raise RuntimeError(f"backend='inductor' raised:\nRuntimeError: {said}")

    monkeypatch.setattr(bigbatch.loop, "train", compiled)
    code, out, err = run_cli(capsys, "train", "train.kimg=0.1", "train.deterministic=true")
    assert code == 2 and "error: grid_sampler_2d_backward_cuda has no deterministic kernel" in err
    assert "set train.deterministic = false" in err


def test_a_learning_rate_that_overflows_the_optimizer_is_one_line(tmp_path, capsys):
    # Found from outside: train.d_lr=1e37 with beta1 0.99 passed the config's checks, and Adam's first step
    # (lr / (1 - beta1), past float32's range) ended in a traceback from torch.optim.
    argv = ["train", "--run-dir", str(tmp_path / "r"), "train.kimg=0.008", "train.batch=8", "model.ch=8"]
    assert main([*argv, "train.d_lr=1e37", "train.betas=[0.99, 0.999]", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a learning rate or weight decay overflows float32" in err


def test_a_path_that_cannot_be_written_is_named_as_given_with_its_fix(tmp_path, monkeypatch, capsys):
    # Found from outside: a folder under a file was said without a fix ("notes.txt/al: Not a directory"), and an
    # output in a folder that may not be changed by its temporary file's name (".v.tmp-20322.mp4").
    import errno

    from bigbatch.cli_errors import os_error_line

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("notes\n")
    (tmp_path / "frames").mkdir()
    Image.new("RGB", (64, 48)).save(tmp_path / "frames" / "00001.png")
    assert main(["extract", "frames", "notes.txt/aligned"]) == 2
    fix = "a part of that path is a file, not a folder: give a path through folders"
    assert capsys.readouterr().err == f"bigbatch: error: notes.txt/aligned: Not a directory; {fix}\n"
    # A video named, not its temporary file (found from outside: "rodir/.v.tmp-20322.mp4: Operation not permitted").
    assert main(["video", "make", "frames", "/proc/made.mp4"]) == 2
    assert capsys.readouterr().err == "bigbatch: error: /proc/made.mp4: No such file or directory\n"
    said = os_error_line(PermissionError(errno.EPERM, "Operation not permitted", "locked/v.mp4"))
    assert said == "locked/v.mp4: Operation not permitted; give this user access to it (to read it, or to write there)"
    said = os_error_line(OSError(errno.ENOSPC, "No space left on device", "runs/plan.json"), resumes=True)
    assert said.startswith("runs/plan.json: No space left on device; free space there (a run resumes from its latest")
    assert said.endswith("; --resume=auto also starts one with none)")  # (found from outside: --resume, refused)


def test_a_refused_run_leaves_no_folder_it_made(tmp_path, capsys):
    # Found from outside: a run refused for its data left the folders above its run directory that it had made.
    run = tmp_path / "made" / "for" / "run"
    assert main(["train", "--preset", "digits", "--run-dir", str(run), "data.path=nothere.h5"]) == 2
    assert "nothere.h5" in capsys.readouterr().err and sorted(tmp_path.iterdir()) == []


def test_plot_of_many_runs_gives_each_its_colour_and_one_legend_of_them(tmp_path, capsys):
    # Found from outside: 23 runs' legends covered the panels and ran off the figure, colours repeated past ten, and
    # tight_layout's raw UserWarning (with its file path) came out.
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    for i in range(23):
        (tmp_path / "runs" / f"r{i:02d}").mkdir(parents=True)
        rows = [f'{{"kimg": {k}, "loss_D": {1 + i / 10 + k}, "loss_G": {2 - k}, "img_per_s": 50}}' for k in (1, 2, 3)]
        (tmp_path / "runs" / f"r{i:02d}" / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    figures = []
    savefig = plt.Figure.savefig
    with warnings.catch_warnings(record=True) as caught, pytest.MonkeyPatch.context() as mp:
        warnings.simplefilter("always")
        mp.setattr(plt.Figure, "savefig", lambda fig, *a, **k: figures.append(fig) or savefig(fig, *a, **k))
        assert main(["plot", str(tmp_path / "runs")]) == 0
    assert not [w for w in caught if "layout" in str(w.message)] and "Warning" not in capsys.readouterr().err
    (fig,) = figures
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [f"r{i:02d}" for i in range(23)]
    assert len({tuple(line.get_color()) for line in legend.get_lines()}) == 23
    losses = next(ax for ax in fig.axes if ax.get_title() == "losses")
    assert [t.get_text() for t in losses.get_legend().get_texts()] == ["loss_D", "loss_G"]  # (the line styles)
    assert Image.open(tmp_path / "runs" / "plots.png").size[1] > 0
