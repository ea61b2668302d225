"""A search's space (bigbatch.sweep(..., search=study)): each entry's choices or (low, high[, "log"]) range, checked
before the first trial trains and sampled by an Optuna trial."""

from __future__ import annotations

import itertools
import math
from typing import Any

from bigbatch.config import Config
from bigbatch.errors import BigbatchError
from bigbatch.sweep_table import is_number


def _ends(spec: Any) -> list[Any] | None:
    """A search space entry's choices, or its range's ends (None: neither; suggest says what it must be)."""
    if isinstance(spec, tuple) and len(spec) in (2, 3) and all(is_number(v) for v in spec[:2]):
        return list(spec[:2])
    return list(spec) if isinstance(spec, list) else None


def check_space(base: Config, space: dict[str, Any], key: str) -> None:
    """`key`'s choices, or its range's ends, are values it takes, alone or beside one of the other entries' (a
    micro-batch that fits only a larger batch sampled with it), before anything trains (found from outside: a choice
    of 0 stopped the search at its fourth trial; a reversed range, Optuna's traceback)."""
    spec = space[key]
    if isinstance(spec, tuple) and len(spec) in (2, 3) and all(is_number(v) for v in spec[:2]):
        if spec[0] > spec[1]:
            raise BigbatchError(f"search range for {key!r}: low {spec[0]!r} > high {spec[1]!r}: give (low, high)")
        if len(spec) == 3 and spec[2] == "log" and spec[0] <= 0:
            raise BigbatchError(f"search range for {key!r}: a log scale needs low > 0, got {spec[0]!r}")
    values = _ends(spec)
    others = {k: ends for k, v in space.items() if k != key and (ends := _ends(v))}
    what = "choices for" if isinstance(spec, list) else "range for"
    floats = isinstance(spec, tuple) and not all(isinstance(v, int) for v in spec[:2])
    for i, value in enumerate(values or []):
        try:
            base.override({key: value})
        except BigbatchError as e:
            # (a float range's open end, as momentum's [0, 1): Optuna samples inside it, found by review)
            inside = math.nextafter(float(value), float(values[1 - i])) if floats else None
            if inside is not None and _takes(base, {key: inside}):
                continue
            beside = itertools.islice(itertools.product(*others.values()), 256)
            if not any(_takes(base, {key: value, **dict(zip(others, combo))}) for combo in beside):
                raise BigbatchError(f"search {what} {key!r}: {e}") from None


def _takes(base: Config, values: dict[str, Any]) -> bool:
    try:
        base.override(values)
    except BigbatchError:
        return False
    return True


def suggest(trial: Any, key: str, spec: Any) -> Any:
    """One config value sampled by an Optuna trial from a search space entry."""
    if isinstance(spec, tuple) and len(spec) in (2, 3) and all(is_number(v) for v in spec[:2]):
        low, high = spec[:2]
        log = len(spec) == 3 and spec[2] == "log"
        if len(spec) == 3 and not log:
            raise BigbatchError(f"search range for {key!r}: the third item can only be 'log', got {spec[2]!r}")
        if isinstance(low, int) and isinstance(high, int):
            return trial.suggest_int(key, low, high, log=log)
        return trial.suggest_float(key, float(low), float(high), log=log)
    if isinstance(spec, list) and spec:
        if not all(v is None or isinstance(v, (bool, int, float, str)) for v in spec):
            raise BigbatchError(f"search choices for {key!r} must be numbers, strings or booleans, got {spec!r}")
        return trial.suggest_categorical(key, spec)
    raise BigbatchError(f"search space for {key!r} must be a list of choices or a (low, high) range, got {spec!r}")
