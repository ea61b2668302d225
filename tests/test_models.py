import pytest
import torch
import torch.nn.functional as F
from torch import nn

import bigbatch
from bigbatch.models import registry
from bigbatch.models.layers import ConditionalBatchNorm2d, set_sn_update

# Every resolution each family supports, tested at tiny width.
SMALL = {
    "dcgan": [16, 32, 64, 128],
    "biggan": [32, 64, 128, 256, 512],
    "sagan": [32, 64, 128, 256, 512],
    "biggan_deep": [32, 64, 128, 256, 512],
    "sngan": [32, 64, 128, 256],
    "stylegan2": [8, 16, 32, 64, 128],
}
# Options a family needs at this test's sizes: StyleGAN2's D groups its minibatch statistic by 2 images here.
OPTIONS = {"stylegan2": {"mbstd_group": 2, "ch_max": 32, "w_dim": 16, "map_layers": 2}}


# Every image-classifier family, tested at tiny width (resnet50's bottlenecks are 4·ch wide at the output).
RESNETS = {"resnet18": {}, "resnet50": {}, "resnet_cifar": {"depth": 8}}
CLASSIFIERS = {"convnet": {}, **RESNETS}


AUTOENCODERS = ["saehd"]  # tested in test_saehd.py and test_swap.py


def test_every_family_is_tested():
    assert sorted(SMALL) == bigbatch.models.list_models("gan")
    assert sorted(CLASSIFIERS) == bigbatch.models.list_models("classify")
    assert AUTOENCODERS == bigbatch.models.list_models("swap")
    assert bigbatch.models.list_models("xseg") == ["xseg"]  # (tests/test_xseg.py, test_xseg_train.py)
    assert sorted([*SMALL, *CLASSIFIERS, *AUTOENCODERS, "xseg"]) == bigbatch.models.list_models()


@pytest.mark.parametrize("name, resolution", [(n, r) for n, rs in SMALL.items() for r in rs])
@pytest.mark.parametrize("n_classes", [0, 5])
def test_forward_backward_every_parameter_gets_a_gradient(name, resolution, n_classes):
    torch.manual_seed(0)
    ch = 16 if name == "biggan_deep" else 8  # bottlenecks a quarter as wide: 8 would leave 2 channels
    G, D = bigbatch.models.create(name, resolution, n_classes, ch=ch, dim_z=24, **OPTIONS.get(name, {}))
    for p in [*G.parameters(), *D.parameters()]:
        if not p.detach().abs().sum() > 0:  # zero-initialised gates and class BN would block gradients
            p.data.normal_()
    z = torch.randn(2, G.dim_z)
    y = torch.tensor([0, 4]) if n_classes else None
    x = G(z, y)
    assert x.shape == (2, 3, resolution, resolution)
    assert name == "stylegan2" or x.abs().max() <= 1  # StyleGAN2 does not squash its images (clamped when written)
    out = D(x, y)
    assert out.shape == (2,)
    out.sum().backward()
    for net in (G, D):
        missing = [n for n, p in net.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
        assert not missing, missing
    for net in (G, D):  # what the engine may activation-checkpoint exists
        assert net.checkpoint_blocks
        for block in net.checkpoint_blocks:
            net.get_submodule(block)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_a_traced_generator_names_no_device_so_an_export_runs_on_any(name):
    # Found by bench/gpu_check.py on a GPU: BigGAN and StyleGAN2 exported (`bigbatch export`, a TorchScript trace
    # on the CPU) failed there: a trace keeps `device=x.device` and `.to(x.device)` as the CPU they named, and the
    # fused resampling's kernel map and StyleGAN2's FIR filter were made so. Nor does it move its images to the host
    # (found from outside: sampling.to_uint8's .cpu() did, copying a GPU's images there).
    import re

    from bigbatch.export import GeneratorOut

    ch = 16 if name == "biggan_deep" else 8
    resolution = max(SMALL[name][0], 32)  # (BigGAN's blocks fuse their resampling from 32 px on)
    G, _ = bigbatch.models.create(name, resolution, 5, ch=ch, dim_z=24, **OPTIONS.get(name, {}))
    example = (torch.randn(2, G.dim_z), torch.tensor([0, 4]))
    G.eval()(*example)  # (run eagerly first: what it keeps, such as StyleGAN2's filter, stays out of the trace)
    traced = torch.jit.trace(GeneratorOut(G.eval(), True).eval(), example, check_trace=False)
    assert "prim::Constant[value=<Tensor>]" not in str(traced.inlined_graph)
    graph = str(traced.inlined_graph).splitlines()
    named = {m.group(1) for line in graph if (m := re.match(r"\s*(%\w+) : Device = prim::Constant", line))}
    uses = [line for line in graph if "prim::Constant" not in line and any(re.search(rf"{d}[,)]", line) for d in named)]
    assert [line.rsplit("# ", 1)[-1] for line in uses] == []


# BigGAN-PyTorch's reference configurations (1000 classes) and its parameter counts (G, D).
REFERENCE_COUNTS = [
    ("biggan", 128, dict(ch=96, dim_z=120, shared_dim=128), (70_433_988, 87_982_370)),
    ("biggan", 256, dict(ch=96, dim_z=120, shared_dim=128), (82_108_548, 99_225_890)),
    ("biggan_deep", 128, dict(ch=128, depth=2, dim_z=128, shared_dim=128), (50_244_484, 34_590_210)),
    ("biggan_deep", 256, dict(ch=128, depth=2, dim_z=128, shared_dim=128), (55_736_708, 38_247_426)),
    # (found from outside: its BigGANdeep.py builds 32 and 64 px, which were refused; its 32 px D attends after every
    # stage, which it labels 16 px: d_attn 0 here, where the images agree, 1e-6 apart, as the 64 px ones do)
    ("biggan_deep", 64, dict(ch=128, depth=2, dim_z=128, shared_dim=128), (49_583_876, 20_869_633)),
    ("biggan_deep", 32, dict(ch=128, depth=2, dim_z=128, shared_dim=128, g_attn=32, d_attn=0), (7_889_668, 3_088_129)),
    # launch_SAGAN_bs128x2_ema.sh: no --G_shared, an embedding per conditional BN (found from outside: shared)
    ("sagan", 128, dict(ch=64, dim_z=128, shared=False), (42_017_412, 39_448_258)),
]


@pytest.mark.parametrize("name, resolution, kwargs, counts", REFERENCE_COUNTS)
def test_parameter_counts_equal_biggan_pytorch(name, resolution, kwargs, counts):
    from bigbatch.models.layers import count_params

    with torch.device("meta"):  # shapes only: instant
        G, D = bigbatch.models.create(name, resolution, 1000, **{"g_attn": 64, "d_attn": 64, **kwargs})
    assert (count_params(G), count_params(D)) == counts


# StyleGAN2-ADA's networks (training/networks.py, fp32) at its configurations, counted with its own code:
# paper256 (channel_base 16384), paper512 and config F at 1024 (32768), and cifar as the stylegan2_cifar preset
# builds it.
STYLEGAN2_COUNTS = [
    (256, 0, dict(ch=64), (24_767_458, 24_001_089)),
    (512, 0, dict(ch=128), (30_276_583, 28_982_849)),
    (1024, 0, dict(ch=128), (30_370_060, 29_012_513)),
    (32, 10, dict(ch=128, map_layers=2, d_resnet=False, mbstd_group=32), (20_215_315, 23_089_664)),
]


@pytest.mark.parametrize("resolution, n_classes, kwargs, counts", STYLEGAN2_COUNTS)
def test_parameter_counts_equal_stylegan2_adas(resolution, n_classes, kwargs, counts):
    from bigbatch.models.layers import count_params

    with torch.device("meta"):
        G, D = bigbatch.models.create("stylegan2", resolution, n_classes, dim_z=512, **kwargs)
    assert (count_params(G), count_params(D)) == counts


def test_biggan_hierarchical_z_drops_the_remainder_as_the_reference(capsys):
    with torch.device("meta"):
        G, _ = bigbatch.models.create("biggan", 256, 10, ch=4, dim_z=120)
    assert G.dim_z == 119  # 7 chunks of 17
    assert "uses dim_z 119" in capsys.readouterr().err
    with pytest.raises(bigbatch.BigbatchError, match="dim_z must be >= 7"):
        bigbatch.models.create("biggan", 256, 10, ch=4, dim_z=5)


def test_sngan_unconditional_bn_and_sn_only_in_d():
    from bigbatch.models.layers import SpectralNorm

    G, D = bigbatch.models.create("sngan", 32, 0, ch=4)
    assert not any(isinstance(m, SpectralNorm) for m in G.modules())
    assert all(isinstance(m, SpectralNorm) for m in D.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)))


def test_ortho_penalty_gradient_is_biggan_pytorchs():
    from bigbatch.tasks.gan.losses import ortho_penalty

    torch.manual_seed(0)
    G, D = bigbatch.models.create("biggan", 32, 5, ch=4, dim_z=16)
    unshared, _ = bigbatch.models.create("biggan", 32, 5, ch=4, dim_z=16, shared=False, hier=False)
    for net in (G, D, unshared):
        ortho_penalty(net).backward()
        shared = getattr(net, "shared", None)
        assert shared is None or shared.weight.grad is None  # BigGAN-PyTorch's blacklist: G.shared alone
        checked = 0
        for p in net.parameters():
            if p.ndim < 2 or (shared is not None and p is shared.weight):
                continue
            w = p.detach().flatten(1)
            expected = 2 * ((w @ w.t()) * (1 - torch.eye(w.shape[0]))) @ w  # BigGAN-PyTorch's utils.ortho
            torch.testing.assert_close(p.grad.flatten(1), expected, rtol=1e-4, atol=1e-6)
            checked += 1
        embeddings = [m.weight for m in net.modules() if isinstance(m, torch.nn.Embedding)]
        assert checked > 10 and all(e.grad is not None for e in embeddings if shared is None or e is not shared.weight)


def test_class_weights_equal_labels_and_mix_linearly():
    torch.manual_seed(0)
    G, D = bigbatch.models.create("dcgan", 16, 4, ch=4, dim_z=8)
    G.eval(), D.eval()
    z = torch.randn(2, 8)
    y = torch.tensor([1, 3])
    one_hot = torch.nn.functional.one_hot(y, 4).float()
    torch.testing.assert_close(G(z, y), G(z, one_hot))
    torch.testing.assert_close(D(G(z, y), y), D(G(z, y), one_hot))


def test_spectral_norm_is_frozen_between_power_iterations():
    torch.manual_seed(0)
    _, D = bigbatch.models.create("dcgan", 16, 0, ch=4, dim_z=8)
    x = torch.randn(4, 3, 16, 16)
    D(x)  # one power iteration
    set_sn_update(D, False)
    a, b = D(x), D(x)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    set_sn_update(D, True)
    assert not torch.equal(D(x), a)  # the estimate moved on


def test_spectral_norm_estimates_the_top_singular_value():
    from bigbatch.models.layers import SNLinear

    torch.manual_seed(0)
    layer = SNLinear(20, 10)
    for _ in range(200):
        layer(torch.randn(1, 20))
    sigma = torch.linalg.matrix_norm(layer.normalized_weight().detach(), ord=2)
    assert abs(float(sigma) - 1) < 1e-3


def test_unknown_family_and_options():
    with pytest.raises(bigbatch.BigbatchError, match="unknown model 'nope'"):
        bigbatch.models.create("nope", 32)
    with pytest.raises(bigbatch.BigbatchError, match="ch must be a whole number, 1 or more, got 0"):
        bigbatch.models.create("dcgan", 32, ch=0)  # (an IndexError from inside the model, found from outside)
    with pytest.raises(bigbatch.BigbatchError, match="no option 'depth'"):
        bigbatch.models.create("dcgan", 32, depth=3)
    with pytest.raises(bigbatch.BigbatchError, match="resolutions"):
        bigbatch.models.create("dcgan", 8)


@pytest.mark.parametrize("name", bigbatch.models.list_models("gan"))
def test_builders_take_keywords_only_and_create_checks_every_option(name):
    resolution = SMALL[name][0]
    with pytest.raises(TypeError, match="positional"):
        registry.builder(name)(resolution)
    with pytest.raises(TypeError, match="positional"):
        bigbatch.models.create(name, resolution, 0, 8)  # ch and the rest by name only
    rng = torch.get_rng_state()
    with pytest.raises(bigbatch.BigbatchError) as e:
        bigbatch.models.create(name, resolution=resolution, colour=1)
    assert str(e.value).startswith(f"'{name}' has no option 'colour'; valid: {', '.join(registry.options(name))} (")
    float_option = "mixing" if name == "stylegan2" else "bn_eps"  # (StyleGAN2 has no normalization layers)
    assert {"init", float_option} <= set(registry.options(name))
    with pytest.raises(bigbatch.BigbatchError, match=f"option '{float_option}' .* must be float"):
        bigbatch.models.create(name, resolution=resolution, **{float_option: "small"})
    schemes = "equalized" if name == "stylegan2" else "N02, ortho, xavier"
    with pytest.raises(bigbatch.BigbatchError, match=f"option 'init' .* must be one of {schemes}"):
        bigbatch.models.create(name, resolution=resolution, init="he")
    assert torch.equal(torch.get_rng_state(), rng)  # refused before anything was built


def test_init_scheme_is_the_familys_default_or_the_option():
    torch.manual_seed(0)
    G, _ = bigbatch.models.create("dcgan", 32, 0, ch=16, dim_z=64)
    assert abs(float(G.input.weight.detach().std()) - 0.02) < 0.002  # the tutorial's N(0, 0.02)
    G, _ = bigbatch.models.create("dcgan", 32, 0, ch=16, dim_z=64, init="ortho")
    w = G.input.weight.detach().flatten(1)  # 64 x 1024: orthonormal rows
    torch.testing.assert_close(w @ w.t(), torch.eye(64), rtol=0, atol=1e-5)
    # "none": PyTorch's own, biases and all (BigGAN-PyTorch's --skip_init, which biggan_deep128's script gave once).
    for init, drawn in (("ortho", False), ("none", True)):
        G, _ = bigbatch.models.create("biggan", 32, 5, ch=4, dim_z=16, init=init)
        biases = [m.bias for m in G.modules() if isinstance(m, torch.nn.modules.conv._ConvNd) and m.bias is not None]
        assert biases and all(bool(b.any()) == drawn for b in biases)  # (the schemes zero them)
    # Found from outside: biggan_deep128 took "none" from the script's first version; its script now inits ortho.
    assert bigbatch.preset("biggan_deep128").model.options["init"] == "ortho"


@pytest.mark.parametrize(
    "name, options, identity",
    [("dcgan", {}, True), ("sngan", {}, True), ("biggan", dict(shared=False, hier=False), False)],
)
def test_class_conditional_bn_starts_as_the_reference_does(name, options, identity):
    torch.manual_seed(0)
    G, _ = bigbatch.models.create(name, 32, 5, ch=4, dim_z=16, **options)
    bns = [m for m in G.modules() if isinstance(m, ConditionalBatchNorm2d)]
    assert bns
    for bn in bns:  # DCGAN and SN-GAN (chainer): gain 1 and bias 0 for every class; BigGAN-PyTorch: drawn
        for e in (bn.gain, bn.bias):
            assert isinstance(e, torch.nn.Embedding) and e.weight.shape[0] == 5
            assert bool((e.weight == 0).all()) == identity


def test_biggan_per_class_bn_and_hierarchical_z_are_one_clear_error():
    with pytest.raises(bigbatch.BigbatchError, match="shared=False needs hier=False"):
        bigbatch.models.create("biggan", 32, 5, ch=4, dim_z=16, shared=False)
    G, _ = bigbatch.models.create("biggan", 32, 0, ch=4, dim_z=16, shared=False)  # no classes: z chunks only
    assert G(torch.randn(2, 16)).shape == (2, 3, 32, 32)


# Image classifiers.


@pytest.mark.parametrize("size", [(32, 32), (48, 48), (32, 48)])
@pytest.mark.parametrize("name", sorted(CLASSIFIERS))
def test_classifier_forward_backward_at_any_input_size(name, size):
    torch.manual_seed(0)
    net = bigbatch.models.create_classifier(name, 5, ch=8, **CLASSIFIERS[name])
    assert (net.n_classes, net.img_channels) == (5, 3)
    x = torch.randn(2, 3, *size)
    features = net.features(x)
    assert features.shape == (2, net.feature_dim)
    logits = net(x)
    assert logits.shape == (2, 5)
    torch.testing.assert_close(logits, net.fc(features))  # train-mode BN: same batch, same statistics
    torch.nn.functional.cross_entropy(logits, torch.tensor([0, 4])).backward()
    missing = [n for n, p in net.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, missing
    assert all(bool(p.grad.isfinite().all()) for p in net.parameters())


def test_classifier_takes_other_image_channels():
    net = bigbatch.models.create_classifier("resnet_cifar", 3, ch=4, img_channels=1, depth=8)
    assert net.img_channels == 1 and net(torch.randn(2, 1, 28, 28)).shape == (2, 3)


@pytest.mark.parametrize(
    "name, n_classes, count, keys",
    [
        ("resnet18", 1000, 11_689_512, 122),
        ("resnet50", 1000, 25_557_032, 320),
        ("resnet_cifar", 10, 272_474, 128),  # ResNet-20 with projection shortcuts (the paper's option A: 0.27M)
    ],
)
def test_resnet_parameter_counts_and_names_equal_torchvision(name, n_classes, count, keys):
    from bigbatch.models.layers import count_params

    with torch.device("meta"):  # shapes only: instant
        net = bigbatch.models.create_classifier(name, n_classes)
    assert count_params(net) == count
    state = net.state_dict()
    assert len(state) == keys  # torchvision's resnet18 and resnet50 state_dict sizes
    assert state["fc.weight"].shape == (n_classes, net.feature_dim)
    names = ["conv1.weight", "bn1.running_var", "layer1.0.conv1.weight", "layer1.0.bn2.weight", "fc.bias"]
    names += {
        "resnet18": ["layer2.0.downsample.0.weight", "layer2.0.downsample.1.bias", "layer4.1.bn2.weight"],
        "resnet50": ["layer1.0.downsample.0.weight", "layer1.0.downsample.1.weight", "layer4.2.bn3.weight"],
        "resnet_cifar": ["layer2.0.downsample.0.weight", "layer3.2.bn2.weight"],
    }[name]
    assert not [n for n in names if n not in state]
    assert (
        not any(k.startswith("layer4") for k in state) if name == "resnet_cifar" else "layer4.0.conv1.weight" in state
    )


def test_resnet50_strides_on_the_3x3_conv_as_torchvision_v1_5():
    with torch.device("meta"):
        net = bigbatch.models.create_classifier("resnet50", 10, ch=8)
    block = net.get_submodule("layer2.0")
    assert (block.conv1.stride, block.conv2.stride, block.downsample[0].stride) == ((1, 1), (2, 2), (2, 2))
    assert net.conv1.kernel_size == (7, 7) and net.conv1.stride == (2, 2)


def test_resnet_cifar_depth_is_6n_plus_2():
    net = bigbatch.models.create_classifier("resnet_cifar", 10, ch=4, depth=32)
    assert len(net.checkpoint_blocks) == 15 and net.checkpoint_blocks[-1] == "layer3.4"
    assert net.conv1.kernel_size == (3, 3) and net.conv1.stride == (1, 1) and net.feature_dim == 16
    with pytest.raises(bigbatch.BigbatchError, match="depth must be 6n\\+2 .*got 21"):
        bigbatch.models.create_classifier("resnet_cifar", 10, depth=21)


def block_inputs_and_outputs(net, x):
    """Each residual block's input and output in one forward of `net`."""
    seen = {}
    for b in net.checkpoint_blocks:
        net.get_submodule(b).register_forward_hook(lambda m, args, out, b=b: seen.update({b: (args[0], out)}))
    net(x)
    return seen


@pytest.mark.parametrize("name", sorted(RESNETS))
def test_zero_init_residual_starts_every_block_as_its_shortcut(name):
    torch.manual_seed(0)
    for zero in (False, True):
        net = bigbatch.models.create_classifier(name, 5, ch=8, zero_init_residual=zero, **CLASSIFIERS[name]).eval()
        with torch.no_grad():
            seen = block_inputs_and_outputs(net, torch.randn(2, 3, 32, 32))
            for b, (x, out) in seen.items():
                block = net.get_submodule(b)
                last_bn = block.bn3 if hasattr(block, "bn3") else block.bn2
                shortcut = x if block.downsample is None else block.downsample(x)
                assert bool((last_bn.weight == 0).all()) == zero, b
                assert torch.equal(out, torch.relu(shortcut)) == zero, b


def test_kaiming_init_is_torchvisions_with_a_small_gaussian_head():
    torch.manual_seed(0)
    net = bigbatch.models.create_classifier("resnet_cifar", 100, ch=16, depth=8)
    conv = net.get_submodule("layer3.0.conv2").weight.detach()  # fan-out 64·3·3
    assert abs(float(conv.std()) / (2 / 576) ** 0.5 - 1) < 0.03
    assert abs(float(net.fc.weight.detach().std()) - 0.01) < 0.0005 and not net.fc.bias.any()
    bn = net.get_submodule("layer3.0.bn2")
    assert bool((bn.weight == 1).all()) and not bn.bias.any()


def test_classifier_options_are_checked_before_building():
    rng = torch.get_rng_state()
    with pytest.raises(bigbatch.BigbatchError) as e:
        bigbatch.models.create_classifier("resnet18", 10, depth=20)
    valid = "zero_init_residual, input_stats, drop_rate, drop_path_rate, blurpool, init"
    assert str(e.value).startswith(f"'resnet18' has no option 'depth'; valid: {valid} (another")
    assert "give model.options={} with model.name" in str(e.value)
    assert registry.options("resnet_cifar") == {
        "depth": 20,
        "zero_init_residual": False,
        "drop_rate": 0.0,
        "drop_path_rate": 0.0,
        "blurpool": False,
        "init": "kaiming",
    }
    with pytest.raises(bigbatch.BigbatchError, match="option 'zero_init_residual' of 'resnet50' must be bool"):
        bigbatch.models.create_classifier("resnet50", 10, zero_init_residual=1)
    assert torch.equal(torch.get_rng_state(), rng)
    with pytest.raises(bigbatch.BigbatchError, match="n_classes, ch and img_channels >= 1"):
        bigbatch.models.create_classifier("resnet18", 0)
    with pytest.raises(TypeError, match="positional"):
        bigbatch.models.create_classifier("resnet18", 10, 8)  # ch and the rest by name only
    with pytest.raises(TypeError, match="positional"):
        registry.builder("resnet18")(10)


def test_gan_and_classifier_builders_refuse_each_others_families():
    with pytest.raises(bigbatch.BigbatchError) as e:
        bigbatch.models.create("resnet18", 32)
    assert "create_classifier" in str(e.value) and "biggan, biggan_deep, dcgan, sagan, sngan" in str(e.value)
    with pytest.raises(bigbatch.BigbatchError) as e:
        bigbatch.models.create_classifier("dcgan", 10)
    assert "models.create;" in str(e.value) and "convnet, resnet18, resnet50, resnet_cifar" in str(e.value)
    with pytest.raises(bigbatch.BigbatchError) as e:
        bigbatch.models.create_classifier("nope", 10)
    assert str(e.value).startswith("unknown model 'nope'; the classifier families are: convnet, resnet18, resnet50")
    assert "the GAN families (create): biggan" in str(e.value)  # and where the other names are built
    with pytest.raises(bigbatch.BigbatchError, match="unknown model task 'detect'"):
        bigbatch.models.list_models("detect")


@pytest.mark.parametrize("name", sorted(RESNETS))
def test_classifier_checkpointing_changes_nothing_but_recomputes(name):
    import copy

    torch.manual_seed(0)
    net = bigbatch.models.create_classifier(name, 5, ch=8, **CLASSIFIERS[name])
    x, y = torch.randn(4, 3, 32, 40), torch.tensor([0, 1, 2, 4])
    runs = []
    for checkpointing in (False, True):
        copied = copy.deepcopy(net)
        calls = []
        copied.get_submodule("layer1.0.conv1").register_forward_hook(lambda *_, calls=calls: calls.append(1))
        model = bigbatch.Replicator(batch=4, device="cpu", checkpointing=checkpointing).prepare(copied)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        runs.append((loss.detach(), {n: p.grad for n, p in copied.named_parameters()}, copied.state_dict(), calls))
    (loss, grads, state, calls), (ckpt_loss, ckpt_grads, ckpt_state, ckpt_calls) = runs
    assert (len(calls), len(ckpt_calls)) == (1, 2)  # the checkpointed block ran again in backward
    torch.testing.assert_close(ckpt_loss, loss, rtol=0, atol=0)
    for n in grads:
        torch.testing.assert_close(ckpt_grads[n], grads[n], rtol=1e-5, atol=1e-7)
    for k in state:  # BN running statistics advanced once, not again in the recomputation
        assert torch.equal(ckpt_state[k], state[k]), k


def reference_gblock(block, x, cond):
    """BigGAN-PyTorch's GBlock.forward order: BN, ReLU, upsample, conv1, BN, ReLU, conv2; the shortcut
    upsampled before its 1x1 conv."""
    h = F.interpolate(torch.relu(block.bn1(x, cond)), scale_factor=2.0)
    h = block.conv2(torch.relu(block.bn2(block.conv1(h), cond)))
    return h + block.conv_sc(F.interpolate(x, scale_factor=2.0))


def reference_dblock(block, x):
    """BigGAN-PyTorch's DBlock.forward order: conv2, then the pooling; the shortcut conv before the
    pooling in preactivation blocks, after it in the first."""
    h = torch.relu(x) if block.preactivation else x
    h = block.conv2(torch.relu(block.conv1(h)))
    h = F.avg_pool2d(h, 2) if block.downsample else h
    if block.preactivation:
        x = x if block.conv_sc is None else block.conv_sc(x)
        x = F.avg_pool2d(x, 2) if block.downsample else x
    else:
        x = F.avg_pool2d(x, 2) if block.downsample else x
        x = x if block.conv_sc is None else block.conv_sc(x)
    return h + x


def test_fused_resampling_is_the_two_step_map():
    from bigbatch.models.layers import SNConv2d
    from bigbatch.models.resample import conv_pool, upsample_conv

    torch.manual_seed(0)
    for conv in (nn.Conv2d(5, 7, 3, padding=1), SNConv2d(5, 7, 3, padding=1, bias=False)):
        conv = conv.double()
        set_sn_update(conv, False)
        x = torch.randn(3, 5, 8, 12, dtype=torch.float64, requires_grad=True)
        for fused, two_steps in (
            (conv_pool, lambda c, x: F.avg_pool2d(c(x), 2)),
            (upsample_conv, lambda c, x: c(F.interpolate(x, scale_factor=2.0))),
        ):
            outs = []
            for f in (fused, two_steps):
                y = f(conv, x)
                grads = torch.autograd.grad((y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum(), [x, conv.weight])
                outs.append((y, *grads))
            for a, b in zip(*outs):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="3x3 conv, padding 1"):
        conv_pool(nn.Conv2d(5, 7, 3, padding=1, stride=2), x)


@pytest.mark.parametrize("name, resolution", [("biggan", 64), ("sngan", 32), ("biggan_deep", 128)])
def test_blocks_compute_biggan_pytorchs_blocks_fused_or_not(name, resolution):
    """Where a block fuses its resampling with a conv (and runs its shortcut's 1x1 conv on the smaller
    side), it computes what BigGAN-PyTorch's order of operations computes: in float64 to rounding."""
    from bigbatch.models import biggan

    torch.manual_seed(0)
    G, D = bigbatch.models.create(name, resolution, 5, ch=4)
    G, D = G.double(), D.double()
    set_sn_update(G, False), set_sn_update(D, False)
    z, y = torch.randn(2, G.dim_z, dtype=torch.float64), torch.tensor([0, 4])
    x = torch.randn(2, 3, resolution, resolution, dtype=torch.float64)
    inputs = {}
    hooks = [b.register_forward_hook(lambda m, i, o: inputs.setdefault(m, i) and None) for b in [*G.blocks, *D.blocks]]
    G(z, y), D(x, y)
    for h in hooks:
        h.remove()
    kinds = set()
    for block, args in inputs.items():
        if isinstance(block, biggan.GBlock):
            torch.testing.assert_close(block(*args), reference_gblock(block, *args), rtol=1e-10, atol=1e-10)
        elif isinstance(block, biggan.DBlock):
            torch.testing.assert_close(block(*args), reference_dblock(block, *args), rtol=1e-10, atol=1e-10)
        kinds.add((type(block).__name__, getattr(block, "fused", None)))
    # Both kinds of G block exist at this resolution (and of D block, where D fuses).
    assert {True, False} <= {fused for kind, fused in kinds if kind.endswith("GBlock")}
    # The whole nets, with every block fused that can be and with none.
    outs = []
    for fused in (True, False):
        for block in [*G.blocks, *D.blocks]:
            if hasattr(block, "fused"):
                block.fused = fused and getattr(block, "downsample", getattr(block, "upsample", True))
        outs.append((G(z, y), D(x, y)))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    "name, counts",
    [
        ("stylegan2_256", (24_767_458, 24_001_089)),
        ("stylegan2_512", (30_276_583, 28_982_849)),
        ("stylegan2_1024", (30_370_060, 29_012_513)),
    ],
)
def test_stylegan2_presets_build_adas_networks(name, counts):
    # Each of ADA's paper configurations as its preset builds it: ADA's own parameter counts (STYLEGAN2_COUNTS).
    from bigbatch.models.layers import count_params
    from bigbatch.tasks.gan.task import build_models

    cfg = bigbatch.preset(name)
    with torch.device("meta"):
        G, D = build_models(cfg, 0, 3)
    assert (count_params(G), count_params(D)) == counts
    assert cfg.model.options["mbstd_group"] == cfg.train.batch // 8  # (8 reference GPUs: the share of each, a group)


def test_an_attention_size_that_no_block_puts_out_is_refused():
    # Found from outside: model.options={g_attn=48} built a BigGAN without attention, without a word.
    with pytest.raises(bigbatch.BigbatchError, match=r"g_attn = 48: no block of this model puts out 48 px; give one "):
        bigbatch.models.create("biggan", 32, 5, ch=4, dim_z=16, g_attn=48)
    with pytest.raises(bigbatch.BigbatchError, match=r"d_attn = 128: no block of this model puts out 128 px"):
        bigbatch.models.create("biggan_deep", 128, 5, ch=4, dim_z=16, d_attn=128)
    G, D = bigbatch.models.create("biggan", 32, 5, ch=4, dim_z=16)  # the default 64: none at 32 px (BigGAN-PyTorch's)
    assert G.attention is None and D.attention is None
    G, D = bigbatch.models.create("biggan", 32, 5, ch=4, dim_z=16, g_attn=16, d_attn=8)
    assert G.attn_after == 1 and D.attn_after == 1  # (D's 32-px blocks put out 16, 8, 8, 8: after the first 8)


def test_a_resnet_fed_imagenets_statistics_sees_what_torchvisions_weights_trained_on():
    # Found from outside: fine-tuning torchvision's weights fed them uint8 / 127.5 - 1, where they were trained on
    # (uint8 / 255 - mean) / std. With input_stats = "imagenet" the network makes the second of the first: the same
    # logits as the weights on torchvision's input, the stem's zero padding included; its state dict stays theirs.
    torch.manual_seed(0)
    plain = bigbatch.models.create_classifier("resnet18", 10, ch=8).eval()
    fed = bigbatch.models.create_classifier("resnet18", 10, ch=8, input_stats="imagenet").eval()
    fed.load_state_dict(plain.state_dict())
    assert list(fed.state_dict()) == list(plain.state_dict())
    x = torch.randint(0, 256, (2, 3, 40, 52)).float()
    mean, std = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1), torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    with torch.no_grad():
        want = plain((x / 255 - mean) / std)
        assert torch.allclose(fed(x / 127.5 - 1), want, atol=1e-5)
        assert not torch.allclose(plain(x / 127.5 - 1), want, atol=1e-2)
    with pytest.raises(bigbatch.BigbatchError, match='input_stats must be "" or "imagenet"'):
        bigbatch.models.create_classifier("resnet18", 10, ch=8, input_stats="imagenet", img_channels=1)
