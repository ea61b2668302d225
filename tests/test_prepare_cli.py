"""`bigbatch prepare` and `bigbatch info DATA.h5` from the command line, then training on the file."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import bigbatch_limited, interrupted_prepare
from PIL import Image

import bigbatch
from bigbatch.cli import main
from bigbatch.data import prepare
from bigbatch.metrics import reference_stats
from bigbatch.tasks.classify.features import ClassifierOptions, feature_extractor


def make_folder(root):
    rng = np.random.default_rng(0)
    for cls in ("cats", "dogs"):
        (root / cls).mkdir(parents=True)
        for i in range(12):
            Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(root / cls / f"{i}.png")
    (root / "dogs" / "broken.png").write_bytes(b"\x89PNG not really")


def test_prepare_info_train(tmp_path, capsys):
    make_folder(tmp_path / "pets")
    assert main(["prepare", str(tmp_path / "pets"), "pets.h5", "--resolution", "16", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "24 images" in out and "2 classes" in out and "skipped 1" in out and "broken.png" in out
    assert "\nor a classifier: bigbatch train --preset fashion_resnet data.path=pets.h5 data.resolution=16 " in out
    assert main(["info", "pets.h5", "--verify"]) == 0
    assert "cats" in (out := capsys.readouterr().out) and "dogs" in out and "content hash verified" in out
    run = ["data.path=pets.h5", "data.resolution=16", "model.ch=8", "train.batch=8", "train.micro_batch=8"]
    assert main(["train", *run, "train.kimg=0.016", "--run-dir", "r", "--quiet"]) == 0
    # The command prepare suggests works, for a size a GAN cannot take too (it suggested a GAN's).
    assert main(["prepare", str(tmp_path / "pets"), "p12.h5", "--resolution", "12", "--workers", "1"]) == 0
    said = capsys.readouterr().out.splitlines()[-2:]
    assert said[1] == "a GAN needs a side that is a power of two: prepare again with --resolution 8"
    assert said[0].startswith("train a classifier on it with: bigbatch train --preset fashion_resnet data.path=p12.h5")
    # (run, not dry-run: the preset's own validation set has other classes, which only a run reads)
    assert main([*shlex.split(said[0].split(": ", 1)[1])[1:], "train.kimg=0.016", "--run-dir", "c", "--quiet"]) == 0
    assert main(["train", "data.path=p12.h5", "--run-dir", "g"]) == 2  # (a GAN: no data.resolution=12 offered)
    assert "holds images of 12 px but data.resolution is 32: prepare the images again" in capsys.readouterr().err
    assert main(["train", "data.path=pets.h5", "--dry-run"]) == 2  # (found from outside: the dry run passed it)
    assert "holds images of 16 px but data.resolution is 32: set data.resolution=16, or" in capsys.readouterr().err
    # Found from outside: whole images (--crop none) were offered a GAN's command, which refused them.
    whole = ["--resolution", "16", "--workers", "1", "--codec", "jpeg", "--crop", "none"]
    assert main(["prepare", str(tmp_path / "pets"), "w.h5", *whole]) == 0
    said = capsys.readouterr().out.splitlines()[-1]
    assert said.startswith("train a classifier on it with: bigbatch train --preset fashion_resnet data.path=w.h5")
    assert main([*shlex.split(said.split(": ", 1)[1])[1:], "train.kimg=0.016", "--run-dir", "w", "--quiet"]) == 0


def test_prepare_bad_input_is_one_line(tmp_path, capsys):
    make_folder(tmp_path / "pets")
    assert main(["prepare", str(tmp_path / "pets"), "pets.h5", "--resolution", "16", "--workers", "1"]) == 0
    (tmp_path / "labels.h5").write_text("file,label\n")  # (it said "file signature not found")
    import h5py

    with h5py.File(tmp_path / "whole.h5", "w") as f:
        f["x"] = np.zeros(50_000, np.uint8)
    (tmp_path / "cut.h5").write_bytes((tmp_path / "whole.h5").read_bytes()[:3000])  # (it said h5py's words alone)
    for argv, words in [
        (["prepare", "nowhere", "x.h5"], "nowhere"),
        (["prepare", str(tmp_path / "pets"), "s3://b/x.h5?versionId=1"], "an output URL takes no query string"),
        (["prepare", str(tmp_path / "pets"), "x.h5", "--resolution", "100000"], "pixels up to 16384"),
        (["prepare", str(tmp_path / "pets"), "x.h5", "--resolution", "16", "--strict"], "broken.png"),
        (["info", "missing.h5"], "missing.h5"),
        (["info", str(tmp_path / "labels.h5")], "labels.h5': not an HDF5 file (give a DATA.h5 that"),
        (["info", str(tmp_path / "cut.h5")], "cut.h5': the file is cut short ("),
        (["stats", "builtin:digits", "--resolution", "0"], "--resolution must be at least 1, got 0"),  # (took 32)
        (["stats", "pets.h5", "--resolution", "32"], "pets.h5 holds images of 16 px: leave it out"),  # (ignored)
        (["train", "data.path=pets.h5", "data.resolution=8", "--run-dir", "r"], "set data.resolution=16, or prepare"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("bigbatch: error: ") and err.count("\n") == 1 and words in err, err


@pytest.mark.slow
def test_stats_and_eval_with_the_offline_classifier(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BIGBATCH_CACHE", str(tmp_path / "cache"))
    run = bigbatch.train(tiny, run_dir="run", quiet=True)
    assert "features:" not in capsys.readouterr().err  # training's own evaluations show no extraction progress
    monkeypatch.setattr("bigbatch.images_done.LINE_EVERY_S", 0.0)  # off a terminal: a line each batch here
    assert main(["stats", "builtin:digits", "--extractor", "classifier", "--resolution", "16"]) == 0
    said, err = capsys.readouterr()
    assert "stats: features: 64/1797 images" in err and "img/s, about" in err
    assert "reference statistics of builtin:digits" in said
    (file,) = (tmp_path / "cache" / "stats").glob("*.safetensors")  # cached for the next call
    assert f"in {file} (give it as B to bigbatch eval of a run on builtin:digits)" in said  # (a run's: its data's)
    assert (
        main(["eval", str(run), "--metrics", "fid,kid", "--n", "64", "--extractor", "classifier", "--batch-size", "16"])
        == 0
    )
    out, err = capsys.readouterr()
    assert "eval: features: 16/64 images" in err and "eval: features: 48/64 images" in err
    scores = json.loads(out.strip().splitlines()[-1])
    assert scores["fcd"] > 0 and "kcd" in scores and "fid" not in scores  # never labelled FID
    assert main(["eval", str(run), "--metrics", "bogus"]) == 2
    assert "unknown metric 'bogus'" in capsys.readouterr().err
    # Inception weights kept elsewhere are given as eval's are (found from outside: stats had no --weights).
    for weights, said in (("nowhere.pth", "does not exist"), (str(tmp_path), "is a folder")):  # (a folder: found
        assert main(["stats", "builtin:digits", "--extractor", "inception", "--weights", weights]) == 2  # outside)
        assert f"Inception weights file {weights} {said}" in capsys.readouterr().err
    # Statistics of images of another size than the samples' are warned of (found from outside: silent).
    before = set((tmp_path / "cache" / "stats").glob("*.safetensors"))  # (training's own, without features, too)
    digits32 = bigbatch.data.load_data("builtin:digits", 32)  # (a classifier of 4 steps: eval warns before it extracts)
    reference_stats(digits32, feature_extractor("classifier", digits32, options=ClassifierOptions(steps=4, width=4)))
    (other,) = set((tmp_path / "cache" / "stats").glob("*.safetensors")) - before
    capsys.readouterr()
    main(["eval", str(run), str(other), "--metrics", "fid", "--n", "64", "--extractor", "classifier"])
    assert f"{other} holds statistics of 32 px images, and the run's samples are 16 px" in capsys.readouterr().err


def test_a_flat_validation_folder_takes_its_labels_from_a_file_in_the_training_classes_order(tmp_path, capsys):
    # ImageNet as it comes: train/<synset>/*.JPEG, and a flat val/ with LOC_val_solution.csv.
    rng = np.random.default_rng(0)
    for synset in ("n02", "n01", "n03"):  # sorted by prepare: n01, n02, n03
        (tmp_path / "train" / synset).mkdir(parents=True)
        Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(tmp_path / "train" / synset / "a.JPEG")
    (tmp_path / "val").mkdir()
    truth = {"ILSVRC2012_val_00000001": "n03", "ILSVRC2012_val_00000002": "n01", "ILSVRC2012_val_00000003": "n03"}
    for name in [*truth, "ILSVRC2012_val_00000004"]:  # the fourth has no label
        Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(tmp_path / "val" / f"{name}.JPEG")
    rows = ["ImageId,PredictionString"] + [f"{k},{v} 10 20 30 40" for k, v in truth.items()]
    (tmp_path / "val.csv").write_text("\n".join([*rows, "ILSVRC2012_val_00000099,n02 1 2 3 4"]) + "\n")
    assert main(["prepare", str(tmp_path / "train"), str(tmp_path / "train.h5"), "--resolution", "8"]) == 0
    argv = ["prepare", str(tmp_path / "val"), str(tmp_path / "val.h5"), "--resolution", "8", "--labels"]
    argv += [str(tmp_path / "val.csv"), "--classes", str(tmp_path / "train.h5")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "ILSVRC2012_val_00000004.JPEG: no label in labels file" in out
    assert "ILSVRC2012_val_00000099 (in labels file" in out and "labelled, but not in the source" in out
    val = bigbatch.data.load_data(str(tmp_path / "val.h5"), 8)
    assert val.class_names == ["n01", "n02", "n03"] and val.get(torch.arange(3))[1].tolist() == [2, 0, 2]
    assert main(argv) == 2 and "val.h5 exists: give --overwrite" in capsys.readouterr().err
    argv.insert(3, "--overwrite")
    assert main([*argv, "--limit", "2"]) == 0  # labels are matched before the limit: one missing, as before
    out = capsys.readouterr().out
    assert out.count("labelled, but not in the source") == 1 and "wrote" in out and "2 images" in out
    assert main([*argv, "--strict"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no label in labels file" in err and "--strict" in err
    (tmp_path / "bad.csv").write_text("ILSVRC2012_val_00000001,n09\n")
    assert main([*argv[:-3], str(tmp_path / "bad.csv"), "--classes", str(tmp_path / "train.h5")]) == 2
    assert "names classes the training data has not (n09): fix the labels" in capsys.readouterr().err
    # A built-in data set gives its classes too (a run trained on one scores a folder so).
    assert main([*argv[:-3], str(tmp_path / "bad.csv"), "--classes", "builtin:digits"]) == 2
    assert "names classes the training data has not (n09)" in capsys.readouterr().err
    # A labels file that cannot be read is one line, without --classes too (the warning about sorted names
    # came first, a second line).
    assert main(["prepare", str(tmp_path / "val"), str(tmp_path / "v2.h5"), "--labels", str(tmp_path / "no.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no.csv" in err, err
    # Labels that are numbers are numbered as numbers (found from outside: 10 before 2, sorted as text).
    rows = [f"ILSVRC2012_val_{i:08d},{label}" for i, label in enumerate([10, 9, 2, 10], start=1)]
    (tmp_path / "numbers.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "numbers.h5"
    assert (
        main(
            ["prepare", str(tmp_path / "val"), str(out), "--resolution", "8", "--labels", str(tmp_path / "numbers.csv")]
        )
        == 0
    )
    assert "sorted (as numbers where all are)" in capsys.readouterr().err
    data = bigbatch.data.load_data(str(out), 8)
    assert data.class_names == ["2", "9", "10"]
    assert data.get(torch.arange(4))[1].tolist() == [2, 1, 0, 2]


def test_a_validation_set_of_class_folders_lacking_a_class_takes_the_training_files_numbering(tmp_path, capsys):
    # Found from outside: refused without --labels, and without --classes the folders read 0, 1 (n03 as 1).
    rng = np.random.default_rng(0)
    for split, synsets in (("train", ("n01", "n02", "n03")), ("val", ("n03", "n01"))):
        for synset in synsets:
            (tmp_path / split / synset).mkdir(parents=True)
            image = Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8))
            image.save(tmp_path / split / synset / "a.png")
    assert main(["prepare", str(tmp_path / "train"), str(tmp_path / "train.h5"), "--resolution", "8"]) == 0
    argv = ["prepare", str(tmp_path / "val"), str(tmp_path / "val.h5"), "--classes", str(tmp_path / "train.h5")]
    assert main(argv) == 0 and "1 class of the 3 --classes names has no image here (n02)" in capsys.readouterr().err
    val = bigbatch.data.load_data(str(tmp_path / "val.h5"), 8)
    assert val.class_names == ["n01", "n02", "n03"] and sorted(val.get(torch.arange(2))[1].tolist()) == [0, 2]
    (tmp_path / "val" / "n09").mkdir()
    Image.new("RGB", (12, 12)).save(tmp_path / "val" / "n09" / "b.png")
    assert main([*argv, "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "class folder n09 of the source is not a class of --classes" in err and err.count("\n") == 1


def test_a_killed_prepare_resumes_and_ends_with_the_uninterrupted_content_hash(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    rng = np.random.default_rng(1)
    for i in range(3000):  # enough to be killed half way
        folder = tmp_path / "src" / ("a" if i % 3 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(folder / f"{i:05d}.png")
    out = tmp_path / "out.h5"
    argv = ["prepare", str(tmp_path / "src"), str(out), "--resolution", "32", "--codec", "jpeg", "--workers", "2"]
    p = subprocess.Popen(
        [sys.executable, "-m", "bigbatch.cli", *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    parts = tmp_path / ".out.h5.parts"
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None and len(list(parts.glob("part-*.npz"))) < 3:
        time.sleep(0.01)
    workers = [int(pid) for f in Path(f"/proc/{p.pid}/task").glob("*/children") for pid in f.read_text().split()]
    p.send_signal(signal.SIGKILL)  # no clean-up of any kind
    p.wait()
    assert p.returncode == -signal.SIGKILL, "prepare ended before it could be killed: give it more files"

    def running(pid: int) -> bool:  # (a zombie has ended: this container's first process may not reap it)
        try:
            return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in "ZX"
        except OSError:
            return False

    assert len(workers) == 2  # its decoding processes die with it, not orphaned
    while time.time() < deadline and any(map(running, workers)):
        time.sleep(0.05)
    assert not any(map(running, workers))
    kept = len(list(parts.glob("part-*.npz")))
    assert kept >= 3 and not out.exists()  # nothing that looks complete
    resumed = prepare(str(tmp_path / "src"), str(out), 32, codec="jpeg", workers=2)
    assert resumed.resumed >= kept * 256 and resumed.count == 3000 and not parts.exists()
    whole = prepare(str(tmp_path / "src"), str(tmp_path / "whole.h5"), 32, codec="jpeg", workers=0)
    assert whole.resumed == 0 and resumed.content_hash == whole.content_hash
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.h5", "src", "whole.h5"]


KILLED_WORKER = """
import os, signal, sys, time
from bigbatch.cli import main
from bigbatch.data import prepare_pool

decode = prepare_pool.decode_or_reason
out = sys.argv[3]  # (python -c CODE prepare SRC OUT ...)
first_part = os.path.join(os.path.dirname(out), "." + os.path.basename(out) + ".parts", "part-0000000.npz")

def dies_at_its_file(data, *args, **kwargs):  # (forked into the workers)
    if data != b"KILL ME":
        return decode(data, *args, **kwargs)
    deadline = time.monotonic() + 30  # (once the other worker has made the first part whole: the test resumes it)
    while not os.path.exists(first_part) and time.monotonic() < deadline:
        time.sleep(0.02)
    if not os.environ.get("MID_MESSAGE"):
        os.kill(os.getpid(), signal.SIGKILL)  # (the kernel's out-of-memory killer, on the file it decodes)
    return (-7, None, None, None, None)  # (marked: killed half way through sending its result, below)

prepare_pool.decode_or_reason = dies_at_its_file
if os.environ.get("MID_MESSAGE"):  # (then the pool never says it broke)
    import struct
    from concurrent.futures import process

    send = process._sendback_result

    def half_sent(result_queue, work_id, result=None, **kwargs):
        if isinstance(result, list) and any(isinstance(r, tuple) and r[0] == -7 for r in result):
            os.write(result_queue._writer.fileno(), struct.pack("!i", 1 << 20) + b"cut short")
            os.kill(os.getpid(), signal.SIGKILL)
        return send(result_queue, work_id, result=result, **kwargs)

    process._sendback_result = half_sent
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("mid_message", ["", "1"])
def test_a_decoding_worker_killed_ends_prepare_in_one_line_and_its_parts_resume(tmp_path, mid_message):
    # Found from outside: a worker killed (as the out-of-memory killer does) left prepare hung at 100% CPU, deaf to
    # SIGTERM (the pool's shutdown waited for the other worker, which ignores SIGTERM), or ended it in a traceback.
    rng = np.random.default_rng(3)
    for i in range(400):
        (tmp_path / "src").mkdir(exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(tmp_path / "src" / f"{i:04d}.png")
    (tmp_path / "src" / "0300.png").write_bytes(b"KILL ME")
    out = tmp_path / "out.h5"
    argv = ["prepare", str(tmp_path / "src"), str(out), "--workers", "2"]
    env = {**os.environ, "MID_MESSAGE": mid_message}
    p = subprocess.run(
        [sys.executable, "-c", KILLED_WORKER, *argv], capture_output=True, text=True, timeout=60, env=env
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "a decoding worker died (killed by signal 9" in p.stderr and "resumes where it stopped" in p.stderr
    again = prepare(str(tmp_path / "src"), str(out), workers=2)  # (the file that killed it: not an image)
    assert again.resumed == 256 and again.count == 399


def test_an_interrupted_prepare_resumes_only_from_files_that_did_not_change(tmp_path, monkeypatch):
    rng = np.random.default_rng(2)
    for i in range(700):
        Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(tmp_path / f"{i:04d}.png")
    (tmp_path / "src").mkdir()
    for f in tmp_path.glob("*.png"):
        f.rename(tmp_path / "src" / f.name)

    def interrupted():
        interrupted_prepare(monkeypatch, str(tmp_path / "src"), str(tmp_path / "out.h5"), 16, workers=0, overwrite=True)

    interrupted()
    again = prepare(str(tmp_path / "src"), str(tmp_path / "out.h5"), 16, workers=0)
    assert again.resumed == 512
    # A damaged part (found from outside: every rerun stopped on it with a traceback) is decoded again.
    interrupted()
    kept = sorted((tmp_path / ".out.h5.parts").glob("part-*.npz"))
    kept[1].write_bytes(kept[1].read_bytes()[:1000])
    monkeypatch.setattr("bigbatch.errors._WARNED", set())
    mended = prepare(str(tmp_path / "src"), str(tmp_path / "out.h5"), 16, workers=0, overwrite=True)
    assert mended.resumed == 256 and mended.content_hash == again.content_hash
    # ... and one damaged past its directory is named and removed when read, the rerun decoding it anew
    interrupted()
    kept = sorted((tmp_path / ".out.h5.parts").glob("part-*.npz"))
    data = bytearray(kept[1].read_bytes())
    data[200:1200] = bytes(1000)  # (inside its first member: the directory at the end reads)
    kept[1].write_bytes(bytes(data))
    with pytest.raises(bigbatch.BigbatchError, match="was damaged .* and is removed: run the same prepare again"):
        prepare(str(tmp_path / "src"), str(tmp_path / "out.h5"), 16, workers=0, overwrite=True)
    assert kept[0].exists() and not kept[1].exists()
    mended = prepare(str(tmp_path / "src"), str(tmp_path / "out.h5"), 16, workers=0, overwrite=True)
    assert mended.resumed == 256 and mended.content_hash == again.content_hash
    interrupted()
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(tmp_path / "src" / "0003.png")  # changed meanwhile
    changed = prepare(str(tmp_path / "src"), str(tmp_path / "out.h5"), 16, workers=0, overwrite=True)
    fresh = prepare(str(tmp_path / "src"), str(tmp_path / "fresh.h5"), 16, workers=0)
    assert changed.resumed == 0 and changed.content_hash == fresh.content_hash != again.content_hash


def test_a_label_is_the_whole_field_spaces_included(tmp_path, capsys):
    rng = np.random.default_rng(0)
    for name in ("one two", "three"):
        (tmp_path / "train" / name).mkdir(parents=True)
        Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(tmp_path / "train" / name / "a.png")
    (tmp_path / "val").mkdir()
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(tmp_path / "val" / f"v{i}.png")
    (tmp_path / "val.csv").write_text('file,label\nv0.png,one two\nv1.png,"one two"\nv2.png, three \n')
    assert main(["prepare", str(tmp_path / "train"), str(tmp_path / "train.h5"), "--resolution", "8"]) == 0
    argv = ["prepare", str(tmp_path / "val"), str(tmp_path / "val.h5"), "--resolution", "8"]
    assert main([*argv, "--labels", str(tmp_path / "val.csv"), "--classes", str(tmp_path / "train.h5")]) == 0
    val = bigbatch.data.load_data(str(tmp_path / "val.h5"), 8)
    assert val.class_names == ["one two", "three"] and sorted(val.get(torch.arange(3))[1].tolist()) == [0, 0, 1]


def test_a_labels_file_labels_files_at_any_depth_of_the_source(tmp_path):
    # Found from outside: one sub-folder made prepare take folders for classes, and every file beside it
    # was called "labelled, but not in the source".
    (tmp_path / "val" / "extra").mkdir(parents=True)
    for i, name in enumerate(["a.png", "b.png", "extra/c.png"]):
        Image.new("RGB", (12, 12), (60 * i, 0, 0)).save(tmp_path / "val" / name)
    (tmp_path / "val.csv").write_text("a.png,cat\nb,dog\nextra/c.png,cat\n")
    report = prepare(str(tmp_path / "val"), str(tmp_path / "val.h5"), 8, workers=0, labels=str(tmp_path / "val.csv"))
    assert report.count == 3 and report.class_names == ["cat", "dog"] and not report.skipped
    images, labels = bigbatch.data.load_data(str(tmp_path / "val.h5"), 8).get(torch.arange(3))
    assert labels.tolist() == [0, 1, 0] and images[:, 0, 0, 0].tolist() == [0, 60, 120]
    # Rows naming the files by longer paths (absolute, or from the working folder) find them too (found from
    # outside: every file "no label").
    (tmp_path / "long.csv").write_text(f"{tmp_path}/val/a.png,cat\nval/b.png,dog\n{tmp_path}/val/extra/c.png,cat\n")
    report = prepare(str(tmp_path / "val"), str(tmp_path / "v2.h5"), 8, workers=0, labels=str(tmp_path / "long.csv"))
    assert report.count == 3 and report.class_names == ["cat", "dog"] and not report.skipped


def test_a_linked_folder_is_followed_whatever_order_the_folder_lists_in_and_a_loop_is_not(tmp_path):
    # Found from outside: a class folder linked from another was walked once, under whichever name the file
    # system listed first: its images went to the other class, and prepare said the class held no images.
    for cls, names in (("cat", ("a", "b")), ("dog", ("c",))):
        (tmp_path / "src" / cls).mkdir(parents=True)
        for name in names:
            Image.new("RGB", (12, 12), (100, 0, 0) if cls == "cat" else (0, 0, 100)).save(
                tmp_path / "src" / cls / f"{name}.png"
            )
    (tmp_path / "src" / "dog" / "cats_too").symlink_to("../cat")  # torchvision's ImageFolder: in both classes
    (tmp_path / "src" / "dog" / "loop").symlink_to("..")  # a loop: not followed
    report = prepare(str(tmp_path / "src"), str(tmp_path / "out.h5"), 8, workers=0)
    assert report.class_names == ["cat", "dog"] and report.count == 5 and not report.empty_folders
    images, labels = bigbatch.data.load_data(str(tmp_path / "out.h5"), 8).get(torch.arange(5))
    assert labels.tolist() == [0, 0, 1, 1, 1] and (images[:, 0, 0, 0] > 0).tolist() == [True, True, False, True, True]


def test_an_output_that_cannot_be_written_is_refused_before_anything_is_decoded(tmp_path, capsys, monkeypatch):
    import importlib
    import subprocess
    import sys

    make_folder(tmp_path / "pets")
    (tmp_path / "folder.h5").mkdir()
    (tmp_path / "file").write_text("")
    stage = importlib.import_module("bigbatch.data.prepare")  # (bigbatch.data.prepare is also the function)
    decoded = stage.decoded
    monkeypatch.setattr(stage, "decoded", lambda *a: pytest.fail("decoded before the output was checked"))
    for out, words in [
        ("folder.h5", "output folder.h5 is a folder; give a file in it"),
        ("file/sub/x.h5", "output file/sub/x.h5 cannot be written: file is a file, not a folder"),
    ]:
        for extra in ([], ["--overwrite"]):  # (with --overwrite it decoded all, then named a temporary file)
            assert main(["prepare", str(tmp_path / "pets"), out, "--resolution", "8", *extra]) == 2
            err = capsys.readouterr().err
            assert err.startswith("bigbatch: error: ") and err.count("\n") == 1 and words in err, err
    assert main(["info", "folder.h5"]) == 2  # (HDF5's message of two lines)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'folder.h5': it is a folder; give a DATA.h5 that `bigbatch prepare` wrote" in err
    # Two prepares to one output would share its parts folder: while one runs, another is refused.
    hold = "import fcntl, sys; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); f.write('4242 otherhost')"
    hold += "; f.flush(); print(flush=True); sys.stdin.read()"
    lock = str(tmp_path / ".out.h5.lock")
    holder = subprocess.Popen([sys.executable, "-c", hold, lock], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    holder.stdout.readline()  # (it holds the lock)
    monkeypatch.setattr(stage, "decoded", decoded)
    assert main(["prepare", str(tmp_path / "pets"), "out.h5", "--resolution", "8"]) == 2
    err = capsys.readouterr().err
    assert "output out.h5 is being written by another prepare (process 4242 on otherhost)" in err, err
    holder.communicate(b"")
    assert main(["prepare", str(tmp_path / "pets"), "out.h5", "--resolution", "8"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder.h5", "out.h5", "pets"]


def test_a_conditional_gan_on_a_set_without_classes_says_it_trains_unconditional(tmp_path, capsys):
    # Found from outside: the digits preset (conditional) on a flat folder trained unconditional in silence.
    (tmp_path / "flat").mkdir()
    for i in range(8):
        Image.new("RGB", (16, 16), (30 * i, 0, 0)).save(tmp_path / "flat" / f"{i}.png")
    assert main(["prepare", str(tmp_path / "flat"), str(tmp_path / "flat.h5"), "--resolution", "16"]) == 0
    run = ["data.path=" + str(tmp_path / "flat.h5"), "data.resolution=16", "model.ch=8", "train.batch=8"]
    assert main(["train", *run, "train.kimg=0.008", "--run-dir", str(tmp_path / "r"), "--quiet"]) == 0
    assert (
        "has no classes: G and D are unconditional, whatever model.conditional = true says" in capsys.readouterr().err
    )


def test_a_labels_row_that_names_several_files_is_refused(tmp_path, capsys):
    # Found from outside: a row "x.png,red" labelled both x.png and sub/x.png (a blue image) red, without a word.
    (tmp_path / "src" / "sub").mkdir(parents=True)
    Image.new("RGB", (12, 12), (255, 0, 0)).save(tmp_path / "src" / "x.png")
    Image.new("RGB", (12, 12), (0, 0, 255)).save(tmp_path / "src" / "sub" / "x.png")
    (tmp_path / "rows.csv").write_text("x.png,red\n")
    argv = ["prepare", str(tmp_path / "src"), str(tmp_path / "o.h5"), "--labels", str(tmp_path / "rows.csv")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "names x.png, which matches 2 files (sub/x.png, x.png): give each file's path" in err, err
    (tmp_path / "rows.csv").write_text("x.png,red\nsub/x.png,blue\n")  # paths: each file its own row
    assert main(argv) == 0
    # A file beside an image under its stem (ImageNet's annotation .xml) is not a second match of the row.
    (tmp_path / "flat").mkdir()
    Image.new("RGB", (12, 12)).save(tmp_path / "flat" / "a.png")
    (tmp_path / "flat" / "a.xml").write_text("<annotation/>")
    (tmp_path / "rows.csv").write_text("a,red\n")
    assert (
        main(["prepare", str(tmp_path / "flat"), str(tmp_path / "f.h5"), "--labels", str(tmp_path / "rows.csv")]) == 0
    )


def test_an_output_inside_its_source_is_not_read_as_one_of_its_images(tmp_path, capsys):
    """Found from outside: a second prepare listed the first's output as a corrupt image (and --strict failed)."""
    rng = np.random.default_rng(0)
    (tmp_path / "flat").mkdir()
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(tmp_path / "flat" / f"{i}.png")
    out = str(tmp_path / "flat" / "out.h5")
    for extra in ([], ["--overwrite", "--strict"]):
        assert main(["prepare", str(tmp_path / "flat"), out, "--resolution", "16", "--workers", "0", *extra]) == 0
        said = capsys.readouterr()
        assert "out.h5" not in said.err and ": 4 images 16x16x3" in said.out and "skipped" not in said.out, said


def test_images_over_pillows_bomb_guard_are_one_warning_line_and_twice_over_are_listed(tmp_path, capfd, monkeypatch):
    # A data set of large photos made Pillow print two lines of its own per image; now one line a decoding process.
    monkeypatch.setattr("bigbatch.errors._WARNED", set())
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 24 * 20 - 1)  # every 24×20 image is over the guard
    make_folder(tmp_path / "pets")
    Image.new("RGB", (24, 41)).save(tmp_path / "pets" / "cats" / "huge.png")  # over twice the guard
    pets = [str(tmp_path / "pets"), str(tmp_path / "pets.h5"), "--resolution", "16", "--workers", "2"]
    assert main(["prepare", *pets]) == 0
    captured = capfd.readouterr()
    lines = captured.err.splitlines()
    assert 1 <= sum("Pillow's guard against decompression bombs" in line for line in lines) <= 2, captured.err
    assert not [line for line in lines if "DecompressionBomb" in line or not line.startswith("bigbatch: ")]
    assert "cats/huge.png: too large to decode safely" in captured.out + captured.err
    assert "24 images" in captured.out


def test_a_full_disk_while_prepare_keeps_its_parts_is_one_line_and_resumes_from_them(tmp_path):
    # The parts a killed prepare resumes from are written ahead of the data file (a part of 256 images before
    # the file holds them): a full disk can fail there first. They stay, said in one line, for the rerun (found
    # from outside: a full disk at the data file's end took hours of decoded parts with it).
    src = tmp_path / "src"
    src.mkdir()
    ramp = np.linspace(0, 255, 64, dtype=np.uint8)
    for i in range(300):
        Image.fromarray(np.stack([np.add.outer(ramp, ramp) // 2 + i % 50] * 3, -1).astype(np.uint8)).save(
            src / f"{i:03d}.png"
        )
    argv = ["prepare", "src", "out.h5", "--resolution", "64"]
    p = bigbatch_limited(1_500_000, *argv, cwd=tmp_path)  # a part of 256 raw images is 3 MB: none kept whole
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("bigbatch: error: cannot write out.h5: File too large (its partial files are removed)")
    assert sorted(f.name for f in tmp_path.iterdir()) == ["src"]
    p = bigbatch_limited(3_500_000, *argv, cwd=tmp_path)  # the part fits, the data file of 300 (3.7 MB) does not
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("bigbatch: error: cannot write out.h5: File too large; the images decoded so far are")
    assert "and prepare run again resumes from them: free space there" in p.stderr
    assert sorted(f.name for f in tmp_path.iterdir()) == [".out.h5.parts", "src"]  # (no partial data file)
    again = subprocess.run([sys.executable, "-m", "bigbatch", *argv], cwd=tmp_path, capture_output=True, text=True)
    assert again.returncode == 0 and "resumed: 300 files as an interrupted prepare" in again.stdout, again.stdout
    assert sorted(f.name for f in tmp_path.iterdir()) == ["out.h5", "src"]


def test_class_names_match_whatever_unicode_form_the_file_system_writes(tmp_path, capsys):
    # Found from outside: a validation folder élan (decomposed, as macOS writes it) was not the training file's élan
    # (composed), and the fix given, to rename it as the training set's class, changed nothing one could see.
    import unicodedata

    rng = np.random.default_rng(0)
    for root, form in (("train", "NFC"), ("val", "NFD")):
        for name in ("élan", "zèbre"):
            (tmp_path / root / unicodedata.normalize(form, name)).mkdir(parents=True)
            image = rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)
            Image.fromarray(image).save(tmp_path / root / unicodedata.normalize(form, name) / "a.png")
    (tmp_path / "val" / unicodedata.normalize("NFD", "zèbre") / "a.png").unlink()  # (a class the val set lacks)
    (tmp_path / "val" / unicodedata.normalize("NFD", "zèbre")).rmdir()
    assert main(["prepare", str(tmp_path / "train"), str(tmp_path / "train.h5"), "--resolution", "8"]) == 0
    argv = ["prepare", str(tmp_path / "val"), str(tmp_path / "val.h5"), "--resolution", "8"]
    assert main([*argv, "--classes", str(tmp_path / "train.h5")]) == 0, capsys.readouterr().err
    val = bigbatch.data.load_data(str(tmp_path / "val.h5"), 8)
    assert val.class_names == ["zèbre", "élan"] and val.get(torch.arange(1))[1].tolist() == [1]  # (é after z)
    # ... and a labels file's names alike
    (tmp_path / "flat").mkdir()
    Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(tmp_path / "flat" / "x.png")
    (tmp_path / "l.csv").write_text(f"file,label\nx.png,{unicodedata.normalize('NFD', 'zèbre')}\n")
    argv = ["prepare", str(tmp_path / "flat"), str(tmp_path / "flat.h5"), "--resolution", "8"]
    assert main([*argv, "--labels", str(tmp_path / "l.csv"), "--classes", str(tmp_path / "train.h5")]) == 0
    assert bigbatch.data.load_data(str(tmp_path / "flat.h5"), 8).get(torch.arange(1))[1].tolist() == [0]


def test_links_planted_at_prepares_temporary_names_are_refused_and_their_files_kept(tmp_path, capsys):
    # Found by review: another user's link at .OUT.partial-PID (in a shared folder such as /tmp) had prepare write
    # the data file into the file it points to, and put the link in place as OUT; one at .OUT.lock, the lock.
    make_folder(tmp_path / "pets")
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    argv = ["prepare", str(tmp_path / "pets"), str(tmp_path / "out.h5"), "--resolution", "16", "--workers", "1"]
    (tmp_path / "theirs").mkdir()
    planted = [(f".out.h5.partial-{os.getpid()}", victim), (".out.h5.lock", victim)]
    for name, target in [*planted, (".out.h5.parts", tmp_path / "theirs")]:  # (the last: their parts as ours)
        link = tmp_path / name
        link.symlink_to(target)
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{link} is in the way" in err, err
        assert victim.read_text() == "mine" and not (tmp_path / "out.h5").exists()
        link.unlink()
    assert main(argv) == 0
    assert (tmp_path / "out.h5").is_file() and not (tmp_path / "out.h5").is_symlink()
