import pytest
import torch

import bigbatch
from bigbatch.models.layers import set_sn_update

SMALL = {"dcgan": [16, 32, 64], "biggan": [32, 64]}  # resolutions each family is tested at


def test_every_family_is_tested():
    assert sorted(SMALL) == bigbatch.models.list_models()


@pytest.mark.parametrize("name, resolution", [(n, r) for n, rs in SMALL.items() for r in rs])
@pytest.mark.parametrize("n_classes", [0, 5])
def test_forward_backward_every_parameter_gets_a_gradient(name, resolution, n_classes):
    torch.manual_seed(0)
    G, D = bigbatch.models.create(name, resolution, n_classes, ch=4, dim_z=20)
    for p in [*G.parameters(), *D.parameters()]:
        if not p.detach().abs().sum() > 0:  # zero-initialised gates (attention) would block gradients
            p.data.normal_()
    z = torch.randn(3, 20)
    y = torch.tensor([0, 1, 4]) if n_classes else None
    x = G(z, y)
    assert x.shape == (3, 3, resolution, resolution) and x.abs().max() <= 1
    out = D(x, y)
    assert out.shape == (3,)
    out.sum().backward()
    for net in (G, D):
        missing = [n for n, p in net.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
        assert not missing, missing
    for net in (G, D):  # what the engine may activation-checkpoint exists
        for block in net.checkpoint_blocks:
            net.get_submodule(block)


def test_biggan_128_has_the_reference_parameter_counts():
    from bigbatch.models.layers import count_params

    G, D = bigbatch.models.create("biggan", 128, 1000, ch=96, dim_z=120, init="N02")  # N02: quick to draw
    assert (count_params(G), count_params(D)) == (70_433_988, 87_982_370)


def test_biggan_hierarchical_z_must_split_evenly():
    with pytest.raises(bigbatch.BigbatchError, match="dim_z must be a multiple of 7, e.g. 119"):
        bigbatch.models.create("biggan", 256, 10, ch=4, dim_z=120)


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
    with pytest.raises(bigbatch.BigbatchError, match="no option 'depth'"):
        bigbatch.models.create("dcgan", 32, depth=3)
    with pytest.raises(bigbatch.BigbatchError, match="resolutions"):
        bigbatch.models.create("dcgan", 8)
