"""Accumulation: micro-batch x k gives the same update as the full batch for BN-free networks.

G is put in eval mode so that its BatchNorms use running statistics (train-mode BN computes
statistics per micro-batch by design, which no accumulation can reproduce)."""

import pytest
import torch

import bigbatch
from bigbatch.batching import replicator_for
from bigbatch.data import load_data
from bigbatch.engine.dist import Context
from bigbatch.engine.plan import make_plan
from bigbatch.errors import BigbatchError
from bigbatch.tasks import build_task


def d_step_params(micro_batch: int, sn_update: str = "step"):
    cfg = bigbatch.preset("digits").override(
        {
            "data.resolution": 16,
            "model.ch": 8,
            "model.dim_z": 16,
            "model.sn_update": sn_update,
            "train.batch": 32,
            "train.micro_batch": micro_batch,
            "train.device": "cpu",
        }
    )  # dcgan: D with spectral norm and no BN
    rep = replicator_for(cfg)
    task = build_task(cfg, rep, load_data("builtin:digits", 16))
    nets = task.nets()
    nets["G"].eval()
    task.d_step(0)
    task.g_step(0)
    return torch.cat([p.detach().flatten() for name in ("G", "D") for p in nets[name].parameters()])


def rel(a, b):
    return float((a - b).norm() / b.norm())


def test_accumulated_d_step_matches_the_full_batch():
    full = d_step_params(32)
    assert rel(d_step_params(8), full) <= 1e-5
    assert rel(d_step_params(4), full) <= 1e-5


def test_per_micro_batch_power_iteration_differs():
    # BigGAN-PyTorch's behaviour ("micro") re-estimates sigma on each micro-batch: not the full batch.
    full = d_step_params(32)
    assert rel(d_step_params(8, "micro"), full) > 1e-5


def test_plan_records_accumulation():
    plan = make_plan(64, 16, "fp32", Context(1, 1, 2, torch.device("cpu")))
    assert plan.accumulation == 2
    assert plan.describe().startswith("batch 64 = micro_batch 16 x accumulation 2 x world_size 2")
    # A batch whose share the micro-batch does not divide names the micro-batch that does (found from outside:
    # a run trained on 2 processes, resumed on 1, was told to change its batch, which a resume may not).
    with pytest.raises(BigbatchError, match="give train.micro_batch=15 .a resumed run keeps its batch."):
        make_plan(30, 16, "fp32", Context(0, 0, 1, torch.device("cpu")))


def test_d_reads_real_and_fake_as_one_batch_unless_it_keeps_batch_statistics(monkeypatch):
    # BigGAN-PyTorch's G_D: one D forward of [real; fake]. A D with BatchNorm (DCGAN without spectral
    # norm) must normalise real and fake apart, as DCGAN trains; so must a D that says so.
    from bigbatch.models.dcgan import DCGANDiscriminator

    for d_sn, apart, batches in ((True, False, [64]), (False, False, [32, 32]), (True, True, [32, 32])):
        monkeypatch.setattr(DCGANDiscriminator, "reads_real_and_fake_apart", apart, raising=False)
        cfg = bigbatch.preset("digits").override(
            {"data.resolution": 16, "model.ch": 8, "model.dim_z": 16, "model.options": {"d_sn": d_sn},
             "train.batch": 32, "train.micro_batch": 32, "train.device": "cpu"}
        )  # fmt: skip
        task = build_task(cfg, replicator_for(cfg), load_data("builtin:digits", 16))
        seen = []
        task.nets()["D"].register_forward_pre_hook(lambda module, args, seen=seen: seen.append(len(args[0])))
        out = task.d_step(0)
        assert seen == batches, (d_sn, apart)
        assert out["D_real"] != out["D_fake"]
