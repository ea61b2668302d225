"""StyleGAN2's per-pixel work as compiled kernels where a step runs its models eagerly: the two ops StyleGAN2-ADA
writes as CUDA kernels of its own, its layers' FIR filter (its upfirdn2d; bigbatch/models/stylegan2.py's `blur`)
and their bias, leaky ReLU and gain (its bias_act; `bias_act` here), on the device types in `ON`.

Each is an autograd Function whose forward is compiled by torch.compile (Inductor: a Triton kernel on a GPU), run
without a graph of its own and with autocast off; its gradient is such a Function again (beside plain ops: the sums
that give the bias's and the noise's gradients, and a G layer's two products with its demodulation and input), so
R1's and path length's gradients of gradients run the compiled kernels too (torch.compile's own autograd does not
differentiate twice). Where the models are traced, exported or compiled (train.compile), the layers' plain ops are
in the graph instead; under a dispatch mode (an op counter's, which would keep Dynamo from ever compiling the kernel
in its process) and on functorch's tensors (vmap, torch.func.grad) the plain ops run. A kernel Inductor cannot build
(no Triton, no C++ compiler) runs its plain ops from then on, said once. Written here because PyTorch has neither
op: ADA builds its own as C++/CUDA extensions at run time.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F

from bigbatch.errors import first_line, warn

ON: tuple[str, ...] = ()
"""Device types whose StyleGAN2 layers run these kernels: none until a GPU measures them paying (bench/gpu.py's
stylegan2-bf16-fused; bench/fir.py's ways). On this project's CPUs the plain ops are as fast and compile nothing."""
_COMPILED: dict[Callable, Callable] = {}
SLOPE = 0.2  # StyleGAN2's leaky ReLU's


def exporting() -> bool:
    return torch.jit.is_tracing() or torch.onnx.is_in_onnx_export() or torch.compiler.is_exporting()


def runs(x: torch.Tensor) -> bool:
    """Whether a layer on x takes the compiled kernel: x's device is in ON, the layer runs eagerly (not traced,
    exported or compiled), no dispatch mode is on, and x is not functorch's."""
    if x.device.type not in ON:  # (the default: every layer asks, every forward)
        return False
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return (
        not exporting()
        and not torch.compiler.is_compiling()
        and _get_current_dispatch_mode() is None
        and not torch._C._functorch.is_functorch_wrapped_tensor(x)
    )


def run(fn: Callable, *args: Any) -> torch.Tensor:
    """`fn` compiled once a process (Dynamo imported on first use), shapes dynamic, on `args` (tensors detached; the
    first a tensor), with no graph and no autocast of its own, so that one compiled graph serves each dtype and layout
    whatever the caller's grad mode and autocast (Dynamo guards on both). Compiled even under
    set_stance("force_eager"), which the GAN task's lazy penalty steps run in under train.compile: the models run
    eagerly there, their kernels compiled.
    What this adds to the compiled call's own host time (20 µs on this project's CPU) is about 10 µs; the plain ops
    it replaces launched five kernels."""
    compiled = _COMPILED.get(fn)
    if compiled is None:
        from bigbatch.engine.compile_cache import use_cache

        use_cache()  # (what Inductor builds kept in the user's cache, as train.compile's: not a folder in /tmp)
        compiled = _COMPILED[fn] = torch.compile(fn, dynamic=True)
    device = args[0].device.type
    args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    # (each context only where it changes something: a Function's forward runs without grad, autocast is off in fp32)
    grad = torch.no_grad() if torch.is_grad_enabled() else nullcontext()
    autocast = torch.autocast(device, enabled=False) if torch.is_autocast_enabled(device) else nullcontext()
    with grad, autocast, _compiling(), _OwnSizes():
        try:
            return compiled(*args)
        except Exception as e:
            if compiled is fn or not _compile_failed(e):
                raise
            warn(f"StyleGAN2's kernel {fn.__name__} could not be compiled ({first_line(e)}): its plain ops run", True)
            _COMPILED[fn] = fn
            return fn(*args)


def _compile_failed(e: Exception) -> bool:
    """Whether torch.compile raised `e` for want of a build (Inductor's, Triton's: Dynamo wraps what they raise)."""
    from torch._dynamo.exc import TorchDynamoException

    return isinstance(e, TorchDynamoException)


def _compiling() -> Any:
    """The default stance where another is set (force_eager: the lazy penalty steps under train.compile), so that the
    kernel compiles; else nothing (entering it costs more than the rest of a call). The stance is read from Dynamo's
    private state, defensively: gone in a later torch, it is taken as the default."""
    from torch._dynamo import eval_frame

    stance = getattr(getattr(eval_frame, "_stance", None), "stance", "default")
    return nullcontext() if stance == "default" else torch.compiler.set_stance("default")


class _OwnSizes:
    """Each size its own symbol where the kernel is traced: Dynamo's default ("duck sizing") makes sizes that happen
    to be equal one symbol (a batch of 64 and 64 channels), and compiles the kernel again at the next shape that parts
    them. Set and put back by hand: config.patch costs 20 µs a call."""

    def __enter__(self) -> None:
        from torch.fx.experimental import _config

        self.before, _config.use_duck_shape = _config.use_duck_shape, False

    def __exit__(self, *exc: object) -> None:
        from torch.fx.experimental import _config

        _config.use_duck_shape = self.before


def bias_act_plain(
    x: torch.Tensor, b: torch.Tensor, gain: float, scale: torch.Tensor | None = None, noise: torch.Tensor | None = None
) -> torch.Tensor:
    """x (times `scale`, plus `noise`, each broadcast to x) plus b over its channels (dim 1), leaky ReLU (SLOPE),
    times gain: a StyleGAN2 layer's work after its convolution (G's: the demodulation and the noise first)."""
    if scale is not None:
        x = x * scale
    if noise is not None:
        x = x + noise
    return F.leaky_relu(x + b.view(-1, *[1] * (x.dim() - 2)), SLOPE) * gain


def _slope_times(g: torch.Tensor, y: torch.Tensor, gain: float) -> torch.Tensor:
    """g times the slope of bias_act where it gave y: gain where y > 0 (the leaky ReLU's input was, gain being
    positive), else SLOPE times gain."""
    return torch.where(y > 0, g, g * SLOPE) * gain


class _SlopeTimes(torch.autograd.Function):
    """bias_act's gradient: linear in g at a fixed y, so its own gradient is itself (y's is zero almost everywhere,
    as ADA's bias_act takes it): one kernel at every order."""

    @staticmethod
    def forward(ctx: Any, g: torch.Tensor, y: torch.Tensor, gain: float) -> torch.Tensor:
        ctx.save_for_backward(y)
        ctx.gain = gain
        return run(_slope_times, g, y, gain)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (y,) = ctx.saved_tensors
        return _SlopeTimes.apply(grad, y, ctx.gain), None, None


class _BiasAct(torch.autograd.Function):
    """bias_act as one kernel. Where autograd's plain ops keep the leaky ReLU's input (and write the product and the
    sum before it), it keeps its output, which the next layer keeps too, and x where it is scaled."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, b: torch.Tensor, gain: float, scale: torch.Tensor | None, noise: torch.Tensor | None
    ) -> torch.Tensor:
        y = run(bias_act_plain, x, b, gain, scale, noise)
        ctx.save_for_backward(y, *([x, scale] if scale is not None else []))
        ctx.gain, ctx.noise_shape = gain, None if noise is None else noise.shape
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        y, *scaled = ctx.saved_tensors
        gz = _SlopeTimes.apply(grad, y, ctx.gain)  # (the gradient of what the leaky ReLU took)
        need = ctx.needs_input_grad
        gb = gz.sum([d for d in range(gz.dim()) if d != 1]) if need[1] else None
        gn = gz.sum_to_size(ctx.noise_shape) if need[4] else None
        if not scaled:
            return gz, gb, None, None, gn
        x, scale = scaled
        gs = (gz * x).sum_to_size(scale.shape) if need[3] else None
        return gz * scale if need[0] else None, gb, None, gs, gn


def bias_act(
    x: torch.Tensor, b: torch.Tensor, gain: float, scale: torch.Tensor | None = None, noise: torch.Tensor | None = None
) -> torch.Tensor:
    """bias_act_plain as one compiled kernel (its gradients too) where `runs(x)`; else its plain ops. b, scale and
    noise in x's dtype."""
    if runs(x):
        return _BiasAct.apply(x, b, gain, scale, noise)
    return bias_act_plain(x, b, gain, scale, noise)
