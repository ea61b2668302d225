"""The data pipeline inside training: loader workers, in-memory reading and data.schedule phases
(dynamic batch size) change nothing they should not, switch without a restart and resume exactly."""

import json

import pytest

import bigbatch
from bigbatch.cli import main
from bigbatch.data import prepare
from bigbatch.runs import read_metrics


def weights(run, name):
    return {net: (run / "checkpoints" / name / f"{net}.safetensors").read_bytes() for net in ("G", "D", "G_ema")}


def test_loader_workers_and_in_ram_reading_train_the_same_weights(tiny, tmp_path):
    prepare("builtin:digits", str(tmp_path / "digits.h5"), resolution=16)
    base = tiny.override({"data.path": str(tmp_path / "digits.h5"), "data.xflip": True, "train.kimg": 0.256})
    runs = {
        "read in the training process": base,
        "two worker processes": base.override({"data.workers": 2}),
        "in RAM, two workers": base.override({"data.in_ram": True, "data.workers": 2}),
    }
    got = {
        what: weights(bigbatch.train(cfg, run_dir=tmp_path / str(i), quiet=True), "000000.256")
        for i, (what, cfg) in enumerate(runs.items())
    }
    first = got.pop("read in the training process")
    for what, w in got.items():
        assert w == first, what


@pytest.fixture
def phased(tiny):
    # 8 steps of 32 images, then from 0.256 kimg steps of 64 = micro-batch 16 x accumulation 4.
    return tiny.override({"data.schedule": [{}, {"kimg": 0.256, "batch": 64}]})


def test_dynamic_batch_switches_at_the_phase_boundary_and_resumes_bit_identical(phased, tmp_path, capsys):
    whole = bigbatch.train(phased, run_dir=tmp_path / "whole")
    out = capsys.readouterr().out
    assert "kimg 0.256: data.schedule phase begins: batch 64 = micro_batch 16 x accumulation 4" in out
    rows = read_metrics(whole / "metrics.jsonl")
    assert [(r["kimg"], r["batch"], r["step"]) for r in rows] == [
        (0.128, 32, 4),
        (0.256, 32, 8),
        (0.384, 64, 10),
        (0.512, 64, 12),
    ]
    parts = tmp_path / "parts"
    bigbatch.train(phased.override({"train.kimg": 0.384}), run_dir=parts, quiet=True)  # stops inside phase 1
    bigbatch.train(phased, run_dir=parts, resume=True, quiet=True)
    assert weights(parts, "000000.512") == weights(whole, "000000.512")


def test_a_run_resumes_only_with_its_own_schedule(phased, tiny, tmp_path, capsys):
    bigbatch.train(tiny.override({"train.kimg": 0.256}), run_dir=tmp_path / "r", quiet=True)
    with pytest.raises(bigbatch.BigbatchError, match="data.schedule"):
        bigbatch.train(phased, run_dir=tmp_path / "r", resume=True, quiet=True)
    # Reading settings may change on resume: they do not change what is trained.
    bigbatch.train(tiny.override({"data.workers": 1}), run_dir=tmp_path / "r", resume=True, quiet=True)


@pytest.mark.parametrize(
    "override, words",
    [
        ("data.schedule=0:32:64,1:16:64", "GAN schedule may change only the batch"),
        ("data.schedule=0:16:24", "train.micro_batch=16 does not divide"),
        ("data.schedule=[{kimg=0},{kimg=2,batchsize=8}]", "data.schedule[1]': unknown keys ['batchsize']"),
        ("data.schedule=[{kimg=0},{kimg=0,batch=64}]", "phase 1 must start after phase 0"),
        ('data.storage_options={secret="s3cr3t"}', "holds credentials (secret)"),
        ("data.workers=-1", "data.workers"),
    ],
)
def test_bad_data_settings_are_one_line(override, words, capsys):
    args = ["train", "data.resolution=16", "train.batch=32", "train.micro_batch=16", override, "--run-dir", "x"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("bigbatch: error: ") and err.count("\n") == 1 and words in err, err
    assert "s3cr3t" not in err


def test_schedule_round_trips_through_the_saved_config(phased, tmp_path):
    run = bigbatch.train(phased.override({"train.kimg": 0.064}), run_dir=tmp_path / "r", quiet=True)
    saved = bigbatch.Config.load(run / "config.toml")
    assert [(p.start, p.batch) for p in saved.schedule().phases] == [(0, 32), (256, 64)]
    assert json.loads((run / "plan.json").read_text())["batch"] == 32
