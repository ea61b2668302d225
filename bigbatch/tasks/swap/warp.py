"""SAEHD's training augmentation, as DeepFaceLab's sample processor draws it (core/imagelib/warp.py):
a random affine (rotation ±10°, scale 1/1.15..1.15 as SAEHD sets it, 1/1.05..1.05 XSeg's, shift ±5% each
way) applied to the input and its target alike, a random mirror (p 0.4, per side), and for the input alone
a random warp: a grid of 2, 4 or 8 cells whose inner points move by N(0, 0.24 cell), interpolated linearly
over the image. The model learns to undo the warp, which is what makes its codes generalise across faces.

The draws follow DFL's distributions; the pixels are torch's (bilinear `grid_sample` where DFL uses
OpenCV's remap and warpAffine), computed on the training device. Every draw comes from a stream keyed
by the step and each image's global position, so the augmentation does not depend on the rank count.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

CELLS = (2, 4, 8)  # cells per side: DFL's cell_size w // 2, w // 4, w // 8
SAEHD_SCALE = 0.15  # SAEHD's scale_range [-0.15, 0.15] (models/Model_SAEHD/Model.py); the sample processor's own 0.05


def draw(
    n: int, g: torch.Generator, flip: bool, rotation: float = 10.0, scale: float = 0.05, shift: float = 0.05
) -> tuple[torch.Tensor, ...]:
    """One step's draws for `n` images: (affine theta (n, 2, 3) mapping output to input coordinates in
    grid_sample's normalised units, warp offsets (n, 2, 7, 7) in cells, cell counts (n,), flips (n,)).
    The affine's ranges are gen_warp_params's: rotation ±`rotation`°, scale 1/(1 + `scale`)..1 + `scale`,
    shift ±`shift` of the width each way (the sample processor's defaults, XSeg's; SAEHD's scale is
    SAEHD_SCALE)."""
    angle = torch.empty(n, dtype=torch.float64).uniform_(-rotation, rotation, generator=g) * (math.pi / 180)
    scale_ = torch.empty(n, dtype=torch.float64).uniform_(1 / (1 + scale), 1 + scale, generator=g)
    shift_ = torch.empty(n, 2, dtype=torch.float64).uniform_(-shift, shift, generator=g) * 2  # of the width 2
    flips = (torch.randint(10, (n,), generator=g) < 4) & flip
    cells = torch.tensor(CELLS)[torch.randint(len(CELLS), (n,), generator=g)]
    offsets = torch.randn(n, 2, max(CELLS) - 1, max(CELLS) - 1, generator=g)
    # Output point p comes from input point q = (R^T (p - t)) / s: the inverse of DFL's rotate-scale-shift.
    cos, sin = torch.cos(angle), torch.sin(angle)
    inv = torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2) / scale_[:, None, None]
    theta = torch.cat([inv, -(inv @ shift_[:, :, None])], dim=2)
    return theta.float(), offsets, cells, flips


def _flow(offsets: torch.Tensor, cells: torch.Tensor, size: int) -> torch.Tensor:
    """(n, 2, size, size) displacements, normalised units: each image's coarse grid of cells + 1 points
    (the border ones fixed) resized to size + cell and cropped by half a cell, as DFL does. Every image's
    grid at every cell count, each image then taking its own: no step waits on the device to learn which
    images have which count (a resize is image by image, so the same values)."""
    flow = offsets.new_zeros(len(offsets), 2, size, size)
    for c in CELLS:
        coarse = offsets.new_zeros(len(offsets), 2, c + 1, c + 1)
        coarse[:, :, 1:-1, 1:-1] = offsets[:, :, : c - 1, : c - 1] * (0.24 * 2 / c)
        cell = size // c
        full = F.interpolate(coarse, size=(size + cell, size + cell), mode="bilinear", align_corners=False)
        half = cell // 2
        flow = torch.where((cells == c)[:, None, None, None], full[:, :, half : half + size, half : half + size], flow)
    return flow


def apply(
    x: torch.Tensor,
    theta: torch.Tensor,
    offsets: torch.Tensor,
    cells: torch.Tensor,
    flips: torch.Tensor,
    warp: bool,
    colour: int = 3,
    picture: torch.Tensor | None = None,
    masks_too: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, target) of images `x` (N, C, H, W in [0, 1]; the first `colour` channels the picture,
    the rest masks): the target transformed, the input's picture also warped (when `warp`). Pictures
    repeat their border; masks are zero outside. `picture`: the input's picture where it differs
    from the target's (DFL's HSV shift, which only the input gets). `masks_too`: the input keeps its masks,
    warped as its picture (XSeg's sample and label). In float32 whatever autocast says: its
    grid in bf16 would sample a 512 px face up to two pixels off."""
    with torch.autocast(x.device.type, enabled=False):
        picture = None if picture is None else picture.float()
        return _apply(x.float(), theta, offsets, cells, flips, warp, colour, picture, masks_too)


def _apply(x, theta, offsets, cells, flips, warp, colour, picture, masks_too):  # (apply's, with autocast off)
    n, _, h, w = x.shape
    theta = theta.to(x.device, x.dtype, non_blocking=True)
    offsets = offsets.to(x.device, x.dtype, non_blocking=True)
    grid = F.affine_grid(theta, [n, 1, h, w], align_corners=False)
    mirrored = flips.to(x.device, non_blocking=True)[:, None, None, None]

    def sample(img: torch.Tensor, where: torch.Tensor, padding: str) -> torch.Tensor:
        out = F.grid_sample(img, where, mode="bilinear", padding_mode=padding, align_corners=False)
        return torch.where(mirrored, out.flip(-1), out)

    target = sample(x[:, :colour], grid, "border")
    if x.shape[1] > colour:
        target = torch.cat([target, sample(x[:, colour:], grid, "zeros")], dim=1)
    if not warp:
        return (target[:, :colour] if picture is None else sample(picture, grid, "border")), target
    flow = _flow(offsets, cells.to(x.device, non_blocking=True), max(h, w))[:, :, :h, :w]
    # DFL warps first, then transforms: the input at p is the picture at q + flow(q), q the affine's point.
    moved = F.grid_sample(flow, grid, mode="bilinear", padding_mode="border", align_corners=False)
    source = x[:, :colour] if picture is None else picture
    where = grid + moved.permute(0, 2, 3, 1)
    warped = sample(source, where, "border")
    if masks_too and x.shape[1] > colour:
        warped = torch.cat([warped, sample(x[:, colour:], where, "zeros")], dim=1)
    return warped, target
