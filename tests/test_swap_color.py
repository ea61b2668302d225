"""The swap task's colour augmentation gives what DeepFaceLab's NumPy and OpenCV code gives
(core/imagelib/color_transfer.py, samplelib/SampleProcessor.py): DFL's functions are restated below in
NumPy on cv2, taking the same random draws, and compared image by image."""

import numpy as np
import pytest
import torch

from bigbatch.data.streams import generator
from bigbatch.tasks.swap import color

cv2 = pytest.importorskip("cv2")


def faces(n=3, size=24, seed=0):
    """Smooth, face-like colour images (a gradient and a blob per image), (N, 3, H, W) in [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, size), torch.linspace(-1, 1, size), indexing="ij")
    base = torch.rand(n, 3, 1, 1, generator=g) * 0.6 + 0.2
    tilt = (torch.rand(n, 3, 1, 1, generator=g) - 0.5) * 0.4
    blob = torch.exp(-(xx**2 + yy**2) * 3) * (torch.rand(n, 3, 1, 1, generator=g) - 0.5) * 0.5
    noise = torch.rand(n, 3, size, size, generator=g) * 0.05
    return (base + tilt * xx + blob + noise).clamp(0, 1)


def hwc(x):
    return x.permute(1, 2, 0).numpy().astype(np.float32)


def test_colour_spaces_are_opencvs():
    x = faces(4, 16)
    x[0, :, :4, :4] = 0  # black, white and greys hit the formulas' other branches
    x[1, :, :4, :4] = 1
    x[2, :, :4, :4] = 0.5
    lab, hsv = color.rgb_to_lab(x), color.rgb_to_hsv(x)
    # the exact conversion (IEC sRGB, CIE L*a*b* with D65 white), computed here independently
    rgb = x.permute(0, 2, 3, 1).double().numpy()
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    m = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
    xyz = linear @ m.T / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > 216 / 24389, np.cbrt(xyz), (24389 / 27 * xyz + 16) / 116)
    exact = np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], -1)
    assert np.abs(lab.permute(0, 2, 3, 1).numpy() - exact).max() < 0.05
    assert (color.lab_to_rgb(torch.from_numpy(exact).permute(0, 3, 1, 2).float()) - x).abs().max() < 5e-4
    for i in range(len(x)):
        want_lab = cv2.cvtColor(hwc(x[i]), cv2.COLOR_RGB2Lab)  # (OpenCV's float path reads an interpolated table)
        assert np.abs(hwc(lab[i]) - want_lab).max() < 0.5 and np.abs(hwc(lab[i]) - want_lab).mean() < 0.15
        back = cv2.cvtColor(want_lab, cv2.COLOR_Lab2RGB)
        assert np.abs(hwc(color.lab_to_rgb(torch.from_numpy(want_lab).permute(2, 0, 1)[None])[0]) - back).max() < 2e-4
        want_hsv = cv2.cvtColor(hwc(x[i]), cv2.COLOR_RGB2HSV)
        assert np.abs(hwc(hsv[i]) - want_hsv).max() < 1e-3
        back = cv2.cvtColor(want_hsv, cv2.COLOR_HSV2RGB)
        assert np.abs(hwc(color.hsv_to_rgb(torch.from_numpy(want_hsv).permute(2, 0, 1)[None])[0]) - back).max() < 1e-5


# DFL's functions, restated in NumPy on cv2 (its BGR order is immaterial: RGB in, RGB out throughout).
def dfl_rct(target, source, mask=None):
    source, target = cv2.cvtColor(source, cv2.COLOR_RGB2Lab), cv2.cvtColor(target, cv2.COLOR_RGB2Lab)
    t, s = target.copy(), source.copy()
    if mask is not None:  # the merger's: statistics with the pixels outside the mask as black
        t[mask < 0.5], s[mask < 0.5] = 0, 0
    out = [(target[..., c] - t[..., c].mean()) * s[..., c].std() / t[..., c].std() + s[..., c].mean() for c in range(3)]
    out = np.stack([np.clip(out[0], 0, 100), np.clip(out[1], -127, 127), np.clip(out[2], -127, 127)], -1)
    return cv2.cvtColor(out.astype(np.float32), cv2.COLOR_Lab2RGB)


def dfl_lct(target, source, eps=1e-5):
    def stats(img):
        mu = img.mean(0).mean(0)
        t = (img - mu).transpose(2, 0, 1).reshape(3, -1)
        return mu, t, t.dot(t.T) / t.shape[1] + eps * np.eye(3)

    def sqrtm(c):
        values, vectors = np.linalg.eigh(c)
        return vectors.dot(np.sqrt(np.diag(values))).dot(vectors.T)

    _, t, ct = stats(target)
    mu_s, _, cs = stats(source)
    ts = sqrtm(cs).dot(np.linalg.inv(sqrtm(ct))).dot(t)
    return np.clip(ts.reshape(3, *target.shape[:2]).transpose(1, 2, 0) + mu_s, 0, 1)


def dfl_mkl(x0, x1):
    eps = np.finfo(float).eps
    h, w, c = x0.shape
    x0, x1 = x0.reshape(-1, c), x1.reshape(-1, c)
    a, b = np.cov(x0.T), np.cov(x1.T)
    da2, ua = np.linalg.eig(a)
    da = np.diag(np.sqrt(da2.clip(eps, None)))
    dc2, uc = np.linalg.eig(da @ ua.T @ b @ ua @ da)
    dc = np.diag(np.sqrt(dc2.clip(eps, None)))
    da_inv = np.diag(1.0 / np.diag(da))
    t = ua @ da_inv @ uc @ dc @ uc.T @ da_inv @ ua.T
    return np.clip(((x0 - x0.mean(0)) @ t + x1.mean(0)).reshape(h, w, c), 0, 1)


def dfl_idt(i0, i1, rotations, bins=256):
    h, w, c = i0.shape
    d0, d1 = i0.reshape(-1, c).T, i1.reshape(-1, c).T
    for r in rotations:
        d0r, d1r = r @ d0, r @ d1
        d_r = np.empty_like(d0)
        for j in range(c):
            lo, hi = min(d0r[j].min(), d1r[j].min()), max(d0r[j].max(), d1r[j].max())
            p0r, edges = np.histogram(d0r[j], bins=bins, range=[lo, hi])
            p1r, _ = np.histogram(d1r[j], bins=bins, range=[lo, hi])
            cp0r, cp1r = p0r.cumsum().astype(np.float32), p1r.cumsum().astype(np.float32)
            f = np.interp(cp0r / cp0r[-1], cp1r / cp1r[-1], edges[1:])
            d_r[j] = np.interp(d0r[j], edges[1:], f, left=0, right=bins)
        d0 = np.linalg.solve(r, d_r - d0r) / len(rotations) + d0
    return np.clip(d0.T.reshape(h, w, c), 0, 1)


def dfl_sot(src, trg, directions):
    h, w, c = src.shape
    new = src.copy()
    for step in directions:
        advect = np.zeros((h * w, c), np.float32)
        for d in step:
            source, target = (new * d).sum(-1).reshape(-1), (trg * d).sum(-1).reshape(-1)
            id_s, id_t = np.argsort(source), np.argsort(target)
            for k in range(c):
                advect[id_s, k] += (target[id_t] - source[id_s]) * d[k]
        new += advect.reshape(h, w, c) / len(step)
    return np.clip(src + cv2.bilateralFilter(new - src, 0, 5.0, 16.0), 0, 1)


@pytest.mark.parametrize("mode", color.MODES)
def test_each_colour_transfer_is_dfls(mode):
    x, y = faces(3, 40, seed=1), faces(3, 40, seed=2)
    ct, _ = color.draw(3, generator(0, 1, 2), mode, 0.0)
    out = color.transfer(mode, x, y, ct)
    assert out.shape == x.shape and out.dtype == x.dtype and 0 <= out.min() and out.max() <= 1
    for i in range(3):
        a, b = hwc(x[i]), hwc(y[i])
        if mode == "rct":
            want = dfl_rct(a, b)
        elif mode == "lct":
            want = dfl_lct(a, b)
        elif mode == "mkl":
            want = dfl_mkl(a, b)
        elif mode == "idt":
            want = dfl_idt(a, b, ct[i].numpy())
        else:
            want = dfl_sot(a, b, ct[i].numpy())
        got = hwc(out[i])
        # (rct's L*a*b*: OpenCV's float conversion reads an interpolated table; see the test above)
        mean, most = {"rct": (3e-3, 0.05), "idt": (1e-5, 2e-4), "sot": (1e-5, 1e-4)}.get(mode, (1e-6, 1e-5))
        assert np.abs(got - want).mean() < mean and np.abs(got - want).max() < most, mode
        # and it does what it is for: the recoloured face's colour means move to the style's
        assert np.abs(got.mean((0, 1)) - b.mean((0, 1))).sum() < np.abs(a.mean((0, 1)) - b.mean((0, 1))).sum()


def test_the_mergers_colour_transfer_is_dfls():
    x, y = faces(2, 32, seed=5), faces(2, 32, seed=6)
    mask = torch.full((2, 1, 32, 32), 1e-3)  # a sigmoid's faint background: noise to DFL's merger (< 1/255)
    mask[..., 6:26, 8:24] = 0.7
    for mode in color.MERGE_MODES:
        base = mode.removesuffix("-m")
        ct, _ = color.draw(2, generator(0, 1, 3), base, 0.0, color.MERGE_SOT_BATCH)
        # (idt on masked faces: float32 rounding, NumPy's or torch's, compounds over the rotations until
        # the black pixels' mass crosses a bin edge: compared over the first 4 rotations)
        ct = ct[:, :4] if base == "idt" else ct
        out = color.merge_transfer(mode, x, y, mask, ct)
        for i in range(2):
            a, b, m = hwc(x[i]), hwc(y[i]), (hwc(mask[i])[..., 0] >= 1 / 255).astype(np.float32)
            if mode.endswith("-m"):
                a, b = a * m[..., None], b * m[..., None]
            if base == "rct":
                want = dfl_rct(a, b, m)
            elif base in ("idt", "sot"):
                want = globals()[f"dfl_{base}"](a, b, ct[i].numpy())
            else:
                want = globals()[f"dfl_{base}"](a, b)
            # (sot-m: the black pixels' equal projections sort in another order in NumPy's quicksort)
            tolerance = {"rct": 3e-3, "sot": 1e-3}.get(base, 2e-5)
            assert np.abs(hwc(out[i]) - want).mean() < tolerance, mode
    with pytest.raises(ValueError, match="mix-m"):
        color.merge_transfer("mix-m", x, y, mask, ct)


def test_the_bilateral_filter_is_opencvs():
    x = faces(2, 48, seed=3) - 0.5
    got = color.bilateral_filter(x, 5.0, 16.0)
    for i in range(2):
        want = cv2.bilateralFilter(hwc(x[i]), 0, 5.0, 16.0)
        assert np.abs(hwc(got[i]) - want).max() < 1e-4
    flat = torch.full((1, 3, 30, 30), 0.25)
    assert torch.equal(color.bilateral_filter(flat, 5.0, 16.0), flat)


def test_the_hsv_shift_is_dfls_and_its_draws_are_keyed():
    power = 0.3
    a = color.draw(64, generator(0, 1, 5), "none", power)[1]
    b = color.draw(64, generator(0, 1, 5), "none", power)[1]
    assert torch.equal(a, b) and not torch.equal(a, color.draw(64, generator(0, 1, 6), "none", power)[1])
    h = max(1, int(360 * power * 0.5))
    assert a[:, 0].abs().max() <= h and a[:, 0].eq(a[:, 0].round()).all() and a[:, 1:].abs().max() <= power / 2
    assert color.draw(4, generator(0, 1, 5), "none", 0.0)[1].abs().sum() == 0
    x = faces(4, 16, seed=4)
    out = color.hsv_shift(x, a[:4])
    for i in range(4):
        hsv = cv2.cvtColor(hwc(x[i]), cv2.COLOR_RGB2HSV)
        hue = (hsv[..., 0] + float(a[i, 0])) % 360
        s = np.clip(hsv[..., 1] + float(a[i, 1]), 0, 1)
        v = np.clip(hsv[..., 2] + float(a[i, 2]), 0, 1)
        want = np.clip(cv2.cvtColor(np.stack([hue, s, v], -1).astype(np.float32), cv2.COLOR_HSV2RGB), 0, 1)
        assert np.abs(hwc(out[i]) - want).max() < 2e-3


def test_colour_work_is_float32_under_autocast():
    """Training runs under bf16 autocast: the colour transfers, the HSV shift and blur-out must not
    drop their matrix products and convolutions to bf16."""
    from bigbatch.tasks.swap.losses import blur_out

    x, y = faces(2, 32, seed=7), faces(2, 32, seed=8)
    mask = torch.zeros(2, 1, 32, 32)
    mask[..., 8:24, 8:24] = 1
    for mode in ("rct", "idt"):
        ct, hsv = color.draw(2, generator(0, 1, 4), mode, 0.2)
        plain = color.transfer(mode, x, y, ct), color.hsv_shift(x, hsv), blur_out(x, mask, 256)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            under = color.transfer(mode, x, y, ct), color.hsv_shift(x, hsv), blur_out(x, mask, 256)
        assert all(torch.equal(a, b) for a, b in zip(plain, under)), mode
