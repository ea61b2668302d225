"""The config's value types: strict coercion of TOML/Python values to a field's annotated type
(`coerce`, no str->int, no bool->int) and how a type is named in a message (`describe`)."""

from __future__ import annotations

import types
import typing
from typing import Any, Literal

from bigbatch.errors import BigbatchError


def describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(a) for a in typing.get_args(tp))
    if origin is tuple:
        return "[" + ", ".join(describe(a) for a in typing.get_args(tp)) + "]"
    if origin is list:
        return f"a list of {describe(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a table"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))


class Mismatch(Exception):
    pass


def coerce(value: Any, tp: Any) -> Any:
    """Return `value` as type `tp`, or raise Mismatch. Strict: no str->int, no bool->int."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value in typing.get_args(tp) and type(value) in {type(a) for a in typing.get_args(tp)}:
            return value
        raise Mismatch
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(tp):
            try:
                return coerce(value, option)
            except Mismatch:
                pass
        raise Mismatch
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise Mismatch
        return tuple(coerce(v, a) for v, a in zip(value, args))
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise Mismatch
        return [coerce(v, typing.get_args(tp)[0]) for v in value]
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise Mismatch
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise Mismatch
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise Mismatch
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise Mismatch
    if tp is str:
        if isinstance(value, str):
            return value
        raise Mismatch
    raise TypeError(f"unsupported config type {tp}")


def typed(value: Any, tp: Any, what: str) -> Any:
    """`value` as type `tp` (as a config field of that type takes it), or a BigbatchError saying `what`
    must be."""
    try:
        return coerce(value, tp)
    except Mismatch:
        raise BigbatchError(f"{what} must be {describe(tp)}, got {value!r}") from None
