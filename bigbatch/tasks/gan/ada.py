"""ADA's augmentation pipeline (Karras et al. 2020, "Training Generative Adversarial Networks with Limited
Data", appendix B), written from the paper's description: the groups blit (x-flip, 90° rotations,
integer translation), geom (isotropic scaling, arbitrary rotation, anisotropic scaling, fractional
translation), color (brightness, contrast, luma flip, hue rotation, saturation), filter (four
frequency bands' gains), noise and cutout: its "bgcfnc", applied in that order ("bgc" is its default). Each
transform applies to an image with probability p (the two arbitrary rotations each with 1 - sqrt(1 - p),
so that one or both happen with p), with the paper's strengths.

- blit moves whole pixels: flips, rotations by 90° and shifts are exact, and the shift fills with the
  image mirrored (reflect).
- geom composes its four transforms into one matrix per image and resamples once: the image is mirrored
  outward as far as the transform reaches, upsampled 2x through the sym6 wavelet's low-pass filter,
  sampled bilinearly at the transformed positions, and downsampled 2x through the same filter reversed
  (an orthogonal wavelet's pair: up then down is the identity), the filter's delay (0.2 px) allowed for.
- color is one 4x4 matrix per image acting on RGB in [-1, 1] (on one channel: its mean over RGB).
- filter splits each image, along rows and along columns, into four octave bands (filters built from the
  sym2 wavelet that sum to the identity, the image mirrored at its edges) and scales each, with probability p
  of its own, by 2^N(0, 1), each band's change of the expected power (10/13 of it taken to lie in the lowest
  band) undone by scaling all four: as ADA's code, whose four scalings multiply.
- noise adds Gaussian noise of std |N(0, 0.1^2)| per image, its pixels drawn from the image's own seed.
- cutout zeroes a square of half the side centred anywhere in the image.

The numbers drawn per image and their count do not depend on p or on the groups used, so turning one
group on changes no other group's draws. Parameters per image (float32): blit's flip, quarter turns and
shift (4), geom's inverse matrix in pixels about the centre (2x3), color's matrix (3x4), cutout's on and
centre (3), filter's four gains, noise's std and seed.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F

from bigbatch.data.streams import generator, host_rows
from bigbatch.tasks.gan.grid_sample import grid_sample

PARAMS = 32
BLIT, GEOM, COLOR, CUT = slice(0, 4), slice(4, 10), slice(10, 22), slice(22, 25)
FILTER, NOISE = slice(25, 29), slice(29, 32)  # the four bands' gains; noise's std and its pixels' seed (2 x 24 bits)
# The paper's strengths: integer shift up to 1/8 of the side; log2 std of scaling 0.2 (both); arbitrary rotation;
# fractional shift std 1/8 of the side; brightness std 0.2; log2 std of contrast 0.5, of saturation 1; cutout 1/2.
XINT_MAX, SCALE_STD, XFRAC_STD = 0.125, 0.2, 0.125
BRIGHTNESS_STD, CONTRAST_STD, SATURATION_STD, CUTOUT = 0.2, 0.5, 1.0, 0.5
# filter: log2 std 1 of each band's gain, the gains scaled to keep an image's expected power, taken to lie 10/13 in
# the lowest band and 1/13 in each other; noise: its std |N(0, 0.1^2)|.
BAND_STD, BAND_POWER, NOISE_STD = 1.0, (10 / 13, 1 / 13, 1 / 13, 1 / 13), 0.1
# The sym2 (Daubechies 2) low-pass filter, whose half-band autocorrelation splits the bands.
SYM2 = tuple(v / (4 * math.sqrt(2)) for v in (1 - math.sqrt(3), 3 - math.sqrt(3), 3 + math.sqrt(3), 1 + math.sqrt(3)))
# The sym6 wavelet's low-pass decomposition filter (orthonormal: its taps sum to sqrt(2), their squares to 1).
SYM6 = (
    0.015404109327027373, 0.0034907120842174702, -0.11799011114819057, -0.048311742585633,
    0.4910559419267466, 0.787641141030194, 0.3379294217276218, -0.07263752278646252,
    -0.021060292512300564, 0.04472490177066578, 0.0017677118642428036, -0.007800708325034148,
)  # fmt: skip
# Where the filter puts a pixel on the 2x canvas: its taps' centre of mass is 5.098, not the 5.5 of a symmetric
# filter, so canvas sample j sits at (j + 0.5) / 2 + DELAY input pixels (DC's group delay), on both passes.
DELAY = (5.5 - sum(i * t for i, t in enumerate(SYM6)) / sum(SYM6)) / 2
LUMA = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64) / math.sqrt(3)


def _rotation(theta: torch.Tensor) -> torch.Tensor:
    c, s = torch.cos(theta), torch.sin(theta)
    return torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2)


def _diag(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.diag_embed(torch.stack([a, b], -1))


def _about_luma(theta: torch.Tensor) -> torch.Tensor:
    """Rotations of RGB by theta about the luma axis (Rodrigues), (n, 3, 3)."""
    v = LUMA
    k = torch.tensor([[0, -v[2], v[1]], [v[2], 0, -v[0]], [-v[1], v[0], 0]], dtype=torch.float64)
    s, c = torch.sin(theta).view(-1, 1, 1), torch.cos(theta).view(-1, 1, 1)
    return torch.eye(3, dtype=torch.float64) + s * k + (1 - c) * (k @ k)


def draw(groups: list[str], p: float, n: int, size: int, seed: int, stream: int, *keys: int) -> torch.Tensor:
    """The transforms of `n` square images of side `size`, (n, PARAMS) float32; each applies with probability
    `p`, else the identity."""
    g = generator(seed, stream, *keys)
    f64 = dict(dtype=torch.float64, generator=g)
    on = torch.rand(n, 14, **f64)  # xflip rot90 xint scale rot aniso rot xfrac | bright contrast luma hue sat | cut
    # u: xint (0-1), the rotations (2-3), hue (4), cutout's centre (5-6), filter's bands 1-3 (7-9), 10-11 spare;
    # normal: scale, aniso, xfrac (2-3), brightness, contrast, saturation
    u, normal = torch.rand(n, 12, **f64), torch.randn(n, 7, **f64)
    coin = torch.randint(0, 2, (n, 2), generator=g)  # xflip, luma flip
    quarter = torch.randint(0, 4, (n,), generator=g)
    p_rot = 1 - math.sqrt(max(1.0 - p, 0.0))
    p_each = torch.tensor([p, p, p, p, p_rot, p, p_rot, p, p, p, p, p, p, p], dtype=torch.float64)
    applies = on < p_each
    out = torch.zeros(n, PARAMS, dtype=torch.float64)
    if "blit" in groups:
        out[:, 0] = torch.where(applies[:, 0], coin[:, 0], 0)
        out[:, 1] = torch.where(applies[:, 1], quarter, 0)
        shift = torch.round((u[:, 0:2] * 2 - 1) * XINT_MAX * size)
        out[:, 2:4] = torch.where(applies[:, 2:3], shift, 0.0)
    inverse = torch.eye(2, dtype=torch.float64).repeat(n, 1, 1)  # output position -> input position
    offset = torch.zeros(n, 2, dtype=torch.float64)
    if "geom" in groups:
        one = torch.ones(n, dtype=torch.float64)
        s = torch.where(applies[:, 3], torch.exp2(normal[:, 0] * SCALE_STD), one)
        pre = torch.where(applies[:, 4], (u[:, 2] * 2 - 1) * math.pi, 0.0)
        a = torch.where(applies[:, 5], torch.exp2(normal[:, 1] * SCALE_STD), one)
        post = torch.where(applies[:, 6], (u[:, 3] * 2 - 1) * math.pi, 0.0)
        t = torch.where(applies[:, 7:8], normal[:, 2:4] * XFRAC_STD * size, 0.0)
        # the content goes through scale, rotation, aniso, rotation, shift: a point of the output comes from
        # S^-1 R1^-1 A^-1 R2^-1 (x - t)
        inverse = _diag(1 / s, 1 / s) @ _rotation(-pre) @ _diag(1 / a, a) @ _rotation(-post)
        offset = -(inverse @ t.unsqueeze(-1)).squeeze(-1)
    out[:, GEOM] = torch.cat([inverse, offset.unsqueeze(-1)], -1).flatten(1)
    matrix = torch.eye(4, dtype=torch.float64).repeat(n, 1, 1)
    if "color" in groups:
        eye = torch.eye(3, dtype=torch.float64)
        vv = torch.outer(LUMA, LUMA)
        b = torch.where(applies[:, 8], normal[:, 4] * BRIGHTNESS_STD, 0.0)
        c = torch.where(applies[:, 9], torch.exp2(normal[:, 5] * CONTRAST_STD), 1.0)
        flip = torch.where(applies[:, 10], coin[:, 1], 0).double()
        hue = torch.where(applies[:, 11], (u[:, 4] * 2 - 1) * math.pi, 0.0)
        sat = torch.where(applies[:, 12], torch.exp2(normal[:, 6] * SATURATION_STD), 1.0)
        steps = [
            _affine(eye.expand(n, 3, 3), b.unsqueeze(-1).expand(n, 3)),  # brightness
            _affine(c.view(n, 1, 1) * eye, None),  # contrast
            _affine(eye - 2 * flip.view(n, 1, 1) * vv, None),  # luma flip
            _affine(_about_luma(hue), None),  # hue
            _affine(vv + (eye - vv) * sat.view(n, 1, 1), None),  # saturation
        ]
        for step in steps:
            matrix = step @ matrix
    out[:, COLOR] = matrix[:, :3, :].flatten(1)
    if "cutout" in groups:
        out[:, 22] = applies[:, 13].double()
        out[:, 23:25] = u[:, 5:7]
    # filter and noise: drawn after the rest, so that the groups above draw as they did before these
    on2, bands, sigma = torch.rand(n, 2, **f64), torch.randn(n, 4, **f64), torch.randn(n, **f64)
    pixels = torch.randint(0, 2**24, (n, 2), generator=g)  # a 48-bit seed in two numbers float32 holds exactly
    # Each band on with its own coin (the first of on2, then three of u's spare), as in ADA's augment.py: its gain's
    # change of the expected power undone by scaling all four, the bands' scalings multiplied.
    coins = torch.cat([on2[:, 0:1], u[:, 7:10]], 1)
    gains = torch.where((coins < p) & ("filter" in groups), torch.exp2(bands * BAND_STD), 1.0)
    weight = torch.tensor(BAND_POWER, dtype=torch.float64)
    out[:, FILTER] = gains / (1 - weight + weight * gains.square()).prod(1, keepdim=True).sqrt()
    if "noise" in groups:
        out[:, 29] = torch.where(on2[:, 1] < p, sigma.abs() * NOISE_STD, 0.0)
        out[:, 30:32] = pixels.double()
    return out.float()


def _affine(linear: torch.Tensor, shift: torch.Tensor | None) -> torch.Tensor:
    n = linear.shape[0]
    m = torch.eye(4, dtype=torch.float64).repeat(n, 1, 1)
    m[:, :3, :3] = linear
    if shift is not None:
        m[:, :3, 3] = shift
    return m


def _reflect(index: torch.Tensor, size: int) -> torch.Tensor:
    """Indices mirrored into [0, size) without repeating the edge (as F.pad's "reflect")."""
    period = 2 * (size - 1)
    r = index.remainder(period)
    return torch.where(r >= size, period - r, r)


def blit(x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """Flip (x), quarter turns, then a whole-pixel shift with mirrored fill; each output pixel is an input pixel."""
    n, c, h, w = x.shape
    flip, turns, dx, dy = (params[:, i].round().long().view(n, 1, 1) for i in range(4))
    # output pixel centres about the image's centre, doubled to stay integer: 2j + 1 - w
    v = (2 * torch.arange(h, device=x.device) + 1 - h).view(1, h, 1).expand(n, h, w) - 2 * dy
    u = (2 * torch.arange(w, device=x.device) + 1 - w).view(1, 1, w).expand(n, h, w) - 2 * dx
    for k in range(1, 4):  # undo the quarter turns (counter-clockwise on the screen: (u, v) -> (v, -u))
        turned = turns >= k
        u, v = torch.where(turned, -v, u), torch.where(turned, u, v)
    u = torch.where(flip.bool(), -u, u)
    rows, cols = _reflect((v + h - 1) // 2, h), _reflect((u + w - 1) // 2, w)
    index = (rows * w + cols).view(n, 1, h * w).expand(n, c, h * w)
    return x.reshape(n, c, h * w).gather(2, index).view(x.shape)


@functools.lru_cache(maxsize=64)
def _resampling(n: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The 2x up- and downsampling of a length-n signal through the sym6 pair, as matrices (2n x n, n x 2n):
    up puts zeros between the samples and filters with the taps reversed at gain 2 (output m takes input j
    with tap m + 5 - 2j), down filters with the taps at gain 1 and keeps every other sample (output k takes
    m with tap m - 2k + 5); zero beyond the ends. Down after up is the identity (the wavelet is orthogonal).
    As matrices the filters run as matrix products, which on a CPU are 10x as fast as 12-tap depthwise
    convolutions at ADA's canvas sizes."""
    taps = torch.tensor(SYM6, dtype=torch.float64)
    m, j = torch.arange(2 * n).view(-1, 1), torch.arange(n).view(1, -1)
    t = m + 5 - 2 * j
    up = torch.where((t >= 0) & (t < len(SYM6)), math.sqrt(2) * taps[t.clamp(0, len(SYM6) - 1)], 0.0)
    on = dict(dtype=dtype, device=device, non_blocking=True)
    return up.to(**on), (up.T / 2).to(**on)


def _up(x: torch.Tensor) -> torch.Tensor:
    (up_h, _), (up_w, _) = _resampling(x.shape[2], x.dtype, x.device), _resampling(x.shape[3], x.dtype, x.device)
    return torch.matmul(up_h, x @ up_w.T)


def _down(x: torch.Tensor) -> torch.Tensor:
    (_, down_h), (_, down_w) = (_resampling(x.shape[i] // 2, x.dtype, x.device) for i in (2, 3))
    return torch.matmul(down_h, x @ down_w.T)


def geometric(x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """Resample each image at its inverse matrix (params (n, 6): output position -> input position, in pixels
    about the centre), anti-aliased 2x; differentiable in x. Computed in float32 (float64 for float64 x)
    on x's device: positions in bf16 would be off by a pixel."""
    n, c, h, w = x.shape
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    inverse = params.view(n, 2, 3).double()
    corners = torch.tensor([[-1, -1], [1, -1], [-1, 1], [1, 1]], dtype=torch.float64) * torch.tensor([w, h]) / 2
    reach = (inverse[:, :, :2] @ corners.T.unsqueeze(0) + inverse[:, :, 2:]).abs()  # (n, 2, 4): |x|, |y|
    beyond = float((reach.amax(dim=(0, 2)) - torch.tensor([w, h]) / 2).max())
    m = int(min(max(math.ceil(beyond), 0) + 6, min(h, w) - 1))  # mirrored margin: the reach and the filters'
    up = _up(F.pad(x.to(dtype), (m, m, m, m), mode="reflect"))
    hp, wp = h + 2 * m, w + 2 * m
    # canvas pixel centres (in input pixels about the centre) -> where they come from, normalised for grid_sample
    on = dict(dtype=dtype, device=x.device)
    ys = (torch.arange(2 * hp, **on) + 0.5) / 2 + DELAY - hp / 2
    xs = (torch.arange(2 * wp, **on) + 0.5) / 2 + DELAY - wp / 2
    points = torch.stack([xs.view(1, -1).expand(2 * hp, -1), ys.view(-1, 1).expand(-1, 2 * wp)], -1)
    inverse = inverse.to(**on, non_blocking=True)  # (from the host: copies that do not wait on the device)
    source = torch.einsum("nij,hwj->nhwi", inverse[:, :, :2], points) + inverse[:, :, 2].view(n, 1, 1, 2)
    grid = (source - DELAY) / torch.tensor([wp / 2, hp / 2], dtype=dtype).to(x.device, non_blocking=True)
    sampled = grid_sample(up, grid)  # with a second derivative on CUDA too, for R1 (grid_sample.py)
    return _down(sampled)[:, :, m : m + h, m : m + w].to(x.dtype)


def colour(x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """Each image through its 3x4 colour matrix (on one channel: the matrix's mean row)."""
    n, c = x.shape[:2]
    m = params.view(n, 3, 4).to(x.dtype)
    if c == 1:
        m = m.mean(dim=1, keepdim=True)
        return x * m[:, :, :3].sum(-1).view(n, 1, 1, 1) + m[:, :, 3].view(n, 1, 1, 1)
    return torch.einsum("nij,njhw->nihw", m[:, :, :3], x) + m[:, :, 3].view(n, 3, 1, 1)


def cutout(x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """Zero a square of half the side centred at params' (y, x) in [0, 1), where params' first column is 1."""
    n, _, h, w = x.shape
    on, cy, cx = (params[:, i].to(x.device, non_blocking=True).view(n, 1, 1) for i in range(3))
    rows = ((torch.arange(h, device=x.device) + 0.5) / h).view(1, h, 1)
    cols = ((torch.arange(w, device=x.device) + 0.5) / w).view(1, 1, w)
    hole = ((rows - cy).abs() < CUTOUT / 2) & ((cols - cx).abs() < CUTOUT / 2) & on.bool()
    return x * (~hole).unsqueeze(1).to(x.dtype)


def _full(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The full convolution of two 1-D filters."""
    return F.conv1d(F.pad(a.view(1, 1, -1), (len(b) - 1, len(b) - 1)), b.flip(0).view(1, 1, -1)).view(-1)


@functools.lru_cache(maxsize=1)
def _bands() -> torch.Tensor:
    """Four 43-tap filters, lowest octave first, that sum to the identity. a = sym2 * its reverse / 2 is a
    half-band low-pass (sym2 is orthonormal: a is 1/2 at the centre and 0 at even offsets from it, its taps
    sum to 1, and it is 0 at the highest frequency); with a2 and a4 the
    same dilated by 2 and 4 (zeros between the taps), the bands are a * a2 * a4, a * a2 - a * a2 * a4,
    a - a * a2 and 1 - a."""
    h = torch.tensor(SYM2, dtype=torch.float64)
    a = _full(h, h.flip(0)) / 2

    def dilated(k: int) -> torch.Tensor:
        out = torch.zeros((len(a) - 1) * k + 1, dtype=torch.float64)
        out[::k] = a
        return out

    lows = [a, _full(a, dilated(2))]
    lows.append(_full(lows[1], dilated(4)))
    width = len(lows[2])
    lows = [
        F.pad(f, ((width - len(f)) // 2, (width - len(f)) // 2)) for f in (*lows, torch.ones(1, dtype=torch.float64))
    ]
    return torch.stack([lows[2], lows[1] - lows[2], lows[0] - lows[1], lows[3] - lows[0]])


@functools.lru_cache(maxsize=16)
def _band_matrices(size: int) -> torch.Tensor:
    """(43, size, size): tap t of a centred 43-tap filter along a side of `size`, the image mirrored (reflect)."""
    source = _reflect(torch.arange(size).view(1, -1, 1) + torch.arange(43).view(-1, 1, 1) - 21, size)  # (43, size, 1)
    return (source == torch.arange(size).view(1, 1, -1)).double()


@functools.lru_cache(maxsize=16)
def _band_taps(size: int, device: torch.device) -> torch.Tensor:
    """(k, size, size) on `device`: which taps (0..42) of a centred 43-tap filter along a side of `size`, the image
    mirrored (reflect), land on each entry (i, j) of its matrix, in the order they are added; 43 (a zero tap) where
    fewer than k do. From 23 px on, k is 2 (the mirror folds one tap onto another)."""
    source = _reflect(torch.arange(size).view(-1, 1) + torch.arange(43).view(1, -1) - 21, size)  # (size, 43)
    rows = torch.arange(size)
    filled = torch.zeros(size, size, dtype=torch.long)
    slots = []
    for t in range(43):  # (taps in order: each entry's sum is added up in one order on every device)
        at = filled[rows, source[:, t]]
        while len(slots) <= int(at.max()):
            slots.append(torch.full((size, size), 43, dtype=torch.long))
        for k in at.unique().tolist():
            mine = at == k
            slots[k][rows[mine], source[mine, t]] = t
        filled[rows, source[:, t]] += 1
    return torch.stack(slots).to(device)


def _filter_matrices(taps: torch.Tensor, size: int, dense: bool | None = None) -> torch.Tensor:
    """(n, size, size) float64: each image's filter `taps` (n, 43) as the matrix that applies it along a side, on
    taps' device. Each entry is the sum of the taps landing on it (one, or two where the mirror folds them; more
    below 23 px), which a product by the dense 0/1 matrices (`dense`, a CPU's: its BLAS is fastest) and the sums of
    the taps gathered (a GPU's, on the device: found by review, built on the host it was a float64 product of
    (n, 43) by (43, size²) and two (n, size, size) copies to the GPU each call) give alike, bit for bit."""
    if dense if dense is not None else taps.device.type == "cpu":
        return torch.einsum("nt,tij->nij", taps, _band_matrices(size).to(taps.device, non_blocking=True))
    zero = torch.cat([taps, taps.new_zeros(len(taps), 1)], 1)  # (n, 44): tap 43 is 0
    slots = _band_taps(size, taps.device)
    out = zero[:, slots[0]]
    for more in slots[1:]:
        out = out + zero[:, more]
    return out


def image_filter(x: torch.Tensor, gains: torch.Tensor) -> torch.Tensor:
    """Each image's four frequency bands scaled by its gains ((n, 4), lowest first), along rows and columns."""
    n, c, h, w = x.shape
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    taps = (gains.double() @ _bands()).to(x.device, non_blocking=True)  # (n, 43): each image's filter
    rows, cols = (_filter_matrices(taps, side).to(dtype).unsqueeze(1) for side in (h, w))
    return (rows @ x.to(dtype) @ cols.transpose(-1, -2)).to(x.dtype)


def noise(x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """Gaussian noise of each image's std (params (n, 3): std, its pixels' seed in two 24-bit halves; drawn on
    the CPU, so the same on any device and whichever images share the micro-batch)."""
    rows = params.tolist()
    noised = [i for i, (std, _, _) in enumerate(rows) if std]
    if not noised:
        return x
    drawn = host_rows(len(noised), tuple(x.shape[1:]), x.device)  # (pinned for a GPU: one copy that does not wait)
    for j, i in enumerate(noised):
        _, high, low = rows[i]
        torch.randn(drawn.shape[1:], generator=torch.Generator().manual_seed(int(high) << 24 | int(low)), out=drawn[j])
    drawn = drawn.to(x.device, x.dtype, non_blocking=True)
    at = {i: j for j, i in enumerate(noised)}
    return torch.stack([img + rows[i][0] * drawn[at[i]] if i in at else img for i, img in enumerate(x)])


def _only(x: torch.Tensor, changed: torch.Tensor, transform) -> torch.Tensor:
    """x with `transform(images, rows)` applied to the images whose `changed` (a CPU flag per image) is set;
    the others are not computed."""
    rows = changed.nonzero().squeeze(1)
    if len(rows) == 0:
        return x
    if len(rows) == len(x):
        return transform(x, rows)
    at = rows.to(x.device, non_blocking=True)
    return x.index_put((at,), transform(x[at], rows))


def apply(x: torch.Tensor, params: torch.Tensor | np.ndarray, groups: list[str]) -> torch.Tensor:
    """Images `x` (N, C, H, W, square; C 1 or 3) through their transforms (`params` from `draw`, where a
    group that is off holds its identity); an image whose transforms are all off passes unchanged.
    Differentiable in `x`. `params` are read on the host, where they were drawn, since which images move, the
    margins and the noise seeds are decided there: the task hands them over on the host (a NumPy array, a
    host part of its batch), and what goes to the device goes without waiting on it. On x's device they are
    copied back first, which waits for the device's queue. Computed in float32 (float64 for float64 x), as
    ADA does, whatever autocast says: its positions and matrices in bf16 would move pixels by one or more."""
    with torch.autocast(x.device.type, enabled=False):
        return _apply(x if x.dtype == torch.float64 else x.float(), torch.as_tensor(params).cpu(), groups)


def _apply(x: torch.Tensor, params: torch.Tensor, groups: list[str]) -> torch.Tensor:
    if params[:, BLIT].any():
        x = blit(x, params[:, BLIT].to(x.device, non_blocking=True))
    moved = (params[:, GEOM] != params.new_tensor([1.0, 0, 0, 0, 1, 0])).any(1)
    x = _only(x, moved, lambda images, rows: geometric(images, params[rows, GEOM]))
    if "color" in groups:
        x = colour(x, params[:, COLOR].to(x.device, non_blocking=True))
    filtered = (params[:, FILTER] != 1).any(1)
    x = _only(x, filtered, lambda images, rows: image_filter(images, params[rows, FILTER]))
    if "noise" in groups:
        x = noise(x, params[:, NOISE])
    if "cutout" in groups:
        x = cutout(x, params[:, CUT])
    return x
