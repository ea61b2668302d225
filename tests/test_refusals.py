"""Input found by fuzzing the command line from outside (a run of every command and config key with odd
values): each refused in one line with exit status 2, never a traceback, a fork bomb or a silent misreading."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

import bigbatch
from bigbatch import checkpoint_find, checkpoints
from bigbatch.cli import main


def one_line(capsys, argv, words):
    code = main(argv)
    err = capsys.readouterr().err
    err = "".join(line for line in err.splitlines(True) if not line.startswith("bigbatch: landmarks:"))  # (a notice)
    assert code == 2, (argv, err)
    assert err.startswith("bigbatch: error: ") and err.count("\n") == 1 and words in err, (argv, err)


@pytest.mark.parametrize(
    "argv, words",
    [
        # sizes and counts that passed, then forked until memory ran out, overflowed a tensor or ran for ever
        (["train", "data.workers=9223372036854775807", "--dry-run"], "'data.workers' must be 0 to 1024 processes"),
        (["prepare", "builtin:digits", "x.h5", "--workers", "9223372036854775808"], "--workers must be 0"),
        (["extract", "nowhere.png", "o", "--workers", "2000"], "--workers must be at most 1024"),
        (["train", "data.resolution=1099511627776", "--dry-run"], "'data.resolution' must be at most 16,384"),
        (["train", "model.ch=9223372036854775807", "--dry-run"], "'model.ch' must be at most 65,536"),
        (["train", "model.dim_z=9223372036854775807", "--dry-run"], "'model.dim_z' must be at most 65,536"),
        (["train", "sample.n=9223372036854775807", "--dry-run"], "'sample.n' must be at most 65,536"),
        (["train", "eval.n=9223372036854775807", "--dry-run"], "'eval.n' must be at most 100,000,000"),
        (["show-batch", "--kimg=1e30"], "--kimg must be a number of kimg, 0 to 1e12"),
        # outputs given as URLs to commands that write local files (they were written to ./s3:/...)
        (["train", "--run-dir", "s3://bucket/run"], "--run-dir s3://bucket/run is a URL, and train writes local"),
        (["export", "run", "s3://bucket/x.pt"], "the output s3://bucket/x.pt is a URL, and export writes local files"),
        (["video", "make", "frames", "s3://bucket/v.mp4"], "the output s3://bucket/v.mp4 is a URL"),
        (["sample", "run", "--out", "s3://bucket/s.png"], "--out s3://bucket/s.png is a URL"),
        (["video", "frames", "nowhere.mp4", "clip:1"], "nowhere.mp4"),  # (a colon in a local name is no URL)
        # runs given as URLs to commands that read local folders (found from outside: "s3:/bucket/run does not exist")
        (["sample", "s3://bucket/run"], "s3://bucket/run is a URL, and runs are read as folders on this machine"),
        (["plot", "runs", "s3://bucket/run"], "s3://bucket/run is a URL, and runs are read as folders"),
        (["stop", "s3://bucket/run"], "s3://bucket/run is a URL, and runs are read as folders"),
        (["train", "--init-from", "gs://bucket/run", "--dry-run"], "gs://bucket/run is a URL, and runs are read"),
        # configs: an empty name, a folder, a BOM, JSON, nesting too deep
        (["train", "--preset=", "--dry-run"], "--preset is empty: give a preset name"),
        (["train", "--config=", "--dry-run"], "--config is empty: give a TOML file"),
        (["train", "--config", ".", "--dry-run"], ". is a folder without a config.toml: give a TOML config file"),
        (["train", "--config", "bom.toml", "--dry-run"], "it begins with a byte-order mark"),
        (["train", "--config", "c.json", "--dry-run"], "it looks like JSON: a config is TOML"),
        (["train", "--config", "deep.toml", "--dry-run"], "nests arrays or tables too deep"),
        # an empty path (an unset variable): it was the working folder, prepared, plotted or extracted into
        (
            ["prepare", "", "x.h5", "--resolution", "32"],
            "SRC is an empty string (an unset shell variable?): give its value",
        ),
        (["plot", "empty", ""], "RUN_DIR is an empty string"),
        (["extract", "bad.png", ""], "OUT is an empty string"),
        (["train", "", "--dry-run"], "key=value is an empty string"),
        # what the real run refuses, the dry run too; nothing done, not exit status 0
        (["extract", "bad.png", "new/o", "--workers", "1"], "bad.png: it does not decode as an image"),
        # an option abbreviated (found from outside: StyleGAN2-ADA's --trunc, its psi, taken as --truncation)
        (["sample", "run", "--trunc", "0.7"], "unrecognized arguments: --trunc 0.7 (see 'bigbatch sample --help')"),
        (["xseg", "fetch", "faces"], "; DFL's XSeg fetch copies the labelled faces out: bigbatch prepare FACES OUT.h5"),
        # misreported causes
        (["info", "--verify", "empty"], "empty is neither a run directory nor a checkpoint folder"),
        (["plot", "nowhere"], "nowhere does not exist; give a run directory or a folder of runs"),
        (
            ["train", "data.schedule=[{kimg=0.064,batch=16},{kimg=0,batch=32}]", "--dry-run"],
            "a schedule's phases go in the order they start: phase 1 starts at 0 kimg",
        ),
    ],
)
def test_odd_input_is_one_line(argv, words, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bom.toml").write_bytes(b"\xef\xbb\xbf[train]\nkimg = 1\n")
    (tmp_path / "c.json").write_text('{"train": {"kimg": 1}}\n')
    (tmp_path / "deep.toml").write_text("a = " + "[" * 3000 + "]" * 3000 + "\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 2)
    one_line(capsys, argv, words)
    assert not (tmp_path / "s3:").exists()
    assert not (tmp_path / "o").exists() and not (tmp_path / "new").exists()  # (refused: no folder left made)


def test_a_checkpoint_this_user_cannot_read_is_not_taken_for_a_damaged_one(tiny, tmp_path, capsys, monkeypatch):
    """Found from outside: an intact newest checkpoint (state.pt without read permission) was moved aside as
    corrupt, and the run resumed from the one before it, losing its progress."""
    run = bigbatch.train(tiny.override({"train.kimg": 0.256}), run_dir=tmp_path / "run", quiet=True)
    real = checkpoints.file_checksum

    def refused(path):
        if path.name == "state.pt":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(checkpoints, "file_checksum", refused)
    one_line(capsys, ["train", "--run-dir", str(run), "--resume", "train.kimg=0.512"], "Permission denied; give")
    assert [c.name for c in checkpoints.complete_checkpoints(run)] == ["000000.256"]  # not moved aside
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".corrupt")]
    # ... nor by verify (found from outside: "damaged ... (it is not damaged)", which a user may delete)
    assert main(["info", "--verify", str(run)]) == 2
    out, err = capsys.readouterr()
    assert "\nunread    cannot read " in "\n" + out and "damaged   " not in out
    assert "1 of 1 checkpoint could not be read by this user (000000.256): give it read access, then verify" in err


def test_a_classifier_initialised_from_a_gan_run_is_told_so(tiny, tmp_path, capsys):
    """Found from outside: the GAN run's checkpoint was called corrupt (it has no classifier weights)."""
    gan = bigbatch.train(tiny.override({"train.kimg": 0.256}), run_dir=tmp_path / "gan", quiet=True)
    argv = ["train", "--preset", "fashion_resnet_fast", f"train.init_from={gan}", "--run-dir", str(tmp_path / "c")]
    one_line(capsys, argv, f"train.init_from {gan} is a gan run, not a classifier")
    assert json.loads((gan / "checkpoints" / "000000.256" / "meta.json").read_text())["kimg"] == 0.256
    assert os.path.isdir(gan / "checkpoints" / "000000.256")


def test_the_dry_run_says_a_missing_init_from(capsys):
    """Found from outside: it passed the dry run unsaid (said as a missing data file is: the preset that names a
    weights file to download still dry-runs)."""
    assert main(["train", "--init-from", "nowhere", "--dry-run"]) == 0
    assert "train.init_from nowhere does not exist: training refuses it until it does" in capsys.readouterr().err


def test_the_dry_run_refuses_what_the_start_refuses(tmp_path, capsys):
    """Found from outside: a --run-dir holding a run (without --resume) and an unknown builtin: data set passed the
    dry run, and a missing eval.weights went unsaid."""
    assert main(["train", "--run-dir", str(tmp_path / "r"), "--dry-run"]) == 0
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.toml").write_text(bigbatch.preset("digits").dumps())
    one_line(capsys, ["train", "--run-dir", str(tmp_path / "r"), "--dry-run"], "r already holds a run; add --resume")
    assert main(["train", "--run-dir", str(tmp_path / "r"), "--resume", "--dry-run"]) == 0
    one_line(capsys, ["train", "data.path=builtin:nosuch", "--dry-run"], "unknown built-in data set 'nosuch'; valid:")
    assert main(["train", "eval.weights=nowhere.pth", "eval.every_kimg=1", "--dry-run"]) == 0
    assert "eval.weights nowhere.pth does not exist: training refuses it until it does" in capsys.readouterr().err


def test_a_folder_this_user_cannot_read_is_said_so_not_empty(tmp_path, monkeypatch, capsys):
    """Found from outside (as another user): prepare said such a folder held no files to read."""
    from PIL import Image

    (tmp_path / "images" / "locked").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "images" / "a.png")
    real = os.scandir

    def scandir(path="."):
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    argv = ["prepare", str(tmp_path / "images"), str(tmp_path / "out.h5"), "--workers", "0"]
    one_line(capsys, argv, "locked: Permission denied; give this user read access to it")


def test_a_crafted_state_that_fails_to_unpickle_is_one_line(tiny, tmp_path, capsys):
    # Found from outside: a crafted state.pt (its checksum made to match) whose unpickling fails otherwise than torch
    # expects (a TypeError) ended a resume in a traceback; every way is one line, no object but plain data built.
    import collections
    import io

    import torch
    import xxhash

    class Crafted:
        def __reduce__(self):
            return collections.OrderedDict, (5,)

    buffer = io.BytesIO()
    torch.save({"x": Crafted()}, buffer)
    run = bigbatch.train(tiny, run_dir=tmp_path / "run", quiet=True)
    ckpt = checkpoint_find.find_checkpoint(run)
    (ckpt / "state.pt").write_bytes(buffer.getvalue())
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["files"]["state.pt"] = len(buffer.getvalue())
    meta["checksums"][checkpoints.CHECKSUM]["state.pt"] = xxhash.xxh3_128(buffer.getvalue()).hexdigest()
    (ckpt / "meta.json").write_text(json.dumps(meta))
    assert main(["train", "--run-dir", str(run), "--resume", "train.kimg=1"]) == 2
    assert "state.pt" in capsys.readouterr().err


def test_a_source_none_of_whose_files_reads_says_why_a_file_read_failed(tmp_path, capsys):
    # Found from outside: every read failed (a server that ignored range requests), and the one line gave, as its
    # example, a file skipped as listed (a member without a class), not why the reads failed.
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "bad.png").write_bytes(b"not a png")
    (tmp_path / "src" / "x.png").write_bytes(b"outside the class folders")
    one_line(
        capsys, ["prepare", str(tmp_path / "src"), str(tmp_path / "d.h5")], "of those read, 1 failed, e.g. a/bad.png"
    )


def test_an_empty_source_is_refused_from_python_too(tmp_path, monkeypatch):
    from bigbatch.data import prepare
    from bigbatch.errors import BigbatchError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.png").write_bytes(b"")  # (the working folder was prepared: found from outside)
    with pytest.raises(BigbatchError, match="the source is empty: give a file, folder or URL"):
        prepare("", "x.h5", resolution=32)
    assert not (tmp_path / "x.h5").exists()


def test_an_empty_argument_passed_through_to_a_sweep_file_is_its_own(tmp_path, capsys):
    (tmp_path / "s.py").write_text("import sys\nprint('args', sys.argv[1:])\n")  # (found by review: refused as a path)
    assert main(["sweep", str(tmp_path / "s.py"), "--tag", ""]) == 0
    assert "args ['--tag', '']" in capsys.readouterr().out


def test_a_path_of_the_wrong_kind_is_named_for_what_it_is(tmp_path, monkeypatch, capsys):
    # Found from outside: --resume of a file said to drop --resume (then "is a file"); prepare of a run folder said its
    # sample sheets differ in size; stop of a path that is nothing said "not a run directory".
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fake.h5").write_bytes(b"")
    one_line(capsys, ["train", "--resume", "--run-dir", "fake.h5"], "--run-dir fake.h5 is a file: give the folder")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "config.toml").write_text(bigbatch.preset("digits").dumps())
    one_line(capsys, ["prepare", "run", "r.h5"], "source run is a run directory, not a folder of images")
    one_line(capsys, ["stop", "nothere"], "nothere does not exist")
    one_line(capsys, ["info", "."], ". is a folder of runs (run): give one of them, ./<run>; `bigbatch plot .`")
    if importlib.util.find_spec("gcsfs") is None:  # (a scheme whose file system is not installed: s3fs was named)
        one_line(capsys, ["info", "gs://b/x.h5"], "install gcsfs to access Google Storage (fsspec's file system for gs")


def test_a_run_given_to_python_as_a_url_is_one_line():
    with pytest.raises(bigbatch.BigbatchError, match=r"^s3://bucket/run is a URL, and runs are read as folders"):
        bigbatch.load_generator("s3://bucket/run")
