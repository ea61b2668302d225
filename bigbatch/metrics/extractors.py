"""Feature extractors selected by name, and the one pinned input pipeline of the Inception ones.

The pipeline (the resize filter alone moves FID by a point, so it is fixed and versioned):
uint8 images, NHWC or NCHW, grey repeated to RGB -> float32 -> bilinear resize to 299x299 exactly as
TensorFlow 1.x computes it (align_corners=False, no half-pixel offset; what the original FID code
ran, and torch-fidelity's `interpolate_bilinear_2d_like_tensorflow1x`) -> (x - 128) / 128. Each image
is processed on its own, so features do not depend on the batch size (to float rounding of the
convolution kernels), and TF32 is off during extraction on GPUs.

Names: "inception" (the pytorch-fid/torch-fidelity state dict, or the TorchScript file's weights
converted into the same module), "inception-torchscript" (StyleGAN/clean-fid's TorchScript file run
as it is), "classifier" (a small network trained on the data set itself, by the classify task: here
only loaded from its cache; its FID is reported as fcd), "auto" (inception when weights are present,
else classifier).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from bigbatch.errors import BigbatchError, warn
from bigbatch.metrics import inception as inc
from bigbatch.metrics.classifier import cached_classifier_extractor, run_classifier_extractor
from bigbatch.metrics.features import Extractor, resolve_device, to_nchw

PIPELINE = "uint8 -> TF1 bilinear (align_corners=False) to 299 -> (x - 128) / 128"
PIPELINE_VERSION = "tf1-bilinear-299/v1"
SIZE = 299
NAMES = ("inception", "inception-torchscript", "classifier", "auto")


def resize_tf_bilinear(x: torch.Tensor, size: int = SIZE) -> torch.Tensor:
    """Bilinear resize of float NCHW `x` to size x size as TensorFlow 1.x's ResizeBilinear
    (align_corners=False, half_pixel_centers=False): output pixel i samples input i * in / out.
    Coordinates and weights are float32 and the arithmetic is TF's, so the result is the same to the bit."""
    h, w = x.shape[-2:]
    if (h, w) == (size, size):
        return x

    def axis(n_in: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        pos = torch.arange(size, dtype=x.dtype, device=x.device) * torch.tensor(n_in / size, dtype=torch.float32)
        lo = pos.long()
        return lo, (lo + 1).clamp_max(n_in - 1), pos - lo.to(pos.dtype)

    y0, y1, dy = axis(h)
    x0, x1, dx = axis(w)
    # Along x first, on the input rows only; the rows picked next are then TF's top and bottom lerps.
    left = x.index_select(-1, x0)
    rows = left + (x.index_select(-1, x1) - left) * dx
    top = rows.index_select(-2, y0)
    return top + (rows.index_select(-2, y1) - top) * dy[:, None]


def preprocess(images: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
    """The pinned pipeline: uint8 images -> float32 (N, 3, 299, 299) in [-1, 1)."""
    x = to_nchw(images).to(device).float().contiguous()  # NCHW memory, whatever layout came in
    return (resize_tf_bilinear(x) - 128) / 128


class InceptionExtractor(Extractor):
    """Our InceptionV3 module, from the .pth state dict or the TorchScript file's weights."""

    def __init__(self, model: inc.InceptionV3, device: torch.device | str = "cpu", source: str = ""):
        self.name, self.family, self.dims = "inception", "inception", 2048
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.has_logits = model.has_logits
        self.source = source
        self.digest = _digest("inception", PIPELINE_VERSION, inc.weights_digest(model.state_dict()))

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.model(preprocess(images, self.device))


class TorchScriptExtractor(Extractor):
    """StyleGAN/clean-fid's TorchScript Inception: the file's own `layers`, fed our pinned pipeline's input (the
    resize the file makes inside, which is skipped, is TF1's too, within float rounding: tests/test_eval_images.py),
    for parity with them; logits only if the file has its output layer."""

    def __init__(self, ts: torch.jit.ScriptModule, device: torch.device | str = "cpu", source: str = ""):
        self.name, self.family, self.dims = "inception-torchscript", "inception", 2048
        self.device = torch.device(device)
        layers, output = inc.torchscript_layers(ts)
        self.layers = layers.to(self.device)
        self.fc_weight = None if output is None else output.state_dict()["weight"].to(self.device)
        self.has_logits = self.fc_weight is not None
        self.source = source
        self.digest = _digest("inception", PIPELINE_VERSION, inc.weights_digest(inc.state_dict_from_torchscript(ts)))

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        pool = self.layers(preprocess(images, self.device)).reshape(-1, 2048)
        out = {"pool": pool}
        if self.fc_weight is not None:
            out["logits"] = pool @ self.fc_weight.T
        return out


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def inception_available() -> bool:
    return inc.find_state_dict_file() is not None or inc.find_torchscript_file() is not None


def get_extractor(
    name: str | Extractor = "auto",
    *,
    path: str | Path | None = None,
    device: torch.device | str | None = "auto",
    data: object = None,
    **classifier_options: object,
) -> Extractor:
    """The extractor called `name` (see the module doc), on `device`.

    path: a weights file to use instead of looking in the cache folder (.pth/.safetensors state dict,
    or a TorchScript .pt). data: the data set whose own classifier the "classifier" extractor is,
    loaded from the cache (classifier_options: `options`, `folder`); the metrics do not train it:
    bigbatch.tasks.classify.features.classifier_extractor trains it and gives the Extractor to pass.
    An Extractor passes through unchanged.
    """
    if isinstance(name, Extractor):
        return name
    dev = resolve_device(device)
    name = resolve_name(name, path)
    if name == "inception":
        file = Path(path) if path is not None else inc.find_state_dict_file() or inc.find_torchscript_file()
        if file is None:
            raise BigbatchError(inc.missing_weights_message())
        if _is_torchscript(file):
            model = inc.build(inc.state_dict_from_torchscript(inc.load_torchscript(file)), str(file))
        else:
            model = inc.build(inc.load_state_dict_file(file), str(file))
        return InceptionExtractor(model, dev, str(file))
    if name == "inception-torchscript":
        file = Path(path) if path is not None else inc.find_torchscript_file()
        if file is None:
            raise BigbatchError(inc.missing_weights_message())
        return TorchScriptExtractor(inc.load_torchscript(file), dev, str(file))
    if name.startswith("classifier:"):
        return run_classifier_extractor(name.removeprefix("classifier:"), dev)
    if name == "classifier":
        if data is None:
            raise BigbatchError("the 'classifier' extractor is the data set's own classifier: pass data=")
        return cached_classifier_extractor(data, dev, **classifier_options)
    raise BigbatchError(f"unknown feature extractor {name!r}; valid: {', '.join(NAMES)}, classifier:RUN")


def falls_back(name: str, path: str | Path | None = None) -> bool:
    """Whether the extractor `name` is the classifier for want of Inception weights ("auto", none given or present)."""
    return name == "auto" and path is None and not inception_available()


def resolve_name(name: str, path: str | Path | None = None) -> str:
    """The extractor `name` stands for: "auto" is "inception" when weights are given or present, else
    "classifier" (said in a warning); any other name is itself."""
    if name != "auto":
        return name
    if not falls_back(name, path):
        return "inception"
    warn(
        f"no Inception weights in {inc.weights_dir()}: scoring with a classifier trained on the data set "
        f"(fcd, cs, kcd; not comparable with FID). For FID put {inc.PTH_NAME} there (from {inc.PTH_URL})"
    )
    return "classifier"


def _is_torchscript(path: Path) -> bool:
    """TorchScript archives are zip files holding a `constants.pkl`; state dicts saved by torch.save are not."""
    import zipfile

    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"  # (found from outside: a folder "does not exist")
        raise BigbatchError(
            f"Inception weights file {path} {what}: give the path of {inc.PTH_NAME} or {inc.TORCHSCRIPT_NAME} "
            "(eval.weights / --weights), or leave it empty to use the weights found where bigbatch looks"
        )
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as z:
        return any(n.endswith("constants.pkl") or "/code/" in n for n in z.namelist())
