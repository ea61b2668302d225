"""How many ops a piece of code dispatches: each at least one kernel launch on a GPU (views launch nothing and are
not counted). The tests count on the CPU what a GPU would launch."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class Ops(TorchDispatchMode):
    """Counts the aten ops dispatched while it is entered (`count`), views excluded."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += not func.is_view
        return func(*args, **(kwargs or {}))
