"""DeepFaceLive's model file (.dfm): a swap model as the ONNX graph DeepFaceLab's `exportdfm` writes for
DeepFaceLive, so that a model trained here (or a DFL model folder, without DFL's TensorFlow and tf2onnx)
swaps faces live there.

The contract, as DFL's SAEHD export_dfm and DeepFaceLive's DFMModel read it:
- one input `in_face:0`, float32 (N, R, R, 3) in [0, 1], BGR (DFL's and OpenCV's order), N free, R fixed
  (DeepFaceLive reads the model's resolution from the input's shape);
- outputs in this order: `out_face_mask:0` (N, R, R, 1), the dst path's mask of the face as it is;
  `out_celeb_face:0` (N, R, R, 3), the face swapped to src, BGR; `out_celeb_face_mask:0` (N, R, R, 1), the
  src path's mask of the swap;
- ONNX opset 12, as DFL's tf2onnx export writes it (the runtimes DeepFaceLive ships read it).

The weights are this model's with the colour order flipped (models/dfl.flip_colour_order), as `export-dfl`
writes them; written with torch.onnx's TorchScript exporter, which writes opset 12 (the dynamo exporter starts at
18).
"""

from __future__ import annotations

import copy
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bigbatch.errors import BigbatchError
from bigbatch.models.dfl import flip_colour_order

INPUT = "in_face:0"
OUTPUTS = ("out_face_mask:0", "out_celeb_face:0", "out_celeb_face_mask:0")
OPSET = 12


class DFMOut(nn.Module):
    """BGR faces float32 NHWC in [0, 1] -> (dst mask, swapped face BGR, its mask), each NHWC: DFL's exported graph."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = copy.deepcopy(model)
        flip_colour_order(self.model)  # (DFL's weights read and write BGR)

    def forward(self, face: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        image, mask, dst_mask = self.model.swap(face.permute(0, 3, 1, 2))
        return dst_mask.permute(0, 2, 3, 1), image.permute(0, 2, 3, 1), mask.permute(0, 2, 3, 1)


def dfm_bytes(model: nn.Module, meta: dict[str, Any]) -> bytes:
    """The .dfm file of a SAEHD `model` (float32, eval, RGB as bigbatch holds it); `meta` goes in as the ONNX
    model's metadata property `bigbatch` (JSON), which DeepFaceLive ignores."""
    import json

    try:
        import onnx
    except ImportError:
        raise BigbatchError(
            "a .dfm is an ONNX file: writing one needs the onnx package: pip install onnx onnxscript (bigbatch's extra "
            "[onnx])"
        ) from None
    r = model.resolution
    module = DFMOut(model).float().cpu().eval()  # (a copy: the caller's model stays as it was)
    axes = {name: {0: "N"} for name in (INPUT, *OUTPUTS)}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.dfm"
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # (the TorchScript exporter's deprecation notice: opset 12 needs it)
            torch.onnx.export(
                module,
                (torch.zeros(1, r, r, 3),),
                str(path),
                dynamo=False,
                opset_version=OPSET,
                input_names=[INPUT],
                output_names=list(OUTPUTS),
                dynamic_axes=axes,
            )
        graph = onnx.load(str(path))
    for out, channels in zip(graph.graph.output, (1, 3, 1)):  # (the exporter left the sides symbolic)
        dims = out.type.tensor_type.shape.dim
        for dim, size in zip(dims[1:], (r, r, channels)):
            dim.ClearField("dim_param")
            dim.dim_value = size
    onnx.helper.set_model_props(graph, {"bigbatch": json.dumps(meta)})
    onnx.checker.check_model(graph)
    return graph.SerializeToString()
