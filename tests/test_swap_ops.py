"""The swap task's pieces as DeepFaceLab computes them: DSSIM, its Gaussian blur, the warp and its draws, the
blurred-out background, the style loss and the discriminators' shapes."""

import numpy as np
import torch
import torch.nn.functional as F

import bigbatch
from bigbatch.tasks.swap import warp
from bigbatch.tasks.swap.losses import blur_out, dssim, gaussian_blur, ssim, style_loss


def _dense_dssim(a, b, size, sigma=1.5):
    """DFL's window as one 2-D kernel (what the separable passes must equal)."""
    d = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    w = torch.softmax((-(d[None] ** 2 + d[:, None] ** 2) / (2 * sigma**2)).flatten(), 0).view(1, 1, size, size)
    a, b = a.double(), b.double()
    c = a.shape[1]
    w = w.expand(c, 1, size, size)

    def mean(x):
        return F.conv2d(x, w, groups=c)

    mu_a, mu_b = mean(a), mean(b)
    lum = (2 * mu_a * mu_b + 1e-4) / (mu_a**2 + mu_b**2 + 1e-4)
    cs = (2 * mean(a * b) - 2 * mu_a * mu_b + 9e-4) / (mean(a * a + b * b) - mu_a**2 - mu_b**2 + 9e-4)
    return (1 - (lum * cs).mean(dim=(2, 3))) / 2


def test_dssim_is_fp32_under_autocast_and_equals_the_2d_window():
    torch.manual_seed(0)
    a, b = torch.rand(2, 3, 48, 48), torch.rand(2, 3, 48, 48)
    plain = dssim(a, b, 11)
    assert torch.allclose(plain.double(), _dense_dssim(a, b, 11), atol=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = dssim(a.bfloat16(), b.bfloat16(), 11)
    assert under.dtype == torch.float32
    assert torch.equal(under, dssim(a.bfloat16().float(), b.bfloat16().float(), 11))
    assert ssim(a, a, 128).sub(1).abs().max() < 1e-6  # an image is its own perfect reconstruction


def test_gaussian_blur_is_dfls():
    x = torch.rand(1, 1, 20, 20, dtype=torch.float64)
    sigma = 2.0  # DFL: max(3, int(4σ)) taps, made odd, Gaussian about the middle, normalised, zero padding
    size = 9
    k = np.exp(-((np.arange(size) - size // 2) ** 2) / (2 * sigma**2))
    k2 = np.outer(k, k) / np.outer(k, k).sum()
    ref = F.conv2d(F.pad(x, (4, 4, 4, 4)), torch.from_numpy(k2)[None, None])
    assert torch.allclose(gaussian_blur(x.float(), sigma).double(), ref, atol=1e-6)


def test_warp_moves_the_input_only_and_is_the_identity_at_rest():
    torch.manual_seed(0)
    x = torch.rand(3, 4, 32, 32)
    g = torch.Generator().manual_seed(0)
    theta, offsets, cells, flips = warp.draw(3, g, flip=False)
    inp, target = warp.apply(x, theta, offsets, cells, flips, warp=False)
    assert torch.equal(inp, target[:, :3]) and target.shape == (3, 4, 32, 32)
    warped, target2 = warp.apply(x, theta, offsets, cells, flips, warp=True)
    assert torch.equal(target, target2) and not torch.allclose(warped, target2[:, :3])
    rest = torch.eye(2, 3).expand(3, 2, 3)
    still, _ = warp.apply(x, rest, torch.zeros_like(offsets), cells, torch.zeros(3, dtype=torch.bool), warp=True)
    assert torch.allclose(still, x[:, :3], atol=1e-5)
    many = warp.draw(4000, torch.Generator().manual_seed(1), flip=True)
    assert 0.37 < many[3].float().mean() < 0.43  # DFL mirrors with p 0.4
    assert set(many[2].tolist()) == set(warp.CELLS)
    # SAEHD's training draws scale 1/1.15..1.15 (its scale_range; found from outside: the sample processor's
    # default 1/1.05..1.05, XSeg's, was drawn).
    from bigbatch.tasks.swap.task import _draws

    theta = _draws(4000, 0, bigbatch.preset("saehd_cpu").swap, 0)[0].double()
    scale = 1 / torch.linalg.det(theta[:, :, :2]).sqrt()
    assert 1 / 1.15 - 1e-6 < scale.min() < 1 / 1.14 and 1.14 < scale.max() < 1.15 + 1e-6


def test_blur_out_keeps_the_face_and_smooths_the_background_without_its_colour():
    torch.manual_seed(0)
    image = torch.rand(2, 3, 64, 64) * 0.2  # a dark, noisy background
    mask = torch.zeros(2, 1, 64, 64)
    mask[..., 16:48, 20:44] = 1
    image = image * (1 - mask) + mask  # a white face
    out = blur_out(image, mask, 256)  # σ 2 px
    assert torch.equal(out * mask, image * mask)
    outside = (1 - mask).bool().expand_as(out)
    assert out[outside].max() < 0.2 + 1e-6  # the background's own blur: no white bled out of the face
    rough = lambda x: (x[..., 1:] - x[..., :-1]).abs()[outside[..., 1:]].mean()  # noqa: E731
    assert rough(out) < rough(image) / 2


def test_style_loss_is_dfls():
    torch.manual_seed(0)
    x = torch.rand(2, 3, 32, 32)
    assert style_loss(x, x, 4, 100.0).abs().max() < 1e-6
    # Without blur: the squared differences of channel means and stds, summed, × weight / channels.
    shifted = style_loss(x + 0.1, x, 0, 30.0)
    assert torch.allclose(shifted, torch.full((2,), 0.01 * 3 * 30.0 / 3), atol=1e-5)
    scaled = style_loss(x * 2, x, 0, 3.0)
    mean, std = x.mean(dim=(2, 3)), (x.var(dim=(2, 3), correction=0) + 1e-5).sqrt()
    std2 = (4 * x.var(dim=(2, 3), correction=0) + 1e-5).sqrt()
    assert torch.allclose(scaled, (mean.square() + (std2 - std).square()).sum(1), atol=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert style_loss(x.bfloat16(), x.bfloat16(), 2, 1.0).dtype == torch.float32


def test_the_code_discriminator_judges_as_many_positions_as_dfls():
    # leras pads its "SAME" 4x4 conv by 2 a side: DFL's CodeDiscriminator gives 3x3 logits of an 8x8 code (found
    # from outside: 2x2 here, its border positions missing from the true-face loss).
    from bigbatch.tasks.swap.discriminators import CodeDiscriminator

    for code_res, side in ((4, 3), (8, 3), (16, 3)):
        logits = CodeDiscriminator(8, code_res, ch=4)(torch.zeros(1, 8, code_res, code_res))
        assert logits.shape == (1, 1, side, side), (code_res, logits.shape)
