"""The model registry: families register a builder with `@register`; `create` builds a GAN family's
(G, D) pair, `create_classifier` an image classifier, `create_autoencoder` a face-swap autoencoder.

The contract every GAN family keeps: `G(z, y) -> images` in [-1, 1] (StyleGAN2's about that, not squashed:
clamped where they are written), NCHW, and `D(x, y) -> logits` (N,),
where y is None (unconditional), labels (N,) or class weights (N, n_classes); G has the attributes
`resolution`, `n_classes`, `dim_z` and `img_channels`. An image classifier is one module,
`forward(x) -> logits` (N, n_classes) for float NCHW images of any size, `features(x) -> (N,
feature_dim)` its pooled penultimate features, with the attributes `n_classes`, `img_channels` and
`feature_dim`. Every model lists in `checkpoint_blocks` the submodule names the engine may
activation-checkpoint. No optimizer, precision or DDP code inside.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from torch import nn

from bigbatch.errors import BigbatchError, whole_number
from bigbatch.models import layers

Builder = Callable[..., tuple[nn.Module, nn.Module]]
ClassifierBuilder = Callable[..., nn.Module]
_B = TypeVar("_B", bound=Callable[..., Any])

# Per task, the arguments every builder takes; anything else in its signature is a family option.
# Classifiers take no resolution: they pool globally, so one network takes any input size.
COMMON = {
    "gan": ("resolution", "n_classes", "ch", "dim_z", "img_channels"),
    "classify": ("n_classes", "ch", "img_channels"),
    "swap": ("resolution", "img_channels"),
    "xseg": ("resolution", "img_channels"),
}
TASKS = tuple(COMMON)


@dataclass(frozen=True)
class _Family:
    build: Callable[..., Any]
    init: str  # the default weight-init scheme; the option `init` of every family
    task: str  # what the builder returns: "gan" a (G, D) pair, "classify" one classifier


_FAMILIES: dict[str, _Family] = {}
# Said where a config names no family known here (found from outside: a run of one's own family refused by the CLI).
USER_FAMILY = (
    " (a family of your own is known where the module that registers it is imported: BIGBATCH_IMPORT=MODULE "
    "bigbatch ..., in Python an import)"
)
# Per task, for messages: what a family is, the function that builds it, what its families are called.
_KIND = {
    "gan": ("a GAN", "create", "the GAN families"),
    "classify": ("an image classifier", "create_classifier", "the classifier families"),
    "swap": ("a face-swap autoencoder", "create_autoencoder", "the autoencoder families"),
    "xseg": ("a face segmenter", "create_segmenter", "the segmenter families"),
}


def register(*, init: str, task: str = "gan") -> Callable[[_B], _B]:
    """Register a family builder under its function name, with its default init scheme (one of
    `layers.INIT_SCHEMES`) and its task (one of `TASKS`).

    The builder takes keyword arguments only, (the task's common arguments, `COMMON[task]`, and the
    family's options with their defaults), checks their values and constructs the modules: (G, D) for
    "gan", one classifier for "classify". `create` and `create_classifier` initialise them, so every
    family is built and initialised one way."""
    if init not in layers.INIT_SCHEMES:
        raise TypeError(f"init scheme {init!r} is not one of {layers.INIT_SCHEMES}")
    if task not in COMMON:
        raise TypeError(f"task {task!r} is not one of {TASKS}")

    def add(fn: _B) -> _B:
        params = inspect.signature(fn).parameters
        missing = [p for p in COMMON[task] if p not in params]
        if missing:
            raise TypeError(f"model builder {fn.__name__} lacks arguments {missing}")
        foreign = [p for c in COMMON.values() for p in c if p in params and p not in COMMON[task]]
        if foreign:
            raise TypeError(f"{task} model builder {fn.__name__} must not take {foreign}")
        if any(p.kind is not inspect.Parameter.KEYWORD_ONLY for p in params.values()):
            raise TypeError(f"model builder {fn.__name__} must take keyword-only arguments (def {fn.__name__}(*, ...))")
        if "init" in params:
            raise TypeError(f"model builder {fn.__name__} must not take 'init': the registry initialises")
        known = _FAMILIES.get(fn.__name__)
        if known is not None and known.build.__module__.startswith("bigbatch."):
            raise TypeError(f"{fn.__name__} is one of bigbatch's own model families: give yours another name")
        if known is not None and known.build.__module__ != fn.__module__:
            raise TypeError(f"a model family named {fn.__name__} is registered already, by {known.build.__module__}")
        # (the same module's again, a notebook's reload: the newer one, as timm's registry takes it; found from
        # outside, importlib.reload raised)
        _FAMILIES[fn.__name__] = _Family(fn, init, task)
        return fn

    return add


def is_own(name: str) -> bool:
    """Whether the family `name` is one of bigbatch's (registered by any `bigbatch` command), not a user's own."""
    family = _FAMILIES.get(name)
    return family is None or family.build.__module__.startswith("bigbatch.")


def check_classifier(name: str, n_classes: int, ch: int, img_channels: int) -> None:
    """What every classify builder checks of its common arguments."""
    if n_classes < 1 or ch < 1 or img_channels < 1:
        raise BigbatchError(
            f"{name} needs n_classes, ch and img_channels >= 1, got {n_classes}, {ch} and {img_channels}"
        )


def list_models(task: str | None = None) -> list[str]:
    """Names of the registered families: all of them, or those of one task ("gan", "classify", "swap")."""
    if task is not None and task not in COMMON:
        raise BigbatchError(f"unknown model task '{task}'; valid: {', '.join(TASKS)}")
    return sorted(name for name, family in _FAMILIES.items() if task in (None, family.task))


def _family(name: str, task: str | None = None) -> _Family:
    """The family `name`, which must be of `task` when one is given."""
    if name not in _FAMILIES:
        if task is not None:  # and where the others are built
            others = "; ".join(
                f"{_KIND[t][2]} ({_KIND[t][1]}): {', '.join(list_models(t))}" for t in _KIND if t != task
            )
            raise BigbatchError(
                f"unknown model '{name}'; {_KIND[task][2]} are: {', '.join(list_models(task))}; {others}"
            )
        raise BigbatchError(f"unknown model '{name}'; valid: {', '.join(list_models(task))}")
    family = _FAMILIES[name]
    if task is not None and family.task != task:
        raise BigbatchError(
            f"model '{name}' is {_KIND[family.task][0]}: build it with bigbatch.models.{_KIND[family.task][1]}; "
            f"{_KIND[task][2]} are: {', '.join(list_models(task))}"
        )
    return family


def builder(name: str) -> Callable[..., Any]:
    """A family's builder: it constructs the family's modules without their initialisation; `create`
    and `create_classifier` are the way to build models."""
    return _family(name).build


def options(name: str) -> dict[str, Any]:
    """A family's own options and their defaults (`init`, its weight-init scheme, last)."""
    family = _family(name)
    params = inspect.signature(family.build).parameters
    return {k: p.default for k, p in params.items() if k not in COMMON[family.task]} | {"init": family.init}


def check_options(name: str, given: dict[str, Any]) -> dict[str, Any]:
    """Raise BigbatchError for an option the family does not take, or one of the wrong type; the family's options
    and their defaults (`options`)."""
    valid = options(name)
    for key, value in given.items():
        if key not in valid:
            raise BigbatchError(
                f"'{name}' has no option '{key}'; valid: {', '.join(valid)} (another family's options, from a preset: "
                "give model.options={} with model.name, which replaces them)"
            )
        default = valid[key]
        ok = type(value) is type(default) or (isinstance(default, float) and type(value) is int)
        ok |= isinstance(default, tuple) and isinstance(value, list)  # (TOML has lists: found from outside, refused)
        if default is not None and default is not inspect.Parameter.empty and not ok:  # (no default: any type)
            raise BigbatchError(f"option '{key}' of '{name}' must be {type(default).__name__}, got {value!r}")
    # The equalized learning rate is in a family's layers, not in its initialisation: it takes that
    # scheme only, and no other family takes it.
    schemes = (
        ("equalized",) if valid["init"] == "equalized" else tuple(s for s in layers.INIT_SCHEMES if s != "equalized")
    )
    if given.get("init", valid["init"]) not in schemes:
        raise BigbatchError(f"option 'init' of '{name}' must be one of {', '.join(schemes)}, got {given['init']!r}")
    return valid


def _default(name: str, params: Any, key: str) -> Any:
    """A common argument's default in the family's signature (found from outside: one without was passed on as
    inspect's `empty`, and failed in the builder's arithmetic)."""
    if (value := params[key].default) is inspect.Parameter.empty:
        raise BigbatchError(f"'{name}' has no default {key}: give it (model.{key})")
    return value


def _options_given(name: str, given: dict[str, Any]) -> dict[str, Any]:
    """`given` checked (check_options), a list given for a tuple option as a tuple, and every option without a
    default given (found from outside: a TypeError from the builder, or "must be type")."""
    valid = check_options(name, given)
    if none := [k for k, v in valid.items() if v is inspect.Parameter.empty and k not in given]:
        raise BigbatchError(f"'{name}' has no default for {', '.join(none)}: give model.options.{none[0]}")
    return {k: tuple(v) if isinstance(valid[k], tuple) and isinstance(v, list) else v for k, v in given.items()}


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
    """Build and initialise a GAN family's (G, D) pair from the global RNG: G's weights, then D's, then
    G's initialisation, then D's. n_classes=0 builds the unconditional models; ch and dim_z default to
    the family's reference values; `opts` are the family's options (BigbatchError naming the valid ones
    for any other)."""
    family = _family(name, "gan")
    for key, value in {"resolution": resolution, "ch": ch, "dim_z": dim_z, "img_channels": img_channels}.items():
        if value is not None:  # (None: the family's default)
            whole_number(key, value, 1)
    opts = _options_given(name, opts)
    init = opts.pop("init", family.init)
    params = inspect.signature(family.build).parameters
    G, D = family.build(
        resolution=resolution,
        n_classes=n_classes,
        ch=_default(name, params, "ch") if ch is None else ch,
        dim_z=_default(name, params, "dim_z") if dim_z is None else dim_z,
        img_channels=img_channels,
        **opts,
    )
    for net in (G, D):
        layers.init_weights(net, init)
    return G, D


def create_classifier(
    name: str,
    n_classes: int,
    *,
    ch: int | None = None,
    img_channels: int = 3,
    **opts: Any,
) -> nn.Module:
    """Build and initialise a classifier family's network from the global RNG: its weights, then the
    init scheme, then the module's own `after_init()` where it has one (a ResNet zeroes the last BN
    gain of each residual block there, with its option zero_init_residual). ch defaults to the
    family's reference width; `opts` are the family's options (BigbatchError naming the valid ones
    for any other)."""
    family = _family(name, "classify")
    opts = _options_given(name, opts)
    init = opts.pop("init", family.init)
    params = inspect.signature(family.build).parameters
    net = family.build(
        n_classes=n_classes,
        ch=_default(name, params, "ch") if ch is None else ch,
        img_channels=img_channels,
        **opts,
    )
    layers.init_weights(net, init)
    if callable(getattr(net, "after_init", None)):
        net.after_init()
    return net


def create_autoencoder(name: str, resolution: int, *, img_channels: int = 3, **opts: Any) -> nn.Module:
    """Build and initialise a face-swap autoencoder family's network (SAEHD) from the global RNG; `opts`
    are the family's options (archi, ae_dims, ...; BigbatchError naming the valid ones for any other)."""
    return _create_one("swap", name, resolution, img_channels, opts)


def create_segmenter(name: str, resolution: int, *, img_channels: int = 3, **opts: Any) -> nn.Module:
    """Build and initialise a face segmenter family's network (DFL's XSeg) from the global RNG; `opts` are
    the family's options (BigbatchError naming the valid ones for any other)."""
    return _create_one("xseg", name, resolution, img_channels, opts)


def _create_one(task: str, name: str, resolution: int, img_channels: int, opts: dict[str, Any]) -> nn.Module:
    family = _family(name, task)
    opts = _options_given(name, opts)
    init = opts.pop("init", family.init)
    net = family.build(resolution=resolution, img_channels=img_channels, **opts)
    layers.init_weights(net, init)
    return net
