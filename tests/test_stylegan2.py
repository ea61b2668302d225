"""StyleGAN2 (model.name = "stylegan2"): the model's properties, and its regularizers' large-batch semantics
(path length regularization, w_avg, style mixing) under accumulation and resume."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

import bigbatch
from bigbatch import models
from bigbatch.batching import replicator_for
from bigbatch.cli import main
from bigbatch.data import load_data
from bigbatch.models import fused, stylegan2
from bigbatch.models.stylegan2 import SynthesisLayer, blur
from bigbatch.sampling import to_uint8
from bigbatch.tasks import build_task
from bigbatch.tasks.gan.load import load_generator

SMALL_OPTIONS = {"ch_max": 16, "w_dim": 16, "map_layers": 2}
SMALL = {"ch": 2, "dim_z": 16, **SMALL_OPTIONS}


def pair(resolution=16, n_classes=10, **options):
    torch.manual_seed(0)
    opts = {k: v for k, v in SMALL.items() if k not in ("ch", "dim_z")} | options
    return models.create(
        "stylegan2", resolution, n_classes, ch=SMALL["ch"], dim_z=SMALL["dim_z"], img_channels=3, **opts
    )


def tiny(**overrides):
    """The digits recipe on a StyleGAN2 of a few thousand weights, every regularizer on."""
    return bigbatch.preset("digits").override(
        {
            "data.resolution": 16,
            "model.name": "stylegan2",
            "model.ch": 2,
            "model.dim_z": 16,
            "model.options": SMALL_OPTIONS,
            "train.loss": "ns",
            "train.pl_weight": 2.0,
            "train.pl_every": 2,
            "train.r1_gamma": 1.0,
            "train.r1_every": 2,
            "train.ema_rampup": 0.05,
            "train.kimg": 0.512,
            "train.batch": 32,
            "train.micro_batch": 16,
            "train.log_every_kimg": 0.128,
            "checkpoint.every_kimg": 0.256,
            "sample.every_kimg": 0.256,
            "sample.n": 16,
            "train.device": "cpu",
        }
        | overrides
    )


def test_each_image_is_a_function_of_its_own_z_whatever_shares_its_batch():
    G, _ = pair()
    G.train()  # noise and style mixing drawn per image
    z, y = torch.randn(6, 16), torch.arange(6)
    whole = G(z, y)
    assert whole.shape == (6, 3, 16, 16)
    alone = torch.cat([G(z[i : i + 1], y[i : i + 1]) for i in range(6)])
    torch.testing.assert_close(alone, whole, rtol=0, atol=1e-5)
    assert not torch.allclose(whole[0], whole[1], atol=1e-3)


def test_draws_keyed_by_the_hosts_copy_of_z_are_the_draws_of_z():
    # The task hands G its latents' host copy, so that on a GPU it draws without reading z back (a wait on
    # the device's queue); the images are those of z, to the bit; a copy of other latents is refused.
    G, _ = pair(mixing=0.9)
    G.train()
    z, y = torch.randn(6, 16), torch.arange(6)
    with G.keyed(z.numpy().copy()):
        keyed = G(z, y)
    assert torch.equal(keyed, G(z, y)) and G.draw_keys is None
    with G.keyed(z[:3].numpy()), pytest.raises(bigbatch.BigbatchError, match="keyed"):
        G(z, y)


def test_style_mixing_switches_to_a_second_w_in_training_only():
    z, y = torch.randn(8, 16), torch.zeros(8, dtype=torch.long)
    G, _ = pair(mixing=1.0)
    mixed, plain = G.train()(z, y), G.eval()(z, y)
    assert (mixed - plain).flatten(1).abs().amax(dim=1).min() > 1e-4  # every image's later layers moved
    G, _ = pair(mixing=0.0)
    torch.testing.assert_close(G.train()(z, y), G.eval()(z, y), rtol=0, atol=1e-6)


def test_demodulation_makes_a_layer_blind_to_the_scale_of_its_styles():
    torch.manual_seed(0)
    layer = SynthesisLayer(8, 4, 16, 8)
    x, w = torch.randn(3, 8, 8, 8), torch.randn(3, 16)
    before = layer(x, w, None)
    with torch.no_grad():
        layer.affine.weight *= 3
        layer.affine.bias *= 3
    torch.testing.assert_close(layer(x, w, None), before, rtol=1e-5, atol=1e-5)


def test_truncation_to_psi_0_gives_the_image_of_the_average_w():
    G, _ = pair(n_classes=0)
    z = torch.randn(64, 16)
    with torch.no_grad():
        mean_w = G.mapping(z, None).mean(dim=0)
    G.track_w_avg(z, None)
    torch.testing.assert_close(G.w_avg, (1 - 0.995) * mean_w)
    G.eval()
    G.noise_mode, G.truncation_psi = "none", 0.0
    images = G(torch.randn(3, 16))
    torch.testing.assert_close(images[1:], images[:1].expand(2, -1, -1, -1))
    G.truncation_psi = 1.0
    assert not torch.allclose(G(torch.randn(2, 16))[0], G(torch.randn(2, 16))[1])


def test_minibatch_stddev_groups_consecutive_images_and_refuses_other_micro_batches():
    _, D = pair()
    x, y = torch.randn(8, 3, 16, 16), torch.arange(8)
    D.train()
    torch.testing.assert_close(torch.cat([D(x[:4], y[:4]), D(x[4:], y[4:])]), D(x, y), rtol=0, atol=1e-6)
    with pytest.raises(bigbatch.BigbatchError, match="give train.micro_batch a multiple of 4"):
        D(x[:6], y[:6])
    assert D.eval()(x[:6], y[:6]).shape == (6,)  # scoring any batch
    # A micro-batch smaller than a group is one group (ADA's min(group, N)): stylegan2_cifar's groups of 32
    # at a batch of 8 (the dry run took it, the run's D refused it).
    D.mbstd_group = 32
    torch.testing.assert_close(D.train()(x, y), pair(mbstd_group=8)[1].train()(x, y), rtol=0, atol=0)


def steps_with_regularizers(micro_batch):
    cfg = tiny(
        **{"train.batch": 16, "train.micro_batch": micro_batch, "train.pl_every": 1, "train.r1_every": 1},
        **{"train.pl_batch_shrink": 4, "model.options": SMALL_OPTIONS | {"mbstd_group": 2}},
    )
    task = build_task(cfg, replicator_for(cfg), load_data("builtin:digits", 16))
    out = {}
    for step in range(2):  # the second uses the running mean of path lengths the first moved
        out = task.d_step(step * 16)
        out |= task.g_step(step)
    nets = task.nets()
    weights = torch.cat([p.detach().flatten() for name in ("G", "D") for p in nets[name].parameters()])
    return weights, task.pl_mean, out


def bf16_errors(device: str, on: tuple[str, ...]) -> list[float]:
    """A blur then a G layer's bias_act (demodulated, noise added) in bf16 under autocast, channels-last, as a GPU
    trains, with fused.ON = `on`: the output's and both orders' gradients' (of each input) relative distance from the
    plain ops' in fp32."""

    def run(bf16):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            inputs = [t.clone().requires_grad_() for t in (x, b, scale, noise)]
            xi, *rest = [t.bfloat16() for t in inputs] if bf16 else inputs
            y = fused.bias_act(blur(xi, 2), rest[0], 2**0.5, *rest[1:])
            grads = torch.autograd.grad(y.square().sum(), inputs, create_graph=True)
            grads2 = torch.autograd.grad(sum(g.square().sum() for g in grads), inputs)
            return [t.detach().float() for t in (y, *grads, *grads2)]

    torch.manual_seed(0)
    x = torch.randn(4, 64, 34, 34, device=device).to(memory_format=torch.channels_last)
    b, scale = torch.randn(64, device=device), torch.rand(4, 64, 1, 1, device=device) + 0.5
    noise = torch.randn(4, 1, 35, 35, device=device)
    want = run(False)  # (fused.ON is empty here: the plain ops)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(fused, "ON", on)
        got = run(True)
    return [float((a - w).norm() / w.norm()) for a, w in zip(got, want)]


@pytest.mark.compiles
def test_the_fused_kernels_are_the_plain_ops_to_every_order_and_train_the_same_weights(monkeypatch):
    """The kernels a GPU may take (fused.ON; bench/fir.py and bench/gpu.py time them): the filter as sums of shifted
    slices and the layers' bias, leaky ReLU and gain, each compiled. Their gradients of both orders are the plain
    ops' (float64), D and G steps with R1 and path length on every step train the same weights within fp32's rounding
    on a graph a kernel and dtype, and they run compiled under set_stance("force_eager") (the lazy penalty steps under
    train.compile); under an op counter the plain ops run, compiling nothing."""
    from op_count import Ops
    from test_stylegan2_blur import two_orders
    from torch._dynamo.utils import counters

    def orders(x, pad, gain):  # (not gradients_of_two_orders: under its counting mode the grouped convolution runs)
        return two_orders(lambda t: blur(t, pad, gain), x)

    def act_orders(x, b, *scale_noise):  # (of each input: D's layers' x and bias, G's demodulation and noise too)
        inputs = (x, b, *scale_noise)
        y = fused.bias_act(x, b, 2**0.5, *scale_noise)
        grads = torch.autograd.grad(y.square().sum(), inputs, create_graph=True)
        return *grads, *torch.autograd.grad(sum(g.square().sum() for g in grads), inputs)

    torch.manual_seed(0)
    x = torch.randn(2, 8, 11, 11, dtype=torch.float64, requires_grad=True)
    b = torch.randn(8, dtype=torch.float64, requires_grad=True)
    layers = [(1, 4), (2, 1.0)]  # G's upsampling layer's (an int gain, as it calls it), D's downsampling conv's
    want = [orders(x, pad, gain) for pad, gain in layers]
    scale_noise = (torch.rand(2, 8, 1, 1, dtype=x.dtype) + 0.5, torch.randn(2, 1, 11, 11, dtype=x.dtype))
    scale_noise = tuple(t.requires_grad_() for t in scale_noise)
    want_act = act_orders(x, b), act_orders(x, b, *scale_noise)
    weights, pl_mean, _ = steps_with_regularizers(16)
    monkeypatch.setattr(fused, "ON", ("cpu",))
    monkeypatch.setattr(fused, "_COMPILED", {})  # (another test may have compiled the kernels in this process)
    torch._dynamo.reset()
    graphs = counters["stats"]["unique_graphs"]
    for (pad, gain), grads in zip(layers, want):
        torch.testing.assert_close(orders(x, pad, gain), grads, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(blur(x.detach(), 2), stylegan2._grouped(x.detach(), 2, 1.0))
    # (compiled, not run eagerly: one graph for both orders, and for an input needing no gradient with grad on)
    assert counters["stats"]["unique_graphs"] == graphs + 1
    torch.testing.assert_close((act_orders(x, b), act_orders(x, b, *scale_noise)), want_act, rtol=1e-12, atol=1e-12)
    assert counters["stats"]["unique_graphs"] == graphs + 4  # (the activation, scaled and not, and its slope)
    fused_weights, pl_fused, _ = steps_with_regularizers(16)
    assert float((fused_weights - weights).norm() / weights.norm()) < 1e-5
    assert pl_fused == pytest.approx(pl_mean, rel=1e-5)
    assert counters["stats"]["unique_graphs"] == graphs + 9  # (and each for fp32: the slope's for two layouts)
    grouped, calls = stylegan2._grouped, []
    monkeypatch.setattr(stylegan2, "_grouped", lambda *a: calls.append(1) or grouped(*a))
    # (each made when entered: set_stance sets the stance as it is called)
    for eager, compiled in ((lambda: torch.compiler.set_stance("force_eager"), True), (lambda: Ops("add"), False)):
        calls.clear()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as run, eager():
            torch.testing.assert_close(orders(x, *layers[1]), want[1], rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(act_orders(x, b), want_act[0], rtol=1e-12, atol=1e-12)
        regions = sum(e.name.startswith("Torch-Compiled Region") for e in run.events())
        assert (regions >= 6, len(calls)) == (compiled, 0 if compiled else 4)  # (each kernel of both orders compiled)
        assert counters["stats"]["unique_graphs"] == graphs + 9
    # In bf16, channels-last: as near the fp32 result as the plain ops in bf16 (not nearer: a sign at the rounding)
    for fused_error, plain_error in zip(bf16_errors("cpu", ("cpu",)), bf16_errors("cpu", ())):
        assert fused_error < max(2 * plain_error, 1e-3) and plain_error < 1e-2


def test_path_length_and_r1_steps_accumulated_equal_the_whole_batch():
    whole, pl_whole, out_whole = steps_with_regularizers(16)
    parts, pl_parts, out_parts = steps_with_regularizers(4)
    assert float((parts - whole).norm() / whole.norm()) < 1e-5
    assert pl_parts == pytest.approx(pl_whole, rel=1e-5) and pl_whole > 0
    assert out_parts["pl_length"] == pytest.approx(out_whole["pl_length"], rel=1e-5)
    assert out_parts["pl_penalty"] == pytest.approx(out_whole["pl_penalty"], rel=1e-4)
    # One image in pl_batch_shrink (4) regularized: of the micro-batches of 2, one in two has one.
    one, pl_one, _ = steps_with_regularizers(2)
    assert float((one - whole).norm() / whole.norm()) < 1e-5 and pl_one == pytest.approx(pl_whole, rel=1e-5)


def test_a_stylegan2_run_resumed_is_the_run_left_alone_bit_for_bit(tmp_path):
    def weights(run):
        ckpt = run / "checkpoints" / "000000.512"
        return {net: (ckpt / f"{net}.safetensors").read_bytes() for net in ("G", "D", "G_ema")}

    cfg = tiny()
    whole = weights(bigbatch.train(cfg, run_dir=tmp_path / "whole", quiet=True))
    bigbatch.train(cfg.override({"train.kimg": 0.256}), run_dir=tmp_path / "parts", quiet=True)
    assert weights(bigbatch.train(cfg, run_dir=tmp_path / "parts", resume=True, quiet=True)) == whole
    lines = (tmp_path / "whole" / "metrics.jsonl").read_text()
    assert '"pl_length"' in lines and '"r1_penalty"' in lines


def test_info_names_the_regularizers(tmp_path, capsys):
    run = bigbatch.train(
        tiny(**{"train.kimg": 0.032, "checkpoint.every_kimg": 0.032}), run_dir=tmp_path / "r", quiet=True
    )
    assert main(["info", str(run)]) == 0
    assert "R1 gamma 1 every 2, path length 2 every 2 on 1/2" in capsys.readouterr().out


def test_path_length_and_psi_need_a_mapping_network(tmp_path, capsys):
    args = ["train.kimg=0.032", "data.resolution=16", "model.ch=4", "checkpoint.every_kimg=0.032"]
    assert main(["train", "--preset", "digits", *args, "train.pl_weight=2", "--run-dir", str(tmp_path / "r")]) == 2
    assert not (tmp_path / "r").exists()
    assert capsys.readouterr().err.strip().splitlines() == [
        "bigbatch: error: config key 'train.pl_weight' needs a G with a mapping network (model.name = \"stylegan2\"); "
        "dcgan's has none: set it to 0"
    ]
    assert main(["train", "--preset", "digits", *args, "--run-dir", str(tmp_path / "dcgan")]) == 0
    capsys.readouterr()
    assert main(["sample", str(tmp_path / "dcgan"), "--psi", "0.5"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        'bigbatch: error: --psi needs a generator with a mapping network (model.name = "stylegan2"); this one is '
        "dcgan: use --truncation (BigGAN's truncation of z)"
    ]
    with pytest.raises(bigbatch.BigbatchError, match=r"^psi needs a generator with a mapping network .* dcgan: use tr"):
        bigbatch.sample(load_generator(tmp_path / "dcgan"), n=2, psi=0.5)  # (the API's own names)
    assert main(["export", str(tmp_path / "dcgan"), str(tmp_path / "g.pt"), "--psi", "0.7"]) == 2
    assert 'error: --psi is StyleGAN2\'s truncation of w (model.name = "stylegan2");' in capsys.readouterr().err
    assert not (tmp_path / "g.pt").exists()


def test_a_family_of_the_equalized_learning_rate_takes_no_other_init():
    with pytest.raises(bigbatch.BigbatchError, match="option 'init' of 'stylegan2' must be one of equalized"):
        models.create("stylegan2", 16, init="ortho")
    with pytest.raises(bigbatch.BigbatchError, match="option 'init' of 'dcgan' must be one of N02, ortho"):
        models.create("dcgan", 16, init="equalized")


def test_exported_stylegan2_draws_each_layers_fixed_noise_and_sample_truncates_w(tmp_path, monkeypatch, capsys):
    run = bigbatch.train(
        tiny(**{"train.kimg": 0.064, "checkpoint.every_kimg": 0.064}), run_dir=tmp_path / "r", quiet=True
    )
    spread = {}
    for psi in ("1", "0.5", "0"):
        out = tmp_path / f"psi{psi}.npz"
        assert main(["sample", str(run), "--psi", psi, "--npz", "--n", "16", "--out", str(out)]) == 0
        spread[psi] = float(np.load(out)["arr_0"].astype(np.float32).std(axis=0).mean())
    assert spread["0"] < 0.5 * spread["0.5"] < 0.5 * spread["1"]  # w toward w_avg: samples alike (noise aside)
    assert main(["sample", str(run), "--standing-stats", "2"]) == 2  # (found from outside: taken silently; no BN)
    # eval --psi scores the samples at that truncation of w, and says so (found from outside: no way to).
    from types import SimpleNamespace

    seen = []
    stand_in = SimpleNamespace(name="stand-in", has_logits=True, family="inception", digest="x")
    monkeypatch.setattr("bigbatch.tasks.classify.features.feature_extractor", lambda *a, **k: stand_in)
    monkeypatch.setattr("bigbatch.metrics.evaluate", lambda G, *a, **k: seen.append(G.truncation_psi) or {"is": 1.0})
    capsys.readouterr()
    assert main(["eval", str(run), "--metrics", "is", "--psi", "0.5"]) == 0
    assert seen == [0.5] and json.loads(capsys.readouterr().out.splitlines()[-1])["psi"] == 0.5
    assert main(["eval", str(run), "--psi", "nan"]) == 2  # (found from outside: pointed to BigGAN's --truncation)
    assert "--psi must be a number (1 = off, 0.7 typical), got nan" in capsys.readouterr().err
    assert main(["export", str(run), str(tmp_path / "g.pt")]) == 0
    exported = torch.jit.load(str(tmp_path / "g.pt"))
    G = load_generator(run)
    G.noise_mode = "const"
    z, y = torch.randn(3, 16), torch.tensor([1, 2, 3])
    expected = to_uint8(G(z, y))
    got = exported(z, y)
    assert got.shape == expected.shape and (got.int() - expected.int()).abs().max() <= 1
    # sample --noise-mode const draws what the exported file computes, ADA's generate.py's default (found from
    # outside: no way to; each image's own noise only).
    from bigbatch.sampling import draw_latents

    out = str(tmp_path / "const.npz")
    assert main(["sample", str(run), "--noise-mode", "const", "--n", "5", "--seed", "4", "--npz", "--out", out]) == 0
    # The API's sample takes them too, for its images alone (found from outside: G.truncation_psi, undocumented).
    G = load_generator(run)
    got = bigbatch.sample(G, n=5, seed=4, psi=0.5, noise_mode="const")
    assert G.truncation_psi == 1 and G.noise_mode == "random"
    assert main(["sample", str(run), *("--psi", "0.5", "--noise-mode", "const", "--n", "5", "--seed", "4"),
                 "--npz", "--out", str(tmp_path / "psi.npz")]) == 0  # fmt: skip
    assert np.array_equal(np.load(tmp_path / "psi.npz")["arr_0"], got.numpy())
    with pytest.raises(bigbatch.BigbatchError, match="noise_mode must be one of random, const, none, got 'fixed'"):
        bigbatch.sample(G, n=1, psi=0.5, noise_mode="fixed")
    assert G.truncation_psi == 1  # (kept: the psi set before the refusal undone)
    drawn = draw_latents(5, 16, 4, 10)
    assert (exported(*drawn).int() - torch.from_numpy(np.load(out)["arr_0"]).int()).abs().max() <= 1
    assert main(["sample", str(tmp_path / "r"), "--noise-mode", "fixed"]) == 2
    # --seeds: an image a seed, z as ADA's generate.py draws it (found from outside: its seed 85 could not be redrawn).
    seeds = ["--seeds", "85,2-3", "--noise-mode", "const", "--overwrite", "--npz", "--out", out]
    assert main(["sample", str(run), *seeds, "--classes", "4"]) == 0
    ada = torch.from_numpy(np.stack([np.random.RandomState(s).randn(1, 16)[0] for s in (85, 2, 3)])).float()
    drawn = torch.from_numpy(np.load(out)["arr_0"])
    assert (exported(ada, torch.tensor([4] * 3)).int() - drawn.int()).abs().max() <= 1
    capsys.readouterr()
    assert main(["sample", str(run), *seeds]) == 2
    assert "--classes (ADA's generate.py --class)" in capsys.readouterr().err
    assert main(["sample", str(run), *seeds, "--n", "3"]) == 2 and "leave out --n" in capsys.readouterr().err
    # --outdir: a PNG a seed, named as ADA's generate.py names them (found from outside: a grid or an .npz alone).
    assert main(["sample", str(run), *seeds[:-3], "--classes", "4", "--outdir", str(tmp_path / "each")]) == 0
    assert sorted(p.name for p in (tmp_path / "each").iterdir()) == ["seed0002.png", "seed0003.png", "seed0085.png"]
    assert np.array_equal(np.asarray(Image.open(tmp_path / "each" / "seed0085.png")), drawn[0].numpy())
    assert main(["sample", str(run), *seeds, "--outdir", str(tmp_path / "each")]) == 2
    assert "--outdir writes a PNG an image: leave out --out, --npz" in capsys.readouterr().err
    assert main(["sample", str(run), *seeds[:-3], "--classes", "4", "--outdir", "s3://b/each"]) == 2  # (review)
    assert "--outdir s3://b/each is a URL, and sample writes local files" in capsys.readouterr().err
    # --psi builds the truncation of w into the file, as sample --psi draws (found missing: only psi 1 went out).
    assert main(["export", str(run), str(tmp_path / "g05.pt"), "--psi", "0.5"]) == 0
    extra = {"bigbatch.json": ""}
    exported = torch.jit.load(str(tmp_path / "g05.pt"), _extra_files=extra)
    G.truncation_psi = 0.5
    truncated = to_uint8(G(z, y))
    assert (exported(z, y).int() - truncated.int()).abs().max() <= 1 < (truncated.int() - expected.int()).abs().max()
    assert json.loads(extra["bigbatch.json"])["psi"] == 0.5
    capsys.readouterr()
    assert main(["export", str(run), str(tmp_path / "g.dfm"), "--psi", "0.5"]) == 2
    assert "--psi is a StyleGAN2's truncation; a .dfm is a face swap" in capsys.readouterr().err


def test_weights_cross_to_stylegan2_adas_layout_and_back(tmp_path, capsys):
    # ADA's layout (its G, D and G_ema state dicts, names and resample filters; checked against its own code
    # by bench/vs_stylegan2.py --check): a run exported to it and converted back samples the same images.
    from bigbatch.checkpoints import load_checkpoint
    from bigbatch.models import convert

    run = bigbatch.train(
        tiny(**{"train.kimg": 0.032, "checkpoint.every_kimg": 0.032}), run_dir=tmp_path / "r", quiet=True
    )
    ckpt = run / "checkpoints" / "000000.032"
    weights, _ = load_checkpoint(ckpt, nets=("G", "D", "G_ema"))
    G, D = pair()
    (tmp_path / "ada").mkdir()
    for net, model in (("G", G), ("D", D), ("G_ema", G)):
        model.load_state_dict(weights[net])
        ada = convert.to_reference(model)
        assert (net == "D") == ("b16.fromrgb.weight" in ada) and (net == "D") != ("synthesis.b16.torgb.weight" in ada)
        assert net == "D" or ("mapping.fc1.weight" in ada and "mapping.w_avg" in ada)
        torch.save(ada, tmp_path / "ada" / f"{net}.pth")
    overrides = [f"{k}={v}" for k, v in (("model.name", "stylegan2"), ("data.resolution", 16), ("model.ch", 2))]
    overrides += ["model.dim_z=16", "model.options={ch_max=16, w_dim=16, map_layers=2}"]
    out = str(tmp_path / "converted")
    assert main(["convert", str(tmp_path / "ada"), out, "--preset", "digits", *overrides]) == 0
    assert "Wrote" in capsys.readouterr().out
    for path in (run, out):
        assert main(["sample", str(path), "--n", "8", "--npz", "--out", f"{path}.npz"]) == 0
    assert np.array_equal(np.load(f"{run}.npz")["arr_0"], np.load(f"{out}.npz")["arr_0"])
    wrong = ["convert", str(tmp_path / "ada"), str(tmp_path / "wrong"), "--preset", "digits", *overrides]
    assert main([*wrong, "model.dim_z=8"]) == 2
    assert "are not StyleGAN2-ADA weights of this model" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "ada"), str(tmp_path / "wrong"), "--preset", "biggan_cifar"]) == 2  # (QA:
    assert "holds StyleGAN2-ADA's weights, and model.name is biggan: give a stylegan2 preset" in (  # --classes asked)
        capsys.readouterr().err
    )


def test_fine_tuning_onto_other_classes_and_freezed_as_for_biggan():
    # Found from outside: StyleGAN2's class embedding is a linear layer, so fine-tuning onto a data set of another
    # number of classes was refused (BigGAN's re-initialises); FreezeD left its fromrgb, which feeds the frozen
    # blocks, training.
    from bigbatch.tasks.gan.finetune import freeze_d_blocks, load_pretrained

    G10, D10 = bigbatch.models.create("stylegan2", 16, 10, ch=8, dim_z=16)
    G2, D2 = bigbatch.models.create("stylegan2", 16, 2, ch=8, dim_z=16)
    fresh = load_pretrained(G2, G10.state_dict(), "G") + load_pretrained(D2, D10.state_dict(), "D")
    assert fresh and all("embed" in k for k in fresh)
    taken = [k for k in G2.state_dict() if "embed" not in k]
    assert taken and all(torch.equal(G2.state_dict()[k], G10.state_dict()[k]) for k in taken)
    freeze_d_blocks(D2, 1)
    assert not any(p.requires_grad for p in D2.fromrgb.parameters())
    assert not any(p.requires_grad for p in D2.blocks[0].parameters())
    assert all(p.requires_grad for p in D2.blocks[1].parameters())


def test_micro_batch_auto_under_a_group_of_the_d_is_said(capsys, monkeypatch):
    # Found from outside: auto settled on 6 under mbstd_group 8 without a word (a number is refused or grouped).
    from bigbatch.batching import warn_under_group

    monkeypatch.setattr("bigbatch.errors._WARNED", set())  # (said once a process: maybe by another test)
    cfg = bigbatch.preset("stylegan2_256").override({"train.micro_batch": "auto"})
    warn_under_group(cfg, 16)
    assert capsys.readouterr().err == ""
    warn_under_group(cfg, 2)
    assert "micro_batch auto settled on 2, under stylegan2's D group of" in capsys.readouterr().err


def test_the_ada_presets_train_their_whole_batch_as_one_micro_batch_where_it_fits():
    # By reading (issue 43): paper256 ran its batch of 64 as eight micro-batches of ADA's per-GPU 8 on one H200, eight
    # times the launches of one; the per-GPU size is D's group, and the micro-batch is planned.
    for name in ("stylegan2_cifar", "stylegan2_256", "stylegan2_512", "stylegan2_1024"):
        t, group = bigbatch.preset(name).train, bigbatch.preset(name).model.options["mbstd_group"]
        assert t.micro_batch == "auto" and t.batch % group == 0 and group < t.batch, name
    small = {
        "data.resolution": 16,
        "model.ch": 2,
        "model.dim_z": 16,
        "model.options": SMALL_OPTIONS | {"mbstd_group": 8},
    }
    cfg = bigbatch.preset("stylegan2_256").override({**small, "train.device": "cpu", "train.memory_budget": "4GiB"})
    rep = replicator_for(cfg)
    task = build_task(cfg, rep, load_data("builtin:digits", 16))
    assert rep.plan_micro_batch(task.probe).micro_batch == 64


def test_the_cifar_presets_g_steps_at_adas_rate_where_it_takes_no_path_length_step():
    # Found from outside: ADA's --cfg=cifar builds G's Adam at lr x 4/5 (its G_reg_interval 4) yet takes no path
    # length step (pl_weight 0), so every G step is at 0.002; the preset's 0.0025 stepped 25% larger. The presets
    # with path length keep ADA's given rate (README: over an interval, about ADA's total step).
    for name in ("stylegan2_cifar", "stylegan2_256"):
        t = bigbatch.preset(name).train
        assert t.g_lr == pytest.approx(t.d_lr * (4 / 5 if t.pl_weight == 0 else 1)), name


def test_micro_batch_auto_settles_only_on_sizes_the_ds_groups_take():
    # By reading: auto probed every divisor of the batch, and the D refused 12 under groups of 8 (a batch of 24).
    cfg = tiny(**{"train.batch": 24, "train.micro_batch": "auto", "train.memory_budget": "4GiB"})
    cfg = cfg.override({"model.options": SMALL_OPTIONS | {"mbstd_group": 8}})
    rep = replicator_for(cfg)
    task = build_task(cfg, rep, load_data("builtin:digits", 16))
    assert rep.plan_micro_batch(task.probe).micro_batch == 24
    assert [p.micro_batch for p in rep.probes if p.micro_batch > 8] == [24]
    assert rep.set_batch(36).micro_batch == 6  # (a later batch 24 does not divide: under a group, not 12 or 18)
    task.d_step(0)


def test_a_fixed_micro_batch_under_a_group_of_the_d_is_said_too(capsys, monkeypatch):
    monkeypatch.setattr("bigbatch.errors._WARNED", set())  # (said once a process: maybe by another test)
    # Found from outside: the warning was for "auto" alone; a micro-batch of 8 under groups of 32 was silent.
    from bigbatch.batching import describe_plan

    cfg = bigbatch.preset("stylegan2_cifar").override({"train.batch": 64, "train.micro_batch": 8})
    describe_plan(cfg)
    assert "train.micro_batch 8 is under stylegan2's D group of 32 images" in capsys.readouterr().err


def test_a_grayscale_stylegan2_ada_model_converts(tmp_path, capsys):
    # Found from outside: ADA's networks of a 1-channel data set (img_channels=1) were refused as "not StyleGAN2-ADA
    # weights of this model", naming settings none of which could fix it: the channels come from the weights.
    from bigbatch.checkpoints import load_checkpoint
    from bigbatch.models import convert

    torch.manual_seed(0)
    G, D = models.create("stylegan2", 16, 0, ch=2, dim_z=16, img_channels=1, ch_max=16, w_dim=16, map_layers=2)
    (tmp_path / "ada").mkdir()
    for net, model in (("G", G), ("D", D), ("G_ema", G)):
        torch.save(convert.to_reference(model), tmp_path / "ada" / f"{net}.pth")
    overrides = ["model.name=stylegan2", "data.resolution=16", "model.ch=2", "model.dim_z=16"]
    overrides += ["model.options={ch_max=16, w_dim=16, map_layers=2}"]
    assert main(["convert", str(tmp_path / "ada"), str(tmp_path / "c"), "--preset", "digits", *overrides]) == 0
    weights, _ = load_checkpoint(tmp_path / "c" / "checkpoints" / "000000.000", nets=("G", "D"))
    assert all(torch.equal(weights["G"][k], v) for k, v in G.state_dict().items())
    assert all(torch.equal(weights["D"][k], v) for k, v in D.state_dict().items())
    assert main(["sample", str(tmp_path / "c"), "--n", "4", "--npz", "--out", str(tmp_path / "s.npz")]) == 0
    assert np.load(tmp_path / "s.npz")["arr_0"].shape[-1] == 1


def test_a_class_conditional_stylegan2_ada_model_converts_under_an_unconditional_preset(tmp_path, capsys):
    # Found from outside: a conditional snapshot under a paper preset (model.conditional false) listed 3 problems,
    # none naming the key; convert reads its 10 classes from the weights, and now builds the model they hold.
    from bigbatch.checkpoints import load_checkpoint
    from bigbatch.models import convert

    torch.manual_seed(0)
    G, D = models.create("stylegan2", 16, 10, ch=2, dim_z=16, ch_max=16, w_dim=16, map_layers=2)
    (tmp_path / "ada").mkdir()
    for net, model in (("G", G), ("D", D)):
        torch.save(convert.to_reference(model), tmp_path / "ada" / f"{net}.pth")
    overrides = [
        "model.name=stylegan2",
        "data.resolution=16",
        "model.ch=2",
        "model.dim_z=16",
        "model.conditional=false",
    ]
    overrides += ["model.options={ch_max=16, w_dim=16, map_layers=2}"]
    assert main(["convert", str(tmp_path / "ada"), str(tmp_path / "c"), "--preset", "digits", *overrides]) == 0
    assert "holds a class-conditional StyleGAN2-ADA model: converted with model.conditional=true" in (
        capsys.readouterr().err
    )
    weights, _ = load_checkpoint(tmp_path / "c" / "checkpoints" / "000000.000", nets=("G",))
    assert all(torch.equal(weights["G"][k], v) for k, v in G.state_dict().items())
    assert main(["sample", str(tmp_path / "c"), "--n", "4", "--classes", "3", "--out", str(tmp_path / "s.png")]) == 0
