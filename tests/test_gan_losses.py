"""The GAN losses beside hinge and non-saturating (train.loss "ls" and "wgan": StudioGAN's least_square and
wasserstein) and WGAN-GP's gradient penalty (train.gp): the papers' formulas, a penalty that trains D and is the same
for any split of the step (world-size invariance: tests/test_distributed.py's ada variant), and what a run of them
says of a D that defeats them."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from bigbatch.cli import main
from bigbatch.tasks.gan import losses


def test_least_squares_and_wasserstein_are_the_papers():
    real, fake = torch.tensor([1.5, -0.5, 0.25]), torch.tensor([0.5, 2.0, -1.0])
    # LSGAN (a = 0, b = c = 1), as StudioGAN's d_ls and g_ls: 0.5 (D(x) - 1)^2 + 0.5 D(G(z))^2; 0.5 (D(G(z)) - 1)^2
    ls_d = sum(0.5 * (r - 1) ** 2 + 0.5 * f**2 for r, f in zip(real.tolist(), fake.tolist())) / 3
    ls_g = sum(0.5 * (f - 1) ** 2 for f in fake.tolist()) / 3
    assert losses.D_LOSS["ls"](real, fake).item() == pytest.approx(ls_d)
    assert losses.G_LOSS["ls"](fake).item() == pytest.approx(ls_g)
    # WGAN: the critic minimizes E[D(G(z))] - E[D(x)], G minimizes -E[D(G(z))]
    assert losses.D_LOSS["wgan"](real, fake).item() == pytest.approx(fake.mean().item() - real.mean().item())
    assert losses.G_LOSS["wgan"](fake).item() == pytest.approx(-fake.mean().item())
    # RpGAN (R3GAN's): each pair's f(D(real) - D(fake)) for D, f(D(fake) - D(real)) for G, f(t) = log(1 + e^-t)
    pairs = list(zip(real.tolist(), fake.tolist()))
    assert losses.D_LOSS["rpgan"](real, fake).item() == pytest.approx(
        sum(math.log1p(math.exp(f - r)) for r, f in pairs) / 3
    )
    assert losses.g_relativistic(fake, real).item() == pytest.approx(
        sum(math.log1p(math.exp(r - f)) for r, f in pairs) / 3
    )


def test_the_gradient_penalty_is_wgan_gps_and_reaches_ds_weights():
    real, fake = torch.randn(4, 3, 5, 5), torch.randn(4, 3, 5, 5)
    mix = torch.tensor([0.0, 0.25, 0.5, 1.0])
    # A linear critic D(x) = <w, x>: its gradient is w wherever it is taken, so the penalty is (|w| - 1)^2, and its
    # gradient with respect to w is 2 (|w| - 1) w / |w|.
    w = torch.randn(3, 5, 5, requires_grad=True)
    penalty = losses.gradient_penalty(lambda x: (x * w).sum(dim=(1, 2, 3)), real, fake, mix)
    norm = w.detach().norm()
    assert penalty.item() == pytest.approx((norm.item() - 1) ** 2, rel=1e-5)
    penalty.backward()
    torch.testing.assert_close(w.grad, 2 * (norm - 1) * w.detach() / norm)
    # A quadratic critic D(x) = |x|^2 / 2, whose gradient is x itself: the penalty is taken at each image's own mix
    # a real + (1 - a) fake (a = 1: the real image; a = 0: the fake one).
    at = mix.view(4, 1, 1, 1) * real + (1 - mix.view(4, 1, 1, 1)) * fake
    want = ((at.flatten(1).norm(dim=1) - 1) ** 2).mean()
    got = losses.gradient_penalty(lambda x: 0.5 * x.square().sum(dim=(1, 2, 3)), real, fake, mix)
    assert got.item() == pytest.approx(want.item(), rel=1e-5)


SMALL = ["--preset", "digits", "data.resolution=16", "model.ch=8", "model.dim_z=16", "train.batch=16"]
WGAN_GP = ["train.loss=wgan", "train.gp=10", "model.options={d_sn=false, d_bn=false}"]
ARGS = [*SMALL, *WGAN_GP, "sample.every_kimg=0", "eval.every_kimg=0", "train.log_every_kimg=0.032"]
ARGS += ["train.kimg=0.032", "checkpoint.every_kimg=0.032", "train.micro_batch=8"]


def test_a_wgan_gp_run_logs_its_penalty_which_trains_d(tmp_path, capsys):
    # (its draws per step, the same for any split of the step: tests/test_distributed.py's ada variant)
    runs, said = {}, {}
    for gp in ("10", "0"):
        run = tmp_path / gp
        assert main(["train", *ARGS, f"train.gp={gp}", "--run-dir", str(run)]) == 0
        runs[gp] = {net: load_file(run / "checkpoints" / "000000.032" / f"{net}.safetensors") for net in "GD"}
        said[gp] = capsys.readouterr().err
    # (a D of neither spectral norm nor BatchNorm: nothing to say of it; G's BatchNorm over micro-batches of 8 is)
    assert said["10"].count("warning") == 1 and "BatchNorm statistics span only 8 images of a step's 16" in said["10"]
    assert "nothing keeps Lipschitz" in said["0"], said  # (nor anything to bound it, without the penalty)
    rows = [json.loads(line) for line in (tmp_path / "10" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["gp_penalty"] > 0 and {"loss_D", "D_real", "D_fake"} <= rows[-1].keys()
    assert "gp_penalty" not in (tmp_path / "0" / "metrics.jsonl").read_text()
    # Its first D step comes first: D's weights differ by the penalty's gradient.
    assert any(not torch.allclose(runs["10"]["D"][k], runs["0"]["D"][k]) for k in runs["0"]["D"])
    # The critic of neither norm trains biases: it is not positively homogeneous, D(2x) = 2 D(x) (found from outside:
    # its biases went with spectral norm).
    from bigbatch import models

    trained = runs["10"]["D"]
    classes = 10 if "embed.weight" in trained else 0  # (digits' classes, where its D is conditional)
    _, critic = models.create("dcgan", resolution=16, n_classes=classes, ch=8, dim_z=16, d_sn=False, d_bn=False)
    critic.load_state_dict(trained)
    x, y = torch.randn(4, 3, 16, 16), torch.arange(4) if classes else None
    with torch.no_grad():
        assert not torch.allclose(critic(2 * x, y), 2 * critic(x, y))
    assert main(["info", str(tmp_path / "10")]) == 0
    assert "wgan loss" in (out := capsys.readouterr().out) and "gradient penalty 10" in out, out


def test_an_rpgan_run_with_r1_and_r2_logs_both_and_resumes_to_the_bits_of_one_left_alone(tmp_path):
    # R3GAN's objective: RpGAN, its G on the iteration's real images, with R1 and R2 (lazily here, every 2 D steps);
    # micro_batch "auto" probes its G step, which reads real images of its own there.
    args = [*SMALL, "train.loss=rpgan", "train.r1_gamma=1", "train.r2_gamma=1", "train.r1_every=2", "train.d_steps=2"]
    args += ["train.micro_batch=auto", "sample.every_kimg=0", "eval.every_kimg=0", "train.log_every_kimg=0.032"]
    args += ["checkpoint.every_kimg=0.064"]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert main(["train", *args, "train.kimg=0.128", "--run-dir", str(whole)]) == 0
    rows = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    assert all(r["r1_penalty"] > 0 and r["r2_penalty"] > 0 and r["loss_G"] > 0 for r in rows), rows
    assert main(["train", *args, "train.kimg=0.064", "--run-dir", str(parts)]) == 0
    assert main(["train", *args, "train.kimg=0.128", "--run-dir", str(parts), "--resume"]) == 0
    for net in ("G", "D", "G_ema"):
        a, b = (load_file(run / "checkpoints" / "000000.128" / f"{net}.safetensors") for run in (whole, parts))
        assert all(torch.equal(a[k], b[k]) for k in a), net


@pytest.mark.parametrize(
    "args, said",
    [
        (["train.loss=wgan"], None),  # (digits' dcgan: spectral norm in D)
        (["train.loss=wgan", "model.options={d_sn=false, d_bn=false}"], "nothing keeps Lipschitz"),
        (["train.loss=wgan", "train.gp=10", "model.options={d_sn=false}"], "with a D that reads its batch as a whole"),
        (["train.loss=ls", "augment.pipeline=ada", "augment.policy=bgc", "augment.target=0.6"], "not centre on 0"),
        (["train.loss=wgan", "augment.policy=color", "augment.target=0.6"], "not centre on 0"),  # (DiffAugment's too)
        (["train.loss=ls", "model.options={d_sn=false}"], None),
    ],
)
def test_a_d_that_defeats_the_loss_is_said_by_the_dry_run(args, said, capsys):
    assert main(["train", *SMALL, *args, "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert (said in err) if said else ("warning" not in err), err


def test_a_loss_that_is_not_one_is_one_line(capsys):
    assert main(["train", *SMALL, "train.loss=wasserstein", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    must = "'train.loss' must be 'hinge' | 'ns' | 'ls' | 'wgan' | 'rpgan'"
    assert len(err) == 1 and f"{must} (StudioGAN's 'wasserstein' is 'wgan' here), got 'wasserstein'" in err[0], err


def test_conditional_rpgan_pairs_each_fake_with_a_real_image_of_its_class(tmp_path, monkeypatch):
    # (found from outside: pairs of any two classes, where R3GAN's generates each fake with its real image's label)
    from bigbatch.tasks.gan.task import GANTask

    calls = []  # ("D", real labels, fake labels) or ("G", fake labels), a micro-batch each
    d_loss, g_loss = GANTask.d_loss, GANTask.g_loss

    def d_looked(self, micro):
        calls.append(("D", micro[1].clone(), micro[3].clone()))
        return d_loss(self, micro)

    def g_looked(self, micro):
        calls.append(("G", micro[1].clone()))
        return g_loss(self, micro)

    monkeypatch.setattr(GANTask, "d_loss", d_looked)
    monkeypatch.setattr(GANTask, "g_loss", g_looked)
    args = [*SMALL, "train.loss=rpgan", "model.conditional=true", "train.kimg=0.064", "train.micro_batch=8"]
    args += ["train.d_steps=2", "sample.every_kimg=0", "eval.every_kimg=0", "--run-dir", str(tmp_path / "r")]
    assert main(["train", *args]) == 0
    assert [c[0] for c in calls] == ["D", "D", "D", "D", "G", "G"] * 2  # (2 iterations: 2 D steps, then G; 2 micro)
    assert all(torch.equal(c[1], c[2]) for c in calls if c[0] == "D")  # D's fakes: each of its real image's class
    for it in range(2):  # G's: of the classes of the last D step's real images (its paired ones), not the first's
        step = calls[6 * it : 6 * it + 6]
        last, first, g = (torch.cat([c[1] for c in part]) for part in (step[2:4], step[0:2], step[4:6]))
        assert torch.equal(g, last) and not torch.equal(g, first)


def test_a_regularizer_drawn_alone_is_named(tmp_path, monkeypatch):
    # (found from outside: gp_penalty drawn alone under a title of five, unnamed)
    import matplotlib.axes

    from bigbatch.plot import plot_run

    named, legend = {}, matplotlib.axes.Axes.legend
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "legend",
        lambda self, *a, **k: (
            named.setdefault(self.get_title(), self.get_legend_handles_labels()[1]) or legend(self, *a, **k)
        ),
    )
    rows = [{"kimg": 0.1, "step": 1, "loss_D": 1.0, "gp_penalty": 0.5}, {"kimg": 0.2, "step": 2, "gp_penalty": 0.4}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plot_run(tmp_path)
    assert named["regularizers: R1, R2, gradient penalty, LeCam, path length and its mean"] == ["gp_penalty"]
