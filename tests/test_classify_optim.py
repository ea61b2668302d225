"""The large-batch optimizers (train.optimizer "lars" and "lamb", found missing from outside by a timm user: the
batch sizes this project is for are where they are used), each step as timm's, trained, resumed and refused."""

import math

import pytest
import torch
from safetensors.torch import load_file
from test_classify import tiny

import bigbatch
from bigbatch.tasks.classify.optim import Lamb, Lars


def two_groups():
    torch.manual_seed(0)
    w, b = torch.randn(4, 3, requires_grad=True), torch.randn(4, requires_grad=True)
    return w, b, [{"params": [w], "weight_decay": 0.1}, {"params": [b], "weight_decay": 0.0}]


def test_lars_scales_each_decayed_tensors_step_by_its_trust_ratio_then_takes_sgds_momentum():
    w, b, groups = two_groups()
    opt = Lars(groups, lr=0.5, momentum=0.9, nesterov=True, trust_coeff=0.01)
    w0, b0 = w.detach().clone(), b.detach().clone()
    bufs = {}
    for step in range(2):
        gw, gb = torch.full_like(w, 0.3) * (step + 1), torch.full_like(b, -0.2)
        w.grad, b.grad = gw.clone(), gb.clone()
        opt.step()
        trust = 0.01 * w0.norm() / (gw.norm() + 0.1 * w0.norm() + 1e-8)
        for name, p0, g in (("w", w0, (gw + 0.1 * w0) * trust), ("b", b0, gb)):  # b: no decay, not adapted
            bufs[name] = g.clone() if step == 0 else bufs[name] * 0.9 + g
            p0 -= 0.5 * (g + 0.9 * bufs[name])
        torch.testing.assert_close(w.detach(), w0)
        torch.testing.assert_close(b.detach(), b0)


def test_lamb_steps_as_adam_scaled_by_each_decayed_tensors_trust_ratio_after_the_global_norm_is_cut_to_1():
    w, b, groups = two_groups()
    opt = Lamb(groups, lr=0.1, betas=(0.9, 0.999), eps=1e-6)
    w0, b0 = w.detach().clone(), b.detach().clone()
    m, v = {"w": 0, "b": 0}, {"w": 0, "b": 0}
    for step in (1, 2):
        gw, gb = torch.full_like(w, 2.0 * step), torch.full_like(b, -1.0)
        w.grad, b.grad = gw.clone(), gb.clone()
        opt.step()
        total = math.sqrt(gw.square().sum() + gb.square().sum())  # above 1: every gradient divided by it
        for name, p0, g, wd in (("w", w0, gw / total, 0.1), ("b", b0, gb / total, 0.0)):
            m[name] = 0.9 * m[name] + 0.1 * g
            v[name] = 0.999 * v[name] + 0.001 * g * g
            update = (m[name] / (1 - 0.9**step)) / ((v[name] / (1 - 0.999**step)).sqrt() + 1e-6) + wd * p0
            p0 -= 0.1 * update * (p0.norm() / update.norm() if wd else 1)
        torch.testing.assert_close(w.detach(), w0)
        torch.testing.assert_close(b.detach(), b0)


@pytest.mark.parametrize("optimizer", ["lars", "lamb"])
def test_a_run_trains_with_it_and_resumes_bit_exact(tmp_path, optimizer):
    over = {"train.optimizer": optimizer, "train.kimg": 0.256, "eval.every_kimg": 0, "checkpoint.every_kimg": 0.128}
    over |= {"train.lr": 2.0 if optimizer == "lars" else 0.01, "train.weight_decay": 1e-4}
    straight = bigbatch.train(tiny(**over), run_dir=tmp_path / "straight", quiet=True)
    bigbatch.train(tiny(**{**over, "train.kimg": 0.128}), run_dir=tmp_path / "resumed", quiet=True)
    resumed = bigbatch.train(tiny(**over), run_dir=tmp_path / "resumed", resume=True, quiet=True)
    a, b = (load_file(r / "checkpoints" / "000000.256" / "model.safetensors") for r in (straight, resumed))
    first = load_file(straight / "checkpoints" / "000000.128" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a) and not torch.equal(a["conv1.weight"], first["conv1.weight"])


def test_its_keys_go_with_it(capsys):
    from bigbatch.cli import main

    assert main(["train", "--dry-run", "--preset", "fashion_resnet", "train.trust_coeff=0.02"]) == 2  # (SGD's preset)
    said = "'train.trust_coeff' is not read by train.optimizer = \"sgd\", which reads train.momentum and train.nesterov"
    assert said in capsys.readouterr().err
    lars = bigbatch.preset("fashion_resnet").override({"train.optimizer": "lars", "train.trust_coeff": 0.02})
    assert lars.train.nesterov == bigbatch.preset("fashion_resnet").train.nesterov  # (SGD's keys are LARS's too)
    with pytest.raises(bigbatch.BigbatchError, match="'train.trust_coeff' must be a positive number"):
        lars.override({"train.trust_coeff": 0})
    # LAMB takes timm's eps, 1e-6, where train.adam_eps is left at Adam's; without weight decay each is said to
    # adapt nothing.
    from bigbatch.tasks.classify import optim

    net = torch.nn.Linear(2, 2)
    groups = [{"params": list(net.parameters()), "weight_decay": 0.0}]
    assert optim.build(tiny(**{"train.optimizer": "lamb"}).train, groups, {}).defaults["eps"] == 1e-6
    assert (
        optim.build(tiny(**{"train.optimizer": "lamb", "train.adam_eps": 1e-5}).train, groups, {}).defaults["eps"]
        == 1e-5
    )
    assert (
        main(["train", "--dry-run", "--preset", "fashion_resnet", "train.optimizer=lars", "train.weight_decay=0"]) == 0
    )
    assert "train.weight_decay is 0: it steps as plain SGD or Adam" in capsys.readouterr().err
