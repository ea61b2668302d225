"""The data pipeline inside training: loader workers, in-memory reading and data.schedule phases
(dynamic batch size) change nothing they should not, switch without a restart and resume exactly."""

import json

import pytest
import torch

import bigbatch
from bigbatch.cli import main
from bigbatch.data import prepare
from bigbatch.data.schedule import schedule_of
from bigbatch.metrics_file import read_metrics


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


@pytest.mark.parametrize(
    "settings, plan, steps, stop",
    [
        # micro-batch 16 stays, accumulation 2 -> 4; stopped and resumed inside the second phase
        ({}, "micro_batch 16 x accumulation 4", [4, 8, 10, 12], 0.384),
        # "auto" plans 32 on the first phase's share and keeps it; 2 D steps per G step; resumed at the boundary
        ({"train.micro_batch": "auto", "train.d_steps": 2}, "micro_batch 32 x accumulation 2", [2, 4, 5, 6], 0.256),
    ],
)
def test_dynamic_batch_switches_at_the_phase_boundary_and_resumes_bit_identical(
    phased, settings, plan, steps, stop, tmp_path, capsys
):
    cfg = phased.override(settings)
    whole = bigbatch.train(cfg, run_dir=tmp_path / "whole")
    out = capsys.readouterr().out
    assert f"kimg 0.256: data.schedule phase begins: batch 64 = {plan}" in out
    (phase,) = json.loads((whole / "plan.json").read_text())["phases"]  # (found from outside: the first's alone)
    assert f"micro_batch {phase['micro_batch']} x accumulation {phase['accumulation']}" == plan and phase["batch"] == 64
    rows = read_metrics(whole / "metrics.jsonl")
    assert [(r["kimg"], r["batch"], r["step"]) for r in rows] == list(
        zip([0.128, 0.256, 0.384, 0.512], [32, 32, 64, 64], steps)
    )
    parts = tmp_path / "parts"
    bigbatch.train(cfg.override({"train.kimg": stop}), run_dir=parts, quiet=True)
    capsys.readouterr()
    bigbatch.train(cfg, run_dir=parts, resume=True)
    # The resumed run says which phase it is in (at the boundary: the phase begins there, as above).
    inside = f"kimg {stop:g}: resumed inside the data.schedule phase begun at 0.256 kimg: batch 64 = {plan}"
    begins = f"kimg 0.256: data.schedule phase begins: batch 64 = {plan}"
    assert (inside if stop > 0.256 else begins) in capsys.readouterr().out
    assert weights(parts, "000000.512") == weights(whole, "000000.512")


def test_a_run_resumes_only_with_its_own_schedule(phased, tiny, tmp_path, capsys):
    bigbatch.train(tiny.override({"train.kimg": 0.256}), run_dir=tmp_path / "r", quiet=True)
    with pytest.raises(bigbatch.BigbatchError, match="data.schedule"):
        bigbatch.train(phased, run_dir=tmp_path / "r", resume=True, quiet=True)
    # Reading settings may change on resume: they do not change what is trained.
    reading = {"data.workers": 1, "data.storage_options": {"endpoint_url": "http://127.0.0.1:9"}}
    bigbatch.train(tiny.override(reading), run_dir=tmp_path / "r", resume=True, quiet=True)


@pytest.mark.parametrize(
    "override, words",
    [
        ("data.schedule=0:32:64,1:16:64", "GAN schedule may change only the batch"),
        ("data.schedule=0:16:24", "phase from 0 kimg: its batch 24 is not a multiple of train.micro_batch x"),
        ("data.schedule=[{kimg=0},{kimg=2,batchsize=8}]", "data.schedule[1]': unknown keys ['batchsize']"),
        ("data.schedule=[{kimg=0},{kimg=0,batch=64}]", "phase 1 must start after phase 0"),
        (
            "data.schedule=0:16:32,0.5:16:0",
            "phase 1 needs a resolution of at least 4 px (0: data.resolution) and a batch >= 1, got "
            "resolution 16 and batch 0 from 0.5 kimg",
        ),
        ("data.schedule=0:1:1x", "phase 0 needs a resolution of at least 4 px"),  # (found from outside: 1 px trained)
        ('data.storage_options={secret="s3cr3t"}', "holds credentials (secret)"),
        (
            'data.storage_options={client_kwargs={aws_secret_access_key="s3cr3t"}}',
            "holds credentials (client_kwargs.aws_secret_access_key)",
        ),
        (  # (found from outside: saved in config.toml)
            'data.storage_options={headers={Authorization="s3cr3t"}, client_kwargs={auth="s3cr3t"}, pkey="s3cr3t", '
            'list=[{secret="s3cr3t"}]}',
            "holds credentials (client_kwargs.auth, headers.Authorization, list.0.secret, pkey)",
        ),
        ("data.workers=-1", "data.workers"),
    ],
)
def test_bad_data_settings_are_one_line(override, words, capsys):
    args = ["train", "data.resolution=16", "train.batch=32", "train.micro_batch=16", override, "--run-dir", "x"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("bigbatch: error: ") and err.count("\n") == 1 and words in err, err
    assert "s3cr3t" not in err


def test_storage_options_that_hold_no_secret_are_taken():
    # (found by review: a User-Agent header, sftp's auth_timeout and gss_auth, adlfs's authority were refused)
    options = {"headers": {"User-Agent": "lab"}, "auth_timeout": 5, "gss_auth": False, "authority": "x", "anon": True}
    assert bigbatch.preset("digits").override({"data.storage_options": options}).data.storage_options == options


def test_schedule_round_trips_through_the_saved_config(phased, tmp_path):
    run = bigbatch.train(phased.override({"train.kimg": 0.064}), run_dir=tmp_path / "r", quiet=True)
    saved = bigbatch.Config.load(run / "config.toml")
    assert [(p.start, p.batch) for p in schedule_of(saved).phases] == [(0, 32), (256, 64)]
    assert json.loads((run / "plan.json").read_text())["batch"] == 32


def test_a_phase_batch_that_cannot_split_over_the_processes_stops_before_anything_is_written(monkeypatch, capsys):
    # Under torchrun with 2 processes (the environment is all the check reads), a later phase of 48
    # images does not split into micro-batches of 16 on each: refused up front, not hours later.
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    args = ["train", "data.resolution=16", "train.batch=32", "train.micro_batch=16", "data.schedule=0:16:32,1:16:48"]
    assert main([*args, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "phase from 1 kimg" in err and "micro_batch x world_size = 16 x 2" in err and err.count("\n") == 1, err


def test_a_held_out_fraction_that_leaves_nothing_to_train_on_is_one_line():
    # Found from outside: data.val_fraction 0.995 of 180 images held out all 180, and the first batch raised
    # a ZeroDivisionError from the data order.
    from bigbatch.data import load_data
    from bigbatch.data.split import Subset, holdout

    digits = load_data("builtin:digits", 8)
    assert len(holdout(digits, 0.99)[0]) == 17  # (1797 - ceil(1797 * 0.99))
    with pytest.raises(bigbatch.BigbatchError, match="data.val_fraction 0.9995 holds out all 1797 images, leaving"):
        holdout(digits, 0.9995)
    # Found from outside: a side of one face held out none of it, and the held-out preview of nothing crashed.
    with pytest.raises(
        bigbatch.BigbatchError, match=r"holds out none of the 1 image\(s\) of builtin:digits \(one\): give more images"
    ):
        holdout(Subset(digits, torch.arange(1), "one"), 0.5)
    # A classifier's way out named to it alone (found from outside: XSeg, which refuses data.val_path, was told it)
    for val_path in (False, True):
        with pytest.raises(bigbatch.BigbatchError) as e:
            holdout(Subset(digits, torch.arange(1), "one"), 0.5, val_path=val_path)
        assert str(e.value).endswith("data.val_fraction = 0" + " (or the held-out images as data.val_path)" * val_path)


def test_a_held_out_fraction_over_half_is_said_once(capsys, monkeypatch):
    # Found from outside: data.val_fraction 0.99 trained on 1% of the images without a word.
    monkeypatch.setattr("bigbatch.errors._WARNED", set())  # (said once a process: maybe by another test)
    from bigbatch.data.load import training_data

    cfg = bigbatch.preset("fashion_resnet")
    cfg = cfg.override({"data.path": "builtin:digits", "data.val_path": "", "data.val_fraction": 0.9})
    assert len(training_data(cfg)) == 179 and len(training_data(cfg)) == 179
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and "holds out 1618 of the 1797 images and trains on the other 179" in err
    training_data(cfg.override({"data.val_fraction": 0.4}))
    assert capsys.readouterr().err == ""


def test_a_phase_batch_the_micro_batch_does_not_divide_is_not_blamed_on_train_batch(capsys):
    from bigbatch.cli import main

    args = ["train", "--preset", "fashion_resnet_fast", "--dry-run", "train.batch=32", "train.micro_batch=32"]
    assert main([*args, 'data.schedule="0:12:48,0.1:16:1x"']) == 2
    err = capsys.readouterr().err
    assert "its batch 48 is not a multiple of train.micro_batch" in err and "or a batch divisible by 32" in err
    assert "give train.micro_batch=24" in err and "resumed" not in err


def test_a_batch_larger_than_the_data_is_said(tiny, tmp_path, capsys):
    # Found from outside: 40 images trained at batch 128 without a word (each step held some images several times)
    from bigbatch.data import prepare

    prepare("builtin:digits", str(tmp_path / "few.h5"), 16, limit=20, workers=0)
    over = {"data.path": str(tmp_path / "few.h5"), "train.kimg": 0.032, "sample.every_kimg": 0}
    bigbatch.train(tiny.override(over), run_dir=tmp_path / "r", quiet=True)
    said = "a step's batch of 32 is more than the 20 images trained on: it holds some repeated"
    assert said in capsys.readouterr().err
