"""A script of its own kind (a diffusion model, found from outside) on the Replicator: randomness drawn for the step's
whole batch from the input function's keyed generator trains the same weights at any micro-batch, and what a script
gets wrong about its input or its resume is said."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import bigbatch

BATCH, STEPS = 16, 3


def diffusion(micro_batch: int, in_step: bool = False) -> nn.Module:
    """A denoiser trained on noise and noise levels drawn per step from ctx.generator, as the README shows (or, with
    `in_step`, its noise drawn by the step function from torch's global generator)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(2, 8, 3, padding=1), nn.GELU(), nn.Conv2d(8, 1, 3, padding=1))
    rep = bigbatch.Replicator(batch=BATCH, micro_batch=micro_batch, device="cpu")
    model = rep.prepare(net)
    opt = rep.wrap_optimizer(torch.optim.Adam(model.parameters(), lr=1e-2))
    images = torch.linspace(-1, 1, 64 * 36).reshape(64, 1, 6, 6)

    def input_fn(ctx):
        for step in range(STEPS):
            g = ctx.generator(step, seed=7)
            noise = torch.randn(ctx.batch, 1, 6, 6, generator=g, device=ctx.device)[ctx.rows]
            level = torch.rand(ctx.batch, generator=g, device=ctx.device)[ctx.rows]
            yield images[step * BATCH : (step + 1) * BATCH][ctx.rows], noise, level

    def step_fn(micro):
        x, noise, level = micro
        if in_step:  # (each micro-batch's levels, then its noise: a split interleaves them otherwise)
            level, noise = torch.rand_like(level), torch.randn_like(noise)
        noisy = x + level.view(-1, 1, 1, 1) * noise
        guess = model(torch.cat([noisy, level.view(-1, 1, 1, 1).expand_as(noisy)], 1))
        return ((guess - noise) ** 2).mean()

    for share in rep.batches(input_fn):
        rep.step(step_fn, share, opt)
    return net


def test_draws_from_the_input_functions_generator_train_the_same_weights_at_any_micro_batch():
    whole, quarters = diffusion(BATCH), diffusion(BATCH // 4)
    for a, b in zip(whole.parameters(), quarters.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    drawn_in_step = diffusion(BATCH, in_step=True), diffusion(BATCH // 4, in_step=True)
    assert not torch.allclose(drawn_in_step[0][0].weight, drawn_in_step[1][0].weight, rtol=0, atol=1e-3)
    ctx = bigbatch.InputContext(bigbatch.Replicator(batch=8, micro_batch=8, device="cpu"))
    first, again = (torch.rand(3, generator=ctx.generator(5)) for _ in range(2))
    assert torch.equal(first, again) and not torch.equal(first, torch.rand(3, generator=ctx.generator(6)))
    assert ctx.rows == slice(0, 8)
    with pytest.raises(bigbatch.BigbatchError, match="takes a step number"):
        ctx.generator(-1)


def test_what_a_script_gets_wrong_of_its_input_or_its_resume_is_said(tmp_path, capsys):
    rep = bigbatch.Replicator(batch=4, micro_batch=2, device="cpu")
    model = rep.prepare(nn.Linear(3, 1))
    opt = rep.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    # (found from outside: a data set smaller than the batch yielded no step, unsaid)
    assert list(rep.batches(lambda ctx: iter(()))) == []
    assert "the input function yielded no step's share (batch 4): nothing trained" in capsys.readouterr().err
    # (found from outside: a list of examples was read as fields, "got 1")
    with pytest.raises(bigbatch.BigbatchError, match="a list of 4 is read as a batch's fields; torch.stack"):
        rep.step(lambda x: model(x).mean(), [torch.randn(1, 3) for _ in range(4)], opt)
    with pytest.raises(bigbatch.BigbatchError, match="a list of 4 is read as a batch's fields; torch.stack"):
        rep.step(lambda x: model(x).mean(), [(torch.randn(3), torch.tensor(1)) for _ in range(4)], opt)  # (pairs)
    rep.step(lambda x: model(x).mean(), torch.randn(4, 3), opt)
    rep.save(tmp_path / "ckpt", model=model, opt=opt)
    # (found from outside: a script resumed at another batch went on without a word)
    for batch, said in ((8, True), (4, False)):
        again = bigbatch.Replicator(batch=batch, micro_batch=2, device="cpu")
        model = again.prepare(nn.Linear(3, 1))
        opt = again.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        again.load(tmp_path / "ckpt", model=model, opt=opt)
        capsys.readouterr()
        again.step(lambda x, m=model: m(x).mean(), torch.randn(batch, 3), opt)
        err = capsys.readouterr().err
        assert ("batch 8, 4 in the state loaded" in err and "give batch=4 to go on as it did" in err) == said, err


def test_an_ema_of_a_scripts_model_averages_by_images_and_resumes_with_it(tmp_path):
    def run(steps, batch, load=None, save=None):
        torch.manual_seed(0)
        rep = bigbatch.Replicator(batch=batch, micro_batch=batch, device="cpu")
        model = rep.prepare(nn.Linear(3, 2))
        opt = rep.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.5))
        ema = bigbatch.EMA(model, halflife_kimg=0.008)
        start = rep.load(load, model=model, opt=opt, ema=ema)["step"] if load else 0
        for step in range(start, steps):
            x = torch.linspace(-1, 1, 3 * batch).reshape(batch, 3) * (step + 1)
            rep.step(lambda x: model(x).square().mean(), x, opt)
            ema.update(rep.batch)
            if save and step + 1 == save[1]:
                rep.save(save[0], model=model, opt=opt, ema=ema, step=step + 1)
        return model, ema

    model, ema = run(4, 8, save=(tmp_path / "ckpt", 2))
    assert int(ema.nimg) == 32 and not ema.training and not any(p.requires_grad for p in ema.parameters())
    assert not torch.equal(ema.module.weight, model.weight)  # (an average, behind the weights)
    _, resumed = run(4, 8, load=tmp_path / "ckpt")
    assert torch.equal(resumed.module.weight, ema.module.weight) and int(resumed.nimg) == 32
    one = bigbatch.EMA(nn.Linear(3, 2), halflife_kimg=0.008)
    w0 = one.module.weight.clone()
    one.live.weight.data.add_(1.0)
    one.update(8)  # (a half-life of 8 images: half of the way)
    torch.testing.assert_close(one.module.weight, w0 + 0.5)
    with pytest.raises(bigbatch.BigbatchError, match="EMA takes a model and a half-life"):
        bigbatch.EMA(nn.Linear(3, 2), halflife_kimg="10")
    for wrong in (-16, 2.5, "16"):  # (found from outside: -16 moved the average away from the model)
        with pytest.raises(bigbatch.BigbatchError, match="EMA.update takes the step's images"):
            one.update(wrong)
    compiled = bigbatch.EMA(torch.compile(nn.Linear(3, 2)), halflife_kimg=1)  # (what prepare returns, compiled)
    assert set(compiled.state_dict()) == {"module.weight", "module.bias", "nimg"}
