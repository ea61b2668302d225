"""A CPU stand-in for "the models live on a GPU": every tensor made on the host without naming a device is
marked where it was made, and an op that meets such a tensor together with one of the step's (the models',
the batch's, or anything derived from them) raises DeviceMixError naming both places, as CUDA would refuse
it ("Expected all tensors to be on the same device"). Used by tests/test_device_guard.py on whole training
runs, so the CPU suite catches a CPU tensor in a CUDA step before a GPU does.

How a tensor counts as the host's (the rest are the step device's, as a GPU run's would be):
- made by a factory call (torch.tensor, zeros, arange, rand, from_numpy, ...) with no `device=`, or with the
  string "cpu" (a torch.device passed on, as `device=x.device`, is the step's device: it names the input's);
- moved there: `.cpu()`, `.to("cpu")`, `.numpy()`'s way back (torch.from_numpy);
- the result of an op whose tensor inputs are all the host's (a host tensor stays one through arithmetic).
`.to(device)`, `.to(other)`, `.cuda()` move a tensor to the step's device. As on CUDA, a 0-dim host tensor
may join a device op (it is read as a number), indexing may use host indices, and `copy_` crosses devices.
A device tensor made a NumPy array (`.numpy()`, `np.asarray`) raises too: CUDA refuses it.
Not seen: a CPU `torch.Generator` passed with a device (the devices are the same here), and ops that
autograd's engine runs in C++ (their inputs were seen when the forward ran).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

ROOT = Path(__file__).resolve().parent.parent
OURS = ("bigbatch", "bench", "tests")  # where a place is named from (not .venv's torch)

# Calls that make a tensor from nothing (or from Python data): the host's unless told a device.
FACTORIES = {
    torch.tensor,
    torch.as_tensor,
    torch.asarray,
    torch.scalar_tensor,
    torch.zeros,
    torch.ones,
    torch.empty,
    torch.full,
    torch.arange,
    torch.range,
    torch.linspace,
    torch.logspace,
    torch.eye,
    torch.rand,
    torch.randn,
    torch.randint,
    torch.randperm,
    torch.normal,
    torch.empty_strided,
    torch.tril_indices,
    torch.triu_indices,
    torch.hann_window,
    torch.hamming_window,
    torch.blackman_window,
    torch.kaiser_window,
    torch.bartlett_window,
}
ALWAYS_HOST = {torch.from_numpy, torch.frombuffer, torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.tolist}
# Ops that take tensors of both kinds on CUDA: copies across devices, indexing with host indices, moves.
CROSSING = {
    torch.Tensor.copy_,
    torch.Tensor.__getitem__,
    torch.Tensor.__setitem__,
    torch.Tensor.to,
    torch.Tensor.cuda,
    torch.Tensor.cpu,
    torch.Tensor.pin_memory,
    torch.Tensor.type_as,
    torch.Tensor.new_tensor,
    torch.Tensor.new_zeros,
    torch.Tensor.new_ones,
    torch.Tensor.new_empty,
    torch.Tensor.new_full,
    torch.Tensor.__deepcopy__,  # copies a module whole, before it is moved
    torch.Tensor.__reduce_ex__,
    torch.Tensor.__setstate__,
}
MARK = "_device_guard_host"  # the attribute a host tensor carries: where it was made
# What makes the host wait for the device's queue on CUDA (torch.cuda.set_sync_debug_mode's findings):
READS = {  # a device tensor read on the host
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.numpy,
    torch.Tensor.cpu,
    torch.Tensor.__bool__,
    torch.Tensor.__float__,
    torch.Tensor.__int__,
    torch.Tensor.__index__,
    torch.Tensor.__array__,  # np.asarray(t)
    torch.Tensor.__format__,  # f"{t:.3f}" (a 0-dim tensor is read)
}
TO_NUMPY = {torch.Tensor.numpy, torch.Tensor.__array__}  # refused by CUDA for a device tensor
SIZED_BY_VALUES = {  # an op whose output's size the host learns from the device
    torch.nonzero,
    torch.Tensor.nonzero,
    torch.argwhere,
    torch.masked_select,
    torch.Tensor.masked_select,
    torch.unique,
    torch.Tensor.unique,
    torch.unique_consecutive,
    torch.equal,
    torch.allclose,
    torch.Tensor.allclose,
}


class DeviceMixError(RuntimeError):
    """A tensor made on the host met the step's tensors in one op."""


def place(depth: int = 2) -> str:
    """The innermost caller in this repository outside this file (file:line in function), else the innermost."""
    frame = sys._getframe(depth)
    first = None
    while frame is not None:
        path = Path(frame.f_code.co_filename).resolve()
        where = f"{path.name}:{frame.f_lineno} in {frame.f_code.co_name}"
        if path.is_relative_to(ROOT) and path.relative_to(ROOT).parts[0] in OURS and path != Path(__file__).resolve():
            return f"{path.relative_to(ROOT)}:{frame.f_lineno} in {frame.f_code.co_name}"
        first = first or where
        frame = frame.f_back
    return first or "?"


def _tensors(tree) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (list, tuple)):
        return [t for item in tree for t in _tensors(item)]
    if isinstance(tree, dict):
        return [t for item in tree.values() for t in _tensors(item)]
    return []


DEVICE = "device"  # the mark of a tensor on the step's device; a host tensor's mark is where it was made


def host_place(t: torch.Tensor) -> str | None:
    """Where `t` was made on the host, or None if it is not known to be the host's."""
    mark = getattr(t, MARK, None)
    return None if mark == DEVICE else mark


def on_device(t: torch.Tensor) -> bool:
    return getattr(t, MARK, None) == DEVICE


def _mark(tree, mark: str) -> None:
    for t in _tensors(tree):
        try:
            setattr(t, MARK, mark)
        except (AttributeError, RuntimeError):  # a tensor type without attributes: left unmarked
            pass


def _target(args, kwargs) -> str | None:
    """Where .to() sends a tensor: "host", "device", or None when it names no device (a dtype only)."""
    for a in (*args, kwargs.get("device"), kwargs.get("other")):
        if isinstance(a, torch.Tensor):
            return "host" if host_place(a) else "device"
        if isinstance(a, str):
            return "host" if a == "cpu" else "device"
        if isinstance(a, torch.device):
            return "device"
    return None


def mark_constants(prefix: str = "bigbatch") -> None:
    """Mark the tensors that modules named `prefix...` hold at their top level (made at import, on the host)."""
    for name, module in list(sys.modules.items()):
        if name == prefix or name.startswith(prefix + "."):
            for value in list(vars(module).values()):
                for t in _tensors(value):
                    if getattr(t, MARK, None) is None:
                        _mark(t, f"{name} (a module constant)")


def _waits(func, args, kwargs) -> str | None:
    """What makes the host wait for the device's queue in this call on CUDA, or None."""
    first = args[0] if args else None
    if func in READS or (func is torch.Tensor.to and _target(args[1:], kwargs) == "host"):
        return f"{func.__name__} of a device tensor" if on_device(first) else None
    if func in SIZED_BY_VALUES or (func is torch.where and len(args) == 1):
        return f"{func.__name__} on the device" if any(on_device(t) for t in _tensors(args)) else None
    if func is torch.Tensor.__getitem__:  # a boolean mask on the device: its count of Trues
        masks = [t for t in _tensors(args[1:]) if t.dtype == torch.bool and on_device(t)]
        return "indexing with a device mask" if masks else None
    if func in (torch.Tensor.to, torch.Tensor.cuda) and host_place(first):
        target = "device" if func is torch.Tensor.cuda else _target(args[1:], kwargs)
        blocking = not (kwargs.get("non_blocking") or any(a is True for a in args[1:]))
        return "a copy to the device without non_blocking=True" if target == "device" and blocking else None
    if func is torch.Tensor.new_tensor and on_device(first) and not isinstance(args[1] if len(args) > 1 else None,
                                                                             torch.Tensor):  # fmt: skip
        return "new_tensor(data) of a device tensor"  # (found by review: data copied to the device, blocking)
    if func in (torch.tensor, torch.as_tensor) and not isinstance(first, torch.Tensor):
        device = kwargs.get("device")
        named = device is not None and not (isinstance(device, str) and device == "cpu")
        return "torch.tensor(data, device=the device)" if named else None
    return None


class DeviceGuard(TorchFunctionMode):
    """Within `with DeviceGuard():` a tensor made on the host (see the module's docstring) that meets a tensor
    of the step's device in one op raises DeviceMixError naming the op, where it ran and where the host tensor
    was made. Tensors it has not seen made (gradients, loaded state) join whichever kind they meet.

    `waits` counts, by what and where, the calls that on CUDA make the host wait for the device's queue (a
    device tensor read back, a copy to the device from the host without non_blocking=True, an op whose size
    the values decide), which leave the GPU idle while the host catches up."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: Counter[str] = Counter()

    def __enter__(self):
        mark_constants()
        return super().__enter__()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in TO_NUMPY and args and on_device(args[0]):  # (found by review: only counted as a wait)
            raise DeviceMixError(
                f"{func.__name__} of a device tensor at {place()}: CUDA cannot make a NumPy array of it; read it "
                "with .cpu() first (or keep what the host reads on the host)"
            )
        wait = _waits(func, args, kwargs)
        if wait is not None:
            self.waits[f"{wait} at {place()}"] += 1
        # (A crossing op is not checked, nor marked from its inputs: not walked either. Tensor.__deepcopy__'s
        # memo holds everything copied so far, and walking it made copying a model quadratic.)
        inputs = [] if func in CROSSING else _tensors(args) + _tensors(kwargs)
        # A factory given a tensor to start from (torch.as_tensor(x), torch.normal(mean, std)) keeps its device.
        factory = func in FACTORIES and not (args and isinstance(args[0], torch.Tensor))
        hosts = [t for t in inputs if host_place(t)]
        devices = [t for t in inputs if on_device(t)]
        if func not in CROSSING and not factory and devices:
            mixed = [t for t in hosts if t.dim() > 0]  # as on CUDA, a 0-dim host tensor is read as a number
            if mixed:
                name = torch.overrides.resolve_name(func) or repr(func)
                raise DeviceMixError(
                    f"{name} at {place()} mixes the step device's tensors with a host tensor "
                    f"{tuple(mixed[0].shape)} made at {host_place(mixed[0])}: name its device (device=x.device) "
                    "or move it (.to(x.device))"
                )
        out = func(*args, **kwargs)
        mark = None
        if func in ALWAYS_HOST:
            mark = f"{place()} ({getattr(func, '__name__', func)})"
        elif factory:
            device = kwargs.get("device")
            mark = (
                f"{place()} ({func.__name__} without device=)"
                if device is None or (isinstance(device, str) and device == "cpu")
                else DEVICE
            )
        elif func in (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.type_as):
            target = "device" if func is torch.Tensor.cuda else _target(args[1:], kwargs)
            if target is None:  # a dtype: the tensor stays where it was
                mark = getattr(args[0], MARK, None)
            elif target == "host":
                mark = host_place(args[0]) or f"{place()} (.to('cpu'))"
            else:
                mark = DEVICE
                if isinstance(args[0], torch.nn.Parameter):  # Module.to() keeps the Parameter, sets its data
                    _mark(args[0], DEVICE)
                elif out is args[0] and host_place(out):  # .to() gave the host tensor back
                    out = out.view_as(out)  # as a new tensor, on the step's device
        elif func in CROSSING:
            if func.__name__.startswith(("new_", "__getitem__", "copy_")):
                mark = getattr(args[0], MARK, None)
        elif devices:
            mark = DEVICE
        elif hosts:
            mark = host_place(hosts[0])
        if mark is not None:
            _mark(out, mark)
        return out
