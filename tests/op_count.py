"""How many ops a piece of code dispatches: each at least one kernel launch on a GPU (views launch nothing and are
not counted). The tests count on the CPU what a GPU would launch."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class Ops(TorchDispatchMode):
    """Counts the aten ops dispatched while it is entered (`count`), views excluded; `named`: those whose name holds
    it alone ("convolution": forward and backward)."""

    def __init__(self, named: str = "") -> None:
        super().__init__()
        self.count, self.named = 0, named

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += not func.is_view and self.named in func._overloadpacket.__name__
        return func(*args, **(kwargs or {}))
