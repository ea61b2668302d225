"""A step's batch as the Replicator handles it: a tensor, or a tuple/list/dict of tensors (None allowed
in tuples and lists), with the examples along dim 0: its length, its micro-batches, its device.

A NumPy array in a batch is a host part: cut into micro-batches with the rest, it stays on the host, for
what a step function reads there (augmentation parameters, a latent's bytes) without waiting on the device.
And `runs`: tensors in runs of bounded size, as the multi-tensor kernels of a step's updates take them."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar

import numpy as np
import torch

from bigbatch.errors import BigbatchError


def call(step_fn: Any, micro: Any) -> Any:
    """`step_fn(micro)`; where that raises a TypeError, a step function of another signature (or none) is one line
    instead (check_step_fn: asked then, so that the steps that run pay nothing for it)."""
    try:
        return step_fn(micro)
    except TypeError:
        check_step_fn(step_fn)
        raise


def check_step_fn(step_fn: Any) -> None:
    """A step function is called with one micro-batch: anything else is one line (found from outside: "'int' object
    is not callable", or a TypeError from inside the step)."""
    import inspect

    if not callable(step_fn):
        raise BigbatchError(f"rep.step's first argument is the step function, got {type(step_fn).__name__}")
    try:
        inspect.signature(step_fn).bind(None)
    except TypeError:
        raise BigbatchError(
            f"the step function {getattr(step_fn, '__name__', step_fn)!r} must take one argument, the micro-batch"
        ) from None
    except ValueError:  # (a builtin without a signature: called as it is)
        pass


def unpack(out: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """A step function's result -> (its loss as an fp32 scalar, the other scalars it returned)."""
    if isinstance(out, dict):
        if "loss" not in out:
            raise BigbatchError("a step function returning a dict must put the loss under 'loss'")
        rest = {k: v for k, v in out.items() if k != "loss"}
        loss = out["loss"]
    else:
        loss, rest = out, {}
    if not isinstance(loss, torch.Tensor):  # (None: a step function that forgot to return)
        got = "None (no return?)" if loss is None else f"a {type(loss).__name__}"
    elif loss.numel() != 1:
        got = f"a tensor of shape {tuple(loss.shape)}"
    elif not loss.requires_grad:
        got = "a tensor without a graph"
    elif not loss.is_floating_point():  # (found from outside: a complex loss was taken, its imaginary part lost)
        got = f"a {loss.dtype} tensor"
    else:
        got = ""
    if got:
        raise BigbatchError(
            f"the step function must return the micro-batch's mean loss as a real scalar tensor with a graph, got {got}"
        )
    for key, value in rest.items():
        number = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if not (number or (isinstance(value, torch.Tensor) and value.numel() == 1)):
            shown = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else repr(value)[:60]
            raise BigbatchError(
                f"the step function's {key!r} must be a number or a one-element tensor (a mean to log), got {shown}"
            )
    # Losses are reduced in fp32 whatever the compute precision.
    return loss.float().reshape(()), rest


def length(batch: Any) -> int:
    """The examples in a batch: dim 0 of its tensors (a tensor, or a tuple/list/dict of them), which must agree."""
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        if batch.ndim == 0:
            raise BigbatchError("every tensor of a batch needs a batch dimension (dim 0); got a 0-d tensor")
        return batch.shape[0]
    if isinstance(batch, (tuple, list, dict)):
        lengths = set()
        for key, b in batch.items() if isinstance(batch, dict) else enumerate(batch):
            if b is None:
                continue
            # (named with its container: found from outside, a list of labels or a dict's int was said to be "got int")
            if not isinstance(b, (torch.Tensor, np.ndarray, tuple, list, dict)):
                where = f"its {key!r}" if isinstance(batch, dict) else f"a {type(batch).__name__} of"
                _not_a_batch(f"{where} {type(b).__name__}")
            lengths.add(length(b))
        if len(lengths) != 1:
            raise BigbatchError(f"the tensors of a batch must agree in dim 0, got lengths {sorted(lengths)}")
        return lengths.pop()
    _not_a_batch(type(batch).__name__)


def _not_a_batch(got: str) -> NoReturn:
    raise BigbatchError(
        f"a batch must be a tensor or a tuple/list/dict of tensors, got {got}: give per-example numbers as a tensor, "
        "and values of another kind as a NumPy array (np.asarray(paths)), cut with the batch and kept on the host"
    )


def cut(batch: Any, start: int, stop: int) -> Any:
    """Examples start..stop-1 of a batch (a micro-batch), the same structure."""
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        return batch[start:stop]
    if isinstance(batch, (tuple, list)):
        return _same(batch, [None if b is None else cut(b, start, stop) for b in batch])
    return {k: None if v is None else cut(v, start, stop) for k, v in batch.items()}  # (None: found from outside)


def to_device(batch: Any, device: torch.device) -> Any:
    """A batch's tensors on `device` (anything else, host parts included, as it is). From the host without
    waiting on the device: a copy from pageable memory is staged before the call returns."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (tuple, list)):
        return _same(batch, [None if b is None else to_device(b, device) for b in batch])
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def _same(batch: tuple | list, parts: list) -> tuple | list:
    """`parts` in `batch`'s sequence type (a namedtuple's fields given one by one)."""
    return type(batch)(*parts) if hasattr(batch, "_fields") else type(batch)(parts)


T = TypeVar("T")


def runs(items: Iterable[T], numel: Callable[[T], int], limit: int) -> Iterator[list[T]]:
    """`items` in order, in runs of at most `limit` elements by `numel` (an item larger than that on its own): what
    multi-tensor (torch._foreach_) kernels take at once, a few launches on a GPU and temporaries of a run's size."""
    run: list[T] = []
    size = 0
    for item in items:
        n = numel(item)
        if run and size + n > limit:
            yield run
            run, size = [], 0
        run.append(item)
        size += n
    if run:
        yield run


def _refused(name: str) -> Callable[..., None]:
    def call(*args: Any, **kwargs: Any) -> None:
        raise BigbatchError(
            f"the step function called the optimizer's {name}(): return the loss alone; rep.step zeroes the "
            "gradients, calls backward on each micro-batch's loss and steps once, after all of them"
        )

    return call


_REFUSED = {name: _refused(name) for name in ("step", "zero_grad")}  # (made once: set at every micro-batch)


@contextmanager
def stepped_by_rep(opt: torch.optim.Optimizer | None) -> Iterator[None]:
    """`opt.step` and `opt.zero_grad` refused while the step function runs (found from outside: one that stepped the
    optimizer itself, an Accelerate habit, stepped it once per micro-batch on partial gradients, silently; by review:
    zero_grad threw the micro-batches' gradients before it away). None: nothing refused."""
    if opt is None:
        yield
        return
    own = {name: vars(opt).get(name) for name in _REFUSED}  # (an LR scheduler wraps step on the instance)
    for name, refused in _REFUSED.items():
        setattr(opt, name, refused)
    try:
        yield
    finally:
        for name, method in own.items():
            if method is None:
                delattr(opt, name)
            else:
                setattr(opt, name, method)


def check_no_gradients(opt: torch.optim.Optimizer) -> None:
    """Refuse gradients there before rep.step's first backward (found from outside: a step function that called
    backward() on part of its loss, or on the loss with retain_graph=True, trained other weights at another
    micro-batch, silently: its gradients were not scaled for the accumulation)."""
    if any(p.grad is not None for g in opt.param_groups for p in g["params"]):
        raise BigbatchError(
            "the step function computed gradients itself (backward() on its loss or part of it): return the whole "
            'loss (a dict\'s "loss"); rep.step calls backward on it, scaled for the accumulation and precision'
        )


def backward(loss: torch.Tensor) -> None:
    """`loss.backward()`, PyTorch's error of a graph backpropagated twice said with its likely causes (found from
    outside: a step function calling backward() itself, an Accelerate habit, was told to retain_graph=True)."""
    try:
        loss.backward()
    except RuntimeError as e:
        if "backward through the graph a second time" not in str(e):
            raise
        raise BigbatchError(
            "a step's graph was backpropagated twice: if the step function calls backward() itself, return the loss "
            "alone (rep.step calls backward on it, scaled for the accumulation and precision); otherwise a tensor of "
            "an earlier micro-batch or step is used again: detach it"
        ) from e
