"""torch-fidelity as the parity reference in tests (never imported by bigbatch itself).

torch-fidelity imports torchvision. The only torchvision on PyPI for this torch is a CUDA build whose
compiled ops cannot load against CPU torch, and its import then fails where it registers fake kernels
for the `torchvision::nms` and `torchvision::qnms` operators. Defining those two schemas (no kernels:
nothing here calls them) lets the import finish; everything torch-fidelity's Inception path uses is
plain torch.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_LIBRARIES: list[torch.library.Library] = []  # kept alive: a Library's definitions die with it


def _has_op(name: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(f"torchvision::{name}", "")
        return True
    except RuntimeError:
        return False


INSTALL = "pip install torch-fidelity==0.4.0 torchvision==0.28.0"


def torch_fidelity():
    """The torch_fidelity module, or skip the test when it is not installed."""
    try:
        return import_torch_fidelity()
    except ImportError:
        pytest.skip(f"torch-fidelity is not installed ({INSTALL})")


def import_torch_fidelity():
    """Import torch_fidelity (ImportError when it or torchvision is not installed)."""
    if importlib.util.find_spec("torch_fidelity") is None or importlib.util.find_spec("torchvision") is None:
        raise ImportError(f"torch-fidelity is not installed ({INSTALL})")
    try:
        import torchvision  # noqa: F401 - a torchvision whose ops load needs no help
    except RuntimeError:
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        missing = [name for name in _SCHEMAS if not _has_op(name)]
        if missing:
            lib = torch.library.Library("torchvision", "FRAGMENT")
            for name in missing:
                lib.define(_SCHEMAS[name])
            _LIBRARIES.append(lib)
        import torchvision  # noqa: F401
    import torch_fidelity

    return torch_fidelity
