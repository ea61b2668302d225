"""The config's value types: strict coercion of TOML/Python values to a field's annotated type
(`coerce`, no str->int, no bool->int), how a type is named in a message (`describe`), and `Section`,
the base of every config section, with the checks other modules register for one (`register_check`)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import sys
import tomllib
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from bigbatch.errors import BigbatchError, first_line


def describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(a) for a in typing.get_args(tp))
    if origin is tuple:
        return "[" + ", ".join(describe(a) for a in typing.get_args(tp)) + "]"
    if origin is list:  # (found from outside: "a list of a number")
        inner = typing.get_args(tp)[0]
        return f"a list of {({int: 'integers', float: 'numbers', str: 'strings'}).get(inner) or describe(inner)}"
    if origin is dict:
        return "a table"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))


def toml_text(value: Any) -> str:
    """A value as TOML writes it (true, [1, 2], {a = 1}); a string in quotes."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_text(v) for v in value) + "]"
    return repr(value) if isinstance(value, str) else str(value)


class Mismatch(Exception):
    pass


def plain(value: Any) -> Any:
    """A NumPy scalar or array as the Python value or list it holds (np.int64(64) -> 64); anything else as given."""
    return value.tolist() if type(value).__module__ == "numpy" and hasattr(value, "tolist") else value


def coerce(value: Any, tp: Any) -> Any:
    """Return `value` as type `tp`, or raise Mismatch. Strict: no str->int, no bool->int. A NumPy value is taken as
    the Python one it holds (found from outside: a grid's np.int64 "must be an integer, got 64")."""
    value = plain(value)
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


# Checks of a section ("" for the whole config) that need other modules; see `register_check`.
_CHECKS: dict[str, list[Callable[[Any], None]]] = {}


def register_check(section: str) -> Callable[[Callable[[Any], None]], Callable[[Any], None]]:
    """Decorator: `fn(section)` validates config section `section` ("" for the whole Config) whenever
    one is built, raising BigbatchError naming the key. For modules that own what a key means."""

    def add(fn: Callable[[Any], None]) -> Callable[[Any], None]:
        _CHECKS.setdefault(section, []).append(fn)
        return fn

    return add


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """A section's fields and their types."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


# The most a count may ask for, in the config and on the command line (found from outside: 2**63 of them forked
# until memory ran out, or ran for ever): processes (data.workers, prepare's and extract's --workers), images
# scored (eval.n, eval --n), batches of standing statistics, images a batch of extraction.
MAX_PROCESSES = 1024
MAX_SCORED = 100_000_000
# IS's splits and KID's subsets, as the papers and torch-fidelity compute them (its isc_splits, kid_subsets,
# kid_subset_size): the metrics' defaults, and eval's.
IS_SPLITS, KID_SUBSETS, KID_SUBSET_SIZE = 10, 100, 1000
MAX_STANDING = 1_000_000
MAX_EVAL_BATCH = 1 << 20
MAX_RESOLUTION = 16384  # pixels a side: data.resolution's, and prepare --resolution's

# Keys users of the peer projects reach for, and where bigbatch has them (found from outside: DFL's clipgrad
# as swap.clipgrad was an unknown key without a pointer).
# A key's form, said where a value of another type is given (found from outside: "must be a string, got 6").
FORMS = {"train.memory_budget": ', a size with its unit, e.g. "6GiB" or "512MiB"'}
# Values by the names other tools give them (StudioGAN's adv_loss, StyleGAN2's loss), said where given (found from
# outside: "wasserstein", as the README names StudioGAN's, refused with the list alone).
THEIR_NAMES = {
    "train.loss": {
        "vanilla": ("StudioGAN's", "ns"),
        "logistic": ("StyleGAN2's", "ns"),
        "least_square": ("StudioGAN's", "ls"),
        "wasserstein": ("StudioGAN's", "wgan"),
    },
    # DFL's face types by their names, as extract --face-type takes them, and its lr_dropout's y/n/cpu (found from
    # outside: refused with the list alone)
    **dict.fromkeys(
        ("swap.face_type", "xseg.face_type"),
        {
            "half_face": ("DFL's", "h"),
            "midfull_face": ("DFL's", "mf"),
            "full_face": ("DFL's", "f"),
            "full": ("DFL's", "f"),
            "whole_face": ("DFL's", "wf"),
        },
    ),
    **dict.fromkeys(
        ("swap.lr_dropout", "xseg.lr_dropout"),
        {"y": ("DFL's", True), "n": ("DFL's", False), "cpu": ("DFL's", True)},
    ),
}
ELSEWHERE = {
    "swap.clipgrad": " (DFL's clipgrad is train.grad_clip = 1.0 here)",
    "swap.batch_size": " (DFL's batch_size is train.batch here)",
    "swap.resolution": " (the resolution is data.resolution)",
    **dict.fromkeys(
        ("swap.archi", "swap.ae_dims", "swap.e_dims", "swap.d_dims", "swap.d_mask_dims"),
        " (archi and the dims are model.options: archi, ae_dims, e_dims, d_dims, d_mask_dims)",
    ),
    "swap.adabelief": ' (DFL\'s adabelief is swap.optimizer = "adabelief", the default; "rmsprop" its other)',
    "swap.use_fp16": ' (DFL\'s use_fp16 is train.precision = "fp16" here, or "bf16")',
    "swap.models_opt_on_gpu": " (the models and their optimizers are on train.device here)",
    "swap.pretrain": " (DFL's pretraining mode is not here: train on any face set, then train.init_from the run)",
    "swap.target_iter": " (DFL's target_iter is the run's length: train.kimg, thousands of faces: iterations x batch)",
    "swap.autobackup_hour": (
        " (checkpoints come every checkpoint.every_kimg and checkpoint.every_minutes, the newest checkpoint.keep kept)"
    ),
    "swap.write_preview_history": " (previews go to RUN/samples/ every sample.every_kimg, each kept)",
    # StyleGAN2-ADA's names (found from outside: --augpipe unhinted)
    "augment.augpipe": ' (StyleGAN2-ADA\'s --augpipe is augment.pipeline = "ada" with augment.policy, e.g. "bgc")',
    "augment.ada_interval": " (p moves every 256 real images here, at the rate of augment.speed_kimg, ADA's ada_kimg)",
}


class Section:
    """Base of every config section: checks field types on construction, then `_validate`, then the
    checks registered for it."""

    _name: typing.ClassVar[str] = ""

    def __setattr__(self, name: str, value: Any) -> None:
        """A field set from Python is checked as from TOML: an unknown key is refused naming the valid ones
        (a typo was kept and ignored), a value of the wrong type naming the type (it failed deep inside
        training); the section's value checks run when it is validated (`bigbatch.train` does)."""
        if name.startswith("_"):
            return object.__setattr__(self, name, value)
        hints = _hints(type(self))
        if name not in hints:
            self._unknown(name)
        tp = hints[name]
        if dataclasses.is_dataclass(tp):  # a section, or a table of its keys
            value = tp.from_dict(value) if isinstance(value, dict) else value
            if not isinstance(value, tp):
                raise BigbatchError(f"config key '{self._key(name)}' must be a table")
        else:
            try:
                value = coerce(value, tp)
            except Mismatch:
                key, hint = self._key(name), FORMS.get(self._key(name), "")
                if not hint and describe(tp) == "a string" and isinstance(value, (int, float)):  # (found from outside:
                    hint = f" (quoted for TOML: {key}='\"{toml_text(value)}\"')"  # name=2024, with no way out said)
                if not hint and isinstance(value, str) and (theirs := THEIR_NAMES.get(key, {}).get(value.lower())):
                    here = toml_text(theirs[1]) if isinstance(theirs[1], bool) else repr(theirs[1])  # (true: TOML's)
                    hint = f" ({theirs[0]} {value!r} is {here} here)"
                if not hint and typing.get_origin(tp) is list and isinstance(value, str) and "," in value:
                    hint = f" in brackets ({key}=[{value}])"  # (found from outside: "a list of a number, got '30,60'")
                shown = toml_text(value)  # (as TOML writes it: found from outside, "got True" of train.seed=true)
                raise BigbatchError(f"config key '{key}' must be {describe(tp)}{hint}, got {shown}") from None
            if isinstance(value, int) and not -(2**63) <= value < 2**63:  # (TOML's integers; torch's and NumPy's)
                raise BigbatchError(f"config key '{self._key(name)}' must be an integer of 64 bits, got {value}")
        object.__setattr__(self, name, value)

    @classmethod
    def _unknown(cls, key: str) -> typing.NoReturn:
        known = [f.name for f in dataclasses.fields(cls)]
        full = f"{cls._name}.{key}" if cls._name else key
        close = difflib.get_close_matches(key, known, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        hint = ELSEWHERE.get(full, hint)
        where = f"[{cls._name}]" if cls._name else "the top level"
        raise BigbatchError(f"unknown config key '{full}'{hint}; valid keys in {where}: {', '.join(known)}")

    def __post_init__(self) -> None:  # (each field was checked as __init__ set it: __setattr__)
        self._validate()
        for check in _CHECKS.get(self._name, ()):
            check(self)

    def _validate(self) -> None:
        pass

    def _key(self, name: str) -> str:
        return f"{self._name}.{name}" if self._name else name

    def changed(self, *names: str) -> list[str]:
        """Which of the fields `names` (default: all) differ from their defaults (as dotted config keys):
        for a task to refuse keys it does not read."""
        defaults = type(self)()
        names = names or tuple(f.name for f in dataclasses.fields(self))
        return [self._key(n) for n in names if getattr(self, n) != getattr(defaults, n)]

    def _fail(self, name: str, problem: str) -> typing.NoReturn:
        raise BigbatchError(f"config key '{self._key(name)}' {problem}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Any:
        known = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in known:
                cls._unknown(key)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if isinstance(value, Section) else value
        return out


def at_least_zero(section: Section, **what: str) -> None:
    """Refuse any field of `section` (name="what it must be") below 0 or not finite, naming the key."""
    for name, kind in what.items():
        value = getattr(section, name)
        if not value >= 0 or (isinstance(value, float) and not math.isfinite(value)):
            section._fail(name, f"must be {kind}, got {value!r}")


def positive(section: Section, *names: str) -> None:
    """Refuse, naming the key, any of the fields `names` of `section` that is not a finite number > 0."""
    for name in names:
        value = getattr(section, name)
        if not value > 0 or (isinstance(value, float) and not math.isfinite(value)):
            finite = "" if value == value and abs(value) != math.inf else "finite "  # (found from outside: inf)
            section._fail(name, f"must be a {finite}positive number, got {value!r}")


def at_most(section: Section, **limits: int) -> None:
    """Refuse any field of `section` (name=its largest value) above its limit, naming the key: a size that
    passed would overflow a tensor's size or run for ever (found from outside: a resolution of 2**40 and a
    width of 2**63 were tracebacks, sample.n of 2**63 one at the first sheet)."""
    for name, most in limits.items():
        if getattr(section, name) > most:
            section._fail(name, f"must be at most {most:,}, got {getattr(section, name)!r}")


def strings(tree: Any, prefix: str = "") -> typing.Iterator[tuple[str, str]]:
    """(dotted key, value) of every string in a config tree, inside lists and tables too."""
    if isinstance(tree, str):
        yield prefix, tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            yield from strings(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from strings(v, prefix)


def read_toml(path: Path) -> dict[str, Any]:
    """A config file's tree (a run's folder: its config.toml, the run's own), or one line saying why it cannot be
    read as one."""
    if path.is_dir():  # (found from outside: Config.load took a run's folder, and --config said "Is a directory")
        if not (path / "config.toml").is_file():
            raise BigbatchError(f"{path} is a folder without a config.toml: give a TOML config file, or a run's folder")
        path = path / "config.toml"
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise BigbatchError(f"config file {path} does not exist") from None
    except UnicodeDecodeError as e:
        raise BigbatchError(
            f"config file {path} is not UTF-8 text (at byte {e.start}), which a TOML file must be; save it as UTF-8"
        ) from None
    except OSError as e:  # (found from outside: a folder or an unreadable file was called invalid TOML)
        raise BigbatchError(f"config file {path} cannot be read: {e.strerror or e}") from None
    except RecursionError:  # (found from outside: a traceback)
        raise BigbatchError(f"config file {path} nests arrays or tables too deep to read as a config") from None
    except tomllib.TOMLDecodeError as e:
        head = path.read_bytes()[:4]
        hint = (
            "; it begins with a byte-order mark: save it as UTF-8 without one"
            if head.startswith(b"\xef\xbb\xbf")
            else "; it looks like JSON: a config is TOML (bigbatch train --dry-run prints one)"
            if head.lstrip()[:1] == b"{"
            else ""
        )  # (found from outside: neither was said)
        raise BigbatchError(f"config file {path} is not valid TOML: {e}{hint}") from None
    except ValueError as e:  # (found from outside: a number of 100,000 digits, Python's int limit, was a traceback)
        raise BigbatchError(f"config file {path} holds {_unreadable(e)}") from None


def _unreadable(e: ValueError) -> str:
    """What of a TOML text Python's parser refused past its syntax, for a message."""
    digits = "digits" in str(e)  # (Python's limit on an integer's digits)
    return f"a number longer than {sys.get_int_max_str_digits():,} digits" if digits else f"a value: {first_line(e)}"


def parse_override(text: str) -> tuple[str, Any]:
    """Parse one command-line override `key=value`; the value is read as TOML, else as a plain string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        if not sep and (Path(text) / "config.toml").is_file():  # (found from outside: show-batch RUN, as info RUN)
            raise BigbatchError(f"{text} is a run: give its config as --config {text} (overrides are key=value)")
        raise BigbatchError(f"cannot read override '{text}': write it as key=value, e.g. train.batch=256")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError as e:
        # (found from outside: a list cut short was "must be a list, got '[0.0,0.99'")
        if raw.strip()[:1] in ("[", "{"):
            raise BigbatchError(
                f"cannot read override '{text}': its value is not TOML ({str(e).split(' (at')[0]}); write a list as "
                "[0.9, 0.999] and a table as {key = 1}, or a string in TOML's quotes (key='\"[text]\"'), quoted for "
                "the shell"
            ) from None
        value = raw
    except (RecursionError, ValueError) as e:  # (found from outside: tracebacks, one of 3,002 lines)
        what = "arrays or tables nested too deep" if isinstance(e, RecursionError) else _unreadable(e)
        raise BigbatchError(f"cannot read override {key.strip()}=...: it holds {what}") from None
    return key.strip(), value
