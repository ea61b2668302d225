"""The Replicator on its own: exact accumulation, precision, skipped steps, checkpointing, auto micro-batch."""

import copy

import pytest
import torch
from torch import nn

import bigbatch
from bigbatch.engine.memory import CPUPeak
from bigbatch.models.layers import SNConv2d, spectral_norm_hook


def classifier():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 10))


def input_fn(ctx):
    # This rank's share of each step: the examples at the step's global positions rank*share ...
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(ctx.batch, 1, 8, 8, generator=g), torch.randint(10, (ctx.batch,), generator=g)
        yield x[ctx.rank * ctx.share : (ctx.rank + 1) * ctx.share], y[ctx.rank * ctx.share : (ctx.rank + 1) * ctx.share]


def train_classifier(micro_batch, precision="fp32", **kwargs):
    rep = bigbatch.Replicator(batch=32, micro_batch=micro_batch, precision=precision, device="cpu", **kwargs)
    model = rep.prepare(classifier())
    opt = rep.wrap_optimizer(torch.optim.Adam(model.parameters(), lr=1e-2))

    def step_fn(micro):
        x, y = micro
        return nn.functional.cross_entropy(model(x), y)

    losses = [rep.step(step_fn, batch, opt) for batch in rep.batches(input_fn)]
    return torch.cat([p.detach().flatten() for p in model.parameters()]), losses, rep


def rel(a, b):
    return float((a - b).norm() / b.norm())


def test_accumulation_gives_the_full_batch_update():
    full, full_losses, _ = train_classifier(32)
    for micro in (16, 8, 4):
        params, losses, rep = train_classifier(micro)
        assert rep.plan.accumulation == 32 // micro
        assert rel(params, full) <= 1e-5
        assert losses == pytest.approx(full_losses, rel=1e-5)


def test_set_batch_changes_the_accumulation_not_the_micro_batch():
    # A dynamic-batch schedule: a step after set_batch(64) is the full-batch step of 64 examples.
    rep = bigbatch.Replicator(batch=32, micro_batch=8, device="cpu")
    assert rep.set_batch(64).accumulation == 8 and rep.plan.micro_batch == 8 and rep.share == 64
    with pytest.raises(bigbatch.BigbatchError, match="not a multiple of micro_batch x world_size"):
        rep.set_batch(12)
    # A share below a fixed micro-batch is one micro-batch; a later larger batch splits by the one asked.
    capped = bigbatch.Replicator(batch=4, micro_batch=8, device="cpu")
    assert (capped.plan.micro_batch, capped.plan.accumulation, capped.plan.micro_batch_asked) == (4, 1, 8)
    assert capped.set_batch(32).micro_batch == 8 and capped.plan.accumulation == 4
    x, y = torch.randn(64, 1, 8, 8), torch.randint(10, (64,))
    params = []
    for r in (rep, bigbatch.Replicator(batch=64, micro_batch=64, device="cpu")):
        model = r.prepare(classifier())
        opt = r.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        r.step(lambda m, model=model: nn.functional.cross_entropy(model(m[0]), m[1]), (x, y), opt)
        params.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert rel(params[0], params[1]) <= 1e-5
    # With micro_batch "auto", a share the planned micro-batch does not divide takes the largest divisor
    # below it, and a later batch it divides returns to it.
    auto = bigbatch.Replicator(batch=32, micro_batch="auto", device="cpu")
    assert auto.set_batch(64) is None and auto.batch == 64  # not planned yet: the first step plans for 64
    auto.use_micro_batch(16)
    assert auto.set_batch(24).micro_batch == 12 and auto.set_batch(96).micro_batch == 16


def test_batches_hand_out_the_current_share_after_set_batch():
    rep = bigbatch.Replicator(batch=8, micro_batch=4, device="cpu")

    def input_fn(ctx):
        while True:
            yield torch.zeros(ctx.share)

    batches = rep.batches(input_fn)
    assert len(next(batches)) == 8
    rep.set_batch(16)
    assert len(next(batches)) == 16


def test_the_plan_of_auto_is_restored_through_state_dict():
    def planned(state=None):
        rep = bigbatch.Replicator(batch=32, micro_batch="auto", device="cpu", memory_budget="1GiB")
        model = rep.prepare(classifier())
        opt = rep.wrap_optimizer(torch.optim.Adam(model.parameters()), "clf")
        if state is not None:
            rep.load_state_dict(state)
        else:
            rep.plan_micro_batch(lambda m: rep.probe_step(lambda x: model(x).mean(), torch.randn(m, 1, 8, 8)))
        return rep, opt

    first, _ = planned()
    # A takes_micro that no divisor of the share passes is one line (found from outside: min() of no probes).
    rep = bigbatch.Replicator(batch=32, micro_batch="auto", device="cpu", memory_budget="1GiB")
    model = rep.prepare(classifier())
    rep.wrap_optimizer(torch.optim.Adam(model.parameters()), "clf")
    rep.takes_micro = lambda m: m % 3 == 0
    with pytest.raises(bigbatch.BigbatchError, match="no micro-batch to try: no divisor of this rank's share"):
        rep.plan_micro_batch(lambda m: rep.probe_step(lambda x: model(x).mean(), torch.randn(m, 1, 8, 8)))
    again, opt = planned(first.state_dict())
    assert not again.micro_batch_pending  # settled by the state: no probing
    assert (again.plan, again.budget, again.probes) == (first.plan, first.budget, first.probes)
    # A step runs on the restored plan, and its gradient norm is there to log.
    model = again.models[0][1]
    x, y = torch.randn(32, 1, 8, 8), torch.randint(10, (32,))
    again.step(lambda m: nn.functional.cross_entropy(model(m[0]), m[1]), (x, y), opt)
    assert again.grad_norm(opt) > 0


def test_bf16_and_fp16_train_close_to_fp32():
    full, full_losses, _ = train_classifier(32)
    for precision in ("bf16", "fp16"):
        params, losses, rep = train_classifier(8, precision)
        assert rel(params, full) < 0.05, precision
        assert losses[0] == pytest.approx(full_losses[0], rel=0.02)
        assert all(p.dtype == torch.float32 for p in rep.unwrap(rep.models[0][1]).parameters())


def test_step_with_non_finite_gradients_is_skipped_and_counted(capsys):
    rep = bigbatch.Replicator(batch=8, micro_batch=4, precision="fp16", device="cpu", skip_limit=0.5, skip_window=4)
    model = rep.prepare(classifier())
    opt = rep.wrap_optimizer(torch.optim.Adam(model.parameters(), lr=1e-2), "clf")
    x, y = torch.randn(8, 1, 8, 8), torch.randint(10, (8,))
    scale = {"value": 1.0}

    def step_fn(micro):
        return nn.functional.cross_entropy(model(micro[0]), micro[1]) * scale["value"]

    rep.step(step_fn, (x, y), opt)
    assert not rep.skipped(opt)
    before = [p.detach().clone() for p in model.parameters()]
    scale["value"] = float("inf")
    rep.step(step_fn, (x, y), opt)
    assert rep.skipped(opt)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))  # never applied
    assert all(p.grad is None for p in model.parameters())
    assert rep.counters()["clf"]["skipped"] == 1
    assert "clf step 2 skipped" in capsys.readouterr().err
    rep.step(step_fn, (x, y), opt)  # 2 of the last 3: at the limit (0.5 x 4), not over it
    with pytest.raises(bigbatch.BigbatchError, match="3 of the last 4 clf steps had a non-finite loss or gradients"):
        rep.step(step_fn, (x, y), opt)


def test_a_step_whose_loss_is_not_finite_is_skipped_though_its_gradients_are():
    # Found from outside: an infinite loss whose gradients were finite (an fp16 forward that overflowed into a
    # term with no gradient) was applied and logged as inf, neither skipped nor counted.
    rep = bigbatch.Replicator(batch=8, micro_batch=8, device="cpu", skip_window=4, skip_limit=0.5)
    model = rep.prepare(classifier())
    opt = rep.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), "clf")
    x, y = torch.randn(8, 1, 8, 8), torch.randint(10, (8,))
    before = [p.detach().clone() for p in model.parameters()]
    loss = rep.step(lambda m: nn.functional.cross_entropy(model(m[0]), m[1]) + torch.tensor(float("inf")), (x, y), opt)
    assert loss == float("inf") and rep.skipped(opt) and rep.counters()["clf"]["skipped"] == 1
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_fp16_loss_scale_settling_is_not_a_divergence():
    # Found from outside: a sum-reduced loss (SAEHD's mean x batch) overflows fp16 at the scaler's first
    # scales; plain torch.amp skips those steps until the scale fits and trains on, but each skip counted
    # towards skip_limit and the healthy run stopped at its 11th step, advised to lower the learning rate.
    torch.manual_seed(0)
    x, y = torch.randn(16, 10), torch.randn(16, 1) * 2000
    net = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 1))
    plain = copy.deepcopy(net)
    rep = bigbatch.Replicator(batch=16, precision="fp16", device="cpu")
    model = rep.prepare(net)
    opt = rep.wrap_optimizer(torch.optim.Adam(model.parameters(), lr=1e-3), "net")
    losses = []
    for _ in range(30):
        losses.append(rep.step(lambda m: nn.functional.mse_loss(model(m[0]), m[1], reduction="sum"), (x, y), opt))
    plain_opt, scaler, plain_skips = torch.optim.Adam(plain.parameters(), lr=1e-3), torch.amp.GradScaler("cpu"), 0
    for _ in range(30):
        plain_opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.mse_loss(plain(x), y, reduction="sum")
        scaler.scale(loss).backward()
        before = scaler.get_scale()
        scaler.step(plain_opt)
        scaler.update()
        plain_skips += scaler.get_scale() < before
    assert rep.counters()["net"]["skipped"] == plain_skips > 10  # more than skip_limit x skip_window
    assert losses[-1] < losses[0]


def test_fp16_uses_one_loss_scaler_per_optimizer():
    rep = bigbatch.Replicator(batch=8, micro_batch=8, precision="fp16", device="cpu")
    a, b = rep.prepare(classifier()), rep.prepare(classifier())
    opt_a = rep.wrap_optimizer(torch.optim.SGD(a.parameters(), lr=0.1), "a")
    opt_b = rep.wrap_optimizer(torch.optim.SGD(b.parameters(), lr=0.1), "b")
    x, y = torch.randn(8, 1, 8, 8), torch.randint(10, (8,))
    rep.step(lambda m: nn.functional.cross_entropy(a(m[0]), m[1]) * float("inf"), (x, y), opt_a)
    rep.step(lambda m: nn.functional.cross_entropy(b(m[0]), m[1]), (x, y), opt_b)
    counters = rep.counters()
    assert counters["a"]["loss_scale"] == counters["b"]["loss_scale"] / 2  # only a's scaler backed off
    state = rep.state_dict()
    again = bigbatch.Replicator(batch=8, micro_batch=8, precision="fp16", device="cpu")
    again.wrap_optimizer(torch.optim.SGD(again.prepare(classifier()).parameters(), lr=0.1), "a")
    again.load_state_dict(state)
    restored = again.counters()["a"]
    assert (restored["steps"], restored["skipped"], restored["loss_scale"]) == (1, 1, counters["a"]["loss_scale"])


def test_wrong_share_size_and_bad_step_output_are_clear_errors():
    rep = bigbatch.Replicator(batch=8, micro_batch=4, device="cpu")
    model = rep.prepare(classifier())
    opt = rep.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(bigbatch.BigbatchError, match="must hold batch / world_size = 8 examples, got 6"):
        rep.step(lambda m: model(m).sum(), torch.randn(6, 1, 8, 8), opt)
    with pytest.raises(bigbatch.BigbatchError, match="mean loss as a real scalar tensor"):
        rep.step(lambda m: model(m), torch.randn(8, 1, 8, 8), opt)
    with pytest.raises(bigbatch.BigbatchError, match="real scalar tensor with a graph, got a torch.complex64 tensor"):
        rep.step(lambda m: model(m).mean() * (1 + 1j), torch.randn(8, 1, 8, 8), opt)  # (it was taken, found outside)
    with pytest.raises(bigbatch.BigbatchError, match="wrap_optimizer"):
        rep.step(lambda m: model(m).sum(), torch.randn(8, 1, 8, 8), torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(bigbatch.BigbatchError, match="needs a batch dimension .*got a 0-d tensor"):
        rep.step(lambda m: model(m[0]).sum(), (torch.randn(8, 1, 8, 8), torch.tensor(1.0)), opt)
    x = torch.randn(8, 1, 8, 8)  # (found from outside: "got int" of a list of labels and of a dict's int)
    for batch, got in (((x, list(range(8))), "a list of int"), ({"x": x, "epoch": 3}, "its 'epoch' int")):
        with pytest.raises(bigbatch.BigbatchError, match=f"got {got}: give per-example numbers as a tensor"):
            rep.step(lambda m: model(m[0]).sum(), batch, opt)
    for stat, shown in ((torch.ones(3), "a tensor of shape \\(3,\\)"), ("x", "'x'")):  # (raw torch errors before)
        with pytest.raises(
            bigbatch.BigbatchError, match=f"'acc' must be a number or a one-element tensor.*got {shown}"
        ):
            rep.step(lambda m, stat=stat: {"loss": model(m).mean(), "acc": stat}, torch.randn(8, 1, 8, 8), opt)
    with pytest.raises(bigbatch.BigbatchError, match="unknown precision"):
        bigbatch.Replicator(batch=8, precision="fp8")
    # Found from outside: these were taken (a device string as the CPU, -1 and NaN as "no clipping", True as 1).
    for kwargs, message in [
        ({"device": "cuda:0"}, "device .* must be 'auto', 'cpu' or 'cuda'"),
        ({"grad_clip": -1}, "grad_clip must be a global gradient norm >= 0"),
        ({"grad_clip": float("nan")}, "grad_clip must be"),
        ({"batch": True}, "batch=True must be a whole number"),
        ({"batch": 8.0}, "batch=8.0 must be a whole number, a positive multiple"),
        ({"micro_batch": True}, "micro_batch must be a positive integer"),
        ({"skip_limit": "x"}, "skip_limit must be in \\[0, 1\\] .* got 'x'"),  # (a TypeError from a comparison)
        ({"skip_window": 2.5}, "skip_window a whole number >= 1, got 0.2 and 2.5"),  # (deque's TypeError, later)
    ]:
        with pytest.raises(bigbatch.BigbatchError, match=message):
            bigbatch.Replicator(**{"batch": 8, "micro_batch": 4, "device": "cpu", **kwargs})


def test_optimizer_names_are_what_a_checkpoint_keeps_them_by():
    # Two optimizers under one name shared one loss scaler and skip history in state_dict(); a state of other
    # names loaded as nothing.
    rep = bigbatch.Replicator(batch=8, micro_batch=4, precision="fp16", device="cpu")
    a, b = rep.prepare(classifier()), rep.prepare(classifier())
    opt_a = rep.wrap_optimizer(torch.optim.SGD(a.parameters(), lr=0.1), "x")
    with pytest.raises(bigbatch.BigbatchError, match="already wrapped under the name 'x'"):
        rep.wrap_optimizer(torch.optim.SGD(b.parameters(), lr=0.1), "x")
    assert rep.wrap_optimizer(opt_a, "x") is opt_a  # the same optimizer again: still one entry
    rep.wrap_optimizer(torch.optim.SGD(b.parameters(), lr=0.1), "opt2")
    rep.wrap_optimizer(torch.optim.SGD(b.parameters(), lr=0.1))  # a default name passes over the names taken
    assert sorted(rep.state_dict()["optimizers"]) == ["opt2", "opt3", "x"]
    with pytest.raises(bigbatch.BigbatchError, match="already wrapped under the name 'opt3'"):
        rep.wrap_optimizer(torch.optim.SGD(b.parameters(), lr=0.1), "opt3")
    other = bigbatch.Replicator(batch=8, micro_batch=4, precision="fp16", device="cpu")
    other.wrap_optimizer(torch.optim.SGD(other.prepare(classifier()).parameters(), lr=0.1), "D")
    with pytest.raises(bigbatch.BigbatchError, match=r"holds optimizers \['opt2', 'opt3', 'x'\], .* has \['D'\]"):
        other.load_state_dict(rep.state_dict())
    with pytest.raises(bigbatch.BigbatchError, match="holds optimizers"):
        other.load_state_dict({"junk": 1})


def sn_discriminator_steps(micro_batch, hook=False, checkpointing=False, prepare=True):
    """A user's own loop: a zoo D with spectral norm trained through the Replicator alone, in float64
    (`prepare=False`: D used as it is, its spectral norm driven by the hook alone)."""
    torch.manual_seed(0)
    _, D = bigbatch.models.create("sngan", 32, 10, ch=8, dim_z=16)
    D = D.double()
    rep = bigbatch.Replicator(batch=32, micro_batch=micro_batch, device="cpu", checkpointing=checkpointing)
    D_train = rep.prepare(D) if prepare else D
    if hook:
        rep.on_micro_batch(spectral_norm_hook(D))  # prepared, D iterates through the engine: the hook leaves it
    opt = rep.wrap_optimizer(torch.optim.Adam(D.parameters(), lr=1e-2))
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        x = torch.randn(32, 3, 32, 32, generator=g, dtype=torch.float64)
        y = torch.randint(10, (32,), generator=g)
        rep.step(lambda m: nn.functional.softplus(-D_train(*m)).mean(), (x, y), opt)
    return torch.cat([t.detach().flatten() for t in D.state_dict().values() if t.is_floating_point()])


def test_spectral_norm_accumulates_exactly_without_a_hook():
    # Found from outside: without the hook a user had to remember, 8 x 4 differed from 32 by 0.72-1.9.
    assert any(isinstance(m, SNConv2d) for m in bigbatch.models.create("sngan", 32, 10, ch=8, dim_z=16)[1].modules())
    full = sn_discriminator_steps(32)
    assert rel(sn_discriminator_steps(8), full) <= 1e-12
    assert rel(sn_discriminator_steps(8, checkpointing=True), full) <= 1e-12
    assert rel(sn_discriminator_steps(8, hook=True), full) <= 1e-12
    assert rel(sn_discriminator_steps(8, hook=True, prepare=False), full) <= 1e-12  # a model it did not prepare


def gan_grads(checkpointing, family):
    torch.manual_seed(0)
    options = {"g_sn": True} if family == "dcgan" else {}
    resolution = {"dcgan": 16, "biggan_deep": 128}.get(family, 32)
    G, D = bigbatch.models.create(family, resolution, 10, ch=8, dim_z=16, **options)
    rep = bigbatch.Replicator(batch=16, micro_batch=8, device="cpu", checkpointing=checkpointing)
    G_train, D_train = rep.prepare(G), rep.prepare(D)  # spectral norm: armed by the engine, once per step
    opt = rep.wrap_optimizer(torch.optim.SGD(G.parameters(), lr=0.0))  # lr 0: look at gradients and buffers
    grads = {}

    def step_fn(micro):
        z, y = micro
        loss = -D_train(G_train(z, y), y).mean()
        return loss

    z, y = torch.randn(16, 16, generator=torch.Generator().manual_seed(2)), torch.arange(16) % 10
    for p in G.parameters():
        p.register_post_accumulate_grad_hook(lambda p: grads.__setitem__(id(p), p.grad.clone()))
    peak = CPUPeak()
    with peak:
        rep.step(step_fn, (z, y), opt)
    order = [grads[id(p)] for p in G.parameters()]
    return order, {k: v.clone() for k, v in G.state_dict().items()}, peak.peak


@pytest.mark.parametrize("family", bigbatch.models.list_models("gan"))
def test_activation_checkpointing_changes_memory_not_results(family):
    plain_grads, plain_state, plain_peak = gan_grads(False, family)
    ckpt_grads, ckpt_state, ckpt_peak = gan_grads(True, family)
    for a, b in zip(plain_grads, ckpt_grads):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
    # BatchNorm running statistics and spectral-norm vectors advance once per forward, not again in
    # the recomputation.
    for k in plain_state:
        assert torch.equal(plain_state[k], ckpt_state[k]), k
    counts = [v for k, v in plain_state.items() if k.endswith("num_batches_tracked")]
    assert (counts or family == "stylegan2") and all(c == 2 for c in counts)  # two micro-batches (StyleGAN2: no BN)
    assert ckpt_peak < plain_peak


def test_checkpointing_supports_double_backward():
    # R1 needs the gradient of the gradient; non-reentrant checkpointing gives it.
    torch.manual_seed(0)
    _, D = bigbatch.models.create("dcgan", 16, 0, ch=8, dim_z=16)
    rep = bigbatch.Replicator(batch=4, micro_batch=4, device="cpu", checkpointing=True)
    D_train = rep.prepare(D)
    opt = rep.wrap_optimizer(torch.optim.SGD(D.parameters(), lr=0.1))

    def r1(micro):
        x = micro.requires_grad_(True)
        (g,) = torch.autograd.grad(D_train(x).sum(), x, create_graph=True)
        return g.square().sum(dim=(1, 2, 3)).mean()

    assert rep.step(r1, torch.randn(4, 3, 16, 16), opt) > 0


def test_auto_micro_batch_is_the_largest_that_fits_the_budget():
    def planned(budget):
        rep = bigbatch.Replicator(batch=32, micro_batch="auto", device="cpu", memory_budget=budget)
        model = rep.prepare(classifier())
        opt = rep.wrap_optimizer(torch.optim.Adam(model.parameters(), lr=1e-2))
        batch = next(iter(rep.batches(input_fn)))
        loss = rep.step(lambda m: nn.functional.cross_entropy(model(m[0]), m[1]), batch, opt)
        return rep, loss

    big, loss_big = planned("1GiB")
    assert big.plan.micro_batch == 32 and big.plan.accumulation == 1
    peaks = {p.micro_batch: p.peak_bytes for p in big.probes}
    assert sorted(peaks.values()) == [peaks[m] for m in sorted(peaks)]  # more images, more memory
    # A budget between the peaks of micro-batches 16 and 32 picks 16, with accumulation 2.
    small, loss_small = planned((peaks[16] + peaks[32]) // 2)
    assert small.plan.micro_batch == 16 and small.plan.accumulation == 2
    assert loss_small == pytest.approx(loss_big, rel=1e-5)  # probing left no trace on the step
    with pytest.raises(bigbatch.BigbatchError, match="over the memory budget"):
        planned(1000)


def test_auto_micro_batch_on_cpu_extrapolates_above_64_and_the_extrapolation_holds():
    # A CPU probe is a whole forward and backward: ImageNet's batch of 4,096 spent minutes in its probes.
    # Above 64 the peaks are extrapolated from the two largest probed; a probe at the size picked agrees.
    from bigbatch.engine import memory

    def planned(budget):
        rep = bigbatch.Replicator(batch=1024, micro_batch="auto", device="cpu", memory_budget=budget)
        model = rep.prepare(classifier())
        opt = rep.wrap_optimizer(torch.optim.Adam(model.parameters(), lr=1e-2))

        def probe(m):  # (from freed gradients, as the planner probes: they count in each peak)
            memory.zero_grads([model, opt])
            x, y = torch.randn(m, 1, 8, 8), torch.randint(10, (m,))
            rep.probe_step(lambda b: nn.functional.cross_entropy(model(b[0]), b[1]), (x, y))

        rep.plan_micro_batch(probe, [opt])
        return rep, probe

    big, probe = planned("1GiB")
    assert big.plan.micro_batch == 1024
    # (the two smallest first: CPU planning's scouts, whose line puts no size probed past 1.5x the budget)
    probed = [(1, True), (2, True), (32, True), (64, True), (1024, False)]
    assert [(p.micro_batch, p.measured) for p in big.probes] == probed
    extrapolated, at_64_planned = big.probes[-1].peak_bytes, big.probes[3].peak_bytes
    at_64, at_1024 = (memory.measure(probe, m, big.device, 2**40, 0).peak_bytes for m in (64, 1024))
    assert at_1024 - at_64 == pytest.approx(extrapolated - at_64_planned, rel=0.02)
    # A budget between the extrapolated peaks of 256 and 512 picks 256 (4 micro-batches), probing nothing above 64.
    per_image = (extrapolated - at_64_planned) / (1024 - 64)
    small, _ = planned(int(at_64_planned + per_image * (384 - 64)))
    assert small.plan.micro_batch == 256 and small.plan.accumulation == 4
    assert [p.micro_batch for p in small.probes if p.measured] == [1, 2, 32, 64]
    extrapolated = [(p.micro_batch, p.fits) for p in small.probes if not p.measured]
    assert extrapolated == [(256, True), (512, False), (1024, False)]


def test_compile_trains_the_same_weights():
    eager, _, _ = train_classifier(8)
    compiled, _, rep = train_classifier(8, compile=True)
    assert type(rep.models[0][1]).__name__ == "OptimizedModule"
    assert rel(compiled, eager) <= 1e-5


def test_checkpointed_blocks_compile_too():
    # torch.compile cannot trace a checkpoint with a recompute context: the blocks compile apart.
    def d_step(**settings):
        torch.manual_seed(0)
        _, D = bigbatch.models.create("dcgan", 16, 0, ch=4, dim_z=8, d_sn=False)  # BN in D
        rep = bigbatch.Replicator(batch=8, micro_batch=4, device="cpu", **settings)
        D_train = rep.prepare(D)
        opt = rep.wrap_optimizer(torch.optim.SGD(D.parameters(), lr=0.1))
        rep.step(lambda x: D_train(x).square().mean(), torch.randn(8, 3, 16, 16, generator=torch.Generator()), opt)
        return torch.cat([p.detach().flatten() for p in D.parameters()])

    eager = d_step()
    assert rel(d_step(checkpointing=True, compile=True), eager) <= 1e-5


def test_spectral_norm_under_accumulation_compiles_one_graph_and_iterates_once_a_step():
    # The step's power iteration runs before its first micro-batch, outside the forward: a compiled D
    # traces one graph for every micro-batch, not one that iterates and one that does not (twice the
    # compile time; on a GPU, BigGAN-128's compile did not finish in the proof's limit).
    import torch.nn.functional as F
    from torch._dynamo.utils import counters

    def d_steps(compile: bool):
        torch.manual_seed(0)
        _, D = bigbatch.models.create("dcgan", 16, 0, ch=4, dim_z=8, d_sn=True)
        rep = bigbatch.Replicator(batch=8, micro_batch=2, device="cpu", compile=compile)
        D_train = rep.prepare(D)
        opt = rep.wrap_optimizer(torch.optim.SGD(D.parameters(), lr=0.1))
        x = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(1))
        layer = next(m for m in D.modules() if isinstance(m, SNConv2d))
        u, weights, memory = layer.sn_u.clone(), [], (layer.sn_u.data_ptr(), layer.sn_v.data_ptr())
        for _ in range(2):
            weights.append(layer.weight.detach().flatten(1).clone())
            rep.step(lambda x: D_train(x).square().mean(), x, opt)
        # u and v advance in their own memory: CUDA graphs read the buffers where they were recorded.
        assert (layer.sn_u.data_ptr(), layer.sn_v.data_ptr()) == memory
        return D, layer, u, weights

    torch._dynamo.reset()
    counters.clear()
    compiled, *_ = d_steps(compile=True)
    assert counters["stats"]["unique_graphs"] == 1
    eager, layer, u, weights = d_steps(compile=False)
    for w in weights:  # one power iteration a step (of 4 micro-batches), on the weights of its start
        u = F.normalize(F.normalize(u @ w, dim=1, eps=layer.sn_eps) @ w.t(), dim=1, eps=layer.sn_eps)
    assert torch.equal(layer.sn_u, u)
    flat = [torch.cat([p.detach().flatten() for p in D.parameters()]) for D in (compiled, eager)]
    assert rel(*flat) <= 1e-5


def test_spectral_norm_stays_fp32_under_autocast():
    torch.manual_seed(0)
    G, _ = bigbatch.models.create("dcgan", 16, 0, ch=4, dim_z=8, g_sn=True)
    rep = bigbatch.Replicator(batch=4, micro_batch=4, precision="bf16", device="cpu")
    G_train = rep.prepare(G)
    opt = rep.wrap_optimizer(torch.optim.SGD(G.parameters(), lr=0.1))
    rep.step(lambda z: G_train(z).square().mean(), torch.randn(4, 8), opt)
    assert all(b.dtype == torch.float32 for b in G.buffers() if b.is_floating_point())
    G.eval()(torch.randn(2, 8))  # and the model still runs outside autocast


def test_a_cpu_replicator_keeps_freed_memory_for_the_next_step():
    # glibc maps large blocks afresh and returns freed memory: each step's activations were faulted in
    # again (2 million page faults a SAEHD step at 256 px). A CPU Replicator keeps them.
    import subprocess
    import sys

    code = """
import ctypes, resource, torch
import bigbatch

ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE: 4 KiB pages, so the counts do not depend on THP

def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        torch.ones(16 * 2**20)  # 64 MiB written, then freed
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

plain = faults()
bigbatch.Replicator(batch=8, micro_batch=8, device="cpu")
faults(), faults()  # the heap's layout settles in a round or two (aligned blocks land beside freed ones)
print(plain, faults() + faults() + faults())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    plain, held = map(int, out.stdout.split())
    # plain: 5 blocks faulted in afresh; held: 15 blocks taken again from freed memory
    assert plain > 5 * 10_000 and held < plain / 20, (plain, held)


def test_bigbatch_asks_cuda_for_expandable_segments_unless_the_user_chose():
    # Fixed-size segments fragment: SAEHD 512 at batch 8 fits 6 GiB on a GPU only with expandable ones.
    # The allocator reads the setting when it first allocates, so importing bigbatch after torch still counts.
    import os
    import subprocess
    import sys

    code = "import torch, bigbatch; print(torch._C._accelerator_getAllocatorSettings() or '-')"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")}
    cases = [({}, "expandable_segments:True"), ({"PYTORCH_ALLOC_CONF": ""}, "-")]
    cases.append(({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"}, "max_split_size_mb:64"))
    for own, want in cases:
        out = subprocess.run([sys.executable, "-c", code], env={**env, **own}, capture_output=True, text=True)
        assert out.stdout.strip() == want, (own, out.stdout, out.stderr)


def planned_and_compiled(device: str, budget: int | str) -> tuple[int, dict]:
    """Two steps of a compiled model under micro_batch "auto": how many sizes were probed, and Dynamo's frames."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
    rep = bigbatch.Replicator(batch=64, micro_batch="auto", compile=True, memory_budget=budget, device=device)
    train = rep.prepare(model)
    opt = rep.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    x = torch.randn(64, 64)
    counters.clear()
    for _ in range(2):
        rep.step(lambda m: train(m).square().mean(), x, opt)
    return len(rep.probes), dict(counters["frames"])


def test_micro_batch_auto_probes_eagerly_and_the_model_still_compiles():
    # A compiled model called under CPUPeak's dispatch mode stopped compiling for the whole process: with
    # micro_batch "auto" on CPU, train.compile then never compiled. It compiles once, at the plan.
    probes, frames = planned_and_compiled("cpu", "1GiB")
    assert probes > 1 and frames == {"total": 1, "ok": 1}, frames


def test_code_marked_eager_breaks_a_compiled_graph_and_nothing_imports_dynamo_before():
    # What torch.compile must run as is (checkpointed blocks' calls, StyleGAN2's per-image draws) is marked,
    # and disabled for Dynamo only when a model is compiled: importing Dynamo at import time cost every
    # command that never compiles ~2.4 s.
    import subprocess
    import sys

    from torch._dynamo.utils import counters

    from bigbatch.compiling import disable_marked, eager

    code = "import sys, bigbatch.loop, bigbatch.models.stylegan2; print('torch._dynamo' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"

    class Net(torch.nn.Module):
        @eager
        def drawn(self, x):
            return x + 1  # traceable: only the mark keeps Dynamo out

        def forward(self, x):
            return self.drawn(x * 2) * 3

    breaks = []
    for disable in (False, True):
        net = Net()
        if disable:
            disable_marked(net)
            disable_marked(net)  # once per class
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(net, backend="eager")
        assert torch.equal(compiled(torch.ones(3)), net(torch.ones(3)))
        breaks.append(sum(counters["graph_break"].values()))
    assert breaks[0] == 0 and breaks[1] >= 1  # marked and disabled: the method ran outside the graph


def test_auto_checks_the_batch_before_it_probes_and_a_resumed_plan_fits_another_batch():
    # Found from outside: with "auto", a bad batch was a probe's traceback; a plan of 48 loaded at batch 64 raised.
    rep = bigbatch.Replicator(batch=64, memory_budget="1GiB")
    model = rep.prepare(classifier())
    opt = rep.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = torch.randn(64, 1, 8, 8), torch.randint(10, (64,))
    for bad in ((x, y[:32]), (x.transpose(0, 1), y)):
        with pytest.raises(bigbatch.BigbatchError, match="must agree in dim 0, got lengths"):
            rep.step(lambda m: nn.functional.cross_entropy(model(m[0]), m[1]), bad, opt)
    assert rep.use_micro_batch(48).micro_batch == 32 and rep.plan.accumulation == 2  # (48 does not divide 64)
    with pytest.raises(bigbatch.BigbatchError, match="must be a whole number, a positive multiple"):
        rep.set_batch(True)
