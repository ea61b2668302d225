"""[augment]: DiffAugment's transforms of D's inputs, ADA's adaptive p, and the batch semantics they keep."""

import functools
import json

import pytest
import torch
import torch.nn.functional as F

import bigbatch
from bigbatch.batching import replicator_for
from bigbatch.data import load_data
from bigbatch.tasks import build_task
from bigbatch.tasks.gan.augment import ADA_IMAGES, Augment, apply, draw

ALL = ["color", "translation", "cutout"]
POLICY = {"augment.policy": "color,translation,cutout"}


def reference(x, params, policy):
    """The transforms one image at a time, as the DiffAugment paper describes them."""
    out = []
    n, _, h, w = x.shape
    for img, (b, s, c, dy, dx, cut, cy, cx) in zip(x, params.tolist()):
        for name in policy:
            if name == "color":
                img = img + b
                img = (img - img.mean(0, keepdim=True)) * s + img.mean(0, keepdim=True)
                img = (img - img.mean()) * c + img.mean()
            elif name == "translation":  # output (i, j) = input (i + dy, j + dx), zero outside
                dy, dx = int(dy), int(dx)
                padded = F.pad(img, (w, w, h, h))
                img = padded[:, h + dy : 2 * h + dy, w + dx : 2 * w + dx]
            elif name == "cutout" and cut:
                side = int(h * 0.5 + 0.5)
                img = img.clone()
                top, left = int(cy) - side // 2, int(cx) - side // 2
                img[:, max(top, 0) : max(top + side, 0), max(left, 0) : max(left + side, 0)] = 0
        out.append(img)
    return torch.stack(out)


@pytest.mark.parametrize("policy", [ALL, ["cutout", "translation"], ["color"]])
def test_transforms_are_diffaugments(policy):
    x = torch.randn(64, 3, 16, 16, dtype=torch.float64)
    params = draw(policy, 1.0, 64, 16, 0, 99, 1)
    want = reference(x, params, policy)
    assert torch.allclose(apply(x, params, policy), want, atol=1e-12)
    assert torch.allclose(apply(x.to(memory_format=torch.channels_last), params, policy), want, atol=1e-12)
    if "translation" in policy:  # every shift of up to 1/8 of the side (2 px) is drawn
        assert set(params[:, 3].tolist()) == {-2.0, -1.0, 0.0, 1.0, 2.0}
    if "cutout" in policy:
        assert (params[:, 5] == 1).all() and 0 <= params[:, 6:].min() and params[:, 6:].max() <= 16


def test_p_decides_each_transform_of_each_image():
    x = torch.randn(4000, 3, 8, 8, dtype=torch.float64)
    assert torch.equal(apply(x, draw(ALL, 0.0, 4000, 8, 0, 99, 1), ALL), x)  # p = 0: the images themselves
    params = draw(ALL, 0.3, 4000, 8, 0, 99, 1)
    on = torch.stack([params[:, 0] != 0, params[:, 1] != 1, params[:, 2] != 1, params[:, 5] == 1], 1).double()
    assert torch.allclose(on.mean(0), torch.full((4,), 0.3, dtype=torch.float64), atol=0.03)
    assert abs(on[:, 0].mul(on[:, 3]).mean() - 0.09) < 0.02  # independently
    assert torch.allclose(apply(x, params, ALL), reference(x, params, ALL), atol=1e-12)
    # The same draws whatever the policy and p: turning a transform on changes no other one's.
    assert torch.equal(draw(["color"], 1.0, 9, 8, 0, 99, 1)[:, :3], draw(ALL, 1.0, 9, 8, 0, 99, 1)[:, :3])


def test_gradients_flow_through_the_transforms():
    x = torch.randn(4, 3, 8, 8, dtype=torch.float64, requires_grad=True)
    params = draw(ALL, 1.0, 4, 8, 0, 99, 2)
    assert torch.autograd.gradcheck(lambda t: apply(t, params, ALL), (x,))


def test_ada_moves_p_towards_its_target_every_256_images():
    cfg = bigbatch.preset("digits").override({**POLICY, "augment.target": 0.6, "augment.speed_kimg": 10}).augment
    ada = Augment(cfg, seed=0)
    assert ada.p == 0.0  # "auto": ADA starts at 0
    for _ in range(ADA_IMAGES // 64 - 1):
        ada.observe(0.9, 64)  # D overfits: more than 60% of reals scored positive
    assert ada.p == 0.0  # not yet 256 images
    ada.observe(0.9, 64)
    assert ada.p == pytest.approx(256 / 10_000)
    ada.observe(-0.5, 512)  # one step of 512 images
    assert ada.p == 0.0  # clamped
    state = ada.state_dict()
    ada.observe(1.0, 32)
    again = Augment(cfg, seed=0)
    again.load_state_dict(state)
    again.observe(1.0, 32)
    assert again.state_dict() == ada.state_dict()
    fixed = Augment(bigbatch.preset("digits").override(POLICY).augment, seed=0)
    fixed.observe(1.0, 1024)
    assert fixed.p == 1.0  # DiffAugment: p fixed at 1


def d_step_params(micro_batch, policy=POLICY):
    cfg = bigbatch.preset("digits").override(
        {"data.resolution": 16, "model.ch": 8, "model.dim_z": 16, "train.batch": 32, "train.micro_batch": micro_batch,
         "train.device": "cpu", **policy}
    )  # fmt: skip
    task = build_task(cfg, replicator_for(cfg), load_data("builtin:digits", 16))
    nets = task.nets()
    nets["G"].eval()  # BatchNorm from running statistics: accumulation is exact for the rest
    task.d_step(0)
    task.g_step(0)
    return torch.cat([p.detach().flatten() for name in ("G", "D") for p in nets[name].parameters()])


ADA_ALL = {"augment.pipeline": "ada", "augment.policy": "bgcfnc", "augment.p": 0.5}


@pytest.mark.parametrize("policy", [POLICY, ADA_ALL], ids=["diffaugment", "ada"])
def test_accumulated_steps_see_the_transforms_of_the_whole_batch(policy):
    full = d_step_params(32, policy)
    assert float((d_step_params(8, policy) - full).norm() / full.norm()) <= 1e-5
    plain = d_step_params(32, {})
    assert float((plain - full).norm() / full.norm()) > 1e-4  # D and G did see other images


@pytest.mark.parametrize("policy", [POLICY, {**ADA_ALL, "augment.p": "auto"}], ids=["diffaugment", "ada"])
def test_an_ada_run_resumes_bit_for_bit_and_logs_p(tiny, tmp_path, policy):
    cfg = tiny.override({**policy, "augment.target": 0.5, "augment.speed_kimg": 2})

    def weights(run):
        return {n: (run / "checkpoints/000000.512" / f"{n}.safetensors").read_bytes() for n in ("G", "D", "G_ema")}

    whole = bigbatch.train(cfg, run_dir=tmp_path / "whole", quiet=True)
    from bigbatch.info import describe_run

    assert f"augment     {cfg.augment.pipeline} {','.join(cfg.augment.transforms)}, target 0.5 (speed 2 kimg)" in (
        describe_run(whole)
    )
    parts = tmp_path / "parts"
    bigbatch.train(cfg.override({"train.kimg": 0.256}), run_dir=parts, quiet=True)
    bigbatch.train(cfg, run_dir=parts, resume=True, quiet=True)
    assert weights(parts) == weights(whole)

    def logged(run):  # the rows but their clocks
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in row.items() if k not in ("seconds", "img_per_s")} for row in rows]

    rows = logged(whole)
    assert logged(parts) == rows
    p = [r["augment_p"] for r in rows]
    assert len(set(p)) > 1 and all(0 <= v <= 1 for v in p)
    # p at the row, not its mean since the row before (found from outside: 0.672 logged where p was 0.768)
    state = torch.load(whole / "checkpoints/000000.512/state.pt", weights_only=True)
    assert rows[-1]["kimg"] == 0.512 and p[-1] == pytest.approx(state["augment"]["p"], abs=0, rel=1e-12)
    # info of a checkpoint says the p a resume from it starts at (found from outside: only the settings)
    half = torch.load(parts / "checkpoints/000000.256/state.pt", weights_only=True)["augment"]["p"]
    assert f"(speed 2 kimg), p {half:.4g} at the checkpoint" in describe_run(parts / "checkpoints/000000.256")
    assert all(-1 <= r["D_real_sign"] <= 1 for r in rows)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            {"augment.policy": "color,flip"},
            r"names 'flip' \(unknown to augment.pipeline 'diffaugment'\); valid: .*color, translation",
        ),
        ({"augment.policy": "color,color"}, r"names 'color' \(twice\)"),
        ({**POLICY, "augment.p": 1.5}, r"augment.p' must be a probability in \[0, 1\]"),
        ({**POLICY, "augment.target": 1.0}, r"augment.target' must be in \[0, 1\)"),
        (  # and how to turn it off (found from outside: an ADA user was steered back to it)
            {"augment.target": 0.6, "augment.p": 0.2},
            r"augment.target' has no transforms to apply: set augment.policy, e.g. \"color,translation,cutout\"; or, "
            r"for no augmentation \(ADA's --aug noaug\), augment.target=0 and augment.p=\"auto\"$",
        ),
    ],
)
def test_bad_augment_settings_are_named(override, message):
    with pytest.raises(bigbatch.BigbatchError, match=message):
        bigbatch.preset("digits").override(override)


def test_tasks_that_do_not_augment_refuse_the_section():
    for preset, task in (("fashion_resnet", "classify"), ("saehd128", "swap")):
        with pytest.raises(
            bigbatch.BigbatchError, match=rf"'augment.policy' is read by task = \"gan\" only, not by task = \"{task}\""
        ):
            bigbatch.preset(preset).override(POLICY)


def test_r1_is_the_squared_gradient_norm_at_the_real_images():
    from bigbatch.tasks.gan.losses import r1_penalty

    w = torch.randn(3, 4, 4, dtype=torch.float64)
    x = torch.randn(5, 3, 4, 4, dtype=torch.float64, requires_grad=True)
    logits = (x * w).sum(dim=(1, 2, 3)) + (x**2).sum(dim=(1, 2, 3))  # gradient w + 2x
    want = (w + 2 * x.detach()).square().sum(dim=(1, 2, 3)).mean()
    penalty = r1_penalty(logits, x)
    assert torch.allclose(penalty.double(), want)
    penalty.backward()  # its own gradient: d/dx mean ||w + 2x||^2 = 4 (w + 2x) / n
    assert torch.allclose(x.grad, 4 * (w + 2 * x.detach()) / 5)


def test_r1_under_accumulation_and_lazily(monkeypatch):
    r1 = {"train.r1_gamma": 10.0}
    full = d_step_params(32, r1)
    assert float((d_step_params(8, r1) - full).norm() / full.norm()) <= 1e-5
    assert float((d_step_params(32, {}) - full).norm() / full.norm()) > 1e-4  # R1 changed D
    # Lazy: on the steps it falls on, r1_every times the weight; on the others no R1 at all.
    lazy = d_step_params(32, {"train.r1_gamma": 5.0, "train.r1_every": 2})  # step 0: 5 / 2 x 2 = 10 / 2
    assert torch.equal(lazy, full)
    with pytest.raises(bigbatch.BigbatchError, match="'train.r1_gamma' is a GAN key, not read by task = \"classify\""):
        bigbatch.preset("fashion_resnet").override(r1)


def test_a_compiled_run_takes_its_lazy_r1_steps_eagerly(monkeypatch):
    # R1's penalty needs a double backward, which AOTAutograd (under every torch.compile backend but "eager")
    # refuses: the compiled D runs eagerly on the R1 steps alone, and the steps between stay compiled.
    from torch._dynamo.utils import counters

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))

    def two_d_steps(compile: bool) -> torch.Tensor:
        cfg = bigbatch.preset("digits").override(
            {"data.resolution": 16, "model.ch": 8, "model.dim_z": 16, "train.batch": 32, "train.micro_batch": 32,
             "train.device": "cpu", "train.r1_gamma": 10.0, "train.r1_every": 2, "train.compile": compile}
        )  # fmt: skip
        task = build_task(cfg, replicator_for(cfg), load_data("builtin:digits", 16))
        task.d_step(0)  # R1 (the first of every 2): eagerly
        task.d_step(32)  # compiled
        return torch.cat([p.detach().flatten() for p in task.nets()["D"].parameters()])

    counters.clear()
    compiled = two_d_steps(True)
    assert counters["aot_autograd"]["ok"] > 0  # (the step between went through AOTAutograd)
    eager = two_d_steps(False)
    assert float((compiled - eager).norm() / eager.norm()) <= 1e-5


@pytest.mark.parametrize("checkpointing", [False, True])  # (checkpointed blocks recomputed in R1's backward too)
def test_r1_through_a_d_whose_attention_runs_fused_kernels(monkeypatch, checkpointing):
    # Found by reading: on a GPU BigGAN's attention runs scaled_dot_product_attention, whose fused kernels have
    # no derivative of their backward, and R1 differentiates D's gradient: its first step failed there. CPU
    # attention takes a fused kernel here as well (PyTorch's flash kernel for CPU, as twice underivable).
    from bigbatch.models import biggan

    monkeypatch.setattr(biggan, "FUSED_ON", ("cpu", "cuda"))
    cfg = bigbatch.preset("digits").override(
        {"model.name": "biggan", "data.resolution": 32, "model.ch": 4, "model.dim_z": 8,
         "model.options": {"g_attn": 16, "d_attn": 16}, "train.batch": 8, "train.micro_batch": 8,
         "train.device": "cpu", "train.r1_gamma": 1.0, "train.checkpointing": checkpointing}
    )  # fmt: skip
    task = build_task(cfg, replicator_for(cfg), load_data("builtin:digits", 32))
    assert "r1_penalty" in task.d_step(0) and all(
        p.grad is None or p.grad.isfinite().all() for p in task.D.parameters()
    )


def test_loss_d_is_the_adversarial_loss_with_r1_logged_apart():
    # Found from outside: loss_D held R1's lazily scaled penalty, leaping every r1_every D steps (a sawtooth in
    # plots.png that looked like instability); ADA logs Loss/D/loss and its R1 apart.
    cfg = bigbatch.preset("digits").override(
        {"data.resolution": 16, "model.ch": 8, "model.dim_z": 16, "train.batch": 8, "train.micro_batch": 8,
         "train.device": "cpu", "train.r1_gamma": 1e6, "train.r1_every": 2}
    )  # fmt: skip
    task = build_task(cfg, replicator_for(cfg), load_data("builtin:digits", 16))
    regularized, plain = task.d_step(0), task.d_step(8)
    assert regularized["r1_penalty"] > 0 and "r1_penalty" not in plain
    assert 0 < regularized["loss_D"] < 10 and 0 < plain["loss_D"] < 10  # (with R1's 1e6 / 2 x 2 x penalty: far above)


def test_an_iterations_d_values_are_the_mean_over_its_d_steps(monkeypatch):
    # Found from outside: with train.d_steps = 4 a row kept the last D step's values (ADA's r_t among them), a
    # quarter of the images that moved p.
    from bigbatch.data.load import training_data
    from bigbatch.data.schedule import schedule_of
    from bigbatch.tasks import Feed

    cfg = bigbatch.preset("digits").override(
        {"data.resolution": 16, "model.ch": 8, "model.dim_z": 16, "train.batch": 16, "train.micro_batch": 16,
         "train.device": "cpu", "train.d_steps": 4, **ADA_ALL, "augment.target": 0.6}
    )  # fmt: skip
    task = build_task(cfg, replicator_for(cfg), training_data(cfg))
    signs = iter([1.0, 0.5, 0.875, -0.375])
    real_d_step = task.d_step

    def d_step(nimg, real):
        return {**real_d_step(nimg, real), "D_real_sign": next(signs)}

    monkeypatch.setattr(task, "d_step", d_step)
    feed = Feed(training_data(cfg), schedule_of(cfg), task.rep, cfg)
    try:
        assert task.step(feed)["D_real_sign"] == 0.5
    finally:
        feed.close()
