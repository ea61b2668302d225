"""Feature extractors selected by name, and the one pinned input pipeline of the Inception ones.

The pipeline (the resize filter alone moves FID by a point, so it is fixed and versioned):
uint8 images, NHWC or NCHW, grey repeated to RGB -> float32 -> bilinear resize to 299x299 exactly as
TensorFlow 1.x computes it (align_corners=False, no half-pixel offset; what the original FID code
ran, and torch-fidelity's `interpolate_bilinear_2d_like_tensorflow1x`) -> (x - 128) / 128. Each image
is processed on its own, so features do not depend on the batch size (to float rounding of the
convolution kernels), and TF32 is off during extraction on GPUs.

Names: "inception" (the pytorch-fid/torch-fidelity state dict, or the TorchScript file's weights
converted into the same module), "inception-torchscript" (StyleGAN/clean-fid's TorchScript file run
as it is), "classifier" (a small network trained on the data set itself; its FID is reported as
fcd), "auto" (inception when weights are present, else classifier).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
import torch.distributed as td

from bigbatch.engine import dist
from bigbatch.errors import BigbatchError, warn
from bigbatch.metrics import inception as inc

PIPELINE = "uint8 -> TF1 bilinear (align_corners=False) to 299 -> (x - 128) / 128"
PIPELINE_VERSION = "tf1-bilinear-299/v1"
SIZE = 299
NAMES = ("inception", "inception-torchscript", "classifier", "auto")


def to_nchw(images: torch.Tensor) -> torch.Tensor:
    """uint8 NHWC or NCHW images, 1 or 3 channels -> uint8 (N, 3, H, W)."""
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or images.dim() != 4:
        got = f"{images.dtype} {tuple(images.shape)}" if isinstance(images, torch.Tensor) else type(images).__name__
        raise BigbatchError(f"feature extractors take uint8 image batches (N, H, W, C) or (N, C, H, W), got {got}")
    if images.shape[-1] in (1, 3):
        images = images.permute(0, 3, 1, 2)
    elif images.shape[1] not in (1, 3):
        raise BigbatchError(f"images must have 1 or 3 channels, got shape {tuple(images.shape)}")
    return images.expand(-1, 3, -1, -1) if images.shape[1] == 1 else images


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


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """Full float32 convolutions and matmuls (no TF32 on Ampere and later), restored afterwards."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


class Extractor:
    """uint8 images -> {"pool": (N, dims) features, "logits": (N, classes) if available}, float32 on the CPU.

    `name` says what the features are ("inception" or "classifier" family); `digest` identifies the
    weights and the input pipeline, and keys the reference-statistics cache.
    """

    name: str = "extractor"
    family: str = "inception"
    digest: str = ""
    dims: int = 0
    has_logits: bool = False
    device: torch.device = torch.device("cpu")

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        with exact_float32():
            out = self.forward(images)
        return {k: v.float().cpu() for k, v in out.items()}


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
    """StyleGAN/clean-fid's TorchScript Inception run as it is (its `layers`, fed our pipeline's input,
    as clean-fid does), for parity with them; logits only if the file has its output layer."""

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


def resolve_device(device: torch.device | str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


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
    or a TorchScript .pt). data: the data set the "classifier" extractor is trained on (or loaded
    from the cache for). An Extractor passes through unchanged.
    """
    if isinstance(name, Extractor):
        return name
    dev = resolve_device(device)
    if name == "auto":
        if path is not None or inception_available():
            name = "inception"
        else:
            warn(
                f"no Inception weights in {inc.weights_dir()}: scoring with a classifier trained on the data set "
                f"(fcd, cs, kcd; not comparable with FID). For FID put {inc.PTH_NAME} there (from {inc.PTH_URL})"
            )
            name = "classifier"
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
    if name == "classifier":
        if data is None:
            raise BigbatchError("the 'classifier' extractor is trained on a data set: pass data=")
        from bigbatch.metrics.classifier import classifier_extractor

        return classifier_extractor(data, device=dev, **classifier_options)
    raise BigbatchError(f"unknown feature extractor {name!r}; valid: {', '.join(NAMES)}")


def _is_torchscript(path: Path) -> bool:
    """TorchScript archives are zip files holding a `constants.pkl`; state dicts saved by torch.save are not."""
    import zipfile

    if not path.is_file():
        raise BigbatchError(f"Inception weights file {path} does not exist; {inc.missing_weights_message()}")
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as z:
        return any(n.endswith("constants.pkl") or "/code/" in n for n in z.namelist())


def extract(extractor: Extractor, images: torch.Tensor, batch_size: int = 64) -> dict[str, torch.Tensor]:
    """Features of uint8 `images`, `batch_size` at a time."""
    if batch_size < 1:
        raise BigbatchError(f"batch_size must be positive, got {batch_size}")
    parts = [extractor(images[i : i + batch_size]) for i in range(0, images.shape[0], batch_size)]
    if not parts:
        raise BigbatchError("no images to extract features from")
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def extract_sharded(
    extractor: Extractor, n: int, images_at: Callable[[int, int], torch.Tensor], batch_size: int = 64
) -> dict[str, torch.Tensor]:
    """Features of images 0 .. n-1 split across ranks: `images_at(start, count)` returns the uint8
    images start .. start+count-1; each rank extracts one contiguous shard and every rank gets all n
    rows, in order. Ranks whose shard runs past n extract copies of image n-1 so that all gathers have
    one shape; those rows are dropped."""
    if n < 1:
        raise BigbatchError(f"need at least one image to extract features from, got n={n}")
    world, lo, hi, per = _shard(n, batch_size)
    real = hi - lo
    parts = [extractor(images_at(s, min(batch_size, lo + real - s))) for s in range(lo, lo + real, batch_size)]
    if real < per:
        last = extractor(images_at(n - 1, 1))
        parts.append({k: v.expand(per - real, -1) for k, v in last.items()})
    local = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    if world == 1:
        return local
    device = _collective_device()
    out = {}
    for key in sorted(local):
        shard = local[key].to(device).contiguous()
        gathered = [torch.empty_like(shard) for _ in range(world)]
        td.all_gather(gathered, shard)
        out[key] = torch.cat(gathered)[:n].cpu()
    return out


def moments_sharded(
    extractor: Extractor, n: int, images_at: Callable[[int, int], torch.Tensor], batch_size: int = 64
) -> tuple[np.ndarray, np.ndarray]:
    """Mean (D,) and unbiased covariance (D, D), float64, of the "pool" features of images 0 .. n-1,
    each rank summing its contiguous shard: only the sums (D + D^2 numbers) cross ranks, never the
    features, so FID statistics of a million images need no (N, D) matrix anywhere. Sums are taken
    around the first image's features, which keeps the float64 covariance accurate for any N."""
    if n < 2:
        raise BigbatchError(f"need at least two images for a covariance, got n={n}")
    world, lo, hi, _ = _shard(n, batch_size)
    shift = extractor(images_at(0, 1))["pool"].double().reshape(-1)  # the same on every rank
    total = torch.zeros(shift.numel(), dtype=torch.float64)
    outer = torch.zeros(shift.numel(), shift.numel(), dtype=torch.float64)
    for start in range(lo, hi, batch_size):
        x = extractor(images_at(start, min(batch_size, hi - start)))["pool"].double() - shift
        total += x.sum(0)
        outer += x.T @ x
    if world > 1:
        flat = torch.cat([total, outer.reshape(-1)]).to(_collective_device())
        td.all_reduce(flat)
        flat = flat.cpu()
        total, outer = flat[: total.numel()], flat[total.numel() :].view_as(outer)
    mean = total / n
    cov = (outer - n * torch.outer(mean, mean)) / (n - 1)
    return (mean + shift).numpy(), ((cov + cov.T) / 2).numpy()


def _shard(n: int, batch_size: int) -> tuple[int, int, int, int]:
    """(world size, first image, end, images per rank) of this rank's contiguous shard of images 0 .. n-1."""
    if batch_size < 1:
        raise BigbatchError(f"batch_size must be positive, got {batch_size}")
    world = td.get_world_size() if dist.active() else 1
    rank = td.get_rank() if dist.active() else 0
    per = -(-n // world)
    return world, min(rank * per, n), min((rank + 1) * per, n), per


def _collective_device() -> torch.device:
    """Where tensors must be for a collective: NCCL takes only CUDA tensors, gloo CPU ones."""
    return torch.device("cuda", torch.cuda.current_device()) if td.get_backend() == "nccl" else torch.device("cpu")
