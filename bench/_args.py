"""Shared by the benchmarks: argparse types that refuse a bad number or name as the command line is read
(argparse's one line, exit status 2), and bigbatch's own errors said as that one line too."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def at_least(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number, `least` or more."""

    def whole_number(text: str) -> int:
        try:
            number = int(text)
        except ValueError:
            number = None
        if number is None or number < least:
            raise argparse.ArgumentTypeError(f"give a whole number, {least} or more (got {text!r})")
        return number

    return whole_number


positive_int = at_least(1)


def checkout(project: str, marker: str) -> Callable[[str], str]:
    """An argparse type: the folder of a `project`'s source checkout, known by its file `marker` (found from
    outside: a wrong path was a worker's ModuleNotFoundError in a log, exit 1)."""
    from pathlib import Path

    def folder(text: str) -> str:
        if not (Path(text) / marker).is_file():
            raise argparse.ArgumentTypeError(f"no {marker} in {text!r}: give the folder of a {project} checkout")
        return text

    return folder


DFL_CHECKOUT = checkout("DeepFaceLab", "models/Model_SAEHD/Model.py")


def writable_file(text: str) -> Path:
    """An argparse type: the file a table is appended to, checked before anything is measured (found from outside: a
    folder, a folder that does not exist or a file this user may not write was a traceback once every part had run,
    minutes of a GPU's time); file:///abs is /abs."""
    import os

    from bigbatch.errors import BigbatchError
    from bigbatch.urls import local_path

    try:
        path = Path(local_path(text, "the table's file", "a benchmark"))
    except BigbatchError as e:  # (a URL)
        raise argparse.ArgumentTypeError(str(e)) from None
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder: give the file to append the table to")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: its folder {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"{text} cannot be written by this user: give a file it may write")
    return path


def positive_float(text: str) -> float:
    """An argparse type: a number above 0 (not nan or infinite)."""
    try:
        number = float(text)
    except ValueError:
        number = float("nan")
    if not 0 < number < float("inf"):
        raise argparse.ArgumentTypeError(f"give a number above 0 (got {text!r})")
    return number


def positive_float_list(text: str) -> list[float]:
    """An argparse type: comma-separated numbers above 0 ('6,8.5')."""
    try:
        return [positive_float(part) for part in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"give comma-separated numbers above 0 (got {text!r})") from None


def int_list(least: int = 1) -> Callable[[str], list[int]]:
    """An argparse type: comma-separated whole numbers, each `least` or more ('64,16')."""
    one = at_least(least)

    def whole_numbers(text: str) -> list[int]:
        try:
            return [one(part) for part in text.split(",")]
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"give comma-separated whole numbers, each {least} or more (got {text!r})"
            ) from None

    return whole_numbers


def name_list(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    """An argparse type: comma-separated names, each one of `choices` ('fp32,bf16')."""

    def names(text: str) -> list[str]:
        given = text.split(",")
        unknown = [n for n in given if n not in choices]
        if unknown:
            named = ", ".join(map(repr, unknown))
            raise argparse.ArgumentTypeError(f"{named}: give comma-separated {', '.join(choices)}")
        return given

    return names


def device_arg(text: str) -> str:
    """An argparse type: "cpu", a CUDA device this machine has, or "auto" (the GPU where there is one), as the device
    it names (found from outside: --device cuda on a machine without one was a traceback of torch's, after the
    benchmark had begun)."""
    import torch

    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(text).type
    except (RuntimeError, ValueError):
        kind = ""
    if kind not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device: give cpu, cuda or cuda:N (or auto)")
    if kind == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text}: no CUDA GPU here: give --device cpu")
    return text


@contextmanager
def one_line_errors() -> Iterator[None]:
    """A BigbatchError (an unknown preset, a bad override, a missing run) as `bigbatch: error: ...`, one line on
    stderr and exit status 2, as the `bigbatch` command says it, not a traceback."""
    from bigbatch.cli_errors import say_error
    from bigbatch.errors import BigbatchError

    try:
        yield
    except BigbatchError as e:
        say_error(str(e))
        sys.exit(2)
