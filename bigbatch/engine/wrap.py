"""Wrappers applied to a plain model from outside, in one fixed order: cross-rank BatchNorm →
activation checkpointing → torch.compile → DDP (torchtitan's order: compile sees the checkpointed
blocks, DDP sees the compiled graph)."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as torch_dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from bigbatch.compiling import disable_marked, eager
from bigbatch.engine import dist
from bigbatch.engine.compile_cache import use_cache
from bigbatch.errors import BigbatchError, named_few, warn


class GlobalBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics cover the same micro-batch on every rank.

    Sum, sum of squares and count are all-reduced with a differentiable collective, so the gradient
    flows through the global statistics as in nn.SyncBatchNorm, but on any backend (gloo on CPU too,
    which nn.SyncBatchNorm refuses). Outside training, or in one process, it is the BatchNorm it was.
    Made by cross_rank_batch_norm, which gives a model's BatchNorm1d/2d/3d this forward in place.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and torch_dist.is_available() and torch_dist.is_initialized()):
            return super().forward(x)
        if torch_dist.get_world_size() == 1:
            return super().forward(x)
        from torch.distributed.nn.functional import all_reduce

        self._check_input_dim(x)
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x  # (float64 stays float64)
        dims = [0, *range(2, x.dim())]
        count = torch.full((1,), x.numel() / x.shape[1], device=x.device, dtype=xf.dtype)
        with warnings.catch_warnings():
            # Deprecated for the functional collectives, which have no autograd; pinned torch keeps it.
            warnings.simplefilter("ignore", FutureWarning)
            packed = all_reduce(torch.cat([xf.sum(dims), (xf * xf).sum(dims), count]))
        c = x.shape[1]
        n = packed[-1]
        mean = packed[:c] / n
        var = (packed[c : 2 * c] / n - mean * mean).clamp_min(0)
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
                self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), factor)
                unbiased = var.detach() * n / (n - 1).clamp_min(1)
                self.running_var.lerp_(unbiased.to(self.running_var.dtype), factor)
        shape = (1, c) + (1,) * (x.dim() - 2)
        y = (xf - mean.view(shape)) * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y.to(x.dtype)


_GLOBAL_CLASSES: dict[type, type] = {}


def cross_rank_batch_norm(model: nn.Module, device: torch.device) -> nn.Module:
    """Make every BatchNorm's statistics span all ranks: nn.SyncBatchNorm on CUDA, GlobalBatchNorm's
    forward elsewhere (given in place: the same module, parameters and buffers, so an optimizer made
    before keeps training them). A BatchNorm subclass with a forward of its own is refused rather than
    silently replaced (PyTorch's convert_sync_batchnorm would replace it)."""
    for name, module in model.named_modules():
        forward = getattr(type(module), "forward", None)
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, GlobalBatchNorm):
            if forward is not nn.modules.batchnorm._BatchNorm.forward and not isinstance(module, nn.SyncBatchNorm):
                raise BigbatchError(
                    f"sync_bn would replace the forward of {name or 'the model'} ({type(module).__name__}, a "
                    "BatchNorm of its own): give it nn.BatchNorm layers, or train without sync_bn"
                )
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    for module in model.modules():
        base = type(module)
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, GlobalBatchNorm):
            if base not in _GLOBAL_CLASSES:
                _GLOBAL_CLASSES[base] = type(f"Global{base.__name__}", (GlobalBatchNorm, base), {})
            module.__class__ = _GLOBAL_CLASSES[base]
    return model


class _CheckpointedForward:
    """Replaces a block's forward: recompute its activations in backward instead of storing them.

    Non-reentrant, so double backward (R1) works. BatchNorm running statistics are put back after the
    recomputation, so they advance once per forward as without checkpointing. (State a model updates
    at its own rate, such as spectral norm's power iteration, runs before the micro-batch's forward
    (`before_micro_batch`, or a Replicator.on_micro_batch hook), so the recomputation does not repeat it.)
    """

    def __init__(self, module: nn.Module):
        self.forward = module.forward
        self.module = module

    def compile(self) -> None:
        """Compile the block itself: torch.compile cannot trace a checkpoint with a recompute context,
        so a compiled model runs its checkpointed blocks as separately compiled graphs."""
        self.forward = torch.compile(self.forward)

    @eager  # compiled models run it as is (the block compiles on its own: compile())
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not (torch.is_grad_enabled() and self.module.training):
            return self.forward(*args, **kwargs)
        return checkpoint(
            self.forward, *args, use_reentrant=False, context_fn=lambda: (nullcontext(), _Frozen(self.module)), **kwargs
        )


class _Frozen:
    """Recomputation context: BatchNorm running statistics put back afterwards (the code path stays
    that of the original forward, which the checkpoint checks). Reusable: double backward may
    recompute more than once."""

    def __init__(self, module: nn.Module):
        self.module = module

    def __enter__(self) -> None:
        mods = list(self.module.modules())
        self.bns = [m for m in mods if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
        self.saved = [(m.running_mean.clone(), m.running_var.clone(), m.num_batches_tracked.clone()) for m in self.bns]

    def __exit__(self, *exc: Any) -> None:
        with torch.no_grad():
            for m, (mean, var, count) in zip(self.bns, self.saved):
                m.running_mean.copy_(mean)
                m.running_var.copy_(var)
                m.num_batches_tracked.copy_(count)


def checkpoint_blocks(model: nn.Module, names: Iterable[str]) -> list[str]:
    """Activation-checkpoint the named submodules of `model` (in place); returns the names done."""
    done = []
    for name in names:
        try:
            block = model.get_submodule(name)
        except AttributeError:  # (its blocks named: found from outside, a name mistyped had no way on)
            listed = list(getattr(model, "checkpoint_blocks", ())) or [n for n, _ in model.named_children()]
            raise BigbatchError(
                f"{type(model).__name__} has no block named {name!r} to checkpoint; it has {named_few(listed, 8)}"
            ) from None
        if not isinstance(vars(block).get("forward"), _CheckpointedForward):
            block.forward = _CheckpointedForward(block)
        done.append(name)
    return done


def strip_wrappers(model: nn.Module) -> nn.Module:
    """Undo checkpoint_blocks on a copy (e.g. the EMA generator), which must not call the original's forward."""
    for m in model.modules():
        if isinstance(vars(m).get("forward"), _CheckpointedForward):
            del m.forward
    return model


# oneDNN's 1x1 convolution with a stride writes past its workspace in backward when the input is
# channels-last with fewer channels than its block (16 with AVX-512, 8 with AVX2): heap corruption,
# a crash or wrong weight gradients (oneDNN issue 6035; torch 2.13's backward of a 1x1 conv, stride 2,
# from 3-8 channels at 64 px crashed here, whatever the weights' layout). A classifier's images arrive
# channels-last, and a convolution follows its input's layout, so on CPU such layers always run NCHW.
ONEDNN_MIN_CHANNELS = 16


def _nchw_input(module: nn.Module, args: tuple) -> tuple:
    x = args[0]
    _, c, h, w = x.shape
    if x.stride() != (c * h * w, h * w, w, 1):  # (what oneDNN reads; .contiguous() may keep NHWC strides)
        x = x.clone(memory_format=torch.contiguous_format)
    return (x, *args[1:])


def keep_nchw(model: nn.Module, device: torch.device) -> list[str]:
    """On CPU, the strided 1x1 convolutions that oneDNN gets wrong in channels-last (see
    ONEDNN_MIN_CHANNELS) get NCHW weights and inputs; their names."""
    if device.type != "cpu":
        return []
    kept = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.Conv2d)
        and m.kernel_size == (1, 1)
        and max(m.stride) > 1
        and m.in_channels < ONEDNN_MIN_CHANNELS
    ]
    for _, m in kept:
        # (not .contiguous(): a 1x1 weight is "contiguous" with either order's strides, and oneDNN reads strides)
        m.weight.data = m.weight.data.clone(memory_format=torch.contiguous_format)
        m.register_forward_pre_hook(_nchw_input)
    return [name for name, _ in kept]


def to_channels_last(model: nn.Module, device: torch.device) -> list[str]:
    """`model`'s 4-d weights in channels-last order (its convolutions then run and return NHWC), except the
    layers `keep_nchw` keeps; their names."""
    model.to(memory_format=torch.channels_last)
    return keep_nchw(model, device)


def _names(value: Any) -> bool:
    """Whether `value` is a list (or tuple, set) of block names."""
    return isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(v, str) for v in value)


def check_checkpointing(checkpointing: Any) -> None:
    """Refuse what is not a `checkpointing` setting: True, False or a list of block names (found from outside: a
    model's own "head" was read a letter at a time)."""
    if not (isinstance(checkpointing, bool) or _names(checkpointing)):
        raise BigbatchError(f"checkpointing must be True, False or a list of block names, got {checkpointing!r}")


def prepare(
    model: nn.Module,
    device: torch.device,
    world_size: int,
    *,
    sync_bn: bool = False,
    checkpointing: bool | Iterable[str] = False,
    compile: bool | str = False,
    channels_last: bool = False,
    unused_parameters: bool = False,
) -> nn.Module:
    """Place `model` and wrap it: cross-rank BN → activation checkpointing → torch.compile → DDP.
    `channels_last`: its 4-d weights in NHWC order, so that convolutions run and return channels-last.
    `compile`: True or torch.compile's mode ("default", "reduce-overhead", "max-autotune").

    `checkpointing=True` checkpoints the blocks the model lists in `checkpoint_blocks`; a list of
    submodule names checkpoints those. The model is modified in place; the returned module is what
    to call in training (the same model, or its compiled / DDP wrapper).
    """
    model.to(device)
    if channels_last:
        to_channels_last(model, device)
    else:
        keep_nchw(model, device)
    if sync_bn and world_size > 1:
        model = cross_rank_batch_norm(model, device)
    check_checkpointing(checkpointing)
    if (name := torch_spectral_norm(model)) is not None:
        warn(
            f"{type(model).__name__}{'.' + name if name else ''} uses torch.nn.utils' spectral norm, whose power "
            "iteration runs at every forward: at each micro-batch, and again where checkpointing recomputes, so the "
            "weights depend on how a batch is split; bigbatch.models.layers.SNConv2d and SNLinear iterate once a step",
            once=True,
        )
    if checkpointing:
        names = getattr(model, "checkpoint_blocks", ()) if checkpointing is True else checkpointing
        if not names:
            warn(f"{type(model).__name__} lists no checkpoint_blocks; activation checkpointing does nothing for it")
        checkpoint_blocks(model, names)
    wrapped: nn.Module = model
    if compile:
        use_cache()  # Inductor's caches in the user's cache folder, for the next run of this model
        disable_marked(model)
        for m in model.modules():
            if isinstance(vars(m).get("forward"), _CheckpointedForward):
                disable_marked(m.forward)
                m.forward.compile()
        wrapped = torch.compile(wrapped, mode=compile if isinstance(compile, str) else None)
    if world_size > 1 and not any(p.requires_grad for p in model.parameters()):
        # Nothing of it trains (a frozen teacher, a perceptual net, nn.Identity): DDP refuses such a module (found
        # from outside: its RuntimeError under torchrun, where one process ran). Rank 0's weights, as DDP's start.
        for t in (*model.parameters(), *model.buffers()):
            sent = t.detach().contiguous()
            torch_dist.broadcast(sent, src=0)
            t.detach().copy_(sent)
    elif world_size > 1:
        ids = [device.index] if device.type == "cuda" else None
        # Buffers are not re-broadcast at each forward: spectral-norm vectors advance identically on
        # every rank; BN running statistics are replayed alike on every rank (running_stats.py).
        wrapped = nn.parallel.DistributedDataParallel(
            wrapped, device_ids=ids, forward_sync_buffers=False, find_unused_parameters=unused_parameters
        )
        if sums_in_rank_order(device):
            wrapped.register_comm_hook(None, _sum_in_rank_order)
    return wrapped


def note_forwards(wrapped: nn.Module, ran: set[int]) -> None:
    """Add a DDP module's id to `ran` at each of its forwards (check_ran's)."""
    if isinstance(wrapped, nn.parallel.DistributedDataParallel):
        wrapped.register_forward_pre_hook(lambda module, args: ran.add(id(module)))


def check_ran(name: str, trained: Iterable[nn.Module], ran: set[int]) -> None:
    """Refuse a step whose gradients for the optimizer `name` came from a DDP module's plain model, called instead of
    the module (not in `ran`): DDP averaged none of them (found from outside: each rank trained apart, told only at
    the save, which refused ranks' weights that differ)."""
    for w in trained:
        if isinstance(w, nn.parallel.DistributedDataParallel) and id(w) not in ran:
            if any(p.grad is not None for p in w.parameters()):
                raise BigbatchError(
                    f"{name}'s gradients came from a model called in place of what rep.prepare returned for it: under "
                    "DDP only the prepared module averages them across ranks; call it (net = rep.prepare(model); "
                    "net(x)), not the plain model"
                )


CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # torch.compile's modes that replay CUDA graphs
COMPILE_MODES = ("default", *CUDA_GRAPH_MODES, "max-autotune-no-cudagraphs")  # torch.compile's modes


def replays(compile: bool | str, device: torch.device) -> bool:
    """Whether models compiled with `compile` (see prepare) on `device` run as CUDA graphs."""
    return compile in CUDA_GRAPH_MODES and device.type == "cuda"


def new_micro_batch(
    compile: bool | str, device: torch.device, models: Iterable[nn.Module], index: int, copied: set[int]
) -> None:
    """Before micro-batch `index` of a step, where `models` replay CUDA graphs (`replays`): a new replay of
    each graph begins (torch.compiler.cudagraph_mark_step_begin), and the gradients so far leave the graphs'
    memory, which the replay writes over (autograd keeps a backward graph's output as a parameter's first
    gradient; later micro-batches add to it in place). `copied`: the ids of the step's gradients copied so
    far (the caller's, emptied at index 0), each copied once. (Activation-checkpointed blocks compile in the
    default mode: their recomputation runs inside another graph's backward.)"""
    if not replays(compile, device):
        return
    if index == 0:
        copied.clear()
    for model in models if index > 0 else ():
        for p in model.parameters():
            if p.grad is not None and id(p.grad) not in copied:
                p.grad = p.grad.clone()
                copied.add(id(p.grad))
    torch.compiler.cudagraph_mark_step_begin()


def sums_in_rank_order(device: torch.device) -> bool:
    """Whether the ranks' gradients on `device` are summed in rank order by `_sum_in_rank_order` (CPU,
    gloo), undivided: each rank then scales its loss by 1 / (accumulation x world size), as one process
    of that accumulation does. On CUDA, NCCL's all-reduce (its own order) divides by the world size."""
    return device.type == "cpu"


def _sum_in_rank_order(_state, bucket):  # (unannotated: DDP checks the annotations as objects, not strings)
    """A DDP communication hook: every rank's bucket gathered, then summed as ((rank 0 + rank 1) + rank 2)
    + ..., the order in which one process adds its micro-batches' gradients. So k processes of one
    micro-batch each get one process's k-micro-batch gradient bit for bit, for any k (gloo's all-reduce
    adds in a ring's order: the same for 2 processes, not for 3 or more). Costs k buckets' memory and
    sends each rank's bucket to all, where a ring all-reduce sends it twice: small against a CPU step."""
    grads = bucket.buffer()
    parts = [torch.empty_like(grads) for _ in range(torch_dist.get_world_size())]
    gathered = torch_dist.all_gather(parts, grads, async_op=True).get_future()  # (async: DDP overlaps it)
    return gathered.then(lambda _: dist.add_in_order(parts))


def unused_parameters_error(said: str) -> BigbatchError:
    """DDP's error for parameters a step left without a gradient, said in the Replicator's terms (found from
    outside: DDP's traceback named its own find_unused_parameters), with the parameter indices DDP gives."""
    which = (
        said[said.find("Parameter indices") :].split("\n")[0].strip().rstrip(".") if "Parameter indices" in said else ""
    )
    return BigbatchError(
        "a prepared model has parameters that got no gradient in the last step (its loss leaves them out), which "
        "DDP cannot all-reduce: prepare it with rep.prepare(model, unused_parameters=True)"
        + (f" ({which})" if which else "")
    )


def torch_spectral_norm(model: nn.Module) -> str | None:
    """The name of a module of `model` under torch.nn.utils' spectral norm (parametrizations.spectral_norm, or the
    older hook of nn.utils.spectral_norm), or None (found from outside: silently split-dependent)."""
    for name, m in model.named_modules():
        params = getattr(m, "parametrizations", None)
        kinds = [type(p).__name__ for ps in (params.values() if params is not None else ()) for p in ps]
        kinds += [type(h).__name__ for h in m._forward_pre_hooks.values()]
        if "_SpectralNorm" in kinds or "SpectralNorm" in kinds:
            return name
    return None
