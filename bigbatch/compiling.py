"""Marks for the code that torch.compile must run eagerly (a graph break), applied only when a model is
compiled: `torch.compiler.disable` imports Dynamo, about 2.4 s of a process's start on this project's CPU,
which every command paid at import, compiling or not."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

EAGER = "_bigbatch_eager"  # on a function marked by `eager`
DISABLED = "_bigbatch_disabled"  # on the torch.compiler.disable wrapper that replaced it


def eager(fn: Callable) -> Callable:
    """Mark a method that torch.compile must not trace; `disable_marked` makes it so before compiling."""
    setattr(fn, EAGER, True)
    return fn


def disable_marked(*objects: Any) -> None:
    """Put torch.compiler.disable on every method marked `eager` of the classes of `objects` (of an
    nn.Module's submodules too), once per class."""
    for obj in objects:
        for item in obj.modules() if isinstance(obj, torch.nn.Module) else [obj]:
            for cls in type(item).__mro__:
                for name, fn in list(vars(cls).items()):
                    if getattr(fn, EAGER, False) and not getattr(fn, DISABLED, False):
                        disabled = torch.compiler.disable(fn)
                        setattr(disabled, DISABLED, True)
                        setattr(cls, name, disabled)
