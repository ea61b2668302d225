"""The model registry: families register a builder with `@register`; `create` builds a (G, D) pair.

The contract every family keeps: `G(z, y) -> images` in [-1, 1], NCHW, and `D(x, y) -> logits` (N,),
where y is None (unconditional), labels (N,) or class weights (N, n_classes); G has the attributes
`resolution`, `n_classes`, `dim_z` and `img_channels`. G and D list in `checkpoint_blocks` the
submodule names the engine may activation-checkpoint. No optimizer, precision or DDP code inside.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from bigbatch.errors import BigbatchError
from bigbatch.models import layers

Builder = Callable[..., tuple[nn.Module, nn.Module]]

# Arguments every builder takes; anything else in its signature is a family option.
COMMON = ("resolution", "n_classes", "ch", "dim_z", "img_channels")


@dataclass(frozen=True)
class _Family:
    build: Builder
    init: str  # the default weight-init scheme; the option `init` of every family


_FAMILIES: dict[str, _Family] = {}


def register(*, init: str) -> Callable[[Builder], Builder]:
    """Register a family builder under its function name, with its default init scheme (one of
    `layers.INIT_SCHEMES`).

    The builder takes keyword arguments only, (resolution, n_classes, ch, dim_z, img_channels, and the
    family's options with their defaults), checks their values and constructs (G, D); `create`
    initialises them, so every family is built and initialised one way."""
    if init not in layers.INIT_SCHEMES:
        raise TypeError(f"init scheme {init!r} is not one of {layers.INIT_SCHEMES}")

    def add(fn: Builder) -> Builder:
        params = inspect.signature(fn).parameters
        missing = [p for p in COMMON if p not in params]
        if missing:
            raise TypeError(f"model builder {fn.__name__} lacks arguments {missing}")
        if any(p.kind is not inspect.Parameter.KEYWORD_ONLY for p in params.values()):
            raise TypeError(f"model builder {fn.__name__} must take keyword-only arguments (def {fn.__name__}(*, ...))")
        if "init" in params:
            raise TypeError(f"model builder {fn.__name__} must not take 'init': the registry initialises")
        _FAMILIES[fn.__name__] = _Family(fn, init)
        return fn

    return add


def list_models() -> list[str]:
    """Names of the registered families."""
    return sorted(_FAMILIES)


def _family(name: str) -> _Family:
    if name not in _FAMILIES:
        raise BigbatchError(f"unknown model '{name}'; valid: {', '.join(list_models())}")
    return _FAMILIES[name]


def builder(name: str) -> Builder:
    """A family's builder: it constructs (G, D) without the family's initialisation; `create` is the
    way to build models."""
    return _family(name).build


def options(name: str) -> dict[str, Any]:
    """A family's own options and their defaults (`init`, its weight-init scheme, last)."""
    family = _family(name)
    params = inspect.signature(family.build).parameters
    return {k: p.default for k, p in params.items() if k not in COMMON} | {"init": family.init}


def check_options(name: str, given: dict[str, Any]) -> None:
    """Raise BigbatchError for an option the family does not take, or one of the wrong type."""
    valid = options(name)
    for key, value in given.items():
        if key not in valid:
            raise BigbatchError(f"'{name}' has no option '{key}'; valid: {', '.join(valid)}")
        default = valid[key]
        ok = type(value) is type(default) or (isinstance(default, float) and type(value) is int)
        if default is not None and not ok:
            raise BigbatchError(f"option '{key}' of '{name}' must be {type(default).__name__}, got {value!r}")
    if given.get("init", valid["init"]) not in layers.INIT_SCHEMES:
        raise BigbatchError(
            f"option 'init' of '{name}' must be one of {', '.join(layers.INIT_SCHEMES)}, got {given['init']!r}"
        )


def create(
    name: str,
    resolution: int,
    n_classes: int = 0,
    *,
    ch: int | None = None,
    dim_z: int | None = None,
    img_channels: int = 3,
    **opts: Any,
) -> tuple[nn.Module, nn.Module]:
    """Build and initialise a family's (G, D) pair from the global RNG: G's weights, then D's, then G's
    initialisation, then D's. n_classes=0 builds the unconditional models; ch and dim_z default to the
    family's reference values; `opts` are the family's options (BigbatchError naming the valid ones for
    any other)."""
    family = _family(name)
    check_options(name, opts)
    init = opts.pop("init", family.init)
    params = inspect.signature(family.build).parameters
    G, D = family.build(
        resolution=resolution,
        n_classes=n_classes,
        ch=params["ch"].default if ch is None else ch,
        dim_z=params["dim_z"].default if dim_z is None else dim_z,
        img_channels=img_channels,
        **opts,
    )
    for net in (G, D):
        layers.init_weights(net, init)
    return G, D
