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
   25..100% of the width (p 0.25); clipped to [0, 1].

DFL's last step, a JPEG re-compression (p 0.25), is left out: it has no differentiable or device-side
form here, and it would send each batch back to the host.

Every draw comes from one stream keyed by the step (`draw`), drawn for the whole step and sliced per rank,
so that the augmentation does not depend on the rank count. The linear filters' kernels (OpenCV's, built
by OpenCV on the host: cv2.getGaussianKernel, its motion-blur line) and the resize's matrices are drawn
there too; the images never leave the device.
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
    first, second = np.zeros((n, TAPS, TAPS), np.float32), np.zeros((n, TAPS, TAPS), np.float32)
    first[:, TAPS // 2, TAPS // 2] = second[:, TAPS // 2, TAPS // 2] = 1  # (identity: not applied)
    for i in range(n):
        if sharpen[i]:
            size, chance, box, amount = int(ints(5)) + 1, int(ints(100)), bool(ints(2) == 0), 0
            amount = int(ints(10)) if box else int(ints(50))
            if chance < 25 and amount > 0:
                first[i] = _centred(_sharpen_kernel(size, box, amount))
        else:
            size, angle, chance = int(ints(5)) + 1, int(ints(360)), int(ints(100))
            if chance < 25:
                first[i] = _centred(_motion_kernel(size, angle))
            size, chance = int(ints(5)) * 2 + 1, int(ints(100))
            if chance < 25:
                k = cv2.getGaussianKernel(size, 0).astype(np.float32)
                second[i] = _centred(k @ k.T)
    filters = torch.from_numpy(first), torch.from_numpy(second), _circles(n, res, ints), _circles(n, res, ints)
    resize = _resize_matrices(n, res, u(n) < 0.25, u(n) < 0.5, u(n)), _circles(n, res, ints)
    return (
        bg_on, bg_theta, bg_flips, *bg_colour, bg_strength, theta, offsets, cells, flips,
        *flares, *colour, *filters, *resize,
    )  # fmt: skip


def apply(
    faces: torch.Tensor, backgrounds: torch.Tensor, draws: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(augmented faces (N, 3, H, W) in [0, 1], their labels (N, 1, H, W) in {0, 1}) of labelled faces
    (N, 4, H, W: the picture and its label, floats in [0, 1]), each with another labelled face for its
    background (`backgrounds`, the same form), by one step's `draw` (this rank's rows). float32."""
    with torch.autocast(faces.device.type, enabled=False):
        return _apply(faces.float(), backgrounds.float(), [d.to(faces.device, non_blocking=True) for d in draws])


def _apply(x: torch.Tensor, bg: torch.Tensor, d: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    bg_on, bg_theta, bg_flips, bg_hsv_on, bg_hsv, bg_levels, bg_strength = d[:7]
    theta, offsets, cells, flips, flare_on, flare_size = d[7:13]
    hsv_on, hsv, levels, circle, first, second, circle1, circle2, resize, circle3 = d[13:]
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
        flare = _gaussian(image * region, flare_size[:, j])
        image = torch.where(flare_on[:, j].view(-1, 1, 1, 1), image + flare, image)
    # 4. under faded circles: colours, sharpening or blurs, a resize
    image = _recolour(image, hsv_on, hsv, levels, _circle(circle, res))
    for kernel, where in ((first, circle1), (second, circle2)):
        fade = _circle(where, res)
        image = image * (1 - fade) + _filter(image, kernel) * fade
    resized = torch.einsum("nij,ncjk,nlk->ncil", resize, image, resize)
    fade = _circle(circle3, res)
    image = (image * (1 - fade) + resized * fade).clamp(0, 1)
    return image, mask


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
    top = int(_odd(torch.tensor(w - 1)))  # every kernel zero-padded to the largest size drawn (k < w, made odd)
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


def _resize_matrices(n: int, res: int, on: torch.Tensor, nearest: torch.Tensor, trg: torch.Tensor) -> torch.Tensor:
    """DFL's apply_random_resize (chance 25, max_size_per 75) as a matrix per face, R (res x res): the image
    resized down to res - int(trg · int(0.75 res)) and back up (cv2's INTER_NEAREST or INTER_LINEAR, which
    torch's `nearest` and `linear` without antialiasing are) is R · image · Rᵀ; the identity where not on."""
    eye = torch.eye(res, dtype=torch.float64)
    out = eye.repeat(n, 1, 1)
    for i in torch.nonzero(on).flatten().tolist():
        small = res - int(float(trg[i]) * int(res * 0.75))
        mode = "nearest" if nearest[i] else "linear"
        kw = {} if mode == "nearest" else {"align_corners": False}
        down = F.interpolate(eye[:, None], size=small, mode=mode, **kw)
        up = F.interpolate(down, size=res, mode=mode, **kw)[:, 0]  # row j: what input pixel j gives each output
        out[i] = up.T
    return out.float()
