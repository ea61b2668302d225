"""XSeg's training augmentation, as DeepFaceLab's SampleGeneratorFaceXSeg draws it for each labelled face,
in its order, on the training device:

1. half the faces get another labelled face's background: that face turned (±180°), scaled (±10%), shifted
   (±10%) and mirrored, its face cut out, its colours shifted (HSV, or RGB levels), and blended in behind
   the face at a random strength (15..100%);
2. the face and its label warped together: DFL's random warp and affine (rotation ±10°, scale ±5%, shift ±5%,
   mirrored with p 0.4; `swap.warp`), the label cut at 0.5;
3. half get a "face flare" (the face blurred by a Gaussian of a quarter to all of the width, added back),
   half a background flare;
4. under a random faded circle: an HSV shift or random RGB levels; then a sharpening (box or Gaussian) or a
   motion blur and a Gaussian blur, each with p 0.25; then a nearest or bilinear down-and-up resize to
   25..100% of the width (p 0.25); clipped to [0, 1]; then a JPEG re-compression at quality 10..100 (p 0.25).

The JPEG round trip is computed on the device (`jpeg`: libjpeg's steps and tables, with a float DCT), so that no
batch goes back to the host; it is within a level of OpenCV's on average.

Every draw comes from one stream keyed by the step (`draw`), drawn for the whole step and sliced per rank,
so that the augmentation does not depend on the rank count. The draws are numbers per face; the linear
filters' kernels are built from them by OpenCV (cv2.getGaussianKernel, its motion-blur line) on the host, for
a micro-batch's faces only; the images never leave the device.
"""

from __future__ import annotations

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from bigbatch.tasks.swap import color, warp

TAPS = 9  # the sharpen, motion blur and Gaussian blur kernels (at most 5, 5 and 9 taps), centred in 9 x 9


def draw(n: int, res: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    """One step's draws for `n` faces of `res` px (see `apply` for their use), on the host."""
    u = lambda *shape: torch.rand(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    ints = lambda hi, *shape: torch.randint(hi, shape, generator=g)  # noqa: E731
    bg_on = u(n) < 0.5
    bg_theta, _, _, bg_flips = warp.draw(n, g, True, rotation=180, scale=0.10, shift=0.10)
    bg_colour = (u(n) < 0.5, *_colour_draws(n, u, ints))
    bg_strength = (0.15 + u(n) * 0.85).float()
    theta, offsets, cells, flips = warp.draw(n, g, True)
    flares = torch.stack([u(n) < 0.5, u(n) < 0.5], 1), _odd(ints(res - res // 4, n, 2) + res // 4)
    colour = (u(n) < 0.5, *_colour_draws(n, u, ints), _circles(n, res, ints))
    sharpen = u(n) < 0.5  # else motion blur then Gaussian blur
    size, box, amount10, amount50, angle = ints(5, n) + 1, ints(2, n) == 0, ints(10, n), ints(50, n), ints(360, n)
    amount = torch.where(box, amount10, amount50)
    first_on = (ints(100, n) < 25) & (~sharpen | (amount > 0))  # (blursharpen: an amount of 0 does nothing)
    blur = torch.where(~sharpen & (ints(100, n) < 25), ints(5, n) * 2 + 1, 0)  # the Gaussian blur's size, 0: none
    filters = torch.stack([sharpen, first_on, size, box, amount, angle, blur], 1).long()
    filters = filters, _circles(n, res, ints), _circles(n, res, ints)
    on, nearest, trg = u(n) < 0.25, u(n) < 0.5, u(n)
    small = res - (trg * int(res * 0.75)).long()  # (DFL's w - int(trg * int(w * max_size_per / 100)))
    resize = torch.stack([on, nearest, small], 1).long(), _circles(n, res, ints)
    compress = u(n) < 0.25, ints(91, n) + 10, _circles(n, res, ints)
    return (
        bg_on, bg_theta, bg_flips, *bg_colour, bg_strength, theta, offsets, cells, flips,
        *flares, *colour, *filters, *resize, *compress,
    )  # fmt: skip


def apply(
    faces: torch.Tensor, backgrounds: torch.Tensor, draws: tuple[np.ndarray, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(augmented faces (N, 3, H, W) in [0, 1], their labels (N, 1, H, W) in {0, 1}) of labelled faces
    (N, 4, H, W: the picture and its label, floats in [0, 1]), each with another labelled face for its
    background (`backgrounds`, the same form), by one step's `draw` (this rank's rows, NumPy: host parts of the
    step's batch). float32."""
    draws = [np.asarray(t) for t in draws]  # (a tensor given: on the host, as drawn)
    # Read on the host, where the draws stay (found from outside: sent to the GPU with the batch, they were read
    # back 10 times a micro-batch, each read waiting for the device's queue): the filter kernels, built for these
    # rows only; which faces get a flare, a resize, a JPEG round trip (computed for those faces alone: each is a
    # p 0.25-0.5 draw), and those faces' rows as index tensors.
    host = {
        "flares": [_rows(np.flatnonzero(draws[11][:, j]), faces.device) for j in range(2)],
        "resizes": draws[20].tolist(),
        "jpeg": _rows(np.flatnonzero(draws[22]), faces.device),
    }
    draws[17] = _kernels(draws[17])
    with torch.autocast(faces.device.type, enabled=False):
        d = [torch.from_numpy(np.ascontiguousarray(t)).to(faces.device, non_blocking=True) for t in draws]
        return _apply(faces.float(), backgrounds.float(), d, host)


def _rows(rows: np.ndarray, device: torch.device) -> torch.Tensor | None:
    """Row numbers on `device`, copied without waiting for its queue (None: no rows)."""
    return torch.from_numpy(rows.astype(np.int64)).to(device, non_blocking=True) if len(rows) else None


def _apply(x: torch.Tensor, bg: torch.Tensor, d: list[torch.Tensor], host: dict) -> tuple[torch.Tensor, torch.Tensor]:
    bg_on, bg_theta, bg_flips, bg_hsv_on, bg_hsv, bg_levels, bg_strength = d[:7]
    theta, offsets, cells, flips, _, flare_size = d[7:13]
    hsv_on, hsv, levels, circle, kernels, circle1, circle2, _, circle3 = d[13:22]
    _, quality, circle4 = d[22:]
    n, _, res, _ = x.shape
    image, mask = x[:, :3], x[:, 3:4]
    # 1. another face's background behind this one
    _, moved = warp.apply(bg, bg_theta, offsets, cells, bg_flips, warp=False)
    other, other_mask = moved[:, :3] * (1 - moved[:, 3:4]), moved[:, 3:4]
    other = _recolour(other, bg_hsv_on, bg_hsv, bg_levels, None)
    keep = 1 - (1 - other_mask) * (1 - mask)
    rnd = bg_strength.view(-1, 1, 1, 1)
    mixed = image * keep + image * (1 - keep) * rnd + other * (1 - keep) * (1 - rnd)
    image = torch.where(bg_on.view(-1, 1, 1, 1), mixed, image)
    # 2. warped and transformed together, the label cut at 0.5
    warped, _ = warp.apply(torch.cat([image, mask], 1), theta, offsets, cells, flips, warp=True, masks_too=True)
    image, mask = warped[:, :3].clamp(0, 1), (warped[:, 3:4] >= 0.5).float()
    # 3. flares: the face (then the background) blurred and added
    for j, region in enumerate((mask, 1 - mask)):
        if (at := host["flares"][j]) is not None:
            image = image.index_add(0, at, _gaussian(image[at] * region[at], flare_size[at, j]))
    # 4. under faded circles: colours, sharpening or blurs, a resize
    image = _recolour(image, hsv_on, hsv, levels, _circle(circle, res))
    for j, where in enumerate((circle1, circle2)):  # sharpening or motion blur, then the Gaussian blur
        fade = _circle(where, res)
        image = image * (1 - fade) + _filter(image, kernels[:, j]) * fade
    resized = [image[i : i + 1] for i in range(n)]  # down to its size and back up, face by face where drawn
    for i, (on, nearest, small) in enumerate(host["resizes"]):
        if on:
            mode = {"mode": "nearest"} if nearest else {"mode": "bilinear", "align_corners": False}
            down = F.interpolate(resized[i], size=(small, small), **mode)
            resized[i] = F.interpolate(down, size=(res, res), **mode)
    fade = _circle(circle3, res)
    image = (image * (1 - fade) + torch.cat(resized) * fade).clamp(0, 1)
    if (at := host["jpeg"]) is not None:
        fade, part = _circle(circle4[at], res), image[at]
        image = image.index_copy(0, at, part * (1 - fade) + jpeg(part, quality[at]) * fade)
    return image, mask


# libjpeg's quantisation tables at quality 50 (ITU T.81 Annex K), luminance then chrominance, in row order.
_LUMA = (
    16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55, 14, 13, 16, 24, 40, 57, 69, 56,
    14, 17, 22, 29, 51, 87, 80, 62, 18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64, 81, 104, 113, 92,
    49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99,
)  # fmt: skip
_CHROMA = (17, 18, 24, 47, *(99,) * 4, 18, 21, 26, 66, *(99,) * 4, 24, 26, 56, *(99,) * 5, 47, 66, *(99,) * 38)


def quantisation_tables(quality: torch.Tensor) -> list[torch.Tensor]:
    """libjpeg's luminance and chrominance tables (N, 8, 8), in row order, at `quality` (N,) each (jpeg_set_quality)."""
    q = quality.float().view(-1, 1, 1)
    scale = torch.where(q < 50, torch.floor(5000 / q), 200 - 2 * q)  # (libjpeg's integer division: found by review)
    tables = []
    for base in (_LUMA, _CHROMA):  # (made on the host and copied without waiting: torch.tensor(device=) waits)
        t = torch.tensor(base, dtype=torch.float32).view(1, 8, 8).to(q.device, non_blocking=True)
        tables.append(torch.floor((t * scale + 50) / 100).clamp(1, 255))
    return tables


def jpeg(x: torch.Tensor, quality: torch.Tensor) -> torch.Tensor:
    """Images (N, 3, H, W) RGB in [0, 1] through a JPEG encode and decode at `quality` (N,) each, as OpenCV's
    imencode and imdecode do it with libjpeg, computed on the images' device: 8-bit (truncated, as DFL casts),
    YCbCr (JFIF), chroma averaged over 2 x 2 (4:2:0), each 8 x 8 block's DCT quantised by libjpeg's tables scaled
    to the quality, then decoded with libjpeg's "fancy" chroma upsampling (linear, 3/4 and 1/4). The DCT is a
    float one where libjpeg's is integer: within a level or two of OpenCV's (tests/test_xseg_train.py). H and W
    multiples of 16."""
    n, _, h, w = x.shape
    tables = quantisation_tables(quality.to(x.device))
    rgb = (x.clamp(0, 1) * 255).floor()
    r, g, b = rgb[:, 0], rgb[:, 1], rgb[:, 2]
    y = torch.round(0.299 * r + 0.587 * g + 0.114 * b)  # (libjpeg's samples are 8-bit at every stage)
    cb = torch.round(-0.168736 * r - 0.331264 * g + 0.5 * b + 128)
    cr = torch.round(0.5 * r - 0.418688 * g - 0.081312 * b + 128)
    chroma = torch.floor(F.avg_pool2d(torch.stack([cb, cr], 1), 2) + 0.375)  # ((sum + bias 1 or 2) >> 2)
    k = torch.arange(8, device=x.device, dtype=torch.float32)
    norm = torch.where(k == 0, 0.5**0.5, 1.0).view(-1, 1) / 2
    dct = torch.cos((2 * k.view(1, -1) + 1) * k.view(-1, 1) * torch.pi / 16) * norm  # (orthonormal DCT-II)

    def through(plane: torch.Tensor, table: torch.Tensor) -> torch.Tensor:  # (N, h, w) -> quantised and back
        ph, pw = plane.shape[1:]
        blocks = (plane - 128).view(n, ph // 8, 8, pw // 8, 8).permute(0, 1, 3, 2, 4)
        coef = dct @ blocks @ dct.T
        t = table.view(n, 1, 1, 8, 8)
        back = dct.T @ (torch.round(coef / t) * t) @ dct
        return torch.round(back.permute(0, 1, 3, 2, 4).reshape(n, ph, pw) + 128).clamp(0, 255)

    y = through(y, tables[0])
    chroma = torch.stack([through(chroma[:, i], tables[1]) for i in range(2)], 1)
    cb, cr = torch.round(F.interpolate(chroma, size=(h, w), mode="bilinear", align_corners=False)).unbind(1)
    r = y + 1.402 * (cr - 128)
    g = y - 0.344136 * (cb - 128) - 0.714136 * (cr - 128)
    b = y + 1.772 * (cb - 128)
    return torch.stack([r, g, b], 1).round().clamp(0, 255) / 255


def _colour_draws(n: int, u, ints) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    """DFL's apply_random_hsv_shift's (hue + 0..359°, saturation and value ± 0.5) and apply_random_rgb_levels'
    (per channel: in black, in white, gamma, out black, out white) draws."""
    hsv = torch.stack([ints(360, n).double(), u(n) - 0.5, u(n) - 0.5], 1).float()
    levels = torch.stack([u(n, 3) * 0.25, 1 - u(n, 3) * 0.25, 0.5 + u(n, 3), u(n, 3) * 0.25, 1 - u(n, 3) * 0.25], 1)
    return hsv, levels.float()


def _recolour(
    x: torch.Tensor, hsv_on: torch.Tensor, hsv: torch.Tensor, levels: torch.Tensor, fade: torch.Tensor | None
) -> torch.Tensor:
    """An HSV shift (where `hsv_on`) or RGB levels, blended in by `fade` (None: everywhere)."""
    shifted = color.hsv_shift(x, hsv)
    lo, hi, gamma, out_lo, out_hi = (levels[:, k].view(-1, 3, 1, 1) for k in range(5))
    levelled = ((x - lo) / (hi - lo)).clamp(0, 1) ** (1 / gamma) * (out_hi - out_lo) + out_lo
    result = torch.where(hsv_on.view(-1, 1, 1, 1), shifted, levelled.clamp(0, 1))
    return result if fade is None else x * (1 - fade) + result * fade


def _circles(n: int, res: int, ints) -> torch.Tensor:  # noqa: ANN001
    """sd.random_circle_faded's draws per face: (centre row, centre column, fade start, fade length)."""
    start = ints(res, n)
    length = torch.tensor([int(ints(res - int(s))) for s in start], dtype=torch.long)
    return torch.stack([ints(res, n), ints(res, n), start, start + length], 1)


def _circle(draws: torch.Tensor, res: int) -> torch.Tensor:
    """The faded circles (N, 1, res, res): 1 inside the fade start, falling to 0 over the fade length."""
    r = torch.arange(res, device=draws.device, dtype=torch.float32)
    cy, cx, start, length = (draws[:, k].float().view(-1, 1, 1) for k in range(4))
    dist = ((r.view(1, -1, 1) - cy) ** 2 + (r.view(1, 1, -1) - cx) ** 2).sqrt()
    return (1 - (dist - start) / torch.where(length == 0, torch.ones_like(length), length)).clamp(0, 1)[:, None]


def _odd(k: torch.Tensor) -> torch.Tensor:
    return k - k % 2 + 1


def _gaussian(x: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """cv2.GaussianBlur(x, (k, k), 0) per image, k odd (its σ: 0.3((k - 1)/2 - 1) + 0.8), reflect-101 border."""
    n, c, h, w = x.shape
    top = (w - 1) - (w - 1) % 2 + 1  # every kernel zero-padded to the largest size drawn (k < w, made odd)
    d = torch.arange(top, device=x.device, dtype=torch.float32) - top // 2
    sigma = (0.3 * ((sizes.float() - 1) * 0.5 - 1) + 0.8).view(-1, 1)
    k = torch.exp(-(d.view(1, -1) ** 2) / (2 * sigma**2)) * (d.view(1, -1).abs() <= (sizes.view(-1, 1) // 2))
    k = (k / k.sum(1, keepdim=True)).repeat_interleave(c, 0)  # (n * c, top)
    pad = top // 2
    y = F.pad(x.reshape(1, n * c, h, w), (pad, pad, pad, pad), mode="reflect")
    y = F.conv2d(y, k.view(n * c, 1, top, 1), groups=n * c)
    return F.conv2d(y, k.view(n * c, 1, 1, top), groups=n * c).view(n, c, h, w)


def _filter(x: torch.Tensor, kernels: torch.Tensor) -> torch.Tensor:
    """cv2.filter2D(x, -1, kernel) per image (a correlation), reflect-101 border."""
    n, c, h, w = x.shape
    y = F.pad(x.reshape(1, n * c, h, w), (TAPS // 2,) * 4, mode="reflect")
    return F.conv2d(y, kernels.repeat_interleave(c, 0)[:, None], groups=n * c).view(n, c, h, w)


def _centred(k: np.ndarray) -> np.ndarray:
    """A kernel of at most TAPS taps placed so that its anchor (OpenCV's: k // 2) is the centre of TAPS x TAPS."""
    out = np.zeros((TAPS, TAPS), np.float32)
    at = TAPS // 2 - k.shape[0] // 2
    out[at : at + k.shape[0], at : at + k.shape[1]] = k
    return out


def _sharpen_kernel(size: int, box: bool, amount: int) -> np.ndarray:
    """DFL's blursharpen as one kernel: box (mode 1) or Gaussian (mode 2) unsharp masking."""
    size += 1 - size % 2
    identity = np.zeros((size, size), np.float32)
    identity[size // 2, size // 2] = 1
    if box:
        return identity + (identity - np.full((size, size), 1 / size**2, np.float32)) * amount
    g = cv2.getGaussianKernel(size, 0).astype(np.float32)
    return identity * (1 + 0.5 * amount) - (g @ g.T) * (0.5 * amount)


def _motion_kernel(size: int, angle: int) -> np.ndarray:
    """DFL's LinearMotionBlur kernel: a horizontal line through the centre row, turned by `angle` degrees."""
    k = np.zeros((size, size), np.float32)
    k[(size - 1) // 2, :] = 1
    k = cv2.warpAffine(k, cv2.getRotationMatrix2D((size / 2 - 0.5, size / 2 - 0.5), angle, 1.0), (size, size))
    return k / k.sum()


def _kernels(filters: np.ndarray) -> np.ndarray:
    """Each face's two filter kernels (N, 2, TAPS, TAPS) from `draw`'s filter draws, by OpenCV as DFL makes them:
    the sharpening (blursharpen) or motion blur (LinearMotionBlur) kernel, then the Gaussian blur's
    (cv2.getGaussianKernel); the identity where one is not applied."""
    out = np.zeros((len(filters), 2, TAPS, TAPS), np.float32)
    out[:, :, TAPS // 2, TAPS // 2] = 1
    for i, (sharpen, first_on, size, box, amount, angle, blur) in enumerate(filters.tolist()):
        if first_on:
            out[i, 0] = _centred(_sharpen_kernel(size, bool(box), amount) if sharpen else _motion_kernel(size, angle))
        if blur:
            k = cv2.getGaussianKernel(blur, 0).astype(np.float32)
            out[i, 1] = _centred(k @ k.T)
    return out
