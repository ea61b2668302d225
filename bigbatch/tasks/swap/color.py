"""DeepFaceLab's colour augmentation of src faces (core/imagelib/color_transfer.py and
samplelib/SampleProcessor.py), batched in torch on the training device:

- `transfer(mode, faces, styles, draws)`, DFL's ct_mode: each src face recoloured like a dst face.
  rct: Reinhard's transfer, each L*a*b* channel given the dst face's mean and standard deviation;
  lct: a linear map of the RGB covariances (PCA basis); mkl: the Monge-Kantorovich linear map;
  idt: iterative distribution transfer, 20 random rotations matching 256-bin histograms;
  sot: sliced optimal transport, 10 steps of 5 random directions, the change smoothed by OpenCV's
  bilateral filter (σ colour 5, σ space 16).
- `hsv_shift(faces, draws)`, DFL's random_hsv_power: hue moved by up to ±180·power degrees,
  saturation and value by up to ±power/2.
- `merge_transfer(mode, swapped, dst, mask, draws)`: the colour transfer of DFL's merger (rct, lct,
  mkl, mkl-m, idt, idt-m, sot-m), the swapped face recoloured like the dst face it replaces.

Colour spaces follow OpenCV's float conventions (L*a*b* from sRGB with D65 white, L in 0..100; HSV
with the hue in degrees), so each mode gives what DFL's NumPy and OpenCV code gives, to float
tolerance (tests/test_swap_color.py runs DFL's code on cv2 beside it). Written here because DFL's
code runs per image on the CPU with NumPy's global random state; these run on the whole batch where
it trains, and every random draw comes from `draw`, keyed by the task by step and image position.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

MODES = ("rct", "lct", "mkl", "idt", "sot")
MERGE_MODES = ("rct", "lct", "mkl", "mkl-m", "idt", "idt-m", "sot-m")  # DFL's merger's, but mix-m
MERGE_SOT_BATCH = 30  # the merger's sot: 30 directions per step
IDT_ROTATIONS, IDT_BINS = 20, 256
SOT_STEPS, SOT_BATCH = 10, 5
SOT_SIGMA_COLOR, SOT_SIGMA_SPACE = 5.0, 16.0

# OpenCV's sRGB (D65) to XYZ, its rows divided by the white point (color_lab.cpp); and back.
_XYZ = ((0.412453, 0.357580, 0.180423), (0.212671, 0.715160, 0.072169), (0.019334, 0.119193, 0.950227))
_RGB = ((3.240479, -1.53715, -0.498535), (-0.969256, 1.875991, 0.041556), (0.055648, -0.204043, 1.057311))
_WHITE = (0.950456, 1.0, 1.088754)


def _matrix(
    rows: tuple[tuple[float, ...], ...], x: torch.Tensor, scale: tuple[float, ...], inverse: bool
) -> torch.Tensor:
    m = torch.tensor(rows, dtype=torch.float64)
    w = torch.tensor(scale, dtype=torch.float64)
    m = m * w[None, :] if inverse else m / w[:, None]
    return torch.einsum("ij,njhw->nihw", m.to(x.device, x.dtype, non_blocking=True), x)


def rgb_to_lab(x: torch.Tensor) -> torch.Tensor:
    """(N, 3, H, W) RGB in [0, 1] -> L*a*b* (L 0..100), as cv2.cvtColor(float, COLOR_RGB2Lab)."""
    x = x.clamp(0, 1)
    linear = torch.where(x <= 0.04045, x / 12.92, ((x + 0.055) / 1.055).pow(2.4))
    xyz = _matrix(_XYZ, linear, _WHITE, inverse=False)
    f = torch.where(xyz > 0.008856, xyz.clamp_min(0).pow(1 / 3), 7.787 * xyz + 16 / 116)
    y = xyz[:, 1]
    lightness = torch.where(y > 0.008856, 116 * f[:, 1] - 16, 903.3 * y)
    return torch.stack([lightness, 500 * (f[:, 0] - f[:, 1]), 200 * (f[:, 1] - f[:, 2])], dim=1)


def lab_to_rgb(lab: torch.Tensor) -> torch.Tensor:
    """L*a*b* -> RGB in [0, 1], as cv2.cvtColor(float, COLOR_Lab2RGB)."""
    lightness, a, b = lab.unbind(1)
    low = lightness <= 8 * 0.9999  # OpenCV's threshold
    y = torch.where(low, lightness / 903.3, ((lightness + 16) / 116).pow(3))
    fy = torch.where(low, 7.787 * y + 16 / 116, (lightness + 16) / 116)
    fxz = torch.stack([fy + a / 500, fy - b / 200], dim=1)
    fxz = torch.where(fxz <= 6 / 29, (fxz - 16 / 116) / 7.787, fxz.pow(3))
    xyz = torch.stack([fxz[:, 0], y, fxz[:, 1]], dim=1)
    rgb = _matrix(_RGB, xyz, _WHITE, inverse=True).clamp(0, 1)
    return torch.where(rgb <= 0.0031308, 12.92 * rgb, 1.055 * rgb.pow(1 / 2.4) - 0.055)


def rgb_to_hsv(x: torch.Tensor) -> torch.Tensor:
    """(N, 3, H, W) RGB -> HSV, H in degrees [0, 360), as cv2.cvtColor(float, COLOR_RGB2HSV)."""
    eps = torch.finfo(torch.float32).eps
    r, g, b = x.unbind(1)
    v, _ = x.max(1)
    diff = v - x.min(1).values
    s = diff / (v.abs() + eps)
    k = 60 / (diff + eps)
    h = torch.where(v == r, (g - b) * k, torch.where(v == g, (b - r) * k + 120, (r - g) * k + 240))
    return torch.stack([torch.where(h < 0, h + 360, h), s, v], dim=1)


def hsv_to_rgb(hsv: torch.Tensor) -> torch.Tensor:
    """HSV (H in degrees) -> RGB, as cv2.cvtColor(float, COLOR_HSV2RGB)."""
    h, s, v = hsv.unbind(1)
    h = h / 60
    sector = torch.floor(h)
    h = h - sector
    sector = torch.remainder(sector, 6).long()
    p, q, t = v * (1 - s), v * (1 - s * h), v * (1 - s * (1 - h))
    # per sector: which of (v, p, q, t) each of r, g, b takes
    table = torch.tensor([[0, 3, 1], [2, 0, 1], [1, 0, 3], [1, 2, 0], [3, 1, 0], [0, 1, 2]])
    table = table.to(hsv.device, non_blocking=True)  # (torch.tensor(device=) waits for the device's queue)
    values = torch.stack([v, p, q, t], dim=1)
    rgb = values.gather(1, table[sector].permute(0, 3, 1, 2))
    return torch.where(s[:, None] == 0, v[:, None].expand_as(rgb), rgb)


def draw(
    n: int, g: torch.Generator, mode: str, hsv_power: float, sot_batch: int = SOT_BATCH
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step's colour draws for `n` images: (ct_mode's: idt's rotations (n, 20, 3, 3) or sot's unit
    directions (n, 10, sot_batch, 3), else (n, 0); the HSV shift per image (n, 3): hue degrees,
    saturation, value)."""
    if mode == "idt":  # Haar-distributed rotations (scipy's special_ortho_group): QR of a Gaussian, signs fixed
        q, r = torch.linalg.qr(torch.randn(n, IDT_ROTATIONS, 3, 3, generator=g, dtype=torch.float64))
        q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[..., None, :]
        q[..., 0] *= torch.sign(torch.linalg.det(q))[..., None]
        ct = q.float()
    elif mode == "sot":
        ct = torch.randn(n, SOT_STEPS, sot_batch, 3, generator=g)
        ct = ct / ct.norm(dim=-1, keepdim=True)
    else:
        ct = torch.zeros(n, 0)
    hsv = torch.zeros(n, 3)
    if hsv_power:  # DFL: hue += randint(-h, h + 1) degrees with h = max(1, int(180·power)); s, v += (U - 0.5)·power
        h = max(1, int(360 * hsv_power * 0.5))
        hsv[:, 0] = torch.randint(-h, h + 1, (n,), generator=g).float()
        hsv[:, 1:] = (torch.rand(n, 2, generator=g) - 0.5) * hsv_power
    return ct, hsv


def hsv_shift(faces: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """(N, 3, H, W) RGB faces with each image's HSV shift (N, 3) from `draw` applied, as DFL's sample
    processor; in float32 whatever autocast says."""
    with torch.autocast(faces.device.type, enabled=False):
        hsv = rgb_to_hsv(faces.float())
        shifts = shifts.to(hsv.device, hsv.dtype, non_blocking=True)[:, :, None, None]
        h = torch.remainder(hsv[:, 0] + shifts[:, 0], 360)
        s = (hsv[:, 1] + shifts[:, 1]).clamp(0, 1)
        v = (hsv[:, 2] + shifts[:, 2]).clamp(0, 1)
        return hsv_to_rgb(torch.stack([h, s, v], dim=1)).clamp(0, 1).to(faces.dtype)


def transfer(
    mode: str, faces: torch.Tensor, styles: torch.Tensor, draws: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """(N, 3, H, W) RGB `faces` in [0, 1] recoloured like `styles` (the same shape), image by image,
    by DFL's colour transfer `mode`; `draws` are `draw`'s for idt and sot. rct with a `mask` (N, 1, H,
    W) takes its statistics with the pixels outside it (< 0.5) as black, as DFL's merger does.
    Computed in float32 (float64 for the 3 × 3 statistics), whatever autocast says."""
    if mode not in MODES:
        raise ValueError(f"unknown colour transfer {mode!r}; one of {MODES}")
    with torch.autocast(faces.device.type, enabled=False):
        x, y = faces.float(), styles.float()
        if mode == "rct":
            out = _rct(x, y, mask)
        elif mode == "lct":
            out = _lct(x, y)
        elif mode == "mkl":
            out = _mkl(x, y)
        elif mode == "idt":
            out = _idt(x, y, draws.to(x.device, non_blocking=True))
        else:
            out = _sot(x, y, draws.to(x.device, non_blocking=True))
        return out.clamp(0, 1).to(faces.dtype)


def merge_transfer(
    mode: str, swapped: torch.Tensor, dst: torch.Tensor, mask: torch.Tensor, draws: torch.Tensor
) -> torch.Tensor:
    """DFL's merger's colour transfer: `swapped` faces (N, 3, H, W) recoloured like the `dst` faces
    they replace, with the face area (`mask` >= 1/255: the merger drops lower values as noise): rct
    takes its statistics there, the "-m" modes see both faces black outside it. `draws`:
    `draw(n, g, "idt" | "sot", 0, MERGE_SOT_BATCH)`'s."""
    if mode not in MERGE_MODES:
        raise ValueError(f"unknown merger colour transfer {mode!r}; one of {MERGE_MODES}")
    area = (mask.float() >= 1 / 255).float()
    base = mode.removesuffix("-m")
    if mode.endswith("-m"):
        swapped, dst = swapped.float() * area, dst.float() * area
    return transfer(base, swapped, dst, draws, area if base == "rct" else None)


def _rct(x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Reinhard: each L*a*b* channel of x given y's mean and (population) standard deviation."""
    lx, ly = rgb_to_lab(x), rgb_to_lab(y)
    sx_in, sy_in = lx, ly
    if mask is not None:  # DFL: the pixels outside are zeroed, and still counted
        inside = mask.to(lx.device, non_blocking=True) >= 0.5
        sx_in, sy_in = lx * inside, ly * inside
    mx, sx = sx_in.mean(dim=(2, 3), keepdim=True), sx_in.std(dim=(2, 3), correction=0, keepdim=True)
    my, sy = sy_in.mean(dim=(2, 3), keepdim=True), sy_in.std(dim=(2, 3), correction=0, keepdim=True)
    lab = (lx - mx) * sy / sx.clamp_min(1e-12) + my  # (a flat channel stays flat, where DFL divides by 0)
    bounds = torch.tensor([[0.0, -127.0, -127.0], [100.0, 127.0, 127.0]]).to(x.device, non_blocking=True)
    low, high = bounds[0, None, :, None, None], bounds[1, None, :, None, None]
    return lab_to_rgb(torch.maximum(torch.minimum(lab, high), low))


def _pixels(x: torch.Tensor) -> torch.Tensor:
    return x.flatten(2).double()  # (N, 3, HW): the 3×3 statistics in float64, as NumPy computes them


def _sqrtm(c: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    values, vectors = torch.linalg.eigh(c)
    root = values.sqrt() if not inverse else 1 / values.sqrt()
    return vectors @ torch.diag_embed(root) @ vectors.transpose(-1, -2)


def _lct(x: torch.Tensor, y: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Linear colour transfer, PCA basis: x's centred pixels through Cy^½ Cx^-½, plus y's mean."""
    px, py = _pixels(x), _pixels(y)
    mx, my = px.mean(2, keepdim=True), py.mean(2, keepdim=True)
    tx, ty = px - mx, py - my
    eye = torch.eye(3, dtype=torch.float64, device=x.device)
    cx = tx @ tx.transpose(1, 2) / tx.shape[2] + eps * eye
    cy = ty @ ty.transpose(1, 2) / ty.shape[2] + eps * eye
    out = _sqrtm(cy) @ _sqrtm(cx, inverse=True) @ tx + my
    return out.float().view_as(x)


def _mkl(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The Monge-Kantorovich linear map between the two pixel distributions (Pitié and Kokaram)."""
    eps = torch.finfo(torch.float64).eps
    px, py = _pixels(x), _pixels(y)
    mx, my = px.mean(2, keepdim=True), py.mean(2, keepdim=True)
    a = (px - mx) @ (px - mx).transpose(1, 2) / (px.shape[2] - 1)  # np.cov
    b = (py - my) @ (py - my).transpose(1, 2) / (py.shape[2] - 1)
    da2, ua = torch.linalg.eigh(a)
    da = da2.clamp_min(eps).sqrt()
    c = torch.diag_embed(da) @ ua.transpose(1, 2) @ b @ ua @ torch.diag_embed(da)
    dc2, uc = torch.linalg.eigh(c)
    inv = torch.diag_embed(1 / da)
    t = ua @ inv @ uc @ torch.diag_embed(dc2.clamp_min(eps).sqrt()) @ uc.transpose(1, 2) @ inv @ ua.transpose(1, 2)
    out = t.transpose(1, 2) @ (px - mx) + my  # NumPy's (x - mx) @ t, per pixel row
    return out.float().view_as(x)


def _interp(
    x: torch.Tensor, xp: torch.Tensor, fp: torch.Tensor, left: torch.Tensor, right: torch.Tensor
) -> torch.Tensor:
    """np.interp row by row: x (R, M), xp (R, K) non-decreasing, fp (R, K); left/right (R, 1)."""
    k = xp.shape[1]
    j = torch.searchsorted(xp.contiguous(), x.contiguous(), right=True) - 1  # xp[j] <= x < xp[j + 1]
    jc = j.clamp(0, k - 2)
    x0, x1, y0, y1 = xp.gather(1, jc), xp.gather(1, jc + 1), fp.gather(1, jc), fp.gather(1, jc + 1)
    inside = (j >= 0) & (j < k - 1)
    out = y0 + (y1 - y0) * (x - x0) / torch.where(inside, x1 - x0, torch.ones_like(x0))
    out = torch.where(x == xp[:, -1:], fp[:, -1:].expand_as(out), out)
    return torch.where(x < xp[:, :1], left.expand_as(out), torch.where(x > xp[:, -1:], right.expand_as(out), out))


def _edges(lo: torch.Tensor, hi: torch.Tensor, bins: int) -> torch.Tensor:
    """np.histogram's edges for float32 data: np.linspace(lo, hi, bins + 1) in float32 (arange × step
    + lo, rounded at each operation), its last edge exactly hi."""
    step = (hi - lo) / bins
    edges = torch.arange(bins + 1, device=lo.device, dtype=lo.dtype) * step + lo
    edges[:, -1:] = hi
    return edges


def _histogram_cdf(x: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """Each row's cumulative histogram (R, bins) over `edges`, normalised to end at 1 (float32), binned
    as np.histogram bins: an index computed from the range, then corrected against the edges, so that
    bin k holds edges[k] <= x < edges[k + 1] (the last bin its upper edge too)."""
    bins = edges.shape[1] - 1
    lo, hi = edges[:, :1], edges[:, -1:]
    index = ((x - lo) / (hi - lo).clamp_min(1e-30) * bins).floor().long().clamp(0, bins - 1)
    index = index - (x < edges.gather(1, index)).long()
    index = index + ((x >= edges.gather(1, index + 1)) & (index != bins - 1)).long()
    ones = torch.ones_like(x, dtype=torch.int64)  # (counted in integers: a float cumsum has no deterministic
    counts = torch.zeros(x.shape[0], bins, dtype=torch.int64, device=x.device).scatter_add_(1, index, ones)
    cdf = counts.cumsum(1).float()  # CUDA kernel, which train.deterministic refuses; the same values)
    return cdf / cdf[:, -1:]


def _idt(x: torch.Tensor, y: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Iterative distribution transfer (Pitié et al.): in each of 20 random rotations, each axis of x's
    pixels moved 1/20 of the way to the histogram match with y's (256 bins), as DFL's color_transfer_idt
    (whose quirks it keeps: values below the first bin's upper edge map to 0). The dtypes are NumPy's
    in DFL's code: pixels, edges and cumulative counts in float32, the interpolation in float64; a
    histogram is discontinuous, so on faces with many equal pixels (a masked face's black) any other
    choice moves whole bins."""
    n, c = x.shape[:2]
    d0, d1 = x.flatten(2), y.flatten(2)
    zero = torch.zeros(n * c, 1, device=x.device, dtype=torch.float64)
    full = torch.full((n * c, 1), float(IDT_BINS), device=x.device, dtype=torch.float64)
    for i in range(rotations.shape[1]):
        r = rotations[:, i]
        d0r, d1r = (r @ d0).flatten(0, 1), (r @ d1).flatten(0, 1)  # (N·3, HW)
        lo = torch.minimum(d0r.min(1, keepdim=True).values, d1r.min(1, keepdim=True).values)
        hi = torch.maximum(d0r.max(1, keepdim=True).values, d1r.max(1, keepdim=True).values)
        edges = _edges(lo, hi, IDT_BINS)
        top = edges[:, 1:].double().contiguous()
        cp0, cp1 = _histogram_cdf(d0r, edges).double(), _histogram_cdf(d1r, edges).double()
        f = _interp(cp0, cp1, top, top[:, :1], top[:, -1:])
        moved = _interp(d0r.double(), top, f, zero, full).float()
        d0 = d0 + (r.transpose(1, 2) @ (moved - d0r).view(n, c, -1)) / rotations.shape[1]
    return d0.view_as(x)


def _sot(x: torch.Tensor, y: torch.Tensor, directions: torch.Tensor) -> torch.Tensor:
    """Sliced optimal transport: per step, x's pixels moved by the mean over 5 random directions of the
    sorted-projection differences to y's; then the change smoothed by OpenCV's bilateral filter."""
    n, c, h, w = x.shape
    px, py = x.flatten(2).transpose(1, 2), y.flatten(2).transpose(1, 2)  # (N, HW, 3)
    moved = px.clone()
    for step in range(directions.shape[1]):
        advect = torch.zeros_like(px)
        for k in range(directions.shape[2]):
            d = directions[:, step, k]  # (N, 3)
            source, order = torch.sort((moved * d[:, None]).sum(-1), dim=1)
            target, _ = torch.sort((py * d[:, None]).sum(-1), dim=1)
            advect.scatter_add_(1, order[..., None].expand(-1, -1, c), (target - source)[..., None] * d[:, None])
        moved = moved + advect / directions.shape[2]
    change = (moved - px).transpose(1, 2).reshape(n, c, h, w)
    return x + bilateral_filter(change, SOT_SIGMA_COLOR, SOT_SIGMA_SPACE)


@functools.lru_cache(maxsize=8)
def _disc(radius: int, sigma_space: float) -> tuple[tuple[int, int, float], ...]:
    """OpenCV's bilateral window: the offsets within `radius` and their spatial weights."""
    out = []
    for i in range(-radius, radius + 1):
        for j in range(-radius, radius + 1):
            r2 = i * i + j * j
            if math.sqrt(r2) <= radius:
                out.append((i, j, math.exp(-0.5 * r2 / sigma_space**2)))
    return tuple(out)


def bilateral_filter(x: torch.Tensor, sigma_color: float, sigma_space: float) -> torch.Tensor:
    """cv2.bilateralFilter(x, 0, sigma_color, sigma_space) per image of (N, C, H, W) float: a disc of
    radius round(1.5·σ space), reflect-101 borders, colour weights on the sum over channels of the
    absolute differences (OpenCV's, with exp computed exactly where OpenCV reads a table)."""
    radius = max(1, round(sigma_space * 1.5))
    n, _, h, w = x.shape
    if h <= radius or w <= radius:  # reflect padding needs more pixels: fall back to replicate
        padded = F.pad(x, (radius,) * 4, mode="replicate")
    else:
        padded = F.pad(x, (radius,) * 4, mode="reflect")
    coeff = -0.5 / sigma_color**2
    total = torch.zeros_like(x)
    norm = torch.zeros(n, 1, h, w, device=x.device, dtype=x.dtype)
    for i, j, weight in _disc(radius, sigma_space):
        shifted = padded[:, :, radius + i : radius + i + h, radius + j : radius + j + w]
        alpha = (shifted - x).abs().sum(1, keepdim=True)
        wgt = weight * torch.exp(alpha.square() * coeff)
        total += wgt * shifted
        norm += wgt
    flat = (x.amax(dim=(1, 2, 3)) - x.amin(dim=(1, 2, 3))).abs() < torch.finfo(torch.float32).eps
    return torch.where(flat[:, None, None, None], x, total / norm)
