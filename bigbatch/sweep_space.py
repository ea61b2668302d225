"""A search's space (bigbatch.sweep(..., search=study)): each entry's choices or (low, high[, "log" or step]) range,
checked before the first trial trains and sampled by an Optuna trial."""

from __future__ import annotations

import itertools
import math
from typing import Any

from bigbatch.config import Config
from bigbatch.errors import BigbatchError
from bigbatch.sweep_table import is_number


def _range(spec: Any) -> tuple | None:
    """A space entry that is a (low, high[, "log" or step]) range, or None."""
    return spec if isinstance(spec, tuple) and len(spec) in (2, 3) and all(is_number(v) for v in spec[:2]) else None


def _ends(spec: Any) -> list[Any]:
    """A space entry's choices, or its range's ends ([]: neither; suggest says what it must be)."""
    return list(ends[:2]) if (ends := _range(spec)) else list(spec) if isinstance(spec, list) else []


def check_space(base: Config, space: dict[str, Any]) -> None:
    """Each entry's choices, or its range's ends, are values its key takes, alone or beside one of the other entries'
    (SGD's momentum beside SGD), before anything trains (found from outside: a choice of 0 stopped the search at its
    fourth trial; a reversed range, Optuna's traceback)."""
    for key, spec in space.items():
        if (ends := _range(spec)) and ends[0] > ends[1]:
            raise BigbatchError(f"search range for {key!r}: low {ends[0]!r} > high {ends[1]!r}: give (low, high)")
        if ends and len(ends) == 3 and ends[2] == "log" and ends[0] <= 0:
            raise BigbatchError(f"search range for {key!r}: a log scale needs low > 0, got {ends[0]!r}")
        if ends:
            _step(key, ends)  # (its third item said before the ends are tried)
        values, others = _ends(spec), {k: e for k, v in space.items() if k != key and (e := _ends(v))}
        floats = bool(ends) and not all(isinstance(v, int) for v in values)
        for i, value in enumerate(values):
            try:
                base.override({key: value})
            except BigbatchError as e:
                # (a float range's open end, as momentum's [0, 1): Optuna samples inside it, found by review)
                if floats and _takes(base, {key: math.nextafter(float(value), float(values[1 - i]))}):
                    continue
                beside = itertools.islice(itertools.product(*others.values()), 256)
                if not any(_takes(base, {key: value, **dict(zip(others, combo))}) for combo in beside):
                    raise BigbatchError(f"search {'range' if ends else 'choices'} for {key!r}: {e}") from None


def _takes(base: Config, values: dict[str, Any]) -> bool:
    try:
        base.override(values)
    except BigbatchError:
        return False
    return True


def suggest(trial: Any, key: str, spec: Any) -> Any:
    """One config value sampled by an Optuna trial from a search space entry."""
    if ends := _range(spec):
        low, high = ends[:2]
        log, step = len(ends) == 3 and ends[2] == "log", _step(key, ends)
        if all(isinstance(v, int) for v in (low, high, step or 1)):
            return trial.suggest_int(key, low, high, log=log, step=step or 1)
        return trial.suggest_float(key, float(low), float(high), log=log, step=step)
    if isinstance(spec, list) and spec:
        if not all(v is None or isinstance(v, (bool, int, float, str)) for v in spec):
            raise BigbatchError(f"search choices for {key!r} must be numbers, strings or booleans, got {spec!r}")
        return trial.suggest_categorical(key, spec)
    raise BigbatchError(f"search space for {key!r} must be a list of choices or a (low, high) range, got {spec!r}")


def _step(key: str, ends: tuple) -> int | float | None:
    """A range's step, Optuna's (low, low + step, ... up to high): its third item where that is a number > 0
    (found from outside: a batch range sampled 49, which its micro-batch of 16 did not divide; (16, 64, 16) was
    refused). None: no step (or "log": Optuna takes one or the other)."""
    if len(ends) < 3 or ends[2] == "log":
        return None
    step = ends[2]
    if not is_number(step) or step <= 0:
        raise BigbatchError(
            f"search range for {key!r}: the third item is 'log' or a step > 0, e.g. (16, 64, 16), got {step!r}"
        )
    if isinstance(ends[0], int) and isinstance(ends[1], int) and not isinstance(step, int):  # (found by review:
        raise BigbatchError(  # a batch range's float step sampled floats)
            f"search range for {key!r}: a range of whole numbers takes a whole step, got {step!r}: give "
            f"({ends[0]}, {ends[1]}, {max(1, round(step))}), or float ends for a float range"
        )
    return step
