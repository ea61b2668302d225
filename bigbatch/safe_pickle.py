"""Pickles from other programs (DeepFaceLab's weight and option files, the metadata in its aligned
face images), read by an unpickler that builds only NumPy arrays and scalars, dicts, lists, tuples,
strings, numbers and booleans, and refuses anything else with one line naming what the data asked
for: a pickle can run code, and these come from outside."""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import pickle
from typing import Any, NoReturn

from bigbatch.errors import BigbatchError

# What an array, a dtype or a NumPy scalar pickles to (NumPy 1 and 2 module names), and nothing else.
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("collections", "OrderedDict"),
}


class _ArraysOnly(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, what: str) -> None:
        super().__init__(file)
        self.what = what

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("numpy", "ndarray"):
            return _Subtype(self.what)
        if name == "_reconstruct" and (module, name) in _ALLOWED:
            return functools.partial(_reconstruct, self.what)
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise BigbatchError(
            f"{self.what} asks to load {module}.{name}, which is not an array, number or string: "
            "refusing it (a DeepFaceLab file holds only those; this one may run code)"
        )


class _Subtype:
    """What `numpy.ndarray` reads as: the type an array's pickle names for `_reconstruct`, never called (an array
    of any size, its memory uninitialised, otherwise: found by review)."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __call__(self, *args: Any) -> NoReturn:
        raise BigbatchError(f"{self.what} asks to make an array of uninitialised memory: refusing it")


def _reconstruct(what: str, subtype: Any, shape: Any, dtype: Any) -> Any:
    """NumPy's `_reconstruct` as an array's pickle calls it, `(ndarray, (0,), b"b")`: an empty array, whose
    pickled state then gives its shape, type and bytes (checked against each other). Any other call (a shape
    of its own: uninitialised memory of any size) is refused."""
    import numpy as np

    if not isinstance(subtype, _Subtype) or shape != (0,) or dtype not in (b"b", "b"):
        raise BigbatchError(f"{what} asks to make an array other than as NumPy pickles one: refusing it")
    return np.ndarray((0,), "b")


def loads(data: bytes, what: str, kind: str = "DeepFaceLab file") -> Any:
    """The object pickled in `data` (from `what`, named in errors), if it is made only of arrays,
    containers, strings and numbers; else one BigbatchError line."""
    try:
        loaded = _ArraysOnly(io.BytesIO(data), what).load()
    except BigbatchError:
        raise
    except Exception as e:  # noqa: BLE001 - any way a pickle can be cut short or garbled
        raise BigbatchError(f"{what} is not a readable {kind} ({type(e).__name__}: {e})") from None
    _refuse_shared(loaded, what)
    return loaded


def _refuse_shared(obj: Any, what: str, limit: int = 50_000_000) -> None:
    """Refused: data whose containers, expanded, hold more than `limit` items (a pickle's memo lets a few hundred
    bytes hold L = [L, L] nested 30 deep, or one tuple listed thousands of times: 2**30 numbers, or hundreds of
    millions, when read), and NumPy arrays of Python objects (which DFL's files do not hold). Each container's
    expanded size is counted once, so the check takes time in the size of the pickle."""
    import numpy as np

    sizes: dict[int, int] = {}
    opened: set[int] = set()

    def size(x: Any) -> int:  # (iterative: a deep chain must not reach Python's recursion limit)
        stack = [(x, False)]
        while stack:
            node, done = stack.pop()
            if isinstance(node, np.ndarray) and node.dtype == object:
                raise BigbatchError(f"{what} holds an array of Python objects, which a DeepFaceLab file does not")
            if not isinstance(node, (dict, list, tuple, set, frozenset)) or id(node) in sizes:
                continue
            if not done and id(node) in opened:  # (reached again inside itself)
                raise BigbatchError(f"{what} holds a container inside itself, which a DeepFaceLab file does not")
            opened.add(id(node))
            children = [*node.keys(), *node.values()] if isinstance(node, dict) else list(node)
            if done:
                total = len(children) + sum(sizes.get(id(c), 0) for c in children)
                if total > limit:
                    raise BigbatchError(
                        f"{what} would hold more than {limit:,} items when read (its containers repeat one another, "
                        "as a pickle made to grow without bound does): refusing it"
                    )
                sizes[id(node)] = total
            else:
                stack.append((node, True))
                stack += [(c, False) for c in children]
        return sizes.get(id(x), 0)

    size(obj)


def torch_weights(data: bytes, what: str) -> Any:
    """A PyTorch file's contents read with torch.load(weights_only=True) (tensors and plain data only), or
    one BigbatchError naming `what`. torch's own message for a file it will not load that way suggests
    weights_only=False, which is never an option here: it is not passed on."""
    import warnings
    import zipfile

    import torch

    # (found from outside: an empty file was "(EOFError)", a text file "(101)", a cut-short one torch's message cut
    # off mid-sentence)
    if not data:
        raise BigbatchError(f"{what} is empty (0 bytes), not a PyTorch file: copy or save it again")
    if data[:2] != b"PK" and data[:1] != b"\x80":
        raise BigbatchError(
            f"{what} is not a PyTorch file (neither torch.save's zip archive nor its older pickle format)"
        )
    if data[:2] == b"PK":  # (a TorchScript archive: torch warned over several lines, then refused; found from outside)
        try:
            names = zipfile.ZipFile(io.BytesIO(data)).namelist()
        except zipfile.BadZipFile:
            names = []
        if any(n.endswith("/constants.pkl") for n in names):
            raise BigbatchError(
                f"{what} is a TorchScript file (such as bigbatch export writes), not weights: give the run it was "
                "exported from, a state dict saved with torch.save, or a .safetensors file"
            )
    try:
        # argparse's Namespace: the `args` timm's and torchvision's training scripts save beside the weights (its
        # fields plain data, still checked by weights_only; found from outside: their checkpoints were refused).
        # (torch.serialization.safe_globals came in torch 2.5: on 2.4 such a file is refused, as before)
        allowed = getattr(torch.serialization, "safe_globals", lambda names: contextlib.nullcontext())
        with warnings.catch_warnings(), allowed([argparse.Namespace]):
            warnings.simplefilter("ignore")  # (torch's notes: what goes wrong is said below, in one line)
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise BigbatchError(
            f"{what} is not a PyTorch weights file, or holds objects beyond tensors and plain data (never "
            "unpickled here): give a state dict saved with torch.save, or a .safetensors file"
        ) from None
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 -- a damaged or crafted pickle fails in many ways (TypeError, IndexError...)
        said = str(e).strip()
        if data[:2] == b"PK" and ("zip archive" in said or isinstance(e, zipfile.BadZipFile)):
            raise BigbatchError(
                f"{what} is damaged or cut short (its zip archive is incomplete): copy or save it again"
            ) from None
        first = said.splitlines()[0].split(". ")[0][:200] if said else type(e).__name__
        raise BigbatchError(f"{what} is not a readable PyTorch file ({first})") from None


class _NumPy1Pickler(pickle._Pickler):
    """A pickler whose NumPy names are those every NumPy reads: NumPy 2 pickles an array as
    `numpy._core.multiarray._reconstruct`, a module NumPy 1 (DFL's) has not, and DFL then cannot load the
    file; `numpy.core.multiarray`, the name NumPy 1 writes, is NumPy 2's alias of the same module."""

    def save_global(self, obj: Any, name: str | None = None) -> None:
        module = getattr(obj, "__module__", None) or ""
        if module == "numpy._core" or module.startswith("numpy._core."):
            module, name = "numpy.core" + module[len("numpy._core") :], name or obj.__qualname__
            if self.proto >= 4:
                self.save(module)
                self.save(name)
                self.write(pickle.STACK_GLOBAL)
            else:
                self.write(pickle.GLOBAL + f"{module}\n{name}\n".encode())
            self.memoize(obj)
            return
        super().save_global(obj, name)


def numpy1_dumps(obj: Any, protocol: int) -> bytes:
    """`obj` pickled at `protocol` with NumPy 1's module names (see _NumPy1Pickler): what DFL's NumPy reads."""
    out = io.BytesIO()
    _NumPy1Pickler(out, protocol).dump(obj)
    return out.getvalue()
