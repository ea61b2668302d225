"""Mixup and CutMix for classifiers (train.mixup, train.cutmix), as timm applies them, in large-batch form:
neighbouring images mixed in pairs, each pair's draws keyed by the step, so that a step does not depend on
its split into micro-batches."""

import json
import re

import pytest
import torch
import torch.nn.functional as F
from test_classify import tiny

import bigbatch
from bigbatch.batching import replicator_for
from bigbatch.data.load import training_data
from bigbatch.tasks import build_task
from bigbatch.tasks.classify import mixing


def test_mixup_and_cutmix_draws_are_timms_and_each_pair_shares_them():
    rows = mixing.draw(4096, 0.8, 1.0, 0, 1024)
    assert torch.equal(rows[0::2], rows[1::2])  # both images of a pair
    kind, lam = rows[0::2, 0], rows[0::2, 1]
    assert 0.45 < float((kind == mixing.CUTMIX).float().mean()) < 0.55  # at even odds with both on
    mixed = lam[kind == mixing.MIXUP].double()
    assert mixed.mean() == pytest.approx(0.5, abs=0.03) and mixed.var() == pytest.approx(1 / (4 * 2.6), rel=0.15)
    # CutMix's weight is the area the box leaves the image's own (the box clipped to the image).
    box = rows[0::2][kind == mixing.CUTMIX]
    assert torch.allclose(box[:, 1], 1 - (box[:, 4] - box[:, 2]) * (box[:, 5] - box[:, 3]))
    assert torch.equal(mixing.draw(4096, 0.8, 1.0, 0, 1024), rows) and not torch.equal(
        mixing.draw(4096, 0.8, 1.0, 0, 2048), rows
    )  # (keyed by the step)


def test_a_pair_is_mixed_each_with_the_other_and_the_loss_is_the_mixed_targets_cross_entropy():
    x = torch.rand(6, 3, 8, 8)
    rows = torch.tensor([[1, 0.7, 0, 0, 0, 0]] * 2 + [[2, 0.75, 0, 0, 0.5, 0.5]] * 2 + [[2, 0.91, 0, 0, 0.3, 0.3]] * 2)
    out, own = mixing.mix(x, rows)
    # CutMix's weight is the share of pixels the box covers at this size (found by review: its fractions' area).
    assert own.tolist() == pytest.approx([0.7, 0.7, 0.75, 0.75, 1 - 4 / 64, 1 - 4 / 64])
    assert torch.allclose(out[0], 0.7 * x[0] + 0.3 * x[1]) and torch.allclose(out[1], 0.7 * x[1] + 0.3 * x[0])
    assert torch.equal(out[2][:, :4, :4], x[3][:, :4, :4]) and torch.equal(out[2][:, 4:, :], x[2][:, 4:, :])
    logits, labels = torch.randn(4, 5), torch.tensor([1, 3, 0, 2])
    target = torch.zeros(4, 5)
    for i, (j, lam) in enumerate(zip([1, 0, 3, 2], [0.7, 0.7, 0.75, 0.75])):
        smooth = F.one_hot(labels, 5).float() * 0.9 + 0.1 / 5
        target[i] = lam * smooth[i] + (1 - lam) * smooth[j]  # timm's mixed, smoothed targets
    want = -(target * logits.log_softmax(1)).sum(1).mean()
    assert float(mixing.loss(logits, labels, own[:4], 0.1)) == pytest.approx(float(want), rel=1e-6)


def test_a_step_with_mixing_is_the_same_whatever_its_micro_batches(capsys):
    def weights(micro, mixed=True):
        over = {"train.mixup": 0.8, "train.cutmix": 1.0} if mixed else {}
        cfg = tiny(**over, **{"train.micro_batch": micro, "eval.every_kimg": 0.0})
        cfg = cfg.override({"model.name": "convnet", "model.options": {}})  # (no BatchNorm: its statistics would)
        rep = replicator_for(cfg)
        task = build_task(cfg, rep, training_data(cfg))
        images, labels = task.data.get(torch.arange(64))
        task.rep.step(task.loss, task.batch(0, images, labels), task.opt)
        if mixed:  # "auto" settles on even micro-batches; a rank's share takes its part of the step's draws
            assert rep.takes_micro(4) and not rep.takes_micro(3)
            share = task._batch(0, 64, 32, images[32:], labels[32:])[3]
            assert torch.equal(share, mixing.draw(64, 0.8, 1.0, cfg.train.seed, 0)[32:])
        return torch.cat([p.detach().flatten() for p in task.plain().parameters()])

    whole, parts = weights(64), weights(16)
    assert float((whole - parts).abs().max()) < 1e-5
    assert float((whole - weights(64, mixed=False)).abs().max()) > 1e-4  # (the step mixed: found by review)
    with pytest.raises(bigbatch.BigbatchError, match="give an even train.micro_batch"):  # (said with the config:
        tiny(**{"train.mixup": 0.8, "train.batch": 28, "train.micro_batch": 7})  # found from outside, --dry-run passed)
    from bigbatch.cli import main

    argv = ["train", "--preset", "fashion_resnet_fast", "train.mixup=0.8", "train.batch=30", "train.micro_batch=15"]
    assert main([*argv, "--dry-run"]) == 2
    # A batch the micro-batch does not divide: the micro-batch suggested is even (found from outside: 65, which the
    # pairs then refused), with a data.schedule's phases and without.
    capsys.readouterr()
    for schedule in ("data.schedule=", "train.kimg=100"):
        argv = ["train", "--preset", "fashion_resnet_fast", "train.mixup=0.8", "train.batch=130", schedule]
        assert main([*argv, "--dry-run"]) == 2
        assert re.search(r"give train.micro_batch=(26|52)\b", capsys.readouterr().err)


def test_a_run_with_mixing_trains_and_resumes_bit_exact(tmp_path):
    cfg = tiny(**{"train.mixup": 0.2, "train.cutmix": 1.0, "train.micro_batch": "auto", "train.memory_budget": "1GiB"})
    cfg = cfg.override({"train.randaugment": "rand-m9-mstd0.5-inc1"})  # (RandAugment's draws too)
    whole = bigbatch.train(cfg, run_dir=tmp_path / "whole", quiet=True)
    bigbatch.train(cfg.override({"train.kimg": 0.256}), run_dir=tmp_path / "part", quiet=True)
    part = bigbatch.train(cfg, run_dir=tmp_path / "part", resume=True, quiet=True)
    ckpt = ("checkpoints", "000000.512", "model.safetensors")
    assert whole.joinpath(*ckpt).read_bytes() == part.joinpath(*ckpt).read_bytes()
    probes = json.loads((whole / "plan.json").read_text())["probes"]
    assert probes and all(p["micro_batch"] % 2 == 0 for p in probes)  # ("auto" tries even micro-batches alone)
