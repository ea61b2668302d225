"""BatchNorm running statistics under the Replicator: each micro-batch's updates replayed in global order
(PyTorch's sequential updates, whatever the split), frozen BatchNorms left alone, statistics that read as
PyTorch's inside a step, and a skipped or overflowed step leaving them as they were."""

import copy

import pytest
import torch
from torch import nn

import bigbatch


@pytest.mark.parametrize("checkpointing", [False, True])
def test_batchnorm_running_statistics_are_pytorchs_sequential_updates(checkpointing):
    # The engine replays each micro-batch's BatchNorm updates after the step (engine/running_stats.py): the
    # statistics must be PyTorch's own, micro-batch after micro-batch and call after call, up to rounding,
    # with the BN called twice a micro-batch, under activation checkpointing (recomputation must not count).
    check_batchnorm_replay("cpu", checkpointing)


def check_batchnorm_replay(device, checkpointing):
    """(tests/test_cuda.py runs it on the GPU.)"""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8, momentum=0.3), nn.ReLU(), nn.Conv2d(8, 4, 3))
    reference = copy.deepcopy(net).to(device)
    rep = bigbatch.Replicator(batch=32, micro_batch=8, device=device)
    model = rep.prepare(net, checkpointing=["1", "2"] if checkpointing else False)
    opt = rep.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.0))  # the weights stay as the reference's
    g = torch.Generator().manual_seed(1)
    for _ in range(2):
        a, b = torch.randn(32, 3, 10, 10, generator=g) * 3 + 1, torch.randn(32, 3, 10, 10, generator=g)
        rep.step(lambda m: model(m[0]).square().mean() + model(m[1]).mean(), (a, b), opt)
        with torch.no_grad():
            for i in range(0, 32, 8):
                reference(a[i : i + 8].to(device))
                reference(b[i : i + 8].to(device))
    mine, theirs = net[1], reference[1]
    assert int(mine.num_batches_tracked) == int(theirs.num_batches_tracked) == 16
    for key in ("running_mean", "running_var"):
        x, y = getattr(mine, key), getattr(theirs, key)
        assert (x - y).abs().max() <= 1e-6 * y.abs().max(), key
        assert not torch.equal(x, torch.zeros_like(x)) and not torch.equal(
            x, getattr(nn.BatchNorm2d(8).to(device), key)
        )


def test_a_frozen_batchnorm_keeps_and_uses_its_statistics():
    # A BatchNorm put in eval mode (fine-tuning with frozen statistics) normalizes with its running statistics
    # in the step, and the step leaves them alone.
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3))
    with torch.no_grad():
        net[1].running_mean.uniform_(-1, 1)
        net[1].running_var.uniform_(0.5, 2)
    reference = copy.deepcopy(net).eval()
    rep = bigbatch.Replicator(batch=16, micro_batch=4, device="cpu")
    model = rep.prepare(net)
    net[1].eval()
    opt = rep.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.0))
    x = torch.randn(16, 3, 10, 10)
    loss = rep.step(lambda m: model(m).square().mean(), x, opt)
    assert loss == pytest.approx(float(reference(x).square().mean()), rel=1e-5)
    for key in ("running_mean", "running_var", "num_batches_tracked"):
        assert torch.equal(getattr(net[1], key), getattr(reference[1], key)), key


def test_a_step_that_reads_batchnorm_in_eval_mode_trains_as_plain_pytorch_does():
    # Found from outside: inside a step the running statistics read as zero (the engine captured each
    # micro-batch's updates from zero), so a target computed with model.eval() in the step was garbage and
    # training diverged without a word. With one micro-batch a step, everything is PyTorch's bit for bit.
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3))
    reference = copy.deepcopy(net)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    rep = bigbatch.Replicator(batch=8, device="cpu")
    model = rep.prepare(net)
    opt = rep.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.05))

    def loss_of(m, x):
        m.eval()
        with torch.no_grad():
            target = m(x * 0.5)  # with the running statistics
        m.train()
        return (m(x) - target).square().mean()

    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(8, 3, 10, 10, generator=g) * 2 + 1
        mine = rep.step(lambda batch: loss_of(model, batch), x, opt)
        ref_opt.zero_grad()
        theirs = loss_of(reference, x)
        theirs.backward()
        ref_opt.step()
        assert float(mine) == float(theirs)
    for (name, a), b in zip(net.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_skipped_step_leaves_batchnorm_statistics_as_they_were(precision, capsys):
    # A batch whose forward overflows: its gradients are not finite, so the step is skipped; its BatchNorm
    # updates (inf, then NaN) must be dropped with it, or the model in eval mode gives NaN for good.
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(256, 10))
    rep = bigbatch.Replicator(batch=16, micro_batch=8, precision=precision, device="cpu")
    model = rep.prepare(net)
    opt = rep.wrap_optimizer(torch.optim.Adam(model.parameters(), lr=1e-3), "clf")
    x, y = torch.randn(16, 1, 8, 8), torch.randint(10, (16,))

    def step_fn(micro):
        return nn.functional.cross_entropy(model(micro[0]), micro[1])

    rep.step(step_fn, (x, y), opt)
    before = {k: v.clone() for k, v in net[1].state_dict().items()}
    bad = x.clone()
    bad[3] *= 1e6 if precision == "fp16" else float("inf")  # (fp16: past 65504 in the forward)
    rep.step(step_fn, (bad, y), opt)
    assert rep.skipped(opt) and "clf step 2 skipped" in capsys.readouterr().err
    for key, value in net[1].state_dict().items():
        assert torch.equal(value, before[key]), key
    rep.step(step_fn, (x, y), opt)  # and the next good step updates them again
    assert not rep.skipped(opt) and not torch.equal(net[1].running_mean, before["running_mean"])
    assert torch.isfinite(model.eval()(x)).all()


def test_batchnorm_updates_that_are_not_finite_are_dropped_even_when_the_step_is_not(capsys):
    # A BatchNorm the loss does not depend on (a branch whose output is unused this step) overflows: the
    # gradients are finite and applied, its statistics stay as they were.
    torch.manual_seed(0)
    trunk, side = nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    rep = bigbatch.Replicator(batch=8, micro_batch=4, device="cpu")
    trunk, side = rep.prepare(trunk), rep.prepare(side)
    opt = rep.wrap_optimizer(torch.optim.SGD(trunk.parameters(), lr=0.1), "trunk")
    before = {k: v.clone() for k, v in side[1].state_dict().items()}
    x = torch.randn(8, 4)

    def step_fn(micro):
        side(micro * float("inf"))  # (its output unused)
        return trunk(micro).square().mean()

    rep.step(step_fn, x, opt)
    assert not rep.skipped(opt)
    for key, value in side[1].state_dict().items():
        assert torch.equal(value, before[key]), key
    assert "trunk step 1: BatchNorm statistics not finite" in capsys.readouterr().err
    # Said at the 1st, 10th, 100th, ... (found from outside: a run gone bad said it at every step)
    for _ in range(11):
        rep.step(step_fn, x, opt)
    err = capsys.readouterr().err
    said = "trunk step 10: BatchNorm statistics not finite, left as before the step (10 steps so far: the run's"
    assert err == f"bigbatch: warning: {said} updates are diverging)\n", err


def test_reestimated_statistics_are_the_plain_average_over_the_batches_given():
    from bigbatch.engine.running_stats import reestimate

    # Precise BN / standing statistics: whatever the statistics were, they become the mean of the
    # batches' means and of their unbiased variances; nothing else in the network runs in training mode
    # (the dropout would make the second BN's inputs random).
    torch.manual_seed(0)
    net = nn.Sequential(nn.BatchNorm2d(3, momentum=0.1), nn.Dropout(0.5), nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))
    net[0].running_mean.fill_(7.0)
    batches = [torch.randn(5, 3, 4, 4) * 2 + 1 for _ in range(3)]
    assert reestimate(net, batches) == 3
    means = torch.stack([b.mean((0, 2, 3)) for b in batches]).mean(0)
    variances = torch.stack([b.var((0, 2, 3), unbiased=True) for b in batches]).mean(0)
    assert torch.allclose(net[0].running_mean, means, atol=1e-6)
    assert torch.allclose(net[0].running_var, variances, atol=1e-5)
    assert int(net[0].num_batches_tracked) == 3 and net[0].momentum == 0.1  # (its momentum is back)
    assert all(m.training for m in net.modules())  # a network in training goes on training
    second = net[3].running_mean.clone()
    reestimate(net, batches)
    assert torch.equal(net[3].running_mean, second)  # the dropout between did not run in training mode
    x = batches[0]
    net.eval()
    assert torch.equal(net(x), net(x))  # eval mode: dropout is off, the statistics read
    # With no batches, the statistics stay as they were (a reset would leave mean 0, variance 1).
    before = {k: v.clone() for k, v in net.state_dict().items()}
    assert reestimate(net, []) == 0
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in before.items())


def test_a_resume_that_changes_what_batchnorm_spans_is_told_a_fix_that_works_at_its_world_size():
    from bigbatch.engine.running_stats import span_changed

    assert span_changed(16, 16, 2, False, 16) is None
    assert "give train.micro_batch=16 to keep them" in span_changed(16, 8, 1, True, 16)  # 2 x 8 with sync_bn -> 1 x 16
    # Found from outside: micro 32 on one process, resumed on two (a share of 16 images a process) was told
    # to give micro_batch 32, which the plan caps at the share: the same warning again.
    said = span_changed(32, 16, 2, False, 16)
    assert "micro_batch 32" not in said and "at 2 processes a micro-batch divides a process's 16 images" in said
    assert "give train.micro_batch=4" in span_changed(16, 16, 4, True, 16)  # (4 ranks x 4 images)
    assert "resume at the world size the run had" in span_changed(16, 4, 3, True, 4)  # (16 images in 3 ranks: none)


def test_auto_planning_a_micro_batch_too_small_for_batchnorm_says_so(capsys, monkeypatch):
    # Found from outside: micro_batch "auto" planned 2 images a micro-batch for a ResNet in a small budget, unsaid;
    # BatchNorm's statistics then span 2 images of a step's 64, and it trains otherwise than at its whole batch.
    monkeypatch.setattr("bigbatch.errors._WARNED", set())

    def planned(net, budget):
        rep = bigbatch.Replicator(batch=64, micro_batch="auto", device="cpu", memory_budget=budget)
        model = rep.prepare(net)
        rep.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        return rep.plan_micro_batch(lambda m: rep.probe_step(lambda x: model(x).mean(), torch.randn(m, 3, 64, 64)))

    def net(norm):
        return nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), norm(64), nn.ReLU(), nn.Conv2d(64, 4, 3, padding=1))

    tight = planned(net(nn.BatchNorm2d), "12MiB")
    assert tight.micro_batch < 16
    err = capsys.readouterr().err
    assert f"micro_batch 'auto' planned {tight.micro_batch} in 12.0 MiB: BatchNorm statistics span only" in err, err
    assert "checkpointing or a larger memory_budget fits more" in err and "train." not in err  # (the API's terms)
    assert planned(net(nn.BatchNorm2d), "1GiB").micro_batch == 64 and not capsys.readouterr().err
    assert planned(net(lambda c: nn.GroupNorm(8, c)), "12MiB").micro_batch < 16
    assert not capsys.readouterr().err  # (no BatchNorm: nothing to say)


def test_a_micro_batch_set_too_small_for_batchnorm_is_said_at_the_first_step(capsys, monkeypatch):
    # Found from outside: micro_batch 4 of a step's 64 trained a BatchNorm network's statistics over 4 images, unsaid.
    monkeypatch.setattr("bigbatch.errors._WARNED", set())

    def first_step(norm, micro, frozen=False):
        rep = bigbatch.Replicator(batch=64, micro_batch=micro, device="cpu")
        net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), norm(8), nn.ReLU(), nn.Conv2d(8, 4, 1))
        net[1].train(not frozen)  # (a frozen BatchNorm, in eval mode, takes no batch's statistics)
        model = rep.prepare(net)
        opt = rep.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        for _ in range(2):
            rep.step(lambda x: model(x).mean(), torch.randn(64, 3, 8, 8), opt)
        return capsys.readouterr().err

    err = first_step(nn.BatchNorm2d, 4)
    assert err.count("\n") == 1 and "micro_batch 4: BatchNorm statistics span only 4 images of a step's 64" in err
    assert "a larger micro_batch spans more ('auto': the largest that fits)" in err and "train." not in err, err
    assert not first_step(nn.BatchNorm2d, 16)  # (16 images: enough)
    assert not first_step(nn.BatchNorm2d, 4, frozen=True)  # (found by review: said of a frozen one)
    assert not first_step(lambda c: nn.GroupNorm(4, c), 4)  # (no BatchNorm: nothing to say)
