"""Bilinear `grid_sample` with a second derivative on every device, for ADA's geometric transforms under R1.

R1 differentiates D(augment(x)) in x, then that gradient in D's weights: a double backward through
grid_sample. PyTorch's CUDA kernel has no derivative of grid_sample's backward ("derivative for
aten::grid_sampler_2d_backward is not implemented"; its CPU fallback has one, so a CPU suite never sees
it), and StyleGAN2's first R1 step on a GPU died of it. The missing piece is simple because the sampling
is linear in its input for a fixed grid: its backward maps grad_out to Gᵀ grad_out, whose derivative in
grad_out, along v, is G v: grid_sample of v. So the backward is itself a differentiable function here,
the same op PyTorch's own backward calls (bit for bit the same first derivative). StyleGAN2-ADA solves it
the same way (its grid_sample_gradfix); this is written from the algebra above. The grid must not need
a gradient (ADA's grids are drawn, not learned)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

BILINEAR = 0  # aten's interpolation_mode
PADDING = {"zeros": 0, "border": 1, "reflection": 2}


def grid_sample(x: torch.Tensor, grid: torch.Tensor, padding_mode: str = "reflection") -> torch.Tensor:
    """F.grid_sample(x, grid, mode="bilinear", padding_mode, align_corners=False), twice differentiable in x
    on every device."""
    if grid.requires_grad:
        raise ValueError("grid_sample: the grid must not require a gradient (only x's is defined here)")
    if torch.is_autocast_enabled(x.device.type):  # as autocast runs grid_sample: in float32, cast in the graph
        x, grid = x.float(), grid.float()
    return _sample(x, grid, padding_mode)


def _sample(x: torch.Tensor, grid: torch.Tensor, padding_mode: str) -> torch.Tensor:
    # Autocast off, here and in the backward passes (R1 differentiates under the step's autocast): each op
    # in x's dtype, so that the gradients' dtypes are the tensors'.
    with torch.autocast(x.device.type, enabled=False):
        return _Sample.apply(x, grid, padding_mode)


class _Sample(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, grid: torch.Tensor, padding_mode: str) -> torch.Tensor:
        ctx.save_for_backward(x, grid)
        ctx.padding_mode = padding_mode
        return F.grid_sample(x, grid, mode="bilinear", padding_mode=padding_mode, align_corners=False)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x, grid = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        with torch.autocast(x.device.type, enabled=False):
            return _SampleBackward.apply(grad_out, x, grid, ctx.padding_mode), None, None


class _SampleBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, grad_out: torch.Tensor, x: torch.Tensor, grid: torch.Tensor, padding_mode: str) -> torch.Tensor:
        ctx.save_for_backward(grid)
        ctx.padding_mode = padding_mode
        op = torch.ops.aten.grid_sampler_2d_backward.default
        grad_x, _ = op(grad_out, x, grid, BILINEAR, PADDING[padding_mode], False, [True, False])
        return grad_x

    @staticmethod
    def backward(ctx, grad2: torch.Tensor):
        # d(Gᵀ g)/dg along grad2 = G grad2; nothing in x (linear in it) and no grid gradient.
        (grid,) = ctx.saved_tensors
        return _sample(grad2, grid, ctx.padding_mode) if ctx.needs_input_grad[0] else None, None, None, None
