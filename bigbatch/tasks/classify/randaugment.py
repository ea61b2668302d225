"""RandAugment (Cubuk et al. 2020) as timm configures it, on the device for a whole micro-batch.

train.randaugment takes timm's --aa string: "rand-m9-mstd0.5-inc1" is magnitude 9 of 10, each image's
magnitude drawn from a normal of standard deviation 0.5 about it, the "increasing" set of operations
(stronger with the magnitude: ResNet strikes back's and DeiT's), two layers. Keys: m (magnitude), n
(layers, 2), mstd (0; "inf": uniform in [0, m]), mmax (10, the clip), inc (0 or 1), p (each layer's
chance to apply, 0.5 as timm's).

Each layer of each image picks one of timm's 15 operations at random and applies it with chance p:
AutoContrast, Equalize, Invert, Rotate (30 degrees at 10), Posterize, Solarize, SolarizeAdd, Color,
Contrast, Brightness, Sharpness, ShearX, ShearY (0.3 at 10, about the top-left corner as PIL shears),
TranslateXRel, TranslateYRel (45% at 10), with timm's level-to-argument maps and a random sign where
timm has one. They run on 0-255 values rounded after each operation (PIL works in uint8: Posterize and
Solarize need whole values), geometric ones by bilinear resampling with timm's fill, the ImageNet mean
(124, 116, 104). timm runs them per image on PIL images in the loader's processes; here the images are
already on the device (cropped there or by the loader), so each operation runs once for the images that
drew it. The draws are made on the host for the whole step and keyed by the step and each image's place
in it, so they do not depend on the micro-batch or the number of processes. Not bit-equal to PIL's
(its bicubic choice, rounding inside each filter): the same operations at the same strengths.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from bigbatch.data.streams import RAND_AUG
from bigbatch.errors import BigbatchError

OPS = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "Posterize",
    "Solarize",
    "SolarizeAdd",
    "Color",
    "Contrast",
    "Brightness",
    "Sharpness",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
)
GEOMETRIC = {"Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"}
FILL = (124, 116, 104)  # timm's fill: the ImageNet mean in 0-255
EXAMPLE = '"rand-m9-mstd0.5-inc1"'
# A draw per layer of each image: [operation, applied (0/1), magnitude, sign (+1/-1), increasing set (0/1)].
OP, APPLIED, LEVEL, SIGN, INC = range(COLUMNS := 5)


@dataclass(frozen=True)
class Policy:
    magnitude: float
    layers: int = 2
    std: float = 0.0
    most: float = 10.0
    increasing: bool = False
    p: float = 0.5


def parse(spec: str) -> Policy:
    """timm's RandAugment string ("rand-m9-mstd0.5-inc1") -> Policy; ValueError naming what is wrong."""
    parts = spec.strip().split("-")
    if parts[0] != "rand" or len(parts) < 2:
        raise ValueError(f"must be timm's RandAugment string, e.g. {EXAMPLE}, got {spec!r}")
    values: dict[str, float] = {}
    for part in parts[1:]:
        found = re.fullmatch(r"(mstd|mmax|inc|m|n|p)(inf|[0-9]*\.?[0-9]+)", part)
        if not found:
            raise ValueError(f"has {part!r}, which is none of m, n, mstd, mmax, inc, p with a number (e.g. {EXAMPLE})")
        values[found[1]] = float(found[2])
    if "m" not in values:
        raise ValueError(f"needs a magnitude, m0 to m10 (e.g. {EXAMPLE}), got {spec!r}")
    std = values.get("mstd", 0.0)
    policy = Policy(
        values["m"],
        int(values.get("n", 2)),
        math.inf if std > 100 else std,  # (timm's: uniform magnitudes above 100, "mstd101"; found from outside)
        values.get("mmax", 10.0) or 10.0,  # (timm's: mmax0 is the default, 10)
        bool(values.get("inc", 0)),
        values.get("p", 0.5),
    )
    if policy.layers < 1 or values.get("n", 2) != policy.layers:
        raise ValueError(f"n is the number of layers, a whole number >= 1, got {values['n']:g}")
    if not 0 <= policy.p <= 1 or values.get("inc", 0) not in (0, 1) or not math.isfinite(policy.magnitude):
        raise ValueError(f"p must be in [0, 1] and inc 0 or 1 (e.g. {EXAMPLE}), got {spec!r}")
    return policy


def draw(policy: Policy, batch: int, seed: int, nimg: int) -> np.ndarray:
    """The step's draws (batch, layers, 5), one row per layer of each image (see OP..SIGN), as timm draws
    them: the operation uniformly with replacement, applied with chance p, the magnitude from a normal
    about m (uniform in [0, m] with mstd inf) clipped to [0, mmax], a sign for the signed operations."""
    rng = np.random.default_rng(np.random.SeedSequence([seed & 0xFFFFFFFFFFFFFFFF, RAND_AUG, nimg]))
    shape = (batch, policy.layers)
    out = np.empty((*shape, COLUMNS), np.float32)
    out[..., OP] = rng.integers(0, len(OPS), shape)
    out[..., APPLIED] = rng.random(shape) < policy.p
    if math.isinf(policy.std):
        level = rng.uniform(0, policy.magnitude, shape)
    else:
        level = policy.magnitude + policy.std * rng.standard_normal(shape)
    out[..., LEVEL] = np.clip(level, 0, policy.most)
    out[..., SIGN] = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
    out[..., INC] = policy.increasing
    return out


def apply(x: torch.Tensor, draws: np.ndarray) -> torch.Tensor:
    """Images x (N, C, H, W, in [-1, 1]) through their layers of `draws` (on the host, cut with the batch),
    in float32 whatever autocast says; an image no layer applies to passes as it is. Not differentiable
    (it augments inputs)."""
    touched = np.flatnonzero(draws[:, :, APPLIED].any(1))
    if not len(touched):
        return x
    draws = draws[touched]
    with torch.no_grad(), torch.autocast(x.device.type, enabled=False):
        at_touched = torch.from_numpy(touched).to(x.device, non_blocking=True)
        p = _q((x[at_touched].float() + 1) * 127.5)  # (whole levels: Solarize's threshold compares them, as PIL)
        for layer in range(draws.shape[1]):
            rows = draws[:, layer]
            for op in np.unique(rows[rows[:, APPLIED] > 0, OP]).astype(int):
                chosen = np.flatnonzero((rows[:, APPLIED] > 0) & (rows[:, OP] == op))
                at = torch.from_numpy(chosen).to(x.device, non_blocking=True)
                args = torch.from_numpy(_argument(OPS[op], rows[chosen]).astype(np.float32))
                p = p.index_put((at,), _OPERATIONS[OPS[op]](p[at], args.to(x.device, non_blocking=True)))
        return x.index_put((at_touched,), (p / 127.5 - 1).to(x.dtype))


def _argument(op: str, rows: np.ndarray) -> np.ndarray:
    """timm's level-to-argument map of `op` for each row's magnitude (of 10) and sign."""
    level, sign, increasing = rows[:, LEVEL] / 10, rows[:, SIGN], rows[:, INC] > 0
    if op == "Rotate":
        return level * 30 * sign
    if op in ("ShearX", "ShearY"):
        return level * 0.3 * sign
    if op.startswith("Translate"):
        return level * 0.45 * sign
    if op in ("Color", "Contrast", "Brightness", "Sharpness"):
        return np.where(increasing, np.maximum(0.1, 1 + level * 0.9 * sign), level * 1.8 + 0.1)  # (timm's floor)
    if op == "Posterize":  # bits kept
        bits = np.floor(level * 4)
        return np.where(increasing, 4 - bits, bits)
    if op == "Solarize":  # threshold
        threshold = np.floor(level * 256)
        return np.where(increasing, 256 - threshold, threshold)
    if op == "SolarizeAdd":
        return np.floor(level * 110)
    return np.zeros(len(rows), np.float32)


def _q(p: torch.Tensor) -> torch.Tensor:
    return p.round().clamp(0, 255)


def _per_image(t: torch.Tensor) -> torch.Tensor:
    return t.view(-1, 1, 1, 1)


def _on(p: torch.Tensor, values: tuple[float, ...]) -> torch.Tensor:
    """Constants on p's device and dtype, copied without waiting (found by review: p.new_tensor(data) copies
    blocking, and made the host wait for the GPU at each operation)."""
    return torch.tensor(values, dtype=p.dtype, device="cpu").to(p.device, non_blocking=True)


def _grey(p: torch.Tensor) -> torch.Tensor:
    """PIL's L of RGB (ITU-R 601-2 luma), (N, 1, H, W); a grey image as it is."""
    if p.shape[1] != 3:
        return p[:, :1]
    weights = _on(p, (0.299, 0.587, 0.114)).view(1, 3, 1, 1)
    return (p * weights).sum(1, keepdim=True)


def _blend(base: torch.Tensor, p: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL's ImageEnhance: base + factor (p - base)."""
    return _q(base + _per_image(factor) * (p - base))


def _autocontrast(p: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
    low, high = p.amin((2, 3), keepdim=True), p.amax((2, 3), keepdim=True)
    spread = high - low
    return _q(torch.where(spread > 0, (p - low) * 255 / spread.clamp(min=1e-6), p))


def _equalize(p: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
    """PIL's ImageOps.equalize per channel: a lookup table from the cumulative histogram, the last level
    present left out."""
    n, c, h, w = p.shape
    levels = _q(p).long().reshape(n * c, h * w)
    # (counted in int64: CUDA's float cumsum is refused under train.deterministic, found by review)
    hist = torch.zeros(n * c, 256, device=p.device, dtype=torch.long).scatter_add_(1, levels, torch.ones_like(levels))
    last = (hist > 0) * torch.arange(256, device=p.device)
    last_count = hist.gather(1, last.argmax(1, keepdim=True))
    step = torch.div(h * w - last_count, 255, rounding_mode="floor")
    before = hist.cumsum(1) - hist  # pixels below each level
    lut = torch.div(step // 2 + before, step.clamp(min=1), rounding_mode="floor").clamp(max=255)
    lut = torch.where(step > 0, lut, torch.arange(256, device=p.device, dtype=lut.dtype).expand_as(lut))
    return lut.gather(1, levels).view(n, c, h, w).to(p.dtype)


def _invert(p: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
    return 255 - p


def _posterize(p: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    unit = _per_image(2 ** (8 - bits.clamp(0, 8)))
    return torch.div(_q(p), unit, rounding_mode="floor") * unit


def _solarize(p: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    return torch.where(p >= _per_image(threshold), 255 - p, p)


def _solarize_add(p: torch.Tensor, add: torch.Tensor) -> torch.Tensor:
    return torch.where(p < 128, (p + _per_image(add)).clamp(max=255), p)


def _colour(p: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return _blend(_grey(p), p, factor) if p.shape[1] == 3 else p


def _contrast(p: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    mean = (_grey(p).mean((1, 2, 3), keepdim=True) + 0.5).floor()
    return _blend(mean, p, factor)


def _brightness(p: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return _blend(torch.zeros_like(p), p, factor)


def _sharpness(p: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL's: blended with its SMOOTH filtering (3x3, 5 at the centre, 1 around, over 13); the border
    pixels are their own smoothing."""
    c = p.shape[1]
    kernel = p.new_ones(c, 1, 3, 3)
    kernel[:, :, 1, 1] = 5
    smooth = F.conv2d(p, kernel / 13, groups=c)
    smooth = F.pad(smooth, (1, 1, 1, 1))
    border = torch.ones_like(p[:1, :1], dtype=torch.bool)
    border[..., 1:-1, 1:-1] = False
    return _blend(torch.where(border, p, _q(smooth)), p, factor)


def _geometric(op: str):
    def transform(p: torch.Tensor, arg: torch.Tensor) -> torch.Tensor:
        n, c, h, w = p.shape
        theta = torch.zeros(n, 2, 3, device=p.device)
        theta[:, 0, 0] = theta[:, 1, 1] = 1
        if op == "Rotate":  # about the centre; positive: counter-clockwise, as PIL's rotate
            a = torch.deg2rad(arg)
            theta[:, 0, 0], theta[:, 0, 1] = torch.cos(a), -torch.sin(a) * h / w
            theta[:, 1, 0], theta[:, 1, 1] = torch.sin(a) * w / h, torch.cos(a)
        elif op == "ShearX":  # input x = x + s y in pixels, from the top-left corner
            theta[:, 0, 1] = theta[:, 0, 2] = arg * h / w
        elif op == "ShearY":
            theta[:, 1, 0] = theta[:, 1, 2] = arg * w / h
        elif op == "TranslateXRel":  # input x = x + t W
            theta[:, 0, 2] = 2 * arg
        else:
            theta[:, 1, 2] = 2 * arg
        fill = _on(p, FILL[:c] if c == 3 else FILL[:1]).view(1, c, 1, 1)
        grid = F.affine_grid(theta, [n, c, h, w], align_corners=False)
        return _q(F.grid_sample(p - fill, grid, mode="bilinear", padding_mode="zeros", align_corners=False) + fill)

    return transform


_OPERATIONS = {
    "AutoContrast": _autocontrast,
    "Equalize": _equalize,
    "Invert": _invert,
    "Posterize": _posterize,
    "Solarize": _solarize,
    "SolarizeAdd": _solarize_add,
    "Color": _colour,
    "Contrast": _contrast,
    "Brightness": _brightness,
    "Sharpness": _sharpness,
    **{op: _geometric(op) for op in GEOMETRIC},
}


def check(spec: str) -> Policy:
    """parse(spec), its ValueError as one line naming the key."""
    try:
        return parse(spec)
    except ValueError as err:
        raise BigbatchError(f"config key 'train.randaugment' {err}") from None
