"""[augment] pipeline = "ada": ADA's blit, geom, color and cutout groups (Karras et al. 2020, appendix B)."""

import math

import pytest
import torch
import torch.nn.functional as F

import bigbatch
from bigbatch.errors import BigbatchError
from bigbatch.tasks.gan import ada
from bigbatch.tasks.gan.augment import Augment

ALL = ["blit", "geom", "color", "filter", "noise", "cutout"]
IDENTITY = [1.0, 0, 0, 0, 1, 0]


def centred(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pixel centres' (x, y) about the image's centre."""
    c = torch.arange(n, dtype=torch.float64) + 0.5 - n / 2
    return c.view(1, n).expand(n, n), c.view(n, 1).expand(n, n)


def blob(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A smooth image (a Gaussian off the centre), as a function of position."""
    return torch.exp(-((x - 3) ** 2 + (y + 2) ** 2) / 30)


def geom(inverse: torch.Tensor, offset=(0.0, 0.0)) -> torch.Tensor:
    return torch.cat([inverse.double(), torch.tensor(offset, dtype=torch.float64).view(2, 1)], -1).view(1, 6)


def test_blit_moves_whole_pixels():
    x = torch.randn(256, 3, 16, 16, dtype=torch.float64)
    params = ada.draw(["blit"], 1.0, 256, 16, 0, 99, 1)
    flips, turns, shifts = params[:, 0], params[:, 1], params[:, 2:4]
    assert set(flips.tolist()) == {0.0, 1.0} and set(turns.tolist()) == {0.0, 1.0, 2.0, 3.0}
    assert set(shifts.flatten().tolist()) == {-2.0, -1.0, 0.0, 1.0, 2.0}  # up to 1/8 of the side
    want = []
    for img, (flip, k, dx, dy) in zip(x, params[:, :4].long().tolist()):
        img = torch.rot90(img.flip(-1) if flip else img, k, (-2, -1))
        padded = F.pad(img.unsqueeze(0), (2, 2, 2, 2), mode="reflect")[0]  # the shift fills with the mirror image
        want.append(padded[:, 2 - dy : 2 - dy + 16, 2 - dx : 2 - dx + 16])
    assert torch.equal(ada.apply(x, params, ["blit"]), torch.stack(want))
    assert torch.equal(ada.apply(x.to(memory_format=torch.channels_last), params, ["blit"]), torch.stack(want))


def test_geom_resamples_about_the_centre_through_the_wavelet_pair():
    xs, ys = centred(32)
    img = blob(xs, ys).expand(1, 3, 32, 32).contiguous()
    noise = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    # the identity: the sym6 pair's up and down passes undo each other
    assert (ada.geometric(noise, torch.tensor([IDENTITY] * 2)) - noise).abs().max() < 1e-10
    # a quarter turn, about the image's centre: torch.rot90 within the interpolation's error
    quarter = ada.geometric(img, geom(torch.tensor([[0.0, 1.0], [-1.0, 0.0]])))
    assert (quarter - torch.rot90(img, 3, (-2, -1))).abs().max() < 3e-3
    # fractional translation and scaling: the blob moved and magnified (the inverse maps output to input)
    shifted = ada.geometric(img, geom(torch.eye(2), (-0.5, 0.25)))
    want = blob(xs - 0.5, ys + 0.25)
    assert (shifted[0, 0] - want).abs().max() < 3e-3 < (img[0, 0] - want).abs().max()
    scaled = ada.geometric(img, geom(torch.eye(2) / 1.25))
    inner = slice(6, 26)
    assert (scaled[0, 0] - blob(xs / 1.25, ys / 1.25))[inner, inner].abs().max() < 5e-3
    # an arbitrary rotation where the output stays inside the input
    c, s = math.cos(0.5), math.sin(0.5)
    turned = ada.geometric(img, geom(torch.tensor([[c, s], [-s, c]])))
    assert (turned[0, 0] - blob(c * xs + s * ys, -s * xs + c * ys))[inner, inner].abs().max() < 5e-3


def test_draws_follow_the_papers_strengths_and_p():
    n = 4000
    params = ada.draw(ALL, 1.0, n, 32, 0, 99, 1)
    # color: M v = ±c v on the luma axis v, c·s times a rotation on the plane across it, offset ±c·b along v
    m = params[:, ada.COLOR].view(n, 3, 4).double()
    v = torch.ones(3, dtype=torch.float64) / math.sqrt(3)
    mv = m[:, :, :3] @ v
    c = mv @ v
    assert torch.allclose(mv, c.unsqueeze(1) * v, atol=1e-5)
    u1 = torch.tensor([1.0, -1.0, 0], dtype=torch.float64) / math.sqrt(2)
    u2 = torch.linalg.cross(v, u1)
    plane = torch.stack([u1, u2], 1)  # (3, 2)
    across = plane.T @ m[:, :, :3] @ plane  # (n, 2, 2): c·s·R(hue)
    cs = across.det().sqrt()
    assert torch.allclose(
        across @ across.transpose(1, 2), cs.view(n, 1, 1) ** 2 * torch.eye(2, dtype=torch.float64), atol=1e-4
    )
    b = (m[:, :, 3] @ v) / (c * math.sqrt(3))
    flipped = c < 0
    assert abs(flipped.double().mean() - 0.5) < 0.03  # luma flip: a coin
    assert abs(c.abs().log2().std() - 0.5) < 0.03 and abs(b.std() - 0.2) < 0.01  # contrast, brightness
    assert abs((cs / c.abs()).log2().std() - 1.0) < 0.05  # saturation
    hue = torch.atan2(across[:, 1, 0], across[:, 0, 0])
    assert abs(hue.abs().mean() - math.pi / 2) < 0.05  # uniform in (-pi, pi)
    # geom with p: all five off with (1 - p)^3 (1 - p_rot)^2 = (1 - p)^4, the rotations each at 1 - sqrt(1 - p)
    for p in (0.3, 0.7):
        still = (ada.draw(["geom"], p, n, 32, 0, 99, 2)[:, ada.GEOM] == torch.tensor(IDENTITY)).all(1)
        assert abs(still.double().mean() - (1 - p) ** 4) < 0.03
    # blit: each flip, turn and shift with p
    blit = ada.draw(["blit"], 0.3, n, 32, 0, 99, 3)
    assert abs((blit[:, 0] == 1).double().mean() - 0.3 * 0.5) < 0.02
    assert abs((blit[:, 1] != 0).double().mean() - 0.3 * 0.75) < 0.02
    # the same numbers whatever the groups: turning one on changes no other's
    assert torch.equal(
        ada.draw(["color"], 0.5, 9, 32, 0, 99, 1)[:, ada.COLOR], ada.draw(ALL, 0.5, 9, 32, 0, 99, 1)[:, ada.COLOR]
    )


def test_p_0_passes_the_images_and_everything_is_differentiable():
    x = torch.randn(64, 3, 16, 16)
    assert torch.equal(ada.apply(x, ada.draw(ALL, 0.0, 64, 16, 0, 99, 1), ALL), x)
    grey = torch.randn(8, 1, 16, 16)  # one channel: the colour matrix's mean row
    params = ada.draw(["color"], 1.0, 8, 16, 0, 99, 1)
    m = params[:, ada.COLOR].view(8, 3, 4).mean(1)
    assert torch.allclose(
        ada.apply(grey, params, ["color"]), grey * m[:, :3].sum(1).view(8, 1, 1, 1) + m[:, 3].view(8, 1, 1, 1)
    )
    x = torch.randn(3, 3, 8, 8, dtype=torch.float64, requires_grad=True)
    params = ada.draw(ALL, 1.0, 3, 8, 0, 99, 2)
    assert torch.autograd.gradcheck(lambda t: ada.apply(t, params, ALL), (x,))


def test_cutout_zeroes_a_square_of_half_the_side():
    x = torch.ones(500, 1, 16, 16)
    params = ada.draw(["cutout"], 1.0, 500, 16, 0, 99, 1)
    holes = (ada.apply(x, params, ["cutout"]) == 0).sum(dim=(1, 2, 3))
    cy, cx = params[:, 23], params[:, 24]
    inside = ((cy - 0.25 >= 0) & (cy + 0.25 <= 1) & (cx - 0.25 >= 0) & (cx + 0.25 <= 1)).bool()
    assert (holes[inside] == 64).all() and (holes <= 64).all() and (holes > 0).all()


def test_the_pipeline_is_a_setting():
    cfg = bigbatch.preset("digits").override(
        {"augment.pipeline": "ada", "augment.policy": "bgc", "augment.target": 0.6}
    )
    assert cfg.augment.transforms == ["blit", "geom", "color"]
    aug = Augment(cfg.augment, seed=0)
    x = torch.randn(8, 3, 32, 32)
    assert aug.p == 0.0 and torch.equal(aug(x, aug.draw(8, 32, 13, 0)), x)  # ADA starts with D seeing the images
    bad = [
        (
            {"augment.pipeline": "ada", "augment.policy": "translation", "augment.p": 0.5},
            "unknown to augment.pipeline 'ada'",
        ),
        ({"augment.pipeline": "ada", "augment.policy": "bgc"}, "set augment.target"),
        ({"augment.pipeline": "ada", "augment.policy": "geom,geom", "augment.p": 0.5}, r"'geom' \(twice\)"),
    ]
    for override, message in bad:
        with pytest.raises(BigbatchError, match=message):
            bigbatch.preset("digits").override(override)


def test_micro_batch_auto_probes_at_the_p_ada_may_reach():
    from bigbatch.batching import replicator_for
    from bigbatch.data import load_data
    from bigbatch.tasks import build_task

    def planned(**augment):
        cfg = bigbatch.preset("digits").override(
            {"data.resolution": 16, "model.ch": 8, "train.batch": 64, "train.micro_batch": "auto",
             "train.memory_budget": "4MiB", "train.device": "cpu", **{f"augment.{k}": v for k, v in augment.items()}}
        )  # fmt: skip
        rep = replicator_for(cfg)
        task = build_task(cfg, rep, load_data("builtin:digits", 16))
        plan = rep.plan_micro_batch(task.probe)
        return plan.micro_batch, [(p.micro_batch, p.fits) for p in rep.probes]

    at_one = planned(pipeline="ada", policy="bgc", p=1.0)
    assert planned(pipeline="ada", policy="bgc", target=0.6) == at_one  # p starts at 0, and may reach 1
    assert planned()[0] > at_one[0]  # (the transforms' memory counts: without them more fits)


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ("bgcfnx", r"'bgcfnx' \(unknown to augment.pipeline 'ada'\); valid: .*cutout, or bg, bgc, bgcf, bgcfn, bgcfnc"),
        ("translation", r"'translation' \(unknown to augment.pipeline 'ada'\)"),
        ("bgc,geom", r"'geom' \(twice: bgc holds it\)"),
    ],
)
def test_ada_policy_errors_name_the_groups_and_shorthands(policy, message):
    with pytest.raises(BigbatchError, match=message):
        bigbatch.preset("digits").override({"augment.pipeline": "ada", "augment.policy": policy, "augment.p": 0.5})


def test_adas_names_under_diffaugment_say_the_pipeline_that_takes_them():
    # Found from outside: an ADA user's augment.policy=bgc was refused with DiffAugment's names alone.
    for policy in ("bgc", "geom"):
        with pytest.raises(BigbatchError, match=f"--augpipe {policy} is augment.pipeline=ada augment.policy={policy}"):
            bigbatch.preset("digits").override({"augment.policy": policy})


def test_ada_shorthands_combine_and_the_groups_keep_adas_order():
    def groups(policy):
        cfg = bigbatch.preset("digits").override(
            {"augment.pipeline": "ada", "augment.policy": policy, "augment.p": 0.5}
        )
        return cfg.augment.transforms

    assert groups("bgc,cutout,") == groups("cutout,color,geom,blit") == ["blit", "geom", "color", "cutout"]
    assert groups("bgcfnc") == groups("noise,cutout,bgcf") == ALL
    with pytest.raises(BigbatchError, match='augment.policy, e.g. "bgc"'):
        bigbatch.preset("digits").override({"augment.pipeline": "ada", "augment.p": 0.5})


def test_show_batch_says_at_which_p_it_shows_ada(tmp_path, capsys):
    from bigbatch.cli import main
    from bigbatch.config import parse_override

    argv = ["show-batch", "data.resolution=16", "augment.pipeline=ada", "augment.policy=bgc", "augment.target=0.6"]
    assert main([*argv, "--out", str(tmp_path / "a.png")]) == 0
    assert "[augment] at p 0 (where ADA starts; a run's own is its metrics.jsonl's augment_p" in capsys.readouterr().out
    assert main([*argv, "augment.p=0.7", "--out", str(tmp_path / "b.png")]) == 0
    assert "[augment] at p 0.7 (where ADA starts" in capsys.readouterr().out
    # A run's config: the p its log says it was at then (found from outside: p 0 shown, the run's at 0.003)
    run = tmp_path / "run"
    run.mkdir()
    cfg = bigbatch.preset("digits").override(dict(parse_override(a) for a in argv[1:]))
    (run / "config.toml").write_text(cfg.dumps())
    (run / "metrics.jsonl").write_text('{"kimg": 0.064, "augment_p": 0.25}\n{"kimg": 0.128, "augment_p": 0.5}\n')
    for kimg, p in (("0.064", "0.25"), ("0.128", "0.5")):
        assert main(["show-batch", "--config", str(run), "--kimg", kimg, "--out", str(tmp_path / "c.png")]) == 0
        said = f"[augment] at p {p} (the run's at kimg {0.064 if p == '0.25' else 0.128:g}, its metrics.jsonl's"
        assert said in capsys.readouterr().out
    assert main(["show-batch", str(run)]) == 2
    assert f"{run} is a run: give its config as --config {run}" in capsys.readouterr().err


def test_filter_scales_four_frequency_bands_and_keeps_the_expected_power():
    checker = (torch.arange(16).view(-1, 1) + torch.arange(16)).remainder(2).double().mul(2).sub(1)  # Nyquist
    x = torch.stack([checker, torch.full((16, 16), 0.7, dtype=torch.float64)]).view(2, 1, 16, 16)
    assert torch.allclose(ada.image_filter(x, torch.ones(2, 4)), x, atol=1e-12)  # the bands sum to the identity
    gains = torch.tensor([[1.0, 1, 1, 3], [0.5, 1, 1, 1]])
    # the top band holds the checkerboard, the lowest a constant: scaled by the gain along rows and columns
    out = ada.image_filter(x, gains)
    assert torch.allclose(out[0], 9 * x[0], atol=1e-10) and torch.allclose(out[1], 0.25 * x[1], atol=1e-10)
    n, p = 8000, 0.4
    g = ada.draw(["filter"], p, n, 16, 0, 99, 1)[:, ada.FILTER].double()
    # Each band moves with a coin of its own, as in ADA's augment.py (found from outside: one coin for all four
    # filtered 60% of the images at p 0.6, ADA 97%): an image is filtered with 1 - (1 - p)^4.
    moved = (g != 1).any(1)
    assert abs(moved.double().mean() - (1 - (1 - p) ** 4)) < 0.02
    same = (g.unsqueeze(2) - g.unsqueeze(1)).abs() < 1e-6  # which bands share a gain: those left alone
    rest = same.sum(2)
    w = torch.tensor(ada.BAND_POWER, dtype=torch.float64)
    one = moved & (rest.max(1).values == 3)  # one band moved: the other three equal
    assert abs(one.double().mean() - 4 * p * (1 - p) ** 3) < 0.02
    power = (g[one].square() * w).sum(1)
    assert torch.allclose(power, torch.ones_like(power), atol=1e-5)  # its change of the expected power undone
    two = (rest == 2).sum(1) == 2  # two bands moved (the other two equal): each band's scaling, multiplied
    kept = torch.where(rest[two] == 2, g[two], torch.nan).nanmean(1, keepdim=True)  # 1 / the scalings
    t = torch.where(rest[two] == 2, 1.0, g[two] / kept)  # the two gains drawn
    assert torch.allclose(kept.squeeze(1), (1 - w + w * t.square()).prod(1).rsqrt(), rtol=1e-5)
    assert abs(t[t != 1].log2().std() - 1) < 0.05  # each band's gain 2^N(0, 1)


def test_noise_has_each_images_std_and_the_same_pixels_in_any_micro_batch():
    n = 4000
    params = ada.draw(["noise"], 1.0, n, 8, 0, 99, 1)
    std = params[:, ada.NOISE][:, 0].double()
    assert abs(std.mean() - 0.1 * math.sqrt(2 / math.pi)) < 0.005  # |N(0, 0.1^2)|
    x = torch.zeros(64, 3, 8, 8)
    noisy = ada.apply(x, params[:64], ["noise"])
    measured = noisy.flatten(1).std(1).double()
    assert torch.allclose(measured, std[:64], rtol=0.2, atol=1e-3)
    halves = torch.cat([ada.apply(x[:24], params[:24], ["noise"]), ada.apply(x[24:], params[24:64], ["noise"])])
    assert torch.equal(halves, noisy)  # each image's pixels come from its own seed


def test_geometric_sampling_has_a_second_derivative_as_r1_needs_it_on_any_device():
    # R1 through ADA's geometric group differentiates grid_sample's backward, which CUDA's kernel cannot (the
    # first StyleGAN2-ADA run on a GPU died at its first R1 step). bigbatch's sampling is twice
    # differentiable by construction: checked numerically in float64, its first derivative bit for bit
    # PyTorch's, and R1's gradient in D's weights equal to what PyTorch's CPU double backward gives.
    from bigbatch.tasks.gan.grid_sample import grid_sample

    g = torch.Generator().manual_seed(0)
    grid = torch.rand(2, 5, 6, 2, generator=g, dtype=torch.float64) * 2.6 - 1.3  # beyond the edges: reflected
    x = torch.randn(2, 3, 7, 8, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: grid_sample(t, grid), (x,))
    assert torch.autograd.gradgradcheck(lambda t: grid_sample(t, grid), (x,))

    theta = torch.randn(3, 5, 6, generator=g, requires_grad=True)
    native = lambda t: F.grid_sample(t, grid.float(), "bilinear", "reflection", False)  # noqa: E731
    got = []
    for sample in (lambda t: grid_sample(t, grid.float()), native):
        xx = x.detach().float().requires_grad_()
        out = sample(xx)
        logits = (out * theta).tanh().sum()  # a D with weights theta
        (grad,) = torch.autograd.grad(logits, xx, create_graph=True)
        r1 = grad.square().sum()
        got.append((grad.detach(), torch.autograd.grad(r1, theta)[0]))
    assert torch.equal(got[0][0], got[1][0])
    torch.testing.assert_close(got[0][1], got[1][1], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="grid"):
        grid_sample(x, grid.clone().requires_grad_())


def test_the_filters_matrices_built_on_a_gpu_are_the_cpus_bit_for_bit():
    # Found by review: built on the host (a float64 product of (n, 43) by (43, size^2)) and copied to the GPU at every
    # call. A GPU sums the taps landing on each entry by gathering them on the device: the same bits as the CPU's
    # product, at any size (the mirror folds 2 taps onto an entry, more below 23 px) and for any batch.
    taps = (torch.rand(6, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2) @ ada._bands()
    for size in (4, 16, 22, 23, 64, 256):
        dense = ada._filter_matrices(taps, size, dense=True)
        assert torch.equal(ada._filter_matrices(taps, size, dense=False), dense)
        assert torch.equal(ada._filter_matrices(taps[2:5], size, dense=False), dense[2:5])
