"""The model registry: families register a builder with `@register`; `create` builds a (G, D) pair.

The contract every family keeps: `G(z, y) -> images` in [-1, 1], NCHW, and `D(x, y) -> logits` (N,),
where y is None (unconditional), labels (N,) or class weights (N, n_classes); G has the attributes
`resolution`, `n_classes`, `dim_z` and `img_channels`. G and D list in `checkpoint_blocks` the
submodule names the engine may activation-checkpoint. No optimizer, precision or DDP code inside.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch import nn

from bigbatch.errors import BigbatchError

Builder = Callable[..., tuple[nn.Module, nn.Module]]
_FAMILIES: dict[str, Builder] = {}

# Arguments every builder takes; anything else in its signature is a family option.
COMMON = ("resolution", "n_classes", "ch", "dim_z", "img_channels")


def register(fn: Builder) -> Builder:
    """Register a family builder under its function name.

    The builder takes (resolution, n_classes, ch, dim_z, img_channels, **options) and returns (G, D)."""
    params = list(inspect.signature(fn).parameters)
    missing = [p for p in COMMON if p not in params]
    if missing:
        raise TypeError(f"model builder {fn.__name__} lacks arguments {missing}")
    _FAMILIES[fn.__name__] = fn
    return fn


def list_models() -> list[str]:
    """Names of the registered families."""
    return sorted(_FAMILIES)


def _builder(name: str) -> Builder:
    if name not in _FAMILIES:
        raise BigbatchError(f"unknown model '{name}'; valid: {', '.join(list_models())}")
    return _FAMILIES[name]


def options(name: str) -> dict[str, Any]:
    """A family's own options and their defaults."""
    sig = inspect.signature(_builder(name))
    return {k: p.default for k, p in sig.parameters.items() if k not in COMMON}


def check_options(name: str, given: dict[str, Any]) -> None:
    """Raise BigbatchError for an option the family does not take, or one of the wrong type."""
    valid = options(name)
    for key, value in given.items():
        if key not in valid:
            raise BigbatchError(f"'{name}' has no option '{key}'; valid: {', '.join(valid) or 'none'}")
        default = valid[key]
        ok = type(value) is type(default) or (isinstance(default, float) and type(value) is int)
        if default is not None and not ok:
            raise BigbatchError(f"option '{key}' of '{name}' must be {type(default).__name__}, got {value!r}")


def create(
    name: str,
    resolution: int,
    n_classes: int = 0,
    ch: int | None = None,
    dim_z: int | None = None,
    img_channels: int = 3,
    **opts: Any,
) -> tuple[nn.Module, nn.Module]:
    """Build a family's (G, D) pair. n_classes=0 builds the unconditional models; ch and dim_z
    default to the family's reference values."""
    builder = _builder(name)
    check_options(name, opts)
    sig = inspect.signature(builder).parameters
    kwargs: dict[str, Any] = dict(resolution=resolution, n_classes=n_classes, img_channels=img_channels, **opts)
    kwargs["ch"] = sig["ch"].default if ch is None else ch
    kwargs["dim_z"] = sig["dim_z"].default if dim_z is None else dim_z
    return builder(**kwargs)
