"""StyleGAN2's FIR filter (blur, upsample): one kernel once its filter is made, and gradients of both orders (R1,
path length) that are the grouped convolutions', at a convolution or two."""

import pytest
import torch
import torch.nn.functional as F

from bigbatch import models
from bigbatch.models import stylegan2
from bigbatch.models.stylegan2 import blur, fir, upsample


def test_upsampling_keeps_a_constant_image_constant():
    up = upsample(torch.ones(1, 2, 8, 8))
    assert up.shape == (1, 2, 16, 16)
    torch.testing.assert_close(up[..., 1:-1, 1:-1], torch.ones(1, 2, 14, 14))


def test_a_blur_run_eagerly_is_one_kernel_once_its_filter_is_made(monkeypatch):
    # By counting (bench/roofline.py): each blur and upsampling made its filter again, ten small kernels beside its
    # one convolution, 15% of a paper256 iteration's launches.
    from op_count import Ops

    monkeypatch.setattr(stylegan2, "_WEIGHTS", {})  # (no filter made yet, whatever ran before in this process)
    x = torch.randn(2, 8, 11, 11)

    def filtered():
        return blur(x, 2), blur(x, 2, 4), upsample(x), blur(x.bfloat16(), 2)

    with Ops() as first:
        filtered()
    with Ops() as again:
        y1, y4, up, half = filtered()
    assert first.count > 30 and again.count == 5  # (four filters, and the bf16 copy of x)
    torch.testing.assert_close(y4, 4 * y1)
    torch.testing.assert_close(half.float(), y1, rtol=2e-2, atol=2e-2)
    assert up.shape == (2, 8, 22, 22) and half.dtype == torch.bfloat16
    # A filter made under inference mode is not kept (a training step could not save it for its backward).
    monkeypatch.setattr(stylegan2, "_WEIGHTS", {})
    torch.manual_seed(0)
    G, _ = models.create("stylegan2", 16, 10, ch=2, dim_z=16, img_channels=3, ch_max=16, w_dim=16, map_layers=2)
    z = torch.randn(2, 16)
    with torch.inference_mode():
        G(z, torch.arange(2))
    G(z, torch.arange(2)).mean().backward()


def two_orders(fn, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fn's gradient at x and the gradient of its square's sum (as R1 takes them)."""
    (g,) = torch.autograd.grad(fn(x).square().sum(), x, create_graph=True)
    return g, torch.autograd.grad(g.square().sum(), x)[0]


def gradients_of_two_orders(fn, x: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor], int]:
    """`two_orders`, and the convolutions both ran."""
    from op_count import Ops

    with Ops("convolution") as counted:
        grads = two_orders(fn, x)
    return grads, counted.count


@pytest.mark.parametrize("pad, gain", [(1, 4.0), (2, 1.0)])  # G's upsampling layer's, D's downsampling conv's
def test_the_blurs_gradients_of_every_order_are_the_grouped_convolutions_at_one_convolution_each(pad, gain):
    """R1 and path length differentiate through the FIR filter twice: its gradients are the filter's own (float64),
    and the double backward runs a convolution or two, not one for each of its 32 channels."""
    torch.manual_seed(0)
    x = torch.randn(2, 32, 11, 11, dtype=torch.float64, requires_grad=True)
    f = (fir(x) * gain).double().expand(32, 1, 4, 4)
    mine, n_mine = gradients_of_two_orders(lambda x: blur(x, pad, gain), x)
    own, n_own = gradients_of_two_orders(lambda x: F.conv2d(F.pad(x, [pad] * 4), f, groups=32), x)
    torch.testing.assert_close(mine, own, rtol=1e-12, atol=1e-12)
    assert n_mine <= 4 and n_own > 32  # (autograd's own: a convolution a channel)
    # As a GPU trains: bf16 under autocast, channels-last: as near float64's gradients as autograd's own in bf16
    # (the same bits on a CPU with AVX-512; on an AVX2 AMD EPYC, the grouped convolution's twice as far).
    exact, x = own, x.detach().float().to(memory_format=torch.channels_last).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mine, _ = gradients_of_two_orders(lambda x: blur(x.bfloat16(), pad, gain), x)
        own, _ = gradients_of_two_orders(lambda x: F.conv2d(F.pad(x.bfloat16(), [pad] * 4), f.bfloat16(), groups=32), x)
    off = [[(g[i].double() - exact[i]).abs().max().item() for g in (mine, own)] for i in range(2)]
    assert all(m <= 1.25 * o + 1e-6 and m <= 2**-6 * exact[i].abs().max() for i, (m, o) in enumerate(off)), off
    with pytest.raises(ValueError, match="blur pads 0 to 3"):
        blur(x, 4)
